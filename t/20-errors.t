#!/usr/bin/perl
# Every error the API answers, each with its JSON body: a data-driven table
# of invalid generate bodies (truncated JSON, wrong types, out-of-range
# values, ids outside the vocabulary, prompts too long, unknown modes,
# duplicate keys), then 405, 411, 413, 415, 409, 503 (no slot, no worker)
# and 404, and what must not be an error (unknown keys, charset).

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use JSON::PP;
use Test::More;
use MsvTest;

my $t = MsvTest->new;
my $big = $t->start_worker(slots => 64, max_model_len => 4096, threads => 2);
my $small = $t->start_worker(slots => 2, max_model_len => 4096);
$t->start_nginx(
    workers => [$big->{name}],
    generate => 'client_max_body_size 64k;',
    http => "    maskserve_max_prompt_tokens 3000;\n",
    server => <<"EOF");
        location = /small/generate {
            maskserve_worker $small->{name};
            maskserve_generate;
        }

        location = /absent/generate {
            maskserve_worker msvt-absent-$$;
            maskserve_generate;
        }
EOF

my $h = $t->health;
my $V = $h->{workers}[0]{vocab_size};
my $L = $h->{workers}[0]{max_model_len};
my $K = $h->{workers}[0]{max_logprobs};
ok($V && $L == 4096 && $K, "model facts from /health: vocab $V, len $L, logprobs $K");

my $sp = 'sampling_params';
my $bias1025 = '{' . join(',', map { qq{"$_":0.5} } 0 .. 1024) . '}';
my $id129 = 'x' x 129;
my $long = join ',', (1) x $L;
my $over = join ',', (1) x 3001;
my $stops33 = join ',', 0 .. 32;
my $K1 = $K + 1;

