#!/usr/bin/perl
# Clients that go away at every point of a request: 300 requests, at most
# 32 at a time, each dropped at a point picked at random (halfway through
# the headers, halfway through the body, right after the request, after
# the response headers, after the first event, after a random number of
# events, while a non-streaming answer is pending).  A request may be
# refused with 503 (overloaded) while the slots of the clients just gone
# are still being freed; that answer ends it too, and no other refusal is
# accepted.  Afterwards every slot is free, the KV cache is whole again,
# no nginx process crashed, and the stack still answers correctly.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);
use MsvTest;

my $N = 300;
my $CONC = 32;

my $t = MsvTest->new;
my $w = $t->start_worker(slots => 64, max_model_len => 4096, threads => 1);
$t->start_nginx(processes => 2);
my $json = MsvTest::json();
my $true = JSON::PP::true;
my $V = $t->health->{workers}[0]{vocab_size};

sub stats {
    my $s = `$MsvTest::BUILD/maskserve-cli --shm $w->{name} --stats 2>/dev/null`;
    return eval { $json->decode($s) };
}

my $kv0 = stats()->{kv}{free};
ok($kv0 > 0, "KV cache: $kv0 tokens free at the start");

my @points = qw(headers body request response first events pending);
my %seen;
srand(60);

sub request_bytes {
    my ($i, $stream) = @_;
    my $body = $json->encode({
        request_id => "dc-$i", token_ids => [1 + $i % 50, 2, 3],
        stream => $stream ? $true : JSON::PP::false,
        return_sampling_mask => $true,
        sampling_params => { max_tokens => 3000, ignore_eos => $true,
                             top_k => 16, seed => $i } });
    my $head = "POST /inference/v1/generate HTTP/1.1\r\nHost: localhost\r\n"
             . "Content-Type: application/json\r\nContent-Length: "
             . length($body) . "\r\n\r\n";
    return ($head, $body);
}

# one client: [socket, point, events wanted, bytes read, started]
my (@live, $next, $done);
$next = 0;
$done = 0;
my $sel = IO::Select->new;
my $t0 = time;

sub start_one {
    my $i = $next++;
    my $point = $points[int rand @points];
    $seen{$point}++;
    my ($head, $body) = request_bytes($i, $point ne 'pending');
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$t->{port}",
                                  Timeout => 10) or die "connect: $!";
    $s->autoflush(1);
    if ($point eq 'headers') {
        print $s substr($head, 0, int(length($head) / 2));
        sleep 0.01;
        close $s;
        $done++;
        return;
    }
    if ($point eq 'body') {
        print $s $head, substr($body, 0, int(length($body) / 2));
        sleep 0.01;
        close $s;
        $done++;
        return;
    }
    print $s $head, $body;
    if ($point eq 'request') {
        close $s;
        $done++;
        return;
    }
    my $c = { s => $s, point => $point, buf => '', t => time,
              want => 1 + int rand 20 };
    push @live, $c;
    $sel->add($s);
}

my $stuck = 0;
my %answers;                    # status and error type of refusals
while ($done < $N) {
    start_one() while $next < $N && @live < $CONC;
    for my $s ($sel->can_read(0.05)) {
        my ($c) = grep { $_->{s} == $s } @live;
        my $n = sysread($s, $c->{buf}, 65536, length $c->{buf});
        $c->{eof} = 1 if !$n;
    }
    for my $c (@live) {
        my $b = $c->{buf};
        my $events = () = $b =~ /data: \{/g;
        my $hdr = $b =~ /\r\n\r\n/;
        # a whole answer other than 200 (a 503 while the slots of the
        # clients just dropped are being freed) ends the request too
        my ($st) = $hdr ? $b =~ m{\AHTTP/1\.1 (\d+)} : ();
        my ($len) = $st && $st != 200
                    ? $b =~ /\r\nContent-Length: (\d+)\r\n/i : ();
        my $refused = defined $len
            && length($b) >= index($b, "\r\n\r\n") + 4 + $len;
        if ($refused) {
            my ($type) = $b =~ /"type":"([^"]*)"/;
            $answers{"$st " . ($type // '?')}++;
        }
        my $drop = $c->{eof} || $refused
            || ($c->{point} eq 'response' && $hdr)
            || ($c->{point} eq 'first' && $events >= 1)
            || ($c->{point} eq 'events' && $events >= $c->{want})
            || ($c->{point} eq 'pending' && time - $c->{t} > 0.05 + rand 0.3);
        if (!$drop && time - $c->{t} > 30) {
            $stuck++;
            $drop = 1;
        }
        next unless $drop;
        $c->{gone} = 1;
        $sel->remove($c->{s});
        close $c->{s};
        $done++;
    }
    @live = grep { !$_->{gone} } @live;
}

is($stuck, 0, 'no request waited 30 s for its drop point');
diag(join ', ', map { "$_: $answers{$_}" } sort keys %answers)
    if %answers && $ENV{TEST_VERBOSE};
is_deeply([grep { $_ ne '503 overloaded' } keys %answers], [],
          'every request refused was refused as overloaded (503)');
cmp_ok($answers{'503 overloaded'} // 0, '<', $N / 4,
       'and most requests were taken (a quarter refused at most)');
diag(join ', ', map { "$_ $seen{$_}" } sort keys %seen) if $ENV{TEST_VERBOSE};
is(scalar(grep { $seen{$_} } @points), scalar @points,
   "$N clients dropped at every one of the " . @points . ' points');
cmp_ok(time - $t0, '<', 120, 'within two minutes');

ok(MsvTest::wait_for(sub {
    my $h = $t->health or return 0;
    $h->{workers}[0]{slots_in_use} == 0 && $h->{workers}[0]{waiting} == 0;
}, 15), 'every slot is free again');

my $s = stats();
is($s->{slots}{free}, 64, 'the region agrees: 64 slots free');
ok(MsvTest::wait_for(sub { stats()->{kv}{free} == $kv0 }, 5),
   "every KV page is free again ($kv0 tokens)");
is($s->{readers}, 2, 'both nginx worker processes still attached');

my $el = $t->error_log;
unlike($el, qr/exited on signal|\[(alert|emerg)\]/,
       'no nginx process crashed or raised an alert');
like($el, qr/request "dc-\d+" cancelled after \d+ tokens \(client gone\)/,
     'cancels are logged');

# the stack still works
my $req = { token_ids => [1, 2, 3], return_sampling_mask => $true,
            sampling_logprobs_mode => 'support',
            sampling_params => { max_tokens => 8, top_k => 10, seed => 3 } };
my $r = $t->generate($req);
is($r->{status}, 200, 'a request afterwards: 200');
is_deeply([MsvTest::choice_problems($req, $r->{json}{choices}[0], $V)], [],
          'and its answer is valid');

done_testing;
