#!/usr/bin/env python3
"""e2e_charts.py: the charts of bench/gpu_e2e.sh from its e2e_h200.csv
(written by bench/e2e_report):

  e2e_h200_tps.png     steady tokens/s by row, a bar per mask mode
  e2e_h200_ratio.png   mask on / off by row and mode, the targets marked
  e2e_h200_stages.png  per-step stage costs (medians over the window)

  e2e_charts.py E2E_H200.CSV OUTDIR
"""

import csv
import os
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

MODES = ["off", "selected", "support", "selected-packed", "support-packed"]
COLORS = ["#444444", "#1f77b4", "#d62728", "#7fb2e5", "#f29b9b"]


def num(s):
    try:
        return float(s)
    except ValueError:
        return float("nan")


def short(label):
    kind, batch, mt, k, p, stream = label.split(":")
    s = f"{kind} b{batch} k{k}"
    if num(p) != 1:
        s += f" p{p}"
    if stream == "1":
        s += " sse"
    if kind != "wave" or mt != "512":
        s += f" {mt}t"
    return s


def main():
    path, out = sys.argv[1], sys.argv[2]
    rows = list(csv.DictReader(open(path)))
    labels = []
    for r in rows:
        if r["row"] not in labels:
            labels.append(r["row"])
    by = {(r["row"], r["mode"]): r for r in rows}
    x = np.arange(len(labels))
    w = 0.8 / len(MODES)

    # tokens/s (steady window; the client's for rows without one)
    fig, ax = plt.subplots(figsize=(max(8, len(labels) * 1.1), 5))
    for i, m in enumerate(MODES):
        v = [num(by[(l, m)]["steady_tok_s"]) if (l, m) in by else np.nan
             for l in labels]
        ax.bar(x + (i - 2) * w, v, w, label=m, color=COLORS[i])
    ax.axhline(21000, color="green", ls="--", lw=1,
               label="target, mask off at batch 256")
    ax.set_xticks(x, [short(l) for l in labels], rotation=35, ha="right")
    ax.set_ylabel("decode tokens/s (steady window, step log)")
    ax.set_title("End to end through nginx: tokens/s by row and mask mode")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "e2e_h200_tps.png"), dpi=120)
    plt.close(fig)

    # ratio on / off against the targets
    fig, ax = plt.subplots(figsize=(max(8, len(labels) * 1.1), 5))
    for i, m in enumerate(MODES[1:], 1):
        v = [num(by[(l, m)]["ratio"]) if (l, m) in by else np.nan
             for l in labels]
        t = [num(by[(l, m)]["target"]) if (l, m) in by else np.nan
             for l in labels]
        ax.bar(x + (i - 2.5) * w, v, w, label=m, color=COLORS[i])
        ax.scatter(x + (i - 2.5) * w, t, marker="_", s=200, color="green",
                   zorder=3, label="target" if i == 1 else None)
    ax.axhline(1.0, color="black", lw=0.5)
    ax.set_ylim(0, 1.15)
    ax.set_xticks(x, [short(l) for l in labels], rotation=35, ha="right")
    ax.set_ylabel("mask on / mask off (same run)")
    ax.set_title("Cost of returning masks: ratio to mask off, targets as "
                 "green marks")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "e2e_h200_ratio.png"), dpi=120)
    plt.close(fig)

    # stage breakdown per step
    stages = [("fwd_ms", "GPU forward"), ("sample_ms", "sampling + capture"),
              ("ring_ms", "copy into the ring"), ("host_ms", "scheduler host"),
              ("gap_ms", "between steps")]
    keys = [(r["row"], r["mode"]) for r in rows]
    fig, ax = plt.subplots(figsize=(max(10, len(keys) * 0.35), 5))
    bottom = np.zeros(len(keys))
    for col, name in stages:
        v = np.array([num(by[k][col]) for k in keys])
        v = np.nan_to_num(v)
        ax.bar(np.arange(len(keys)), v, 0.8, bottom=bottom, label=name)
        bottom += v
    ax.set_xticks(np.arange(len(keys)),
                  [f"{short(l)} {m}" for l, m in keys], rotation=90,
                  fontsize=6)
    ax.set_ylabel("ms per step (median over the steady window)")
    ax.set_title("Where a step's time goes")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "e2e_h200_stages.png"), dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
