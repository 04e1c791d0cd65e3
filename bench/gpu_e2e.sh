#!/bin/bash
# gpu_e2e.sh: the project's end-to-end claim on one GPU: client -> nginx
# with the module -> worker (dummy qwen3-8b, CUDA backend, device
# sampler) -> ring -> nginx -> client, mask off against selected and
# support (JSON and packed) in the same run, on the workloads RL trainers
# run (batch 256, 512 new tokens, temperature 1, ignore_eos, prompt 128).
#
# Each row is one wave of requests (bench/e2e_load, --warmup 0
# --repeats 1) per mask mode, the modes of a row one after the other in
# one client run, so every request is checked in every mode (its
# token_ids must not change with the mask).  Throughput comes from the
# worker's own step log (--step-log, docs/SCHEDULER.md): decode tokens
# over the steps where every request of the wave decodes and none
# prefills; the stage costs per step from the same lines; wall time,
# bytes, nginx and client CPU and resident memory from the client; what
# nginx formatted of the masks and the time it took inside the module
# from its /metrics before and after each wave (e2e_load --metrics), hence
# M ids/s and M float32/s per core inside the module and nginx CPU per
# 1000-id row, JSON against packed (bench/e2e_report.c has the targets).
#
#   PART=1 bench/gpu_e2e.sh     batch 256, non-streaming: top_k 20, 1000,
#                               8192 (top_p 1) and 1024 (top_p 0.95); about
#                               6 minutes on an H200
#   PART=2 bench/gpu_e2e.sh     streaming top_k 20 and 1000; batch 64 and 1
#                               at top_k 1000; staggered rollouts (max_tokens
#                               64..1024) at top_k 128 and 8192; groups (64
#                               requests x sampling_params.n 4); about 6
#                               minutes
#   bench/gpu_e2e.sh            both parts, one after the other
#   PART=merge OUT=DIR bench/gpu_e2e.sh PART1_OUT PART2_OUT
#                               one table, CSV and charts from two parts
#
# Outputs in $OUT (default build-gpu/out): e2e_h200.md (the table with
# the targets, what bounds each missed one), e2e_h200.csv (every number
# of every run), e2e_h200_*.png (charts, when python has matplotlib),
# gpu_e2e.log; per part part<N>/runs.csv (the client's lines),
# part<N>/steps.txt (the step log), part<N>/worker.log.  The table is
# rewritten after every row, so a run cut short still has what it did.
# Exit status 1 when a response was invalid (the row is named) or a
# process failed.
#
# On the GPU machine nothing needs installing: .debs/*.deb (apt-get
# download nginx libhiredis0.14 libyajl2 libyajl-dev redis-server
# redis-tools liblzf1 libjemalloc2) are unpacked into a scratch folder and
# .debs/ngx_http_maskserve_module.so, the module built against Debian's
# nginx-dev (tools/build-module.sh), is loaded.  Without .debs/ the
# system's nginx and redis-server and the module of `make module` are
# used (tools/deps.sh installs them), which with a small scale checks the
# script on the CPU backend:
#
#   BACKEND=cpu DUMMY=tiny B=build BATCH=8 BATCH_MID=4 GRPO_PROMPTS=2 VOCAB=4000 \
#   MAX_TOKENS=24 STAGGER=8:40 PROMPT=16 K_BIG=4000 K_TP=1024 \
#   OUT=/tmp/e2e bench/gpu_e2e.sh
#
# The client checks every response in CLIENT_THREADS threads (8), each
# with its own connections (bench/e2e_load --threads), so that parsing and
# checking wide masks does not bound the rows.
#
# Environment: B (build dir), BACKEND (cuda), DUMMY (qwen3-8b), BATCH
# (256), BATCH_MID (64), GRPO_PROMPTS (64; x GRPO_N 4), GRPO_BY (n: one
# request per prompt with sampling_params.n GRPO_N, e2e_load --n; group:
# GRPO_N requests per prompt, e2e_load --group), CLIENT_THREADS (8),
# MAX_TOKENS (512),
# VOCAB (prompt ids below it, 150000),
# PROMPT (128), STAGGER (64:1024), K_SMALL (20), K_MID (1000), K_BIG
# (8192), K_TP (1024, with top_p TOP_P 0.95), K_ST (128), NGINX_WORKERS
# (8), SAMPLE_THREADS (8), MAX_BATCHED (8192), WORKER_ARGS
# (empty; --batch-invariant makes token identity across modes a check), OUTPUT_LIMIT (256m), NGINX, REDIS, MODULE_SO,
# PY (python with matplotlib for the charts).

set -eu -o pipefail
cd "$(dirname "$0")/.."
root=$PWD

