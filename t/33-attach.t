#!/usr/bin/perl
# Attaching never blocks nginx: with the worker stopped (SIGSTOP, so its
# socket takes the hello but nobody answers), new nginx worker processes
# (after a reload) keep answering /health at once, as "unavailable"; when
# the worker runs again they attach and serve.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use JSON::PP;
use Test::More;
use Time::HiRes qw(time);
use MsvTest;

my $t = MsvTest->new;
my $w = $t->start_worker(slots => 8);
$t->start_nginx(processes => 1);

my @old = $t->nginx_workers;
is(scalar @old, 1, 'one nginx worker process');

kill 'STOP', $w->{pid};
$t->reload_nginx;
my %o = map { $_ => 1 } @old;
ok(MsvTest::wait_for(sub { grep { !$o{$_} } $t->nginx_workers }, 10),
   'a new worker process started while the worker is stopped');

# the new process has sent its hello and waits for the welcome without
# blocking: it answers at once, and says why it is not attached
my ($slow, $seen) = (0, 0);
my $last;
for (1 .. 10) {
    my $t0 = time;
    my $r = $t->get('/health');
    $slow++ if time - $t0 > 0.5;
    $last = $r;
    $seen++ if $r->{json} && $r->{json}{status} eq 'unavailable';
    select undef, undef, undef, 0.1;
}
is($slow, 0, '/health answers within 0.5 s while an attach is pending');
ok($seen > 0, '/health says unavailable while not attached')
    or diag(explain($last->{json}));
my $err = $last->{json} && $last->{json}{workers}[0]{error} // '';
like($err, qr/welcome|heartbeat/, "the health entry says why: $err");

kill 'CONT', $w->{pid};
ok(MsvTest::wait_for(sub { (($t->health // {})->{status} // '') eq 'ok' }, 15),
   'attached once the worker runs again');

my $r = $t->generate({ token_ids => [1, 2, 3],
                       sampling_params => { max_tokens => 4, top_k => 5,
                                            seed => 1 },
                       return_sampling_mask => JSON::PP::true });
is($r->{status}, 200, 'and serves requests');
is(scalar @{ $r->{json}{choices}[0]{token_ids} }, 4, 'with every token');

done_testing();
