#!/usr/bin/perl
# Sampling parameters at the edges of what is accepted (docs/API.md,
# docs/SAMPLER.md section 7): every accepted extreme gives rows that keep
# the contract (support log-sum-exp 0 within 1e-4, no null, greedy width
# 1); integers of any length follow the documented rule (max_tokens and
# min_tokens clipped to the context, top_k of the vocabulary or more is
# off); logprobs k returns min(k, |support|) entries; errors name the
# field and its range; trailing data after an abort body is refused.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use JSON::PP;
use Test::More;
use MsvTest;

my $L = 64;
my $t = MsvTest->new;
$t->start_worker(slots => 16, max_model_len => $L, threads => 2);
$t->start_nginx;

my $h = $t->health;
my $V = $h->{workers}[0]{vocab_size};
my $K = $h->{workers}[0]{max_logprobs};
ok($V > 100 && $K >= 8, "vocab $V, max_logprobs $K");

my $true = JSON::PP::true;
my @prompt = (5, 17, 99, 5, 17, 1000 % $V);

# Every number of a choice is finite (a null would be undef here).
sub nonfinite {
    my ($c) = @_;
    my $n = 0;
    for my $l (@{ $c->{sampling_mask_logprobs} // [] }) {
        for my $x (ref $l ? @$l : ($l)) {
            $n++ if !defined $x || ref $x || $x != $x || abs($x) == 9**9**9;
        }
    }
    for my $e (@{ ($c->{logprobs} // {})->{content} // [] }) {
        for my $x ($e->{logprob}, map { $_->{logprob} } @{ $e->{top_logprobs} }) {
            $n++ if !defined $x || ref $x || $x != $x || abs($x) == 9**9**9;
        }
    }
    return $n;
}

# --- accepted extremes: every row keeps the contract
my $bias = { map { ($_ * 37) % $V => ($_ % 2 ? 100 : -100) } 1 .. 40 };
my @extreme = (
    [ 'temperature 1e-5 (the least)', { temperature => 1e-5 } ],
    [ 'temperature 1e-5 with top_p and min_p', { temperature => 1e-5, top_p => 0.9,
                                                 min_p => 0.5 } ],
    [ 'temperature FLT_MAX', { temperature => 3.4028234e38 } ],
    [ 'temperature 1e30, top_k 7', { temperature => 1e30, top_k => 7 } ],
    [ 'logit_bias +-100 on 40 ids', { logit_bias => $bias } ],
    [ 'logit_bias +-100, temperature 1e-5', { logit_bias => $bias, temperature => 1e-5 } ],
    [ 'logit_bias +-100, greedy', { temperature => 0, logit_bias => $bias } ],
    [ 'repetition_penalty 0.01', { repetition_penalty => 0.01 } ],
    [ 'repetition_penalty 100, temperature 1e-5', { repetition_penalty => 100,
                                                    temperature => 1e-5 } ],
    [ 'presence and frequency 1000', { presence_penalty => 1000, frequency_penalty => 1000 } ],
    [ 'presence and frequency -1000, temperature 1e-5',
      { presence_penalty => -1000, frequency_penalty => -1000, temperature => 1e-5 } ],
    [ 'everything at once', { temperature => 1e-5, repetition_penalty => 0.01,
                              presence_penalty => -1000, frequency_penalty => 1000,
                              logit_bias => $bias, min_p => 1e-30, top_p => 1e-30 } ],
    [ 'top_p 1e-30', { top_p => 1e-30 } ],
    [ 'min_p 1', { min_p => 1 } ],
);

for my $x (@extreme) {
    my ($what, $sp) = @$x;
    for my $mode ('support', 'selected') {
        my $req = { token_ids => \@prompt, return_sampling_mask => $true,
                    sampling_logprobs_mode => $mode,
                    sampling_params => { max_tokens => 12, ignore_eos => $true,
                                         seed => 11, logprobs => 4, %$sp } };
        my $r = $t->post('/inference/v1/generate', $req);
        my $c = $r->{json} && $r->{json}{choices} && $r->{json}{choices}[0];
        my @p = $c ? MsvTest::choice_problems($req, $c, $V) : ('no choice');
        push @p, 'non-finite numbers: ' . nonfinite($c) if $c && nonfinite($c);
        push @p, 'tokens: ' . scalar @{ $c->{token_ids} } if $c && @{ $c->{token_ids} } != 12;
        ok($r->{status} == 200 && !@p, "$what ($mode): 12 rows keep the contract")
            or diag("status $r->{status}: " . join('; ', @p[0 .. ($#p < 4 ? $#p : 4)])
                    . ' ' . substr($r->{content}, 0, 300));
    }
}

# --- integers of any length
sub body {
    my ($sp) = @_;
    return '{"token_ids":[' . join(',', @prompt) . '],"sampling_params":{' . $sp . '}}';
}

my $room = $L - @prompt;
for my $big ('4294967296', '9223372036854775807', '9223372036854775808',
             '18446744073709551616', '1' . ('0' x 60))
{
    my $r = $t->post('/inference/v1/generate', body(qq{"max_tokens":$big,"ignore_eos":true}));
    my $c = $r->{json} && $r->{json}{choices}[0];
    ok($r->{status} == 200 && $c && @{ $c->{token_ids} } == $room
       && $c->{finish_reason} eq 'length',
       "max_tokens $big: clipped to the $room tokens of context left")
        or diag("status $r->{status}: " . substr($r->{content}, 0, 300));
}

{
    my $r = $t->post('/inference/v1/generate',
        body(qq{"max_tokens":9223372036854775807,"min_tokens":9223372036854775807}));
    my $c = $r->{json} && $r->{json}{choices}[0];
    ok($r->{status} == 200 && $c && @{ $c->{token_ids} } == $room,
       'min_tokens and max_tokens 2^63-1: both to the end of the context')
        or diag("status $r->{status}: " . substr($r->{content}, 0, 300));

    $r = $t->post('/inference/v1/generate', body(qq{"min_tokens":16}));
    is($r->{status}, 200, 'min_tokens equal to the default max_tokens is accepted');
}

# a top_k of the vocabulary or more is no truncation: the same rows as off
{
    my %rows;
    for my $k (-1, $V, $V + 1, 2147483648, '99999999999999999999') {
        my $r = $t->post('/inference/v1/generate',
            '{"token_ids":[' . join(',', @prompt) . '],"return_sampling_mask":true,'
            . '"sampling_params":{"max_tokens":3,"seed":5,"ignore_eos":true,'
            . qq("top_k":$k) . '}}');
        $rows{$k} = $r->{status} == 200 ? $r->{json}{choices}[0]{sampling_mask} : $r->{content};
    }
    my $off = $rows{-1};
    ok(ref $off && @{ $off->[0] } > 1000, 'top_k -1: whole-vocabulary rows ('
       . (ref $off ? scalar @{ $off->[0] } : 0) . ' ids)');
    for my $k ($V, $V + 1, 2147483648, '99999999999999999999') {
        is_deeply($rows{$k}, $off, "top_k $k: the rows of top_k off");
    }
}

# --- logprobs k: min(k, |support|) entries
{
    my $r = $t->post('/inference/v1/generate', {
        token_ids => \@prompt, sampling_params => { max_tokens => 5, top_k => 3,
                                                    logprobs => $K, seed => 3 } });
    my $content = $r->{json}{choices}[0]{logprobs}{content};
    my @n = map { scalar @{ $_->{top_logprobs} } } @$content;
    is_deeply(\@n, [3, 3, 3, 3, 3], "logprobs $K with top_k 3: 3 entries per token");

    $r = $t->post('/inference/v1/generate', {
        token_ids => \@prompt, sampling_params => { max_tokens => 5, temperature => 0,
                                                    logprobs => $K } });
    @n = map { scalar @{ $_->{top_logprobs} } } @{ $r->{json}{choices}[0]{logprobs}{content} };
    is_deeply(\@n, [1, 1, 1, 1, 1], "logprobs $K, greedy: 1 entry per token");
}

# --- errors name the field and say the range
my $sp = 'sampling_params';
for my $c (
    [ '"temperature":1e-38', 'temperature', qr/0 \(greedy\) or a number in \[1e-05/ ],
    [ '"repetition_penalty":1e-40', 'repetition_penalty', qr/\[0\.01, 100\]/ ],
    [ '"presence_penalty":5000', 'presence_penalty', qr/\[-1000, 1000\]/ ],
    [ '"frequency_penalty":-1e20', 'frequency_penalty', qr/\[-1000, 1000\]/ ],
    [ '"logit_bias":{"7":1e15}', 'logit_bias', qr/\[-100, 100\]/ ],
    [ '"top_p":2', 'top_p', qr/\(0, 1\]/ ],
    [ '"min_p":-1', 'min_p', qr/\[0, 1\]/ ],
    [ '"max_tokens":0', 'max_tokens', qr/>= 1/ ],
    [ '"top_k":-2', 'top_k', qr/-1 or 0 \(off\)/ ],
    [ '"logprobs":99999999999999999999', 'logprobs', qr/\[0, 1024\]/ ],
    [ '"seed":18446744073709551616', 'seed', qr/\[0, 2\^64\)/ ],
    [ '"min_tokens":17', 'min_tokens', qr/exceeds max_tokens 16 .*default/ ],
    [ '"temperature":"1"', 'temperature', qr/not a string/ ],
    [ '"top_k":[1]', 'top_k', qr/not an array/ ],
    [ '"ignore_eos":1', 'ignore_eos', qr/true or false, not a number/ ],
) {
    my ($field, $name, $re) = @$c;
    my $r = $t->post('/inference/v1/generate', body($field));
    my $e = $r->{json} && $r->{json}{error};
    ok($r->{status} == 400 && $e && $e->{param} eq "$sp.$name"
       && $e->{message} =~ /^\Q$sp.$name\E/ && $e->{message} =~ $re,
       "$field: 400 naming $sp.$name and its range")
        or diag("status $r->{status}: $r->{content}");
}

# --- abort: trailing data is an error there too
for my $b ('{"request_id":"x"}"', '{"request_id":"x"} "}', '{"request_id":"x"}  1') {
    my $r = $t->post('/inference/v1/abort', $b);
    my $e = $r->{json} && $r->{json}{error};
    ok($r->{status} == 400 && $e && !defined $e->{param}
       && $e->{message} =~ /invalid JSON/, "abort body $b: 400 invalid JSON")
        or diag("status $r->{status}: $r->{content}");
}
{
    my $r = $t->post('/inference/v1/abort', "{\"request_id\":\"nope-$$\"} \r\n\t");
    is($r->{status}, 404, 'abort body with trailing whitespace: parsed (404, unknown id)');
    $r = $t->post('/inference/v1/abort', '{"request_id":".."}');
    is($r->{status}, 400, 'abort of "..": 400');
}

done_testing();
