#!/usr/bin/perl
# sampling_params.n: several completions of one prompt in one request,
# end to end (real nginx + worker on the CPU backend + redis-server).
#
# - n > 1 equals n separate requests with seeds s, s + 1, ...: tokens,
#   masks (JSON, selected and support, and packed), logprobs and finish
#   reasons per choice, streamed and not; without a seed every choice
#   returns the seed the worker drew for it, and reproduces with it.
# - Stream events say which choice they carry; concatenated per index
#   they give the non-streaming answer; usage counts every choice.
# - The prompt is prefilled once for the group (the worker's --stats).
# - Abort by id and over Redis pub/sub stops every choice; the status
#   endpoint and the Redis record describe the whole request.
# - Each choice is checked against the KV pool as a request of its own: a
#   group larger than the pool completes (preempted), unchanged; a choice
#   that can never fit fails the request with no_kv.
# - All slots or none: a group larger than the free slots gets 503.
# - n at maskserve_max_n (the default 64, and a location's 8) and over;
#   bad n values give a 400 naming sampling_params.n.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use JSON::PP;
use List::Util qw(sum);
use Test::More;
use MsvTest;

my $true = JSON::PP::true;
my $V = 4099;

my $t = MsvTest->new;
my $w = $t->start_worker(slots => 64, max_model_len => 4096, threads => 1,
                         args => ['--backend', 'cpu']);
# a KV pool of 256 tokens: one choice of 107 fits, four at once do not
my $small = $t->start_worker(slots => 8, threads => 1,
                             args => ['--backend', 'cpu', '--kv-tokens', 256]);
# a location of two regions, one too small for a group of 6
my $four = $t->start_worker(slots => 4, threads => 1, args => ['--backend', 'cpu']);
$t->start_redis;
$t->start_nginx(processes => 2, workers => [$w->{name}], server => <<"EOF");
        location = /n8/generate {
            maskserve_generate;
            maskserve_max_n 8;
        }

        location = /two/generate {
            maskserve_generate;
            maskserve_worker $four->{name};
            maskserve_worker $small->{name};
        }

        location = /small/generate {
            maskserve_generate;
            maskserve_worker $small->{name};
        }
