#!/bin/bash
# gpu_tests.sh: the whole test suite on a GPU machine, the worker on the
# CUDA backend (with the device sampler): every C test (test_gpu_sampler
# runs instead of skipping; test_backend runs its CUDA parts, with CUDA
# required) and every end-to-end test in t/ (real nginx, redis-server and
# worker; MSV_BACKEND=cuda).
#
# Like gpu_e2e.sh it needs no Debian packages installed: it unpacks
# .debs/*.deb (apt-get download nginx libhiredis0.14 libyajl2 libyajl-dev
# redis-server redis-tools liblzf1 libjemalloc2) and loads
# .debs/ngx_http_maskserve_module.so, the module built on a Debian machine
# (make module; build/nginx/src/objs/ngx_http_maskserve_module.so).
#
# TESTS names the end-to-end tests (default t/*.t).  Output: $OUT (or
# build-gpu/out)/gpu_tests.log.

set -eu -o pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-build-gpu/out}
B=${B:-build-gpu}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_tests.log") 2>&1

MSV_DEBS=all . bench/gpu_env.sh

echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader), $(nproc) cores"
make -j"$(nproc)" B="$B" bins > "$OUT/build.log" 2>&1 \
    || { tail -30 "$OUT/build.log"; exit 1; }
mkdir -p "$B/nginx/src/objs"
cp .debs/ngx_http_maskserve_module.so "$B/nginx/src/objs/"

# batch invariant: the suite checks that a request gets the same answer
# alone, in a crowd and from either of two workers
export MSV_BUILD=$PWD/$B MSV_BACKEND=cuda MSV_WORKER_ARGS=--batch-invariant
# t/c/test_backend: no usable GPU is a failure here, not a skip
export MSV_TEST_REQUIRE_CUDA=1
# the python3 first on the PATH has numpy and torch (t/50-client.t)
export MSV_PYTHON=$(command -v python3)
export MSV_NGINX=$deb/usr/sbin/nginx MSV_REDIS=$deb/usr/bin/redis-server
# the C tests of this tree (not a stale binary left in $B/t)
prove -j"${JOBS:-1}" $(ls t/c/test_*.c | sed "s|^t/c/|$B/t/|; s|\.c\$||") \
    ${TESTS:-t/*.t} || true

if [ "${CHECKS:-1}" = 1 ]; then
    echo "== GPU sampler under compute-sanitizer (memcheck)"
    MSV_GS_QUICK=1 compute-sanitizer --tool memcheck --leak-check no \
        "$B/t/test_gpu_sampler" > "$OUT/sanitizer.log" 2>&1 || true
    grep -E "ERROR SUMMARY|^not ok" "$OUT/sanitizer.log" | head
    echo "== kernels/check.sh -q -n (CUDA backend against the CPU backend)"
    B=$B sh kernels/check.sh -q -n 2>&1 | sed -n '/^# case /,$p' | tail -15
fi
