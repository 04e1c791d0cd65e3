#!/usr/bin/perl
# The worker's --step-log: a real worker (dummy `tiny`, small steps so
# prefill chunks share steps with decodes) serves requests of several
# prompt lengths and output lengths from maskserve-cli; its log must have
# every field on every line, consistent times and stage costs, one line
# per step the worker counts, the tokens it generated (sampled), one
# decode row per output token but the first, every prompt token
# prefilled once, the ring bytes the rows took; and it must be on disk as
# soon as the batch is done, before the worker exits.

use strict;
use warnings;
use FindBin;
use File::Temp qw(tempdir);
use JSON::PP;
use List::Util qw(sum);
use Test::More;
use Time::HiRes qw(sleep);

my $root = "$FindBin::Bin/..";
my $bin  = $ENV{MSV_BUILD} // "$root/build";
my $dir  = tempdir(CLEANUP => 1);
my $shm  = "msv-t06-$$";
my $log  = "$dir/steps.txt";

my @keys = qw(step t0_ns t1_ns seqs decode prefill sampled active fwd_ns
              sample_ns ring_ns ring_bytes host_ns flush_ns);

# a path that cannot be opened is refused at start
my $rc = system("$bin/maskserve-worker --dummy tiny --backend cpu --shm $shm "
                . "--step-log $dir/no/such/dir/steps.txt 2>$dir/bad.log");
ok($rc != 0 && `cat $dir/bad.log` =~ /--step-log .*cannot open/,
   '--step-log into a missing folder: refused at start')
    or diag(`cat $dir/bad.log`);

my $pid = fork() // die "fork: $!";
if ($pid == 0) {
    open STDERR, '>', "$dir/worker.log" or die;
    exec "$bin/maskserve-worker", '--dummy', 'tiny', '--shm', $shm,
        '--backend', $ENV{MSV_BACKEND} // 'cpu', '--sampler', $ENV{MSV_SAMPLER} // 'auto',
        '--max-num-seqs', '16', '--seed', '3', '--threads', '2',
        '--max-model-len', '256', '--max-num-batched-tokens', '48',
        '--no-prefix-caching', '--step-log', $log or die "exec: $!";
}
my $ready = 0;
for (1 .. 200) {
    my $out = `$bin/maskserve-cli --shm $shm --stats 2>/dev/null`;
    if ($? == 0 && decode_json($out)->{state} eq 'ready') { $ready = 1; last }
    sleep 0.05;
}
ok($ready, 'worker ready') or do {
    diag(`cat $dir/worker.log`); kill 'KILL', $pid; done_testing(); exit 1;
};

# 24 requests, prompts of 5..74 tokens (distinct, so nothing is shared),
# 3..25 output tokens each, masks of every mode
my (@reqs, $want_tokens, $want_decode, $want_prefill);
for my $i (0 .. 23) {
    my $plen = 5 + ($i * 13) % 70;
    my $mt = 3 + ($i * 7) % 23;
    my %r = (request_id => "s$i",
             token_ids => [map { 1 + ($i * 31 + $_ * 17) % 200 } 1 .. $plen],
             sampling_params => { max_tokens => $mt, ignore_eos => JSON::PP::true,
                                  temperature => 1.0, top_k => 10 + $i,
                                  seed => 100 + $i });
    if ($i % 3) {
        $r{return_sampling_mask} = JSON::PP::true;
        $r{sampling_logprobs_mode} = $i % 3 == 1 ? 'selected' : 'support';
    }
    push @reqs, encode_json(\%r);
    $want_tokens += $mt;
    $want_decode += $mt - 1;
    $want_prefill += $plen;
}
open my $fh, '>', "$dir/req.jsonl" or die;
print $fh "$_\n" for @reqs;
close $fh;

