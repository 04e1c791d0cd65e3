#!/bin/bash
# gpu_sampler.sh: on a machine with an NVIDIA GPU, check and time the GPU
# sampler (kernels/sampling.cu):
#
#   1. build (yajl from Debian packages in .debs/ when the system has none:
#      apt-get download libyajl2 libyajl-dev);
#   2. t/c/test_gpu_sampler: GPU sampler vs the CPU sampler on the same
#      logits (random and adversarial rows, every truncation, penalties
#      over several steps, every mask mode), V = 151,936 and odd sizes,
#      with the streaming kernel (its cluster size chosen per run, then
#      forced to 4 blocks a row, MSV_CUDA_SAMPLER_NC=4, so that every kind
#      of row takes that path too), with top_k and top_p by radix rounds only
#      (MSV_CUDA_SAMPLER_SORT=0) and with the resident kernel alone
#      (MSV_CUDA_SAMPLER_STREAM=0);
#   3. the same under compute-sanitizer when it is there: memcheck, and
#      racecheck (shared memory) and synccheck (barriers) on 4 blocks a
#      row;
#   4. bench/gpu_sampler: kernels and copy per step, batch 64 and 256, on
#      logits that change every step (the default, the cluster size
#      forced to 8 blocks a row, and the cuts by radix rounds only,
#      alternated twice), on the same logits
#      every step (-s 1) and with the resident kernel alone, beside
#      bench/gpu_sampler_torch.py (the PyTorch way) in the same run.
#
# Results go to $OUT (or build-gpu/out): gpu_sampler.log and the tables.
# EXTRA=0 leaves out the runs that do not compare the cluster sizes (the
# resident kernel alone, in the test, under the sanitizer and timed, and
# the same-logits timing), for a call that also runs the worker.
# Each test run is stopped after TEST_TIMEOUT seconds (default 300; a hang
# on a barrier fails the run instead of holding the machine), each
# sanitizer run after SAN_TIMEOUT (default 120).  RACE= (empty) leaves
# out racecheck and synccheck.

set -eu -o pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-build-gpu/out}
B=${B:-build-gpu}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_sampler.log") 2>&1

. bench/gpu_env.sh

echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
echo "== build"
make -j"$(nproc)" B="$B" "$B/t/test_gpu_sampler" "$B/bench/gpu_sampler" \
    > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }

# each switch's test runs even when one before it failed, so that the
# failures name the path at fault; the script stops after them
fail=0
T=${TEST_TIMEOUT:-300}
ST=${SAN_TIMEOUT:-120}
echo "== GPU sampler vs CPU sampler"
timeout "$T" "$B/t/test_gpu_sampler" | tee "$OUT/test_gpu_sampler.tap" | grep -v '^ok' \
    || fail=1
grep 'by path\|on a sort' "$OUT/test_gpu_sampler.tap" || true
echo "== the same, 4 blocks a row"
MSV_CUDA_SAMPLER_NC=4 timeout "$T" "$B/t/test_gpu_sampler" \
    | tee "$OUT/test_gpu_sampler_nc4.tap" | grep -v '^ok' || fail=1
grep 'by path\|on a sort' "$OUT/test_gpu_sampler_nc4.tap" || true
echo "== the same, top_k and top_p by radix rounds only"
MSV_CUDA_SAMPLER_SORT=0 timeout "$T" "$B/t/test_gpu_sampler" \
    | tee "$OUT/test_gpu_sampler_radix.tap" | grep -v '^ok' || fail=1
if [ "${EXTRA:-1}" = 1 ]; then
    echo "== the same, the resident kernel alone"
    MSV_CUDA_SAMPLER_STREAM=0 timeout "$T" "$B/t/test_gpu_sampler" \
        | tee "$OUT/test_gpu_sampler_resident.tap" | grep -v '^ok' || fail=1
fi
if [ "$fail" != 0 ]; then
    echo "gpu_sampler.sh: a test failed (above); no timings"
    exit 1
fi

if command -v compute-sanitizer >/dev/null && [ "${SANITIZE:-1}" = 1 ]; then
    if [ "${EXTRA:-1}" = 1 ]; then
        echo "== compute-sanitizer (memcheck)"
        MSV_GS_QUICK=1 timeout "$ST" compute-sanitizer --tool memcheck \
            --leak-check no "$B/t/test_gpu_sampler" > "$OUT/sanitizer.log" \
            2>&1 || true
        grep -E "ERROR SUMMARY|^not ok" "$OUT/sanitizer.log" | head || true
    fi
    # racecheck and synccheck are slow: V = 4,099 alone (MSV_GS_QUICK=2)
    for tool in memcheck ${RACE-racecheck synccheck}; do
        echo "== compute-sanitizer ($tool), 4 blocks a row"
        q=2
        opt=
        if [ "$tool" = memcheck ]; then
            q=1
            opt="--leak-check no"
        fi
        MSV_GS_QUICK=$q MSV_CUDA_SAMPLER_NC=4 timeout "$ST" \
            compute-sanitizer --tool "$tool" $opt "$B/t/test_gpu_sampler" \
            > "$OUT/sanitizer_${tool}_nc4.log" 2>&1 || echo "(exit $?)"
        grep -E "ERROR SUMMARY|^not ok|RACECHECK SUMMARY" \
            "$OUT/sanitizer_${tool}_nc4.log" | head || true
    done
fi

for k in 1 2; do
    echo "== timing: GPU sampler, logits that change every step ($k)"
    "$B/bench/gpu_sampler" -r "${REPS:-15}" ${GS_ARGS:-} \
        | tee "$OUT/gpu_sampler_$k.txt" | grep '^|\|clusters'
    echo "== the same, 8 blocks a row ($k)"
    MSV_CUDA_SAMPLER_NC=8 "$B/bench/gpu_sampler" -r "${REPS:-15}" \
        ${GS_ARGS:-} | tee "$OUT/gpu_sampler_nc8_$k.txt" | grep '^|'
    echo "== the same, the cuts by radix rounds only ($k)"
    MSV_CUDA_SAMPLER_SORT=0 "$B/bench/gpu_sampler" -r "${REPS:-15}" \
        ${GS_ARGS:-} | tee "$OUT/gpu_sampler_radix_$k.txt" | grep '^|'
done
if [ "${EXTRA:-1}" = 1 ]; then
    echo "== timing: GPU sampler, the same logits every step"
    "$B/bench/gpu_sampler" -r "${REPS:-15}" -s 1 \
        | tee "$OUT/gpu_sampler_same.txt" | grep '^|'
    echo "== timing: the resident kernel alone"
    MSV_CUDA_SAMPLER_STREAM=0 "$B/bench/gpu_sampler" -r "${REPS:-15}" \
        | tee "$OUT/gpu_sampler_resident.txt" | grep '^|'
fi

echo "== timing: PyTorch"
python3 bench/gpu_sampler_torch.py --repeats "${REPS:-15}" \
    | tee "$OUT/gpu_sampler_torch.txt" | tail -40
