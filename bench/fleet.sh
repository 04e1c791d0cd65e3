#!/bin/sh
# fleet.sh: what the front hop costs.  Starts redis-server, two GPU hosts
# (each a CPU worker, dummy `tiny` weights, and an nginx with the module
# registering itself with maskserve_fleet_address) and a front nginx
# routing through the maskserve_fleet upstream, all on loopback; then, at
# CONC concurrent streams in total, alternately:
#
#   direct: two bench/e2e_load clients at once, CONC/2 streams each,
#           straight to host A and to host B;
#   front:  one bench/e2e_load client, CONC streams, to the front, which
#           spreads them over the two hosts.
#
# Same total load on the same two hosts, so the difference is the front
# (its proxying, its choice of host and its balance).  Reports requests/s,
# time to first event (TTFE) p50/p99 and the front's CPU per MB of
# streamed masks; medians over REPEATS pairs of runs; every response is
# validated by e2e_load.  Appends command, date, machine and numbers to
# bench/results/fleet.md.
#
#   bench/fleet.sh
#
# Environment: B (build), CONC (64), REQUESTS per run (8 x CONC), REPEATS
# (3), MAX_TOKENS (32), TOP_K (50), THREADS per worker (1),
# FRONT_WORKERS (1), RESULTS (bench/results/fleet.md; "-": stdout).
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

B=${B:-build}
CONC=${CONC:-64}
REQUESTS=${REQUESTS:-$((8 * CONC))}
REPEATS=${REPEATS:-3}
MAX_TOKENS=${MAX_TOKENS:-32}
TOP_K=${TOP_K:-50}
THREADS=${THREADS:-1}
FRONT_WORKERS=${FRONT_WORKERS:-1}
RESULTS=${RESULTS:-bench/results/fleet.md}
NGINX=${NGINX:-/usr/sbin/nginx}
REDIS=${REDIS:-redis-server}

die() {
    echo "fleet: $*" >&2
    exit 1
}

command -v "$NGINX" > /dev/null || die "nginx not found"
command -v "$REDIS" > /dev/null || die "redis-server not found"

make -j2 B="$B" "$B/maskserve-worker" "$B/bench/e2e_load" > /dev/null \
    || die "make failed"
make B="$B" module > /dev/null || die "make module failed"

case "$B" in
/*) so="$B/nginx/src/objs/ngx_http_maskserve_module.so" ;;
*)  so="$root/$B/nginx/src/objs/ngx_http_maskserve_module.so" ;;
esac
[ -f "$so" ] || die "$so was not built"

run=$(mktemp -d "${TMPDIR:-/tmp}/msv-fleet.XXXXXX")
pids=""

free_port() {
    perl -MIO::Socket::INET -e '
        my $s = IO::Socket::INET->new(Listen => 1, LocalAddr => "127.0.0.1",
                                      LocalPort => 0, ReuseAddr => 1)
            or die "no free port: $!\n";
        print $s->sockport, "\n";'
}

cleanup() {
    trap - EXIT INT TERM
    for p in $pids; do
        kill -TERM "$p" 2> /dev/null || true
    done
    for p in $pids; do
        wait "$p" 2> /dev/null || true
    done
    rm -f /dev/shm/msv-fleet-$$-*
    if [ "${keep:-0}" = 1 ]; then
        echo "fleet: logs kept in $run" >&2
    else
        rm -rf "$run"
    fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() {
    keep=1
    echo "fleet: $*" >&2
    tail -n 5 "$run"/*.log "$run"/*/error.log >&2 2> /dev/null || true
    exit 1
}

wait_for() {
    # $1: what, $2: command
    i=0
    until eval "$2" > /dev/null 2>&1; do
        i=$((i + 1))
        [ $i -lt 300 ] || fail "$1 did not come up in 30 s"
        sleep 0.1
    done
}

user=""
[ "$(id -u)" = 0 ] && user="user root;"

