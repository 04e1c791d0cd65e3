#!/usr/bin/perl
# Redis end to end: a real worker, real redis-server and nginx (two worker
# processes) with the module.
#
#   - request metadata lands in <prefix>:req:<id> with every field and the
#     configured TTL, and the status endpoint returns it as JSON (escaping,
#     replies larger than hiredis's 16 KiB read, a key of the wrong type);
#   - the worker registry key and the workers set are kept;
#   - Redis stopped while requests stream: generation goes on, /health says
#     redis is down, lookups fall back at once; Redis restarted empty:
#     the metadata of requests that finished meanwhile is written again;
#   - Redis frozen (SIGSTOP): nothing hangs, the links are declared dead
#     and come back after SIGCONT, with the metadata held meanwhile;
#   - abort by id over pub/sub: a PUBLISH on <prefix>:abort, and a second
#     nginx that does not see the worker region asking through Redis;
#   - AUTH and SELECT against a password-protected Redis, and a wrong
#     password that keeps Redis down without disturbing generation;
#   - the host name resolved at configuration time (an unknown one is a
#     configuration error).

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use IO::Socket::INET;
use Math::BigInt;
use MsvTest;
use JSON::PP;
use POSIX ();
use Test::More;
use Time::HiRes qw(sleep time);

my $PREFIX = 't35';
my $HOST   = 't35-host';
my $TTL_MS = 120_000;
my $utf8   = JSON::PP->new->utf8;
my $utf8bn = JSON::PP->new->utf8->allow_bignum;   # encodes harness numbers

my $t = MsvTest->new;
$t->start_redis;
my $w = $t->start_worker(slots => 16, max_model_len => 4096);
my $region = $w->{name};
my $http = "    maskserve_redis_prefix $PREFIX;\n"
         . "    maskserve_redis_ttl 120s;\n"
         . "    maskserve_hostname $HOST;\n";
$t->start_nginx(processes => 2, http => $http);

sub rkey { "$PREFIX:req:$_[0]" }

sub redis_state {
    my $hl = $_[0]->health;
    return ($hl && $hl->{redis}) // '';
}

# Each nginx worker process has its own Redis links and its own reconnect
# backoff, and /health answers from whichever process takes the
# connection: one answer says nothing of the others.  True once every
# worker process of $t has logged both links $what ("is ready", "lost")
# after byte $from of its error log.
sub links_logged_since {
    my ($t, $from, $what) = @_;
    open my $fh, '<', "$t->{dir}/error.log" or return 0;
    seek $fh, $from, 0;
    local $/;
    my $log = <$fh> // '';
    for my $pid ($t->nginx_workers) {
        for my $link (qw(command subscriber)) {
            return 0 unless $log =~
                /\b$pid#\d+: .*maskserve redis: $link connection to \S+ $what/;
        }
    }
    return 1;
}