my $sum = `$bin/maskserve-cli --shm $shm --requests $dir/req.jsonl --summary --timeout 60 2>$dir/cli.err`;
is($? >> 8, 0, 'cli exit 0') or diag(`cat $dir/cli.err`);
my $s = decode_json($sum);
is($s->{tokens}, $want_tokens, "cli: $want_tokens tokens");

# the batch is done: its lines are on disk while the worker still runs
my @lines;
for (1 .. 100) {
    open my $lf, '<', $log or die "$log: $!";
    @lines = <$lf>;
    close $lf;
    last if @lines && $lines[-1] =~ / active 0 /;
    sleep 0.05;
}
ok(@lines && $lines[-1] =~ / active 0 /, 'the log is flushed once nothing runs')
    or diag(scalar(@lines) . ' lines');

my (@st, @bad);
for my $l (@lines) {
    my @f = split ' ', $l;
    my %h = @f;
    my @got = @f[map { 2 * $_ } 0 .. $#f / 2];
    push @bad, "keys: $l" unless "@got" eq "@keys";
    push @bad, "not integers: $l" if grep { !defined || !/^\d+$/ } @h{@keys};
    push @st, \%h;
}
is(scalar(@bad), 0, 'every line has every field, in order, as integers') or diag("@bad[0 .. 2]");

my @why;
for my $i (0 .. $#st) {
    my $h = $st[$i];
    my $span = $h->{t1_ns} - $h->{t0_ns};
    push @why, "$h->{step}: t1 < t0" if $h->{t1_ns} < $h->{t0_ns};
    push @why, "$h->{step}: stages do not add up to the step (one is negative)"
        if $h->{fwd_ns} + $h->{sample_ns} + $h->{ring_ns} + $h->{host_ns}
           + $h->{flush_ns} != $span;
    push @why, "$h->{step}: decode > seqs" if $h->{decode} > $h->{seqs};
    push @why, "$h->{step}: prefill chunks without tokens"
        if $h->{prefill} < $h->{seqs} - $h->{decode};
    push @why, "$h->{step}: more than 48 tokens"
        if $h->{decode} + $h->{prefill} > 48;
    push @why, "$h->{step}: sampled outside decode .. seqs"
        if $h->{sampled} < $h->{decode} || $h->{sampled} > $h->{seqs};
    push @why, "$h->{step}: rows without ring bytes"
        if $h->{sampled} > 0 && $h->{ring_bytes} == 0;
    push @why, "$h->{step}: a forward of no time" if $h->{fwd_ns} == 0;
    if ($i > 0) {
        my $p = $st[$i - 1];
        push @why, "$h->{step}: index not increasing" if $h->{step} <= $p->{step};
        push @why, "$h->{step}: starts before the last ended" if $h->{t0_ns} < $p->{t1_ns};
    }
}
is(scalar(@why), 0, 'times, batch and stages consistent on every line') or diag("@why[0 .. 4]");

is(sum(map { $_->{sampled} } @st), $want_tokens, "sampled sums to the $want_tokens tokens generated");
is(sum(map { $_->{decode} } @st), $want_decode, "decode rows: one per token but each request's first ($want_decode)");
is(sum(map { $_->{prefill} } @st), $want_prefill, "prefill: every prompt token once ($want_prefill)");
is(sum(map { $_->{ring_bytes} } @st), $s->{row_bytes}, "ring bytes: the rows' $s->{row_bytes}");
ok((grep { $_->{prefill} > 0 && $_->{decode} > 0 } @st),
   'some steps mix prefill chunks with decodes');

kill 'TERM', $pid;
waitpid($pid, 0);
my ($steps, $tokens) = `cat $dir/worker.log` =~ /stopped after (\d+) steps, (\d+) tokens/;
is(scalar(@st), $steps // -1, 'one line per step the worker counts');
is($want_tokens, $tokens // -1, "the worker's token counter agrees");

open my $lf, '<', $log or die;
my $n = () = <$lf>;
is($n, scalar(@lines), 'nothing left unwritten at exit');

done_testing();
