#!/usr/bin/perl
# Requests that end early, and workers that go away: a client disconnect
# frees the slot (seen in /health), abort by id from a second request ends
# the stream with finish_reason "abort", the status endpoint sees running
# requests; a worker killed with SIGKILL mid-stream ends its requests with
# an explicit error within a second, new requests get 503, and a restarted
# worker is picked up without reloading nginx; a worker stopped with
# SIGTERM does the same through its abort rows.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use IO::Select;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);
use MsvTest;

my $t = MsvTest->new;
# --drain-timeout 1: a stopped worker's long requests end at that deadline
my $w = $t->start_worker(slots => 16, max_model_len => 32768, threads => 1,
                         model_dir => $t->long_context_model(32768),
                         args => ['--drain-timeout', 1]);
$t->start_nginx;
# long requests: still running when aborted, killed or drained, on any
# backend (about 4 s alone at the measured rate)
my $LONG = $t->tokens_lasting(4, 32000);

my $true = JSON::PP::true;

sub long_req {
    my ($id, %o) = @_;
    return { request_id => $id, token_ids => [1, 2, 3, 4],
             return_sampling_mask => $true,
             sampling_params => { max_tokens => $LONG, ignore_eos => $true,
                                  top_k => 8, %o } };
}

sub in_use { my $h = $t->health; $h && $h->{workers}[0]{slots_in_use} }

