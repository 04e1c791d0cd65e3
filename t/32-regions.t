#!/usr/bin/perl
# A location served by two workers: requests spread over both (least
# loaded first), the same seed gives the same answer on either, and when
# one worker dies the other keeps serving (health degraded, not down)
# until the dead one is back.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use JSON::PP;
use Test::More;
use MsvTest;

my $t = MsvTest->new;
my $a = $t->start_worker(slots => 8, max_model_len => 2048, seed => 1);
my $b = $t->start_worker(slots => 8, max_model_len => 2048, seed => 1);
$t->start_nginx(workers => [$a->{name}, $b->{name}]);

my $true = JSON::PP::true;
my $h = $t->health;
is($h->{status}, 'ok', 'both workers ready');
is(scalar @{ $h->{workers} }, 2, 'two regions in /health');
my $V = $h->{workers}[0]{vocab_size};

sub per_region {
    my %n = map { $_->{name} => $_->{requests_done} } @{ $t->health->{workers} };
    return \%n;
}

# 12 concurrent requests: more than one worker's 8 slots
my @reqs = map { { request_id => "spread-$_", token_ids => [3, 1, $_],
                   return_sampling_mask => $true,
                   sampling_params => { max_tokens => 48, top_k => 10,
                                        ignore_eos => $true, seed => 50 + $_ } } }
           1 .. 12;
my @res = $t->parallel(map { ['generate', $_] } @reqs);
is(scalar(grep { $_ && $_->{status} == 200 } @res), 12,
   '12 concurrent requests over two 8-slot workers: all served');
my $n = per_region();
ok($n->{$a->{name}} > 0 && $n->{$b->{name}} > 0,
   "both workers served ($n->{$a->{name}} + $n->{$b->{name}})");
is(scalar(grep { !@$_ } MsvTest::choices_problems($V,
              map { [$reqs[$_], $res[$_]{json}{choices}[0]] } 0 .. $#reqs)),
   12, 'every answer obeys the invariants');

# the same seeded request, many times: whichever worker runs it, same answer
my $req = { token_ids => [9, 8, 7], return_sampling_mask => $true,
            sampling_logprobs_mode => 'support',
            sampling_params => { max_tokens => 12, top_k => 40, seed => 99,
                                 ignore_eos => $true } };
my @same = $t->parallel(map { ['generate', $req] } 1 .. 6);
is(scalar(grep { $_->{status} == 200 } @same), 6, 'six copies served');
is(scalar(grep { MsvTest::json()->encode($_->{json}{choices})
                 eq MsvTest::json()->encode($same[0]{json}{choices}) } @same),
   6, 'identical answers from either worker');

# one worker dies: the other serves; health is degraded but up
{
    my $bg = $t->bg(stream => { %{ $reqs[0] }, request_id => 'dies',
                                sampling_params => { max_tokens => 1900,
                                                     top_k => 10,
                                                     ignore_eos => $true } });
    ok($t->bg_started($bg), 'a long stream runs');
    my $st = $t->get('/inference/v1/requests/dies')->{json};
    my $victim = $st->{record}{worker} eq $a->{name} ? $a : $b;
    my $other = $victim == $a ? $b : $a;
    $t->stop_worker($victim, 'KILL');

    my $r = $t->bg_wait($bg, 10);
    ok($r->{events}[-1]{error}, 'the stream on the dead worker ends with an error');

    ok(MsvTest::wait_for(sub { $t->health->{status} eq 'degraded' }, 3),
       'health degraded');
    is($t->get('/health')->{status}, 200, '... still 200');

    my @after = $t->parallel(map { ['generate', $reqs[$_]] } 0 .. 5);
    is(scalar(grep { $_->{status} == 200 } @after), 6,
       'new requests go to the surviving worker');
    is_deeply($after[0]{json}{choices}, $res[0]{json}{choices},
              '... with the same answers as before');

    $t->restart_worker($victim);
    ok(MsvTest::wait_for(sub { $t->health->{status} eq 'ok' }, 5),
       'the restarted worker is back');
}

ok(MsvTest::wait_for(sub {
    !grep { $_->{slots_in_use} } @{ $t->health->{workers} } }, 5),
   'no slot left in use');
unlike($t->error_log, qr/\[(alert|emerg|crit)\]/, 'no alerts in the error log');

done_testing();
