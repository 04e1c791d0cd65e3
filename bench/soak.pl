#!/usr/bin/perl
# soak.pl: a bounded soak of the whole stack (real redis-server, worker
# with dummy `tiny` weights on the CPU backend, stock nginx with the
# module), for docs/reliability.md and, shortened, for CI (t/69-soak.t).
#
#   bench/soak.pl [--seconds N] [--conc N] [--sample SEC] [--threads N]
#
# --conc clients (default 64) send mixed requests back to back until the
# time is up: non-streaming and streaming, mask off / selected / support,
# top-k, top-p, greedy, logprobs, and streams the client drops after the
# first event.  Every request is one of a fixed set of seeded requests
# whose answer was recorded alone before the soak started; an answer must
# pass the sampling-mask checks (MsvTest::choice_problems) and be
# identical to the recorded one, so a lost, duplicated or reordered row
# (or token) is a failure.  The RSS of every process (worker, redis,
# nginx master and workers) is sampled every --sample seconds; memory is
# flat when the last third's peak of each process is within 10% + 4 MiB
# of the first third's.  At the end every slot must be free and the KV
# cache back to its starting size.  Request metadata goes to Redis with a
# 30 s TTL.
#
# Prints a table last; exit status 0 when everything held, 1 otherwise.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../t/lib";
use Getopt::Long;
use IO::Select;
use JSON::PP;
use List::Util qw(max min sum);
use POSIX qw(:sys_wait_h);
use Time::HiRes qw(time sleep);
use MsvTest;

my %o = (seconds => 1800, conc => 64, sample => 10, threads => 1,
         seeds => 6);
GetOptions(\%o, 'seconds=i', 'conc=i', 'sample=i', 'threads=i', 'seeds=i')
    or die "usage: $0 [--seconds N] [--conc N] [--sample SEC] [--threads N]\n";

my $true = JSON::PP::true;
my $false = JSON::PP::false;
my $json = JSON::PP->new->canonical;

my $t = MsvTest->new;
$t->start_redis;
# Twice as many slots as clients: a stream a client drops frees its slot
# a moment later, while that client already sends its next request (with
# as many slots as clients, that request could find none and get 503).
# A short TTL keeps Redis at a steady state of recent requests, so that
# its memory, too, must be flat.
my $w = $t->start_worker(slots => 2 * $o{conc}, max_model_len => 1024,
                         threads => $o{threads});
$t->start_nginx(processes => 2,
                http => "    maskserve_redis_ttl 30s;\n");
my $V = $t->health->{workers}[0]{vocab_size};

# The request mix: [kind, request]; each is sent with several seeds.
my @mix = (
    [generate => { token_ids => [1, 2, 3], return_sampling_mask => $true,
                   sampling_logprobs_mode => 'support',
                   sampling_params => { max_tokens => 16, top_k => 20 } }],
    [stream => { token_ids => [5, 6], return_sampling_mask => $true,
                 sampling_params => { max_tokens => 32, logprobs => 3,
                                      top_p => 0.9 } }],
    [generate => { token_ids => [9], sampling_params => { max_tokens => 8,
                                                          temperature => 0 } }],
    [stream => { token_ids => [7, 8, 9, 10], return_sampling_mask => $true,
                 sampling_logprobs_mode => 'support',
                 sampling_params => { max_tokens => 24, min_p => 0.05,
                                      ignore_eos => $true } }],
    [stream => { token_ids => [4, 4, 4], sampling_params => {
                   max_tokens => 48, repetition_penalty => 1.2,
                   ignore_eos => $true } }],
    [drop => { token_ids => [2, 3], return_sampling_mask => $true,
               sampling_params => { max_tokens => 200, ignore_eos => $true,
                                    top_k => 8 } }],
);

my @cases;
for my $m (@mix) {
    for my $s (1 .. $o{seeds}) {
        my %req = %{ $m->[1] };
        $req{sampling_params} = { %{ $req{sampling_params} }, seed => 1000 + $s };
        push @cases, [$m->[0], \%req];
    }
}

