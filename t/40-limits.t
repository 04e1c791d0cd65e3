#!/usr/bin/perl
# The limits and policies of a location: a client that stops reading is
# cut off at maskserve_output_limit with an explicit error while other
# requests go on; maskserve_max_support refuses top_k above the cap and
# aborts a request whose realized support is wider; a non-streaming answer
# larger than the output limit is refused (the two limits with masks as
# JSON and packed); "maskserve_stream_flush interval" coalesces steps into
# fewer events.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use IO::Select;
use JSON::PP;
use Socket qw(:all);
use Test::More;
use Time::HiRes qw(time sleep);
use MsvTest;

my $t = MsvTest->new;
$t->start_worker(slots => 16, max_model_len => 4096, threads => 1);
$t->start_nginx(server => <<'EOF');
        location = /small-out/generate {
            maskserve_generate;
            maskserve_output_limit 64k;
        }

        location = /capped/generate {
            maskserve_generate;
            maskserve_max_support 100;
        }

        location = /interval/generate {
            maskserve_generate;
            maskserve_stream_flush interval 250ms;
        }
EOF

my $true = JSON::PP::true;
my $V = $t->health->{workers}[0]{vocab_size};
sub in_use { $t->health->{workers}[0]{slots_in_use} }

sub post_to {
    my ($path, $req) = @_;
    return $t->post($path, $req);
}

