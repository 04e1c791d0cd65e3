#!/usr/bin/perl
# End to end without nginx: a real worker with the dummy `tiny` model serves
# 64 concurrent requests of mixed modes submitted by maskserve-cli straight
# into its region; every row is checked against the sampler's invariants,
# seeded requests give the same tokens in every mask mode and alone or in a
# crowd, and every slot is FREE afterwards.

use strict;
use warnings;
use FindBin;
use File::Temp qw(tempdir);
use JSON::PP;
use List::Util qw(max sum);
use POSIX qw(:sys_wait_h);
use Test::More;

my $root = "$FindBin::Bin/..";
my $bin  = $ENV{MSV_BUILD} // "$root/build";
my $dir  = tempdir(CLEANUP => 1);
my $shm  = "msv-t05-$$";
my $json = JSON::PP->new->canonical;

sub cli {
    my (@args) = @_;
    my $out = `$bin/maskserve-cli --shm $shm @args 2>$dir/cli.err`;
    return ($? >> 8, $out);
}

sub stats {
    my ($rc, $out) = cli('--stats');
    return $rc == 0 ? decode_json($out) : undef;
}

# start the worker and wait until its region says ready
my $pid = fork() // die "fork: $!";
if ($pid == 0) {
    open STDERR, '>', "$dir/worker.log" or die;
    exec "$bin/maskserve-worker", '--dummy', 'tiny', '--shm', $shm,
        '--backend', $ENV{MSV_BACKEND} // 'cpu', '--sampler', $ENV{MSV_SAMPLER} // 'auto',
        '--max-num-seqs', '64', '--seed', '7',
        '--threads', '2', '--max-model-len', '512' or die "exec: $!";
}
my $st;
for (1 .. 200) {
    $st = stats();
    last if $st && $st->{state} eq 'ready';
    select undef, undef, undef, 0.05;
}
ok($st && $st->{state} eq 'ready', 'worker ready') or do {
    diag(`cat $dir/worker.log`); kill 'KILL', $pid; done_testing(); exit 1;
};
my $V = $st->{vocab_size};
diag("vocab $V, backend $st->{backend}");
is($st->{weight_version}, '0', '--stats: weight_version 0 by default');
is($st->{paused}, 0, '--stats: not paused');

# 64 requests: modes x sampling settings, some seeded twins
my @modes = (
    [0, undef], [1, 'selected'], [1, 'support'],
);
my @sp = (
    { temperature => 1.0, top_k => 20 },
    { temperature => 0.8, top_p => 0.9 },
    { temperature => 1.0, min_p => 0.05 },
    { temperature => 0 },
    { temperature => 1.2, top_k => 1000, top_p => 0.95, repetition_penalty => 1.3,
      presence_penalty => 0.5, frequency_penalty => 0.3 },
    { temperature => 1.0, top_k => 50, logit_bias => { 5 => 4.0, 9 => -100 },
      logprobs => 5 },
    { temperature => 1.0, top_k => 1 },
    { temperature => 0.7, top_k => -1, logprobs => 3 },
);
my (@reqs, %want);
my $n = 0;
while (@reqs < 64) {
    my $s = $sp[$n % @sp];
    my ($mask, $mode) = @{ $modes[int($n / @sp) % @modes] };
    # twins (same n % @sp) share prompt and params, seed included, and
    # differ only in the mask mode
    my %p = (%$s, max_tokens => 6 + $n % @sp, ignore_eos => JSON::PP::true,
             seed => 1000 + $n % @sp);
    my $r = { request_id => "r$n", sampling_params => \%p,
              token_ids => [map { ($_ * 13 + $n % @sp) % $V } 1 .. 3 + $n % @sp] };
    $r->{return_sampling_mask} = JSON::PP::true if $mask;
    $r->{sampling_logprobs_mode} = $mode if $mode;
    push @reqs, $r;
    $n++;
}
open my $fh, '>', "$dir/reqs.jsonl" or die;
print $fh $json->encode($_), "\n" for @reqs;
close $fh;

# one request alone first
open $fh, '>', "$dir/alone.jsonl" or die;
print $fh $json->encode($reqs[0]), "\n";
close $fh;
my ($rc, $out) = cli("--requests $dir/alone.jsonl --timeout 60");
is($rc, 0, 'alone: cli exit 0') or diag(`cat $dir/cli.err`);
my @alone = map { decode_json($_) } grep { /\S/ } split /\n/, $out;
my @alone_tokens = map { $_->{token} } grep { !$_->{done} && $_->{token} >= 0 } @alone;

