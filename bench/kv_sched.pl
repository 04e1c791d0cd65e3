#!/usr/bin/perl
# kv_sched.pl: what KV pages on demand and prefix caching buy, on the CPU
# backend (dummy `tiny` weights), side by side in one run.
#
# 1. Admitted concurrency.  256 rollouts of max_tokens 32,768 whose actual
#    lengths are spread over 256..8,192 (prompt 1,024), on the KV pool the
#    qwen3-8b preset gets on one H200 (bf16 KV; the arithmetic is printed),
#    everything scaled down by SCALE (16) so that it runs here.  A request
#    ends at its actual length through min_tokens and an eos bias, while
#    max_tokens stays the large value admission used to reserve for.
#    "before" is a worker built from an earlier commit (OLD_BUILD, optional:
#    without it the old rule's arithmetic is printed instead); "after" is
#    this tree.  Admitted concurrency is sampled from --stats every 20 ms.
# 2. A GRPO-shaped run: 32 prompts x 8 rollouts (seeds s + i, what n = 8
#    means), prompt 1,024, max_tokens 64, prefix caching on vs off, same
#    worker otherwise, REPEATS runs each interleaved, medians.
#
#   perl bench/kv_sched.pl            appends to bench/results/kv_sched.md
#
# Environment: B (build, default build), OLD_BUILD, SCALE (16), REPEATS (3),
# THREADS (CPU backend threads, 2), RESULTS ("-": stdout only).
# Every run is validated by maskserve-cli --summary (row order, sampled
# token in its row) and by the finish of every request; exit 1 otherwise.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../t/lib";
use JSON::PP;
use List::Util qw(sum max);
use POSIX qw(floor);
use Time::HiRes qw(time sleep);
use MsvTest;

my $root = "$FindBin::Bin/..";
my $B = $ENV{B} // "$root/build";
$MsvTest::BUILD = $B;
my $OLD = $ENV{OLD_BUILD};
my $SCALE = $ENV{SCALE} // 16;
my $REPEATS = $ENV{REPEATS} // 3;
my $THREADS = $ENV{THREADS} // 2;
my $RESULTS = $ENV{RESULTS} // "$root/bench/results/kv_sched.md";
my $json = JSON::PP->new->canonical;
my $V = 4099;
my $failed = 0;
my @out;

sub say_ { my $l = join '', @_; print "$l\n"; push @out, $l }

my $t = MsvTest->new;
my $dir = $t->dir;

sub cli {
    my ($bin, $shm, @args) = @_;
    my $o = `$bin/maskserve-cli --shm $shm @args 2>>$dir/cli.err`;
    return ($? >> 8, $o);
}

sub stats { my ($bin, $w) = @_; my ($rc, $o) = cli($bin, $w->{name}, '--stats'); $rc == 0 ? decode_json($o) : undef }

sub worker {
    my ($bin, %o) = @_;
    local $MsvTest::BUILD = $bin;
    return $t->start_worker(threads => $THREADS, %o);
}

# Run requests; returns (wall seconds, done lines by id).  With $poll, a
# child samples admitted concurrency meanwhile into $poll.
sub run {
    my ($bin, $w, $reqs, $tag, $poll) = @_;
    open my $fh, '>', "$dir/$tag.jsonl" or die;
    print $fh $json->encode($_), "\n" for @$reqs;
    close $fh;
    my $pp;
    if ($poll) {
        $pp = fork() // die;
        if ($pp == 0) {
            # the harness's END and signal handlers stop every worker: not
            # from this child
            $SIG{TERM} = 'DEFAULT';
            open my $pf, '>', $poll or POSIX::_exit(1);
            while (1) {
                my $s = stats($bin, $w) or POSIX::_exit(0);
                my $adm = $s->{slots}{running} - ($s->{kv} ? $s->{kv}{preempted} : 0);
                print $pf "$adm\n";
                sleep 0.02;
            }
            POSIX::_exit(0);
        }
    }
    my $t0 = time;
    my ($rc, $o) = cli($bin, $w->{name}, "--requests $dir/$tag.jsonl --timeout 1200");
    my $sec = time - $t0;
    kill 'TERM', $pp if $pp;
    waitpid($pp, 0) if $pp;
    my %done;
    for my $l (grep { /\S/ } split /\n/, $o) {
        my $d = decode_json($l);
        $done{ $d->{request_id} } = $d if $d->{done};
    }
    if ($rc != 0 || keys %done != @$reqs) {
        $failed = 1;
        warn "kv_sched: $tag: cli exit $rc, " . scalar(keys %done) . " of "
             . scalar(@$reqs) . " done\n" . `tail -3 $dir/cli.err`;
    }
    return ($sec, \%done);
}

