#!/usr/bin/perl
# The endpoints an RL trainer drives between rollouts, end to end (real
# nginx, worker and Redis):
#
# - pause with each mode under load: abort ends every stream with
#   finish_reason "abort" and abort_reason "paused"; keep freezes them (no
#   token while paused) and they finish after resume exactly as an
#   unpaused run of the same seeded requests; wait answers once they all
#   finished on their own.  New requests while paused get 503 with
#   Retry-After; /health says paused; pause while paused and resume twice
#   change nothing; a second command while one runs gets 409.
# - abort_requests: a list with unknown ids (those come back in
#   not_found), then all; bad bodies are 400s naming the field.
# - flush_cache: a prompt cached before the flush is computed again after.
# - /v1/models, and /metrics parsed line by line (exposition format) and
#   checked against the counts of a fixed workload.
# - the admin locations answer 403 to a denied client.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use JSON::PP;
use HTTP::Tiny;
use MIME::Base64 ();
use POSIX ();
use Test::More;
use Time::HiRes qw(time sleep);
use MsvTest;

my $t = MsvTest->new;
my $true = JSON::PP::true;
my $false = JSON::PP::false;

$t->start_redis;
my $w = $t->start_worker(slots => 32, max_model_len => 4096, threads => 1,
                         args => ['--weight-version', 'v7']);
my $admin = join '', map { <<"EOF" } qw(pause resume abort_requests flush_cache);
        location = /inference/v1/$_ {
            allow 127.0.0.1;
            deny all;
            maskserve_$_;
        }
EOF
$t->start_nginx(server => $admin . <<'EOF');
        location = /v1/models {
            maskserve_models;
        }

        location = /metrics {
            maskserve_metrics;
        }

        location = /denied/pause {
            deny all;
            maskserve_pause;
        }

        location = /denied/metrics {
            deny all;
            maskserve_metrics;
        }
EOF

sub req {
    my ($id, $max, %o) = @_;
    return { request_id => $id, token_ids => [5, 6, 7, 8],
             return_sampling_mask => $true,
             sampling_params => { max_tokens => $max, ignore_eos => $true,
                                  top_k => 8, seed => 1000 + length($id), %o } };
}

sub last_choice {
    my ($r) = @_;
    return undef unless $r && $r->{events} && @{ $r->{events} };
    return $r->{events}[-1]{choices}[0];
}

