#!/usr/bin/perl
# POST /inference/v1/generate through nginx against a real worker: every
# mask mode (off, selected, support) x (stream, non-stream) x sampler
# settings; every row is checked against the sampler's invariants, and
# with one seed the answers agree across modes, between stream and
# non-stream, and alone or among 32 concurrent requests.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use JSON::PP;
use Test::More;
use MsvTest;

my $t = MsvTest->new;
$t->start_worker(slots => 64, max_model_len => 512, threads => 2);
$t->start_nginx;

my $h = $t->get('/health');
is($h->{status}, 200, 'health 200');
is($h->{json}{status}, 'ok', 'health says ok');
my $w = $h->{json}{workers}[0];
ok($w->{attached} && $w->{ready}, 'worker attached and ready');
my $V = $w->{vocab_size};
ok($V > 100, "vocabulary of $V");

my $true = JSON::PP::true;
my @prompt = map { ($_ * 37) % $V } 1 .. 7;

my %settings = (
    top_k     => { temperature => 1.0, top_k => 12 },
    top_p     => { temperature => 0.9, top_p => 0.8 },
    min_p     => { temperature => 1.1, min_p => 0.02 },
    greedy    => { temperature => 0 },
    penalties => { temperature => 1.0, top_k => 40, repetition_penalty => 1.3,
                   presence_penalty => 0.4, frequency_penalty => 0.6 },
    bias      => { temperature => 1.0, top_k => 30,
                   logit_bias => { 17 => 5.0, 23 => -100, 40 => 2.5 } },
    logprobs  => { temperature => 0.8, top_k => 25, logprobs => 4 },
    combined  => { temperature => 0.7, top_k => 60, top_p => 0.95,
                   min_p => 0.01, logprobs => 2 },
);
my @modes = ([off => undef], [selected => 'selected'], [support => 'support']);