($rc, $out) = cli("--requests $dir/reqs.jsonl --timeout 120");
is($rc, 0, '64 concurrent: cli exit 0') or diag(`cat $dir/cli.err; tail -20 $dir/worker.log`);

my (%rows, %done);
for my $l (grep { /\S/ } split /\n/, $out) {
    my $o = decode_json($l);
    if ($o->{done}) { $done{ $o->{request_id} } = $o; next; }
    push @{ $rows{ $o->{request_id} } }, $o;
}
is(scalar(keys %done), 64, 'every request finished');

my ($bad, $checked) = (0, 0);
my %by_id = map { $_->{request_id} => $_ } @reqs;
for my $id (sort keys %by_id) {
    my $r = $by_id{$id};
    my $p = $r->{sampling_params};
    my $rows = $rows{$id} || [];
    my $mode = !$r->{return_sampling_mask} ? 0
             : ($r->{sampling_logprobs_mode} // 'selected') eq 'support' ? 2 : 1;
    my @why;
    push @why, 'finish' unless $done{$id} && $done{$id}{finish} eq 'length';
    push @why, 'count' unless @$rows == $p->{max_tokens};
    for my $i (0 .. $#$rows) {
        my $w = $rows->[$i];
        push @why, "pos $i" unless $w->{pos} == $i;
        push @why, "token range" unless $w->{token} >= 0 && $w->{token} < $V;
        push @why, "final flag" if ($i == $#$rows) != defined $w->{finish};
        next unless $mode;
        my $ids = $w->{ids} || [];
        push @why, "empty support" unless @$ids;
        push @why, "not ascending" if grep { $ids->[$_] <= $ids->[$_ - 1] } 1 .. $#$ids;
        push @why, "token not in support" unless grep { $_ == $w->{token} } @$ids;
        push @why, "top_k" if ($p->{top_k} // -1) > 0 && @$ids > $p->{top_k};
        push @why, "greedy width" if $p->{temperature} == 0 && @$ids != 1;
        my $lps = $w->{lps};
        if ($mode == 2) {
            push @why, "lps count" unless @$lps == @$ids;
            my $m = max(@$lps);
            my $lse = $m + log(sum(map { exp($_ - $m) } @$lps));
            push @why, "logsumexp $lse" if abs($lse) > 1e-4;
            my ($k) = grep { $ids->[$_] == $w->{token} } 0 .. $#$ids;
            push @why, "support lp != sampled lp"
                if defined $k && $lps->[$k] != $w->{logprob};
        } else {
            push @why, "selected lp" unless @$lps == 1 && $lps->[0] == $w->{logprob};
        }
        $checked++;
    }
    if (defined $p->{logprobs}) {
        for my $w (@$rows) {
            my $top = $w->{top} || [];
            push @why, "top count" if @$top > $p->{logprobs} || !@$top;
            push @why, "top order" if grep { $top->[$_][1] > $top->[$_ - 1][1] } 1 .. $#$top;
        }
    }
    if (@why) { $bad++; diag("$id: @why") if $bad < 10; }
}
is($bad, 0, "rows obey the invariants ($checked mask rows checked)");

# twins: same prompt, params and seed -> same tokens whatever the mask mode
my (%tok_by_key, $twin_bad, $twins);
for my $id (keys %by_id) {
    my $r = $by_id{$id};
    my $key = $json->encode([$r->{token_ids}, $r->{sampling_params}]);
    my $toks = join ',', map { $_->{token} } @{ $rows{$id} };
    if (exists $tok_by_key{$key}) {
        $twins++;
        $twin_bad++ if $tok_by_key{$key} ne $toks;
    } else {
        $tok_by_key{$key} = $toks;
    }
}
ok($twins > 20 && !$twin_bad, "seeded twins in off/selected/support agree ($twins twins)");

is(join(',', @alone_tokens), join(',', map { $_->{token} } @{ $rows{r0} }),
   'a request alone gives the same tokens as among 63 others');

$st = stats();
is($st->{slots}{free}, $st->{n_slots}, 'all slots FREE afterwards');

# eos and min_tokens: a bias that makes eos the only likely token; eos is
# masked while t < min_tokens, then ends the request (finish stop, eos
# included); with ignore_eos it runs to max_tokens
my $eos = $st->{eos_ids}[0];
ok(defined $eos, "the region declares an eos id ($eos)");
open $fh, '>', "$dir/eos.jsonl" or die;
print $fh $json->encode({ request_id => 'eos-min3', token_ids => [5, 6, 7],
    sampling_params => { max_tokens => 10, min_tokens => 3, seed => 1,
                         logit_bias => { $eos => 100 } } }), "\n";
print $fh $json->encode({ request_id => 'eos-ignored', token_ids => [5, 6, 7],
    sampling_params => { max_tokens => 5, seed => 1, ignore_eos => JSON::PP::true,
                         logit_bias => { $eos => 100 } } }), "\n";
close $fh;
($rc, $out) = cli("--requests $dir/eos.jsonl --timeout 60");
is($rc, 0, 'eos requests: cli exit 0');
my (%etok, %edone);
for my $o (map { decode_json($_) } grep { /\S/ } split /\n/, $out) {
    if ($o->{done}) { $edone{ $o->{request_id} } = $o; next; }
    push @{ $etok{ $o->{request_id} } }, $o->{token};
}
my @m = @{ $etok{'eos-min3'} || [] };
ok(@m == 4 && $m[3] == $eos && !grep({ $_ == $eos } @m[0 .. 2])
   && $edone{'eos-min3'}{finish} eq 'stop',
   "min_tokens 3 holds eos back, then eos stops the request (@m)");
my @g = @{ $etok{'eos-ignored'} || [] };
ok(@g == 5 && !grep({ $_ != $eos } @g) && $edone{'eos-ignored'}{finish} eq 'length',
   "ignore_eos: eos sampled 5 times, finish length");

# malformed request file -> clear error, exit 2
open $fh, '>', "$dir/bad.jsonl" or die;
print $fh "{\"token_ids\": [1, 2\n";
close $fh;
($rc) = cli("--requests $dir/bad.jsonl");
is($rc, 2, 'malformed request line: exit 2');
like(`cat $dir/cli.err`, qr/bad\.jsonl:1:/, 'error names file and line');

# parameters outside the rules the HTTP API applies (shm/msv_params.h):
# one line naming the file, the line and the field
for my $c (['"temperature": 1e-38', 'temperature'], ['"logit_bias": {"5": 1e15}', 'logit_bias'],
           ['"repetition_penalty": 1e-40', 'repetition_penalty'],
           ['"min_tokens": 17', 'min_tokens'], ['"top_p": "x"', 'top_p'])
{
    my ($sp, $field) = @$c;
    open $fh, '>', "$dir/bad.jsonl" or die;
    print $fh "{\"token_ids\": [1, 2], \"sampling_params\": {\"max_tokens\": 2}}\n";
    print $fh "{\"token_ids\": [1, 2], \"sampling_params\": {$sp}}\n";
    close $fh;
    ($rc) = cli("--requests $dir/bad.jsonl");
    my $err = `cat $dir/cli.err`;
    ok($rc == 2 && $err =~ /^maskserve-cli: \S*bad\.jsonl:2: sampling_params\.$field /
       && $err =~ tr/\n// == 1, "cli refuses $sp: exit 2, one line naming it")
        or diag("rc $rc: $err");
}
{
    open $fh, '>', "$dir/big.jsonl" or die;
    print $fh '{"request_id": "big", "token_ids": [1, 2], "sampling_params": '
            . '{"max_tokens": 9223372036854775807, "top_k": 99999999999, "ignore_eos": true}}' . "\n";
    close $fh;
    my $out;
    ($rc, $out) = cli("--requests $dir/big.jsonl --timeout 60");
    my ($done) = grep { $_->{done} } map { decode_json($_) } grep { /\S/ } split /\n/, $out;
    ok($rc == 0 && $done && $done->{completion_tokens} == 510 && $done->{finish} eq 'length',
       'cli: max_tokens 2^63-1 runs to the end of the context (510 tokens)')
        or diag("rc $rc: " . `cat $dir/cli.err`);
}

kill 'TERM', $pid;
waitpid($pid, 0);
is($? >> 8, 0, 'worker exits 0 on SIGTERM');
ok(!-e "/dev/shm/$shm", 'region unlinked');

# --weight-version: a string responses can carry as it is
for my $bad ('', 'a"b', 'x' x 65) {
    my $err = `$bin/maskserve-worker --dummy tiny --shm t05-wv-$$ --weight-version '$bad' 2>&1 >/dev/null`;
    ok(($? >> 8) == 2 && $err =~ /^maskserve-worker: --weight-version: / && $err =~ tr/\n// == 1,
       "--weight-version '" . substr($bad, 0, 8) . "': exit 2, one line naming it");
}

done_testing();
