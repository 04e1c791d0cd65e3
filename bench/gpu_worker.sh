#!/bin/bash
# gpu_worker.sh: on a machine with an NVIDIA GPU, check and measure the
# worker on the CUDA backend, without nginx:
#
#   1. build with the CUDA backend (yajl from Debian packages in .debs/
#      when the system has none: apt-get download libyajl2 libyajl-dev);
#   2. the worker's end-to-end test (t/05-worker-cli.t) on --backend cuda;
#   3. the CUDA backend against the CPU backend (kernels/check.sh -q);
#   4. mask cost: the dummy qwen3-8b (bf16) at 256 concurrent requests,
#      mask off / selected / support at top_k 20 and 1000, through
#      maskserve-cli --summary (every row checked), tokens/s side by side.
#
# Results go to $OUT (or build-gpu/out) as gpu_worker.log and a table.

set -eu -o pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-build-gpu/out}
B=${B:-build-gpu}
mkdir -p "$OUT"
log=$OUT/gpu_worker.log
exec > >(tee "$log") 2>&1

if ! printf '#include <yajl/yajl_tree.h>\n' | cc -E -x c - >/dev/null 2>&1
then
    deb=/tmp/msv-deb
    mkdir -p "$deb"
    for f in .debs/libyajl*.deb; do dpkg -x "$f" "$deb"; done
    export CPPFLAGS="-I$deb/usr/include"
    export LDFLAGS="-L$deb/usr/lib/x86_64-linux-gnu"
    export LD_LIBRARY_PATH="$deb/usr/lib/x86_64-linux-gnu"
fi

echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
echo "== build"
make -j"$(nproc)" B="$B" bins > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }

echo "== t/05-worker-cli.t on the CUDA backend"
MSV_BUILD=$PWD/$B MSV_BACKEND=cuda prove -v t/05-worker-cli.t

echo "== kernels/check.sh -q"
B=$B sh kernels/check.sh -q -n 2>&1 | tail -25

echo "== mask cost, dummy qwen3-8b, 256 concurrent requests"
shm=msv-gpu-$$
"$B/maskserve-worker" --dummy qwen3-8b --backend cuda --shm "$shm" \
    --max-num-seqs 256 --max-model-len 1024 --ring-bytes 256M --seed 1 \
    2> "$OUT/worker8b.log" &
wpid=$!
trap 'kill $wpid 2>/dev/null || true' EXIT
for _ in $(seq 1 3000); do
    grep -q "ready: region" "$OUT/worker8b.log" && break
    kill -0 $wpid 2>/dev/null || { tail "$OUT/worker8b.log"; exit 1; }
    sleep 0.1
done
grep -E "tensors loaded|backend ready" "$OUT/worker8b.log"

reqs() {   # mask topk
    python3 - "$1" "$2" <<'EOF'
import json, sys
mask, topk = sys.argv[1], int(sys.argv[2])
for i in range(256):
    r = {"request_id": f"b{i}", "token_ids": [(i * 7919 + j * 104729) % 151000 for j in range(64)],
         "sampling_params": {"max_tokens": 64, "temperature": 1.0, "top_k": topk,
                             "seed": i, "ignore_eos": True}}
    if mask != "off":
        r["return_sampling_mask"] = True
        r["sampling_logprobs_mode"] = mask
    print(json.dumps(r))
EOF
}

printf '\n%-10s %6s %12s %14s %10s\n' mode top_k tokens/s mask_ids/tok seconds \
    | tee "$OUT/table.txt"
for topk in 20 1000; do
    for rep in 1 2; do
        for mode in off selected support; do
            reqs $mode $topk > "$OUT/req.jsonl"
            s=$("$B/maskserve-cli" --shm "$shm" --requests "$OUT/req.jsonl" \
                    --summary --timeout 300)
            python3 - "$mode" "$topk" "$s" <<'EOF' | tee -a "$OUT/table.txt"
import json, sys
m, k, s = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
print("%-10s %6s %12.1f %14.1f %10.2f" % (m, k, s["tokens_per_s"],
      s["mask_ids"] / max(s["tokens"], 1), s["seconds"]))
EOF
        done
    done
done

kill -TERM $wpid
wait $wpid || true
tail -3 "$OUT/worker8b.log"
