#!/bin/bash
# worker_rss.sh: the worker's resident memory (VmRSS) after start and
# after each of a series of workloads, each run twice, on a machine with
# an NVIDIA GPU (dummy qwen3-8b, CUDA backend; BACKEND=cpu with a smaller
# preset for a look without one).  A workload that leaves the RSS higher
# the first time and not the second has warmed something up (kernels
# loaded on first use, decode graphs captured for a new batch bucket or
# context bound); one that grows it every time holds on to memory.
#
#   bash bench/worker_rss.sh        (B: build dir, default build-gpu;
#                                    OUT: results, default $B/rss;
#                                    PRESET, BACKEND, MAX_LEN, VOCAB (prompt ids below it); MSV_CUDA_* and
#                                    CUDA_MODULE_LOADING reach the worker;
#                                    WORKER_FLAGS: extra worker flags;
#                                    ROUNDS: times the series runs, 2)
# Prints one line a workload: label, requests, prompt, new tokens, RSS in
# MB after it, and the change from the line before.

set -eu -o pipefail
cd "$(dirname "$0")/.."

B=${B:-build-gpu}
OUT=${OUT:-$B/rss}
PRESET=${PRESET:-qwen3-8b}
BACKEND=${BACKEND:-cuda}
mkdir -p "$OUT"
shm=msv-rss-$$

"$B/maskserve-worker" --dummy "$PRESET" --backend "$BACKEND" \
    --shm "$shm" --max-num-seqs 256 --max-model-len ${MAX_LEN:-8448} \
    --kv-tokens 262144 --max-num-batched-tokens 8192 --ring-bytes 256M \
    --seed 1 ${WORKER_FLAGS:-} 2> "$OUT/worker.log" &
wpid=$!
trap 'kill $wpid 2>/dev/null || true' EXIT
for _ in $(seq 1 3000); do
    grep -q "ready: region" "$OUT/worker.log" && break
    kill -0 $wpid 2>/dev/null || { tail "$OUT/worker.log"; exit 1; }
    sleep 0.1
done

last=0
rss() {     # label n prompt_len max_tokens
    local kb mb
    kb=$(awk '/VmRSS/ {print $2}' "/proc/$wpid/status")
    mb=$((kb / 1024))
    printf '%-8s %4s %6s %6s %7d MB %+6d\n' "$1" "$2" "$3" "$4" "$mb" \
        $((mb - last))
    last=$mb
}

run() {     # label n prompt_len max_tokens
    python3 - "$2" "$3" "$4" "${VOCAB:-151000}" > "$OUT/req.jsonl" <<'PY'
import json, sys
n, plen, mt, vocab = map(int, sys.argv[1:])
for i in range(n):
    print(json.dumps({"request_id": f"r{i}",
        "token_ids": [(i * 7919 + j * 104729) % vocab for j in range(plen)],
        "sampling_params": {"max_tokens": mt, "temperature": 1.0,
                            "top_k": 1000, "seed": i, "ignore_eos": True},
        "return_sampling_mask": True, "sampling_logprobs_mode": "support"}))
PY
    "$B/maskserve-cli" --shm "$shm" --requests "$OUT/req.jsonl" --summary \
        --timeout 300 > "$OUT/summary_$1.json"
    rss "$1" "$2" "$3" "$4"
}

printf '%-8s %4s %6s %6s %10s %7s\n' workload reqs prompt new RSS change
rss start - - -
for round in $(seq 1 "${ROUNDS:-2}"); do
    run "b1s.$round" 1 16 16
    run "b1l.$round" 1 128 900
    run "b8.$round" 8 128 128
    run "b64.$round" 64 128 128
    run "b256.$round" 256 128 256
    run "b37.$round" 37 300 200
done
kill -TERM $wpid
wait $wpid || true