# [ body, param (undef: none), what ]; every one is a 400
my @bad = (
    # not JSON, or not the JSON expected
    ['', undef, 'empty body'],
    ['{', undef, 'truncated object'],
    ['{"token_ids":[1,2', undef, 'truncated array'],
    ['{"token_ids":[1,2]', undef, 'object not closed'],
    ['{"token_ids":[1],"stream":tr', undef, 'truncated literal'],
    ['[1,2,3]', undef, 'an array'],
    ['"abc"', undef, 'a string'],
    ['null', undef, 'null'],
    ['{"token_ids":[1]} x', undef, 'trailing garbage'],
    ['{"token_ids":[1]}"', undef, 'an unterminated string after the object'],
    ['{"token_ids":[1]} "abc', undef, 'an unterminated string, with text'],
    ['{"token_ids":[1]} "}', undef, 'an unterminated string ending in a brace'],
    ["{\"token_ids\":[1]}\n\t \"", undef, 'a quote after whitespace'],
    ['{"token_ids":[1]}{}', undef, 'two values'],
    ['{token_ids:[1]}', undef, 'unquoted key'],
    ['{"token_ids":[1],}', undef, 'trailing comma'],
    ['{"token_ids":[01]}', undef, 'leading zero'],
    [qq{{"token_ids":[1],"request_id":"\xff\xfe"}}, undef, 'invalid UTF-8'],
    ['{"token_ids":[1] /* c */}', undef, 'comment'],

    # token_ids
    ['{}', 'token_ids', 'token_ids missing'],
    ['{"token_ids":[]}', 'token_ids', 'token_ids empty'],
    ['{"token_ids":"1 2"}', 'token_ids', 'token_ids a string'],
    ['{"token_ids":null}', 'token_ids', 'token_ids null'],
    ['{"token_ids":{"a":1}}', 'token_ids', 'token_ids an object'],
    ['{"token_ids":[1,"2"]}', 'token_ids', 'a string id'],
    ['{"token_ids":[1.5]}', 'token_ids', 'a fractional id'],
    ['{"token_ids":[1e2]}', 'token_ids', 'an exponent id'],
    ['{"token_ids":[-1]}', 'token_ids', 'a negative id'],
    ['{"token_ids":[true]}', 'token_ids', 'a boolean id'],
    ['{"token_ids":[[1]]}', 'token_ids', 'a nested array'],
    [qq{{"token_ids":[1,$V]}}, 'token_ids', 'an id == vocab'],
    ['{"token_ids":[2147483648]}', 'token_ids', 'an id above int32'],
    ['{"token_ids":[99999999999999999999999]}', 'token_ids', 'a huge id'],
    [qq{{"token_ids":[$long]}}, 'token_ids', 'prompt == max_model_len'],
    [qq{{"token_ids":[$over]}}, 'token_ids', 'prompt > maskserve_max_prompt_tokens'],
    ['{"token_ids":[1],"token_ids":[2]}', 'token_ids', 'duplicate token_ids'],

    # request_id
    ['{"token_ids":[1],"request_id":5}', 'request_id', 'request_id a number'],
    ['{"token_ids":[1],"request_id":""}', 'request_id', 'request_id empty'],
    ['{"token_ids":[1],"request_id":"a b"}', 'request_id', 'request_id with a space'],
    ['{"token_ids":[1],"request_id":"a/b"}', 'request_id', 'request_id with a slash'],
    ['{"token_ids":[1],"request_id":"."}', 'request_id', 'request_id "."'],
    ['{"token_ids":[1],"request_id":".."}', 'request_id', 'request_id ".."'],
    [qq{{"token_ids":[1],"request_id":"$id129"}}, 'request_id', 'request_id of 129'],
    ['{"token_ids":[1],"request_id":["a"]}', 'request_id', 'request_id an array'],

    # top level flags
    ['{"token_ids":[1],"stream":"yes"}', 'stream', 'stream a string'],
    ['{"token_ids":[1],"stream":1}', 'stream', 'stream a number'],
    ['{"token_ids":[1],"stream":false,"stream":true}', 'stream', 'duplicate stream'],
    ['{"token_ids":[1],"return_sampling_mask":1}', 'return_sampling_mask',
     'return_sampling_mask a number'],
    ['{"token_ids":[1],"sampling_logprobs_mode":"all"}', 'sampling_logprobs_mode',
     'unknown mode'],
    ['{"token_ids":[1],"sampling_logprobs_mode":1}', 'sampling_logprobs_mode',
     'mode a number'],
    ['{"token_ids":[1],"sampling_logprobs_mode":"SUPPORT"}', 'sampling_logprobs_mode',
     'mode in capitals'],

    # sampling_params
    [qq{{"token_ids":[1],"$sp":[]}}, $sp, 'sampling_params an array'],
    [qq{{"token_ids":[1],"$sp":"x"}}, $sp, 'sampling_params a string'],
    [qq{{"token_ids":[1],"$sp":{"max_tokens":0}}}, "$sp.max_tokens", 'max_tokens 0'],
    [qq{{"token_ids":[1],"$sp":{"max_tokens":-1}}}, "$sp.max_tokens", 'max_tokens -1'],
    [qq{{"token_ids":[1],"$sp":{"max_tokens":1.5}}}, "$sp.max_tokens", 'max_tokens 1.5'],
    [qq{{"token_ids":[1],"$sp":{"max_tokens":"16"}}}, "$sp.max_tokens", 'max_tokens a string'],
    [qq{{"token_ids":[1],"$sp":{"max_tokens":-99999999999999999999999}}}, "$sp.max_tokens",
     'max_tokens below -2^63'],
    [qq{{"token_ids":[1],"$sp":{"min_tokens":-1}}}, "$sp.min_tokens", 'min_tokens -1'],
    [qq{{"token_ids":[1],"$sp":{"min_tokens":5,"max_tokens":3}}}, "$sp.min_tokens",
     'min_tokens > max_tokens'],
    [qq{{"token_ids":[1],"$sp":{"min_tokens":17}}}, "$sp.min_tokens",
     'min_tokens > the default max_tokens 16'],
    [qq{{"token_ids":[1],"$sp":{"temperature":-0.1}}}, "$sp.temperature", 'temperature < 0'],
    [qq{{"token_ids":[1],"$sp":{"temperature":"hot"}}}, "$sp.temperature", 'temperature a string'],
    [qq{{"token_ids":[1],"$sp":{"temperature":1e999}}}, "$sp.temperature", 'temperature inf'],
    [qq{{"token_ids":[1],"$sp":{"top_k":-2}}}, "$sp.top_k", 'top_k -2'],
    [qq{{"token_ids":[1],"$sp":{"top_k":1.5}}}, "$sp.top_k", 'top_k 1.5'],
    [qq{{"token_ids":[1],"$sp":{"top_k":-3000000000}}}, "$sp.top_k", 'top_k below int32'],
    [qq{{"token_ids":[1],"$sp":{"top_p":0}}}, "$sp.top_p", 'top_p 0'],
    [qq{{"token_ids":[1],"$sp":{"top_p":1.01}}}, "$sp.top_p", 'top_p > 1'],
    [qq{{"token_ids":[1],"$sp":{"top_p":-0.5}}}, "$sp.top_p", 'top_p < 0'],
    [qq{{"token_ids":[1],"$sp":{"min_p":-0.1}}}, "$sp.min_p", 'min_p < 0'],
    [qq{{"token_ids":[1],"$sp":{"min_p":1.5}}}, "$sp.min_p", 'min_p > 1'],
    [qq{{"token_ids":[1],"$sp":{"seed":-1}}}, "$sp.seed", 'seed -1'],
    [qq{{"token_ids":[1],"$sp":{"seed":1.5}}}, "$sp.seed", 'seed 1.5'],
    [qq{{"token_ids":[1],"$sp":{"seed":18446744073709551616}}}, "$sp.seed", 'seed 2^64'],
    [qq{{"token_ids":[1],"$sp":{"seed":"7"}}}, "$sp.seed", 'seed a string'],
    [qq{{"token_ids":[1],"$sp":{"stop_token_ids":"1"}}}, "$sp.stop_token_ids",
     'stop_token_ids a string'],
    [qq{{"token_ids":[1],"$sp":{"stop_token_ids":[$V]}}}, "$sp.stop_token_ids",
     'stop id == vocab'],
    [qq{{"token_ids":[1],"$sp":{"stop_token_ids":[-1]}}}, "$sp.stop_token_ids",
     'stop id -1'],
    [qq{{"token_ids":[1],"$sp":{"stop_token_ids":[$stops33]}}}, "$sp.stop_token_ids",
     '33 stop ids'],
    [qq{{"token_ids":[1],"$sp":{"ignore_eos":"yes"}}}, "$sp.ignore_eos", 'ignore_eos a string'],
    [qq{{"token_ids":[1],"$sp":{"repetition_penalty":0}}}, "$sp.repetition_penalty",
     'repetition_penalty 0'],
    [qq{{"token_ids":[1],"$sp":{"repetition_penalty":-1}}}, "$sp.repetition_penalty",
     'repetition_penalty < 0'],
    [qq{{"token_ids":[1],"$sp":{"presence_penalty":-1e999}}}, "$sp.presence_penalty",
     'presence_penalty -inf'],
    [qq{{"token_ids":[1],"$sp":{"frequency_penalty":"x"}}}, "$sp.frequency_penalty",
     'frequency_penalty a string'],
    [qq{{"token_ids":[1],"$sp":{"logit_bias":[]}}}, "$sp.logit_bias", 'logit_bias an array'],
    [qq{{"token_ids":[1],"$sp":{"logit_bias":{"abc":1}}}}, "$sp.logit_bias", 'bias key not a number'],
    [qq{{"token_ids":[1],"$sp":{"logit_bias":{"-1":1}}}}, "$sp.logit_bias", 'bias key -1'],
    [qq{{"token_ids":[1],"$sp":{"logit_bias":{"01":1}}}}, "$sp.logit_bias", 'bias key 01'],
    [qq{{"token_ids":[1],"$sp":{"logit_bias":{"$V":1}}}}, "$sp.logit_bias", 'bias key == vocab'],
    [qq{{"token_ids":[1],"$sp":{"logit_bias":{"1":"x"}}}}, "$sp.logit_bias", 'bias value a string'],
    [qq{{"token_ids":[1],"$sp":{"logit_bias":{"1":null}}}}, "$sp.logit_bias", 'bias value null'],
    [qq{{"token_ids":[1],"$sp":{"logit_bias":{"1":1e999}}}}, "$sp.logit_bias", 'bias value inf'],
    [qq{{"token_ids":[1],"$sp":{"logit_bias":{"5":1,"5":2}}}}, "$sp.logit_bias", 'bias key twice'],
    [qq{{"token_ids":[1],"$sp":{"logit_bias":$bias1025}}}, "$sp.logit_bias", '1025 bias entries'],
    [qq{{"token_ids":[1],"$sp":{"logprobs":-1}}}, "$sp.logprobs", 'logprobs -1'],
    [qq{{"token_ids":[1],"$sp":{"logprobs":$K1}}}, "$sp.logprobs",
     'logprobs > max_logprobs'],
    [qq{{"token_ids":[1],"$sp":{"logprobs":"5"}}}, "$sp.logprobs", 'logprobs a string'],
    [qq{{"token_ids":[1],"$sp":{"top_k":5,"top_k":6}}}, "$sp.top_k", 'duplicate top_k'],
    [qq{{"$sp":{"temperature":0},"token_ids":[1],"$sp":{}}}, $sp, 'duplicate sampling_params'],
    ['{"token_ids":[1],"foo":1,"foo":[2]}', 'foo', 'duplicate unknown key'],
    [qq{{"token_ids":[1],"$sp":{"x_y":null,"top_k":2,"x_y":{}}}}, "$sp.x_y",
     'duplicate unknown key in sampling_params'],

    # extremes that have no use a row could show (docs/SAMPLER.md section 7)
    [qq{{"token_ids":[1],"$sp":{"temperature":1e-38}}}, "$sp.temperature",
     'temperature a float32 subnormal'],
    [qq{{"token_ids":[1],"$sp":{"temperature":1e-50}}}, "$sp.temperature",
     'temperature that rounds to 0 as a float'],
    [qq{{"token_ids":[1],"$sp":{"temperature":9e-6}}}, "$sp.temperature",
     'temperature just below 1e-5'],
    [qq{{"token_ids":[1],"$sp":{"temperature":3.5e38}}}, "$sp.temperature",
     'temperature above FLT_MAX'],
    [qq{{"token_ids":[1],"$sp":{"top_p":1e-50}}}, "$sp.top_p", 'top_p that rounds to 0'],
    [qq{{"token_ids":[1],"$sp":{"logit_bias":{"1":1e15}}}}, "$sp.logit_bias",
     'bias value 1e15'],
    [qq{{"token_ids":[1],"$sp":{"logit_bias":{"1":100.001}}}}, "$sp.logit_bias",
     'bias value above 100'],
    [qq{{"token_ids":[1],"$sp":{"logit_bias":{"1":-3e38}}}}, "$sp.logit_bias",
     'bias value -3e38'],
    [qq{{"token_ids":[1],"$sp":{"repetition_penalty":1e-40}}}, "$sp.repetition_penalty",
     'repetition_penalty 1e-40'],
    [qq{{"token_ids":[1],"$sp":{"repetition_penalty":0.0099}}}, "$sp.repetition_penalty",
     'repetition_penalty below 0.01'],
    [qq{{"token_ids":[1],"$sp":{"repetition_penalty":100.5}}}, "$sp.repetition_penalty",
     'repetition_penalty above 100'],
    [qq{{"token_ids":[1],"$sp":{"presence_penalty":1e30}}}, "$sp.presence_penalty",
     'presence_penalty 1e30'],
    [qq{{"token_ids":[1],"$sp":{"presence_penalty":-1000.5}}}, "$sp.presence_penalty",
     'presence_penalty below -1000'],
    [qq{{"token_ids":[1],"$sp":{"frequency_penalty":3.4e38}}}, "$sp.frequency_penalty",
     'frequency_penalty FLT_MAX'],
);

