#!/bin/bash
# gpu_update.sh: how long a trainer's weight update takes on the CUDA
# worker with a checkpoint of the qwen3-8b shapes (bf16, 16.4 GB): pause,
# update_weights_from_disk, resume, each timed from the command to the
# worker's answer, through the worker's control mailbox (the commands
# nginx's endpoints post; bench/update_time.c), repeated, medians last.
#
# The checkpoint: $CKPT when it holds one (a real Hugging Face directory
# of the same model works too), else the dummy weights of $PRESET written
# there by bench/write_checkpoint (what --dummy $PRESET serves).  The
# update reads the same files again, from the page cache.  The worker
# leaves room for the second copy of the weights an update builds:
# --gpu-memory-fraction $FRACTION (docs/API.md).
#
# Then the update alone (mode keep, no pause) while $LOAD (default 256)
# streams of $LOAD_TOKENS (700) tokens run: the pause it causes is the
# worker's "between two steps" figure.  LOAD=0 skips it.
#
# Needs no Debian packages (bench/gpu_env.sh unpacks yajl from .debs/ when
# the system has none).  Output: $OUT (or build-gpu/out)/gpu_update.log.

set -eu -o pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-build-gpu/out}
B=${B:-build-gpu}
PRESET=${PRESET:-qwen3-8b}
CKPT=${CKPT:-/tmp/msv-ckpt-$PRESET}
REPEAT=${REPEAT:-3}
MODE=${MODE:-abort}
FRACTION=${FRACTION:-0.6}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_update.log") 2>&1

. bench/gpu_env.sh

echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader), $(nproc) cores"
make -j"$(nproc)" B="$B" "$B/maskserve-worker" "$B/maskserve-cli" "$B/bench/update_time" \
    "$B/bench/write_checkpoint" > "$OUT/build.log" 2>&1 \
    || { tail -30 "$OUT/build.log"; exit 1; }

if [ ! -f "$CKPT/config.json" ]; then
    "$B/bench/write_checkpoint" "$PRESET" "$CKPT" 1
fi
echo "== checkpoint $CKPT: $(du -sh "$CKPT" | cut -f1)"

shm=msv-upd-$$
log=$OUT/worker-update.log
"$B/maskserve-worker" --model "$CKPT" --backend cuda --shm "$shm" \
    --max-num-seqs 256 --max-model-len 2048 \
    --gpu-memory-fraction "$FRACTION" --weight-version v0 2> "$log" &
wpid=$!
trap 'kill $wpid 2>/dev/null || true; wait $wpid 2>/dev/null || true' EXIT
for _ in $(seq 1 1800); do
    grep -q "ready: region" "$log" && break
    kill -0 $wpid 2>/dev/null || { tail "$log"; exit 1; }
    sleep 0.1
done
grep -q "ready: region" "$log" || { tail "$log"; exit 1; }
grep -E "backend ready|host copy" "$log"

echo "== pause ($MODE), update_weights_from_disk, resume; $REPEAT rounds"
"$B/bench/update_time" --shm "$shm" --model-path "$CKPT" \
    --repeat "$REPEAT" --mode "$MODE"
grep -E "control: version" "$log" | tail -n "$REPEAT"

# the same update while $LOAD streams run (mode keep, no pause: they go
# on, on the new weights, and the update stops them only between two
# steps); every answer checked by maskserve-cli
if [ "${LOAD:-256}" -gt 0 ]; then
    python3 - "${LOAD:-256}" "${LOAD_TOKENS:-700}" > "$OUT/load.jsonl" <<'PY'
import json, sys
n, mt = map(int, sys.argv[1:])
for i in range(n):
    print(json.dumps({"request_id": f"u{i}",
        "token_ids": [(i * 7919 + j * 104729) % 151000 for j in range(128)],
        "sampling_params": {"max_tokens": mt, "temperature": 1.0,
                            "top_k": 1000, "seed": i, "ignore_eos": True}}))
PY
    echo "== update_weights_from_disk (keep, no pause) under ${LOAD:-256} streams of ${LOAD_TOKENS:-700} tokens"
    "$B/maskserve-cli" --shm "$shm" --requests "$OUT/load.jsonl" --summary \
        --timeout 300 > "$OUT/load_summary.json" &
    lpid=$!
    sleep 2
    "$B/bench/update_time" --shm "$shm" --model-path "$CKPT" \
        --repeat "$REPEAT" --mode keep --no-pause
    wait $lpid || { echo "gpu_update.sh: the load failed" >&2; exit 1; }
    echo "load: $(cat "$OUT/load_summary.json")"
    grep -E "control: version" "$log" | tail -n "$REPEAT"
fi
