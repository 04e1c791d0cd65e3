#!/bin/sh
# run.sh: start the whole stack in the foreground (make run).
#
#   redis-server on 127.0.0.1:$REDIS_PORT (default 6390, no persistence)
#   one worker: region $SHM (default maskserve-0); the CUDA backend when a
#     GPU is usable, else the CPU backend; $MODEL (a Hugging Face
#     checkpoint directory) or the dummy `tiny` model
#   nginx (the stock binary) with the module, on 127.0.0.1:$PORT (8080);
#     as root, its worker processes run as $NGINX_USER (nobody) in group
#     $GROUP (maskserve), which the worker shares its region with
#
# Runtime files (logs, nginx.conf, pid files) go to build/run/.  Ctrl-C
# (or SIGTERM) stops everything.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
B=${B:-$root/build}
run=$B/run
PORT=${PORT:-8080}
REDIS_PORT=${REDIS_PORT:-6390}
SHM=${SHM:-maskserve-0}
MODEL=${MODEL:-}
so=$B/nginx/src/objs/ngx_http_maskserve_module.so

mkdir -p "$run/logs" "$run/tmp"

for f in "$B/maskserve-worker" "$so"; do
    [ -e "$f" ] || { echo "run.sh: $f is missing: run make first" >&2; exit 1; }
done

pids=""
cleanup() {
    trap - INT TERM EXIT
    [ -f "$run/nginx.pid" ] && kill -QUIT "$(cat "$run/nginx.pid")" 2>/dev/null
    for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    echo "maskserve: stopped"
}
trap cleanup INT TERM EXIT

# Redis
redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' \
    --appendonly no --dir "$run" > "$run/logs/redis.log" 2>&1 &
pids="$pids $!"

# Who runs what.  As root: the worker stays root (it owns the GPU), its
# region and socket are 0660 for group $GROUP (created if missing), and
# nginx's worker processes run as the unprivileged $NGINX_USER in that
# group; they never run as root.  Otherwise everything runs as the caller
# and the region is 0600.
GROUP=${GROUP:-maskserve}
NGINX_USER=${NGINX_USER:-nobody}
if [ "$(id -u)" = 0 ]; then
    getent group "$GROUP" > /dev/null || groupadd --system "$GROUP"
    share="--group $GROUP"
    user_line="user              $NGINX_USER $GROUP;"
else
    share=""
    user_line="# not root: nginx's workers run as $(id -un), like the worker"
fi

# worker
if [ -n "$MODEL" ]; then
    src="--model $MODEL"
else
    src="--dummy tiny"
fi
# shellcheck disable=SC2086
"$B/maskserve-worker" $src --backend auto --shm "$SHM" $share \
    2> "$run/logs/worker.log" &
wpid=$!
pids="$pids $wpid"

i=0
until grep -q "ready: region" "$run/logs/worker.log" 2>/dev/null; do
    i=$((i + 1))
    if ! kill -0 "$wpid" 2>/dev/null || [ $i -gt 6000 ]; then
        echo "maskserve: the worker did not start:" >&2
        tail -n 20 "$run/logs/worker.log" >&2
        exit 1
    fi
    sleep 0.1
done

# nginx
cat > "$run/nginx.conf" <<EOF
load_module $so;

# the region is 0660 for group $GROUP when started as root (0600 else)
$user_line
worker_processes  2;
error_log         $run/logs/error.log info;
pid               $run/nginx.pid;

events {
    worker_connections  4096;
}

http {
    access_log  $run/logs/access.log;
    client_body_temp_path  $run/tmp/body;
    proxy_temp_path        $run/tmp/proxy;
    fastcgi_temp_path      $run/tmp/fastcgi;
    uwsgi_temp_path        $run/tmp/uwsgi;
    scgi_temp_path         $run/tmp/scgi;

    maskserve_redis  127.0.0.1:$REDIS_PORT;

    # as docs/nginx.conf: bodies up to 4 MiB, kept in memory
    client_max_body_size     4m;
    client_body_buffer_size  4m;

    server {
        listen  127.0.0.1:$PORT;

        # errors nginx answers itself (bad framing, 404, 413, ...) in the
        # API's JSON shape
        include  $root/docs/nginx-errors.conf;

        location = /inference/v1/generate {
            maskserve_generate;
            maskserve_worker  $SHM;
        }
        location = /inference/v1/abort {
            maskserve_abort;
            maskserve_worker  $SHM;
        }
        location /inference/v1/requests/ {
            maskserve_request_status;
            maskserve_worker  $SHM;
        }
        location = /health {
            maskserve_health;
            maskserve_worker  $SHM;
        }
        location = /v1/models {
            maskserve_models;
            maskserve_worker  $SHM;
        }

        # admin endpoints (docs/API.md): this host only
        location = /inference/v1/pause {
            allow  127.0.0.1;
            deny   all;
            maskserve_pause;
            maskserve_worker  $SHM;
        }
        location = /inference/v1/resume {
            allow  127.0.0.1;
            deny   all;
            maskserve_resume;
            maskserve_worker  $SHM;
        }
        location = /inference/v1/abort_requests {
            allow  127.0.0.1;
            deny   all;
            maskserve_abort_requests;
            maskserve_worker  $SHM;
        }
        location = /inference/v1/update_weights_from_disk {
            allow  127.0.0.1;
            deny   all;
            maskserve_update_weights;
            maskserve_worker  $SHM;
        }
        location = /inference/v1/flush_cache {
            allow  127.0.0.1;
            deny   all;
            maskserve_flush_cache;
            maskserve_worker  $SHM;
        }
        location = /metrics {
            allow  127.0.0.1;
            deny   all;
            maskserve_metrics;
            maskserve_worker  $SHM;
        }
    }
}
EOF

/usr/sbin/nginx -p "$run" -c "$run/nginx.conf" -t -q
/usr/sbin/nginx -p "$run" -c "$run/nginx.conf"

i=0
until curl -fsS "http://127.0.0.1:$PORT/health" > /dev/null 2>&1; do
    i=$((i + 1))
    [ $i -gt 100 ] && { echo "maskserve: nginx did not become healthy" >&2;
                        tail -n 20 "$run/logs/error.log" >&2; exit 1; }
    sleep 0.1
done

example='{"token_ids": [1, 2, 3, 4], "sampling_params": {"max_tokens": 4, "temperature": 1.0, "top_k": 8, "seed": 7}, "return_sampling_mask": true, "sampling_logprobs_mode": "support"}'

cat <<EOF

maskserve is up: nginx on 127.0.0.1:$PORT, worker region $SHM, redis on 127.0.0.1:$REDIS_PORT
logs in $run/logs/.  Try:

  curl -s http://127.0.0.1:$PORT/inference/v1/generate \\
       -H 'Content-Type: application/json' \\
       -d '$example'

EOF
curl -s "http://127.0.0.1:$PORT/inference/v1/generate" \
     -H 'Content-Type: application/json' -d "$example"
echo
echo
echo "Ctrl-C stops the stack."

wait "$wpid"
