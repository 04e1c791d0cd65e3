#!/usr/bin/perl
# Errors nginx answers itself, before the module runs (malformed HTTP,
# sizes above its buffers, unknown methods, versions and paths), come back
# in the API's JSON error shape through the shipped error pages
# (docs/nginx-errors.conf, which docs/nginx.conf and make run include);
# and the shipped configurations agree with each other.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use IO::Socket::INET;
use JSON::PP;
use Test::More;
use MsvTest;

my $t = MsvTest->new;
$t->start_worker(slots => 4, max_model_len => 256);
$t->start_nginx;

# Send raw bytes, read until the server closes; status, headers, body.
sub raw {
    my ($bytes) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$t->{port}", Timeout => 10)
        or die "connect: $!";
    print $s $bytes;
    shutdown($s, 1) if $bytes !~ /\r\n\r\n/;   # an unfinished head: end it here
    local $/;
    my $resp = <$s> // '';
    close $s;
    my ($head, $body) = split /\r\n\r\n/, $resp, 2;
    my ($status) = ($head // '') =~ m{^HTTP/1\.[01] (\d{3})};
    my ($ct) = ($head // '') =~ /^Content-Type:\s*(\S+)/mi;
    return { status => $status // 0, type => $ct // '', body => $body // '',
             raw => $resp };
}

my $post = "POST /inference/v1/generate HTTP/1.1\r\nHost: x\r\n"
         . "Content-Type: application/json\r\nConnection: close\r\n";
my $body = '{"token_ids":[1,2],"sampling_params":{"max_tokens":1}}';
my $big = 'x' x 20000;

# [ what, request bytes, status, error type ]
my @cases = (
    ['a Content-Length that is not a number',
     $post . "Content-Length: abc\r\n\r\n$body", 400, 'invalid_request_error'],
    ['a negative Content-Length',
     $post . "Content-Length: -5\r\n\r\n$body", 400, 'invalid_request_error'],
    ['two Content-Length headers',
     $post . "Content-Length: 5\r\nContent-Length: 6\r\n\r\n$body", 400,
     'invalid_request_error'],
    ['a chunk size that is not hex',
     $post . "Transfer-Encoding: chunked\r\n\r\nzz\r\n$body\r\n0\r\n\r\n", 400,
     'invalid_request_error'],
    ['a chunk without its CRLF',
     $post . "Transfer-Encoding: chunked\r\n\r\n5\r\nabcdefgh\r\n0\r\n\r\n", 400,
     'invalid_request_error'],
    ['HTTP/1.1 without Host',
     "GET /health HTTP/1.1\r\nConnection: close\r\n\r\n", 400, 'invalid_request_error'],
    ['a malformed request line',
     "GET /health HTTP/1.1 junk\r\nHost: x\r\nConnection: close\r\n\r\n", 400,
     'invalid_request_error'],
    ['a header line without a colon',
     "GET /health HTTP/1.1\r\nHost: x\r\nno colon here\r\nConnection: close\r\n\r\n",
     400, 'invalid_request_error'],
    ['headers above large_client_header_buffers',
     "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: $big\r\nConnection: close\r\n\r\n",
     400, 'invalid_request_error'],
    ['a URI above large_client_header_buffers',
     "GET /health?$big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 414,
     'invalid_request_error'],
    ['HTTP/2.0 as text',
     "GET /health HTTP/2.0\r\nHost: x\r\nConnection: close\r\n\r\n", 505,
     'invalid_request_error'],
    ['HTTP/3.1',
     "GET /health HTTP/3.1\r\nHost: x\r\nConnection: close\r\n\r\n", 505,
     'invalid_request_error'],
    ['TRACE',
     "TRACE /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 405,
     'invalid_request_error'],
    ['an unknown path',
     "GET /inference/v1/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404,
     'invalid_request_error'],
    ['the root path',
     "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404,
     'invalid_request_error'],
    ['a Transfer-Encoding nginx does not implement',
     $post . "Transfer-Encoding: gzip\r\n\r\n$body", 501, 'invalid_request_error'],
    ['a body above client_max_body_size',
     $post . "Content-Length: 2000000\r\n\r\n", 413, 'invalid_request_error'],
);

for my $c (@cases) {
    my ($what, $req, $status, $type) = @$c;
    my $r = raw($req);
    my $j = eval { decode_json($r->{body}) };
    my $e = $j && ref $j eq 'HASH' && $j->{error};
    my $ok = $r->{status} == $status && $r->{type} =~ m{^application/json}
        && $e && $e->{type} eq $type && $e->{code} == $status
        && !defined $e->{param} && length($e->{message}) > 5
        && $e->{message} !~ /\n/;
    ok($ok, "$status in JSON: $what")
        or diag(substr($r->{raw}, 0, 600));
}

# what still works: the module's own errors are unchanged, and so is a
# good request on the same server
{
    my $r = raw($post . "Content-Length: " . length($body) . "\r\n\r\n$body");
    my $j = eval { decode_json($r->{body}) };
    ok($r->{status} == 200 && $j && @{ $j->{choices}[0]{token_ids} } == 1,
       'a valid request is served') or diag($r->{raw});

    $r = raw("GET /inference/v1/requests/nope-$$ HTTP/1.1\r\nHost: x\r\n"
             . "Connection: close\r\n\r\n");
    $j = eval { decode_json($r->{body}) };
    ok($r->{status} == 404 && $j && ($j->{error}{param} // '') eq 'request_id',
       "the module's own 404 (unknown request id) keeps its param")
        or diag($r->{raw});

    $r = raw("GET /inference/v1/generate HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    ok($r->{status} == 405 && $r->{raw} =~ /^Allow: POST/mi,
       "the module's own 405 keeps Allow: POST") or diag($r->{raw});
}

# the shipped configurations: both include the error pages in every
# server block, and make run takes the body limit docs/nginx.conf states
{
    my $slurp = sub { open my $fh, '<', $_[0] or die "$_[0]: $!"; local $/; <$fh> };
    my $doc = $slurp->("$MsvTest::ROOT/docs/nginx.conf");
    my $run = $slurp->("$MsvTest::ROOT/tools/run.sh");
    my @servers = $doc =~ /^\s*server\s*\{/mg;
    my @incl = $doc =~ m{^\s*include\s+\S*/docs/nginx-errors\.conf;}mg;
    ok(@servers >= 1 && @incl == @servers,
       'docs/nginx.conf includes the error pages in each of its '
       . scalar(@servers) . ' server blocks');
    my @rservers = $run =~ /^\s*server\s*\{/mg;
    my @rincl = $run =~ m{^\s*include\s+\S*/docs/nginx-errors\.conf;}mg;
    ok(@rservers >= 1 && @rincl == @rservers, 'make run includes them too');
    my ($dl) = $doc =~ /^\s*client_max_body_size\s+(\S+);/m;
    my ($rl) = $run =~ /^\s*client_max_body_size\s+(\S+);/m;
    ok(defined $dl && defined $rl && $dl eq $rl,
       "make run's client_max_body_size (" . ($rl // 'none')
       . ") is docs/nginx.conf's (" . ($dl // 'none') . ')');
}

done_testing();