my $seed = 4242;
my %got;    # $name -> $mode -> $kind -> choice
for my $name (sort keys %settings) {
    for my $m (@modes) {
        my ($mode, $lm) = @$m;
        my $req = {
            token_ids => \@prompt,
            sampling_params => { %{ $settings{$name} }, max_tokens => 12,
                                 seed => $seed, ignore_eos => $true },
            ($lm ? (return_sampling_mask => $true,
                    sampling_logprobs_mode => $lm) : ()),
        };

        my $r = $t->generate($req);
        is($r->{status}, 200, "$name/$mode: non-stream 200")
            or diag($r->{content});
        my $j = $r->{json};
        my $c = $j->{choices}[0];
        my @p = MsvTest::choice_problems($req, $c, $V);
        ok(!@p, "$name/$mode: non-stream rows obey the invariants")
            or diag(join "\n", @p[0 .. ($#p > 9 ? 9 : $#p)]);
        is(scalar @{ $c->{token_ids} }, 12, "$name/$mode: 12 tokens");
        is($c->{finish_reason}, 'length', "$name/$mode: finish length");
        is_deeply($j->{usage}, { prompt_tokens => 7, completion_tokens => 12 },
                  "$name/$mode: usage");
        is($j->{seed}, $seed, "$name/$mode: the seed comes back");
        $got{$name}{$mode}{plain} = $c;

        my $s = $t->stream($req);
        is($s->{status}, 200, "$name/$mode: stream 200");
        ok($s->{done} == 1 && !$s->{bad}, "$name/$mode: events well formed, "
           . "one [DONE]");
        my $mg = MsvTest::merge_events($s->{events});
        ok($mg, "$name/$mode: no error event") or next;
        my $sc = $mg->{choices}[0];
        @p = MsvTest::choice_problems($req, $sc, $V);
        ok(!@p, "$name/$mode: stream rows obey the invariants")
            or diag(join "\n", @p);
        is_deeply($sc, $c, "$name/$mode: stream == non-stream");
        is_deeply($mg->{usage}, $j->{usage}, "$name/$mode: stream usage");
        is($s->{events}[-1]{choices}[0]{finish_reason}, 'length',
           "$name/$mode: the last event has the finish reason");
        ok(!grep({ defined $_->{choices}[0]{finish_reason} }
                 @{ $s->{events} }[0 .. $#{ $s->{events} } - 1]),
           "$name/$mode: only the last event has a finish reason");
        $got{$name}{$mode}{stream} = $sc;
    }

    my $g = $got{$name};
    is_deeply($g->{selected}{plain}{token_ids}, $g->{off}{plain}{token_ids},
              "$name: same tokens with mask off and selected");
    is_deeply($g->{support}{plain}{token_ids}, $g->{off}{plain}{token_ids},
              "$name: same tokens with mask off and support");
    is_deeply($g->{support}{plain}{sampling_mask},
              $g->{selected}{plain}{sampling_mask},
              "$name: same mask rows in selected and support modes");

    # the selected logprob is the support's logprob of the sampled token
    my ($sel, $sup) = ($g->{selected}{plain}, $g->{support}{plain});
    my $bad = 0;
    for my $i (0 .. $#{ $sup->{token_ids} }) {
        my $row = $sup->{sampling_mask}[$i];
        my ($pos) = grep { $row->[$_] == $sup->{token_ids}[$i] } 0 .. $#$row;
        $bad++ unless defined $pos
            && abs($sup->{sampling_mask_logprobs}[$i][$pos]
                   - $sel->{sampling_mask_logprobs}[$i]) <= 1e-6;
    }
    is($bad, 0, "$name: selected logprob == support logprob of the token");
}

# greedy rows have one id; top_k bounds the rows (checked above too)
is(scalar(grep { @$_ != 1 } @{ $got{greedy}{support}{plain}{sampling_mask} }),
   0, 'greedy: every row is the sampled token alone');

# logit_bias and presence_penalty do what they say
{
    my $req = { token_ids => \@prompt, sampling_params => {
        temperature => 0, max_tokens => 8, ignore_eos => $true,
        logit_bias => { 99 => 100 } } };
    my $r = $t->generate($req);
    is_deeply($r->{json}{choices}[0]{token_ids}, [(99) x 8],
              'logit_bias +100 makes greedy pick that token every time');

    my $g = $got{greedy}{off}{plain}{token_ids};
    $req->{sampling_params}{logit_bias} = { $g->[0] => -100 };
    $r = $t->generate($req);
    isnt($r->{json}{choices}[0]{token_ids}[0], $g->[0],
         'logit_bias -100 removes the greedy token');

    $req = { token_ids => \@prompt, sampling_params => {
        temperature => 0, max_tokens => 24, ignore_eos => $true,
        presence_penalty => 1000 } };
    $r = $t->generate($req);
    my %seen;
    my @dup = grep { $seen{$_}++ } @{ $r->{json}{choices}[0]{token_ids} };
    is(scalar @dup, 0, 'presence_penalty 1000: greedy never repeats a token');
}

# stop_token_ids: stop at a token greedy is known to produce
{
    my $g = $got{greedy}{off}{plain}{token_ids};
    my $stop = $g->[4];
    my ($first) = grep { $g->[$_] == $stop } 0 .. $#$g;
    my $req = { token_ids => \@prompt, return_sampling_mask => $true,
                sampling_params => { temperature => 0, max_tokens => 12,
                                     stop_token_ids => [$stop] } };
    my $r = $t->generate($req);
    my $c = $r->{json}{choices}[0];
    is($c->{finish_reason}, 'stop', 'stop_token_ids: finish stop');
    is_deeply($c->{token_ids}, [@{$g}[0 .. $first]],
              'stop_token_ids: output ends with the stop token');
    is(scalar @{ $c->{sampling_mask} }, $first + 1, 'one mask row per token');
}

# a seed drawn by the worker comes back and reproduces the answer
{
    my $req = { token_ids => \@prompt, return_sampling_mask => $true,
                sampling_params => { temperature => 1.0, top_k => 50,
                                     max_tokens => 10, ignore_eos => $true } };
    my $a = $t->generate($req)->{json};
    ok(defined $a->{seed}, "an unseeded request reports its seed ($a->{seed})");
    like($a->{request_id}, qr/^[A-Za-z0-9._:-]{1,128}$/, 'generated request id');
    $req->{sampling_params}{seed} = $a->{seed};
    my $b = $t->generate($req)->{json};
    is_deeply($b->{choices}, $a->{choices}, 'that seed reproduces it');

    $req->{sampling_params}{seed} = '18446744073709551615';
    my $body = JSON::PP->new->canonical->encode($req);
    $body =~ s/"18446744073709551615"/18446744073709551615/;
    my $r = $t->post('/inference/v1/generate', $body);
    is($r->{status}, 200, 'seed 2^64-1 is accepted');
    like($r->{content}, qr/"seed":18446744073709551615,/, 'and echoed exactly');
}

# max_tokens is clipped to the context left, as vLLM does
{
    my $req = { token_ids => [(5) x 505], sampling_params => {
        max_tokens => 100, ignore_eos => $true, seed => 1 } };
    my $r = $t->generate($req);
    is($r->{status}, 200, 'prompt of 505 in a 512 context');
    is(scalar @{ $r->{json}{choices}[0]{token_ids} }, 7,
       'max_tokens clipped to max_model_len - prompt');
    is($r->{json}{choices}[0]{finish_reason}, 'length', 'finish length');
}

# request ids are echoed; headers say what the body is
{
    my $req = { request_id => 'client-id_1:x.y', token_ids => [1, 2, 3],
                sampling_params => { max_tokens => 3, seed => 3 } };
    my $r = $t->generate($req);
    is($r->{json}{request_id}, 'client-id_1:x.y', 'request_id echoed');
    like($r->{headers}{'content-type'}, qr{^application/json}, 'JSON body');
    ok($r->{headers}{'content-length'}, 'non-stream has a Content-Length');

    my $s = $t->stream($req);
    like($s->{headers}{'content-type'}, qr{^text/event-stream}, 'SSE body');
    is($s->{headers}{'x-accel-buffering'}, 'no', 'X-Accel-Buffering: no');
    is($s->{headers}{'transfer-encoding'}, 'chunked', 'chunked');
    is($s->{events}[0]{request_id}, 'client-id_1:x.y', 'id in events');
    like($s->{raw}, qr/data: \[DONE\]\n\n\z/, 'the stream ends with [DONE]');
}

# alone == among 32 concurrent requests (same seeds)
{
    my @reqs;
    for my $i (0 .. 32) {
        push @reqs, { request_id => "crowd-$i", token_ids => [@prompt, $i],
                      return_sampling_mask => $true,
                      sampling_logprobs_mode => ($i % 2 ? 'support' : 'selected'),
                      sampling_params => { temperature => 1.0, top_k => 20 + $i,
                                           top_p => 0.9, max_tokens => 16,
                                           ignore_eos => $true,
                                           seed => 777 + $i } };
    }
    my $alone = $t->generate($reqs[0])->{json};
    my @res = $t->parallel(map { [$_ % 3 ? 'generate' : 'stream', $reqs[$_]] }
                           0 .. $#reqs);
    my ($ok, $inv, @checks) = (0, 0);
    for my $i (0 .. $#res) {
        my $r = $res[$i];
        next unless $r && $r->{status} == 200;
        my $j = $i % 3 ? $r->{json} : MsvTest::merge_events($r->{events});
        next unless $j;
        $ok++;
        push @checks, [$reqs[$i], $j->{choices}[0]];
        if ($i == 0) {
            is_deeply($j->{choices}, $alone->{choices},
                      'alone == among 32 concurrent (stream vs non-stream)');
        }
    }
    $inv = grep { !@$_ } MsvTest::choices_problems($V, @checks);
    is($ok, 33, '33 concurrent requests answered');
    is($inv, 33, 'all of them obey the invariants');
}

# the log variables
{
    my $log = $t->access_log;
    like($log, qr{/inference/v1/generate 200 id=client-id_1:x\.y p=3 c=3 m=0 f=length},
         'access log variables (mask off)');
    like($log, qr{id=crowd-0 p=8 c=16 m=\d+ f=length}, 'mask entries logged');
    my ($m) = $log =~ /id=crowd-0 p=8 c=16 m=(\d+)/;
    ok($m > 16, "mask entries counted ($m)");
}

my $hh = $t->health;
is($hh->{workers}[0]{slots_in_use}, 0, 'no slot left in use');
unlike($t->error_log, qr/\[(alert|emerg|crit)\]/, 'no alerts in the error log');

done_testing();