# --- a client that does not read (masks as JSON, then packed)
for my $fmt ('json', 'packed') {
    socket(my $s, PF_INET, SOCK_STREAM, 0) or die "socket: $!";
    setsockopt($s, SOL_SOCKET, SO_RCVBUF, pack('i', 4096)) or die "rcvbuf: $!";
    connect($s, pack_sockaddr_in($t->{port}, inet_aton('127.0.0.1')))
        or die "connect: $!";
    my $body = JSON::PP->new->encode({
        request_id => "slow-$fmt", token_ids => [1, 2, 3], stream => $true,
        return_sampling_mask => $true, sampling_logprobs_mode => 'support',
        mask_format => $fmt,
        sampling_params => { max_tokens => 3000, ignore_eos => $true } });
    syswrite($s, "POST /small-out/generate HTTP/1.1\r\nHost: x\r\n"
                 . "Content-Type: application/json\r\nContent-Length: "
                 . length($body) . "\r\nConnection: close\r\n\r\n$body");

    # full-vocabulary support rows are ~60 KB each: the limit is hit soon
    ok(MsvTest::wait_for(sub {
        $t->error_log =~ /request "slow-$fmt" failed after \d+ tokens: the client reads too slowly/
    }, 10), "$fmt: the slow client is cut off at the output limit");
    ok(MsvTest::wait_for(sub { in_use() == 0 }, 5), 'its slot is freed');

    # others are not held up meanwhile
    my $t0 = time;
    my $r = $t->stream({ token_ids => [4, 5], return_sampling_mask => $true,
                         sampling_params => { max_tokens => 50, top_k => 5,
                                              ignore_eos => $true } });
    is($r->{status}, 200, 'another stream is served');
    is(scalar @{ MsvTest::merge_events($r->{events})->{choices}[0]{token_ids} }, 50,
       '... completely');
    cmp_ok(time - $t0, '<', 5, '... without waiting for the slow client');

    # reading now, the slow client finds an explicit error at the end
    my $all = '';
    my $sel = IO::Select->new($s);
    my $end = time + 20;
    while (time < $end) {
        last unless $sel->can_read(1);
        my $n = sysread($s, $all, 1 << 20, length $all);
        last unless $n;
    }
    like($all, qr/data: \{"error":\{"message":"the client reads too slowly[^"]*","type":"overloaded"/,
         'the stream ends with an error event');
    like($all, qr/data: \[DONE\]\n\n\r\n0\r\n\r\n\z/, 'then [DONE] and the last chunk');
    close $s;
}

# --- a non-streaming answer above the output limit
for my $fmt ('json', 'packed') {
    my $r = post_to('/small-out/generate', {
        token_ids => [1, 2, 3], return_sampling_mask => $true,
        sampling_logprobs_mode => 'support', mask_format => $fmt,
        sampling_params => { max_tokens => 100, ignore_eos => $true } });
    is($r->{status}, 400, "$fmt: non-stream answer above the output limit: 400");
    is($r->{json}{error}{param}, 'sampling_params.max_tokens', '... naming max_tokens');
    like($r->{json}{error}{message}, qr/maskserve_output_limit/, '... and the limit');
}

# --- maskserve_max_support
{
    my %base = (token_ids => [1, 2, 3], return_sampling_mask => $true);
    my $r = post_to('/capped/generate', { %base, sampling_params => { top_k => 101 } });
    is($r->{status}, 400, 'top_k above maskserve_max_support: 400');
    is($r->{json}{error}{param}, 'sampling_params.top_k', '... naming top_k');

    $r = post_to('/capped/generate', { %base, sampling_params => {
        top_k => 100, max_tokens => 8, ignore_eos => $true } });
    is($r->{status}, 200, 'top_k at the cap: 200');
    ok(!grep({ @$_ > 100 } @{ $r->{json}{choices}[0]{sampling_mask} }),
       'rows within the cap');

    $r = post_to('/capped/generate', { token_ids => [1, 2, 3], sampling_params => {
        top_k => 1000, max_tokens => 4 } });
    is($r->{status}, 200, 'no cap without return_sampling_mask');

    # no top_k: the realized support is the whole vocabulary
    $r = post_to('/capped/generate', { %base, sampling_params => {
        max_tokens => 8, ignore_eos => $true } });
    is($r->{status}, 400, 'a realized row wider than the cap: 400');
    is($r->{json}{error}{param}, 'return_sampling_mask', '... naming the mask');
    like($r->{json}{error}{message}, qr/maskserve_max_support 100/, '... and the cap');

    my $s = $t->stream({ %base, sampling_params => { max_tokens => 8,
                                                      ignore_eos => $true } });
    # the stream goes through /inference/v1/generate: no cap there
    is($s->{status}, 200, 'the uncapped location is not affected');

    my $res;
    {
        my $raw = '';
        my $hr = $t->{http}->request('POST', $t->url('/capped/generate'), {
            headers => { 'Content-Type' => 'application/json' },
            content => JSON::PP->new->encode({ %base, stream => $true,
                sampling_params => { max_tokens => 8, ignore_eos => $true } }),
            data_callback => sub { $raw .= $_[0] } });
        $res = { status => $hr->{status}, raw => $raw . ($hr->{content} // ''),
                 type => $hr->{headers}{'content-type'} };
    }
    # the first row already breaks the cap: nothing was sent, a JSON 400
    is($res->{status}, 400, 'stream breaking the cap at once: 400');
    like($res->{raw}, qr/"param":"return_sampling_mask"/, '... naming the mask');
    ok(MsvTest::wait_for(sub { in_use() == 0 }, 5), 'no slot left in use');
}

# --- stream flush policy
{
    my $req = { token_ids => [1, 2, 3], return_sampling_mask => $true,
                sampling_params => { max_tokens => 600, top_k => 4,
                                     ignore_eos => $true, seed => 9 } };
    my $t0 = time;
    my $step = $t->stream($req);
    my $dt = time - $t0;
    my $r;
    {
        my @ev;
        my $raw = '';
        $t->{http}->request('POST', $t->url('/interval/generate'), {
            headers => { 'Content-Type' => 'application/json' },
            content => JSON::PP->new->encode({ %$req, stream => $true }),
            data_callback => sub { $raw .= $_[0] } });
        for my $e (split /\n\n/, $raw) {
            next unless $e =~ /^data: (\{.*)/s;
            push @ev, decode_json($1);
        }
        $r = \@ev;
    }
    my $a = MsvTest::merge_events($step->{events});
    my $b = MsvTest::merge_events($r);
    is_deeply($b->{choices}, $a->{choices}, 'interval flush: the same output');
    my $max = 2 + int($dt / 0.25) * 3;
    cmp_ok(scalar @$r, '<=', $max, 'interval flush: few events ('
           . scalar(@$r) . " in ${\ sprintf '%.2f', $dt} s)");
    cmp_ok(scalar @{ $step->{events} }, '>', scalar @$r,
           'every_step sends more events (' . scalar(@{ $step->{events} }) . ')');
}

unlike($t->error_log, qr/\[(alert|emerg|crit)\]/, 'no alerts in the error log');

done_testing();
