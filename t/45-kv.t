#!/usr/bin/perl
# KV pages on demand, preemption and prefix caching, end to end without
# nginx: real workers (dummy `tiny`, CPU backend) fed by maskserve-cli.
#
# - The same seeded requests on a large pool without sharing (the
#   reference), a large pool with sharing, and a pool so small that
#   sequences are preempted and cached pages evicted many times, with
#   sharing on and off: every row identical (tokens, masks, logprobs, top
#   logprobs, finish), every row exactly once and in order, and every page
#   back at the end.  The CPU forward does not depend on batch
#   composition, so any difference is a scheduler bug.
# - Prefix caching counted from --stats: a second request with the same
#   prompt prefills only its tail; a prompt sharing less than a page with
#   it shares nothing; with --no-prefix-caching nothing is shared.
# - 64 staggered long rollouts (max_tokens 16..2048) on a pool that holds
#   a quarter of their worst case all complete, validated.
# - A client killed while some of its sequences wait preempted: the worker
#   forgets them and every page comes back.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use JSON::PP;
use POSIX ();
use List::Util qw(sum max);
use Test::More;
use MsvTest;

my $t = MsvTest->new;
my $bin = $MsvTest::BUILD;
my $dir = $t->dir;
my $json = JSON::PP->new->canonical;
my $V = 4099;

