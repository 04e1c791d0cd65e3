#!/usr/bin/perl
# Weight updates from disk, end to end (real nginx, worker and Redis; the
# CPU backend, or the one $MSV_BACKEND names: bench/gpu_tests.sh runs it
# with MSV_BACKEND=cuda): a worker serving the qwen3-tiny fixture (A) is
# updated to B, a checkpoint of the same config with other values
# (written here from A), and back.
#
# - After an update the worker answers exactly as a worker started on B
#   (same seeded requests: tokens and masks); before, as A; every choice
#   names the version it ran on; /health, /v1/models and /metrics follow.
# - A wrong shape, a missing tensor, an extra tensor, a truncated file, a
#   different config, a missing directory: 400 naming the field and the
#   tensor, and the old weights keep serving, byte-identical answers.
# - A prompt cached before the update is computed again after it (and
#   matches B's answer, which stale KV would not).
# - Under a load of streams in each mode: abort ends them with abort
#   reason "paused"; wait lets them finish on the old version first; keep
#   lets them go on and finish.  A second update meanwhile gets 409.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use File::Copy qw(copy);
use JSON::PP;
use POSIX ();
use Test::More;
use Time::HiRes qw(time sleep);
use MsvTest;

my $t = MsvTest->new;
my $true = JSON::PP::true;
my $dir = $t->dir;
my $A = "$MsvTest::ROOT/t/fixtures/qwen3-tiny";
my $json = JSON::PP->new->canonical;

# ---------------------------------------------------------------- checkpoints

sub read_st {
    my ($path) = @_;
    open my $fh, '<:raw', $path or die "$path: $!";
    local $/;
    my $all = <$fh>;
    my $n = unpack('Q<', substr($all, 0, 8));
    return (decode_json(substr($all, 8, $n)), substr($all, 8 + $n));
}

sub write_st {
    my ($d, $hdr, $data, %o) = @_;
    mkdir $d;
    copy("$A/config.json", "$d/config.json") or die;
    my $h = $json->encode($hdr);
    $h .= ' ' x ((8 - length($h) % 8) % 8);
    open my $fh, '>:raw', "$d/model.safetensors" or die;
    print $fh pack('Q<', length $h), $h, $data;
    close $fh;
    truncate("$d/model.safetensors", (-s "$d/model.safetensors") - $o{cut})
        if $o{cut};
    return $d;
}

my ($hdr, $data) = read_st("$A/model.safetensors");

# B: every tensor's elements in reverse order (same names, shapes, dtypes)
my $bdata = $data;
for my $k (grep { $_ ne '__metadata__' } keys %$hdr) {
    my ($s, $e) = @{ $hdr->{$k}{data_offsets} };
    die "fixture: $k is not F32" unless $hdr->{$k}{dtype} eq 'F32';
    substr($bdata, $s, $e - $s) = pack('V*', reverse unpack('V*', substr($data, $s, $e - $s)));
}
my $B = write_st("$dir/B", $hdr, $bdata);

my %h2 = %{ decode_json($json->encode($hdr)) };
my $sh = 'model.layers.0.mlp.up_proj.weight';
$h2{$sh}{shape} = [reverse @{ $h2{$sh}{shape} }];
my $bad_shape = write_st("$dir/bad-shape", \%h2, $bdata);

my %h3 = %{ decode_json($json->encode($hdr)) };
my $gone = 'model.layers.1.mlp.down_proj.weight';
delete $h3{$gone};
my $bad_missing = write_st("$dir/bad-missing", \%h3, $bdata);

my %h4 = %{ decode_json($json->encode($hdr)) };
$h4{'model.extra.weight'} = { %{ $h4{'model.norm.weight'} } };
my $bad_extra = write_st("$dir/bad-extra", \%h4, $bdata);

my $bad_cut = write_st("$dir/bad-cut", $hdr, $bdata, cut => 1000);

# ---------------------------------------------------------------- servers