sub read_until {
    my ($s, $re, $timeout) = @_;
    my $sel = IO::Select->new($s);
    my $buf = '';
    my $end = time + ($timeout // 10);
    while (time < $end && $buf !~ $re) {
        last unless $sel->can_read(0.1) || time < $end;
        my $n = sysread($s, $buf, 65536, length $buf);
        last if defined $n && $n == 0;
    }
    return $buf;
}

# --- client disconnect mid-stream
{
    my $s = $t->raw_post('/inference/v1/generate', { %{ long_req('gone-1') },
                                                     stream => $true });
    my $got = read_until($s, qr/data: \{/, 10);
    like($got, qr/data: \{/, 'stream started');
    ok(in_use() >= 1, 'its slot is in use');
    close $s;
    my $t0 = time;
    ok(MsvTest::wait_for(sub { in_use() == 0 }, 5), 'disconnect frees the slot');
    cmp_ok(time - $t0, '<', 2, 'within two seconds');
    like($t->error_log, qr/request "gone-1" cancelled after \d+ tokens \(client gone\)/,
         'the cancel is logged');
}

# --- client disconnect while waiting for a non-streaming answer
{
    my $s = $t->raw_post('/inference/v1/generate', long_req('gone-2'));
    ok(MsvTest::wait_for(sub { in_use() >= 1 }, 5), 'non-stream running');
    sleep 0.2;
    close $s;
    ok(MsvTest::wait_for(sub { in_use() == 0 }, 5),
       'disconnect of a non-stream client frees the slot');
}

# --- abort by id from a second request, status while running
{
    my $bg = $t->bg(stream => long_req('ab-1'));
    ok($t->bg_started($bg), 'stream ab-1 started');

    my $st = $t->get('/inference/v1/requests/ab-1');
    is($st->{status}, 200, 'status of a running request');
    is($st->{json}{source}, 'local', 'from the local slot tables');
    is($st->{json}{record}{state}, 'running', 'state running');
    is($st->{json}{record}{worker}, $w->{name}, 'its worker');
    is($st->{json}{record}{prompt_tokens}, 4, 'its prompt length');

    my $a = $t->post('/inference/v1/abort', { request_id => 'ab-1' });
    is($a->{status}, 200, 'abort 200');
    is_deeply($a->{json}, { request_id => 'ab-1', aborted => $true }, 'abort body');

    my $r = $t->bg_wait($bg, 10);
    ok($r && $r->{done}, 'the stream ended with [DONE]');
    my $last = $r->{events}[-1];
    is($last->{choices}[0]{finish_reason}, 'abort', 'finish_reason abort');
    ok($last->{usage}, 'usage in the last event');
    my $m = MsvTest::merge_events($r->{events});
    my $n = scalar @{ $m->{choices}[0]{token_ids} };
    ok($n > 0 && $n < $LONG, "partial output ($n tokens)");
    is($last->{usage}{completion_tokens}, $n, 'usage counts what was sent');
    is(scalar @{ $m->{choices}[0]{sampling_mask} }, $n, 'one mask row per token');

    is($t->get('/inference/v1/requests/ab-1')->{status}, 404,
       'no longer in flight');
    is($t->post('/inference/v1/abort', { request_id => 'ab-1' })->{status}, 404,
       'a second abort finds nothing');
}

{
    my $bg = $t->bg(generate => long_req('ab-2'));
    ok(MsvTest::wait_for(sub {
        $t->get('/inference/v1/requests/ab-2')->{status} == 200 }, 5),
       'non-stream ab-2 running');
    is($t->post('/inference/v1/abort', { request_id => 'ab-2' })->{status}, 200,
       'abort ab-2');
    my $r = $t->bg_wait($bg, 10);
    is($r->{status}, 200, 'an aborted non-stream request answers 200');
    is($r->{json}{choices}[0]{finish_reason}, 'abort', '... with finish abort');
    is(scalar @{ $r->{json}{choices}[0]{sampling_mask} },
       scalar @{ $r->{json}{choices}[0]{token_ids} }, '... and its partial rows');
}
ok(MsvTest::wait_for(sub { in_use() == 0 }, 5), 'all slots free');

# --- the worker dies (SIGKILL) mid-way
my @nginx_workers = $t->nginx_workers;
{
    my $s1 = $t->bg(stream => long_req('kill-s'));
    my $n1 = $t->bg(generate => long_req('kill-n'));
    ok($t->bg_started($s1), 'stream running');
    ok(MsvTest::wait_for(sub { in_use() >= 2 }, 5), 'both running');

    my $t0 = time;
    $t->stop_worker($w, 'KILL');

    my $rs = $t->bg_wait($s1, 10);
    my $rn = $t->bg_wait($n1, 10);
    ok($rs, 'the stream ended');
    my $last = $rs->{events}[-1];
    ok($last->{error}, 'with an error event') or diag(explain $last);
    is($last->{error}{type}, 'server_error', 'type server_error');
    like($last->{error}{message}, qr/worker/, 'saying the worker is gone');
    is($rs->{done}, 1, 'then [DONE]');
    cmp_ok($rs->{t_end} - $t0, '<', 1.0, 'within a second');

    is($rn->{status}, 502, 'the non-stream request gets 502');
    is($rn->{json}{error}{type}, 'server_error', '... server_error');
    cmp_ok($rn->{t_end} - $t0, '<', 1.0, '... within a second');

    my $r = $t->generate({ token_ids => [1], sampling_params => { max_tokens => 1 } });
    is($r->{status}, 503, 'new requests: 503');
    is($r->{json}{error}{type}, 'overloaded', '... overloaded');
    my $h = $t->get('/health');
    is($h->{status}, 503, 'health 503');
    ok(!$h->{json}{workers}[0]{attached}, 'worker detached');

    $t->restart_worker($w);
    ok(MsvTest::wait_for(sub { $t->get('/health')->{status} == 200 }, 5),
       'the restarted worker is picked up');
    # every nginx worker process attaches again on its own
    my $ok = 0;
    for (1 .. 8) {
        my $g = $t->generate({ token_ids => [1, 2], sampling_params => {
            max_tokens => 3, seed => 5 } });
        $ok++ if $g->{status} == 200 && @{ $g->{json}{choices}[0]{token_ids} } == 3;
    }
    is($ok, 8, 'requests succeed again');
    is_deeply([$t->nginx_workers], \@nginx_workers, 'without reloading nginx');
}

# --- the worker stops (SIGTERM): at the drain deadline its abort rows end
#     the requests still running
{
    my $s1 = $t->bg(stream => long_req('term-s'));
    ok($t->bg_started($s1), 'stream running');
    my $t0 = time;
    $t->stop_worker($w, 'TERM');
    my $rs = $t->bg_wait($s1, 10);
    my $last = $rs->{events}[-1];
    ok($last->{error}, 'error event on worker shutdown');
    like($last->{error}{message}, qr/shutting down|gone/, 'saying why');
    is($rs->{done}, 1, 'then [DONE]');
    cmp_ok($rs->{t_end} - $t0, '<', 3.0, 'promptly');

    is($t->generate({ token_ids => [1] })->{status}, 503, '503 while it is down');
    $t->restart_worker($w);
    ok(MsvTest::wait_for(sub {
        $t->generate({ token_ids => [1], sampling_params => { max_tokens => 1 } })
          ->{status} == 200 }, 5), 'and back after restart');
}

unlike($t->error_log, qr/\[(alert|emerg|crit)\]/, 'no alerts in the error log');

done_testing();