# what a case answers: the choice, for exact comparison
sub answer {
    my ($kind, $req) = @_;
    if ($kind eq 'generate') {
        my $r = $t->generate($req);
        return (undef, "status $r->{status}") unless $r->{status} == 200 && $r->{json};
        return ($r->{json}, undef);
    }
    my $r = $t->stream($req);
    return (undef, "status $r->{status}") unless $r->{status} == 200;
    return (undef, 'no [DONE]') unless $r->{done} == 1;
    return (undef, "$r->{bad} malformed events") if $r->{bad};
    my $m = MsvTest::merge_events($r->{events});
    return (undef, 'an error event') unless $m;
    return ($m, undef);
}

sub canon {
    my ($a) = @_;
    my $c = { %{ $a->{choices}[0] } };
    delete $c->{index};
    return $json->encode([$c, $a->{usage}]);
}

my $kv0 = kv_free();
my %ref;
for my $i (0 .. $#cases) {
    my ($kind, $req) = @{ $cases[$i] };
    next if $kind eq 'drop';
    my ($a, $e) = answer($kind, $req);
    die "soak: reference $i: $e\n" if $e;
    my @p = MsvTest::choice_problems($req, $a->{choices}[0], $V);
    die "soak: reference $i: @p\n" if @p;
    $ref{$i} = canon($a);
}

sub pids {
    my %p = (worker => $w->{pid}, redis => $t->{redis_pid},
             'nginx master' => $t->{nginx_pid});
    my $i = 0;
    $p{'nginx worker ' . $i++} = $_ for $t->nginx_workers;
    return \%p;
}

