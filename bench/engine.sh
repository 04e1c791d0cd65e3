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
#      without its graph, with events between launches), and from the
#      worker's step log the time between forwards: the device sampler's
#      time and the host's work after it (rows into the ring, the
#      scheduler), which the device waits for;
#   5. the worker's resident memory after start and after the runs;
#   6. batch invariance: 32 seeded requests (temperature 1, top_k 50,
#      support masks with logprobs) alone, then the same 32 among 224
#      others with prompts up to 1500 tokens (prefill chunks mixed with
#      decode); every row compared bit for bit, in the default mode and
#      with --batch-invariant, whose decode rate at batch 1, 64 and 256
#      is measured beside, with the lengths of step 2 (the same mean
#      context); its per-shape algorithm lines, from the worker log, go
#      to $OUT/invariant_algos.txt;
#   7. (case pf, not in the default CASES) batch 1 at each weight
#      prefetch of PF_LIST (MSV_CUDA_PREFETCH, megabytes; default
#      "0 16 32 0 16 32"), a worker started for each, in the default mode
#      and with --batch-invariant.
#
#   bash bench/engine.sh            (B: build dir, default build-gpu;
#                                    OUT: results, default $B/engine;
#                                    CASES: a subset of "b1 b64 b256
#                                    prefill inv pf", default all but
#                                    pf;
#                                    MSV_CUDA_* reach the worker)
# Needs a build with the CUDA backend (make B=$B bins) and python3.

set -eu -o pipefail
cd "$(dirname "$0")/.."

B=${B:-build-gpu}
OUT=${OUT:-$B/engine}
PRECISION=${PRECISION:-bf16}
CASES=${CASES:-b1 b64 b256 prefill inv}
mkdir -p "$OUT"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}

echo "== engine.sh $(date -u +%FT%TZ) precision $PRECISION"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true

"$NVCC" -O2 -gencode arch=compute_90,code=sm_90 -Ishm -Iworker \
    -o "$B/bench/engine_floor" bench/engine_floor.cu "$B/libmsv_worker.a" \
    ${LDFLAGS:-} -lcublasLt -lcublas -lyajl -lm
"$B/bench/engine_floor" qwen3-8b 384 1 64 256 | tee "$OUT/floor.txt"

steps=$OUT/steps.txt
: > "$steps"
slog=$OUT/steplog.txt
shm=msv-engine-$$
wpid=

start() {   # extra worker flags
    MSV_CUDA_TIMING=$steps MSV_CUDA_TIMING_DETAIL=16 \
    "$B/maskserve-worker" --dummy qwen3-8b --backend cuda \
        --precision "$PRECISION" "$@" \
        --shm "$shm" --max-num-seqs 256 --max-model-len 8448 \
        --kv-tokens 262144 --max-num-batched-tokens 8192 --ring-bytes 256M \
        --seed 1 --step-log "$slog" 2> "$OUT/worker.log" &
    wpid=$!
    for _ in $(seq 1 3000); do
        grep -q "ready: region" "$OUT/worker.log" && break
        kill -0 $wpid 2>/dev/null || { tail "$OUT/worker.log"; exit 1; }
        sleep 0.1
    done
    grep -E "tensors loaded|backend ready|released" "$OUT/worker.log" || true
}

stop() {
    kill -TERM $wpid
    wait $wpid || true
    cat "$OUT/worker.log" >> "$OUT/workers.log"
}

trap 'kill $wpid 2>/dev/null || true' EXIT
start
echo "rss_start_kb $(awk '/VmRSS/ {print $2}' /proc/$wpid/status)" \
    | tee "$OUT/rss.txt"

reqs() {    # n prompt_len max_tokens [salt: prompts no earlier run had]
    python3 - "$1" "$2" "$3" "${4:-0}" <<'PY'
import json, sys
n, plen, mt, salt = map(int, sys.argv[1:])
for i in range(n):
    print(json.dumps({"request_id": f"e{i}",
        "token_ids": [(i * 7919 + j * 104729 + salt * 7) % 151000
                      for j in range(plen)],
        "sampling_params": {"max_tokens": mt, "temperature": 0.0,
                            "ignore_eos": True}}))
PY
}

run() {     # label n prompt_len max_tokens [salt]
    local from lfrom
    from=$(wc -l < "$steps")
    lfrom=$(cat "$slog" 2>/dev/null | wc -l)
    reqs "$2" "$3" "$4" "${5:-0}" > "$OUT/req.jsonl"
    "$B/maskserve-cli" --shm "$shm" --requests "$OUT/req.jsonl" --summary \
        --timeout 300 > "$OUT/summary_$1.json"
    sleep 0.3                   # the worker flushes its step log when idle
    tail -n +"$((from + 1))" "$steps" > "$OUT/steps_$1.txt"
    tail -n +"$((lfrom + 1))" "$slog" > "$OUT/steplog_$1.txt"
    echo "$1: $(cat "$OUT/summary_$1.json")"
}

