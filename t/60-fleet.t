#!/usr/bin/perl
# The front role on loopback: one Redis, two "GPU hosts" (each an nginx
# with the module and a CPU worker, registering itself in Redis with its
# address) and a front nginx that has no worker and routes through the
# maskserve_fleet upstream.
#
#   - the front's /health lists both hosts, their address and state;
#   - requests spread by load: with one host busy, new requests go to the
#     other; concurrent requests use both;
#   - affinity (a request header): one group always lands on one host,
#     and different groups use both hosts;
#   - request status and abort by id through the front reach the host
#     that runs the request; an unknown id is a 404 naming request_id;
#   - the front reloaded: a stream across the reload finishes, the new
#     processes (which hold requests until their first registry read)
#     route;
#   - Redis frozen: generation through the front goes on, both hosts stay
#     up, requests by id get a 503 quickly;
#   - a host killed mid-load: its streams end with an explicit error (an
#     error event naming the host, then a truncated chunked body, not a
#     clean end) within seconds, the other
#     host's streams finish, new requests go to the other host, the dead
#     host is shown failing then stale, and nothing hangs;
#   - control endpoints fanned out from the front: pause pauses both
#     hosts (each host's /health), resume resumes both, a weight update
#     reaches both, flush and abort_requests (all) too, a bad field is the
#     hosts' 400, and with one host down the answer names it as failed;
#   - a host drained (SIGTERM to its worker) mid-load: its short streams
#     finish, its long ones end at --drain-timeout with the "shutting
#     down" error, it leaves the registry and the front's choice at once
#     (not after the keys expire), new requests all go to the other host,
#     and it registers again when its worker is back;
#   - configuration errors (nginx -t).
#
# With MSV_FLEET_NETNS=1 (t/61-fleet-netns.t) each host runs in its own
# network namespace instead.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use HTTP::Tiny;
use JSON::PP;
use POSIX qw(:sys_wait_h);
use Test::More;
use Time::HiRes qw(sleep time);
use MsvTest;

my $PREFIX = 't60';
my $DRAIN = 2;      # the hosts' --drain-timeout, s
my $MODEL;          # the hosts' checkpoint, which update_weights reloads
my $true = JSON::PP::true;
my $json = JSON::PP->new->canonical;

# ---------------------------------------------------------------- setup

# MSV_FLEET_NETNS=1 (t/61-fleet-netns.t): each GPU host runs in its own
# network namespace, reached over a veth pair, instead of on loopback.
my $NETNS = $ENV{MSV_FLEET_NETNS};
my $K = 100 + $$ % 100;    # 10.$K.<host>.0/24
my @ns;

