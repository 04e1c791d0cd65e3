#!/bin/sh
# check.sh: build with the CUDA backend and run the backend suite,
# t/c/test_backend, on the GPU (a missing or unusable GPU fails instead
# of skipping): every kernel against its CPU twin, the CUDA interface,
# the whole model against the CPU backend (tiny preset, each
# t/fixtures/* model, qwen3-0.6b), each fixture on every backend against
# its Hugging Face logits; then the decode timing for qwen3-8b
# (bench/forward_time).
#
#   sh kernels/check.sh [-n] [-q] [-k] [-s SEED] [-f DIR]
#     -n  no timing
#     -q  no qwen3-0.6b comparison (quicker)
#     -k  kernel checks only (no timing)
#     -s  the random inputs' seed (the suite prints it first)
#     -f  the fixtures directory (default t/fixtures)
#
# Environment: B (build directory, default build-cuda), JOBS (make -j,
# default 2), CC, NVCC, CUDA_HOME, and CPPFLAGS / LDFLAGS for libraries
# outside the system paths (yajl: CPPFLAGS=-I<dir> LDFLAGS=-L<dir>).
# Exit status: 0 when every check passes (and the timing ran cleanly).

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

if ! printf '#include <yajl/yajl_tree.h>\n' \
        | $CC ${CPPFLAGS:-} -E -x c - >/dev/null 2>&1; then
    echo "check.sh: yajl headers not found: install libyajl-dev, or set" \
         "CPPFLAGS=-I<dir> LDFLAGS=-L<dir>" >&2
    exit 2
fi

timing=1
fixtures=t/fixtures
opts=
while getopts f:knqs: o; do
    case $o in
    f) fixtures=$OPTARG ;;
    k) opts="$opts -k"; timing=0 ;;
    n) timing=0 ;;
    q) opts="$opts -q" ;;
    s) opts="$opts -s $OPTARG" ;;
    *) echo "usage: $0 [-n] [-q] [-k] [-s seed] [-f fixtures_dir]" >&2
       exit 2 ;;
    esac
done

export CC NVCC
make -j"${JOBS:-2}" B="$B" "$B/t/test_backend" "$B/bench/forward_time"

rc=0
# shellcheck disable=SC2086
MSV_TEST_REQUIRE_CUDA=1 "$B/t/test_backend" -f "$fixtures" $opts || rc=$?

if [ "$timing" = 1 ]; then
    echo
    "$B/bench/forward_time" || rc=$((rc ? rc : $?))
fi
exit $rc