sub post { $t->post("/inference/v1/$_[0]", $_[1] // {}) }
sub wstate { $t->health->{workers}[0] }

# ---------------------------------------------------------------- models

{
    my $r = $t->get('/v1/models');
    is($r->{status}, 200, '/v1/models: 200');
    my $m = $r->{json}{data};
    is($r->{json}{object}, 'list', '/v1/models: a list');
    is(scalar @$m, 1, '/v1/models: one model');
    is($m->[0]{object}, 'model', 'object model');
    ok(length $m->[0]{id}, "id \"$m->[0]{id}\"");
    is($m->[0]{max_model_len}, 4096, 'max_model_len');
    is($m->[0]{vocab_size}, wstate()->{vocab_size}, 'vocab_size');
    is($m->[0]{weight_version}, 'v7', 'weight_version');
    is(wstate()->{weight_version}, 'v7', '/health: weight_version');
    is($t->post('/v1/models', {})->{status}, 405, '/v1/models: POST is 405');
}

# ---------------------------------------------------------------- metrics

# Every line a HELP, a TYPE or a sample of a declared family with a valid
# value; returns { "name{labels}" => value }.
sub metrics {
    my $r = $t->get('/metrics');
    is($r->{status}, 200, '/metrics: 200');
    like($r->{headers}{'content-type'}, qr{^text/plain; version=0\.0\.4},
         '/metrics: exposition content type');
    my (%type, %v, @bad);
    for my $l (split /\n/, $r->{content}) {
        if ($l =~ /^# HELP (maskserve_[a-z_]+) \S/) { next }
        if ($l =~ /^# TYPE (maskserve_[a-z_]+) (counter|gauge|histogram)$/) {
            push @bad, "TYPE twice: $l" if $type{$1};
            $type{$1} = $2;
            next;
        }
        if ($l =~ /^(maskserve_[a-z_]+)(\{(?:[a-z_]+="[^"\\\n]*",?)*\})? (-?[0-9]+(?:\.[0-9]+)?)$/) {
            my ($n, $lab, $val) = ($1, $2 // '', $3);
            (my $fam = $n) =~ s/_(bucket|sum|count)$//;
            push @bad, "undeclared family: $l"
                unless $type{$n} || ($type{$fam} // '') eq 'histogram';
            push @bad, "counter name without _total: $l"
                if $type{$n} && $n !~ /_total$/ && $r->{content} =~ /^# TYPE \Q$n\E counter$/m;
            $lab =~ s/worker="[^"]*",?//;
            $lab = '' if $lab eq '{}';
            $lab =~ s/,\}$/}/;
            push @bad, "sample twice: $l" if exists $v{"$n$lab"};
            $v{"$n$lab"} = $val;
            next;
        }
        push @bad, "not exposition format: $l";
    }
    is_deeply(\@bad, [], '/metrics: every line valid') or diag(join "\n", @bad);
    return \%v;
}

{
    my $m0 = metrics();
    is($m0->{maskserve_up}, 1, 'maskserve_up 1');
    is($m0->{maskserve_paused}, 0, 'not paused');
    is($m0->{'maskserve_weight_version_info{version="v7"}'}, 1,
       'weight version info');

    # the fixed workload: 5 requests, prompts of 4 + i tokens, 6 tokens
    my ($ptok, $n) = (0, 5);
    for my $i (1 .. $n) {
        my $q = req("m$i", 6);
        $q->{token_ids} = [map { 100 + 7 * $_ + $i } 1 .. 4 + $i];
        $ptok += 4 + $i;
        my $r = $t->generate($q);
        is($r->{status}, 200, "workload request $i");
    }
    my $m = metrics();
    my $d = sub { $m->{$_[0]} - ($m0->{$_[0]} // 0) };
    is($d->('maskserve_requests_finished_total{reason="length"}'), $n,
       "finished length +$n");
    is($d->('maskserve_requests_finished_total{reason="stop"}'), 0, 'stop +0');
    is($d->('maskserve_requests_finished_total{reason="abort"}'), 0, 'abort +0');
    is($d->('maskserve_generation_tokens_total'), 6 * $n, 'generation tokens');
    is($d->('maskserve_prompt_tokens_total'), $ptok, 'prompt tokens');
    is($d->('maskserve_rows_total{mode="selected"}'), 6 * $n,
       'rows: one per token, mode selected');
    is($d->('maskserve_rows_total{mode="support"}'), 0, 'no support rows');
    cmp_ok($d->('maskserve_row_bytes_total{mode="selected"}'), '>=', 6 * $n * 56,
           'row bytes: at least a header and one id and logprob each');
    is($m->{maskserve_requests_running}, 0, 'nothing running');
    is($m->{maskserve_slots_in_use}, 0, 'no slot in use');
    is($m->{maskserve_kv_used_pages}, 0, 'no KV page used');
    is($m->{maskserve_kv_page_tokens}, 16, 'page size');
    ok($m->{maskserve_kv_free_pages} + $m->{maskserve_kv_cached_pages} > 0,
       'free and cached pages');
    ok($d->('maskserve_steps_total') >= 6, 'steps counted');
    for my $h (qw(maskserve_step_duration_seconds maskserve_step_batch_sequences)) {
        my @b = map { $m->{$_} } sort { my ($x) = $a =~ /le="([^"]+)"/;
                                          my ($y) = $b =~ /le="([^"]+)"/;
                                          ($x eq '+Inf' ? 1e99 : $x) <=> ($y eq '+Inf' ? 1e99 : $y) }
                      grep { /^${h}_bucket\{le=/ } keys %$m;
        ok(@b >= 10, "$h: buckets");
        is(scalar(grep { $b[$_] < $b[$_ - 1] } 1 .. $#b), 0, "$h: cumulative");
        is($b[-1], $m->{"${h}_count"}, "$h: +Inf equals the count");
        is($m->{"${h}_count"}, $m->{maskserve_steps_total}, "$h: one per step");
    }
    # every step of the workload ran one sequence (one request at a time)
    is($m->{'maskserve_step_batch_sequences_bucket{le="1"}'}
       - ($m0->{'maskserve_step_batch_sequences_bucket{le="1"}'} // 0),
       $d->('maskserve_steps_total'), 'the workload: batches of one');
    is($d->('maskserve_step_batch_sequences_sum'), $d->('maskserve_steps_total'),
       'batch size sum');
}

# nginx's own formatting counters: after masked requests in each form they
# grow by exactly the rows, ids and logprobs the responses carried, and by
# the bytes of their mask text; the time is positive.  Mask-off requests
# and token_ids count nothing.  nginx runs two worker processes here and
# the counters are summed over them, whichever one answers /metrics.
{
    my $m0 = metrics();
    my %want = map { my $f = $_; $f => { map { $_ => 0 } qw(rows ids floats bytes) } }
               qw(json packed);
    my $i = 0;
    for my $case (['selected', 'json'], ['support', 'json'],
                  ['selected', 'packed'], ['support', 'packed'],
                  ['off', 'json'])
    {
        my ($mode, $form) = @$case;
        my $q = req('f' . $i++, 7, top_k => 8 + 3 * $i);
        $q->{sampling_logprobs_mode} = $mode unless $mode eq 'off';
        $q->{return_sampling_mask} = $mode eq 'off' ? $false : $true;
        $q->{mask_format} = 'packed' if $form eq 'packed';
        my $r = $t->generate($q);
        is($r->{status}, 200, "format counters: $mode $form request");
        next if $mode eq 'off';
        my $ch = $r->{json}{choices}[0];
        my $w = $want{$form};
        $w->{rows} += scalar @{ $ch->{token_ids} };
        if ($form eq 'json') {
            my @rows = @{ $ch->{sampling_mask} };
            $w->{ids} += $_ for map { scalar @$_ } @rows;
            my $lps = $ch->{sampling_mask_logprobs};
            $w->{floats} += $mode eq 'support' ? eval { my $s = 0; $s += @$_ for @$lps; $s }
                                               : scalar @$lps;
            # the text of the two arrays' insides, as the body has them
            my ($mt) = $r->{content} =~ /"sampling_mask":\[((?:\[[0-9,]*\],?)*)\]/;
            my ($lt) = $mode eq 'support'
                ? $r->{content} =~ /"sampling_mask_logprobs":\[((?:\[[^\[\]]*\],?)*)\]/
                : $r->{content} =~ /"sampling_mask_logprobs":\[([^\[\]]*)\]/;
            ok(defined $mt && defined $lt, "format counters: $mode json mask text found");
            $w->{bytes} += length($mt // '') + length($lt // '');
        } else {
            my $p = $ch->{sampling_mask_packed};
            my @len = unpack 'l<*', MIME::Base64::decode_base64($p->{lengths});
            is(scalar @len, scalar @{ $ch->{token_ids} }, "format counters: $mode packed lengths");
            my $ids = length(MIME::Base64::decode_base64($p->{ids})) / 4;
            my $lps = length(MIME::Base64::decode_base64($p->{logprobs})) / 4;
            $w->{ids} += $ids;
            $w->{floats} += $lps;
            is($ids, eval { my $s = 0; $s += $_ for @len; $s }, "format counters: $mode packed ids");
            is($lps, $mode eq 'support' ? $ids : scalar @len,
               "format counters: $mode packed logprobs");
            $w->{bytes} += length($p->{$_}) for qw(lengths ids logprobs);
        }
    }
    my $m = metrics();
    for my $form (qw(json packed)) {
        ok($want{$form}{ids} > $want{$form}{rows}, "format counters: $form rows wider than one id");
        for my $k (qw(rows ids floats bytes)) {
            my $n = "maskserve_format_${k}_total{format=\"$form\"}";
            ok(exists $m->{$n}, "$n present");
            is(($m->{$n} // 0) - ($m0->{$n} // 0), $want{$form}{$k},
               "$n grew by $want{$form}{$k}");
        }
        for my $a (qw(ids logprobs)) {
            my $s = "maskserve_format_seconds_total{format=\"$form\",array=\"$a\"}";
            ok(exists $m->{$s}, "$s present");
            cmp_ok(($m->{$s} // 0) - ($m0->{$s} // 0), '>', 0, "$s grew");
            cmp_ok(($m->{$s} // 0) - ($m0->{$s} // 0), '<', 1, "$s: well under a second");
        }
    }

    # the same totals from every process, over fresh connections
    my %seen;
    for (1 .. 6) {
        my $r = HTTP::Tiny->new->get($t->url('/metrics'));
        my ($v) = $r->{content} =~ /^maskserve_format_ids_total\{format="json"\} ([0-9]+)$/m;
        $seen{$v // 'none'}++;
    }
    is_deeply([keys %seen], [$m->{'maskserve_format_ids_total{format="json"}'}],
              'format counters: one total whichever process answers');
}

# ---------------------------------------------------------------- pause

{
    # reference outputs of the requests the keep mode runs
    my @ref = map { $t->generate(req("k$_", 600)) } 1 .. 4;

    # abort under load
    my @h = map { $t->bg('stream', req("a$_", 3000)) } 1 .. 8;
    $t->bg_started($_, 20) for @h;
    my $r = post('pause', { mode => 'abort' });
    is($r->{status}, 200, 'pause abort: 200');
    is($r->{json}{paused}, $true, 'paused');
    is($r->{json}{mode}, 'abort', 'mode abort');
    is($r->{json}{aborted}, 8, 'eight requests aborted');
    my @res = map { $t->bg_wait($_, 30) } @h;
    my @c = map { last_choice($_) } @res;
    is(scalar(grep { $_ && $_->{finish_reason} eq 'abort' } @c), 8,
       'every stream ends with finish_reason abort');
    is(scalar(grep { $_ && ($_->{abort_reason} // '') eq 'paused' } @c), 8,
       'with abort_reason paused');
    is(scalar(grep { $_->{done} } @res), 8, 'and [DONE]');
    is(wstate()->{paused}, $true, '/health: paused');
    is(wstate()->{pause_state}, 'paused', '/health: pause_state paused');

    my $g = $t->generate(req('while-paused', 4));
    is($g->{status}, 503, 'a new request while paused: 503');
    is($g->{headers}{'retry-after'}, '1', 'with Retry-After');
    like($g->{json}{error}{message}, qr/paused/, 'saying paused');

    $r = post('pause', { mode => 'keep' });
    is($r->{status}, 200, 'pause while paused: 200');
    is($r->{json}{was_paused}, $true, 'was paused already');
    is($r->{json}{kept}, 0, 'nothing kept');

    $r = post('resume');
    is($r->{status}, 200, 'resume: 200');
    is($r->{json}{resumed}, $true, 'resumed');
    is($r->{json}{paused}, $false, 'not paused');
    $r = post('resume');
    is($r->{status}, 200, 'resume twice: 200');
    is($r->{json}{resumed}, $false, 'the second resume changes nothing');
    is(wstate()->{paused}, $false, '/health: not paused');
    is($t->generate(req('after-resume', 4))->{status}, 200,
       'requests run again after resume');

    # keep: frozen while paused, then on as if nothing happened
    @h = map { $t->bg('stream', req("k$_", 600)) } 1 .. 4;
    $t->bg_started($_, 20) for @h;
    $r = post('pause', { mode => 'keep' });
    is($r->{status}, 200, 'pause keep: 200');
    # the first streams may have finished while the last ones started
    my $kept = $r->{json}{kept} // 0;
    cmp_ok($kept, '>=', 1, "requests kept ($kept of 4)");
    my $tok0 = wstate()->{tokens};
    sleep 0.5;
    is(wstate()->{tokens}, $tok0, 'no token while paused (keep)');
    is(wstate()->{slots_running}, $kept, 'the kept ones still hold their slots');
    $r = post('resume');
    is($r->{json}{resumed}, $true, 'resume after keep');
    @res = map { $t->bg_wait($_, 60) } @h;
    for my $i (0 .. 3) {
        my $m = MsvTest::merge_events($res[$i]{events});
        is($m && $m->{choices}[0]{finish_reason}, 'length', "keep k" . ($i + 1)
           . ': finishes with length');
        is_deeply($m && $m->{choices}[0]{token_ids},
                  $ref[$i]{json}{choices}[0]{token_ids},
                  "keep k" . ($i + 1) . ': tokens as without the pause');
        is_deeply($m && $m->{choices}[0]{sampling_mask},
                  $ref[$i]{json}{choices}[0]{sampling_mask},
                  "keep k" . ($i + 1) . ': masks as without the pause');
    }

    # wait: answers when they finished by themselves; a second command
    # meanwhile is a 409
    my $done0 = wstate()->{requests_done};
    @h = map { $t->bg('stream', req("w$_", 1000)) } 1 .. 4;
    $t->bg_started($_, 20) for @h;
    my $f = $t->dir . '/pause-wait.json';
    my $pid = fork() // die;
    if ($pid == 0) {
        my $x = post('pause', { mode => 'wait' });
        my $h = wstate();
        open my $fh, '>', $f;
        print $fh JSON::PP->new->encode({ status => $x->{status}, json => $x->{json},
                                          running => $h->{running},
                                          done => $h->{requests_done} });
        close $fh;
        POSIX::_exit(0);
    }
    ok(MsvTest::wait_for(sub { wstate()->{pause_state} eq 'pausing' }, 10),
       '/health: pausing while they finish');
    $r = post('resume');
    is($r->{status}, 409, 'a second command meanwhile: 409');
    like($r->{json}{error}{message}, qr/in progress/, 'saying one is in progress');
    is($t->generate(req('while-pausing', 4))->{status}, 503,
       'a new request while pausing: 503');
    @res = map { $t->bg_wait($_, 60) } @h;
    waitpid($pid, 0);
    open my $fh, '<', $f or die;
    my $pw = JSON::PP->new->decode(do { local $/; <$fh> });
    is($pw->{status}, 200, 'pause wait: 200');
    is($pw->{json}{paused}, $true, 'paused');
    is(scalar(grep { (last_choice($_)->{finish_reason} // '') eq 'length' } @res),
       4, 'every stream finished by itself (length)');
    is($pw->{running}, 0, 'answered once nothing ran any more');
    is($pw->{done}, $done0 + 4, 'all four had finished');
    is(wstate()->{pause_state}, 'paused', '/health: paused');
    is(post('resume')->{json}{resumed}, $true, 'resume after wait');

    # a client that goes away does not cancel its command: the pause
    # still completes and the channel is free again after it
    @h = map { $t->bg('stream', req("g$_", 600)) } 1 .. 2;
    $t->bg_started($_, 20) for @h;
    my $sock = $t->raw_post('/inference/v1/pause', { mode => 'wait' });
    ok(MsvTest::wait_for(sub { wstate()->{pause_state} eq 'pausing' }, 10),
       'client gone: pausing');
    close $sock;
    @res = map { $t->bg_wait($_, 60) } @h;
    ok(MsvTest::wait_for(sub { wstate()->{pause_state} eq 'paused' }, 10),
       'client gone: paused once they finished');
    $r = post('resume');
    is($r->{status}, 200, 'client gone: the channel is free, resume 200');
    is($r->{json}{resumed}, $true, 'resumed');

    # bad bodies
    $r = post('pause', { mode => 'later' });
    is($r->{status}, 400, 'unknown mode: 400');
    is($r->{json}{error}{param}, 'mode', 'naming mode');
    $r = post('pause', { mode => 3 });
    is($r->{json}{error}{param}, 'mode', 'a number for mode: 400 naming mode');
    $r = post('pause', { mode => 'abort', now => $true });
    is($r->{status}, 400, 'unknown field: 400');
    is($r->{json}{error}{param}, 'now', 'naming it');
    $r = post('resume', '{"x":');
    is($r->{status}, 400, 'invalid JSON: 400');
    $r = post('resume', '[]');
    is($r->{status}, 400, 'not an object: 400');
    $r = $t->request('POST', '/inference/v1/resume', undef);
    is($r->{status}, 200, 'resume with no body: 200');
    is($t->get('/inference/v1/pause')->{status}, 405, 'GET pause: 405');
    is(wstate()->{paused}, $false, 'none of that paused anything');
}

# ---------------------------------------------------------------- abort

{
    my @h = map { $t->bg('stream', req("b$_", 3000)) } 1 .. 4;
    $t->bg_started($_, 20) for @h;
    my $r = post('abort_requests', { request_ids => ['b1', 'b3', 'nope'] });
    is($r->{status}, 200, 'abort a list: 200');
    is($r->{json}{aborted}, 2, 'two aborted');
    is_deeply([sort @{ $r->{json}{request_ids} }], ['b1', 'b3'], 'b1 and b3');
    is_deeply($r->{json}{not_found}, ['nope'], 'the unknown id not found');
    my @res = map { $t->bg_wait($h[$_], 20) } 0, 2;
    is(scalar(grep { (last_choice($_)->{finish_reason} // '') eq 'abort' } @res),
       2, 'b1 and b3 end with finish_reason abort');
    is(wstate()->{slots_running}, 2, 'b2 and b4 still run');

    $r = post('abort_requests', {});
    is($r->{json}{aborted}, 2, 'abort all: two');
    is_deeply([sort @{ $r->{json}{request_ids} }], ['b2', 'b4'], 'b2 and b4');
    @res = map { $t->bg_wait($h[$_], 20) } 1, 3;
    is(scalar(grep { (last_choice($_)->{finish_reason} // '') eq 'abort' } @res),
       2, 'they end with finish_reason abort');
    $r = post('abort_requests', { request_ids => [] });
    is($r->{json}{aborted}, 0, 'abort all with nothing in flight: none');

    for my $bad ('"b1"', '[1]', '["bad id"]', '{"a":1}') {
        $r = post('abort_requests', "{\"request_ids\":$bad}");
        is($r->{status}, 400, "request_ids $bad: 400");
        is($r->{json}{error}{param}, 'request_ids', 'naming request_ids');
    }
}

# ---------------------------------------------------------------- other hosts

# a second nginx, same Redis, that does not see the worker's region:
# all_hosts reaches the requests of this host through the abort channel
{
    my $t2 = MsvTest->new(redis_port => $t->{redis_port});
    $t2->start_nginx(processes => 1, workers => ["t60-absent-$$"],
                     no_wait_ready => 1, server => <<'EOF');
        location = /inference/v1/abort_requests {
            maskserve_abort_requests;
        }
EOF
    ok(MsvTest::wait_for(sub { (($t2->health // {})->{redis} // '') eq 'up' }, 10),
       'second nginx: redis up');
    my @h = map { $t->bg('stream', req("h$_", 3000)) } 1 .. 3;
    $t->bg_started($_, 20) for @h;

    my $r = $t2->post('/inference/v1/abort_requests', { request_ids => ['h2'] });
    is($r->{json}{aborted}, 0, 'without all_hosts the other host is not reached');
    is_deeply($r->{json}{not_found}, ['h2'], 'h2 not found there');
    is(wstate()->{slots_running}, 3, 'all three still run');

    $r = $t2->post('/inference/v1/abort_requests',
                   { request_ids => ['h2'], all_hosts => $true });
    is($r->{status}, 200, 'all_hosts with a list: 200');
    is($r->{json}{all_hosts}, $true, 'all_hosts true');
    my $c = last_choice($t->bg_wait($h[1], 20));
    is($c && $c->{finish_reason}, 'abort', 'h2 aborted from the other host');
    is(wstate()->{slots_running}, 2, 'the other two still run');

    $r = $t2->post('/inference/v1/abort_requests', { all_hosts => $true });
    is($r->{status}, 200, 'all_hosts for all: 200');
    my @c = map { last_choice($t->bg_wait($h[$_], 20)) } 0, 2;
    is(scalar(grep { $_ && $_->{finish_reason} eq 'abort' } @c), 2,
       'h1 and h3 aborted from the other host');

    $r = $t2->post('/inference/v1/abort_requests', { all_hosts => 1 });
    is($r->{status}, 400, 'all_hosts not a boolean: 400');
    is($r->{json}{error}{param}, 'all_hosts', 'naming all_hosts');
    $t2->stop_nginx;
}

# ---------------------------------------------------------------- flush

{
    my $p = [map { 300 + $_ } 1 .. 40];      # two full pages and a tail
    my $q = { %{ req('f1', 2) }, token_ids => $p };
    $t->generate($q);
    my $m0 = metrics();
    $t->generate({ %$q, request_id => 'f2' });
    my $m1 = metrics();
    cmp_ok($m1->{maskserve_prefix_hit_tokens_total}
           - $m0->{maskserve_prefix_hit_tokens_total}, '>=', 32,
           'the second run finds the prompt cached');
    ok($m1->{maskserve_kv_cached_pages} > 0, 'cached pages before the flush');

    my $r = post('flush_cache');
    is($r->{status}, 200, 'flush_cache: 200');
    is($r->{json}{flushed}, $true, 'flushed');
    is($r->{json}{pages_dropped}, $m1->{maskserve_kv_cached_pages},
       'every cached page dropped');
    my $m2 = metrics();
    is($m2->{maskserve_kv_cached_pages}, 0, 'no cached page after');
    is($m2->{maskserve_cache_flushes_total}, 1, 'one flush counted');
    $t->generate({ %$q, request_id => 'f3' });
    my $m3 = metrics();
    is($m3->{maskserve_prefix_hit_tokens_total},
       $m2->{maskserve_prefix_hit_tokens_total},
       'after the flush the prompt is computed again');
    is($m3->{maskserve_prefill_tokens_total} - $m2->{maskserve_prefill_tokens_total},
       40, 'all of it');
}

# ---------------------------------------------------------------- access

{
    is($t->post('/denied/pause', {})->{status}, 403, 'denied client: pause 403');
    is($t->get('/denied/metrics')->{status}, 403, 'denied client: metrics 403');
    is(wstate()->{paused}, $false, 'the denied pause did nothing');
    my $m = metrics();
    is($m->{'maskserve_requests_aborted_total{reason="paused"}'}, 8,
       'metrics: eight aborted by the pause');
    is($m->{'maskserve_requests_aborted_total{reason="cancelled"}'}, 7,
       'metrics: seven cancelled by abort_requests');
}

done_testing;
