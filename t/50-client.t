# The Python client (client/) against a live stack: the package is
# installed with pip (no network: --no-build-isolation --no-index), its
# offline decoding tests run with numpy and without, and its live tests
# run against real nginx + the module + a CPU worker: packed == JSON in
# every mode, streamed and not, greedy, whole-vocabulary rows, aborted and
# random requests, and the replay of masks on the CPU backend's own
# logits (build/maskserve-logits) in numpy and torch to 1e-5.  Then
# bench/e2e_load checks live responses of every variant (JSON and packed
# side by side, their mask rows compared), and bench/e2e_check whole
# bodies and streams, live and broken.
#
# Every Python test is relayed as one TAP line; a skipped one fails.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use File::Path qw(make_path);
use Test::More;
use MsvTest;

my $root = $MsvTest::ROOT;
my $py = $ENV{MSV_PYTHON} // (-x '/usr/bin/python3' ? '/usr/bin/python3'
                                                     : 'python3');

my $t = MsvTest->new;
my $dir = $t->dir;

# a missing dependency fails this file (tools/deps.sh installs them)
for my $m ('numpy', 'torch') {
    next if is(system($py, '-c', "import $m"), 0, "$py has $m");
    diag("$py cannot import $m (MSV_PYTHON names another python3)");
    done_testing;
    exit 1;
}

# install as a user would, from a copy (pip builds in the source tree)
system('cp', '-r', "$root/client", "$dir/client-src") == 0 or die;
my $out = `$py -m pip install -q --disable-pip-version-check --target $dir/site --no-build-isolation --no-index --no-deps $dir/client-src 2>&1`;
is($?, 0, 'pip install ./client') or diag($out);
ok(-f "$dir/site/maskserve_client/__init__.py", '... installs maskserve_client');

