#!/usr/bin/perl
# Redis slow rather than dead: nginx talks to redis-server through a proxy
# on loopback (written here) that holds every reply for a while.
#   - replies 0.5 s late (under the 2 s reply timeout): generation is
#     untouched (32 requests intact, no slower than with Redis fast), the
#     links stay up, and every request's metadata lands in Redis once the
#     replies come;
#   - replies 3 s late (over the timeout): generation is still untouched,
#     the links are declared dead and remade (reconnects counted), the
#     per-process backlog stays bounded by the requests made, and once the
#     proxy is fast again everything unsynced is written.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use POSIX ();
use Test::More;
use Time::HiRes qw(time sleep);
use MsvTest;

my $t = MsvTest->new;
my $R = $t->start_redis;
my $P = MsvTest::free_port();
my $delay_file = $t->dir . '/proxy-delay';

sub set_delay {
    open my $fh, '>', "$delay_file.tmp" or die;
    print $fh $_[0];
    close $fh;
    rename "$delay_file.tmp", $delay_file;
}
set_delay(0);

# The proxy: client bytes go to Redis at once; Redis's bytes go back to
# the client after the delay in $delay_file.
my $proxy = fork() // die "fork: $!";
if ($proxy == 0) {
    my $l = IO::Socket::INET->new(Listen => 64, LocalAddr => "127.0.0.1:$P",
                                  ReuseAddr => 1) or POSIX::_exit(1);
    my $sel = IO::Select->new($l);
    my (%peer, %queue, $delay);
    while (1) {
        if (open my $fh, '<', $delay_file) { $delay = <$fh> // 0 }
        for my $s ($sel->can_read(0.01)) {
            if ($s == $l) {
                my $c = $l->accept or next;
                my $u = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$R") or do { close $c; next };
                $peer{$c} = $u;
                $peer{$u} = $c;
                $queue{$u} = [];
                $sel->add($c, $u);
                next;
            }
            my $o = $peer{$s} or next;
            my $n = sysread($s, my $buf, 65536);
            if (!$n) {
                $sel->remove($s, $o);
                close $s;
                close $o;
                delete @peer{$s, $o};
                delete @queue{$s, $o};
                next;
            }
            if ($queue{$s}) {
                push @{ $queue{$s} }, [time + $delay, $buf];   # a reply
            } else {
                syswrite($o, $buf);                            # a command
            }
        }
        for my $u (grep { $queue{$_} } keys %queue) {
            my $q = $queue{$u};
            while (@$q && $q->[0][0] <= time) {
                syswrite($peer{$u}, (shift @$q)->[1]);     # to its client
            }
        }
    }
}
END { local $?; if ($proxy) { kill 'KILL', $proxy; waitpid($proxy, 0) } }

my $w = $t->start_worker(slots => 64, max_model_len => 1024, threads => 1);
$t->{redis_port} = $P;      # nginx.conf names the proxy
$t->start_nginx(processes => 2,
                http => "    maskserve_redis_prefix t63;\n    maskserve_redis_ttl 300s;\n");
my $true = JSON::PP::true;
my $V = $t->health->{workers}[0]{vocab_size};

sub direct {
    local $t->{redis_port} = $R;
    return $t->redis_cmd(@_);
}

sub stats {
    my $h = $t->health or return {};
    return { redis => $h->{redis}, %{ $h->{redis_stats} // {} } };
}

ok(MsvTest::wait_for(sub { (stats()->{redis} // '') eq 'up' }, 10),
   'through the proxy: redis up');

my $seq = 0;
sub batch {
    my ($tag) = @_;
    my @reqs = map { { request_id => "$tag-" . $seq++, token_ids => [1, 2, $_],
                       return_sampling_mask => $true,
                       sampling_params => { max_tokens => 16, top_k => 8,
                                            ignore_eos => $true, seed => $_ } } } 1 .. 32;
    my $t0 = time;
    my @r = $t->parallel(map { [generate => $_] } @reqs);
    my $dt = time - $t0;
    my $ok = grep {
        my $r = $r[$_];
        $r && $r->{status} == 200
            && !MsvTest::choice_problems($reqs[$_], $r->{json}{choices}[0], $V)
            && @{ $r->{json}{choices}[0]{token_ids} } == 16
    } 0 .. $#reqs;
    return ($ok, $dt, [map { $_->{request_id} } @reqs]);
}

sub all_written {
    my ($ids) = @_;
    return !grep {
        my $h = direct('HGET', "t63:req:$_", 'state');
        !defined $h || $h ne 'finished';
    } @$ids;
}

my ($ok0, $dt0, $ids0) = batch('fast');
is($ok0, 32, 'Redis fast: 32 requests intact');
ok(MsvTest::wait_for(sub { all_written($ids0) }, 10), 'and their metadata written');

# --- replies 0.5 s late
set_delay(0.5);
my ($ok1, $dt1, $ids1) = batch('slow');
is($ok1, 32, 'Redis 0.5 s slow: 32 requests intact');
cmp_ok($dt1, '<', 2 * $dt0 + 2, sprintf('no slower (%.2f s, fast %.2f s)', $dt1, $dt0));
is(stats()->{redis}, 'up', 'the links stay up');
ok(MsvTest::wait_for(sub { all_written($ids1) }, 15),
   'every request\'s metadata lands, late');

# --- replies 3 s late: past the reply timeout
my $rc0 = stats()->{reconnects} // 0;
set_delay(3);
my ($ok2, $dt2, $ids2) = batch('stuck');
is($ok2, 32, 'Redis 3 s slow: 32 requests intact');
cmp_ok($dt2, '<', 2 * $dt0 + 2, sprintf('no slower (%.2f s)', $dt2));
ok(MsvTest::wait_for(sub { (stats()->{redis} // '') eq 'down' }, 15),
   'the links are declared dead (health: redis down)');
my $st = stats();
cmp_ok($st->{tracked} // 1e9, '<=', 2 * (32 * 3),
       "the backlog is bounded by the requests made (tracked $st->{tracked})");
is($st->{dropped}, 0, 'nothing dropped (far below the map\'s bound)');

set_delay(0);
ok(MsvTest::wait_for(sub { (stats()->{redis} // '') eq 'up' }, 15), 'fast again: up');
ok(MsvTest::wait_for(sub { (stats()->{reconnects} // 0) > $rc0 }, 15),
   'through new connections (reconnects counted)');
ok(MsvTest::wait_for(sub { all_written([@$ids1, @$ids2]) }, 15),
   'and what was unsynced is written');
ok(MsvTest::wait_for(sub { (stats()->{unsynced} // 1) == 0 }, 15), 'nothing left unsynced');

unlike($t->error_log, qr/\[(alert|emerg)\]|exited on signal/, 'no nginx alerts or crashes');

done_testing;
