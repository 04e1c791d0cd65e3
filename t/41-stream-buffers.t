#!/usr/bin/perl
# Stream events and the buffers they are written in, end to end (real
# nginx + worker on the CPU backend).  A stream's section goes on in the
# rest of its buffer from one event to the next (ngx_http_maskserve_output.c):
# in the same buffer once the event is sent, through a second buffer over
# the same block while the event is still in flight.  Both happen here: a
# client that keeps up (every event sent at once), and one that reads a
# little at a time through small socket buffers (events held back while
# the next rows are written past them, and sent as several rows each).
#
# Every stream gives exactly the non-streaming answer with the same seed,
# each row once and in order, whatever the rows' width against the
# blocks: JSON (4 KB blocks) and packed (16 KB), support rows of 20 ids
# (many events to a block, and blocks left with less than a small buffer)
# and rows wider than a block, selected rows, logprobs content, and
# sampling_params.n = 3 with one choice ending long before the others.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use IO::Select;
use JSON::PP;
use List::Util qw(max);
use Socket qw(:all);
use Test::More;
use Time::HiRes qw(time sleep);
use MsvTest;

my $true = JSON::PP::true;
my $json = JSON::PP->new->canonical;

my $t = MsvTest->new;
$t->start_worker(slots => 16, max_model_len => 4096, threads => 1);

# a server whose connections have a small send buffer: a client that
# reads slowly holds events back from the first ones on
my $slow_port = MsvTest::free_port();
$t->start_nginx(http => <<"EOF");
    server {
        listen 127.0.0.1:$slow_port sndbuf=4k;

        location = /inference/v1/generate {
            maskserve_generate;
        }
    }
EOF
my $V = $t->health->{workers}[0]{vocab_size};

