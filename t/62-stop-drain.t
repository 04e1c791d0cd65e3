#!/usr/bin/perl
# The worker paused and stopped under load, and the stack full:
#   - SIGSTOP for 1 s (below the stall limit): every stream resumes and
#     ends intact;
#   - SIGSTOP for longer than the stall limit (maskserve_worker_stall_timeout
#     3s here):
#     every request ends with an explicit error, none hangs; after SIGCONT
#     the worker is attached again and serves; resumed once nginx is
#     attaching again, every slot comes back;
#   - SIGTERM (drain): running requests end with an explicit "shutting
#     down" error and [DONE], the worker exits 0 within --drain-timeout
#     and removes its region; new requests get 503 until it is back;
#   - every slot taken: a burst of 16 more requests all get 503
#     "overloaded" with Retry-After at once, and the running ones go on.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use JSON::PP;
use POSIX qw(:sys_wait_h);
use Test::More;
use Time::HiRes qw(time sleep);
use MsvTest;

my $STALL = 3;      # maskserve_worker_stall_timeout, s

my $DRAIN = 2;      # the worker's --drain-timeout, s (shorter below on a
                    # backend too fast for a stream to outlast it)

my $t = MsvTest->new;
my $w = $t->start_worker(slots => 16, max_model_len => 32768, threads => 1,
                         model_dir => $t->long_context_model(32768),
                         args => ['--drain-timeout', $DRAIN]);
$t->start_nginx(processes => 2,
                http => "    maskserve_worker_stall_timeout ${STALL}s;\n");
my $true = JSON::PP::true;
my $V = $t->health->{workers}[0]{vocab_size};

# whether the stack answers a one-token request within $timeout s
sub serving {
    my ($timeout) = @_;
    return MsvTest::wait_for(sub {
        $t->generate({ token_ids => [1], sampling_params => { max_tokens => 1 } })
          ->{status} == 200 }, $timeout);
}
# streams that must still run when every slot is seen taken, or outlast
# the drain, are sized by the backend's measured rate: a GPU runs a batch
# of the tiny model's sequences as fast as one
my $FULL = $t->tokens_lasting(3, 4000, 16);
my $LONG = $t->tokens_lasting(6, 32000);
# tokens a second of each of 8 streams at once, as the drain runs them
my $RATE = $t->tokens_lasting(1, undef, 8);
# the model's 32,768 positions cap a stream: where that is less than 6 s
# of it, the drain is a third of what a stream lasts, so the streams are
# still running at its deadline
my $lasts = $LONG / $RATE;
if ($lasts < 3 * $DRAIN) {
    $DRAIN = sprintf('%.2f', $lasts / 3);
    my ($i) = grep { $w->{args}[$_] eq '--drain-timeout' } 0 .. $#{ $w->{args} };
    $w->{args}[$i + 1] = $DRAIN;
    $t->stop_worker($w);
    $t->restart_worker($w);
    ok(serving(20), "the worker back with --drain-timeout $DRAIN");
}
diag("streams of $LONG tokens at $RATE tokens/s, --drain-timeout $DRAIN s");

