#!/bin/sh
# check.sh: build the CUDA backend and run kernels/check_backend on the
# GPU: per-kernel comparisons, the whole model against the CPU backend
# (tiny preset, each t/fixtures/* model, qwen3-0.6b), the fixtures
# against their Hugging Face logits, and decode timing for qwen3-8b.
#
#   sh kernels/check.sh [check_backend options: -n no timing, -q quick,
#                        -k kernel checks only]
#
# Environment: B (build directory, default build-cuda), JOBS (make -j,
# default 2), CC, NVCC, CUDA_HOME, and CPPFLAGS / LDFLAGS for libraries
# outside the system paths (yajl: CPPFLAGS=-I<dir> LDFLAGS=-L<dir>).
# Exit status: 0 when every comparison is within tolerance.

set -eu

cd "$(dirname "$0")/.."

B=${B:-build-cuda}
CC=${CC:-cc}
NVCC=${NVCC:-$(command -v nvcc 2>/dev/null \
               || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)}

if [ -z "$NVCC" ]; then
    echo "check.sh: nvcc not found: the CUDA backend is not built" >&2
    exit 2
fi
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}

if ! printf '#include <yajl/yajl_tree.h>\n' \
        | $CC ${CPPFLAGS:-} -E -x c - >/dev/null 2>&1; then
    echo "check.sh: yajl headers not found: install libyajl-dev, or set" \
         "CPPFLAGS=-I<dir> LDFLAGS=-L<dir>" >&2
    exit 2
fi

make -j"${JOBS:-2}" B="$B" "$B/libmsv_worker.a" "$B/libmsv_shm.a"

mkdir -p "$B/kernels"
# the host-array kernel wrappers are test code: built here, not part of
# libmsv_worker.a
"$NVCC" -O2 -g -gencode arch=compute_90,code=sm_90 -Ishm -Iworker \
    -DMSV_HAVE_CUDA=1 -c kernels/kernel_check.cu -o "$B/kernels/kernel_check.o"
$CC -std=gnu11 -O2 -g -Wall -Wextra -Wno-unused-parameter -pthread \
    ${CPPFLAGS:-} -Ishm -Iworker -Ikernels -DMSV_HAVE_CUDA=1 \
    -o "$B/kernels/check_backend" kernels/check_backend.c \
    "$B/kernels/kernel_check.o" \
    "$B/libmsv_worker.a" "$B/libmsv_shm.a" \
    ${LDFLAGS:-} -L"$CUDA_HOME/lib64" \
    -L"$CUDA_HOME/targets/x86_64-linux/lib" \
    -lcublas -lcudart -lstdc++ -Wl,-rpath,"$CUDA_HOME/lib64" \
    -lyajl -lm -lpthread -lrt

exec "$B/kernels/check_backend" -f t/fixtures "$@"
