#!/usr/bin/perl
# A stalled worker (SIGSTOP): below maskserve_worker_stall_timeout its
# requests wait and finish intact once it runs again, while /health
# reports it stalled; above the limit they end with an error that says
# what was seen (no heartbeat for N s), and the worker is attached again
# once it runs.  A step longer than the limit (a long prefill) keeps the
# heartbeat beating: busy, not stalled.  The directive's bound and the
# worker's --step-timeout are checked.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use JSON::PP;
use Test::More;
use POSIX ();
use Time::HiRes qw(time sleep);
use MsvTest;

my $t = MsvTest->new;
my $w = $t->start_worker(slots => 8, max_model_len => 4096, threads => 1);
$t->start_nginx(http => "    maskserve_worker_stall_timeout 3s;\n");

my $true = JSON::PP::true;

sub req {
    my ($id, $n) = @_;
    return { request_id => $id, token_ids => [1, 2, 3, 4],
             sampling_params => { max_tokens => $n, ignore_eos => $true,
                                  top_k => 8 } };
}

sub worker0 { my $h = $t->health; $h ? ($h, $h->{workers}[0]) : () }

{
    my ($h, $w0) = worker0();
    is($h->{status}, 'ok', 'health ok at start');
    is($w0->{stalled}, JSON::PP::false, 'worker not stalled');
    is($w0->{stall_limit_ms}, 3000, 'the stall limit of the directive');
}