$t->start_redis;
my $w = $t->start_worker(slots => 40, max_model_len => 512, model_dir => $A,
                         args => ['--weight-version', 'A1']);
my $wb = $t->start_worker(slots => 8, max_model_len => 512, model_dir => $B,
                          args => ['--weight-version', 'B']);
$t->start_nginx(workers => [$w->{name}], server => <<"EOF");
        location = /b/generate {
            maskserve_worker $wb->{name};
            maskserve_generate;
        }

        location = /inference/v1/update_weights_from_disk {
            allow 127.0.0.1;
            deny all;
            maskserve_update_weights;
        }

        location = /inference/v1/pause {
            maskserve_pause;
        }

        location = /inference/v1/resume {
            maskserve_resume;
        }

        location = /denied/update {
            deny all;
            maskserve_update_weights;
        }

        location = /v1/models {
            maskserve_models;
        }

        location = /metrics {
            maskserve_metrics;
        }
EOF

sub req {
    my ($id, $max, %o) = @_;
    return { request_id => $id, token_ids => [5, 17, 300, 42, 996],
             return_sampling_mask => $true,
             sampling_params => { max_tokens => $max, temperature => 1.0,
                                  top_k => 20, seed => 77, %o } };
}

sub update { $t->post('/inference/v1/update_weights_from_disk', { @_ }) }
sub wstate { $t->health->{workers}[0] }
sub choice { $_[0]{json}{choices}[0] }
sub metric {
    my ($name) = @_;
    my $r = $t->get('/metrics');
    return $r->{content} =~ /^\Q$name\E\{worker="[^"]*"\} (\S+)$/m ? $1 : undef;
}

my $q = req('q', 24);
my $onA = $t->generate($q);
is($onA->{status}, 200, 'on A: 200');
is(choice($onA)->{weight_version}, 'A1', 'the choice names version A1');
my $onB = $t->post('/b/generate', { %$q, stream => JSON::PP::false });
is($onB->{status}, 200, 'the B worker: 200');
isnt($json->encode(choice($onB)->{token_ids}), $json->encode(choice($onA)->{token_ids}),
     'A and B differ');

# a long prompt, cached on A
my $P = { %{ req('p', 4) }, token_ids => [map { 10 + $_ } 1 .. 48] };
$t->generate($P);

# ---------------------------------------------------------------- refusals

for my $case ([$bad_shape, qr/\Q$sh\E.*shape/, 'a wrong shape'],
              [$bad_missing, qr/\Q$gone\E.*missing/, 'a missing tensor'],
              [$bad_extra, qr/model\.extra\.weight/, 'an extra tensor'],
              [$bad_cut, qr/safetensors/, 'a truncated file'],
              ["$MsvTest::ROOT/t/fixtures/qwen3-tiny-bf16", qr/config\.json/,
               'another config'],
              ["$dir/nowhere", qr/nowhere/, 'no such directory'])
{
    my ($path, $re, $what) = @$case;
    my $r = update(model_path => $path, weight_version => 'X');
    is($r->{status}, 400, "$what: 400");
    is($r->{json}{error}{param}, 'model_path', "$what: naming model_path");
    like($r->{json}{error}{message}, $re, "$what: saying what") or diag($r->{content});
    my $again = $t->generate($q);
    is($again->{content}, $onA->{content}, "$what: the old weights answer byte for byte");
}
is(wstate()->{weight_version}, 'A1', 'still version A1');
is(metric('maskserve_weight_update_failures_total'), 6, 'six failures counted');

for my $bad ([{ weight_version => 'X' }, 'model_path'],
             [{ model_path => $B }, 'weight_version'],
             [{ model_path => $B, weight_version => 'a"b' }, 'weight_version'],
             [{ model_path => $B, weight_version => 'x' x 65 }, 'weight_version'],
             [{ model_path => $B, weight_version => 'X', mode => 'now' }, 'mode'],
             [{ model_path => $B, weight_version => 'X', force => 1 }, 'force'])
{
    my $r = update(%{ $bad->[0] });
    is($r->{status}, 400, "bad body ($bad->[1]): 400");
    is($r->{json}{error}{param}, $bad->[1], "naming $bad->[1]");
}
is($t->post('/denied/update', { model_path => $B, weight_version => 'X' })->{status},
   403, 'a denied client: 403');
