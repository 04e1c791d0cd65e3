#!/bin/sh
# e2e_cpu.sh: the end-to-end benchmark on the CPU backend.
#
# Builds the worker, the nginx module and the load client (make), starts
# redis-server, one worker (dummy `tiny` weights, CPU backend) and the
# stock nginx with the module on free loopback ports, runs bench/e2e_load
# at 64 concurrent streams with the mask off, selected and support side by
# side (interleaved, repeated, medians), once with top_k 50 and once with
# no top-k (every support row is the whole vocabulary), stops everything
# and appends the command, date, machine and numbers to
# bench/results/e2e_cpu.md.
#
#   bench/e2e_cpu.sh [e2e_load options]     options go to every client run
#
# Environment:
#   B              build directory (default build)
#   CONC           concurrent streams (64)
#   REQUESTS       requests per run (8 x CONC)
#   REPEATS        runs per mode (5)
#   MAX_TOKENS     max_tokens of every request (32)
#   TOP_KS         top_k settings, one client invocation each ("50 -1")
#   THREADS        CPU backend threads (default: half the cores, at least 1)
#   NGINX_WORKERS  nginx worker processes (1)
#   RESULTS        where to append (bench/results/e2e_cpu.md; "-": stdout)
#   MODULE_SO      the module to load (default: the one `make module` builds
#                  in B), to compare two builds of it with the rest the same
#
# Exit status: 0 when every response was valid, 1 otherwise (the numbers
# are recorded either way, marked as failed).
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

B=${B:-build}
CONC=${CONC:-64}
REQUESTS=${REQUESTS:-$((8 * CONC))}
REPEATS=${REPEATS:-5}
MAX_TOKENS=${MAX_TOKENS:-32}
TOP_KS=${TOP_KS:-50 -1}
NGINX_WORKERS=${NGINX_WORKERS:-1}
RESULTS=${RESULTS:-bench/results/e2e_cpu.md}
NGINX=${NGINX:-/usr/sbin/nginx}
REDIS=${REDIS:-redis-server}

ncpu=$(nproc)
THREADS=${THREADS:-$(( ncpu / 2 > 0 ? ncpu / 2 : 1 ))}

die() {
    echo "e2e_cpu: $*" >&2
    exit 1
}

need() {
    command -v "$1" > /dev/null || die "$1 not found (apt-get install $2)"
}

need "$NGINX" nginx
need "$REDIS" redis-server
need perl perl
need curl curl
need pgrep procps

# ---------------------------------------------------------------- build

make -j2 B="$B" "$B/maskserve-worker" "$B/maskserve-cli" "$B/bench/e2e_load" \
    > /dev/null || die "make failed"
make B="$B" module > /dev/null || die "make module failed"

