#!/usr/bin/perl
# Processes killed under load: 32 requests in flight (24 streams, 8
# non-streaming) when redis-server is killed (SIGKILL), when nginx reloads
# (HUP), when one nginx worker process is killed (SIGKILL) and when the
# maskserve worker is killed (SIGKILL).  Each request must end, within a
# bound, either intact (every token, valid rows, [DONE]) or with an
# explicit error (an error event then [DONE], a 502 JSON answer, or a
# connection cut without the terminating chunk when the nginx process
# serving it died); never a hang, never fewer tokens presented as a
# complete answer.  After each fault every slot and KV page is free again.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);
use MsvTest;

my $t = MsvTest->new;
$t->start_redis;
my $w = $t->start_worker(slots => 64, max_model_len => 2048, threads => 1);
$t->start_nginx(processes => 2);
my $json = MsvTest::json();
my $true = JSON::PP::true;
my $V = $t->health->{workers}[0]{vocab_size};
our $MAX = 120;

sub stats {
    my $s = `$MsvTest::BUILD/maskserve-cli --shm $w->{name} --stats 2>/dev/null`;
    return eval { $json->decode($s) } // {};
}
my $kv0 = stats()->{kv}{free};

sub req {
    my ($tag, $i) = @_;
    return { request_id => "$tag-$i", token_ids => [1 + $i, 2, 3],
             return_sampling_mask => $true,
             sampling_logprobs_mode => $i % 2 ? 'support' : 'selected',
             sampling_params => { max_tokens => $MAX, ignore_eos => $true,
                                  top_k => 12, seed => $i } };
}

