#!/bin/bash
# engine_gpu.sh: everything the CUDA engine needs checked and measured on
# a GPU machine, in one run, each part under its own time limit:
#
#   1. build with the CUDA backend (sm_90);
#   2. kernels/check.sh -q -n, the backend suite t/c/test_backend with
#      CUDA required: every kernel against its CPU twin (both KV types,
#      serial and split attention bit-identical), the interface, the whole
#      model CUDA vs CPU in both precisions, the fixtures on the CPU and
#      both CUDA precisions against their Hugging Face logits;
#   3. bench/engine.sh: the decode floor and the worker's decode and
#      prefill rates (dummy qwen3-8b), then bench/kv_read_rate: the
#      attention's read ceilings (sequential, and its K/V page pattern at
#      32 and 8 warps an SM), and bench/gemv_rate: the small-batch
#      products' shapes against a sequential read of the same weights;
#   4. t/05-worker-cli.t on --backend cuda;
#   5. compute-sanitizer over the kernel checks (test_backend -k).
#
# Logs go to $OUT (default build-gpu/out): gpu.log (all of it), check.log,
# engine.log, kv_read_rate.txt, gemv_rate.txt, t05.log, sanitizer.log,
# engine.tar.gz (the per-step lines and rows).
# yajl comes from the Debian packages in .debs/ when the system has none.

set -u -o pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-build-gpu/out}
export B=${B:-build-gpu}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu.log") 2>&1
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }

. bench/gpu_env.sh

stamp "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
stamp build
make -j"$(nproc)" B="$B" bins > "$OUT/build.log" 2>&1 \
    || { tail -40 "$OUT/build.log"; exit 1; }
grep -i "warning" "$OUT/build.log" | head -20

stamp "kernels/check.sh -q -n"
JOBS=$(nproc) timeout ${CHECK_S:-90} sh kernels/check.sh -q -n \
    > "$OUT/check.log" 2>&1
echo "check.sh exit $?"
grep -c "^ok" "$OUT/check.log"
grep -E "^not ok|FAIL|passed|comparisons|error|^# skip" "$OUT/check.log" \
    | head -40
sed -n '/^# case /,/comparisons within/p' "$OUT/check.log" | head -70
grep -E "^ok .*cuda .*: \((a|b|c)\)" "$OUT/check.log" | head -24

stamp "bench/engine.sh"
OUT=$B/engine timeout ${ENGINE_S:-130} bash bench/engine.sh \
    > "$OUT/engine.log" 2>&1
echo "engine.sh exit $?"
tail -32 "$OUT/engine.log"
tar czf "$OUT/engine.tar.gz" -C "$B" engine 2>/dev/null

stamp "bench/kv_read_rate"
"${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}" \
    -O2 -gencode arch=compute_90,code=sm_90 \
    -o "$B/bench/kv_read_rate" bench/kv_read_rate.cu \
    && timeout ${READS_S:-60} "$B/bench/kv_read_rate" 32 8 \
    | tee "$OUT/kv_read_rate.txt"
echo "kv_read_rate exit $?"

stamp "bench/gemv_rate"
"${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}" \
    -O2 -gencode arch=compute_90,code=sm_90 -Ikernels -Ibench \
    -o "$B/bench/gemv_rate" bench/gemv_rate.cu kernels/cuda_common.cu \
    -lcublas \
    && timeout ${GEMV_S:-60} "$B/bench/gemv_rate" | tee "$OUT/gemv_rate.txt"
echo "gemv_rate exit $?"

stamp "t/05 on the CUDA backend"
MSV_BUILD=$PWD/$B MSV_BACKEND=cuda timeout ${T05_S:-40} \
    prove t/05-worker-cli.t > "$OUT/t05.log" 2>&1
echo "t/05 exit $?"
tail -4 "$OUT/t05.log"

stamp "compute-sanitizer on the kernel checks"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
MSV_TEST_REQUIRE_CUDA=1 timeout ${SAN_S:-40} "$CS" --error-exitcode 9 \
    "$B/t/test_backend" -k > "$OUT/sanitizer.log" 2>&1
echo "compute-sanitizer exit $?"
grep -E "ERROR SUMMARY|^not ok|comparisons|test_backend:" \
    "$OUT/sanitizer.log" | tail -4
stamp done
