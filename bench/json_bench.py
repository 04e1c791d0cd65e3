#!/usr/bin/env python3
"""json_bench.py: the rows of bench/json_bench.c through Python's JSON.

    build/bench/json_bench --dump rows.bin
    python3 bench/json_bench.py rows.bin [seconds [repeats]]

For each row size (1, 20, 1000, 8192), formats every row's ids and every
row's float32 logprobs with json.dumps, and with orjson.dumps when orjson
is importable, and reports items per second on one core (thread CPU time,
median of `repeats` measurements of at least `seconds` each) and bytes per
item.  Python floats are doubles: json.dumps prints the shortest decimal
of the double holding the float32 (-0.7570000290870667 for -0.757f), which
is longer than the float32's own shortest decimal.  Every output is parsed
back and compared with the input before timing.
"""

import array
import json
import statistics
import struct
import sys
import time

try:
    import orjson
except ImportError:
    orjson = None


def read_rows(path):
    """Row sets written by json_bench --dump: per size, uint32 len,
    uint32 n_rows, int32 ids[len * n_rows], float32 lps[len * n_rows]."""
    sets = []
    with open(path, "rb") as f:
        data = f.read()
    off = 0
    while off < len(data):
        if off + 8 > len(data):
            sys.exit(f"json_bench.py: {path}: truncated header at {off}")
        length, n_rows = struct.unpack_from("=II", data, off)
        off += 8
        n = length * n_rows
        if length == 0 or off + 8 * n > len(data):
            sys.exit(f"json_bench.py: {path}: bad row set at {off - 8}")
        ids = array.array("i")
        ids.frombytes(data[off:off + 4 * n])
        off += 4 * n
        lps = array.array("f")
        lps.frombytes(data[off:off + 4 * n])
        off += 4 * n
        rows_ids = [ids[r * length:(r + 1) * length].tolist()
                    for r in range(n_rows)]
        rows_lps = [lps[r * length:(r + 1) * length].tolist()
                    for r in range(n_rows)]
        sets.append((length, rows_ids, rows_lps))
    if not sets:
        sys.exit(f"json_bench.py: {path}: no rows")
    return sets


def as_f32(x):
    return struct.unpack("=f", struct.pack("=f", x))[0]


def validate(name, rows, outs, floats):
    for row, out in zip(rows, outs):
        back = json.loads(out)
        if floats:
            back = [as_f32(x) for x in back]
        if back != row:
            sys.exit(f"json_bench.py: {name}: output does not give the "
                     f"input back")


def measure(dumps, rows, seconds, repeats):
    items = sum(len(r) for r in rows)
    rates = []
    for _ in range(repeats):
        iters = 0
        t0 = time.thread_time()
        while True:
            for r in rows:
                dumps(r)
            iters += 1
            dt = time.thread_time() - t0
            if dt >= seconds:
                break
        rates.append(items * iters / dt)
    return statistics.median(rates)


def main():
    if len(sys.argv) < 2 or len(sys.argv) > 4:
        sys.exit("usage: json_bench.py ROWS.bin [seconds [repeats]]")
    try:
        seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 0.2
        repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    except ValueError:
        sys.exit("json_bench.py: seconds and repeats must be numbers")
    if not 0 < seconds <= 60 or not 1 <= repeats <= 64:
        sys.exit("json_bench.py: seconds in (0, 60], repeats in 1..64")

    sets = read_rows(sys.argv[1])

    methods = [("json.dumps", lambda r: json.dumps(r, separators=(",", ":")))]
    if orjson is not None:
        methods.append(("orjson.dumps", orjson.dumps))

    print(f"# json_bench.py: python {sys.version.split()[0]}, "
          f"orjson {'%s' % orjson.__version__ if orjson else 'not installed'}"
          f", {seconds} s per measurement, median of {repeats}")

    results = []
    for length, rows_ids, rows_lps in sets:
        items = sum(len(r) for r in rows_ids)
        for name, dumps in methods:
            for kind, rows, floats in (("ids", rows_ids, False),
                                       ("f32", rows_lps, True)):
                outs = [dumps(r) for r in rows]
                validate(f"{name} {kind} L={length}", rows, outs, floats)
                nbytes = sum(len(o) for o in outs) - 2 * len(outs)
                rate = measure(dumps, rows, seconds, repeats)
                results.append((length, name, kind, rate, nbytes / items))
                print(f"# {kind} {name:13s} L={length:<5d} "
                      f"{rate / 1e6:8.2f} M items/s  "
                      f"{nbytes / items:5.2f} bytes/item", flush=True)

    print()
    print("| row L | method | ids M/s | f32 M/s | bytes/id | bytes/f32 |")
    print("|---:|---|---:|---:|---:|---:|")
    for length, _, _ in sets:
        for name, _ in methods:
            r = {k: (rate, b) for (l, n, k, rate, b) in results
                 if l == length and n == name}
            print(f"| {length} | {name} | {r['ids'][0] / 1e6:.2f} | "
                  f"{r['f32'][0] / 1e6:.2f} | {r['ids'][1]:.2f} | "
                  f"{r['f32'][1]:.2f} |")
    print("(M items/s on one core, thread CPU time; bytes per item include "
          "the separator)")


if __name__ == "__main__":
    main()