sub req {
    my ($id, $max, %o) = @_;
    return { request_id => $id, token_ids => [3, 1, 4],
             return_sampling_mask => ($o{mask} // 1) ? $true : JSON::PP::false,
             sampling_params => { max_tokens => $max, ignore_eos => $true,
                                  top_k => 8, seed => length $id } };
}

sub intact {
    my ($req, $r) = @_;
    return 0 unless $r && $r->{status} == 200 && $r->{done} == 1 && !$r->{bad};
    my $m = MsvTest::merge_events($r->{events}) or return 0;
    my $c = $m->{choices}[0];
    return !MsvTest::choice_problems($req, $c, $V)
        && @{ $c->{token_ids} } == $req->{sampling_params}{max_tokens};
}

sub explicit_error {
    my ($r) = @_;
    return 0 unless $r && $r->{done} == 1;
    my $e = $r->{events}[-1]{error};
    return $e && $e->{type} && $e->{message} ? $e->{message} : 0;
}

sub in_use { my $h = $t->health; $h && $h->{workers}[0]{slots_in_use} }

# --- SIGSTOP below the stall limit
{
    my @reqs = map { req("stop1-$_", 150) } 1 .. 8;
    my @bg = map { $t->bg(stream => $_) } @reqs;
    $t->bg_started($_, 10) for @bg;
    kill 'STOP', $w->{pid};
    sleep 1;
    kill 'CONT', $w->{pid};
    my $n = grep { intact($reqs[$_], $t->bg_wait($bg[$_], 60)) } 0 .. $#bg;
    is($n, 8, 'SIGSTOP for 1 s: all 8 streams resume and end intact');
}

# --- SIGSTOP above the stall limit
{
    my @reqs = map { req("stop2-$_", 600) } 1 .. 8;
    my @bg = map { $t->bg(stream => $_) } @reqs;
    $t->bg_started($_, 10) for @bg;
    my $t0 = time;
    kill 'STOP', $w->{pid};
    my @r = map { $t->bg_wait($_, $STALL + 10) } @bg;
    my $dt = time - $t0;
    kill 'CONT', $w->{pid};
    my @msg = grep { $_ } map { explicit_error($_) } @r;
    is(scalar @msg, 8, "SIGSTOP beyond ${STALL} s: all 8 streams end with an explicit error")
        or diag(explain [map { $_ && $_->{events}[-1] } @r]);
    diag("message: $msg[0]") if @msg;
    cmp_ok($dt, '<', $STALL + 8, 'without hanging');
    ok(MsvTest::wait_for(sub {
        my $r = $t->generate({ token_ids => [1, 2], sampling_params => { max_tokens => 3 } });
        $r->{status} == 200 && @{ $r->{json}{choices}[0]{token_ids} } == 3;
    }, 20), 'after SIGCONT the worker serves again');
    # The requests nginx failed are not cancelled in the worker: their
    # slots come back when they have run to their end (600 tokens here),
    # not at once.  Bounded, never leaked.
    ok(MsvTest::wait_for(sub { defined in_use() && in_use() == 0 }, 90),
       'and no slot is left in use once they have run out');
}

# --- SIGSTOP above the stall limit, resumed while nginx attaches again:
# its processes take reader entries again (often each other's) before the
# worker sees their old connections close, so the worker's reap leaves
# their slots alone; nginx takes them back when it attaches
# (msv_slots_adopt).  Three rounds: which entry each process gets varies.
{
    my $n = int($RATE * 2);        # about 2 s of tokens a stream
    for my $round (1 .. 3) {
        my @reqs = map { req("stop3-$round-$_", $n, mask => 0) } 1 .. 8;
        my @bg = map { $t->bg(stream => $_) } @reqs;
        $t->bg_started($_, 10) for @bg;
        sleep 1.5;
        kill 'STOP', $w->{pid};
        my @r = map { $t->bg_wait($_, $STALL + 10) } @bg;
        sleep 1;                   # nginx's next attach is under way
        kill 'CONT', $w->{pid};
        my @msg = grep { $_ } map { explicit_error($_) } @r;
        is(scalar @msg, 8, "round $round: every stream ended with an explicit error");
        ok(MsvTest::wait_for(sub { defined in_use() && in_use() == 0 }, 15),
           "round $round: every slot back within 15 s of SIGCONT")
            or diag(`$MsvTest::BUILD/maskserve-cli --shm $w->{name} --stats 2>&1`);
    }
}

# --- every slot taken: 503 at once, the running requests go on
{
    my @reqs = map { req("full-$_", $FULL) } 1 .. 16;
    my @bg = map { $t->bg(stream => $_) } @reqs;
    $t->bg_started($_, 10) for @bg;
    ok(MsvTest::wait_for(sub { (in_use() // 0) == 16 }, 10), 'all 16 slots in use');
    my $t0 = time;
    my @extra = $t->parallel(map { [generate => { token_ids => [1],
        sampling_params => { max_tokens => 2 } }] } 1 .. 16);
    my $dt = time - $t0;
    my $n503 = grep { $_->{status} == 503 && $_->{json}{error}{type} eq 'overloaded'
                      && ($_->{headers}{'retry-after'} // '') eq '1' } @extra;
    is($n503, 16, '16 more requests: all 503 overloaded with Retry-After');
    cmp_ok($dt, '<', 10, 'answered at once, not queued');
    my $n = grep { intact($reqs[$_], $t->bg_wait($bg[$_], 60)) } 0 .. $#bg;
    is($n, 16, 'the 16 running streams end intact');
}

# --- SIGTERM: drain
{
    # no masks: a GPU streams tens of thousands of events in the drain
    my @reqs = map { req("term-$_", $LONG, mask => 0) } 1 .. 8;
    my @bg = map { $t->bg(stream => $_) } @reqs;
    $t->bg_started($_, 10) for @bg;
    my $t0 = time;
    kill 'TERM', $w->{pid};
    my $st;
    MsvTest::wait_for(sub {
        my $r = waitpid($w->{pid}, WNOHANG);
        $st = $? if $r == $w->{pid};
        $r == $w->{pid};
    }, 10);
    my $dt = time - $t0;
    ok(defined $st, 'SIGTERM: the worker exits');
    is($st, 0, 'with status 0');
    cmp_ok($dt, '<', $DRAIN + 3, "within --drain-timeout ($DRAIN s) and a margin");
    $w->{pid} = 0;
    my @r = map { $t->bg_wait($_, 30) } @bg;
    my @msg = grep { $_ } map { explicit_error($_) } @r;
    is(scalar @msg, 8, 'every running stream ends with an explicit error and [DONE]')
        or diag(explain [map { $_ && { status => $_->{status}, done => $_->{done},
                                       events => scalar @{ $_->{events} },
                                       last => $_->{events}[-1] } } @r]);
    like($msg[0] // '', qr/shutting down/, 'saying the worker is shutting down');
    ok(!-e "/dev/shm/$w->{name}", 'the region is removed');
    like(MsvTest::_tail($w->{log}, 20), qr/stopping: aborting \d+ requests/,
         'the worker logs the drain');
    my $r = $t->generate({ token_ids => [1] });
    is($r->{status}, 503, 'new requests: 503 while it is down');
    $t->restart_worker($w);
    ok(serving(10), 'served again once it is back');
}

unlike($t->error_log, qr/\[(alert|emerg)\]|exited on signal/, 'no nginx alerts or crashes');

done_testing;
