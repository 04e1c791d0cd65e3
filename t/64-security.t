#!/usr/bin/perl
# Who may attach, and nginx's own access control in front of the module:
#   - by default the region and its socket are 0600, the worker's user
#     only: nginx's workers running as another user (nobody) cannot
#     attach, and /health says why;
#   - with --group the region and socket are 0660 for that group: nginx's
#     workers run unprivileged (user nobody nogroup) and serve;
#   - a reader refuses a region that gives others access, or that is not
#     owned by the user its worker runs as (a region planted under the
#     name), and the same for the socket;
#   - an abort published through Redis with a malformed request id is
#     dropped without its bytes reaching the log;
#   - allow/deny in front of the endpoints: a refused client gets 403 (a
#     JSON error through error_page) and nothing reaches the worker.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use JSON::PP;
use Test::More;
use MsvTest;

plan skip_all => 'needs root: it starts processes as nobody' if $> != 0;

my ($nuid, $ngid) = (getpwnam('nobody'))[2, 3];
my $ngroup = getgrgid($ngid);
my $true = JSON::PP::true;

sub mode { my @s = stat $_[0]; return @s ? [($s[2] & 07777), $s[4], $s[5]] : undef }

sub nginx_worker_uids {
    my ($t) = @_;
    return map { (stat "/proc/$_")[4] } $t->nginx_workers;
}

# --- default: 0600, an nginx running as nobody cannot attach
{
    my $t = MsvTest->new;
    chmod 0711, $t->dir;
    my $w = $t->start_worker(slots => 4);
    my $shm = "/dev/shm/$w->{name}";
    is_deeply(mode($shm), [0600, 0, 0], 'region 0600, owned by the worker\'s user');
    is_deeply(mode("$shm.sock"), [0600, 0, 0], 'socket 0600 too');

    $t->start_nginx(user => "nobody $ngroup", no_wait_ready => 1);
    is_deeply([sort { $a <=> $b } nginx_worker_uids($t)], [$nuid, $nuid],
              'nginx workers run as nobody');
    my $h = $t->get('/health');
    is($h->{status}, 503, 'they cannot attach: health 503');
    like($h->{json}{workers}[0]{error} // '', qr/Permission denied/,
         'health says why') or diag(explain $h->{json});
    $t->stop_nginx;

    # the owner check, through maskserve-cli (the module opens the same way)
    my $cli = "$MsvTest::BUILD/maskserve-cli --shm $w->{name} --stats";
    like(`$cli 2>&1`, qr/"state":"ready"/, 'the owner reads the region');
    chmod 0604, $shm;
    like(`$cli 2>&1`, qr/mode 0604 gives other users access: refused/,
         'a region readable by others is refused');
    chmod 0600, $shm;
    chown $nuid, -1, $shm;
    like(`$cli 2>&1`, qr/owned by uid $nuid, but its worker \(pid $w->{pid}\) runs as uid 0: refused/,
         'a region not owned by its worker\'s user is refused');
    chown 0, -1, $shm;
    chown $nuid, -1, "$shm.sock";
    like(`$cli 2>&1`, qr/socket \S+: owner uid $nuid .*refused/,
         'a socket not owned by the region\'s owner is refused');
    chown 0, -1, "$shm.sock";
    like(`$cli 2>&1`, qr/"state":"ready"/, 'restored: read again');
}

# --- --group: 0660 for nginx's group, nginx unprivileged
{
    my $t = MsvTest->new;
    chmod 0711, $t->dir;
    my $w = $t->start_worker(slots => 4, args => ['--group', $ngroup]);
    my $shm = "/dev/shm/$w->{name}";
    is_deeply(mode($shm), [0660, 0, $ngid], "--group $ngroup: region 0660, group $ngroup");
    is_deeply(mode("$shm.sock"), [0660, 0, $ngid], 'socket likewise');

    $t->start_nginx(user => "nobody $ngroup",
        server => <<'EOF2');
        error_page 403 @maskserve_403;
        location @maskserve_403 {
            default_type application/json;
            return 403 '{"error":{"message":"forbidden","type":"invalid_request_error","param":null,"code":403}}\n';
        }
        location = /guarded/generate {
            allow 192.0.2.1;
            deny all;
            maskserve_generate;
        }
EOF2
    is_deeply([nginx_worker_uids($t)], [$nuid, $nuid], 'nginx workers run as nobody');
    my $req = { token_ids => [1, 2], return_sampling_mask => $true,
                sampling_params => { max_tokens => 4, seed => 1 } };
    my $r = $t->generate($req);
    is($r->{status}, 200, 'and serve');
    my $V = $t->health->{workers}[0]{vocab_size};
    is_deeply([MsvTest::choice_problems($req, $r->{json}{choices}[0], $V)], [],
              'a valid answer');

    my $done = $t->health->{workers}[0]{requests_done};
    my $g = $t->post('/guarded/generate', { %$req, stream => JSON::PP::false });
    is($g->{status}, 403, 'deny all: 403');
    is($g->{json}{error}{code}, 403, 'as a JSON error');
    is($t->health->{workers}[0]{requests_done}, $done, 'nothing reached the worker');
    like($t->error_log, qr/access forbidden by rule/, 'nginx logs the refusal');
}

# --- request ids from Redis (pub/sub aborts) are checked before use
{
    my $t = MsvTest->new;
    $t->start_redis;
    my $w = $t->start_worker(slots => 4);
    $t->start_nginx;
    ok(MsvTest::wait_for(sub { ($t->health // {})->{redis} eq 'up' }, 10), 'redis up');
    my $evil = "x\n2026/01/01 00:00:00 [emerg] 1#1: forged line";
    ok($t->redis_cmd('PUBLISH', 'msv:abort', $evil) >= 1, 'a forged abort published');
    ok(MsvTest::wait_for(sub {
        $t->error_log =~ /abort message with an invalid request id \(\d+ bytes\) ignored/
    }, 5), 'an abort with a bad request id is ignored, its length logged');
    unlike($t->error_log, qr/forged line/, 'and its bytes never reach the log');
    is($t->get('/health')->{status}, 200, 'nothing else happened');
}

# --- --group with a name that does not exist: one line, exit 1
{
    my $out = `$MsvTest::BUILD/maskserve-worker --dummy tiny --backend cpu --shm msvt-nogroup-$$ --group no-such-group-$$ 2>&1`;
    isnt($? >> 8, 0, 'an unknown --group: the worker refuses to start');
    like($out, qr/^maskserve-worker: --group: no group "no-such-group-$$"$/m, 'saying so');
}

done_testing;
