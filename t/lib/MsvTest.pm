package MsvTest;

# The end-to-end test harness: starts a real maskserve worker (dummy
# weights, CPU backend), real redis-server and the stock nginx with the
# built module, on free loopback ports and fresh shared-memory names; talks
# HTTP to nginx; checks every response against the sampling-mask
# invariants (with bench/e2e_check, the load client's checker); and
# stops everything it started, whatever happens.
#
#   my $t = MsvTest->new;
#   my $w = $t->start_worker;            # waits for "ready"
#   $t->start_nginx;                     # waits for /health
#   my $r = $t->generate({ token_ids => [1, 2], ... });
#   my @p = MsvTest::choice_problems($req, $r->{json}{choices}[0], $vocab);
#
# Binaries come from $MSV_BUILD (default: build/ in the repository); the
# worker runs on the CPU backend unless $MSV_BACKEND names another, with
# the extra flags in $MSV_WORKER_ARGS (bench/gpu_tests.sh: --batch-invariant,
# the mode in which the CUDA backend answers alone as in a crowd).

use strict;
use warnings;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Temp qw(tempdir);
use HTTP::Tiny;
use IO::Socket::INET;
use JSON::PP;
use MIME::Base64 ();
use POSIX qw(:sys_wait_h);
use Test::More;
use Time::HiRes qw(sleep time);

our $ROOT = abs_path(dirname(__FILE__) . '/../..');
our $BUILD = $ENV{MSV_BUILD} // "$ROOT/build";
our $NGINX = $ENV{MSV_NGINX} // '/usr/sbin/nginx';
our $REDIS = $ENV{MSV_REDIS} // '/usr/bin/redis-server';

my $json = JSON::PP->new->canonical;
my @all;    # every harness, for the END cleanup

# an interrupted test still stops what it started (END runs on exit)
$SIG{INT} = $SIG{TERM} = sub { exit 1 };

sub json { $json }

sub new {
    my ($class, %opt) = @_;

    my $so = "$BUILD/nginx/src/objs/ngx_http_maskserve_module.so";
    for my $f ("$BUILD/maskserve-worker", "$BUILD/bench/e2e_check", $so, $NGINX) {
        die "MsvTest: $f is missing: build first (make B=<dir> all, "
            . "MSV_BUILD=<dir>)\n" unless -x $f || -f $f;
    }

    my $self = bless {
        dir     => tempdir("msvt-XXXXXX", TMPDIR => 1, CLEANUP => 1),
        so      => $so,
        workers => {},
        seq     => 0,
        http    => HTTP::Tiny->new(timeout => 60, keep_alive => 0),
        %opt,
    }, $class;
    push @all, $self;
    return $self;
}

sub dir { $_[0]{dir} }

sub free_port {
    my $s = IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1',
                                  LocalPort => 0, Proto => 'tcp', ReuseAddr => 1)
        or die "MsvTest: no free port: $!";
    my $p = $s->sockport;
    close $s;
    return $p;
}