EOF
ok(MsvTest::wait_for(sub { ($t->health->{redis} // '') eq 'up' }, 10),
   'redis up');

my @prompt = (5, 17, 42, 99, 123, 7, 1000);

sub base {
    my ($id, %o) = @_;
    my %sp = (temperature => 1.0, top_k => 20, top_p => 0.95,
              max_tokens => 12, logprobs => 3, %{ $o{sp} // {} });
    return { request_id => $id, token_ids => $o{prompt} // [@prompt],
             return_sampling_mask => $true,
             sampling_logprobs_mode => $o{mode} // 'selected',
             mask_format => $o{format} // 'json',
             sampling_params => \%sp };
}

# the plain shape of a choice, and stream events merged per choice into it
sub plain { MsvTest::plain_choice(@_) }
sub merge_stream { MsvTest::merge_choice_events(@_) }

# ------------------------------------------------- n == n separate requests

my $n = 4;
my $s = 9000;

# a stop id that ends choice 0 early: mixed finish reasons in the group
my $probe = $t->generate(base('probe', sp => { seed => $s }))->{json};
my $stop = $probe->{choices}[0]{token_ids}[3];

for my $mode ('selected', 'support') {
    for my $format ('json', 'packed') {
        my $tag = "$mode/$format";
        my %o = (mode => $mode, format => $format,
                 sp => { seed => $s, stop_token_ids => [$stop] });
        my @alone = map {
            my %a = %o;
            $a{sp} = { %{ $o{sp} }, seed => $s + $_ };
            $t->generate(base("alone-$_-$mode-$format", %a))->{json}
        } 0 .. $n - 1;

        my %g = %o;
        $g{sp} = { %{ $o{sp} }, n => $n };
        my $r = $t->generate(base("group-$mode-$format", %g));
        is($r->{status}, 200, "$tag: n=$n answered") or diag($r->{content});
        my $j = $r->{json};
        is(scalar @{ $j->{choices} }, $n, "$tag: $n choices");
        is_deeply([map { $_->{index} } @{ $j->{choices} }], [0 .. $n - 1],
                  "$tag: choices[i].index = i");
        is_deeply([map { $_->{seed} } @{ $j->{choices} }],
                  [map { $s + $_ } 0 .. $n - 1], "$tag: choice i has seed s + i");
        is($j->{seed}, $s, "$tag: the request's seed is s");
        for my $i (0 .. $n - 1) {
            is_deeply(plain($j->{choices}[$i], $mode),
                      plain($alone[$i]{choices}[0], $mode),
                      "$tag: choice $i == a request with seed s + $i");
            if ($format eq 'packed') {
                is_deeply([@{ $j->{choices}[$i] }{qw(sampling_mask_packed logprobs_packed)}],
                          [@{ $alone[$i]{choices}[0] }{qw(sampling_mask_packed logprobs_packed)}],
                          "$tag: choice $i packed strings are that request's");
            }
        }
        is($j->{choices}[0]{finish_reason}, 'stop', "$tag: choice 0 stopped");
        isnt(join(',', @{ $j->{choices}[1]{token_ids} }),
             join(',', @{ $j->{choices}[2]{token_ids} }),
             "$tag: the choices differ");
        is_deeply($j->{usage},
                  { prompt_tokens => scalar @prompt,
                    completion_tokens => sum(map { scalar @{ $_->{choices}[0]{token_ids} } } @alone) },
                  "$tag: usage counts every choice");

        my $st = $t->stream(base("gs-$mode-$format", %g));
        is($st->{status}, 200, "$tag: streamed");
        ok($st->{done} && !$st->{bad}, "$tag: the stream ends with [DONE]");
        my $m = merge_stream($st->{events}, $mode);
        ok($m, "$tag: no error event") or next;
        is_deeply($m->{problems}, [], "$tag: nothing after a choice's end");
        is_deeply([sort keys %{ $m->{choices} }], [0 .. $n - 1],
                  "$tag: events carry every index");
        ok(!(grep { !defined $_->{index} } map { @{ $_->{choices} } } @{ $st->{events} }),
           "$tag: every event's choice says its index");
        for my $i (0 .. $n - 1) {
            my $c = delete $m->{choices}{$i}{seed};
            is($c, $s + $i, "$tag: streamed choice $i says its seed");
            is_deeply($m->{choices}{$i}, plain($j->{choices}[$i], $mode),
                      "$tag: streamed choice $i == its non-streamed one");
        }
        is_deeply($m->{usage}, $j->{usage}, "$tag: stream usage");
        ok($st->{events}[-1]{usage}, "$tag: usage in the last event");
    }
}

# without a seed: each choice returns the seed the worker drew for it
{
    my $r = $t->generate(base('drawn', sp => { n => 3 }));
    is($r->{status}, 200, 'drawn seeds: answered');
    my @c = @{ $r->{json}{choices} };
    ok(!(grep { !defined $_->{seed} } @c), 'every choice has its seed');
    is($r->{json}{seed}, $c[0]{seed}, 'the request\'s seed is choice 0\'s');
    for my $i (0 .. 2) {
        my $a = $t->generate(base("drawn-$i", sp => { seed => $c[$i]{seed} }))->{json};
        is_deeply(plain($c[$i], 'selected'), plain($a->{choices}[0], 'selected'),
                  "drawn seeds: choice $i reproduces with its seed");
    }
}

# ------------------------------------------------- the prompt prefilled once

sub stats {
    my $out = `$MsvTest::BUILD/maskserve-cli --shm $w->{name} --stats`;
    return $? == 0 ? decode_json($out) : undef;
}

{
    # 2 full pages of 16 and a partial one, a prompt nobody sent before
    my @p = map { 300 + $_ } 0 .. 39;
    my $s0 = stats();
    my $r = $t->generate(base('prefix', prompt => \@p,
                              sp => { n => 4, max_tokens => 2, seed => 5 }));
    is($r->{status}, 200, 'prefix: n=4 answered');
    my $s1 = stats();
    is($s1->{prefix}{prefill_tokens} - $s0->{prefix}{prefill_tokens}, 40 + 3 * 8,
       'prefix: the prompt computed once, the others only their last page');
    is($s1->{prefix}{hit_tokens} - $s0->{prefix}{hit_tokens}, 3 * 32,
       'prefix: three choices found the full pages cached');
}

# ------------------------------------------------- abort and status

sub long_group {
    my ($id, $nn) = @_;
    return { request_id => $id, token_ids => [1, 2, 3, 4],
             return_sampling_mask => $true,
             sampling_params => { n => $nn, max_tokens => 3000,
                                  ignore_eos => $true, top_k => 8, seed => 77 } };
}

sub in_use {
    my $h = $t->health or return undef;
    my ($x) = grep { $_->{name} eq $w->{name} } @{ $h->{workers} };
    return $x && $x->{slots_in_use};
}

{
    my $bg = $t->bg(stream => long_group('ab-group', 4));
    ok($t->bg_started($bg), 'abort: the group streams');
    ok(MsvTest::wait_for(sub { in_use() == 4 }, 5), 'abort: one slot per choice');

    my $st = $t->get('/inference/v1/requests/ab-group');
    is($st->{status}, 200, 'status of a running group');
    is($st->{json}{source}, 'redis', 'status: from Redis, the whole request');

    my $a = $t->post('/inference/v1/abort', { request_id => 'ab-group' });
    is($a->{status}, 200, 'abort by id: 200');
    my $r = $t->bg_wait($bg, 10);
    ok($r && $r->{done}, 'abort: the stream ended with [DONE]');
    my $m = merge_stream($r->{events}, 'selected');
    ok($m, 'abort: no error event') or diag(explain($r->{events}[-1]));
    is_deeply([map { $m->{choices}{$_}{finish_reason} } 0 .. 3], [('abort') x 4],
              'abort: every choice ends with abort');
    my @k = map { scalar @{ $m->{choices}{$_}{token_ids} } } 0 .. 3;
    ok(!(grep { $_ >= 3000 } @k), "abort: every choice partial (@k)");
    is($m->{usage}{completion_tokens}, sum(@k), 'abort: usage counts every choice');
    ok(MsvTest::wait_for(sub { in_use() == 0 }, 5), 'abort: every slot back');
    my $h = MsvTest::wait_for(sub {
        my $x = $t->redis_cmd('HGETALL', "msv:req:ab-group");
        my %x = ref $x eq 'ARRAY' ? @$x : ();
        return ($x{state} // '') eq 'aborted' ? \%x : 0;
    }, 10);
    ok($h, 'abort: the Redis record is aborted');
    is($h && $h->{completion_tokens}, sum(@k), 'abort: the record counts every choice');
    is($h && $h->{finish_reason}, 'abort', 'abort: the record\'s finish_reason');
}

# the local slot tables (no Redis record yet: the id was never seen) and
# an abort published over Redis, of a non-streaming group
{
    my $bg = $t->bg(generate => long_group('pub-group', 3));
    ok(MsvTest::wait_for(sub { in_use() == 3 }, 5), 'pub: three slots');
    sleep 0.3;
    $t->redis_cmd('DEL', 'msv:req:pub-group');
    my $st = $t->get('/inference/v1/requests/pub-group');
    is($st->{status}, 200, 'local status of a running group');
    is($st->{json}{source}, 'local', 'status: from the slot tables');
    is($st->{json}{record}{choices}, 3, 'status: three choices');
    ok($st->{json}{record}{completion_tokens} > 0, 'status: tokens of all choices');
    ok($t->redis_cmd('PUBLISH', 'msv:abort', 'pub-group') >= 1, 'pub: published');
    my $r = $t->bg_wait($bg, 10);
    is($r && $r->{status}, 200, 'pub: the group answered');
    my @c = $r && $r->{json} ? @{ $r->{json}{choices} } : ();
    is_deeply([map { $_->{finish_reason} } @c], [('abort') x 3],
              'pub: every choice aborted');
    is($r && $r->{json}{usage}{completion_tokens},
       sum(map { scalar @{ $_->{token_ids} } } @c), 'pub: usage counts every choice');
    ok(MsvTest::wait_for(sub { in_use() == 0 }, 5), 'pub: every slot back');
}

# ------------------------------------------------- the KV cache

# Each choice is checked as a request of its own (prompt + max_tokens
# against the pool); the group needs no more at once: the worker preempts
# and resumes its sequences, and every choice is what it is on a pool
# that holds them all.
{
    my %sp = (n => 4, seed => 31, max_tokens => 100, ignore_eos => $true);
    my $ref = $t->generate(base('kv-ref', sp => \%sp))->{json};
    my $r = $t->post('/small/generate', { %{ base('kv-small', sp => \%sp) },
                                         stream => JSON::PP::false });
    is($r->{status}, 200, 'kv: 4 x 107 tokens on a pool of 256 answered')
        or diag($r->{content});
    is_deeply([map { plain($_, 'selected') } @{ $r->{json}{choices} }],
              [map { plain($_, 'selected') } @{ $ref->{choices} }],
              'kv: every choice as on a large pool');
    my $st = `$MsvTest::BUILD/maskserve-cli --shm $small->{name} --stats`;
    my $j = $? == 0 ? decode_json($st) : {};
    ok(($j->{kv}{preemptions} // 0) > 0, 'kv: the group was preempted');
    is($j->{kv}{free}, $j->{kv}{tokens}, 'kv: every page back');

    $r = $t->post('/small/generate', { %{ base('kv-never', sp => { %sp, max_tokens => 300 }) },
                                      stream => JSON::PP::false });
    is($r->{status}, 400, 'kv: a choice that can never fit the pool: 400');
    is($r->{json}{error}{param}, 'token_ids', 'kv: as a request of its own');
    like($r->{json}{error}{message}, qr/never fit the worker's KV cache/,
         'kv: the no_kv message');
    ok(MsvTest::wait_for(sub {
        my $o = `$MsvTest::BUILD/maskserve-cli --shm $small->{name} --stats`;
        return $? == 0 && decode_json($o)->{slots}{free} == 8;
    }, 5), 'kv: the group\'s slots are back');
}

# a group goes to a region with a slot for each choice
for my $k (1 .. 4) {
    my $r = $t->post('/two/generate', { %{ base("two-$k", sp => { n => 6, max_tokens => 2 }) },
                                       stream => JSON::PP::false });
    is($r->{status}, 200, "n 6 over regions of 4 and 8 slots ($k)") or diag($r->{content});
}

# ------------------------------------------------- limits and bad values

{
    my $r = $t->generate(base('lim-64', sp => { n => 64, max_tokens => 2 }));
    is($r->{status}, 200, 'n 64 (maskserve_max_n default) answered')
        or diag($r->{content});
    is(scalar @{ $r->{json}{choices} }, 64, '64 choices');
    is($r->{json}{usage}{completion_tokens}, 128, 'usage of 64 choices');

    # all slots or none: with one slot taken, 64 choices do not fit now
    my $bg = $t->bg(stream => long_group('hold', 1));
    ok($t->bg_started($bg), 'a request holds one slot');
    $r = $t->generate(base('lim-64-busy', sp => { n => 64, max_tokens => 2 }));
    is($r->{status}, 503, 'n 64 with 63 slots free: 503');
    is($r->{headers}{'retry-after'}, '1', 'n 64 with 63 slots free: Retry-After');
    is(in_use(), 1, 'no slot kept by the refused group');
    $t->post('/inference/v1/abort', { request_id => 'hold' });
    ok($t->bg_wait($bg, 10), 'the holder ends');
    ok(MsvTest::wait_for(sub { in_use() == 0 }, 5), 'its slot back');

    $r = $t->generate(base('lim-65', sp => { n => 65 }));
    is($r->{status}, 400, 'n 65 over the default maximum: 400');
    is($r->{json}{error}{param}, 'sampling_params.n', 'n 65: param');
    like($r->{json}{error}{message}, qr/maskserve_max_n 64/, 'n 65: message');

    $r = $t->post('/n8/generate', { %{ base('lim-8', sp => { n => 8, max_tokens => 2 }) },
                                   stream => JSON::PP::false });
    is($r->{status}, 200, 'n 8 at a location\'s maskserve_max_n 8');
    is(scalar @{ $r->{json}{choices} }, 8, '8 choices');
    $r = $t->post('/n8/generate', { %{ base('lim-9', sp => { n => 9 }) },
                                   stream => JSON::PP::false });
    is($r->{status}, 400, 'n 9 over maskserve_max_n 8: 400');
    is($r->{json}{error}{param}, 'sampling_params.n', 'n 9: param');
}

for my $bad ('0', '-1', '1.5', '2.0', '"2"', 'true', '[]', '{}', '1025',
             '99999999999999999999')
{
    my $body = '{"token_ids":[1,2],"sampling_params":{"n":' . $bad . '}}';
    my $r = $t->request('POST', '/inference/v1/generate', $body);
    is($r->{status}, 400, "n $bad: 400");
    is($r->{json} && $r->{json}{error}{param}, 'sampling_params.n', "n $bad: param");
}

{
    my $r = $t->generate({ token_ids => [1, 2], sampling_params => { n => undef, max_tokens => 2 } });
    is($r->{status}, 200, 'n null: the default');
    is(scalar @{ $r->{json}{choices} }, 1, 'n null: one choice');
    ok(!exists $r->{json}{choices}[0]{seed}, 'one choice: no per-choice seed');
}

ok(MsvTest::wait_for(sub { in_use() == 0 }, 5), 'every slot free at the end');

done_testing;