is(wstate()->{weight_version}, 'A1', 'none of that changed the version');

# ---------------------------------------------------------------- update

{
    my $r = update(model_path => $B, weight_version => 'B1');
    is($r->{status}, 200, 'update to B: 200') or diag($r->{content});
    is($r->{json}{updated}, $true, 'updated');
    is($r->{json}{weight_version}, 'B1', 'version B1');
    ok(defined $r->{json}{seconds} && defined $r->{json}{pause_seconds},
       'seconds and pause_seconds');
    is(wstate()->{weight_version}, 'B1', '/health: B1');
    is($t->get('/v1/models')->{json}{data}[0]{weight_version}, 'B1', '/v1/models: B1');
    is(metric('maskserve_weight_updates_total'), 1, 'metrics: one update');

    my $now = $t->generate($q);
    is_deeply(choice($now)->{token_ids}, choice($onB)->{token_ids},
              'after the update: the tokens of a worker started on B');
    is_deeply(choice($now)->{sampling_mask}, choice($onB)->{sampling_mask},
              'and its masks');
    is_deeply(choice($now)->{sampling_mask_logprobs},
              choice($onB)->{sampling_mask_logprobs}, 'and its logprobs');
    is(choice($now)->{weight_version}, 'B1', 'the choice names B1');

    my $hits = metric('maskserve_prefix_hit_tokens_total');
    my $pb = $t->post('/b/generate', { %$P, stream => JSON::PP::false });
    my $pa = $t->generate($P);
    is(metric('maskserve_prefix_hit_tokens_total'), $hits,
       'the prompt cached before the update is not found after it');
    is_deeply(choice($pa)->{sampling_mask_logprobs},
              choice($pb)->{sampling_mask_logprobs},
              'it is computed again: the answer of B');
}

# ---------------------------------------------------------------- under load

sub streams {
    my ($tag, $n, $max) = @_;
    my @h = map { $t->bg('stream', req("$tag$_", $max, seed => $_, ignore_eos => $true)) } 1 .. $n;
    $t->bg_started($_, 20) for @h;
    return @h;
}

sub last_choice {
    my ($r) = @_;
    return {} unless $r && $r->{events} && @{ $r->{events} };
    return $r->{events}[-1]{choices}[0];
}