# intact | error | cut | bad: <why> | hang
sub outcome {
    my ($kind, $req, $r) = @_;
    return 'hang' unless $r;
    if ($r->{status} == 599) {
        return 'cut';          # transport error: the client knows
    }
    if ($kind eq 'generate') {
        if ($r->{status} == 502 || $r->{status} == 503) {
            return $r->{json} && $r->{json}{error}{type} ? 'error'
                                                          : 'bad: error without JSON';
        }
        return "bad: status $r->{status}" unless $r->{status} == 200;
        my $c = $r->{json}{choices}[0];
        my @p = MsvTest::choice_problems($req, $c, $V);
        return "bad: @p" if @p;
        my $n = @{ $c->{token_ids} };
        return 'error' if $c->{finish_reason} eq 'abort';
        return "bad: $n tokens with finish_reason $c->{finish_reason}"
            unless $n == $MAX && $c->{finish_reason} eq 'length';
        return 'intact';
    }
    return "bad: status $r->{status}" unless $r->{status} == 200;
    return "bad: $r->{bad} malformed events" if $r->{bad};
    return "bad: no [DONE]" unless $r->{done} == 1;
    my $last = $r->{events}[-1];
    if ($last && $last->{error}) {
        return $last->{error}{type} && $last->{error}{message}
               ? 'error' : 'bad: an error event without type or message';
    }
    my $m = MsvTest::merge_events($r->{events});
    return 'bad: an error event in the middle' unless $m;
    my $c = $m->{choices}[0];
    my @p = MsvTest::choice_problems($req, $c, $V);
    return "bad: @p" if @p;
    my $n = @{ $c->{token_ids} };
    return "bad: $n tokens then [DONE] with finish_reason "
           . ($c->{finish_reason} // 'none')
        unless $n == $MAX && ($c->{finish_reason} // '') eq 'length';
    return 'intact';
}

# Start 32 requests, run $fault once they are all under way, collect.
sub under_load {
    my ($tag, $fault) = @_;
    my @h;
    for my $i (0 .. 31) {
        my $kind = $i % 4 == 3 ? 'generate' : 'stream';
        push @h, [$kind, req($tag, $i), $t->bg($kind, req($tag, $i))];
    }
    $t->bg_started($_->[2], 20) for @h;
    MsvTest::wait_for(sub {
        my $hh = $t->health;
        $hh && $hh->{workers}[0]{attached} && $hh->{workers}[0]{slots_in_use} >= 32
    }, 10);
    my $t0 = time;
    $fault->();
    my %n;
    my @bad;
    for (@h) {
        my $o = outcome($_->[0], $_->[1], $t->bg_wait($_->[2], 60));
        $n{$o =~ /^bad/ ? 'bad' : $o}++;
        push @bad, "$_->[1]{request_id}: $o" if $o =~ /^bad|hang/;
    }
    diag(join ', ', map { "$_ $n{$_}" } sort keys %n);
    diag($_) for @bad[0 .. ($#bad > 4 ? 4 : $#bad)];
    return (\%n, time - $t0);
}

sub settled {
    my ($what) = @_;
    ok(MsvTest::wait_for(sub {
        my $h = $t->health or return 0;
        $h->{workers}[0]{attached} && $h->{workers}[0]{slots_in_use} == 0
    }, 20), "$what: every slot free again");
    ok(MsvTest::wait_for(sub { (stats()->{kv}{free} // -1) == $kv0 }, 10),
       "$what: the KV cache whole again");
}

sub works {
    my ($what) = @_;
    my $req = { token_ids => [4, 5], return_sampling_mask => $true,
                sampling_params => { max_tokens => 6, seed => 9 } };
    my $ok = MsvTest::wait_for(sub {
        my $r = $t->generate($req);
        $r->{status} == 200
            && !MsvTest::choice_problems($req, $r->{json}{choices}[0], $V);
    }, 10);
    ok($ok, "$what: new requests are served");
}

# --- redis-server killed: generation does not depend on it
{
    my ($n, $dt) = under_load('rk', sub { kill 'KILL', $t->{redis_pid} });
    waitpid($t->{redis_pid}, 0);
    $t->{redis_pid} = 0;
    is($n->{intact}, 32, 'SIGKILL redis: all 32 requests intact');
    ok(MsvTest::wait_for(sub { ($t->health // {})->{redis} eq 'down' }, 5),
       'health says redis is down');
    settled('SIGKILL redis');
    $t->start_redis;
    ok(MsvTest::wait_for(sub { ($t->health // {})->{redis} eq 'up' }, 10),
       'redis back: health says up');
}

# --- nginx reload (HUP): the old processes finish their requests
{
    my @old = $t->nginx_workers;
    my ($n, $dt) = under_load('rl', sub { $t->reload_nginx });
    is($n->{intact}, 32, 'reload: all 32 requests intact');
    ok(MsvTest::wait_for(sub {
        my %now = map { $_ => 1 } $t->nginx_workers;
        !grep { $now{$_} } @old
    }, 20), 'reload: the old worker processes exit');
    settled('reload');
    works('reload');
}

# --- one nginx worker process killed (requests long enough that the
#     victim still has some in flight when the kill lands)
{
    local $MAX = 600;
    # kill the busier one, so that some requests are surely on it
    my $victim;
    my ($n, $dt) = under_load('nk', sub {
        my %socks;
        for my $p ($t->nginx_workers) {
            opendir my $d, "/proc/$p/fd" or next;
            $socks{$p} = grep { (readlink("/proc/$p/fd/$_") // '') =~ /^socket:/ }
                         readdir $d;
        }
        ($victim) = sort { $socks{$b} <=> $socks{$a} } keys %socks;
        kill 'KILL', $victim;
    });
    ok(!$n->{bad} && !$n->{hang}, 'SIGKILL of an nginx worker: no hang, '
       . 'no silently truncated answer');
    cmp_ok($n->{cut} // 0, '>=', 1, 'its clients see the connection cut');
    is(($n->{cut} // 0) + ($n->{intact} // 0), 32,
       'the other process\'s requests are intact');
    like($t->error_log, qr/worker process $victim exited on signal 9/,
         'the master saw it die');
    settled('SIGKILL nginx worker');
    works('SIGKILL nginx worker');
}

# --- the maskserve worker killed: requests long enough to be in flight
#     whatever the stack's speed (120 tokens can all be done before the
#     kill lands)
{
    local $MAX = 1500;
    my ($n, $dt) = under_load('wk', sub { $t->stop_worker($w, 'KILL') });
    ok(!$n->{bad} && !$n->{hang} && !$n->{cut},
       'SIGKILL worker: no hang, no silently truncated answer');
    cmp_ok($n->{error} // 0, '>=', 1, 'the requests in flight end with an explicit error');
    cmp_ok($dt, '<', 5, 'within seconds');
    $t->restart_worker($w);
    settled('SIGKILL worker');
    works('SIGKILL worker, restarted');
}

# the one alert expected is the master's note of the process killed above
unlike(join("\n", grep { !/exited on signal 9/ } split /\n/, $t->error_log),
       qr/\[(alert|emerg)\]/, 'no other alerts in the error log');

done_testing;
