#!/bin/bash
# engine.sh: the CUDA engine against its floor, on a machine with an
# NVIDIA GPU, through the worker (no nginx), dummy qwen3-8b (bf16):
#
#   1. the floor in the same run: bench/engine_floor (cuBLAS bf16 time of
#      one decode step's products at M = 1, 64, 256, plus the bf16 KV
#      bytes at the mean context over the measured copy rate);
#   2. decode at batch 1, 64, 256: prompt 128, 512 new tokens, ignore_eos,
#      greedy, mask off, submitted at once through maskserve-cli
#      --summary (every row checked); tokens/s from the worker's own
#      per-step timing (MSV_CUDA_TIMING), steady state = steps with every
#      request decoding;
#   3. prefill: 256 x 128 and 1 x 8192 prompts (max_tokens 1);
#   4. a per-step breakdown from CUDA events (every 16th step runs
#      without its graph, with events between launches);
#   5. the worker's resident memory after start and after the runs.
#
#   bash bench/engine.sh            (B: build dir, default build-gpu;
#                                    OUT: results, default $B/engine)
# Needs a build with the CUDA backend (make B=$B bins) and python3.

set -eu -o pipefail
cd "$(dirname "$0")/.."

B=${B:-build-gpu}
OUT=${OUT:-$B/engine}
PRECISION=${PRECISION:-bf16}
mkdir -p "$OUT"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}

echo "== engine.sh $(date -u +%FT%TZ) precision $PRECISION"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true

"$NVCC" -O2 -gencode arch=compute_90,code=sm_90 -Ishm -Iworker \
    -o "$B/bench/engine_floor" bench/engine_floor.cu "$B/libmsv_worker.a" \
    ${LDFLAGS:-} -lcublas -lyajl -lm
"$B/bench/engine_floor" qwen3-8b 384 1 64 256 | tee "$OUT/floor.txt"

steps=$OUT/steps.txt
: > "$steps"
shm=msv-engine-$$
MSV_CUDA_TIMING=$steps MSV_CUDA_TIMING_DETAIL=16 \
"$B/maskserve-worker" --dummy qwen3-8b --backend cuda --precision "$PRECISION" \
    --shm "$shm" --max-num-seqs 256 --max-model-len 8448 \
    --kv-tokens 262144 --max-num-batched-tokens 8192 --ring-bytes 256M \
    --seed 1 2> "$OUT/worker.log" &
wpid=$!
trap 'kill $wpid 2>/dev/null || true' EXIT
for _ in $(seq 1 3000); do
    grep -q "ready: region" "$OUT/worker.log" && break
    kill -0 $wpid 2>/dev/null || { tail "$OUT/worker.log"; exit 1; }
    sleep 0.1
done
grep -E "tensors loaded|backend ready|released" "$OUT/worker.log" || true
echo "rss_start_kb $(awk '/VmRSS/ {print $2}' /proc/$wpid/status)" \
    | tee "$OUT/rss.txt"

reqs() {    # n prompt_len max_tokens
    python3 - "$1" "$2" "$3" <<'PY'
import json, sys
n, plen, mt = map(int, sys.argv[1:])
for i in range(n):
    print(json.dumps({"request_id": f"e{i}",
        "token_ids": [(i * 7919 + j * 104729) % 151000 for j in range(plen)],
        "sampling_params": {"max_tokens": mt, "temperature": 0.0,
                            "ignore_eos": True}}))
PY
}

run() {     # label n prompt_len max_tokens
    local from
    from=$(wc -l < "$steps")
    reqs "$2" "$3" "$4" > "$OUT/req.jsonl"
    "$B/maskserve-cli" --shm "$shm" --requests "$OUT/req.jsonl" --summary \
        --timeout 300 > "$OUT/summary_$1.json"
    tail -n +"$((from + 1))" "$steps" > "$OUT/steps_$1.txt"
    echo "$1: $(cat "$OUT/summary_$1.json")"
}

run warm 8 128 16
run b1 1 128 512
run b64 64 128 512
run b256 256 128 512
run p256x128 256 128 1
run p1x8192 1 8192 1
echo "rss_end_kb $(awk '/VmRSS/ {print $2}' /proc/$wpid/status)" \
    | tee -a "$OUT/rss.txt"

kill -TERM $wpid
wait $wpid || true
trap - EXIT

python3 - "$OUT" <<'PY' | tee "$OUT/table.txt"
import os, statistics as st, sys
out = sys.argv[1]
def steps(label):
    rows = []
    for line in open(os.path.join(out, f"steps_{label}.txt")):
        f = line.split()
        rows.append({f[i]: float(f[i + 1]) for i in range(0, len(f) - 1, 2)})
    return rows
floor = {}
for line in open(os.path.join(out, "floor.txt")):
    f = line.split()
    if f and f[0] == "floor":
        floor[int(f[1])] = (float(f[5]), float(f[6]))
rss = dict(l.split() for l in open(os.path.join(out, "rss.txt")))
print()
print("%-6s %10s %10s %9s %9s %8s %8s %10s %7s" % ("batch", "fwd_tok/s",
      "step_tok/s", "fwd_ms", "gap_ms", "graph", "floor_ms", "floor_t/s",
      "ratio"))
for b in (1, 64, 256):
    r = [x for x in steps(f"b{b}") if x["seqs"] == b and x["tokens"] == b]
    plain = [x for x in r if x["detail"] == 0]
    if not plain:
        print("%-6d no steady steps" % b)
        continue
    wall = st.median(x["wall_ms"] for x in plain)
    gap = st.median(x["gap_ms"] for x in plain[1:] or plain)
    fm, ft = floor.get(b, (float("nan"), float("nan")))
    print("%-6d %10.1f %10.1f %9.3f %9.3f %8.2f %8.3f %10.1f %7.2f" % (b,
          b / wall * 1e3, b / (wall + gap) * 1e3, wall, gap,
          st.mean(x["graph"] for x in plain), fm, ft, fm / wall))
print()
print("%-6s %9s %9s %9s %9s %9s %9s   (detail steps, median ms)" % ("batch",
      "gpu", "gemm", "attn", "other", "copy", "host"))
for b in (1, 64, 256):
    d = [x for x in steps(f"b{b}") if x["seqs"] == b and x["tokens"] == b
         and x["detail"] == 1]
    if d:
        m = lambda k: st.median(x[k] for x in d)
        print("%-6d %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f" % (b, m("gpu_ms"),
              m("gemm_ms"), m("attn_ms"), m("other_ms"), m("copy_ms"),
              m("host_ms")))
print()
for lab in ("p256x128", "p1x8192"):
    r = [x for x in steps(lab) if x["tokens"] > x["seqs"]]
    tok = sum(x["tokens"] for x in r)
    ms = sum(x["wall_ms"] for x in r)
    print("prefill %-9s %8d tokens in %4d steps %9.1f ms %10.1f tok/s" % (
          lab, tok, len(r), ms, tok / ms * 1e3 if ms else 0))
print()
print("worker VmRSS: %.2f GB after start, %.2f GB after the runs" % (
      int(rss["rss_start_kb"]) / 2**20, int(rss["rss_end_kb"]) / 2**20))
PY
