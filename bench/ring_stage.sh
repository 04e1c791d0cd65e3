#!/bin/sh
# ring_stage.sh: the worker's host time between forwards at batch 256, on
# the CPU backend, two worker builds side by side.
#
#   bench/ring_stage.sh [WORKER_A [WORKER_B]]   (default: both B/maskserve-worker)
#
# Each run starts a worker (dummy `tiny`, CPU backend, one thread, one
# sampling thread, pinned to CPU 0) with --step-log, and maskserve-cli
# (pinned to CPU 1) sends SEQS requests of TOKENS tokens at once with
# --summary (every row checked: order, sampled token in its support); a
# run that fails stops the benchmark.  The builds alternate (A B, B A, ...),
# each run from a fresh copy of its binary: on a machine whose kernel
# samples page accesses (DAMON), one copy of a binary ran its row loop
# 2.5x slower than another copy of the same bytes, run after run.  Per
# run, over the steady steps (every request decoding, none prefilling):
# the median of ring_ns + flush_ns (rows into the ring) and of host_ns
# (the scheduler's own part).  Last, a table: the median over runs, and
# the median over pairs of B / A.
#
# Environment:
#   B        build directory (default build)
#   PAIRS    pairs of runs (3)
#   SEQS     requests, all running at once: --max-num-seqs (256)
#   TOKENS   max_tokens of every request (400)
#   RING     --ring-bytes (1M: small enough that the ring's pages are all
#            touched in the first steps; with the default 64M, a run of
#            13 MB of rows takes a page fault every 4 KiB of rows)
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

B=${B:-build}
PAIRS=${PAIRS:-3}
SEQS=${SEQS:-256}
TOKENS=${TOKENS:-400}
RING=${RING:-1M}

make -j2 B="$B" "$B/maskserve-worker" "$B/maskserve-cli" > /dev/null
A=${1:-$B/maskserve-worker}
Bw=${2:-$B/maskserve-worker}
cli=$B/maskserve-cli

run=$(mktemp -d "${TMPDIR:-/tmp}/msv-ring-stage.XXXXXX")
trap 'rm -rf "$run"' EXIT

# distinct prompts (nothing shared), masks of every mode
perl -e 'for my $i (0 .. $ARGV[0] - 1) {
    my $p = join ",", map { 1 + ($i * 31 + $_ * 17) % 200 } 0 .. 7 + $i % 9;
    my $m = $i % 3 == 0 ? "" : sprintf ",\"return_sampling_mask\":true,"
            . "\"sampling_logprobs_mode\":\"%s\"", $i % 3 == 1 ? "selected" : "support";
    printf "{\"request_id\":\"r%d\",\"token_ids\":[%s],\"sampling_params\":"
           . "{\"max_tokens\":%d,\"ignore_eos\":true,\"temperature\":1.0,"
           . "\"top_k\":20,\"seed\":%d}%s}\n", $i, $p, $ARGV[1], 1000 + $i, $m;
}' "$SEQS" "$TOKENS" > "$run/req.jsonl"

one() {     # binary tag
    cp "$1" "$run/worker.$2"
    shm="msv-ring-stage-$$-$2"
    taskset -c 0 "$run/worker.$2" --dummy tiny --backend cpu --shm "$shm" \
        --max-num-seqs "$SEQS" --seed 3 --threads 1 --sample-threads 1 \
        --max-model-len $((TOKENS + 64)) --ring-bytes "$RING" \
        --step-log "$run/$2.log" 2> "$run/$2.err" &
    wp=$!
    i=0
    until "$cli" --shm "$shm" --stats 2> /dev/null | grep -q '"state":"ready"'; do
        i=$((i + 1))
        [ $i -lt 200 ] || { kill $wp; cat "$run/$2.err" >&2; exit 1; }
        sleep 0.05
    done
    if ! taskset -c 1 "$cli" --shm "$shm" --requests "$run/req.jsonl" \
            --summary --timeout 300 > "$run/$2.sum"; then
        kill $wp; echo "ring_stage: run $2 failed" >&2; exit 1
    fi
    kill $wp
    wait $wp || true
    rm -f "$run/worker.$2"
}

k=1
while [ $k -le "$PAIRS" ]; do
    if [ $((k % 2)) = 1 ]; then one "$A" a$k; one "$Bw" b$k
    else one "$Bw" b$k; one "$A" a$k; fi
    k=$((k + 1))
done

perl - "$run" "$PAIRS" "$SEQS" <<'EOF'
use strict;
use warnings;
my ($dir, $pairs, $seqs) = @ARGV;
sub med { my @a = sort { $a <=> $b } @_; @a % 2 ? $a[$#a / 2] : ($a[@a / 2 - 1] + $a[@a / 2]) / 2 }
my (%ring, %host);
for my $t (map { ("a$_", "b$_") } 1 .. $pairs) {
    open my $fh, '<', "$dir/$t.log" or die "$t.log: $!";
    my (@r, @h);
    while (<$fh>) {
        my %x = split ' ';
        next unless $x{decode} == $seqs && $x{prefill} == 0 && $x{active} == $seqs;
        push @r, $x{ring_ns} + $x{flush_ns};
        push @h, $x{host_ns};
    }
    die "$t: no steady steps\n" unless @r;
    ($ring{$t}, $host{$t}) = (med(@r) / 1e3, med(@h) / 1e3);
    printf "%-3s %4d steady steps  ring %6.1f us  host %6.1f us\n", $t, scalar @r, $ring{$t}, $host{$t};
}
my @p = 1 .. $pairs;
printf "\n| build | ring_ns + flush_ns, us | host_ns, us |\n|---|---:|---:|\n";
printf "| A | %.1f | %.1f |\n", med(map { $ring{"a$_"} } @p), med(map { $host{"a$_"} } @p);
printf "| B | %.1f | %.1f |\n", med(map { $ring{"b$_"} } @p), med(map { $host{"b$_"} } @p);
printf "| B / A | %.3f | %.3f |\n", med(map { $ring{"b$_"} / $ring{"a$_"} } @p),
    med(map { $host{"b$_"} / $host{"a$_"} } @p);
EOF