nginx_conf() {
    # $1: dir, $2: nginx worker processes, $3: http block body
    cat > "$1/nginx.conf" <<EOF
load_module $so;
$user
worker_processes $2;
error_log $1/error.log notice;
pid $1/nginx.pid;
events {
    worker_connections 4096;
}
http {
    access_log off;
    client_body_temp_path $1/body;
    proxy_temp_path $1/proxy;
    fastcgi_temp_path $1/fastcgi;
    uwsgi_temp_path $1/uwsgi;
    scgi_temp_path $1/scgi;
    maskserve_redis 127.0.0.1:$redis_port;
    maskserve_redis_prefix fleetbench;
$3
}
EOF
    "$NGINX" -p "$1/" -c "$1/nginx.conf" -g 'daemon off;' \
        > "$1/nginx.out" 2>&1 &
    pids="$pids $!"
    last_nginx=$!
}

redis_port=$(free_port)
"$REDIS" --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no \
    --daemonize no --dir "$run" > "$run/redis.log" 2>&1 &
pids="$pids $!"

for h in a b; do
    mkdir -p "$run/$h"
    shm="msv-fleet-$$-$h"
    "$B/maskserve-worker" --dummy tiny --backend cpu --shm "$shm" \
        --max-num-seqs "$CONC" --max-model-len 512 --threads "$THREADS" \
        --seed 1 2> "$run/worker-$h.log" &
    pids="$pids $!"
    wait_for "worker $h" "grep -q 'ready: region' '$run/worker-$h.log'"

    port=$(free_port)
    eval "port_$h=$port"
    nginx_conf "$run/$h" 1 "
    maskserve_worker $shm;
    maskserve_hostname host-$h;
    maskserve_fleet_address 127.0.0.1:$port;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$port;
        location = /inference/v1/generate { maskserve_generate; }
        location = /health { maskserve_health; }
    }"
    wait_for "host $h" "curl -fsS http://127.0.0.1:$port/health"
done

front_port=$(free_port)
mkdir -p "$run/front"
nginx_conf "$run/front" "$FRONT_WORKERS" "
    upstream gpu_hosts {
        maskserve_fleet;
        keepalive 256;
    }
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$front_port;
        proxy_http_version 1.1;
        proxy_set_header Connection \"\";
        proxy_buffering off;
        location = /inference/v1/generate { proxy_pass http://gpu_hosts; }
        location = /health { maskserve_fleet_health; }
    }"
front_pid=$last_nginx
wait_for "the front" \
    "curl -fsS http://127.0.0.1:$front_port/health | grep -q '\"hosts_up\":2'"
front_workers=$(pgrep -P "$front_pid" | tr '\n' ',' | sed 's/,$//')

common="--modes selected --top-k $TOP_K --max-tokens $MAX_TOKENS --repeats 1"

# the table row of one e2e_load output: rps ttfe50 ttfe99 mbps kb/resp
# [watched CPU ms/resp]
row() {
    awk -F'|' '/^\| selected / { gsub(/ /, ""); print $3, $5, $6, $9, $10, $13 }' "$1"
}

status=0
: > "$run/samples"
r=1
while [ $r -le "$REPEATS" ]; do
    half=$((CONC / 2))
    "$B/bench/e2e_load" --port "$port_a" -c $half -n $((REQUESTS / 2)) \
        $common > "$run/direct-a.out" 2> "$run/direct-a.err" &
    ca=$!
    "$B/bench/e2e_load" --port "$port_b" -c $half -n $((REQUESTS / 2)) \
        $common > "$run/direct-b.out" 2> "$run/direct-b.err" &
    cb=$!
    wait $ca || status=1
    wait $cb || status=1

    "$B/bench/e2e_load" --port "$front_port" -c "$CONC" -n "$REQUESTS" \
        $common --cpu "front=$front_workers" \
        > "$run/front.out" 2> "$run/front.err" || status=1

    echo "$r direct $(row "$run/direct-a.out") / $(row "$run/direct-b.out")" \
        >> "$run/samples"
    echo "$r front $(row "$run/front.out")" >> "$run/samples"
    [ $status = 0 ] || fail "invalid responses (see $run/*.err)"
    r=$((r + 1))
done

hosts=$(curl -fsS "http://127.0.0.1:$front_port/health")