# [private (anonymous) RSS, shared-memory RSS] in KiB.  The region's
# pages count in every process that touched them, and they are touched
# progressively as the ring wraps: only the private part says "leak".
sub rss_kb {
    my ($pid) = @_;
    my ($anon, $shm);
    open my $fh, '<', "/proc/$pid/status" or return undef;
    while (<$fh>) {
        $anon = $1 if /^RssAnon:\s+(\d+)/;
        $shm = $1 if /^RssShmem:\s+(\d+)/;
    }
    return defined $anon ? [$anon, $shm // 0] : undef;
}

sub kv_free {
    my $s = `$MsvTest::BUILD/maskserve-cli --shm $w->{name} --stats 2>/dev/null`;
    my $j = eval { $json->decode($s) } or return undef;
    return $j->{kv}{free};   # free + cached: all a sequence could take
}

# ---------------------------------------------------------------- clients

my $t0 = time;
my $deadline = $t0 + $o{seconds};
my @kids;
for my $c (0 .. $o{conc} - 1) {
    my $pid = fork() // die "fork: $!";
    if ($pid == 0) {
        srand($c * 7919 + 1);
        my %n = (ok => 0, dropped => 0, bad => 0, tokens => 0);
        my @why;
        while (time < $deadline) {
            my $i = int(rand(@cases));
            my ($kind, $req) = @{ $cases[$i] };
            if ($kind eq 'drop') {
                my $s = eval { $t->raw_post('/inference/v1/generate',
                                            { %$req, stream => $true }) };
                my $buf = '';
                if ($s) {
                    my $sel = IO::Select->new($s);
                    my $end = time + 30;
                    while (time < $end && $buf !~ /data: \{/) {
                        $sel->can_read(0.5) or next;
                        my $r = sysread($s, $buf, 65536, length $buf);
                        last unless $r;
                    }
                    close $s;
                }
                if ($buf =~ /data: \{/) {
                    $n{dropped}++;
                } else {
                    $n{bad}++;
                    push @why, "drop case $i: no first event" if @why < 5;
                }
                next;
            }
            my ($a, $e) = answer($kind, $req);
            my @p = $e ? ($e) : MsvTest::choice_problems($req, $a->{choices}[0], $V);
            push @p, 'differs from the answer recorded alone'
                if !@p && canon($a) ne $ref{$i};
            if (@p) {
                $n{bad}++;
                push @why, "case $i ($kind): @p" if @why < 5;
            } else {
                $n{ok}++;
                $n{tokens} += scalar @{ $a->{choices}[0]{token_ids} };
            }
        }
        open my $fh, '>', "$t->{dir}/soak-$c.json" or POSIX::_exit(1);
        print $fh $json->encode({ %n, why => \@why });
        close $fh;
        POSIX::_exit(0);
    }
    push @kids, $pid;
}

# ---------------------------------------------------------------- sampling

my %rss;    # name -> [[t, kb]...]
my $next = time;
while (grep { waitpid($_, WNOHANG) == 0 } @kids) {
    if (time >= $next) {
        my $p = pids();
        for my $name (keys %$p) {
            my $kb = rss_kb($p->{$name});
            push @{ $rss{$name} }, [time - $t0, $kb] if defined $kb;
        }
        $next += $o{sample};
    }
    sleep 0.2;
}
@kids = grep { waitpid($_, WNOHANG) == 0 } @kids;
waitpid($_, 0) for @kids;

my %tot = (ok => 0, dropped => 0, bad => 0, tokens => 0);
my @why;
for my $c (0 .. $o{conc} - 1) {
    open my $fh, '<', "$t->{dir}/soak-$c.json" or do { $tot{bad}++; push @why, "client $c left no result"; next };
    local $/;
    my $r = $json->decode(<$fh>);
    $tot{$_} += $r->{$_} for qw(ok dropped bad tokens);
    push @why, @{ $r->{why} };
}

# the stack after the soak: every slot free, the KV cache whole
my $idle = MsvTest::wait_for(sub {
    my $h = $t->health;
    $h && $h->{workers}[0]{slots_in_use} == 0 && $h->{workers}[0]{waiting} == 0;
}, 30);
my $kv1 = MsvTest::wait_for(sub { my $k = kv_free(); defined $k && defined $kv0 && $k == $kv0 ? $k : 0 }, 10)
    || kv_free();
my $elapsed = time - $t0;

my $ok = $tot{bad} == 0 && $idle && defined $kv0 && defined $kv1 && $kv1 == $kv0
         && $tot{ok} > 0;

printf "soak: %d s, %d clients, %d answers checked (%d tokens), %d streams "
       . "dropped by the client, %d bad\n", $elapsed, $o{conc}, $tot{ok},
       $tot{tokens}, $tot{dropped}, $tot{bad};
print "  $_\n" for @why[0 .. min($#why, 9)];
printf "after: slots %s, KV tokens free %s of %s\n",
       $idle ? 'all free' : 'NOT all free', $kv1 // '?', $kv0 // '?';

print "\nprivate RSS (RssAnon) in MiB; shared = the region's pages mapped\n";
print "\n| process | samples | first | peak first third | peak last third | last | shared last | flat |\n";
print "|---|---|---|---|---|---|---|---|\n";
for my $name (sort keys %rss) {
    my @s = @{ $rss{$name} };
    next unless @s;
    my $third = $o{seconds} / 3;
    my @a = map { $_->[1][0] } grep { $_->[0] <= $third } @s;
    my @b = map { $_->[1][0] } grep { $_->[0] >= 2 * $third } @s;
    @a = ($s[0][1][0]) unless @a;
    @b = ($s[-1][1][0]) unless @b;
    my $flat = max(@b) <= max(@a) * 1.10 + 4096;
    $ok &&= $flat;
    printf "| %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %s |\n", $name,
           scalar @s, $s[0][1][0] / 1024, max(@a) / 1024, max(@b) / 1024,
           $s[-1][1][0] / 1024, $s[-1][1][1] / 1024, $flat ? 'yes' : 'NO';
}
print "\nsoak: ", ($ok ? 'PASS' : 'FAIL'), "\n";
exit($ok ? 0 : 1);