# a host harness whose processes run in its namespace, at its address
package NsHost {
    our @ISA = ('MsvTest');
    sub _spawn {
        my ($self, $log, @cmd) = @_;
        @cmd = ('ip', 'netns', 'exec', $self->{netns}, @cmd) if $self->{netns};
        return $self->SUPER::_spawn($log, @cmd);
    }
    sub nginx_conf {
        my ($self, @o) = @_;
        my $c = $self->SUPER::nginx_conf(@o);
        if ($self->{netns}) {
            $c =~ s/listen 127\.0\.0\.1:/listen $self->{addr}:/;
            $c =~ s/maskserve_redis 127\.0\.0\.1:/maskserve_redis $self->{gw}:/;
        }
        return $c;
    }
    sub url { "http://" . ($_[0]{addr} // '127.0.0.1') . ":$_[0]{port}$_[1]" }
}

sub sh { system(@_) == 0 or die "t60: @_ failed\n" }

sub netns_up {
    my ($i) = @_;
    my ($n, $vr, $vh) = map { sprintf "%s%d%s%d", $_->[0], $$, $_->[1], $i }
                        ['msv', 'h'], ['mv', 'a'], ['mv', 'b'];
    push @ns, [$n, $vr];
    sh('ip', 'netns', 'add', $n);
    sh('ip', 'link', 'add', $vr, 'type', 'veth', 'peer', 'name', $vh);
    sh('ip', 'link', 'set', $vh, 'netns', $n);
    sh('ip', 'addr', 'add', "10.$K.$i.1/24", 'dev', $vr);
    sh('ip', 'link', 'set', $vr, 'up');
    sh('ip', 'netns', 'exec', $n, 'ip', 'addr', 'add', "10.$K.$i.2/24", 'dev', $vh);
    sh('ip', 'netns', 'exec', $n, 'ip', 'link', 'set', $vh, 'up');
    sh('ip', 'netns', 'exec', $n, 'ip', 'link', 'set', 'lo', 'up');
    return (netns => $n, addr => "10.$K.$i.2", gw => "10.$K.$i.1");
}

END {
    for (@ns) {
        system('ip', 'link', 'del', $_->[1]);
        system('ip', 'netns', 'del', $_->[0]);
    }
}

my %nsa = $NETNS ? netns_up(1) : ();
my %nsb = $NETNS ? netns_up(2) : ();

my $rd = MsvTest->new;    # Redis, beside the front
my $rport = $rd->start_redis(args => $NETNS
    ? ['--bind', '127.0.0.1', $nsa{gw}, $nsb{gw}, '--protected-mode', 'no']
    : []);
# the tiny fixture with room for streams that outlast the drain on any
# backend
$MODEL = $rd->long_context_model(32768);

my $ha = NsHost->new(redis_port => $rport, %nsa);
my $hb = NsHost->new(redis_port => $rport, %nsb);

my %host;    # address -> name
for my $h ([$ha, 'gpu-a'], [$hb, 'gpu-b']) {
    my ($t, $name) = @$h;
    my $addr = $t->{addr} // '127.0.0.1';
    $t->{port} = MsvTest::free_port();
    $t->start_worker(name => "t60-$$-$name", slots => 32, max_model_len => 32768,
                     model_dir => $MODEL,
                     args => ['--weight-version', 'w0', '--drain-timeout', $DRAIN]);
    $host{"$addr:$t->{port}"} = $name;
    $t->start_nginx(processes => 1, http =>
          "    maskserve_redis_prefix $PREFIX;\n"
        . "    maskserve_hostname $name;\n"
        . "    maskserve_fleet_address $addr:$t->{port};\n",
        server => join '', map { "        location = /inference/v1/$_->[0] {\n"
                                 . "            $_->[1];\n        }\n" }
            ['pause', 'maskserve_pause'], ['resume', 'maskserve_resume'],
            ['update_weights_from_disk', 'maskserve_update_weights'],
            ['flush_cache', 'maskserve_flush_cache'],
            ['abort_requests', 'maskserve_abort_requests']);
}

my $f = MsvTest->new(redis_port => $rport);
$f->{port} = MsvTest::free_port();
{
    my $d = $f->dir;
    my $user = $> == 0 ? "user root;\n" : '';
    open my $fh, '>', "$d/nginx.conf" or die;
    print $fh <<"EOF";
load_module $f->{so};
$user
worker_processes 2;
error_log $d/error.log info;
pid $d/nginx.pid;

events {
    worker_connections 2048;
}

http {
    access_log $d/access.log;
    client_body_temp_path $d/body;
    proxy_temp_path $d/proxy;
    fastcgi_temp_path $d/fastcgi;
    uwsgi_temp_path $d/uwsgi;
    scgi_temp_path $d/scgi;

    maskserve_redis 127.0.0.1:$rport;
    maskserve_redis_prefix $PREFIX;

    upstream gpu_hosts {
        maskserve_fleet affinity=\$http_x_maskserve_affinity stale=2s
                        fail_timeout=30s;
        keepalive 16;
    }

    server {
        listen 127.0.0.1:$f->{port};
        include $MsvTest::ROOT/docs/nginx-errors.conf;

        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_buffering off;
        proxy_read_timeout 60s;
        add_header X-Maskserve-Upstream \$upstream_addr always;

        location = /inference/v1/generate {
            proxy_pass http://gpu_hosts;
        }

        location = /inference/v1/abort {
            maskserve_fleet_owner on;
            proxy_pass http://gpu_hosts;
        }

        location /inference/v1/requests/ {
            maskserve_fleet_owner on;
            proxy_pass http://gpu_hosts;
        }

        location = /health {
            maskserve_fleet_health;
        }

        # control endpoints: to every GPU host, one answer
        location = /inference/v1/pause {
            maskserve_fleet_control /fleet_host;
        }

        location = /inference/v1/resume {
            maskserve_fleet_control /fleet_host;
        }

        location = /inference/v1/update_weights_from_disk {
            maskserve_fleet_control /fleet_host;
        }

        location = /inference/v1/flush_cache {
            maskserve_fleet_control /fleet_host;
        }

        location = /inference/v1/abort_requests {
            maskserve_fleet_control /fleet_host draining;
        }

        location = /fleet_host {
            internal;
            proxy_pass http://\$maskserve_fleet_host\$request_uri;
            proxy_connect_timeout 2s;
            proxy_read_timeout 120s;
            subrequest_output_buffer_size 64k;
        }
    }
}
EOF
    close $fh;
    $f->{nginx_pid} = $f->_spawn("$d/nginx.out", $MsvTest::NGINX, '-p', "$d/",
                                 '-c', "$d/nginx.conf", '-g', 'daemon off;');
}

sub fhealth {
    my $r = $f->get('/health');
    return $r->{json} ? { %{ $r->{json} }, _status => $r->{status} } : undef;
}

sub hstate {
    my ($hl, $name) = @_;
    my ($h) = grep { $_->{host} eq $name } @{ $hl->{hosts} // [] };
    return $h ? $h->{state} : '';
}

# /health says what the process that answers knows: each front process
# reads the registry on its own, so the checks below are made on the answer
# of one that has read it and sees both hosts
my $hl;
ok(MsvTest::wait_for(sub {
    $hl = fhealth() or return 0;
    return hstate($hl, 'gpu-a') eq 'up' && hstate($hl, 'gpu-b') eq 'up';
}, 20), 'front: both hosts up') or do {
    diag($f->error_log(30), MsvTest::_tail($f->dir . "/nginx.out"),
         MsvTest::_tail($ha->dir . "/error.log", 10));
    done_testing();
    exit 1;    # the rest would only wait on what is not there
};

is($hl->{_status}, 200, 'front /health 200')
    or diag(explain($hl), $f->error_log(40));
is($hl->{role}, 'front', 'role front');
is($hl->{redis}, 'up', 'front sees Redis');
is($hl->{status}, 'ok', 'status ok');
for my $h (@{ $hl->{hosts} }) {
    is($host{$h->{address}}, $h->{host}, "host $h->{host} at $h->{address}");
    is($h->{ready_regions}, 1, "$h->{host}: one ready region");
    is($h->{capacity}, 32, "$h->{host}: capacity 32");
}
is($f->post('/health', {})->{status}, 405, 'front /health: POST is 405');

my $vocab = $ha->health->{workers}[0]{vocab_size} or diag(JSON::PP->new->encode($ha->health));

# ---------------------------------------------------------------- helpers

my $http = HTTP::Tiny->new(timeout => 60, keep_alive => 0);

sub req {
    my ($id, $max, %o) = @_;
    return { request_id => $id, token_ids => [map { ($_ * 31) % $vocab } 1 .. 6],
             return_sampling_mask => ($o{mask} // 1) ? $true : JSON::PP::false,
             sampling_params => { max_tokens => $max, ignore_eos => $true,
                                  top_k => 8, seed => 7 } };
}

# the host that answered, from the front's X-Maskserve-Upstream (every
# try's address: the last one answered)
sub upstream_host {
    my ($r) = @_;
    my @up = split /, /, $r->{headers}{'x-maskserve-upstream'} // '';
    return @up ? $host{$up[-1]} // $up[-1] : '';
}

# one request to $t (the front or a host); returns status, the host that
# served it (front only), the parsed body, or for streams the events
sub call {
    my ($t, $req, %o) = @_;
    my ($raw, $done, @ev) = ('', 0);
    my $r = $http->request('POST', $t->url('/inference/v1/generate'), {
        headers => { 'Content-Type' => 'application/json',
                     %{ $o{headers} // {} } },
        content => $json->encode({ %$req, stream => $o{stream} ? $true
                                                 : JSON::PP::false }),
        $o{stream} ? (data_callback => sub {
            $raw .= $_[0];
            while ($raw =~ s/^data: (.*?)\n\n//s) {
                if ($1 eq '[DONE]') { $done++; next }
                push @ev, eval { $json->decode($1) };
                $o{on_event}->() if $o{on_event};
            }
        }) : (),
    });
    my $up = upstream_host($r);
    return { status => $r->{status}, host => $up,
             tries => [split /, /, $r->{headers}{'x-maskserve-upstream'} // ''],
             json => (!$o{stream} && $r->{status} < 599
                      ? eval { $json->decode($r->{content}) } : undef),
             events => \@ev, done => $done,
             content => $o{stream} ? '' : $r->{content} // '' };
}

# call() in a child process; bg_wait returns its result (or undef)
my $seq = 0;
sub bg {
    my ($t, $req, %o) = @_;
    my $file = $f->dir . "/bg-" . ++$seq;
    my $pid = fork() // die;
    if ($pid == 0) {
        my $first = 0;
        my $r = call($t, $req, %o, on_event => sub {
            return if $first++;
            open my $fh, '>', "$file.first"; close $fh;
        });
        $r->{t_end} = time;
        open my $fh, '>', "$file.tmp"; print $fh $json->encode($r); close $fh;
        rename "$file.tmp", $file;
        POSIX::_exit(0);
    }
    return { pid => $pid, file => $file };
}

sub bg_started { my $h = shift; MsvTest::wait_for(sub { -e "$h->{file}.first" }, 20) }

sub bg_wait {
    my ($h, $timeout) = @_;
    my $ok = MsvTest::wait_for(sub { waitpid($h->{pid}, WNOHANG) == $h->{pid} },
                               $timeout, 0.02);
    if (!$ok) { kill 'KILL', $h->{pid}; waitpid($h->{pid}, 0); return undef }
    open my $fh, '<', $h->{file} or return undef;
    local $/;
    return $json->decode(<$fh>);
}

# SIGKILL a host's nginx: the master first, then its worker processes.
# Killed in the other order (or together), a master that runs between the
# two kills starts a new worker in place of the one that died; that one
# outlives the master, orphaned, on the host's listening socket, and
# answers (a 503 once the host's worker is gone too) as if the host lived.
sub kill_nginx {
    my ($t) = @_;
    my @w = $t->nginx_workers;
    kill 'KILL', $t->{nginx_pid};
    waitpid($t->{nginx_pid}, 0);
    $t->{nginx_pid} = 0;
    kill 'KILL', @w;
    # gone, or a zombie (its sockets closed) waiting for init
    MsvTest::wait_for(sub {
        !grep { my $fh; open($fh, '<', "/proc/$_/stat")
                        && (<$fh> // '') !~ /^\d+ \(.*?\) Z/ } @w
    }, 10) or diag("kill_nginx: worker processes @w still run");
}

sub abort_on {
    my ($t, $id) = @_;
    return $t->post('/inference/v1/abort', { request_id => $id });
}

# ---------------------------------------------------------------- routing

{
    my $r = call($f, req('f-one', 4));
    is($r->{status}, 200, 'generate through the front');
    like($r->{host}, qr/^gpu-[ab]$/, "served by $r->{host}");
    my @p = MsvTest::choice_problems(req('f-one', 4), $r->{json}{choices}[0], $vocab);
    is_deeply(\@p, [], 'the answer passes the mask checks');
    is($r->{json}{request_id}, 'f-one', 'request id kept');

    my $s = call($f, req('f-stream', 5), stream => 1);
    is($s->{status}, 200, 'stream through the front');
    ok($s->{done}, 'the stream ends with [DONE]');
    my $m = MsvTest::merge_events($s->{events});
    ok($m && @{ $m->{choices}[0]{token_ids} } == 5, 'five tokens streamed');
}

# by load: host A busy with 8 long streams (sent to it directly); once
# the registry shows it, every new request goes to B
{
    my $n_busy = $ha->tokens_lasting(4, 32000);    # outlasting the checks
    my @busy = map { bg($ha, req("busy-$_", $n_busy, mask => 0), stream => 1) } 1 .. 8;
    bg_started($_) for @busy;
    ok(MsvTest::wait_for(sub {
        my ($h) = grep { $_->{host} eq 'gpu-a' } @{ fhealth()->{hosts} };
        return $h && $h->{load} >= 8;
    }, 5), 'the front sees the load of host A');
    sleep 0.6;    # every front process has read it (refresh is 250 ms)

    my @hosts = map { call($f, req("by-load-$_", 3))->{host} } 1 .. 6;
    is_deeply(\@hosts, [('gpu-b') x 6], 'with A loaded, requests go to B')
        or diag(explain([fhealth(), fhealth()]));

    is(abort_on($ha, "busy-$_")->{status}, 200, "busy-$_ aborted") for 1 .. 8;
    bg_wait($_, 20) for @busy;
    ok(MsvTest::wait_for(sub {
        !grep { $_->{load} > 0 } @{ fhealth()->{hosts} } }, 5), 'load back to 0');

    # concurrent requests: the front's own in-flight count spreads them
    my @h = map { bg($f, req("spread-$_", 60), stream => 1) } 1 .. 12;
    my %n;
    for (@h) { my $r = bg_wait($_, 60); $n{$r ? $r->{host} : 'none'}++ }
    ok(($n{'gpu-a'} // 0) >= 3 && ($n{'gpu-b'} // 0) >= 3,
       "12 concurrent streams spread over both hosts (a=" . ($n{'gpu-a'} // 0)
       . " b=" . ($n{'gpu-b'} // 0) . ")");
}

# affinity: a group's requests land on one host; groups use both
my %key_of;    # host -> an affinity key that lands there
{
    for my $g (1 .. 16) {
        my %seen;
        for my $i (1 .. 3) {
            my $r = call($f, req("aff-$g-$i", 2),
                         headers => { 'X-Maskserve-Affinity' => "group-$g" });
            $seen{$r->{status} == 200 ? $r->{host} : "status $r->{status}"}++;
        }
        my @hs = keys %seen;
        is(scalar @hs, 1, "group-$g: 3 requests on one host (@hs)");
        $key_of{$hs[0]} //= "group-$g";
    }
    ok($key_of{'gpu-a'} && $key_of{'gpu-b'}, 'the groups use both hosts');
}

# status and abort by id through the front reach the owner
{
    my $h = bg($f, req('own-1', 4000), stream => 1,
               headers => { 'X-Maskserve-Affinity' => $key_of{'gpu-b'} });
    ok(bg_started($h), 'a long stream on B');
    my $st = $f->get('/inference/v1/requests/own-1');
    is($st->{status}, 200, 'status through the front');
    is(upstream_host($st), 'gpu-b', 'answered by the host that runs it');
    is($st->{json}{record}{host}, 'gpu-b', 'the record names it');
    like($st->{json}{record}{state}, qr/^(admitted|running)$/, 'running');
    my $ab = abort_on($f, 'own-1');
    is($ab->{status}, 200, 'abort through the front');
    is(upstream_host($ab), 'gpu-b', 'sent to the host that runs it');
    ok($ab->{json}{aborted}, 'aborted: true');
    my $r = bg_wait($h, 20);
    ok($r && $r->{done}, 'the stream ended cleanly');
    my $m = $r && MsvTest::merge_events($r->{events});
    is($m && $m->{choices}[0]{finish_reason}, 'abort', 'finish_reason abort');

    my $nf = abort_on($f, 'no-such-id');
    is($nf->{status}, 404, 'abort of an unknown id: 404');
    is($nf->{json}{error}{param}, 'request_id', '... naming request_id');
    is($f->get('/inference/v1/requests/no-such-id')->{status}, 404,
       'status of an unknown id: 404');
    my $bad = abort_on($f, '');
    is($bad->{status}, 400, 'abort without an id: 400');
    is($bad->{json}{error}{param}, 'request_id', '... naming request_id');
    is($f->post('/inference/v1/abort', '{not json')->{status}, 400,
       'abort with a bad body: 400');
    is($f->get('/inference/v1/requests/bad%20id')->{status}, 400,
       'status with an invalid id: 400');
}

# Redis frozen: the front keeps routing on the table it read last, and
# requests by id, which need Redis, get a 503 at once or within the 2 s
# reply timeout
{
    kill 'STOP', $rd->{redis_pid};
    # each of the front's nginx workers has its own Redis connection and
    # notices the freeze on its own next command; a read answers from
    # either worker: six in a row saying down, each worker has noticed
    ok(MsvTest::wait_for(sub {
           !grep { ((fhealth() // {})->{redis} // '') ne 'down' } 1 .. 6
       }, 8), 'front: Redis down, in every worker');
    my @st = map { call($f, req("no-redis-$_", 3))->{status} } 1 .. 4;
    is_deeply(\@st, [200, 200, 200, 200], 'generation goes on through the front');
    my $hl;
    ok(MsvTest::wait_for(sub {
           $hl = fhealth();
           ($hl->{redis} // '') eq 'down';
       }, 4), 'health still says Redis down');
    is(hstate($hl, 'gpu-a') . ' ' . hstate($hl, 'gpu-b'), 'up up',
       'both hosts still up (no staleness while Redis is away)');
    is($hl->{status}, 'degraded', 'status degraded');
    my $t0 = time;
    my $ab = abort_on($f, 'f-one');
    is($ab->{status}, 503, 'abort by id without Redis: 503');
    like($ab->{json}{error}{message} // '', qr/Redis/, '... saying why');
    cmp_ok(time - $t0, '<', 3, '... without waiting long');
    kill 'CONT', $rd->{redis_pid};
    ok(MsvTest::wait_for(sub { (fhealth() // {})->{redis} eq 'up'
                               && (fhealth() // {})->{redis} eq 'up' }, 10),
       'front: Redis back');
}

# the front reloaded: new worker processes read the registry afresh, the
# old ones exit with their scans and streams
{
    my @old = $f->nginx_workers;
    my $h = bg($f, req('reload-1', 200), stream => 1);
    bg_started($h);
    kill 'HUP', $f->{nginx_pid};
    ok(MsvTest::wait_for(sub {
        my %o = map { $_ => 1 } @old;
        my @now = $f->nginx_workers;
        return @now == 2 && !grep { $o{$_} } @now;
    }, 20), 'front reloaded: old worker processes gone');
    my $r = bg_wait($h, 30);
    ok($r && $r->{done}, 'a stream across the reload finished');
    ok(MsvTest::wait_for(sub { (fhealth() // {})->{hosts_up} == 2 }, 10),
       'the new processes see both hosts');
    is(call($f, req('after-reload', 3))->{status}, 200, 'and route');
    unlike($f->error_log, qr/\[alert\]|\[crit\]|exited on signal/, 'no alert or crash');
}

# ---------------------------------------------------------------- control fan-out

sub fan { my ($path, $body) = @_; $f->post("/inference/v1/$path", $body // {}) }
sub by_host { +{ map { $_->{host} => $_ } @{ ($_[0]{json} // {})->{hosts} // [] } } }
sub wstate { my $h = $_[0]->health; $h ? $h->{workers}[0] : {} }

{
    my $p = fan('pause', { mode => 'abort' });
    is($p->{status}, 200, 'pause from the front: 200') or diag($p->{content});
    my $bh = by_host($p);
    is_deeply([sort keys %$bh], ['gpu-a', 'gpu-b'], '... the answer names both hosts');
    for my $n ('gpu-a', 'gpu-b') {
        is($host{$bh->{$n}{address} // ''}, $n, "... $n with its address");
        is($bh->{$n}{status}, 200, "... $n: 200");
        ok($bh->{$n}{ok} && $bh->{$n}{response}{paused}, "... $n: paused, says its answer");
    }
    is($p->{json}{hosts_ok}, 2, '... hosts_ok 2');
    is_deeply($p->{json}{failed}, [], '... none failed');
    is(wstate($_)->{pause_state}, 'paused', "host /health: paused") for $ha, $hb;
    is(call($f, req('while-paused', 2))->{status}, 503,
       'generate through the front while both are paused: 503');

    my $rs = fan('resume');
    is($rs->{status}, 200, 'resume from the front: 200') or diag($rs->{content});
    ok(by_host($rs)->{$_}{response}{resumed}, "... $_ resumed") for 'gpu-a', 'gpu-b';
    is(wstate($_)->{pause_state}, 'running', "host /health: running") for $ha, $hb;
    is(call($f, req('after-resume', 2))->{status}, 200, 'generation through the front again');

    my $u = fan('update_weights_from_disk',
                { model_path => $MODEL, weight_version => 'fleet-2' });
    is($u->{status}, 200, 'weight update from the front: 200') or diag($u->{content});
    for my $n ('gpu-a', 'gpu-b') {
        my $h = by_host($u)->{$n} // {};
        ok($h->{ok} && $h->{response}{updated}, "... $n updated, says its answer");
        is($h->{response}{weight_version}, 'fleet-2', "... $n: weight_version fleet-2");
    }
    is(wstate($_)->{weight_version}, 'fleet-2', 'host /health: serves fleet-2') for $ha, $hb;

    my $fl = fan('flush_cache');
    is($fl->{status}, 200, 'flush_cache from the front: 200');
    ok(by_host($fl)->{$_}{response}{flushed}, "... $_ flushed") for 'gpu-a', 'gpu-b';

    # abort_requests with no ids: every request in flight on every host
    my @s = map { bg($f, req("fan-abort-$_", 4000), stream => 1,
                     headers => { 'X-Maskserve-Affinity' => $key_of{$_} }) } 'gpu-a', 'gpu-b';
    bg_started($_) for @s;
    my $ab = fan('abort_requests', {});
    is($ab->{status}, 200, 'abort_requests (all) from the front: 200');
    is(by_host($ab)->{$_}{response}{aborted}, 1, "... one aborted on $_") for 'gpu-a', 'gpu-b';
    for (@s) {
        my $r = bg_wait($_, 20);
        my $m = $r && MsvTest::merge_events($r->{events});
        is($m && $m->{choices}[0]{finish_reason}, 'abort', '... its stream ends, finish_reason abort');
    }

    # bad input: every host refuses it alike, and the front says so
    my $bad = fan('pause', { mode => 'sideways' });
    is($bad->{status}, 400, 'a bad mode: 400, as the hosts answer');
    is($bad->{json}{error}{type}, 'invalid_request_error', '... invalid_request_error');
    like($bad->{json}{error}{message} // '', qr/^2 of 2 GPU hosts failed: gpu-[ab] .*; gpu-[ab] /,
         '... naming the hosts');
    is(by_host($bad)->{$_}{response}{error}{param}, 'mode', "... $_ names the field mode")
        for 'gpu-a', 'gpu-b';
    is(wstate($_)->{pause_state}, 'running', 'and nothing paused') for $ha, $hb;
    is($f->get('/inference/v1/pause')->{status}, 405, 'GET on a fan-out endpoint: 405');
}

# ---------------------------------------------------------------- drain

# a host drained mid-load: SIGTERM to its worker
{
    my ($wa) = values %{ $ha->{workers} };
    my $hdr = { 'X-Maskserve-Affinity' => $key_of{'gpu-a'} };
    my @short = map { req("drain-short-$_", 400) } 1 .. 2;
    # long enough to outlast the drain on any backend
    my $n_long = $ha->tokens_lasting($DRAIN + 4, 32000);
    # (no masks: a GPU streams tens of thousands of events meanwhile)
    my @long = map { req("drain-long-$_", $n_long, mask => 0) } 1 .. 2;
    # the long ones first; SIGTERM as soon as the short ones run
    my @bl = map { bg($f, $_, stream => 1, headers => $hdr) } @long;
    ok(bg_started($_), 'a long stream on A') for @bl;
    my @bs = map { bg($f, $_, stream => 1, headers => $hdr) } @short;
    ok(bg_started($_), 'a short stream on A') for @bs;
    my $logpos = -s $wa->{log};
    my $t0 = time;
    kill 'TERM', $wa->{pid};

    ok(MsvTest::wait_for(sub {
        my $h = fhealth(); my $g = fhealth();
        hstate($h, 'gpu-a') =~ /^(draining|gone)$/ && hstate($g, 'gpu-a') =~ /^(draining|gone)$/;
    }, 2, 0.02), 'the front sees A draining within 2 s');
    my @hosts = map {
        my $r = call($f, req("drain-new-$_", 3), headers => $hdr);
        $r->{status} == 200 ? $r->{host} : "status $r->{status}";
    } 1 .. 6;
    is_deeply(\@hosts, [('gpu-b') x 6], "new requests, A's group included, all go to B");
    my $direct = $ha->generate({ token_ids => [1], sampling_params => { max_tokens => 1 } });
    is($direct->{status}, 503, "A's nginx takes no new request: 503");
    ok($direct->{headers}{'retry-after'}, '... with Retry-After');

    my $st;
    MsvTest::wait_for(sub {
        my $r = waitpid($wa->{pid}, WNOHANG);
        $st = $? if $r == $wa->{pid};
        $r == $wa->{pid};
    }, $DRAIN + 8);
    my $t_exit = time;
    is($st, 0, "the worker exits 0");
    cmp_ok($t_exit - $t0, '<', $DRAIN + 3, "within --drain-timeout ($DRAIN s) and a margin");
    $wa->{pid} = 0;
    like(MsvTest::_tail($wa->{log}, 30), qr/stopping: draining 4 requests/,
         'the 4 streams were in flight when the drain began');

    for my $i (0 .. $#bs) {
        my $r = bg_wait($bs[$i], 20);
        my $m = $r && $r->{done} && MsvTest::merge_events($r->{events});
        my $c = $m && $m->{choices}[0];
        ok($c && $c->{finish_reason} eq 'length' && @{ $c->{token_ids} } == 400
           && !MsvTest::choice_problems($short[$i], $c, $vocab),
           'a short stream on A finishes whole during the drain');
    }
    for my $h (@bl) {
        my $r = bg_wait($h, 20);
        my $e = $r && $r->{events}[-1]{error};
        ok($r && $r->{done} && $e && ($e->{message} // '') =~ /shutting down/,
           'a long one ends at the deadline with the "shutting down" error and [DONE]')
            or diag(explain($r && $r->{events}[-1]));
    }

    ok(MsvTest::wait_for(sub {
        hstate(fhealth(), 'gpu-a') eq 'gone' && hstate(fhealth(), 'gpu-a') eq 'gone' }, 2, 0.02),
       'A is gone from the front within 2 s of the exit (its keys did not expire: removed)');
    cmp_ok(time - $t_exit, '<', 3, '... not after the 10 s expiry');
    is_deeply($rd->redis_cmd('KEYS', "$PREFIX:worker:gpu-a:*"), [], "A's registry key is removed");
    ok(!grep({ /^gpu-a:/ } @{ $rd->redis_cmd('SMEMBERS', "$PREFIX:workers") // [] }),
       "... and its member of $PREFIX:workers");
    like($ha->error_log, qr/deregistered \(drained\)/, "A's nginx logs the deregistration");
    is(hstate(fhealth(), 'gpu-b'), 'up', 'B stays up');

    $ha->restart_worker($wa);
    ok(MsvTest::wait_for(sub {
        hstate(fhealth(), 'gpu-a') eq 'up' && hstate(fhealth(), 'gpu-a') eq 'up' }, 10),
       'its worker back, A registers again and is up');
    my $r = call($f, req('drain-back', 3), headers => $hdr);
    is($r->{host}, 'gpu-a', "A's group goes to A again");
}

# a host killed mid-load
{
    my @on_a = map { bg($f, req("kill-a-$_", 4000), stream => 1,
                        headers => { 'X-Maskserve-Affinity' => $key_of{'gpu-a'} }) } 1 .. 3;
    my @on_b = map { bg($f, req("kill-b-$_", 400), stream => 1,
                        headers => { 'X-Maskserve-Affinity' => $key_of{'gpu-b'} }) } 1 .. 3;
    bg_started($_) for @on_a, @on_b;

    # the host dies: its nginx and its worker, without a word
    kill_nginx($ha);
    $ha->stop_worker($_, 'KILL') for values %{ $ha->{workers} };
    my $t_kill = time;

    # a control request meanwhile: the dead host (its keys not yet
    # expired) is named as failed, the live one did it
    my $fl = fan('flush_cache');
    is($fl->{status}, 502, 'flush_cache from the front with a host down: 502');
    is_deeply($fl->{json}{failed}, ['gpu-a'], '... naming it as failed');
    is(by_host($fl)->{'gpu-b'}{status}, 200, '... the live host did it');
    ok(!by_host($fl)->{'gpu-a'}{ok} && by_host($fl)->{'gpu-a'}{error},
       '... the dead one: not ok, and why');
    like($fl->{json}{error}{message} // '', qr/^1 of 2 GPU hosts failed: gpu-a \([\d.]+:\d+\) 502/,
         '... in the message too');

    for my $h (@on_a) {
        my $r = bg_wait($h, 15);
        ok($r, 'a stream on the dead host ends (no hang)');
        next unless $r;
        my $last = $r->{events}[-1] // {};
        is($last->{error}{code}, 502, '... with an error event, code 502');
        like($last->{error}{message} // '',
             qr/^the GPU host [\d.]+:\d+ serving this request went away mid-stream/,
             '... naming the host');
        ok(@{ $r->{events} } > 1, '... after the events it had streamed');
        is($r->{status}, 599, '... and a truncated chunked body (no clean end)');
        cmp_ok($r->{t_end} - $t_kill, '<', 5, '... within 5 s');
    }
    for my $h (@on_b) {
        my $r = bg_wait($h, 60);
        ok($r && $r->{done} && $r->{host} eq 'gpu-b', 'a stream on the live host finishes');
    }

    # new requests: to B, the group of A included (the first try on A is
    # refused and retried on B by nginx; then A is skipped)
    my $tried_a = 0;    # tries on A: none once it was stale before these
    my @hosts = map {
        my $r = call($f, req("after-$_", 3),
                     headers => { 'X-Maskserve-Affinity' => $key_of{'gpu-a'} });
        $tried_a += grep { ($host{$_} // '') eq 'gpu-a' } @{ $r->{tries} };
        $r->{status} == 200 ? $r->{host} : "status $r->{status}";
    } 1 .. 6;
    is_deeply(\@hosts, [('gpu-b') x 6], 'new requests go to the live host');

    ok(MsvTest::wait_for(sub { hstate(fhealth(), 'gpu-a') =~ /^(failing|stale)$/ }, 5),
       'the dead host is shown failing or stale');
    ok(MsvTest::wait_for(sub { hstate(fhealth(), 'gpu-a') eq 'stale' }, 6),
       'then stale once its heartbeat stopped');
    my $h = fhealth();
    # degraded while A is listed (stale); on a slow machine its registry
    # record may have expired (10 s after the kill) by now: then A is gone,
    # no longer part of the fleet, and the front is ok with B alone
    if (hstate($h, 'gpu-a') eq 'gone') {
        is($h->{status}, 'ok', 'front status ok: A expired from the registry');
    } else {
        is($h->{status}, 'degraded', 'front status degraded');
    }
    is($h->{_status}, 200, 'still 200 with one host live');
    # the first try on A (if A was still live when they came: on a slow
    # machine the streams above can take past `stale`) is refused and logged
    if ($tried_a) {
        like($f->error_log, qr/maskserve fleet: host "gpu-a" \([\d.]+:\d+\) failed, skipped/,
             'the failure is logged');
    } else {
        like(hstate($h, 'gpu-a'), qr/^(stale|gone)$/,
             'A not tried: it was stale (or gone) already');
    }
    like($f->error_log, qr/maskserve fleet: the host [\d.]+:\d+ went away mid-stream/,
         'the streams cut off are logged');

    # with no host left, the front answers a JSON 502 at once
    kill_nginx($hb);
    my $t0 = time;
    my $r = call($f, req('none-left', 3));
    is($r->{status}, 502, 'no host left: 502');
    like($r->{content}, qr/"code":502/, '... with the JSON error body');
    cmp_ok(time - $t0, '<', 3, '... at once');
}

# configuration errors, checked by nginx -t
sub conf_error {
    my ($http) = @_;
    my $d = $f->dir;
    open my $fh, '>', "$d/bad.conf" or die;
    print $fh "load_module $f->{so};\nerror_log $d/bad.log;\npid $d/bad.pid;\n"
            . "events {}\nhttp {\n$http\n}\n";
    close $fh;
    my $out = `$MsvTest::NGINX -t -p $d/ -c $d/bad.conf 2>&1`;
    return $? == 0 ? '' : $out;
}
{
    my $up = "upstream u {\n maskserve_fleet;\n}\n";
    my $redis = "maskserve_redis 127.0.0.1:$rport;\n";
    is(conf_error("$redis$up"), '', 'a valid front configuration');
    like(conf_error($up), qr/"maskserve_fleet" reads the GPU hosts from Redis/,
         'maskserve_fleet without maskserve_redis');
    like(conf_error("$redis upstream u {\n maskserve_fleet;\n server 127.0.0.1:1;\n}\n"),
         qr/must have no "server"/, 'a server in the fleet upstream');
    like(conf_error("$redis upstream u {\n server 127.0.0.1:1;\n maskserve_fleet;\n}\n"),
         qr/must come first in its upstream block/, 'maskserve_fleet after a server');
    like(conf_error("$redis upstream u {\n maskserve_fleet stale=1s;\n}\n"),
         qr/stale= must be at least 1500ms/, 'stale= too short');
    like(conf_error("$redis upstream u {\n maskserve_fleet weight=2;\n}\n"),
         qr/invalid maskserve_fleet parameter "weight=2"/, 'an unknown parameter');
    like(conf_error("$redis upstream u {\n maskserve_fleet fail_timeout=x;\n}\n"),
         qr/invalid maskserve_fleet parameter "fail_timeout=x"/, 'a bad time');
    like(conf_error("$redis$up upstream v {\n maskserve_fleet;\n}\n"),
         qr/one maskserve_fleet upstream per configuration/, 'two fleet upstreams');
    like(conf_error("${redis}maskserve_fleet_address gpu-node-1:8000;\n"),
         qr/invalid maskserve_fleet_address "gpu-node-1:8000"/, 'a host name as address');
    like(conf_error("${redis}maskserve_fleet_address 10.0.0.1;\n"),
         qr/invalid maskserve_fleet_address "10.0.0.1"/, 'an address without port');
    like(conf_error("maskserve_fleet_address 10.0.0.1:80;\n"),
         qr/"maskserve_redis" must be set/, 'an address without Redis');
}

done_testing();