table=$(CONC=$CONC perl -e '
    my (@d, @f);
    while (<STDIN>) {
        my @x = split;
        if ($x[1] eq "direct") {
            # two clients: rates add up; p50 their mean, p99 the larger
            my @a = @x[2 .. 6]; my @b = @x[9 .. 13];
            push @d, [$a[0] + $b[0], ($a[1] + $b[1]) / 2,
                      $a[2] > $b[2] ? $a[2] : $b[2], $a[3] + $b[3]];
        } else {
            my @a = @x[2 .. 7];
            push @f, [$a[0], $a[1], $a[2], $a[3], $a[5] / ($a[4] / 1024)];
        }
    }
    sub med { my @v = sort { $a <=> $b } @_; $v[$#v / 2] }
    my @dm = map { my $i = $_; med(map { $_->[$i] } @d) } 0 .. 3;
    my @fm = map { my $i = $_; med(map { $_->[$i] } @f) } 0 .. 4;
    my $ratio = med(map { $f[$_][0] / $d[$_][0] } 0 .. $#f);
    printf "| path | req/s | TTFE p50 ms | TTFE p99 ms | MB/s | front CPU ms/MB |\n";
    printf "|---|---|---|---|---|---|\n";
    printf "| direct (2 x %d streams) | %.1f | %.1f | %.1f | %.2f | - |\n",
           $ENV{CONC} / 2, @dm;
    printf "| front (%d streams) | %.1f | %.1f | %.1f | %.2f | %.1f |\n",
           $ENV{CONC}, @fm;
    printf "| front - direct | x%.2f (median of ratios) | %+.1f | %+.1f | | |\n",
           $ratio, $fm[1] - $dm[1], $fm[2] - $dm[2];
' < "$run/samples")

now=$(date -u '+%Y-%m-%d %H:%M UTC')
cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
rev=$(git rev-parse --short HEAD 2> /dev/null || echo unknown)
[ -z "$(git status --porcelain 2> /dev/null | head -n 1)" ] \
    || rev="$rev with uncommitted changes"

record() {
    echo "## $now"
    echo
    echo "- command: \`bench/fleet.sh\` (CONC=$CONC REQUESTS=$REQUESTS" \
         "REPEATS=$REPEATS MAX_TOKENS=$MAX_TOKENS TOP_K=$TOP_K" \
         "THREADS=$THREADS FRONT_WORKERS=$FRONT_WORKERS), tree $rev"
    echo "- machine: nproc $(nproc), $cpu; load average" \
         "$(cut -d' ' -f1-3 /proc/loadavg) after; the clients, three nginx," \
         "two workers and Redis share these cores"
    echo "- every response validated by e2e_load (mask \`selected\`," \
         "streaming, ignore_eos)"
    echo
    echo "$table"
    echo
    echo "Samples (run, path, req/s, TTFE p50, p99, MB/s, KB/resp[, front CPU ms/resp]):"
    echo
    echo '```text'
    cat "$run/samples"
    echo '```'
    echo
    echo "The front's view after the runs: \`$hosts\`"
    echo
}

if [ "$RESULTS" = "-" ]; then
    record
else
    if [ ! -s "$RESULTS" ]; then
        cat > "$RESULTS" <<'EOF'
# The front hop

`bench/fleet.sh` runs two GPU hosts (CPU workers, dummy `tiny` weights)
and a front (`maskserve_fleet`, docs/FLEET.md) on loopback and compares,
at the same total load on the same hosts, two `bench/e2e_load` clients
talking to the hosts directly (half the streams each) with one client
talking to the front (all the streams).  "front - direct" is what the hop
adds: proxying, the choice of host and how evenly it spreads.  The direct
TTFE p50 is the mean of the two clients' medians, its p99 the larger of
their p99s.  Front CPU ms/MB is the front's nginx CPU time per MB of
response streamed through it.  On the shared 2-core development machine
these are relative numbers only: absolute times belong to the GPU machine.

EOF
    fi
    record >> "$RESULTS"
    echo "fleet: appended to $RESULTS" >&2
fi
echo "$table"
exit $status