# the invariance workload: inv.jsonl (32 requests) and mix.jsonl (the
# same 32 at positions 100.. among 224 others)
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
def req(rid, plen, seed, mt):
    return json.dumps({"request_id": rid,
        "token_ids": [(seed * 7919 + j * 104729) % 151000 for j in range(plen)],
        "sampling_params": {"max_tokens": mt, "temperature": 1.0,
                            "top_k": 50, "seed": seed, "ignore_eos": True},
        "return_sampling_mask": True, "sampling_logprobs_mode": "support"})
inv = [req(f"inv{i}", 37 + 5 * i, 1000 + i, 64) for i in range(32)]
mix = [req(f"mix{i}", 50 + (i * 337) % 1450, 5000 + i, 64) for i in range(224)]
open(os.path.join(out, "inv.jsonl"), "w").write("\n".join(inv) + "\n")
open(os.path.join(out, "mix.jsonl"), "w").write(
    "\n".join(mix[:100] + inv + mix[100:]) + "\n")
PY

inv() {     # label
    "$B/maskserve-cli" --shm "$shm" --requests "$OUT/inv.jsonl" \
        --timeout 300 > "$OUT/rows_$1_alone.jsonl"
    "$B/maskserve-cli" --shm "$shm" --requests "$OUT/mix.jsonl" \
        --timeout 300 > "$OUT/rows_$1_mixed.jsonl"
    python3 - "$OUT/rows_$1_alone.jsonl" "$OUT/rows_$1_mixed.jsonl" \
        "$1" <<'PY' | tee -a "$OUT/invariance.txt"
import json, sys
def rows(path):
    r = {}
    for line in open(path):
        j = json.loads(line)
        if not j["request_id"].startswith("inv") or j.get("done"):
            continue
        key = (j["request_id"], j["pos"])
        r[key] = (j["token"], j["logprob"], j.get("ids"), j.get("lps"))
    return r
a, m = rows(sys.argv[1]), rows(sys.argv[2])
same = sum(1 for k in a if m.get(k) == a[k])
tok = sum(1 for k in a if k in m and m[k][0] == a[k][0])
print("invariance %-8s %5d rows alone, %5d in the mix, %5d identical "
      "(token, logprob, support ids and logprobs), %5d same token" % (
      sys.argv[3], len(a), sum(1 for k in m), same, tok))
PY
}

has() { case " $CASES " in *" $1 "*) return 0 ;; esac; return 1; }

run warm 8 128 16
has b1 && run b1 1 128 512
has b64 && run b64 64 128 512
has b256 && run b256 256 128 512
# prefill: prompts of their own, so that no page comes from the prefix
# cache (the decode runs' prompts are the same as each other's)
has prefill && run p256x128 256 128 1 1
has prefill && run p1x8192 1 8192 1 2
echo "rss_end_kb $(awk '/VmRSS/ {print $2}' /proc/$wpid/status)" \
    | tee -a "$OUT/rss.txt"
: > "$OUT/invariance.txt"
has inv && inv default
stop

if has inv; then
    start --batch-invariant
    grep "batch invariant:" "$OUT/worker.log" | tee "$OUT/invariant_algos.txt"
    inv invariant
    run ib1 1 128 512
    run ib64 64 128 512
    run ib256 256 128 512
    stop
fi

if has pf; then
    k=0
    for v in ${PF_LIST:-0 16 32 0 16 32}; do
        k=$((k + 1))
        MSV_CUDA_PREFETCH=$v start
        run "pf${k}_$v" 1 128 512
        stop
        MSV_CUDA_PREFETCH=$v start --batch-invariant
        run "ipf${k}_$v" 1 128 512
        stop
    done
fi
trap - EXIT

python3 - "$OUT" <<'PY' | tee "$OUT/table.txt"
import os, statistics as st, sys
out = sys.argv[1]
def steps(label):
    rows = []
    path = os.path.join(out, f"steps_{label}.txt")
    if not os.path.exists(path):       # a case CASES left out
        return rows
    for line in open(path):
        f = line.split()
        rows.append({f[i]: float(f[i + 1]) for i in range(0, len(f) - 1, 2)})
    return rows