OUT=${OUT:-build-gpu/out}
B=${B:-build-gpu}
PART=${PART:-all}
BACKEND=${BACKEND:-cuda}
DUMMY=${DUMMY:-qwen3-8b}
BATCH=${BATCH:-256}
BATCH_MID=${BATCH_MID:-64}
GRPO_PROMPTS=${GRPO_PROMPTS:-64}
GRPO_N=${GRPO_N:-4}
GRPO_BY=${GRPO_BY:-n}
CLIENT_THREADS=${CLIENT_THREADS:-8}
MAX_TOKENS=${MAX_TOKENS:-512}
PROMPT=${PROMPT:-128}
STAGGER=${STAGGER:-64:1024}
K_SMALL=${K_SMALL:-20}
K_MID=${K_MID:-1000}
K_BIG=${K_BIG:-8192}
K_TP=${K_TP:-1024}
TOP_P=${TOP_P:-0.95}
K_ST=${K_ST:-128}
# JSON support rows at top_k 8192 are ~6 cores of formatting at 20,000
# tokens/s (35 ns an id and its logprob): 4 workers bound the step there
NGINX_WORKERS=${NGINX_WORKERS:-8}
SAMPLE_THREADS=${SAMPLE_THREADS:-8}
MAX_BATCHED=${MAX_BATCHED:-8192}
# the worker's default mode, as users run it for throughput; with
# WORKER_ARGS=--batch-invariant the client also requires request i to
# return the same tokens in every mode of its row (the CUDA backend
# guarantees that only in that mode, which costs +0.5-2% a step at batch
# 256, +7% at 64, +12% at 1: bench/results/engine.md); otherwise the
# differences are counted and
# reported (e2e_load --same-tokens 0)
WORKER_ARGS=${WORKER_ARGS:-}
case " $WORKER_ARGS " in
*" --batch-invariant "*) SAME_TOKENS=1 ;;
*) SAME_TOKENS=0 ;;
esac
# a non-streaming top_k 8192 support answer of 512 tokens is ~70 MB of JSON
OUTPUT_LIMIT=${OUTPUT_LIMIT:-256m}
VOCAB=${VOCAB:-150000}
PORT=${PORT:-18080}
REDIS_PORT=${REDIS_PORT:-16390}
TIMEOUT=${TIMEOUT:-300}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

die() {
    echo "gpu_e2e: $*" >&2
    exit 1
}

stamp() {
    echo "== $(date -u +%T) +$((SECONDS))s $*"
}

case "$GRPO_BY" in
n|group) ;;
*) die "GRPO_BY=$GRPO_BY: n or group" ;;
esac