sub wait_for {
    my ($cond, $timeout, $step) = @_;
    my $end = time + ($timeout // 10);
    while (time < $end) {
        my $v = $cond->();
        return $v if $v;
        sleep($step // 0.05);
    }
    return $cond->();
}

sub _spawn {
    my ($self, $log, @cmd) = @_;
    my $pid = fork() // die "MsvTest: fork: $!";
    if ($pid == 0) {
        POSIX::setpgid(0, 0);
        open STDIN, '<', '/dev/null';
        open STDOUT, '>>', $log or die;
        open STDERR, '>>', $log or die;
        exec @cmd or do { print STDERR "exec $cmd[0]: $!\n"; POSIX::_exit(127) };
    }
    return $pid;
}

# Stop a child: signal, wait up to $timeout, then SIGKILL.
sub _stop {
    my ($pid, $sig, $timeout) = @_;
    return 0 unless $pid;
    kill $sig, $pid;
    my $end = time + ($timeout // 10);
    while (time < $end) {
        my $r = waitpid($pid, WNOHANG);
        return $? if $r == $pid || $r == -1;
        sleep 0.05;
    }
    kill 'KILL', $pid;
    waitpid($pid, 0);
    return $?;
}

# ---------------------------------------------------------------- worker

sub start_worker {
    my ($self, %o) = @_;
    my $name = $o{name} // sprintf("msvt-%d-%d", $$, ++$self->{seq});
    my $log = "$self->{dir}/worker-$name.log";
    # model_dir: a checkpoint directory (--model), else dummy weights
    my @src = $o{model_dir} ? ('--model', $o{model_dir})
                            : ('--dummy', $o{model} // 'tiny');
    my @args = (@src, '--shm', $name,
                '--backend', $ENV{MSV_BACKEND} // 'cpu',
                '--max-num-seqs', $o{slots} // 64,
                '--max-model-len', $o{max_model_len} // 512,
                '--threads', $o{threads} // 1,
                '--seed', $o{seed} // 1,
                split(' ', $ENV{MSV_WORKER_ARGS} // ''),
                @{ $o{args} // [] });
    my $start = -s $log // 0;
    my $pid = $self->_spawn($log, "$BUILD/maskserve-worker", @args);
    my $w = { name => $name, pid => $pid, log => $log, args => \@args };
    $self->{workers}{$name} = $w;
    my $ok = wait_for(sub {
        return 1 if _log_has($log, $start, qr/\bready: region\b/);
        return -1 if waitpid($pid, WNOHANG) == $pid;
        return 0;
    }, 60);
    die "MsvTest: worker $name did not start:\n" . _tail($log) . "\n"
        unless $ok && $ok > 0;
    return $w;
}

sub restart_worker {
    my ($self, $w) = @_;
    my $log = $w->{log};
    my $start = -s $log // 0;
    $w->{pid} = $self->_spawn($log, "$BUILD/maskserve-worker", @{ $w->{args} });
    my $pid = $w->{pid};
    my $ok = wait_for(sub {
        return 1 if _log_has($log, $start, qr/\bready: region\b/);
        return -1 if waitpid($pid, WNOHANG) == $pid;
        return 0;
    }, 60);
    die "MsvTest: worker $w->{name} did not restart:\n" . _tail($log) . "\n"
        unless $ok && $ok > 0;
    return $w;
}

# SIGTERM (clean stop) or SIGKILL (crash); returns the wait status.
sub stop_worker {
    my ($self, $w, $sig) = @_;
    my $st = _stop($w->{pid}, $sig // 'TERM', 15);
    $w->{pid} = 0;
    return $st;
}

sub _log_has {
    my ($log, $from, $re) = @_;
    open my $fh, '<', $log or return 0;
    seek $fh, $from, 0;
    local $/;
    my $s = <$fh> // '';
    return $s =~ $re;
}

sub _tail {
    my ($f, $n) = @_;
    open my $fh, '<', $f or return "($f: $!)";
    my @l = <$fh>;
    $n //= 30;
    @l = @l[-$n .. -1] if @l > $n;
    return join '', @l;
}

# ---------------------------------------------------------------- redis

# start_redis(args => [...]): extra redis-server arguments, such as
# ('--requirepass', 'secret').
sub start_redis {
    my ($self, %o) = @_;
    my $port = $self->{redis_port} //= free_port();
    my $log = "$self->{dir}/redis.log";
    $self->{redis_pid} = $self->_spawn($log, $REDIS, '--port', $port,
        '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
        '--daemonize', 'no', '--dir', $self->{dir}, @{ $o{args} // [] });
    wait_for(sub {
        my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port",
                                      Timeout => 1);
        return 0 unless $s;
        print $s "PING\r\n";
        my $l = <$s> // '';
        return $l =~ /PONG|NOAUTH/;
    }, 20) or die "MsvTest: redis-server did not start:\n" . _tail($log);
    return $port;
}

sub stop_redis {
    my ($self) = @_;
    _stop($self->{redis_pid}, 'TERM', 10);
    $self->{redis_pid} = 0;
}

# One command through a plain socket (inline protocol); returns the reply
# as Perl data (arrays of bulk strings, integers, strings).
sub redis_cmd {
    my ($self, @args) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$self->{redis_port}",
                                  Timeout => 5) or return undef;
    my $req = '*' . @args . "\r\n";
    $req .= '$' . length($_) . "\r\n$_\r\n" for @args;
    print $s $req;
    return redis_reply($s);
}

sub redis_reply {
    my ($s) = @_;
    my $l = <$s> // return undef;
    $l =~ s/\r\n$//;
    my ($t, $v) = (substr($l, 0, 1), substr($l, 1));
    return $v if $t eq '+' || $t eq ':';
    return "ERR $v" if $t eq '-';
    if ($t eq '$') {
        return undef if $v < 0;
        my $d = '';
        read($s, $d, $v + 2);
        return substr($d, 0, $v);
    }
    if ($t eq '*') {
        return [map { redis_reply($s) } 1 .. $v];
    }
    return undef;
}

# ---------------------------------------------------------------- nginx

sub nginx_conf {
    my ($self, %o) = @_;
    my $d = $self->{dir};
    my @w = @{ $o{workers} // [map { $_->{name} } values %{ $self->{workers} }] };
    my $workers = join '', map { "    maskserve_worker $_;\n" } @w;
    # user => 'nobody nogroup': nginx's workers as that user and group
    my $user = $o{user} ? "user $o{user};\n" : $> == 0 ? "user root;\n" : '';
    my $redis = $self->{redis_port}
        ? "    maskserve_redis 127.0.0.1:$self->{redis_port};\n" : '';
    my $n = $o{processes} // 2;
    my $gen = $o{generate} // '';
    my $http = $o{http} // '';
    my $server = $o{server} // '';

    return <<"EOF";
load_module $self->{so};
$user
worker_processes $n;
error_log $d/error.log info;
pid $d/nginx.pid;
worker_shutdown_timeout 30s;

events {
    worker_connections 2048;
}

http {
    log_format msv '\$request_uri \$status id=\$maskserve_request_id '
                   'p=\$maskserve_prompt_tokens c=\$maskserve_completion_tokens '
                   'm=\$maskserve_mask_entries f=\$maskserve_finish_reason';
    access_log $d/access.log msv;

    client_body_temp_path $d/body;
    proxy_temp_path $d/proxy;
    fastcgi_temp_path $d/fastcgi;
    uwsgi_temp_path $d/uwsgi;
    scgi_temp_path $d/scgi;

$workers$redis$http
    server {
        listen 127.0.0.1:$self->{port};

        # the shipped JSON error pages, as docs/nginx.conf and make run
        include $ROOT/docs/nginx-errors.conf;

        location = /inference/v1/generate {
            maskserve_generate;
            $gen
        }

        location = /inference/v1/abort {
            maskserve_abort;
        }

        location /inference/v1/requests/ {
            maskserve_request_status;
        }

        location = /health {
            maskserve_health;
        }

$server
    }
}
EOF
}

sub write_conf {
    my ($self, %o) = @_;
    $self->{port} //= free_port();
    my $conf = "$self->{dir}/nginx.conf";
    open my $fh, '>', $conf or die "MsvTest: $conf: $!";
    print $fh $self->nginx_conf(%o);
    close $fh;
    return $conf;
}

sub start_nginx {
    my ($self, %o) = @_;
    my $conf = $self->write_conf(%o);
    my $log = "$self->{dir}/nginx.out";
    $self->{nginx_pid} = $self->_spawn($log, $NGINX, '-p', "$self->{dir}/",
                                       '-c', $conf, '-g', 'daemon off;');
    my $ok = wait_for(sub {
        return -1 if waitpid($self->{nginx_pid}, WNOHANG) == $self->{nginx_pid};
        my $r = $self->{http}->get($self->url('/health'));
        return $r->{status} == 200 ? 1 : 0 unless $o{no_wait_ready};
        return $r->{status} < 599 ? 1 : 0;
    }, 30);
    die "MsvTest: nginx did not start:\n" . _tail($log) . _tail("$self->{dir}/error.log")
        unless $ok && $ok > 0;
    # One process answering is not all of them: wait until every worker
    # process has attached to every running worker region it serves, so
    # that the next request does not find a process still attaching.
    unless ($o{no_wait_ready}) {
        my $n = $o{processes} // 2;
        my @names = grep { $self->{workers}{$_} && $self->{workers}{$_}{pid} }
                    @{ $o{workers} // [keys %{ $self->{workers} }] };
        wait_for(sub {
            my $el = $self->error_log;
            for my $name (@names) {
                my $k = () = $el =~ /attached to worker region "\Q$name\E"/g;
                return 0 if $k < $n;
            }
            return 1;
        }, 30);
    }
    return $self->{nginx_pid};
}

sub reload_nginx {
    my ($self, %o) = @_;
    $self->write_conf(%o) if %o;
    kill 'HUP', $self->{nginx_pid};
}

sub stop_nginx {
    my ($self) = @_;
    _stop($self->{nginx_pid}, 'TERM', 20);
    $self->{nginx_pid} = 0;
}

# pids of the nginx worker processes (children of the master)
sub nginx_workers {
    my ($self) = @_;
    my @p;
    opendir my $dh, '/proc' or return ();
    for my $p (grep { /^\d+$/ } readdir $dh) {
        open my $fh, '<', "/proc/$p/stat" or next;
        my $st = <$fh> // next;
        my ($ppid) = $st =~ /^\d+ \(.*?\) \S (\d+)/;
        push @p, $p if defined $ppid && $ppid == $self->{nginx_pid};
    }
    return sort { $a <=> $b } @p;
}

sub error_log { _tail("$_[0]{dir}/error.log", $_[1] // 1000) }
sub access_log { _tail("$_[0]{dir}/access.log", $_[1] // 1000) }

# ---------------------------------------------------------------- HTTP

sub url { "http://127.0.0.1:$_[0]{port}$_[1]" }

# A request; $body: a reference (sent as JSON) or a string (sent as is).
# Returns { status, headers, content, json (when the body is JSON) }.
sub request {
    my ($self, $method, $path, $body, %h) = @_;
    my %opt = (headers => { 'Content-Type' => 'application/json', %h });
    if (defined $body) {
        $opt{content} = ref $body ? $json->encode($body) : $body;
    }
    my $r = $self->{http}->request($method, $self->url($path), \%opt);
    my $res = { status => $r->{status}, headers => $r->{headers},
                content => $r->{content} // '' };
    if (($r->{headers}{'content-type'} // '') =~ m{application/json}) {
        $res->{json} = eval { $json->decode($res->{content}) };
        $res->{json_error} = $@ if $@;
    }
    return $res;
}

sub post { my ($self, $path, $body, %h) = @_; $self->request('POST', $path, $body, %h) }
sub get { my ($self, $path) = @_; $self->request('GET', $path) }
sub health { $_[0]->get('/health')->{json} }

sub generate {
    my ($self, $req) = @_;
    return $self->post('/inference/v1/generate', { %$req, stream => JSON::PP::false });
}

# A checkpoint directory for start_worker(model_dir => ...): the
# qwen3-tiny fixture with max_position_embeddings $max_pos, for streams
# longer than the dummy tiny model's 4096 positions.
sub long_context_model {
    my ($self, $max_pos) = @_;
    my $src = "$ROOT/t/fixtures/qwen3-tiny";
    my $dir = "$self->{dir}/qwen3-tiny-$max_pos";
    return $dir if -d $dir;
    mkdir $dir or die "MsvTest: $dir: $!\n";
    open my $in, '<', "$src/config.json" or die "MsvTest: $src/config.json: $!\n";
    my $cfg = $json->decode(do { local $/; <$in> });
    $cfg->{max_position_embeddings} = $max_pos;
    open my $out, '>', "$dir/config.json" or die "MsvTest: $dir/config.json: $!\n";
    print $out $json->encode($cfg);
    close $out or die "MsvTest: $dir/config.json: $!\n";
    symlink("$src/model.safetensors", "$dir/model.safetensors")
        or die "MsvTest: $dir/model.safetensors: $!\n";
    return $dir;
}

# New tokens enough for a request to run about $seconds on this stack
# (at least 200, at most $cap) when $parallel (default 1) run at once,
# from the rate of 256-token probes, the second of two rounds (the first
# warms the backend up: a CUDA worker captures its graphs then).  A test
# that needs requests still running when something happens to them (an
# abort, a kill, a drain deadline, every slot taken) sizes them by the
# backend it runs on: a GPU runs a batch of the tiny model's sequences
# as fast as one, many times faster than a CPU.
sub tokens_lasting {
    my ($self, $seconds, $cap, $parallel) = @_;
    my $probe = 256;
    my $dt;
    $parallel //= 1;
    for my $round (1, 2) {
        my $t0 = Time::HiRes::time();
        my @r = $self->parallel(map { [generate => {
            token_ids => [1, 2, 3],
            sampling_params => { max_tokens => $probe,
                                 ignore_eos => JSON::PP::true } }] } 1 .. $parallel);
        $dt = Time::HiRes::time() - $t0;
        for (@r) {
            die "MsvTest: tokens_lasting: a probe answered $_->{status}\n"
                unless $_ && $_->{status} == 200;
        }
    }
    my $n = int($probe / ($dt > 1e-3 ? $dt : 1e-3) * $seconds);
    $n = 200 if $n < 200;
    $n = $cap if defined $cap && $n > $cap;
    return $n;
}

# A streaming request: collects every event.  Returns { status, headers,
# events => [decoded JSON...], done => saw [DONE], raw => body text }.
sub stream {
    my ($self, $req, %o) = @_;
    my ($buf, $done, $raw, $bad) = ('', 0, '', 0);
    my @ev;
    my $r = $self->{http}->request('POST', $self->url('/inference/v1/generate'), {
        headers => { 'Content-Type' => 'application/json' },
        content => $json->encode({ %$req, stream => JSON::PP::true }),
        data_callback => sub {
            my ($data, $resp) = @_;
            $raw .= $data;
            $buf .= $data;
            while ($buf =~ s/^(.*?)\n\n//s) {
                my $e = $1;
                if ($e !~ /^data: (.*)\z/s) { $bad++; next }
                my $d = $1;
                if ($d eq '[DONE]') { $done++; next }
                my $j = eval { $json->decode($d) };
                if (!$j) { $bad++; next }
                push @ev, $j;
                $o{on_event}->($j) if $o{on_event};
            }
        },
    });
    my $res = { status => $r->{status}, headers => $r->{headers},
                events => \@ev, done => $done, raw => $raw,
                bad => $bad + (length $buf ? 1 : 0) };
    if ($r->{status} != 200
        && ($r->{headers}{'content-type'} // '') =~ m{application/json})
    {
        $res->{raw} = $raw . ($r->{content} // '');
        $res->{json} = eval { $json->decode($res->{raw}) };
    }
    return $res;
}

# Merge stream events into the shape of a non-streaming choice.
sub merge_events {
    my ($events) = @_;
    my %c = (token_ids => [], sampling_mask => [], sampling_mask_logprobs => [],
             logprobs => { content => [] });
    my ($have_mask, $have_lp, %top);
    for my $e (@$events) {
        return undef if $e->{error};
        my $ch = $e->{choices}[0];
        push @{ $c{token_ids} }, @{ $ch->{token_ids} };
        if (exists $ch->{sampling_mask}) {
            $have_mask = 1;
            push @{ $c{sampling_mask} }, @{ $ch->{sampling_mask} };
            push @{ $c{sampling_mask_logprobs} }, @{ $ch->{sampling_mask_logprobs} };
        }
        if (exists $ch->{logprobs}) {
            $have_lp = 1;
            push @{ $c{logprobs}{content} }, @{ $ch->{logprobs}{content} };
        }
        $c{finish_reason} = $ch->{finish_reason};
        # fields of the last event's choice only (docs/API.md)
        for my $k (qw(weight_version abort_reason)) {
            $c{$k} = $ch->{$k} if exists $ch->{$k};
        }
        $top{usage} = $e->{usage} if $e->{usage};
        $top{seed} = $e->{seed} if defined $e->{seed};
        $top{request_id} = $e->{request_id};
    }
    delete @c{qw(sampling_mask sampling_mask_logprobs)} unless $have_mask;
    delete $c{logprobs} unless $have_lp;
    $c{index} = 0;
    return { %top, choices => [\%c] };
}

# Send a request over a raw socket and return the socket (for clients
# that read slowly or go away).
sub raw_post {
    my ($self, $path, $body) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$self->{port}",
                                  Timeout => 30) or die "connect: $!";
    my $c = ref $body ? $json->encode($body) : $body;
    print $s "POST $path HTTP/1.1\r\nHost: localhost\r\n"
           . "Content-Type: application/json\r\nContent-Length: "
           . length($c) . "\r\nConnection: close\r\n\r\n$c";
    return $s;
}

# Run requests concurrently (one process each); returns the responses in
# order.  Each item: [ 'generate' | 'stream', $req ].
sub parallel {
    my ($self, @items) = @_;
    my @pids;
    for my $i (0 .. $#items) {
        my $pid = fork() // die "fork: $!";
        if ($pid == 0) {
            my ($kind, $req) = @{ $items[$i] };
            my $r = $kind eq 'stream' ? $self->stream($req) : $self->generate($req);
            delete $r->{raw};
            open my $fh, '>', "$self->{dir}/par-$$-$i.json";
            print $fh $json->encode($r);
            close $fh;
            POSIX::_exit(0);
        }
        push @pids, $pid;
    }
    my @res;
    for my $i (0 .. $#items) {
        waitpid($pids[$i], 0);
        my $f = "$self->{dir}/par-$pids[$i]-$i.json";
        open my $fh, '<', $f or do { push @res, undef; next };
        local $/;
        push @res, $json->decode(<$fh>);
        unlink $f;
    }
    return @res;
}

# A request in the background (a child process).  $kind: 'stream' or
# 'generate'.  Returns a handle for bg_started and bg_wait.
sub bg {
    my ($self, $kind, $req) = @_;
    my $f = "$self->{dir}/bg-" . ++$self->{seq};
    my $pid = fork() // die "fork: $!";
    if ($pid == 0) {
        my @times;
        my $r;
        if ($kind eq 'stream') {
            $r = $self->stream($req, on_event => sub {
                push @times, time;
                if (@times == 1) { open my $fh, '>', "$f.first"; close $fh }
            });
        } else {
            open my $fh, '>', "$f.first";
            close $fh;
            $r = $self->generate($req);
        }
        delete $r->{raw};
        $r->{times} = \@times;
        $r->{t_end} = time;
        open my $fh, '>', "$f.tmp";
        print $fh $json->encode($r);
        close $fh;
        rename "$f.tmp", $f;
        POSIX::_exit(0);
    }
    return { pid => $pid, file => $f };
}

# Wait until a background stream has its first event.
sub bg_started {
    my ($self, $h, $timeout) = @_;
    return wait_for(sub { -e "$h->{file}.first" }, $timeout // 10);
}

# Its result, or undef if it did not end within $timeout seconds.
sub bg_wait {
    my ($self, $h, $timeout) = @_;
    my $ok = wait_for(sub { waitpid($h->{pid}, WNOHANG) == $h->{pid} },
                      $timeout // 30, 0.01);
    if (!$ok) {
        kill 'KILL', $h->{pid};
        waitpid($h->{pid}, 0);
        return undef;
    }
    open my $fh, '<', $h->{file} or return undef;
    local $/;
    return $json->decode(<$fh>);
}

# ---------------------------------------------------------------- checks

# int32 and float32 arrays of a base64 string
sub _i32 { [unpack 'l<*', MIME::Base64::decode_base64($_[0] // '')] }
sub _f32 { [unpack 'f<*', MIME::Base64::decode_base64($_[0] // '')] }

# A choice in one plain shape, whatever its format: tokens, rows, row
# logprobs, logprobs content, finish reason.  Packed strings are decoded;
# JSON numbers are rounded to the float32 they stand for.
sub plain_choice {
    my ($c, $mode) = @_;
    my $f = sub { unpack 'f<', pack 'f<', $_[0] };
    my %p = (token_ids => $c->{token_ids}, finish_reason => $c->{finish_reason});
    if (my $m = $c->{sampling_mask_packed}) {
        my ($len, $ids, $lps) = (_i32($m->{lengths}), _i32($m->{ids}), _f32($m->{logprobs}));
        my ($o, @rows, @rl) = (0);
        for my $l (@$len) {
            push @rows, [@{$ids}[$o .. $o + $l - 1]];
            push @rl, $mode eq 'support' ? [@{$lps}[$o .. $o + $l - 1]] : $lps->[@rows - 1];
            $o += $l;
        }
        $p{mask} = \@rows;
        $p{mlps} = \@rl;
    } elsif ($c->{sampling_mask}) {
        $p{mask} = $c->{sampling_mask};
        $p{mlps} = [map { ref $_ ? [map { $f->($_) } @$_] : $f->($_) }
                    @{ $c->{sampling_mask_logprobs} }];
    }
    if (my $l = $c->{logprobs_packed}) {
        my ($tl, $len, $ids, $lps) = (_f32($l->{token_logprobs}), _i32($l->{lengths}),
                                      _i32($l->{ids}), _f32($l->{logprobs}));
        my ($o, @e) = (0);
        for my $i (0 .. $#$len) {
            push @e, [$tl->[$i], [map { [$ids->[$_], $lps->[$_]] }
                                  $o .. $o + $len->[$i] - 1]];
            $o += $len->[$i];
        }
        $p{lp} = \@e;
    } elsif ($c->{logprobs}) {
        $p{lp} = [map { [$f->($_->{logprob}),
                         [map { [$_->{token_id}, $f->($_->{logprob})] }
                          @{ $_->{top_logprobs} }]] } @{ $c->{logprobs}{content} }];
    }
    return \%p;
}

# Stream events merged per choice index, packed strings decoded and
# concatenated, in the plain shape.
sub merge_choice_events {
    my ($events, $mode) = @_;
    my (%by, %fin, $usage, @problems);
    for my $e (@$events) {
        return undef if $e->{error};
        $usage = $e->{usage} if $e->{usage};
        for my $c (@{ $e->{choices} }) {
            my $i = $c->{index};
            push @problems, "choice $i after its finish_reason" if $fin{$i};
            $fin{$i} = $c->{finish_reason} if defined $c->{finish_reason};
            my $p = plain_choice($c, $mode);
            my $m = $by{$i} //= { token_ids => [], finish_reason => undef,
                                  seed => $c->{seed} };
            push @{ $m->{token_ids} }, @{ $p->{token_ids} };
            for my $k (qw(mask mlps lp)) {
                push @{ $m->{$k} }, @{ $p->{$k} } if $p->{$k};
            }
            $m->{finish_reason} = $p->{finish_reason} if defined $p->{finish_reason};
        }
    }
    return { choices => \%by, usage => $usage, problems => \@problems };
}


# Check choices against their requests and the sampler's invariants:
# rows in order and in the vocabulary, the sampled token in its row,
# |row| <= top_k, greedy rows of one id with logprob 0, support rows
# summing to 1 and agreeing with logprobs.content, top logprobs best
# first and no more than asked, finish reasons, max_tokens.  The checks
# are the load client's own (bench/e2e/check.c), run by bench/e2e_check,
# one process for a whole batch.  @items: [$req, $choice] pairs.
# Returns, in order, for each a reference to its list of problems (empty
# when all is well).
sub choices_problems {
    my ($vocab, @items) = @_;
    return () unless @items;
    my ($fh, $file) = File::Temp::tempfile("msvc-XXXXXX", TMPDIR => 1,
                                           UNLINK => 1);
    for my $it (@items) {
        my ($req, $c) = @$it;
        # one choice of several is checked as the only one
        $c = { %$c, index => 0 } if ref $c eq 'HASH';
        print $fh $json->encode($req), "\n", $json->encode($c), "\n";
    }
    close $fh or die "MsvTest: $file: $!";
    my @cmd = ("$BUILD/bench/e2e_check", '--choice',
               defined $vocab ? ('--vocab', $vocab) : (), $file);
    open my $out, '-|', @cmd or die "MsvTest: $cmd[0]: $!";
    my @res = map { $json->decode($_) } <$out>;
    close $out;
    unlink $file;
    die "MsvTest: $cmd[0] answered " . @res . " of " . @items . " checks "
        . "(status $?)\n" if @res != @items || ($? & 127) || ($? >> 8) > 1;
    return @res;
}

# Check one choice against the request and the sampler's invariants.
# Returns a list of problems (empty when all is well).
sub choice_problems {
    my ($req, $c, $vocab) = @_;
    return @{ (choices_problems($vocab, [$req, $c]))[0] };
}

END {
    local $?;    # keep the test's exit status
    for my $t (@all) {
        _stop($t->{nginx_pid}, 'TERM', 10) if $t->{nginx_pid};
        for my $w (values %{ $t->{workers} }) {
            _stop($w->{pid}, 'TERM', 10) if $w->{pid};
            unlink "/dev/shm/$w->{name}", "/dev/shm/$w->{name}.sock";
        }
        _stop($t->{redis_pid}, 'TERM', 10) if $t->{redis_pid};
    }
}

1;