# Run a unittest module, relay its tests as TAP; returns the count.
sub pytests {
    my ($label, $module, %env) = @_;
    local %ENV = (%ENV, PYTHONPATH => "$dir/site",
                  PYTHONDONTWRITEBYTECODE => 1, %env);
    my $cmd = "cd $root/client/tests && $py -m unittest -v $module 2>&1";
    my @l = `$cmd`;
    my $rc = $?;
    my $n = 0;
    for (@l) {
        if (/^(test\w+) \(.*?\) \.\.\. (.*)$/) {
            my ($name, $res) = ($1, $2);
            ok($res eq 'ok', "$label: $name") or diag($res);
            $n++;
        }
    }
    ok($rc == 0 && $n > 0, "$label: $module passes ($n tests)")
        or diag(join '', @l);
    note(join '', grep { !/^test\w+ \(/ } @l);
    return $n;
}

pytests('decode, numpy', 'test_decode');
pytests('decode, no numpy', 'test_decode', MASKSERVE_CLIENT_NO_NUMPY => 1);

my $w = $t->start_worker(slots => 16, max_model_len => 4096, threads => 1);
$t->start_nginx;

my %live = (MSV_URL => $t->url(''),
            MSV_LOGITS => "$MsvTest::BUILD/maskserve-logits",
            MSV_DUMMY => 'tiny', MSV_WORKER_SEED => 1,
            MSV_LOGITS_BACKEND => $ENV{MSV_BACKEND} // 'cpu',
            # the worker's --batch-invariant, so the replay's logits are
            # the worker's bit for bit on CUDA too
            MSV_LOGITS_ARGS => (($ENV{MSV_WORKER_ARGS} // '') =~ /--batch-invariant/
                                ? '--batch-invariant' : ''),
            MSV_CLIENT_INSTALLED => "$dir/site/", MSV_REQUIRE_TORCH => 1);

pytests('live, numpy', 'test_live', %live);
# the replay is numpy's and torch's; everything else runs without numpy
pytests('live, no numpy', join(' ', map { "test_live.Live.$_" }
            qw(test_packed_equals_json test_aborted_request
               test_random_requests test_packed_events_cover_their_tokens
               test_bad_mask_format test_installed_package)),
        %live, MASKSERVE_CLIENT_NO_NUMPY => 1);

# the load client's checker on live responses, every variant side by side:
# JSON and packed masks checked alike and their rows compared
my ($port) = $t->url('') =~ /:(\d+)$/;
for my $k (50, -1) {
    my $o = `$MsvTest::BUILD/bench/e2e_load --port $port -c 4 -n 16 --repeats 1 --max-tokens 8 --warmup 4 --modes all --top-k $k 2>&1`;
    is($?, 0, "bench/e2e_load validates every variant (top_k $k)")
        or diag($o);
    like($o, qr/validation: 0 failed responses, 0 token_ids mismatches/,
         '... with no failure and no mismatch');
}

# the same checker on whole bodies and raw streams (bench/e2e_check, which
# the other tests call on choices): live ones pass, each broken copy is
# caught with the problem named
{
    my $V = $t->health->{workers}[0]{vocab_size};
    my $true = JSON::PP::true;
    my @reqs = map { { token_ids => [5, 6, 7],
                       sampling_params => { max_tokens => 6, top_k => 20,
                                            seed => 3, ignore_eos => $true,
                                            logprobs => 2 },
                       %$_ } }
        {},
        { return_sampling_mask => $true, sampling_logprobs_mode => 'selected' },
        { return_sampling_mask => $true, sampling_logprobs_mode => 'support' },
        { return_sampling_mask => $true, sampling_logprobs_mode => 'support',
          mask_format => 'packed' };
    my @items;
    for my $req (@reqs) {
        my %plain = %$req;
        delete $plain{sampling_params}{logprobs} if $req->{mask_format};
        my $r = $t->generate(\%plain);
        my $s = $t->stream(\%plain);
        push @items, [\%plain, $r->{content}, 'body'],
                     [\%plain, MsvTest::json()->encode($s->{raw}), 'stream'];
    }
    my ($body, $stream) = ($items[4][1], $t->stream($reqs[2])->{raw});
    (my $eos = $body) =~ s/"finish_reason":"length"/"finish_reason":"stop"/;
    (my $row = $body) =~ s/"sampling_mask":\[\[/"sampling_mask":[[$V,/;
    (my $usage = $body) =~ s/"completion_tokens":6/"completion_tokens":5/;
    (my $done = $stream) =~ s/data: \[DONE\]\n\n//;
    my @bad = ([$eos, 'with ignore_eos, expected "length"'],
               [$row, 'not ascending and unique'],
               [$usage, 'usage.completion_tokens 5'],
               [MsvTest::json()->encode($done), 'did not end with data: [DONE]']);
    my $in = "$dir/checks.txt";
    open my $fh, '>', $in or die "$in: $!";
    print $fh MsvTest::json()->encode($_->[0]), "\n", $_->[1], "\n" for @items;
    print $fh MsvTest::json()->encode($reqs[2]), "\n", $_->[0], "\n" for @bad;
    close $fh;
    my @out = map { MsvTest::json()->decode($_) }
              `$MsvTest::BUILD/bench/e2e_check --vocab $V $in`;
    is($? >> 8, 1, 'bench/e2e_check: exit status 1 when a pair has a problem');
    for my $i (0 .. $#items) {
        my $what = ($items[$i][0]{sampling_logprobs_mode} // 'off')
                 . ($items[$i][0]{mask_format} ? ' packed' : '');
        is_deeply($out[$i], [], "bench/e2e_check: a live $items[$i][2] "
                  . "($what) passes") or diag(explain($out[$i]));
    }
    for my $i (0 .. $#bad) {
        my $p = $out[@items + $i] // [];
        ok(@$p == 1 && index($p->[0], $bad[$i][1]) >= 0,
           "bench/e2e_check: a broken copy is caught ($bad[$i][1])")
            or diag(explain($p));
    }
}

# every request ended and left nothing behind
ok(MsvTest::wait_for(sub { ($t->health->{workers}[0]{slots_in_use} // 1) == 0 },
                     5), 'all slots free');
unlike($t->error_log, qr/\[(alert|crit|emerg)\]/, 'no alerts in the error log');

done_testing;