# A stream read $chunk bytes at a time with a pause after each, through a
# 4 KB receive buffer.  Returns { status, events => [decoded...], done,
# problems => [framing problems] }.
sub slow_stream {
    my ($req, $chunk) = @_;
    socket(my $s, PF_INET, SOCK_STREAM, 0) or die "socket: $!";
    setsockopt($s, SOL_SOCKET, SO_RCVBUF, pack('i', 4096)) or die "rcvbuf: $!";
    connect($s, pack_sockaddr_in($slow_port, inet_aton('127.0.0.1')))
        or die "connect: $!";
    my $body = $json->encode({ %$req, stream => $true });
    syswrite($s, "POST /inference/v1/generate HTTP/1.1\r\nHost: x\r\n"
                 . "Content-Type: application/json\r\nContent-Length: "
                 . length($body) . "\r\nConnection: close\r\n\r\n$body");

    my $raw = '';
    my $sel = IO::Select->new($s);
    my $end = time + 120;
    while (time < $end) {
        last unless $sel->can_read(10);
        my $n = sysread($s, $raw, $chunk, length $raw);
        last unless $n;
        sleep 0.002;
    }
    close $s;

    my %r = (events => [], done => 0, problems => []);
    my ($head, $rest) = split /\r\n\r\n/, $raw, 2;
    ($r{status}) = ($head // '') =~ m{^HTTP/1\.1 (\d+)};
    push @{ $r{problems} }, 'not chunked'
        unless ($head // '') =~ /^Transfer-Encoding: chunked\r?$/mi;

    my $text = '';
    $rest //= '';
    while (1) {
        if ($rest !~ s/^([0-9a-fA-F]+)\r\n//) {
            push @{ $r{problems} }, 'bad chunk framing';
            last;
        }
        my $n = hex $1;
        if ($n == 0) {
            push @{ $r{problems} }, 'bytes after the last chunk'
                unless $rest eq "\r\n";
            last;
        }
        $text .= substr($rest, 0, $n, '');
        push @{ $r{problems} }, 'bad chunk end' unless $rest =~ s/^\r\n//;
    }

    push @{ $r{problems} }, 'the text does not end an event'
        unless $text =~ /\n\n\z/;
    for my $e (split /\n\n/, $text) {
        if ($e !~ /^data: (.*)\z/s) {
            push @{ $r{problems} }, "not an event: " . substr($e, 0, 60);
            next;
        }
        my $d = $1;
        if ($d eq '[DONE]') {
            $r{done}++;
            next;
        }
        push @{ $r{problems} }, 'an event after [DONE]' if $r{done};
        my $j = eval { decode_json($d) };
        if (!$j) {
            push @{ $r{problems} }, "not JSON: " . substr($d, 0, 60);
            next;
        }
        push @{ $r{events} }, $j;
    }
    return \%r;
}

my @prompt = (5, 17, 42, 99, 123, 7, 1000);

sub request {
    my (%o) = @_;
    return { token_ids => [@prompt], return_sampling_mask => $true,
             sampling_logprobs_mode => $o{mode} // 'support',
             mask_format => $o{format} // 'json',
             sampling_params => { temperature => 1.0, seed => 777,
                                  ignore_eos => $true, %{ $o{sp} } } };
}

# the id choice 0 samples 4th with seed 777: a stop id that ends it early
my $probe = $t->generate(request(sp => { top_k => 20, max_tokens => 4 }));
is($probe->{status}, 200, 'probe answered');
my $stop = $probe->{json}{choices}[0]{token_ids}[3];

my @cases = (
    ['json, 20-id rows', 1024,
     request(sp => { top_k => 20, max_tokens => 300, logprobs => 2 })],
    ['json, 20-id rows, n=3, choice 0 stops early', 1024,
     request(sp => { top_k => 20, max_tokens => 200, logprobs => 2, n => 3,
                     stop_token_ids => [$stop] })],
    ['json, 700-id rows (wider than a block)', 4096,
     request(sp => { top_k => 700, max_tokens => 40 })],
    ['json, selected rows', 1024,
     request(mode => 'selected', sp => { top_k => 50, max_tokens => 300,
                                         logprobs => 5 })],
    ['packed, 20-id rows', 1024,
     request(format => 'packed', sp => { top_k => 20, max_tokens => 300,
                                         logprobs => 2 })],
    ['packed, 20-id rows, n=3, choice 0 stops early', 1024,
     request(format => 'packed',
             sp => { top_k => 20, max_tokens => 200, logprobs => 2, n => 3,
                     stop_token_ids => [$stop] })],
    ['packed, 3000-id rows (a block for two)', 4096,
     request(format => 'packed', sp => { top_k => 3000, max_tokens => 40 })],
);

for my $c (@cases) {
    my ($tag, $chunk, $req) = @$c;
    my $mode = $req->{sampling_logprobs_mode};
    my $n = $req->{sampling_params}{n} // 1;

    my $r = $t->generate($req);
    is($r->{status}, 200, "$tag: non-streaming answer") or next;
    my @body = @{ $r->{json}{choices} };
    is(scalar @body, $n, "$tag: $n choice(s)");
    if ($req->{mask_format} eq 'json') {
        # (bench/e2e_check reads JSON logprobs content only)
        my @p = MsvTest::choices_problems($V, map { [$req, $_] } @body);
        is_deeply(\@p, [map { [] } @body], "$tag: the answer is valid");
    }
    my %want = map { ($_->{index} => MsvTest::plain_choice($_, $mode)) } @body;
    # with n > 1 each event's choice says its seed
    $want{$_}{seed} = $n > 1 ? $body[$_]{seed} : undef for 0 .. $n - 1;
    if ($n > 1) {
        is($body[0]{finish_reason}, 'stop', "$tag: choice 0 stopped");
        cmp_ok(scalar @{ $body[0]{token_ids} }, '<',
               scalar @{ $body[1]{token_ids} }, "$tag: ... before the others");
    }

    my $fast = $t->stream($req);
    is($fast->{status}, 200, "$tag: fast client: 200");
    ok($fast->{done} && !$fast->{bad}, "$tag: fast client: events, then [DONE]");
    my $fm = MsvTest::merge_choice_events($fast->{events}, $mode);
    ok($fm, "$tag: fast client: no error event") or next;
    is_deeply($fm->{problems}, [], "$tag: fast client: nothing after a choice's end");
    is_deeply($fm->{choices}, \%want, "$tag: fast client: the non-streaming answer");
    is_deeply($fm->{usage}, $r->{json}{usage}, "$tag: fast client: usage");

    my $t0 = time;
    my $slow = slow_stream($req, $chunk);
    my $dt = time - $t0;
    is($slow->{status}, 200, "$tag: slow client: 200");
    is_deeply($slow->{problems}, [], "$tag: slow client: chunks and events well formed");
    is($slow->{done}, 1, "$tag: slow client: one [DONE], last");
    my $sm = MsvTest::merge_choice_events($slow->{events}, $mode);
    ok($sm, "$tag: slow client: no error event") or next;
    is_deeply($sm->{problems}, [], "$tag: slow client: nothing after a choice's end");
    is_deeply($sm->{choices}, \%want, "$tag: slow client: the non-streaming answer");
    is_deeply($sm->{usage}, $r->{json}{usage}, "$tag: slow client: usage");

    # held back behind the slow client, rows went out several to an event
    my $most = max(map { my $e = $_; map { scalar @{ $_->{token_ids} } }
                                          @{ $e->{choices} } } @{ $slow->{events} });
    cmp_ok($most, '>', 1, sprintf("$tag: slow client: up to %d rows an event "
                                  . "(%d events, %.1f s)", $most,
                                  scalar @{ $slow->{events} }, $dt));
}

unlike($t->error_log, qr/\[(alert|emerg|crit)\]/, 'no alerts in the error log');

done_testing();