# --- stopped below the limit: the request waits and finishes intact
{
    my $bg = $t->bg(stream => req('stall-short', 2000));
    ok($t->bg_started($bg), 'stream started');
    kill 'STOP', $w->{pid};
    sleep 1.6;

    my ($h, $w0) = worker0();
    is($h->{status}, 'degraded', 'health degraded while stopped');
    is($w0->{stalled}, $true, 'the worker is reported stalled');
    cmp_ok($w0->{heartbeat_age_ms}, '>=', 1000, 'heartbeat age over a second');
    is($w0->{ready}, $true, 'still ready: below the stall limit');
    cmp_ok($w0->{slots_in_use}, '>=', 1, 'its request still in flight');

    kill 'CONT', $w->{pid};
    my $r = $t->bg_wait($bg, 30);
    ok($r, 'the stream ended');
    my @ev = @{ $r->{events} // [] };
    ok(!(grep { $_->{error} } @ev), 'no error event');
    my $m = MsvTest::merge_events(\@ev);
    my $c = $m ? $m->{choices}[0] : {};
    is(scalar @{ $c->{token_ids} // [] }, 2000, 'all 2000 tokens');
    is($c->{finish_reason}, 'length', 'finish_reason length');
    is($r->{done}, 1, '[DONE]');

    ok(MsvTest::wait_for(sub { my ($h) = worker0(); $h && $h->{status} eq 'ok' }, 5),
       'health ok again');
}

# --- stopped above the limit: an error saying what was seen
{
    my $bg = $t->bg(stream => req('stall-long', 4000));
    ok($t->bg_started($bg), 'stream started');
    my $t0 = time;
    kill 'STOP', $w->{pid};

    my $r = $t->bg_wait($bg, 15);
    my $dt = time - $t0;
    ok($r, 'the stream ended');
    cmp_ok($dt, '>=', 2.9, 'not before the stall limit');
    cmp_ok($dt, '<', 6, 'soon after it');
    my $last = $r->{events}[-1] // {};
    ok($last->{error}, 'with an error event') or diag(explain $last);
    is($last->{error}{type}, 'server_error', 'type server_error');
    like($last->{error}{message}, qr/no heartbeat from the worker \(pid \d+\) for 3\.\d s, the stall limit is 3\.0 s/,
         'the message says what was seen');
    unlike($last->{error}{message}, qr/died or was replaced/, 'not a guess');
    is($r->{done}, 1, 'then [DONE]');
    like($t->error_log, qr/lost: no heartbeat from the worker/, 'logged as seen');

    kill 'CONT', $w->{pid};
    ok(MsvTest::wait_for(sub { my ($h, $w0) = worker0(); $w0 && $w0->{ready} }, 10),
       'attached again once the worker runs');
    my $g = $t->generate(req('after-stall', 5));
    is($g->{status}, 200, 'and serving');
    is(scalar @{ $g->{json}{choices}[0]{token_ids} // [] }, 5, '5 tokens');
}

# --- a long step is busy, not stalled: the heartbeat beats through it
{
    my $dir = $t->dir;
    open my $fh, '>', "$dir/long-step.json" or die "$dir/long-step.json: $!";
    print $fh encode_json({
        architectures => ['Qwen3ForCausalLM'], model_type => 'qwen3',
        vocab_size => 4099, hidden_size => 512, intermediate_size => 1536,
        num_hidden_layers => 8, num_attention_heads => 8,
        num_key_value_heads => 4, head_dim => 64,
        max_position_embeddings => 8192, rms_norm_eps => 1e-6,
        rope_theta => 10000.0, tie_word_embeddings => JSON::PP::false,
        eos_token_id => 0 });
    close $fh;

    my $t2 = MsvTest->new;
    # the CPU backend, whatever MSV_BACKEND says: a GPU makes no step of
    # this model long enough
    my $big = $t2->start_worker(model => "$dir/long-step.json", slots => 2,
                                max_model_len => 8192, threads => 1,
                                args => ['--max-num-batched-tokens', 8192,
                                         '--backend', 'cpu']);
    $t2->start_nginx(http => "    maskserve_worker_stall_timeout 1s;\n");

    # a prefill in one step, longer each time until it outlasts the limit
    my ($n, $max_step, $stalled, $ok) = (128, 0, 0, 1);
    while ($max_step < 1500 && $n <= 4096) {
        my $bg = $t2->bg(generate => { request_id => "long-$n",
            token_ids => [map { 1 + $_ % 4000 } 1 .. $n],
            sampling_params => { max_tokens => 1 } });
        until (waitpid($bg->{pid}, POSIX::WNOHANG()) == $bg->{pid}) {
            my $h = $t2->health;
            my $w0 = $h ? $h->{workers}[0] : {};
            $max_step = $w0->{step_ms} if ($w0->{step_ms} // 0) > $max_step;
            $stalled++ if $w0->{stalled};
            sleep 0.1;
        }
        open my $rf, '<', $bg->{file} or die;
        my $r = decode_json(do { local $/; <$rf> });
        $ok = 0 unless ($r->{status} // 0) == 200;
        diag("a prefill of $n tokens: status $r->{status}, longest step "
             . "seen $max_step ms");
        $n *= 2;
    }
    cmp_ok($max_step, '>=', 1500, 'a step ran longer than the 1s stall limit');
    ok($ok, 'every long prefill answered 200');
    is($stalled, 0, 'the worker was never reported stalled meanwhile');
    unlike($t2->error_log, qr/lost: no heartbeat/, 'nor given up');
}

# --- the directive's bound
{
    my $t2 = MsvTest->new;
    my $conf = $t2->write_conf(workers => [$w->{name}],
        http => "    maskserve_worker_stall_timeout 500ms;\n");
    my $out = `$MsvTest::NGINX -t -p ${\ $t2->dir}/ -c $conf 2>&1`;
    isnt($? >> 8, 0, 'a stall timeout under 1s fails the configuration');
    like($out, qr/"maskserve_worker_stall_timeout" must be at least 1s/,
         '... saying so');
}

# --- the worker's --step-timeout
for my $bad ('0', 'x', '-1') {
    my $out = `$MsvTest::BUILD/maskserve-worker --dummy tiny --step-timeout $bad 2>&1`;
    isnt($? >> 8, 0, "--step-timeout $bad refused");
    like($out, qr/--step-timeout: invalid value/, '... saying so');
}

done_testing;
