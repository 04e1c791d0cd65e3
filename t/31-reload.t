#!/usr/bin/perl
# nginx -s reload while streams run: the old worker processes keep their
# attachments until their streams are complete (every token, no error),
# new worker processes take the new requests, and the old ones then exit
# and detach cleanly.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use JSON::PP;
use Test::More;
use MsvTest;

my $t = MsvTest->new;
$t->start_worker(slots => 16, max_model_len => 4096, threads => 1);
$t->start_nginx(processes => 2);

my $true = JSON::PP::true;
my $V = $t->health->{workers}[0]{vocab_size};

my @old = $t->nginx_workers;
is(scalar @old, 2, 'two nginx worker processes');

my @reqs = map { { request_id => "rl-$_", token_ids => [1, 2, $_],
                   return_sampling_mask => $true,
                   sampling_logprobs_mode => 'support',
                   sampling_params => { max_tokens => 1500, top_k => 6,
                                        ignore_eos => $true, seed => $_ } } } 1 .. 4;
my @bg = map { $t->bg(stream => $_) } @reqs;
ok($t->bg_started($_), 'stream started') for @bg;

$t->reload_nginx;
ok(MsvTest::wait_for(sub {
    my @now = $t->nginx_workers;
    my %o = map { $_ => 1 } @old;
    (grep { !$o{$_} } @now) == 2;
}, 10), 'new worker processes started');

my %o = map { $_ => 1 } @old;
ok((grep { $o{$_} } $t->nginx_workers) >= 1,
   'old worker processes still serve their streams');

my $r = $t->generate({ token_ids => [5, 6], sampling_params => { max_tokens => 4,
                                                                seed => 1 } });
is($r->{status}, 200, 'a new request is served meanwhile');

for my $i (0 .. $#bg) {
    my $res = $t->bg_wait($bg[$i], 30);
    ok($res && $res->{done}, "rl-$i: stream complete with [DONE]");
    my $m = MsvTest::merge_events($res->{events});
    ok($m, "rl-$i: no error event") or next;
    my $c = $m->{choices}[0];
    is(scalar @{ $c->{token_ids} }, 1500, "rl-$i: all 1500 tokens");
    is($c->{finish_reason}, 'length', "rl-$i: finish length");
    my @p = MsvTest::choice_problems($reqs[$i], $c, $V);
    ok(!@p, "rl-$i: rows obey the invariants") or diag(join "\n", @p[0 .. 4]);
}

ok(MsvTest::wait_for(sub { !grep { $o{$_} } $t->nginx_workers }, 10),
   'the old worker processes exit once their streams are done');
my @now = $t->nginx_workers;
is(scalar @now, 2, 'two worker processes remain');

ok(MsvTest::wait_for(sub { $t->health->{workers}[0]{slots_in_use} == 0 }, 5),
   'no slot left in use');
$r = $t->generate({ token_ids => [5, 6], sampling_params => { max_tokens => 4,
                                                             seed => 1 } });
is($r->{status}, 200, 'the new workers serve');

my $log = $t->error_log;
unlike($log, qr/\[(alert|emerg|crit)\]/, 'no alerts (no socket left open)');
like($log, qr/gracefully shutting down/, 'the old workers shut down gracefully');

done_testing();