so="$root/$B/nginx/src/objs/ngx_http_maskserve_module.so"
case "$B" in
/*) so="$B/nginx/src/objs/ngx_http_maskserve_module.so" ;;
esac
so=${MODULE_SO:-$so}
[ -f "$so" ] || die "$so was not built"

# ---------------------------------------------------------------- start

run=$(mktemp -d "${TMPDIR:-/tmp}/msv-e2e.XXXXXX")
shm="msv-e2e-$$"
worker_pid=""
redis_pid=""
nginx_pid=""

free_port() {
    perl -MIO::Socket::INET -e '
        my $s = IO::Socket::INET->new(Listen => 1, LocalAddr => "127.0.0.1",
                                      LocalPort => 0, ReuseAddr => 1)
            or die "no free port: $!\n";
        print $s->sockport, "\n";'
}

stop() {
    # $1: pid, $2: signal; waits up to 10 s, then SIGKILL
    [ -n "$1" ] || return 0
    kill "-$2" "$1" 2> /dev/null || return 0
    i=0
    while kill -0 "$1" 2> /dev/null && [ "$i" -lt 100 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    kill -KILL "$1" 2> /dev/null || true
    wait "$1" 2> /dev/null || true
}

cleanup() {
    trap - EXIT HUP INT PIPE TERM
    stop "$nginx_pid" QUIT
    stop "$worker_pid" TERM
    stop "$redis_pid" TERM
    rm -f "/dev/shm/$shm" "/dev/shm/$shm.sock"
    if [ "${keep_logs:-0}" = 1 ]; then
        echo "e2e_cpu: logs kept in $run" >&2
    else
        rm -rf "$run"
    fi
}
trap cleanup EXIT
# a reader of the output that went away (| grep -m1, | head) ends the run
# too, and the stack with it
trap 'exit 1' HUP INT PIPE TERM

fail() {
    keep_logs=1
    echo "e2e_cpu: $*" >&2
    for f in "$run"/*.log; do
        [ -f "$f" ] || continue
        echo "--- $f" >&2
        tail -n 15 "$f" >&2
    done
    exit 1
}

port=$(free_port)
redis_port=$(free_port)
[ "$port" != "$redis_port" ] || redis_port=$(free_port)

"$REDIS" --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no \
    --daemonize no --dir "$run" > "$run/redis.log" 2>&1 &
redis_pid=$!

"$B/maskserve-worker" --dummy tiny --backend cpu --shm "$shm" \
    --max-num-seqs "$CONC" --max-model-len 512 --threads "$THREADS" \
    --seed 1 2> "$run/worker.log" &
worker_pid=$!

i=0
until grep -q "ready: region" "$run/worker.log" 2> /dev/null; do
    kill -0 "$worker_pid" 2> /dev/null || fail "the worker exited"
    i=$((i + 1))
    [ $i -lt 600 ] || fail "the worker did not become ready in 60 s"
    sleep 0.1
done

user=""
[ "$(id -u)" = 0 ] && user="user root;"

cat > "$run/nginx.conf" <<EOF
load_module $so;
$user
worker_processes $NGINX_WORKERS;
error_log $run/error.log notice;
pid $run/nginx.pid;

events {
    worker_connections 4096;
}

http {
    access_log off;
    client_body_temp_path $run/body;
    proxy_temp_path $run/proxy;
    fastcgi_temp_path $run/fastcgi;
    uwsgi_temp_path $run/uwsgi;
    scgi_temp_path $run/scgi;

    maskserve_worker $shm;
    maskserve_redis 127.0.0.1:$redis_port;

    server {
        listen 127.0.0.1:$port;

        location = /inference/v1/generate {
            maskserve_generate;
        }

        location = /health {
            maskserve_health;
        }

        # e2e_load --metrics /metrics: what nginx formatted, and how fast
        location = /metrics {
            maskserve_metrics;
        }
    }
}
EOF

"$NGINX" -p "$run/" -c "$run/nginx.conf" -t -q 2> "$run/nginx-t.log" \
    || fail "nginx rejected the configuration"
"$NGINX" -p "$run/" -c "$run/nginx.conf" -g 'daemon off;' \
    > "$run/nginx.log" 2>&1 &
nginx_pid=$!

i=0
until curl -fsS "http://127.0.0.1:$port/health" 2> /dev/null \
      | grep -q '"ready":true'
do
    kill -0 "$nginx_pid" 2> /dev/null || fail "nginx exited"
    i=$((i + 1))
    [ $i -lt 300 ] || fail "nginx did not report the worker ready in 30 s"
    sleep 0.1
done

# the nginx worker processes, for the CPU accounting
i=0
nginx_workers=""
while [ "$(echo "$nginx_workers" | wc -w)" -lt "$NGINX_WORKERS" ]; do
    i=$((i + 1))
    [ $i -lt 100 ] || fail "cannot find the nginx worker processes"
    sleep 0.1
    nginx_workers=$(pgrep -P "$nginx_pid" | tr '\n' ',' | sed 's/,$//')
done

# ---------------------------------------------------------------- run

now=$(date -u '+%Y-%m-%d %H:%M UTC')
cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
mem=$(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)
kernel=$(uname -r)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
rev=$(git rev-parse --short HEAD 2> /dev/null || echo unknown)
if [ -n "$(git status --porcelain 2> /dev/null | head -n 1)" ]; then
    rev="$rev with uncommitted changes"
fi
nginx_v=$("$NGINX" -v 2>&1 | sed 's/.*: //')
redis_v=$("$REDIS" --version | sed 's/.* v=\([^ ]*\).*/\1/')

status=0
out="$run/report.md"
: > "$out"