my $date = `date -u '+%Y-%m-%d %H:%M UTC'`; chomp $date;
my $cpu = `grep -m1 'model name' /proc/cpuinfo`; $cpu =~ s/.*:\s*//; chomp $cpu;
my $commit = `git -C $root rev-parse --short HEAD`; chomp $commit;
say_("## kv_sched.pl, $date, commit $commit");
say_("");
say_("Machine: " . `nproc` =~ s/\n//r . " cores ($cpu), shared; CPU backend, $THREADS threads, dummy `tiny`.");
say_("Command: `SCALE=$SCALE REPEATS=$REPEATS" . ($OLD ? " OLD_BUILD=<build of an earlier commit>" : "")
     . " perl bench/kv_sched.pl`");
say_("");

# ------------------------------------------------------------ concurrency

# qwen3-8b on one H200: KV per token = layers x (k, v) x kv heads x head_dim
# x 2 bytes (bf16) = 36 x 2 x 8 x 128 x 2
my $gib = 2 ** 30;
my $hbm = 139 * $gib;                   # what the device reports as usable
my $weights = 16.4e9;                   # docs/MODELS.md
my $kv_tok = 36 * 2 * 8 * 128 * 2;
my $pool = floor((0.9 * $hbm - $weights - 2 * $gib) / $kv_tok);
my ($P, $MT, $L0, $L1, $N) = (1024, 32768, 256, 8192, 256);
my $old_adm = floor($pool / ($P + $MT));
say_("### Admitted concurrency: $N rollouts, max_tokens $MT, lengths $L0..$L1, prompt $P");
say_("");
say_(sprintf("Pool, qwen3-8b on one H200 with --gpu-memory-fraction 0.9: (0.9 x 139 GiB - 16.4 GB weights "
     . "- 2 GiB scratch) / %d B per token (bf16 KV) = **%d tokens** (fp32 KV, today's CUDA storage: %d).",
     $kv_tok, $pool, floor((0.9 * $hbm - $weights - 2 * $gib) / (2 * $kv_tok))));
say_(sprintf("Reserving prompt + max_tokens at admission admits %d / %d = **%d** at a time (%d with fp32 KV); "
     . "the default pool (max-num-seqs x max-model-len) did not fit at all.", $pool, $P + $MT, $old_adm,
     floor($pool / 2 / ($P + $MT))));
say_("");

my %c = (P => $P / $SCALE, MT => $MT / $SCALE, L0 => $L0 / $SCALE, L1 => $L1 / $SCALE,
         pool => floor($pool / $SCALE));
my @creq;
for my $i (0 .. $N - 1) {
    my $len = int($c{L0} + ($c{L1} - $c{L0}) * (($i * 97) % $N) / ($N - 1));
    push @creq, { request_id => "c$i",
                  token_ids => [map { ($_ * 7 + $i * 131) % ($V - 1) + 1 } 1 .. $c{P}],
                  sampling_params => { max_tokens => $c{MT}, min_tokens => $len - 1,
                                       logit_bias => { 0 => 100 }, temperature => 1.0,
                                       top_k => 20, seed => $i } };
}
my $ctok = sum map { $_->{sampling_params}{min_tokens} + 1 } @creq;
say_("Run here at 1/$SCALE: prompt $c{P}, max_tokens $c{MT}, lengths $c{L0}..$c{L1} "
     . "(eos at the length), pool $c{pool} tokens, --max-num-seqs $N.");
say_("");
say_("| build | admitted, mean | admitted, max | wall s | tokens | preemptions | prefill tokens |");
say_("|---|---|---|---|---|---|---|");
for my $case ($OLD ? ([$OLD, 'before']) : (), [$B, 'after']) {
    my ($bin, $tag) = @$case;
    my $w = worker($bin, slots => $N, max_model_len => $c{P} + $c{MT} + 64,
                   args => ['--kv-tokens', $c{pool}]);
    my ($sec, $done) = run($bin, $w, \@creq, "conc-$tag", "$dir/poll-$tag");
    my @bad = grep { ($done->{$_->{request_id}}{finish} // '') ne 'stop'
                     || $done->{$_->{request_id}}{completion_tokens}
                        != $_->{sampling_params}{min_tokens} + 1 } @creq;
    $failed = 1 if @bad;
    open my $pf, '<', "$dir/poll-$tag" or die;
    my @a = grep { $_ > 0 } map { chomp; $_ } <$pf>;
    my $s = stats($bin, $w);
    say_(sprintf("| %s | %.1f | %d | %.1f | %d%s | %s | %s |", $tag, @a ? sum(@a) / @a : 0,
         @a ? max(@a) : 0, $sec, $ctok, @bad ? " (**" . scalar(@bad) . " wrong**)" : '',
         $s->{kv} ? $s->{kv}{preemptions} : '-', $s->{prefix} ? $s->{prefix}{prefill_tokens} : '-'));
    $t->stop_worker($w);
}
say_("");

# ------------------------------------------------------------------- GRPO

my ($NP, $G, $GP, $GT) = (32, 8, 1024, 64);
my @greq;
for my $p (0 .. $NP - 1) {
    my @prompt = map { ($_ * 11 + $p * 389) % ($V - 1) + 1 } 1 .. $GP;
    for my $i (0 .. $G - 1) {
        push @greq, { request_id => "p$p-$i", token_ids => \@prompt,
                      sampling_params => { max_tokens => $GT, temperature => 1.0,
                                           top_p => 0.95, ignore_eos => JSON::PP::true,
                                           seed => 1000 * $p + $i } };
    }
}
say_("### GRPO-shaped: $NP prompts x $G rollouts (seeds s + i), prompt $GP, max_tokens $GT");
say_("");
my %r;
for my $rep (1 .. $REPEATS) {
    for my $case ([1, 'sharing on'], [0, 'sharing off']) {
        my ($on, $tag) = @$case;
        my $w = worker($B, slots => 256, max_model_len => $GP + $GT + 64,
                       args => [$on ? () : '--no-prefix-caching']);
        (my $f = "grpo-$tag-$rep") =~ s/ /-/g;
        my ($sec, $done) = run($B, $w, \@greq, $f);
        my @bad = grep { ($done->{$_->{request_id}}{finish} // '') ne 'length' } @greq;
        $failed = 1 if @bad;
        my $s = stats($B, $w);
        push @{ $r{$tag} }, [$sec, $s->{prefix}{prefill_tokens}, $s->{prefix}{hit_tokens}];
        $t->stop_worker($w);
    }
}
sub median { my @s = sort { $a <=> $b } @_; $s[$#s / 2] }
say_("| prefix caching | prefill tokens computed | cached tokens used | wall s (median of $REPEATS) | runs |");
say_("|---|---|---|---|---|");
for my $tag ('sharing on', 'sharing off') {
    my $x = $r{$tag};
    say_(sprintf("| %s | %d | %d | %.2f | %s |", $tag, $x->[0][1], $x->[0][2],
         median(map { $_->[0] } @$x), join(', ', map { sprintf '%.2f', $_->[0] } @$x)));
}
say_(sprintf("\nRatio off / on: prefill tokens %.2fx, wall time %.2fx%s.",
     $r{'sharing off'}[0][1] / max(1, $r{'sharing on'}[0][1]),
     median(map { $_->[0] } @{ $r{'sharing off'} }) / median(map { $_->[0] } @{ $r{'sharing on'} }),
     $failed ? ' (**a run failed validation**)' : ''));
say_("");

if ($RESULTS ne '-') {
    open my $rf, '>>', $RESULTS or die "$RESULTS: $!";
    print $rf join("\n", @out), "\n";
    close $rf;
}
exit($failed ? 1 : 0);
