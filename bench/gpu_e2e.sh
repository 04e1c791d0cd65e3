#!/bin/bash
# gpu_e2e.sh: the whole stack on a GPU machine: redis-server, the worker on
# the CUDA backend (dummy qwen3-8b, bf16) and the stock Debian nginx with
# the module, driven by bench/e2e_load at 256 concurrent streams with the
# mask off, selected and support side by side (interleaved, repeated), at
# top_k 20 and 1000.  Every response is validated by the client.
#
#   MODES=all TOP_KS="1000 8192" bench/gpu_e2e.sh
#
# compares JSON and packed masks (off, selected, support, selected-packed,
# support-packed) at the issue-10 settings: nginx and client CPU per
# response, bytes per response, tokens/s and the ratio to mask-off.
#
# The machine needs no Debian packages installed: the script unpacks
# .debs/*.deb (apt-get download nginx libhiredis0.14 libyajl2 libyajl-dev
# redis-server redis-tools liblzf1 libjemalloc2) into a scratch folder and
# loads .debs/ngx_http_maskserve_module.so, the module built against
# Debian's nginx-dev (tools/build-module.sh) on a Debian machine.
#
# Results: $OUT (or build-gpu/out)/gpu_e2e.log, tables last.

set -eu -o pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-build-gpu/out}
B=${B:-build-gpu}
CONC=${CONC:-256}
REQUESTS=${REQUESTS:-768}
REPEATS=${REPEATS:-2}
MAX_TOKENS=${MAX_TOKENS:-64}
PORT=${PORT:-18080}
MODES=${MODES:-off,selected,support}
TOP_KS=${TOP_KS:-20 1000}
REDIS_PORT=${REDIS_PORT:-16390}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_e2e.log") 2>&1

deb=/tmp/msv-deb
mkdir -p "$deb"
for f in .debs/*.deb; do dpkg -x "$f" "$deb"; done
lib=$deb/usr/lib/x86_64-linux-gnu
export CPPFLAGS="-I$deb/usr/include" LDFLAGS="-L$lib" LD_LIBRARY_PATH="$lib"
so=$PWD/.debs/ngx_http_maskserve_module.so
[ -f "$so" ] || { echo "gpu_e2e.sh: $so missing" >&2; exit 1; }

echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader), $(nproc) cores"
make -j"$(nproc)" B="$B" "$B/maskserve-worker" "$B/bench/e2e_load" \
    > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }

run=/tmp/msv-run
rm -rf "$run"
mkdir -p "$run/tmp"
pids=""
cleanup() {
    [ -f "$run/nginx.pid" ] && kill -QUIT "$(cat "$run/nginx.pid")" 2>/dev/null
    for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

"$deb/usr/bin/redis-server" --port "$REDIS_PORT" --bind 127.0.0.1 --save '' \
    --appendonly no --dir "$run" > "$run/redis.log" 2>&1 &
pids="$pids $!"

"$B/maskserve-worker" --dummy qwen3-8b --backend cuda --shm msv-gpu-e2e \
    --max-num-seqs "$CONC" --max-model-len 1024 --ring-bytes 256M \
    --sample-threads 8 --seed 1 2> "$run/worker.log" &
wpid=$!
pids="$pids $wpid"
for _ in $(seq 1 3000); do
    grep -q "ready: region" "$run/worker.log" && break
    kill -0 $wpid 2>/dev/null || { tail "$run/worker.log"; exit 1; }
    sleep 0.1
done
grep -E "tensors loaded|backend ready" "$run/worker.log"

cat > "$run/nginx.conf" <<EOF
load_module $so;
user root root;
worker_processes 4;
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
    server {
        listen 127.0.0.1:$PORT;
        location = /inference/v1/generate { maskserve_generate; maskserve_worker msv-gpu-e2e; }
        location = /health { maskserve_health; maskserve_worker msv-gpu-e2e; }
    }
}
EOF
"$deb/usr/sbin/nginx" -p "$run" -c "$run/nginx.conf" -e "$run/error.log"
for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -sS "http://127.0.0.1:$PORT/health"; echo
ngx=$(pgrep -f "nginx: worker process" | paste -sd, -)

for k in $TOP_KS; do
    echo "== top_k $k: $CONC streams, $REQUESTS requests per run, $MAX_TOKENS tokens each"
    "$B/bench/e2e_load" --port "$PORT" -c "$CONC" -n "$REQUESTS" \
        --repeats "$REPEATS" --max-tokens "$MAX_TOKENS" --top-k "$k" \
        --vocab 150000 --prompt-len 64 --timeout 300 --modes "$MODES" \
        --cpu worker=$wpid --cpu nginx="$ngx" 2>&1 | tail -14
done
tail -3 "$run/worker.log"