for k in $TOP_KS; do
    args="--port $port -c $CONC -n $REQUESTS --repeats $REPEATS"
    args="$args --max-tokens $MAX_TOKENS --top-k $k"
    args="$args --cpu worker=$worker_pid --cpu nginx=$nginx_workers"
    [ $# -eq 0 ] || args="$args $*"
    echo "e2e_cpu: e2e_load $args" >&2

    # shellcheck disable=SC2086
    if "$B/bench/e2e_load" $args > "$run/client.out" 2> "$run/client.err"
    then
        verdict="every response valid"
    else
        verdict="VALIDATION FAILED (see the errors below)"
        status=1
    fi
    cat "$run/client.out" >&2

    if [ "$k" -gt 0 ]; then
        title="top_k $k"
    else
        title="no top-k: every support row is the whole vocabulary (4099)"
    fi

    {
        echo "### $title"
        echo
        echo "\`$B/bench/e2e_load $args\`: $verdict"
        echo
        # the table the client prints last
        sed -n '/^| mask /,/^$/p' "$run/client.out"
        echo '```text'
        grep -E '^(warm-up|run )' "$run/client.out"
        if [ -s "$run/client.err" ]; then
            head -n 20 "$run/client.err"
        fi
        echo '```'
        echo
    } >> "$out"
done

stats=$("$B/maskserve-cli" --shm "$shm" --stats 2> /dev/null \
        || echo "(unavailable)")
load1=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- record

record() {
    echo "## $now"
    echo
    echo "- command: \`bench/e2e_cpu.sh${*:+ $*}\`" \
         "(CONC=$CONC REQUESTS=$REQUESTS REPEATS=$REPEATS" \
         "MAX_TOKENS=$MAX_TOKENS THREADS=$THREADS" \
         "NGINX_WORKERS=$NGINX_WORKERS), tree $rev"
    echo "- machine: nproc $ncpu, $cpu, $mem, Linux $kernel; load average" \
         "$load0 before, $load1 after (the client, nginx and the worker" \
         "share these cores with whatever else runs)"
    echo "- stack: \`maskserve-worker --dummy tiny --backend cpu" \
         "--threads $THREADS --max-num-seqs $CONC --max-model-len 512\`," \
         "nginx $nginx_v with $NGINX_WORKERS worker process(es) and the" \
         "module, redis $redis_v; loopback"
    echo "- load: $CONC concurrent streams, one per keep-alive connection," \
         "prompts of 16 tokens, max_tokens $MAX_TOKENS with ignore_eos," \
         "temperature 1, a seed per request; $REQUESTS requests per run," \
         "measured over the run's steady window; modes interleaved," \
         "medians of $REPEATS runs"
    if [ -n "${MODULE_SO:-}" ]; then
        echo "- module: \`$so\`"
    fi
    echo "- worker counters after the runs: \`$stats\`"
    echo
    cat "$out"
}

if [ "$RESULTS" = "-" ]; then
    record "$@"
else
    if [ ! -s "$RESULTS" ]; then
        mkdir -p "$(dirname "$RESULTS")"
        cat > "$RESULTS" <<'EOF'
# End to end on the CPU backend

`bench/e2e_cpu.sh` starts redis-server, one worker (dummy `tiny` weights:
Qwen3-shaped, vocabulary 4099, CPU backend) and nginx with the module on
loopback, and drives `POST /inference/v1/generate` with `bench/e2e_load` at
64 concurrent streams, with the sampling mask off, `selected` and `support`
side by side at the same load (interleaved runs).  The claim measured:
masks cost nothing extra per request.  "req/s vs off" is the median of the
ratios between runs of one repeat, with their range.

Each run issues a fixed number of requests, keeping 64 in flight.  Rates
are measured over the run's steady window, from the completion of the
first 64 (which all start together) to the last request issued, while all
64 connections are busy; latencies are those of the requests started in
that window.  TTFE is the time from sending a request to its first
complete SSE event; latency, to the end of the response.  MB/s counts
response bytes on the wire.  Mask ids/token is the mean width of a mask
row.  The CPU columns are CPU time (user + system) per valid response of
the load client, the worker process and the nginx worker processes,
sampled from /proc around each run: on a small machine the three share
the same cores, so extra CPU per response anywhere lowers req/s, and these
columns say where it goes.

Every response is validated: status, chunked framing, SSE events, JSON,
token count = max_tokens, one mask row and one logprob entry per token,
the sampled token in its row, rows ascending, |row| <= top_k, support
logprobs summing to 1, `[DONE]` last, usage; and request i must return
the same token ids in every mode and repeat.  Absolute numbers from a
shared 2-core development machine are noisy; compare within one run.

EOF
    fi
    record "$@" >> "$RESULTS"
    echo "e2e_cpu: results appended to $RESULTS" >&2
fi

if [ $status -ne 0 ]; then
    keep_logs=1
fi
exit $status