{
    my @h = streams('ab', 32, 500);
    my $r = update(model_path => $A, weight_version => 'A2', mode => 'abort');
    is($r->{status}, 200, 'update abort under load: 200');
    # the first streams may have finished while the last ones started
    my $ab = $r->{json}{aborted} // 0;
    cmp_ok($ab, '>=', 16, "most of them aborted ($ab)");
    my @c = map { last_choice($t->bg_wait($_, 30)) } @h;
    is(scalar(grep { ($_->{finish_reason} // '') eq 'abort'
                     && ($_->{abort_reason} // '') eq 'paused' } @c), $ab,
       'those end with abort, reason paused');
    is(scalar(grep { ($_->{finish_reason} // '') eq 'length' } @c), 32 - $ab,
       'the others had finished');
    is(choice($t->generate($q))->{weight_version}, 'A2', 'A2 serves');
    is($t->generate($q)->{json}{choices}[0]{token_ids}[0],
       choice($onA)->{token_ids}[0], 'A answers again');

    # wait: they finish on A2; a second update meanwhile is a 409.  On a
    # GPU the tiny model's steps are fast enough that 120 tokens could all
    # be out before the second update arrives: the longest the fixture's
    # 512 positions allow there
    @h = streams('wt', 32, ($ENV{MSV_BACKEND} // 'cpu') eq 'cpu' ? 120 : 500);
    my $f = "$dir/update-wait.json";
    my $pid = fork() // die;
    if ($pid == 0) {
        my $x = update(model_path => $B, weight_version => 'B2', mode => 'wait');
        open my $fh, '>', $f;
        print $fh $json->encode({ status => $x->{status}, json => $x->{json} });
        close $fh;
        POSIX::_exit(0);
    }
    ok(MsvTest::wait_for(sub { wstate()->{pause_state} eq 'pausing' }, 10),
       'update wait: pausing while they finish');
    $r = update(model_path => $B, weight_version => 'B3');
    is($r->{status}, 409, 'a second update meanwhile: 409');
    @c = map { last_choice($t->bg_wait($_, 60)) } @h;
    waitpid($pid, 0);
    open my $fh, '<', $f or die;
    my $uw = decode_json(do { local $/; <$fh> });
    is($uw->{status}, 200, 'update wait: 200');
    is(scalar(grep { ($_->{finish_reason} // '') eq 'length' } @c), 32,
       'every stream finished by itself');
    is(scalar(grep { ($_->{weight_version} // '') eq 'A2' } @c), 32,
       'on the old version');
    is(wstate()->{weight_version}, 'B2', 'then B2 serves');
    is(wstate()->{paused}, JSON::PP::false, 'and the worker runs again');

    # keep: they go on through the swap
    @h = streams('kp', 32, 500);
    $r = update(model_path => $A, weight_version => 'A3', mode => 'keep');
    is($r->{status}, 200, 'update keep under load: 200');
    # the first streams may have finished while the last ones started
    my $kept = $r->{json}{kept} // 0;
    cmp_ok($kept, '>=', 16, "most of them kept ($kept)");
    @c = map { last_choice($t->bg_wait($_, 60)) } @h;
    is(scalar(grep { ($_->{finish_reason} // '') eq 'length' } @c), 32,
       'every stream goes on to its length');
    my $spans = 0;
    for my $c (@c) {
        my $v = $c->{weight_versions} // [];
        $spans++ if @$v == 2 && $v->[0]{version} eq 'B2' && $v->[1]{version} eq 'A3'
                    && $v->[0]{start} == 0 && $v->[0]{end} == $v->[1]{start}
                    && $v->[1]{end} == 500 && $v->[0]{end} > 0
                    && $c->{weight_version} eq 'B2';
    }
    is($spans, $kept, 'each kept one names two version spans: B2 up to the '
       . 'swap, A3 after');
    ok(!exists choice($t->generate($q))->{weight_versions},
       'a request that ran on one version has no spans');
    is(metric('maskserve_weight_updates_total'), 4, 'metrics: four updates');

    # paused with requests kept in place: wait could never end, keep does
    @h = streams('pk', 4, 500);
    $r = $t->post('/inference/v1/pause', { mode => 'keep' });
    # the first streams may have finished while the last ones started
    $kept = $r->{json}{kept} // 0;
    cmp_ok($kept, '>=', 1, "paused with requests kept ($kept)");
    $r = update(model_path => $B, weight_version => 'B4', mode => 'wait');
    is($r->{status}, 409, 'update wait while they are kept: 409');
    like($r->{json}{error}{message}, qr/kept in place/, 'saying why');
    is(wstate()->{weight_version}, 'A3', 'nothing changed');
    $r = update(model_path => $B, weight_version => 'B4', mode => 'keep');
    is($r->{status}, 200, 'update keep while paused: 200');
    is(wstate()->{pause_state}, 'paused', 'still paused after it');
    is($t->post('/inference/v1/resume', {})->{json}{resumed}, JSON::PP::true, 'resume');
    @c = map { last_choice($t->bg_wait($_, 60)) } @h;
    is(scalar(grep { ($_->{finish_reason} // '') eq 'length' } @c), 4,
       'they all finish');
    is(scalar(grep { @{ $_->{weight_versions} // [] } == 2 } @c), $kept,
       'the kept ones with two version spans');
}

done_testing;