ok(@bad >= 50, scalar(@bad) . ' invalid bodies');

for my $b (@bad) {
    my ($body, $param, $what) = @$b;
    my $r = $t->post('/inference/v1/generate', $body);
    my $e = $r->{json} && $r->{json}{error};
    my $ok = $r->{status} == 400 && $e
        && $e->{type} eq 'invalid_request_error'
        && (defined $param ? defined $e->{param} && $e->{param} eq $param
                           : !defined $e->{param})
        && length($e->{message}) > 5 && $e->{message} !~ /\n/
        && $e->{code} == 400;
    ok($ok, "400 $what" . (defined $param ? " ($param)" : ''))
        or diag("status $r->{status}: $r->{content}");
}

# what is not an error
{
    my $r = $t->post('/inference/v1/generate',
        '{"token_ids":[1,2],"foo":{"bar":[1,2,{"x":null}]},"n":[[]],'
        . '"sampling_params":{"max_tokens":2,"weird":{"a":[{}]},"n":1,'
        . '"seed":null,"logprobs":null,"top_k":null}}');
    is($r->{status}, 200, 'unknown keys, nested, are ignored; nulls are defaults');
    is(scalar @{ $r->{json}{choices}[0]{token_ids} }, 2, '... and it generates');

    $r = $t->post('/inference/v1/generate', '{"token_ids":[3],"sampling_params":{"max_tokens":1}}',
                  'Content-Type' => 'application/json; charset=utf-8');
    is($r->{status}, 200, 'application/json with a charset');

    # a body larger than client_body_buffer_size is read from its file
    my $ids = join ', ', map { 1000 + $_ % 3000 } 1 .. 2500;
    $r = $t->post('/inference/v1/generate', '{"token_ids": [' . $ids . '],'
                  . (' ' x 20000) . '"sampling_params":{"max_tokens":2}}');
    is($r->{status}, 200, "a body buffered to a temporary file") or diag($r->{content});
    is($r->{json}{usage}{prompt_tokens}, 2500, '... parsed whole');
    like($t->error_log, qr/client request body is buffered to a temporary file/,
         '... (nginx did use a file)');

    $r = $t->post('/inference/v1/generate',
                  '{"token_ids":[3],"sampling_params":{"max_tokens":1,"top_k":0}}');
    is($r->{status}, 200, 'top_k 0 is "off"');

    $r = $t->post('/inference/v1/generate',
                  '{"token_ids":[3],"sampling_params":{"max_tokens":1,"temperature":1}}');
    is($r->{status}, 200, 'an integer for a float field');
}