sub error_log_size { -s "$_[0]{dir}/error.log" // 0 }

# nginx answers /health before its Redis links finish their handshake
ok(MsvTest::wait_for(sub { redis_state($t) eq 'up' }, 10), 'health: redis up');
my $health = $t->health;
my $vocab = $health->{workers}[0]{vocab_size};
ok($vocab && $vocab > 100, "vocab size $vocab");

sub hgetall {
    my ($key) = @_;
    my $r = $t->redis_cmd('HGETALL', $key);
    return undef unless ref $r eq 'ARRAY' && @$r;
    return { @$r };
}

# wait until the request's key exists in the given state (a regex: any
# of several)
sub wait_state {
    my ($id, $state, $timeout) = @_;
    return MsvTest::wait_for(sub {
        my $h = hgetall(rkey($id));
        return $h && $h->{state} =~ /^(?:$state)\z/ ? $h : 0;
    }, $timeout // 10);
}

sub req {
    my ($id, $max, %o) = @_;
    return { request_id => $id, token_ids => [map { ($_ * 37) % $vocab } 1 .. 5],
             return_sampling_mask => JSON::PP::true,
             sampling_params => { max_tokens => $max, temperature => 1.0,
                                  top_k => 40, ignore_eos => JSON::PP::true,
                                  seed => 35 },
             %o };
}

# a streaming request in a child process; collect it with bg_wait
sub bg_stream {
    my ($tt, $r) = @_;
    my $file = $tt->dir . "/bg-$r->{request_id}.json";
    my $pid = fork() // die "fork: $!";
    if ($pid == 0) {
        my $res = $tt->stream($r);
        delete $res->{raw};
        open my $fh, '>', $file or POSIX::_exit(1);
        print $fh $utf8bn->encode($res);
        close $fh;
        POSIX::_exit(0);    # not END: the parent owns the processes
    }
    return { pid => $pid, file => $file, req => $r };
}

sub bg_wait {
    my ($bg) = @_;
    waitpid($bg->{pid}, 0);
    open my $fh, '<', $bg->{file} or return undef;
    local $/;
    my $res = eval { $utf8->decode(<$fh>) };
    return undef unless $res;
    $res->{merged} = MsvTest::merge_events($res->{events});
    return $res;
}

sub check_stream_ok {
    my ($bg, $res, $what) = @_;
    my $id = $bg->{req}{request_id};
    my $c = $res && $res->{merged} && $res->{merged}{choices}[0];
    ok($c && $res->{status} == 200 && $res->{done} && !$res->{bad},
       "$what: $id streamed to the end") or return diag(explain($res));
    my @p = MsvTest::choice_problems($bg->{req}, $c, $vocab);
    is($c->{finish_reason}, 'length', "$what: $id finish_reason length");
    is(scalar @{ $c->{token_ids} }, $bg->{req}{sampling_params}{max_tokens},
       "$what: $id every token");
    is_deeply(\@p, [], "$what: $id masks hold the invariants");
}

# ---------------------------------------------------------------- metadata

my $t0 = time;
my $r = $t->generate(req('t35-meta', 12));
is($r->{status}, 200, 'generate t35-meta') or diag($r->{content});
is($r->{json}{choices}[0]{finish_reason}, 'length', 't35-meta finished');

my $h = wait_state('t35-meta', 'finished');
ok($h, 'metadata key reaches state finished') or diag(explain(hgetall(rkey('t35-meta'))));
$h //= {};
is_deeply([sort keys %$h],
          [sort qw(host pid region slot cookie state prompt_tokens
                   completion_tokens finish_reason t_admit t_update)],
          'request key has exactly the documented fields');
is($h->{host}, $HOST, 'host field');
my %nginx_pids = map { $_ => 1 } $t->nginx_workers;
ok($nginx_pids{ $h->{pid} // 0 }, "pid $h->{pid} is an nginx worker process");
is($h->{region}, $region, 'region field');
like($h->{slot} // '', qr/^\d+$/, 'slot field');
ok(($h->{slot} // 99) < 16, 'slot within the region');
like($h->{cookie} // '', qr/^\d+$/, 'cookie field, decimal');
is($h->{prompt_tokens}, 5, 'prompt_tokens field');
is($h->{completion_tokens}, 12, 'completion_tokens field');
is($h->{finish_reason}, 'length', 'finish_reason field');
ok(($h->{t_admit} // 0) <= ($h->{t_update} // -1), 't_admit <= t_update');
ok(abs(($h->{t_update} // 0) / 1000 - time) < 30, 't_update is epoch ms, now');
ok(($h->{t_admit} // 0) / 1000 >= $t0 - 2, 't_admit not before the request');

my $pttl = $t->redis_cmd('PTTL', rkey('t35-meta'));
ok($pttl > $TTL_MS - 30_000 && $pttl <= $TTL_MS, "request key PTTL $pttl ~ 120 s");

# the status endpoint returns the record through req_get as JSON
$r = $t->get('/inference/v1/requests/t35-meta');
is($r->{status}, 200, 'status of t35-meta');
is($r->{json}{source}, 'redis', 'status answered from Redis');
my $rec = $r->{json}{record} // {};
is_deeply([sort keys %$rec], [sort keys %$h], 'record has the key\'s fields');
for my $f (qw(pid slot prompt_tokens completion_tokens t_admit t_update)) {
    ok(defined $rec->{$f} && !ref $rec->{$f} && $r->{content} =~ /"$f":\d/,
       "record $f is a JSON number");
    is($rec->{$f}, $h->{$f}, "record $f matches Redis");
}
for my $f (qw(host region cookie state finish_reason)) {
    ok($r->{content} =~ /"$f":"/, "record $f is a JSON string");
    is($rec->{$f}, $h->{$f}, "record $f matches Redis");
}

$r = $t->get('/inference/v1/requests/t35-never-seen');
is($r->{status}, 404, 'status of an unknown id: 404');

# values needing escapes, invalid UTF-8, a 100 KB reply (hiredis reads
# 16 KiB at a time), a numeric field that is not a JSON number
my $big = join '', map { chr(97 + $_ % 26) } 1 .. 100_000;
is($t->redis_cmd('HSET', rkey('t35-odd'), 'state', 'running',
                 'weird', "q\"b\\s/\n\t\x01\xc3\xa9\xff", 'payload', $big,
                 'slot', '007', 'prompt_tokens', '-12',
                 "k\"ey", 'v'), 6, 'odd record written');
$r = $t->get('/inference/v1/requests/t35-odd');
is($r->{status}, 200, 'status of the odd record');
$rec = eval { $utf8->decode($r->{content}) };
ok($rec, 'odd record is valid JSON') or diag($@);
$rec = $rec ? $rec->{record} : {};
is($rec->{weird}, "q\"b\\s/\n\t\x{01}\x{e9}\x{fffd}",
   'escapes, UTF-8 kept, invalid byte -> U+FFFD');
is(length($rec->{payload} // ''), 100_000, '100 KB value read whole');
ok(($rec->{payload} // '') eq $big, '100 KB value intact');
is($rec->{slot}, '007', '"007" stays a string');
ok($r->{content} =~ /"prompt_tokens":-12[,}]/, '-12 is a JSON number');
is($rec->{"k\"ey"}, 'v', 'escaped key');

# a key of the wrong type: Redis answers an error, the module falls back
$t->redis_cmd('SET', rkey('t35-str'), 'x');
$r = $t->get('/inference/v1/requests/t35-str');
is($r->{status}, 404, 'WRONGTYPE key: status falls back to local (404)');
is($t->health->{redis}, 'up', 'redis still up after an error reply');

# ---------------------------------------------------------------- registry

my $wkey = "$PREFIX:worker:$HOST:$region";
my $reg = MsvTest::wait_for(sub { hgetall($wkey) }, 5);
ok($reg, "registry key $wkey") or diag(explain($t->redis_cmd('KEYS', '*')));
$reg //= {};
is_deeply([sort keys %$reg],
          [sort qw(host region capacity load generation alive draining heartbeat)],
          'registry key has the documented fields');
is($reg->{host}, $HOST, 'registry host');
is($reg->{region}, $region, 'registry region');
is($reg->{capacity}, 16, 'registry capacity = slots');
is($reg->{alive}, 1, 'registry alive');
like($reg->{load} // '', qr/^\d+$/, 'registry load');
my $gen = $health->{workers}[0]{generation};
is($reg->{generation}, Math::BigInt->from_hex($gen)->bstr,
   "registry generation = worker generation $gen");
ok(abs(($reg->{heartbeat} // 0) / 1000 - time) < 5, 'registry heartbeat fresh');
$pttl = $t->redis_cmd('PTTL', $wkey);
ok($pttl > 0 && $pttl <= 10_000, "registry PTTL $pttl <= 10 s");
my $members = $t->redis_cmd('SMEMBERS', "$PREFIX:workers");
ok((grep { $_ eq "$HOST:$region" } @{ $members // [] }),
   'workers set lists host:region');

# ---------------------------------------------------------------- pub/sub

# a PUBLISH from any client aborts the request wherever it runs
my $bg = bg_stream($t, req('t35-pub', 4000));
ok(wait_state('t35-pub', 'admitted|running'), 't35-pub in flight in Redis');
ok($t->redis_cmd('PUBLISH', "$PREFIX:abort", 't35-pub') >= 2,
   'abort published, both nginx processes subscribed');
my $res = bg_wait($bg);
my $c = $res && $res->{merged} && $res->{merged}{choices}[0];
is($c && $c->{finish_reason}, 'abort', 'published abort ends the stream');
ok($c && @{ $c->{token_ids} } < 4000, 'aborted early');
$h = wait_state('t35-pub', 'aborted');
ok($h, 'aborted state in Redis');
is($h && $h->{finish_reason}, 'abort', 'finish_reason abort in Redis');

# a second nginx on another port, same Redis, that does not see the
# worker region (it names one that does not exist): it finds the request
# in Redis, publishes, and the owner aborts it
my $t2 = MsvTest->new(redis_port => $t->{redis_port});
$t2->start_nginx(processes => 1, workers => ["t35-absent-$$"], http => $http,
                 no_wait_ready => 1);
ok(MsvTest::wait_for(sub { redis_state($t2) eq 'up' }, 10),
   'second nginx: redis up');
$r = $t2->post('/inference/v1/abort', { request_id => 't35-nobody' });
is($r->{status}, 404, 'second nginx: abort of an unknown id is 404');

$bg = bg_stream($t, req('t35-remote', 4000));
ok(wait_state('t35-remote', 'admitted|running'),
   't35-remote in flight in Redis');
$r = $t2->post('/inference/v1/abort', { request_id => 't35-remote' });
is($r->{status}, 200, 'second nginx accepts the abort');
ok($r->{json} && $r->{json}{aborted}, 'second nginx: aborted true');
$res = bg_wait($bg);
$c = $res && $res->{merged} && $res->{merged}{choices}[0];
is($c && $c->{finish_reason}, 'abort', 'remote abort ends the stream');
ok($c && @{ $c->{token_ids} } < 4000, 'remote abort: early');
ok(wait_state('t35-remote', 'aborted'), 'remote abort: aborted in Redis');
$t2->stop_nginx;

# ---------------------------------------------------------------- Redis down

my @bg = map { bg_stream($t, req("t35-load-$_", 1500)) } 1 .. 6;
ok(MsvTest::wait_for(sub {
    !grep { !hgetall(rkey("t35-load-$_")) } 1 .. 6 }, 10),
   'six streams admitted and in Redis');
my @live = grep { (hgetall(rkey("t35-load-$_")) // {})->{state} =~ /admitted|running/ }
           1 .. 6;
is(scalar @live, 6, 'all six still generating when Redis stops');

my $logpos = error_log_size($t);
$t->stop_redis;
ok(MsvTest::wait_for(sub { links_logged_since($t, $logpos, 'lost') }, 5),
   'every nginx process lost its links');
ok(MsvTest::wait_for(sub { redis_state($t) eq 'down' }, 5),
   'health: redis down');
my $hd = $t->get('/health');
is($hd->{status}, 200, 'health with Redis down: still 200');
is($hd->{json} && $hd->{json}{status}, 'degraded',
   'health with Redis down: status degraded');

for my $i (1 .. 2) {
    $r = $t->generate(req("t35-down-$i", 20));
    is($r->{status}, 200, "generate t35-down-$i with Redis down");
    is($r->{json} && $r->{json}{choices}[0]{finish_reason}, 'length',
       "t35-down-$i complete");
}

$t0 = time;
$r = $t->get('/inference/v1/requests/t35-meta');
is($r->{status}, 404, 'status with Redis down: local answer');
ok(time - $t0 < 2, 'status with Redis down does not wait');

check_stream_ok($_, bg_wait($_), 'Redis down') for @bg;

is($t->health->{redis}, 'down', 'still down');

# a fresh, empty Redis on the same port
$logpos = error_log_size($t);
$t->start_redis;
ok(MsvTest::wait_for(sub { links_logged_since($t, $logpos, 'is ready') }, 10),
   'every nginx process has its links again');
ok(MsvTest::wait_for(sub { redis_state($t) eq 'up' }, 10),
   'health: redis up again');
is($t->health->{status}, 'ok', 'health: ok again with Redis back');

for my $id ((map { "t35-load-$_" } 1 .. 6), 't35-down-1', 't35-down-2') {
    my $max = $id =~ /down/ ? 20 : 1500;
    $h = wait_state($id, 'finished', 10);
    ok($h, "$id written again after the restart");
    is($h && $h->{completion_tokens}, $max, "$id completion_tokens");
    ok($h && $h->{t_admit} <= $h->{t_update}, "$id times kept");
}
ok(MsvTest::wait_for(sub { hgetall($wkey) }, 5), 'registry key back');
ok(!hgetall(rkey('t35-meta')),
   'a request written before the outage is not invented again');

# ---------------------------------------------------------------- Redis frozen

kill 'STOP', $t->{redis_pid};
ok(MsvTest::wait_for(sub { redis_state($t) eq 'down' }, 10),
   'frozen Redis: links declared dead');

$t0 = time;
$r = $t->get('/inference/v1/requests/t35-down-1');
ok($r->{status} == 404 && time - $t0 < 5, 'status with Redis frozen answers');

$r = $t->generate(req('t35-frozen', 20));
is($r->{status}, 200, 'generate with Redis frozen');
kill 'CONT', $t->{redis_pid};

ok(MsvTest::wait_for(sub { redis_state($t) eq 'up' }, 10),
   'thawed Redis: up again');
ok(wait_state('t35-frozen', 'finished'), 'metadata held while frozen is written');

# ---------------------------------------------------------------- AUTH, SELECT

# a Redis with a password, a third nginx (one process, same worker region)
# that authenticates and selects db 5
my $t3 = MsvTest->new;
my $pport = $t3->start_redis(args => ['--requirepass', 'pw35']);

# AUTH, SELECT 5 and one command on one connection; the last reply
sub authed_cmd {
    my (@args) = @_;
    my $sock = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$pport",
                                     Timeout => 5) or return undef;
    my $out = '';
    for my $cmd (['AUTH', 'pw35'], ['SELECT', 5], \@args) {
        $out .= '*' . @$cmd . "\r\n";
        $out .= '$' . length($_) . "\r\n$_\r\n" for @$cmd;
    }
    print $sock $out;
    MsvTest::redis_reply($sock) for 1 .. 2;
    return MsvTest::redis_reply($sock);
}

ok(MsvTest::wait_for(sub { (authed_cmd('PING') // '') eq 'PONG' }, 10),
   'password-protected Redis started');

my $http3 = "    maskserve_redis_prefix t35b;\n"
          . "    maskserve_redis_password pw35;\n"
          . "    maskserve_redis_db 5;\n"
          . "    maskserve_hostname $HOST;\n";
$t3->start_nginx(processes => 1, workers => [$region], http => $http3);
ok(MsvTest::wait_for(sub { redis_state($t3) eq 'up' }, 10),
   'third nginx: AUTH and SELECT accepted, redis up');

$r = $t3->generate(req('t35-auth', 10));
is($r->{status}, 200, 'generate through the third nginx');
# the record is written at admission and updated once the answer ends
# (asynchronously): wait for its last state, not for its first
my $ah;
MsvTest::wait_for(sub {
    my $v = authed_cmd('HGETALL', 't35b:req:t35-auth');
    $ah = { @$v } if ref $v eq 'ARRAY' && @$v;
    return $ah && ($ah->{state} // '') eq 'finished';
}, 10);
is($ah && $ah->{state}, 'finished', 'metadata in db 5 of the protected Redis');
is($ah && $ah->{completion_tokens}, 10, 'its completion_tokens');

# a wrong password: the links never come up, generation still works
$t3->reload_nginx(processes => 1, workers => [$region],
                  http => $http3 =~ s/pw35/wrong/r);
ok(MsvTest::wait_for(sub {
    $t3->error_log(1000) =~ /handshake refused: WRONGPASS/ }, 10),
   'wrong password: handshake refused, logged');
ok(MsvTest::wait_for(sub { redis_state($t3) eq 'down' }, 10),
   'wrong password: redis down');
$r = $t3->generate(req('t35-wrongpass', 10));
is($r->{status}, 200, 'generate with the wrong Redis password');
$t3->stop_nginx;

# ------------------------------------------- names resolved at config time

# The Redis host is resolved when nginx reads its configuration, not in
# the worker processes: a name resolves (localhost), an unknown one is a
# configuration error, and either way no worker process waits on DNS.
{
    my $t4 = MsvTest->new;
    my $conf = $t4->write_conf(workers => [$region],
        http => "    maskserve_redis localhost:$pport;\n");
    my $out = `$MsvTest::NGINX -t -p ${\ $t4->dir}/ -c $conf 2>&1`;
    is($? >> 8, 0, 'maskserve_redis localhost: configuration ok')
        or diag($out);

    $conf = $t4->write_conf(workers => [$region],
        http => "    maskserve_redis no-such-host.invalid:6379;\n");
    $out = `$MsvTest::NGINX -t -p ${\ $t4->dir}/ -c $conf 2>&1`;
    isnt($? >> 8, 0, 'an unknown Redis host fails the configuration');
    like($out, qr/maskserve_redis: host "no-such-host\.invalid" not found/,
         '... naming the host');
}

# ---------------------------------------------------------------- logs

my $log = $t->error_log(100_000);
like($log, qr/maskserve redis: command connection to 127\.0\.0\.1:\d+ lost/,
     'loss logged');
like($log, qr/maskserve redis: command connection to .* is ready again/,
     'recovery logged');
my @bad = grep { /\[(alert|crit|emerg)\]/ } split /\n/, $log;
is_deeply(\@bad, [], 'no alert, crit or emerg in the error log');

done_testing();
