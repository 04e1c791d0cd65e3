#!/bin/bash
# gpu_worker.sh: on a machine with an NVIDIA GPU, check and measure the
# worker on the CUDA backend, without nginx:
#
#   1. build with the CUDA backend (yajl from Debian packages in .debs/
#      when the system has none: apt-get download libyajl2 libyajl-dev);
#   2. the worker's end-to-end test (t/05-worker-cli.t) on --backend cuda,
#      with the device sampler and with the CPU sampler;
#   3. the CUDA backend against the CPU backend (kernels/check.sh -q);
#   4. mask cost: the dummy qwen3-8b (bf16) at 256 concurrent requests,
#      mask off / selected / support at top_k 20, 1000 and 8192, through
#      maskserve-cli --summary (every row checked), tokens/s side by side,
#      for the device sampler and the CPU sampler (SAMPLERS="auto cpu");
#   5. the two samplers' rows for the same seeded requests, compared.
#
# Results go to $OUT (or build-gpu/out) as gpu_worker.log and a table.

set -eu -o pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-build-gpu/out}
B=${B:-build-gpu}
mkdir -p "$OUT"
log=$OUT/gpu_worker.log
exec > >(tee "$log") 2>&1

. bench/gpu_env.sh

echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
echo "== build"
make -j"$(nproc)" B="$B" bins > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }

echo "== t/05-worker-cli.t on the CUDA backend (device sampler, then CPU sampler)"
MSV_BUILD=$PWD/$B MSV_BACKEND=cuda MSV_SAMPLER=auto prove t/05-worker-cli.t
MSV_BUILD=$PWD/$B MSV_BACKEND=cuda MSV_SAMPLER=cpu prove t/05-worker-cli.t

if [ "${CHECK_BACKEND:-1}" = 1 ]; then
    echo "== kernels/check.sh -q"
    B=$B sh kernels/check.sh -q -n 2>&1 | tail -25
fi

NEW=${NEW:-128}
reqs() {   # mask topk
    python3 - "$1" "$2" "$NEW" <<'EOF'
import json, sys
mask, topk, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(256):
    r = {"request_id": f"b{i}", "token_ids": [(i * 7919 + j * 104729) % 151000 for j in range(128)],
         "sampling_params": {"max_tokens": new, "temperature": 1.0, "top_k": topk,
                             "seed": i, "ignore_eos": True}}
    if mask != "off":
        r["return_sampling_mask"] = True
        r["sampling_logprobs_mode"] = mask
    print(json.dumps(r))
EOF
}

start_worker() {   # sampler
    shm=msv-gpu-$$-$1
    "$B/maskserve-worker" --dummy qwen3-8b --backend cuda --sampler "$1" \
        --shm "$shm" --max-num-seqs 256 --max-model-len 1024 \
        --ring-bytes 256M --seed 1 2> "$OUT/worker8b-$1.log" &
    wpid=$!
    for _ in $(seq 1 3000); do
        grep -q "ready: region" "$OUT/worker8b-$1.log" && break
        kill -0 $wpid 2>/dev/null || { tail "$OUT/worker8b-$1.log"; exit 1; }
        sleep 0.1
    done
    grep -E "backend ready|sampler:" "$OUT/worker8b-$1.log"
}

echo "== dummy qwen3-8b, 256 concurrent requests, 128 prompt + $NEW new tokens"
printf '\n%-8s %-10s %6s %12s %14s %10s\n' sampler mode top_k tokens/s \
    mask_ids/tok seconds | tee "$OUT/table.txt"
trap 'kill $wpid 2>/dev/null || true' EXIT
for sampler in ${SAMPLERS:-auto cpu}; do
    start_worker "$sampler"
    for topk in ${TOPKS:-20 1000 8192}; do
        for mode in off selected support; do
            reqs $mode $topk > "$OUT/req.jsonl"
            s=$("$B/maskserve-cli" --shm "$shm" --requests "$OUT/req.jsonl" \
                    --summary --timeout 300)
            python3 - "$sampler" "$mode" "$topk" "$s" <<'EOF' | tee -a "$OUT/table.txt"
import json, sys
sm, m, k, s = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
print("%-8s %-10s %6s %12.1f %14.1f %10.2f" % (sm, m, k, s["tokens_per_s"],
      s["mask_ids"] / max(s["tokens"], 1), s["seconds"]))
EOF
        done
    done
    # the same seeded requests, every row kept, for the comparison below
    reqs support 1000 > "$OUT/req.jsonl"
    "$B/maskserve-cli" --shm "$shm" --requests "$OUT/req.jsonl" \
        --timeout 300 > "$OUT/rows-$sampler.jsonl"
    grep -E "VmRSS|VmHWM" /proc/$wpid/status | tr '\n' ' '; echo
    kill -TERM $wpid
    wait $wpid || true
done

if [ -f "$OUT/rows-auto.jsonl" ] && [ -f "$OUT/rows-cpu.jsonl" ]; then
    echo "== device sampler vs CPU sampler on the same seeded requests"
    python3 - "$OUT/rows-auto.jsonl" "$OUT/rows-cpu.jsonl" <<'EOF'
import json, sys
def load(f):
    rows = {}
    for line in open(f):
        r = json.loads(line)
        if "pos" in r:
            rows[(r["request_id"], r["pos"])] = r
    return rows
a, b = load(sys.argv[1]), load(sys.argv[2])
same = sum(1 for k in a if k in b and all(a[k].get(f) == b[k].get(f)
           for f in ("token", "ids", "finish")))
lp = max((abs(x - y) for k in a if k in b
          for x, y in zip(a[k].get("lps", []), b[k].get("lps", []))), default=0)
print(f"rows {len(a)} / {len(b)}; identical token, support and finish: {same}; "
      f"largest logprob difference {lp:.3g}")
EOF
fi