# python for the charts: the GPU machine's venv, else the system's
if [ -z "${PY:-}" ]; then
    PY=python3
    [ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
fi

# ---------------------------------------------------------------- report

# report DIR...: e2e_h200.{md,csv} (and charts) from the parts in DIRs
report() {
    local args=() d
    for d in "$@"; do
        [ -s "$d/runs.csv" ] && args+=("$d/runs.csv" "$d/steps.txt")
    done
    [ ${#args[@]} -gt 0 ] || { echo "gpu_e2e: nothing to report yet"; return 0; }
    {
        cat "$OUT/header.md" 2>/dev/null || true
        "$B/bench/e2e_report" "$OUT/e2e_h200.csv" "${args[@]}"
    } > "$OUT/e2e_h200.md.tmp" || rep_rc=$?
    mv "$OUT/e2e_h200.md.tmp" "$OUT/e2e_h200.md"
}

charts() {
    if "$PY" -c 'import matplotlib, numpy' 2>/dev/null; then
        "$PY" bench/e2e_charts.py "$OUT/e2e_h200.csv" "$OUT" \
            || echo "gpu_e2e: the charts failed"
    else
        echo "gpu_e2e: charts skipped: $PY has no matplotlib/numpy (PY=...)"
    fi
}

if [ "$PART" = merge ]; then
    [ $# -ge 1 ] || die "PART=merge: give the parts' output folders"
    rep_rc=0
    cat "$1/header.md" > "$OUT/header.md" 2>/dev/null || true
    dirs=()
    for d in "$@"; do
        for p in "$d"/part*; do [ -d "$p" ] && dirs+=("$p"); done
    done
    [ -x "$B/bench/e2e_report" ] || make -j2 B="$B" "$B/bench/e2e_report" \
        > /dev/null
    report "${dirs[@]}"
    charts
    cat "$OUT/e2e_h200.md"
    exit $rep_rc
fi

exec > >(tee -a "$OUT/gpu_e2e.log") 2>&1

# ---------------------------------------------------------------- binaries

if ls .debs/*.deb > /dev/null 2>&1; then
    deb=$(mktemp -d /tmp/msv-deb.XXXXXX)
    for f in .debs/*.deb; do dpkg -x "$f" "$deb"; done
    lib=$deb/usr/lib/x86_64-linux-gnu
    export CPPFLAGS="-I$deb/usr/include" LDFLAGS="-L$lib"
    export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    NGINX=${NGINX:-$deb/usr/sbin/nginx}
    REDIS=${REDIS:-$deb/usr/bin/redis-server}
    MODULE_SO=${MODULE_SO:-$root/.debs/ngx_http_maskserve_module.so}
    jobs=$(nproc)
else
    NGINX=${NGINX:-/usr/sbin/nginx}
    REDIS=${REDIS:-redis-server}
    MODULE_SO=${MODULE_SO:-$root/$B/nginx/src/objs/ngx_http_maskserve_module.so}
    jobs=2
fi
command -v "$NGINX" > /dev/null || die "$NGINX not found (NGINX=...)"
command -v "$REDIS" > /dev/null || die "$REDIS not found (REDIS=...)"
[ -f "$MODULE_SO" ] || die "$MODULE_SO missing (make module, or MODULE_SO=...)"

gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader \
      2>/dev/null | head -1 || true)
cpu_model=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //' || true)
cpu_smt=$(lscpu 2>/dev/null | sed -n 's/^Thread(s) per core: *//p' \
          | head -1 || true)
stamp "gpu_e2e PART=$PART backend $BACKEND, dummy $DUMMY, ${gpu:-no GPU}," \
      "$(nproc) cores"
make -j"$jobs" B="$B" "$B/maskserve-worker" "$B/bench/e2e_load" \
    "$B/bench/e2e_report" > "$OUT/build.log" 2>&1 \
    || { tail -30 "$OUT/build.log"; exit 1; }

cat > "$OUT/header.md" <<EOF
# The whole stack: client -> nginx + module -> worker -> ring -> nginx -> client

Command: \`bash bench/gpu_e2e.sh\` (PART=1 and PART=2, merged with
\`PART=merge\`), from the repository root.

Date: $(date -u '+%F %H:%M UTC').  Machine: ${gpu:-no GPU}, $(nproc) CPU
cores ($cpu_model, $cpu_smt threads a core).  Worker: \`--dummy $DUMMY --backend $BACKEND --max-num-seqs $BATCH
--max-num-batched-tokens $MAX_BATCHED --sample-threads $SAMPLE_THREADS${WORKER_ARGS:+ $WORKER_ARGS}\`;
nginx $("$NGINX" -v 2>&1 | sed 's/.*\///') with $NGINX_WORKERS worker
processes and the module; redis-server; bench/e2e_load
(\`--threads $CLIENT_THREADS\`) on the same machine.

Load: one wave per row and mask mode (batch $BATCH unless the row says
otherwise), prompts of $PROMPT tokens, $MAX_TOKENS new tokens, ignore_eos,
temperature 1, a seed per request (groups: $GRPO_PROMPTS prompts x $GRPO_N,
$([ "$GRPO_BY" = n ] && echo "one request each with sampling_params.n $GRPO_N" || echo "$GRPO_N requests each"));
the modes of a row one after the
other, mask off first.  Every response was validated by the client
(framing, JSON, token counts, one mask row and logprob entry per token,
sampled token in its row, |row| <= top_k, support logprobs summing to 1,
packed masks decoded and checked alike)$([ "$SAME_TOKENS" = 1 ] && echo " and request i returned the same
tokens in every mode of its row" || echo "; request i's tokens in each mode
against its first mode are counted (the default mode's logits depend on
the batch; the validation line says how many differed)").

Columns: steady tok/s = decode tokens / time over the steps where every
request of the wave decodes and none prefills (the worker's step log);
on/off = that against the row's mask-off run (staggered and group rows:
mask-off wall / mask-on wall); step and stage times are medians over
that window (whole run when a row has none); gap = time between two
steps; wire MB/s = response bytes / client wall time; nginx and client
CPU per MB of responses; RSS at the end of the row (VmHWM, the peak, in
parentheses).  Targets: mask off >= 21,000 tokens/s at batch 256;
support/off >= 0.97 at top_k 1000, >= 0.85 at top_k 8192 JSON, >= 0.95
packed; selected/off >= 0.99, 0.98, 0.95 at top_k 20, 1000, 8192;
staggered top_k 8192 support wall within 1.2x of mask off; inside nginx,
JSON support rows formatted at >= 100 M ids/s and >= 40 M float32/s (the
module's own counters, maskserve_format_*), and packed support at most a
tenth of JSON's nginx CPU per 1000-id row.

EOF

# ---------------------------------------------------------------- the stack

run=$(mktemp -d /tmp/msv-e2e-run.XXXXXX)
mkdir -p "$run/tmp"
shm=msv-gpu-e2e-$$
wpid=
rpid=
cleanup() {
    [ -f "$run/nginx.pid" ] && kill -QUIT "$(cat "$run/nginx.pid")" 2>/dev/null
    if [ -n "$wpid" ]; then kill -TERM "$wpid" 2>/dev/null; wait "$wpid"; fi
    if [ -n "$rpid" ]; then kill -TERM "$rpid" 2>/dev/null; wait "$rpid"; fi
    return 0
}
trap cleanup EXIT

"$REDIS" --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$run" > "$run/redis.log" 2>&1 &
rpid=$!

# start_worker PARTDIR: a worker with its step log in PARTDIR
start_worker() {
    local pd=$1 args=()
    [ "$BACKEND" = cpu ] && args+=(--threads "$(nproc)")
    "$B/maskserve-worker" --dummy "$DUMMY" --backend "$BACKEND" --shm "$shm" \
        --max-num-seqs "$BATCH" --max-model-len $((PROMPT + ${STAGGER#*:} + 64)) \
        --max-num-batched-tokens "$MAX_BATCHED" --ring-bytes 256M \
        --sample-threads "$SAMPLE_THREADS" --seed 1 --step-log "$pd/steps.txt" \
        $WORKER_ARGS "${args[@]}" 2> "$pd/worker.log" &
    wpid=$!
    for _ in $(seq 1 3000); do
        grep -q "ready: region" "$pd/worker.log" && break
        kill -0 "$wpid" 2>/dev/null || { tail "$pd/worker.log"; die "the worker died"; }
        sleep 0.1
    done
    grep -q "ready: region" "$pd/worker.log" || die "the worker is not ready after 300 s"
    grep -E "tensors loaded|backend ready|sampler:" "$pd/worker.log" || true
}

stop_worker() {
    kill -TERM "$wpid"
    wait "$wpid" || true
    wpid=
}

cat > "$run/nginx.conf" <<EOF
load_module $MODULE_SO;
$([ "$(id -u)" = 0 ] && echo "user root root;")
worker_processes $NGINX_WORKERS;
error_log $run/error.log notice;
pid $run/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $run/tmp/body;
    proxy_temp_path $run/tmp/proxy;
    fastcgi_temp_path $run/tmp/fastcgi;
    uwsgi_temp_path $run/tmp/uwsgi;
    scgi_temp_path $run/tmp/scgi;
    maskserve_redis 127.0.0.1:$REDIS_PORT;
    maskserve_output_limit $OUTPUT_LIMIT;
    server {
        listen 127.0.0.1:$PORT;
        location = /inference/v1/generate { maskserve_generate; maskserve_worker $shm; }
        location = /health { maskserve_health; maskserve_worker $shm; }
        location = /metrics { maskserve_metrics; maskserve_worker $shm; }
    }
}
EOF

start_nginx() {
    "$NGINX" -p "$run" -c "$run/nginx.conf" -e "$run/error.log" \
        || die "nginx did not start: $(tail -3 "$run/error.log")"
    for _ in $(seq 1 100); do
        curl -fsS "http://127.0.0.1:$PORT/health" > /dev/null 2>&1 && break
        sleep 0.1
    done
    curl -fsS "http://127.0.0.1:$PORT/health" > /dev/null \
        || die "nginx /health: $(curl -sS "http://127.0.0.1:$PORT/health")"
    ngx=$(pgrep -P "$(cat "$run/nginx.pid")" | paste -sd, -)
}

# ---------------------------------------------------------------- rows

failed=""

# row PARTDIR LABEL MODES E2E_LOAD_OPTIONS...: one client run, its modes
# one wave each, then the tables so far
row() {
    local pd=$1 label=$2 modes=$3 rc=0
    shift 3
    stamp "row $label ($modes): start"
    "$B/bench/e2e_load" --port "$PORT" --warmup 0 --repeats 1 \
        --threads "$CLIENT_THREADS" --same-tokens "$SAME_TOKENS" \
        --prompt-len "$PROMPT" --vocab "$VOCAB" --timeout "$TIMEOUT" \
        --modes "$modes" --csv "$pd/runs.csv" --label "$label" \
        --cpu worker="$wpid" --cpu nginx="$ngx" --metrics /metrics "$@" \
        > "$pd/load_${label//:/_}.txt" 2>&1 || rc=$?
    grep -E "^run |^validation|e2e_load:" "$pd/load_${label//:/_}.txt" \
        | grep -v "^e2e_load: 127" || true
    if [ $rc -ne 0 ]; then
        echo "gpu_e2e: row $label: e2e_load exit $rc (invalid responses or" \
             "a client error; $pd/load_${label//:/_}.txt)"
        failed="$failed $label"
    fi
    # the worker flushes its step log once nothing runs
    for _ in $(seq 1 100); do
        tail -1 "$pd/steps.txt" 2>/dev/null | grep -q " active 0 " && break
        sleep 0.05
    done
    report "$OUT"/part*
    stamp "row $label: done"
}

# the rows of a part; est = a budget at ~12,000 tok/s at batch 256 (~7,000
# at 64, ~180 at 1), prefill ~30,000 tok/s, per mode
part1() {
    local pd=$OUT/part1 m=all
    mkdir -p "$pd"
    stamp "part 1: batch $BATCH x $MAX_TOKENS, non-streaming; budget ~20" \
          "waves of ~12 s (mask rows at top_k $K_BIG longer: JSON volume)"
    start_worker "$pd"
    start_nginx
    for k in "$K_SMALL" "$K_MID" "$K_BIG"; do
        row "$pd" "wave:$BATCH:$MAX_TOKENS:$k:1:0" $m --no-stream \
            -c "$BATCH" -n "$BATCH" --max-tokens "$MAX_TOKENS" --top-k "$k"
    done
    row "$pd" "wave:$BATCH:$MAX_TOKENS:$K_TP:$TOP_P:0" $m --no-stream \
        -c "$BATCH" -n "$BATCH" --max-tokens "$MAX_TOKENS" --top-k "$K_TP" \
        --top-p "$TOP_P"
    kill -QUIT "$(cat "$run/nginx.pid")"
    sleep 0.5
    stop_worker
}

part2() {
    local pd=$OUT/part2 m=all st=off,support,support-packed
    mkdir -p "$pd"
    stamp "part 2: streaming, batch $BATCH_MID and 1, staggered, groups;" \
          "budget ~10 streaming waves of ~12 s, 5 x 5 s at $BATCH_MID," \
          "5 x 3 s at 1, 6 staggered of ~15 s, 3 groups of ~12 s"
    start_worker "$pd"
    start_nginx
    for k in "$K_SMALL" "$K_MID"; do
        row "$pd" "wave:$BATCH:$MAX_TOKENS:$k:1:1" $m \
            -c "$BATCH" -n "$BATCH" --max-tokens "$MAX_TOKENS" --top-k "$k"
    done
    for b in "$BATCH_MID" 1; do
        row "$pd" "wave:$b:$MAX_TOKENS:$K_MID:1:0" $m --no-stream \
            -c "$b" -n "$b" --max-tokens "$MAX_TOKENS" --top-k "$K_MID"
    done
    for k in "$K_ST" "$K_BIG"; do
        row "$pd" "stagger:$BATCH:${STAGGER/:/-}:$k:1:0" $st --no-stream \
            -c "$BATCH" -n "$BATCH" --max-tokens "$STAGGER" --top-k "$k"
    done
    # a group: GRPO_N completions of one prompt, as one request of
    # sampling_params.n (every choice checked) or as GRPO_N requests
    if [ "$GRPO_BY" = n ]; then
        grpo=(-c "$GRPO_PROMPTS" -n "$GRPO_PROMPTS" --n "$GRPO_N")
    else
        grpo=(-c $((GRPO_PROMPTS * GRPO_N)) -n $((GRPO_PROMPTS * GRPO_N))
              --group "$GRPO_N")
    fi
    row "$pd" "grpo:${GRPO_PROMPTS}x$GRPO_N:$MAX_TOKENS:$K_MID:1:0" $st --no-stream \
        "${grpo[@]}" --max-tokens "$MAX_TOKENS" --top-k "$K_MID"
    kill -QUIT "$(cat "$run/nginx.pid")"
    sleep 0.5
    stop_worker
}

rep_rc=0
case "$PART" in
1) part1 ;;
2) part2 ;;
all) part1; part2 ;;
*) die "PART=$PART: 1, 2, all or merge" ;;
esac

report "$OUT"/part*
charts
stamp "tables"
cat "$OUT/e2e_h200.md"
if [ -n "$failed" ]; then
    echo "gpu_e2e: FAILED rows:$failed"
    exit 1
fi
[ "$rep_rc" = 0 ] || { echo "gpu_e2e: the report found invalid runs"; exit 1; }
stamp "done"