# Always the CPU backend, whatever MSV_BACKEND says: the identities below
# rest on its forward not depending on batch composition.
sub worker {
    my (%o) = @_;
    return $t->start_worker(%o, args => [@{ $o{args} // [] }, '--backend', 'cpu']);
}

sub cli {
    my ($shm, @args) = @_;
    my $out = `$bin/maskserve-cli --shm $shm @args 2>$dir/cli.err`;
    return ($? >> 8, $out);
}

sub stats {
    my ($w) = @_;
    my ($rc, $out) = cli($w->{name}, '--stats');
    return $rc == 0 ? decode_json($out) : undef;
}

# Run a request file; rows by request id (slot and step dropped: they
# depend on the schedule) and the done lines.
sub run_reqs {
    my ($w, $reqs, $tag) = @_;
    open my $fh, '>', "$dir/$tag.jsonl" or die;
    print $fh $json->encode($_), "\n" for @$reqs;
    close $fh;
    my ($rc, $out) = cli($w->{name}, "--requests $dir/$tag.jsonl --timeout 300");
    is($rc, 0, "$tag: cli exit 0") or diag(`cat $dir/cli.err`);
    my (%rows, %done);
    for my $l (grep { /\S/ } split /\n/, $out) {
        my $o = decode_json($l);
        if ($o->{done}) { $done{ $o->{request_id} } = $o; next; }
        next if $o->{token} < 0;        # an abort row
        delete @$o{qw(slot step)};
        push @{ $rows{ $o->{request_id} } }, $json->encode($o);
    }
    return (\%rows, \%done);
}

sub pool_back {
    my ($w, $tag) = @_;
    my $st = stats($w);
    ok($st && $st->{kv}{free} == $st->{kv}{tokens} && $st->{kv}{preempted} == 0
       && $st->{slots}{free} == $st->{n_slots},
       "$tag: every page and slot back at the end ($st->{kv}{free} of "
       . "$st->{kv}{tokens} tokens, $st->{kv}{cached} cached)");
    return $st;
}

# ---------------------------------------------------------------- requests

# three prompt stems of 40..70 tokens, each request its own tail, so
# requests share full pages with some others and part of a page with none
my @stems = map { my $s = $_; [map { ($_ * 31 + $s * 977) % $V } 1 .. 40 + 15 * $s] } 0 .. 2;
my @modes = ([0, undef], [1, 'selected'], [1, 'support']);
my @reqs;
for my $i (0 .. 23) {
    my $stem = $stems[$i % 3];
    my @tail = map { ($_ * 7 + $i * 101) % $V } 1 .. 3 + $i % 11;
    my ($mask, $mode) = @{ $modes[int($i / 3) % 3] };
    my $r = { request_id => "q$i", token_ids => [@$stem, @tail],
              sampling_params => { max_tokens => 30 + ($i * 37) % 61,
                                   temperature => 1.0, top_k => 40,
                                   ignore_eos => JSON::PP::true,
                                   seed => 500 + $i } };
    $r->{sampling_params}{logprobs} = 2 if $i % 4 == 1;
    $r->{sampling_params}{repetition_penalty} = 1.2 if $i % 5 == 2;
    $r->{return_sampling_mask} = JSON::PP::true if $mask;
    $r->{sampling_logprobs_mode} = $mode if $mode;
    push @reqs, $r;
}
my $worst = max map { @{ $_->{token_ids} } + $_->{sampling_params}{max_tokens} } @reqs;

sub check_rows {
    my ($rows, $done, $tag) = @_;
    my @bad;
    for my $r (@reqs) {
        my $id = $r->{request_id};
        my @p = map { decode_json($_)->{pos} } @{ $rows->{$id} || [] };
        push @bad, "$id count" unless @p == $r->{sampling_params}{max_tokens};
        push @bad, "$id order" if grep { $p[$_] != $_ } 0 .. $#p;
        push @bad, "$id finish" unless ($done->{$id}{finish} // '') eq 'length';
    }
    is("@bad", '', "$tag: every row exactly once, in order, finish length");
}

sub same_rows {
    my ($a, $b, $tag) = @_;
    my @diff = grep { join("\n", @{ $a->{$_} || [] }) ne join("\n", @{ $b->{$_} || [] }) }
               map { $_->{request_id} } @reqs;
    is("@diff", '', "$tag: rows identical to the reference, byte for byte");
}

# ------------------------------------------------ prefix caching, counted

my $ref = worker(args => ['--no-prefix-caching', '--kv-tokens', 65536]);
my $big = worker(args => ['--kv-tokens', 65536]);

my @p100 = map { ($_ * 13 + 5) % $V } 1 .. 100;
my @pre = (
    { request_id => 'a', token_ids => \@p100,
      sampling_params => { max_tokens => 4, seed => 1 } },
    { request_id => 'b', token_ids => \@p100,
      sampling_params => { max_tokens => 4, seed => 2 } },
    { request_id => 'c', token_ids => [@p100[0 .. 9], map { $_ + 1 } @p100[10 .. 99]],
      sampling_params => { max_tokens => 4, seed => 3 } },
);
for my $case ([$big, 'sharing on', [0, 96, 0]], [$ref, 'sharing off', [0, 0, 0]]) {
    my ($w, $tag, $hits) = @$case;
    for my $k (0 .. 2) {
        my $s0 = stats($w);
        (my $file = "pre-$tag-$k") =~ s/ /-/g;
        run_reqs($w, [$pre[$k]], $file);
        my $s1 = stats($w);
        my $hit = $s1->{prefix}{hit_tokens} - $s0->{prefix}{hit_tokens};
        my $pf = $s1->{prefix}{prefill_tokens} - $s0->{prefix}{prefill_tokens};
        is("$hit $pf", "$hits->[$k] " . (100 - $hits->[$k]),
           "$tag, request $pre[$k]{request_id}: $hit prompt tokens cached, "
           . "$pf prefilled");
    }
}
# a group of four with one new prompt, submitted together: one computes
# the prompt, the others wait a step and prefill only their last page
my @p200 = map { ($_ * 29 + 11) % $V } 1 .. 200;
my $g0 = stats($big);
my ($g_rows) = run_reqs($big, [map { { request_id => "g$_", token_ids => \@p200,
    sampling_params => { max_tokens => 3, seed => 10 + $_ } } } 0 .. 3], 'group');
my $g1 = stats($big);
is(($g1->{prefix}{prefill_tokens} - $g0->{prefix}{prefill_tokens}) . ' '
   . ($g1->{prefix}{hit_tokens} - $g0->{prefix}{hit_tokens}), (200 + 3 * 8) . ' ' . (3 * 192),
   'four requests of one prompt submitted together prefill it once');
is(scalar(grep { @{ $g_rows->{"g$_"} || [] } == 3 } 0 .. 3), 4, 'and all four complete');

my $st = stats($big);
ok($st->{kv}{cached} >= 96, "unused prompt pages stay cached ($st->{kv}{cached} tokens)");

# ------------------------------------- preemption and sharing: identity

my ($r_rows, $r_done) = run_reqs($ref, \@reqs, 'reference');
check_rows($r_rows, $r_done, 'reference');
pool_back($ref, 'reference');
is(stats($ref)->{kv}{preemptions}, 0, 'the large pool never preempts');

# one request of each stem first: requests admitted together all compute
# their prompts, later ones find the stems cached
my $s0 = stats($big)->{prefix}{hit_tokens};
my ($b_rows, $b_done) = run_reqs($big, [@reqs[0 .. 2]], 'sharing-first');
my ($b2_rows, $b2_done) = run_reqs($big, [@reqs[3 .. $#reqs]], 'sharing');
%$b_rows = (%$b_rows, %$b2_rows);
%$b_done = (%$b_done, %$b2_done);
check_rows($b_rows, $b_done, 'sharing');
same_rows($r_rows, $b_rows, 'sharing on');
$st = pool_back($big, 'sharing');
my $stem_hits = $st->{prefix}{hit_tokens} - $s0;
my $want = sum map { 16 * int(@{ $stems[$_ % 3] } / 16) } 3 .. $#reqs;
ok($stem_hits >= $want, "later requests found their stems' full pages "
   . "cached ($stem_hits tokens, at least $want)");

# a pool for little more than the largest request alone
my $small_kv = $worst + 32;
for my $caching (1, 0) {
    my $tag = $caching ? 'small pool, sharing' : 'small pool, no sharing';
    my $w = worker(args => ['--kv-tokens', $small_kv,
                                      $caching ? () : '--no-prefix-caching']);
    my ($rows, $done) = run_reqs($w, \@reqs, $caching ? 'small' : 'small-off');
    check_rows($rows, $done, $tag);
    same_rows($r_rows, $rows, $tag);
    my $s = pool_back($w, $tag);
    ok($s->{kv}{preemptions} >= 5, "$tag: $s->{kv}{preemptions} preemptions");
    ok(!$caching || $s->{kv}{evictions} > 0,
       "$tag: $s->{kv}{evictions} cached pages evicted under pressure");

    # the client dies while sequences wait preempted: the worker forgets
    # them with the others and every page comes back
    my @slow = map { { %$_, sampling_params => { %{ $_->{sampling_params} },
                                                 max_tokens => 400 } } } @reqs;
    open my $fh, '>', "$dir/slow.jsonl" or die;
    print $fh $json->encode($_), "\n" for @slow;
    close $fh;
    my $w2 = worker(max_model_len => 1024,
                              args => ['--kv-tokens', 512 + 64,
                                       $caching ? () : '--no-prefix-caching']);
    my $cp = fork() // die;
    if ($cp == 0) {
        { exec "$bin/maskserve-cli --shm $w2->{name} --requests $dir/slow.jsonl "
               . "--summary --timeout 120 > /dev/null 2>&1" }
        POSIX::_exit(127);
    }
    my $seen = MsvTest::wait_for(sub { my $x = stats($w2); $x && $x->{kv}{preempted} > 0 }, 60);
    kill 'KILL', $cp;
    waitpid($cp, 0);
    ok($seen, "$tag: a client killed while sequences wait preempted");
    my $back = MsvTest::wait_for(sub { my $x = stats($w2);
        $x && $x->{slots}{free} == $x->{n_slots} && $x->{kv}{free} == $x->{kv}{tokens}
        && $x->{kv}{preempted} == 0 }, 30);
    ok($back, "$tag: its slots and every page come back, preempted ones included")
        or diag($json->encode(stats($w2)));
    $t->stop_worker($w2);
    $t->stop_worker($w);
}

# a request that cannot fit even alone still gets no_kv at once
my $tiny_pool = worker(args => ['--kv-tokens', 64]);
my ($nr, $nd) = run_reqs($tiny_pool, [{ request_id => 'huge', token_ids => [1 .. 40],
    sampling_params => { max_tokens => 100 } }], 'no-kv');
ok(!@{ $nr->{huge} || [] } && ($nd->{huge}{finish} // '') eq 'abort',
   'a request larger than the whole pool ends with an abort, no rows')
    or diag($json->encode($nd));
like(`cat $tiny_pool->{log}`, qr/exceed the KV cache/, 'logged as no KV');
$t->stop_worker($tiny_pool);

# ------------------------------------------- long staggered rollouts

my @long;
for my $i (0 .. 63) {
    my $mt = int(16 + (2048 - 16) * (($i * 37) % 64) / 63);
    push @long, { request_id => "l$i",
                  token_ids => [map { ($_ * 17 + $i) % $V } 1 .. 8 + $i % 24],
                  sampling_params => { max_tokens => $mt, temperature => 1.0,
                                       top_k => 20, ignore_eos => JSON::PP::true,
                                       seed => $i },
                  ($i % 4 == 0 ? (return_sampling_mask => JSON::PP::true) : ()) };
}
my $need = sum map { @{ $_->{token_ids} } + $_->{sampling_params}{max_tokens} } @long;
my $q = int($need / 4);
my $lw = worker(max_model_len => 2304, threads => 2,
                          args => ['--kv-tokens', $q]);
my $t0 = time;
my ($lrows, $ldone) = run_reqs($lw, \@long, 'long');
my @bad;
for my $r (@long) {
    my $id = $r->{request_id};
    my @o = map { decode_json($_) } @{ $lrows->{$id} || [] };
    push @bad, "$id count" unless @o == $r->{sampling_params}{max_tokens};
    push @bad, "$id order" if grep { $o[$_]{pos} != $_ } 0 .. $#o;
    push @bad, "$id finish" unless ($ldone->{$id}{finish} // '') eq 'length';
    if ($r->{return_sampling_mask}) {
        push @bad, "$id mask" if grep {
            my $w = $_; !@{ $w->{ids} || [] } || @{ $w->{ids} } > 20
                || !grep { $_ == $w->{token} } @{ $w->{ids} } } @o;
    }
}
is("@bad", '', sprintf("64 rollouts of max_tokens 16..2048 on a quarter pool "
   . "(%d of %d tokens) all complete and validate (%ds)", $q, $need, time - $t0));
$st = pool_back($lw, 'long');
ok($st->{kv}{preemptions} > 0, "preempted $st->{kv}{preemptions} times");

done_testing();