sub is_error {
    my ($r, $status, $type, $param, $what) = @_;
    my $e = $r->{json} && $r->{json}{error};
    my $ok = $r->{status} == $status && $e && $e->{type} eq $type
        && (defined $param ? ($e->{param} // '') eq $param : !defined $e->{param});
    ok($ok, $what) or diag("status $r->{status}: $r->{content}");
}

# method, type, length
is_error($t->get('/inference/v1/generate'), 405, 'invalid_request_error', undef,
         '405 GET generate');
is($t->get('/inference/v1/generate')->{headers}{allow}, 'POST', '405 says Allow: POST');
is_error($t->request('PUT', '/inference/v1/generate', '{}'), 405,
         'invalid_request_error', undef, '405 PUT generate');
is_error($t->post('/inference/v1/generate', '{"token_ids":[1]}', 'Content-Type' => 'text/plain'),
         415, 'invalid_request_error', undef, '415 text/plain');
is_error($t->post('/inference/v1/generate', '{"token_ids":[1]}',
                  'Content-Type' => 'application/jsonx'),
         415, 'invalid_request_error', undef, '415 application/jsonx');
is_error($t->post('/inference/v1/generate', '{"token_ids":[1]}',
                  'Content-Type' => 'application/x-www-form-urlencoded'),
         415, 'invalid_request_error', undef, '415 form');
is_error($t->post('/inference/v1/generate', '{"token_ids":[' . join(',', (1) x 40000) . ']}'),
         413, 'invalid_request_error', undef, '413 body above client_max_body_size');
{
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$t->{port}", Timeout => 10);
    print $s "POST /inference/v1/generate HTTP/1.1\r\nHost: x\r\n"
           . "Content-Type: application/json\r\nConnection: close\r\n\r\n";
    local $/;
    my $resp = <$s> // '';
    my ($st) = $resp =~ m{^HTTP/1\.1 (\d+)};
    my ($body) = $resp =~ /\r\n\r\n(.*)\z/s;
    my $j = eval { decode_json($body) };
    ok($st == 411 && $j && $j->{error}{type} eq 'invalid_request_error',
       '411 without Content-Length') or diag($resp);
}

# 503: no worker attached; no free slot
my $r = $t->post('/absent/generate', '{"token_ids":[1]}');
is_error($r, 503, 'overloaded', undef, '503 when no worker is attached');
is($r->{headers}{'retry-after'}, 1, '503 has Retry-After');

{
    my @s = map { $t->raw_post('/small/generate', {
        request_id => "hold-$_", token_ids => [1, 2, 3], stream => JSON::PP::true,
        sampling_params => { max_tokens => 4000, ignore_eos => JSON::PP::true } }) } 1, 2;
    # both streams started: each sent its first event
    for my $s (@s) {
        my $got = '';
        while ($got !~ /\r\n\r\n.*data: /s) {
            my $n = sysread($s, $got, 4096, length $got) or last;
        }
    }
    $r = $t->post('/small/generate', '{"token_ids":[1]}');
    is_error($r, 503, 'overloaded', undef, '503 when every slot is taken');
    is($r->{headers}{'retry-after'}, 1, '... with Retry-After');

    # 409: the same id again while it runs
    $r = $t->post('/inference/v1/generate', '{"request_id":"hold-1","token_ids":[1]}');
    is_error($r, 409, 'invalid_request_error', 'request_id',
             '409 for a request_id in flight (found in another region)');

    for my $id ('hold-1', 'hold-2') {
        my $a = $t->post('/inference/v1/abort', { request_id => $id });
        is($a->{status}, 200, "abort $id");
    }
    for my $s (@s) {
        local $/;
        my $rest = <$s> // '';
        like($rest, qr/"finish_reason":"abort"/, 'the held stream ends with abort');
    }
}

# abort and status: not found, bad bodies, methods
is_error($t->post('/inference/v1/abort', { request_id => 'nope' }), 404,
         'invalid_request_error', 'request_id', '404 abort of an unknown id');
is_error($t->post('/inference/v1/abort', {}), 400, 'invalid_request_error',
         'request_id', '400 abort without request_id');
is_error($t->post('/inference/v1/abort', { request_id => 7 }), 400,
         'invalid_request_error', 'request_id', '400 abort with a numeric id');
is_error($t->post('/inference/v1/abort', '{"request_id":'), 400,
         'invalid_request_error', undef, '400 abort with truncated JSON');
is_error($t->get('/inference/v1/abort'), 405, 'invalid_request_error', undef,
         '405 GET abort');
is_error($t->post('/health', '{}'), 405, 'invalid_request_error', undef,
         '405 POST health');
is_error($t->post('/inference/v1/requests/x', '{}'), 405, 'invalid_request_error',
         undef, '405 POST request status');
is_error($t->get('/inference/v1/requests/nope'), 404, 'invalid_request_error',
         'request_id', '404 status of an unknown id');
is_error($t->get('/inference/v1/requests/a%20b'), 400, 'invalid_request_error',
         'request_id', '400 status of an invalid id');

# nothing is left behind
ok(MsvTest::wait_for(sub {
    my $hh = $t->health;
    !grep { $_->{slots_in_use} } @{ $hh->{workers} };
}, 5), 'every slot is free again');
unlike($t->error_log, qr/\[(alert|emerg|crit)\]/, 'no alerts in the error log');
unlike($t->access_log, qr/ 500 /, 'no 500 at all');

done_testing();