def steady(label, b):
    """the plain steps with all b sequences decoding, their median wall
    and gap ms (None: no such step)"""
    plain = [x for x in steps(label) if x["seqs"] == b and x["tokens"] == b
             and x["detail"] == 0]
    if not plain:
        return None
    return (plain, st.median(x["wall_ms"] for x in plain),
            st.median(x["gap_ms"] for x in plain[1:] or plain))
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
for lab, b in (("b1", 1), ("b64", 64), ("b256", 256), ("ib1", 1),
               ("ib64", 64), ("ib256", 256)):
    sd = steady(lab, b)
    if sd is None:
        print("%-6s no steady steps" % lab)
        continue
    plain, wall, gap = sd
    fm, ft = floor.get(b, (float("nan"), float("nan")))
    print("%-6s %10.1f %10.1f %9.3f %9.3f %8.2f %8.3f %10.1f %7.2f" % (lab,
          b / wall * 1e3, b / (wall + gap) * 1e3, wall, gap,
          st.mean(x["graph"] for x in plain), fm, ft, fm / wall))
# the pf case's runs, pf<k>_<MB> then ipf<k>_<MB>, in k order
pf = sorted((f[6:-4] for f in os.listdir(out)
             if f.startswith("steps_") and "pf" in f and f.endswith(".txt")),
            key=lambda x: (x[0] == "i", int(x.split("_")[0].lstrip("ipf"))))
if pf:
    print()
    print("%-12s %6s %9s %9s %9s   (batch 1 by MSV_CUDA_PREFETCH MB; "
          "i: --batch-invariant)" % ("run", "MB", "fwd_tok/s", "fwd_ms",
                                     "gap_ms"))
for lab in pf:
    sd = steady(lab, 1)
    if sd is None:
        print("%-12s no steady steps" % lab)
        continue
    _, wall, gap = sd
    print("%-12s %6s %9.1f %9.3f %9.3f" % (lab, lab.split("_")[1],
          1 / wall * 1e3, wall, gap))
print()
print("%-6s %9s %9s %9s %9s %9s %9s   (detail steps, median ms)" % ("batch",
      "gpu", "gemm", "attn", "other", "copy", "host"))
for lab, b in (("b1", 1), ("b64", 64), ("b256", 256), ("ib1", 1),
               ("ib64", 64), ("ib256", 256)):
    d = [x for x in steps(lab) if x["seqs"] == b and x["tokens"] == b
         and x["detail"] == 1]
    if d:
        m = lambda k: st.median(x[k] for x in d)
        print("%-6s %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f" % (lab, m("gpu_ms"),
              m("gemm_ms"), m("attn_ms"), m("other_ms"), m("copy_ms"),
              m("host_ms")))
print()
print("%-6s %9s %9s %9s %9s   (other kernels of the detail steps, median ms)"
      % ("batch", "norm", "rope", "silu", "embed"))
for lab, b in (("b1", 1), ("b64", 64), ("b256", 256), ("ib1", 1),
               ("ib64", 64), ("ib256", 256)):
    d = [x for x in steps(lab) if x["seqs"] == b and x["tokens"] == b
         and x["detail"] == 1 and "norm_ms" in x]
    if d:
        m = lambda k: st.median(x[k] for x in d)
        print("%-6s %9.3f %9.3f %9.3f %9.3f" % (lab, m("norm_ms"),
              m("rope_ms"), m("silu_ms"), m("embed_ms")))
print()
print("%-6s %9s %9s %9s %9s %9s %9s   (worker step log, steady steps, "
      "median us)" % ("batch", "step", "fwd", "sample", "ring", "host",
                      "flush"))
for lab, b in (("b1", 1), ("b64", 64), ("b256", 256), ("ib1", 1),
               ("ib64", 64), ("ib256", 256)):
    path = os.path.join(out, f"steplog_{lab}.txt")
    if not os.path.exists(path):
        continue
    d = []
    for line in open(path):
        f = line.split()
        x = {f[i]: float(f[i + 1]) for i in range(0, len(f) - 1, 2)}
        if x.get("decode") == b and x.get("prefill") == 0 \
           and x.get("seqs") == b:
            d.append(x)
    if d:
        m = lambda k: st.median(x[k] for x in d) / 1e3
        print("%-6s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f" % (lab,
              st.median((x["t1_ns"] - x["t0_ns"]) for x in d) / 1e3,
              m("fwd_ns"), m("sample_ns"), m("ring_ns"), m("host_ns"),
              m("flush_ns")))
print("(step: the scheduler's step; fwd: the forward's launch and the wait "
      "for its end, the flush (rows of the step before) running meanwhile; "
      "sample: the device sampler's own time; ring + host: the host's work "
      "after it, the device idle)")
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
print()
print(open(os.path.join(out, "invariance.txt")).read().rstrip())
PY
