#!/usr/bin/env python3
"""Tables and a chart of the three fresh-home runs (fresh-runs.sh): tok/s of
every row per run, the median of the three, auto's choice and estimate per
run, and auto against the best fixed strategy. Usage: summarize.py DIR."""
import json
import re
import statistics
import sys
from pathlib import Path

d = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
runs = sorted(p for p in d.glob("run[0-9].jsonl") if p.stat().st_size > 0)


def short(s):
    return "slim tree" if s.startswith("tree-no-fallback@") else s


rows = {}  # (budget MiB, strategy) -> [tok/s per run]
for i, p in enumerate(runs):
    for line in p.read_text().splitlines():
        r = json.loads(line)
        if r.get("peer"):
            continue
        key = (r["budget_bytes"] >> 20, short(r["strategy"]))
        rows.setdefault(key, [None] * len(runs))[i] = r["tok_s"]

# auto's choice and estimate in each run, from the bench log: the line
# after "auto inside B" that says what it drafts with.
choice = {}
for i, p in enumerate(runs):
    log = p.with_suffix(".log").read_text().splitlines()
    budget = None
    for line in log:
        m = re.match(r"auto inside ([\d.]+) MiB$", line.strip())
        if m:
            budget = int(float(m.group(1)))
        m = re.match(r"auto: drafting with (.+?) \(([\d.]+) tok/s expected", line)
        if m and budget is not None:
            choice[(budget, i)] = (m.group(1).replace("qwen2.5-coder-0.5b-k32768-keep", "0.5B"),
                                   float(m.group(2)))
            budget = None

budgets = sorted({b for b, _ in rows})
fixed = ["autoregressive-pipelined", "ppd", "tree@lookup", "slim tree"]
print("| budget | row | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " | median |")
print("|---|---|" + "---|" * (len(runs) + 1))
med = {}
for b in budgets:
    for s in ["auto"] + fixed:
        v = rows.get((b, s))
        if not v:
            continue
        m = statistics.median(x for x in v if x is not None)
        med[(b, s)] = m
        cells = " | ".join("—" if x is None else f"{x:.2f}" for x in v)
        print(f"| {b} MiB | {s} | {cells} | {m:.2f} |")
print()
print("| budget | auto's choice (estimate → measured) per run | best fixed (median) | auto / best (median) |")
print("|---|---|---|---|")
for b in budgets:
    per = []
    for i in range(len(runs)):
        c = choice.get((b, i))
        got = rows.get((b, "auto"), [None] * len(runs))[i]
        if c and got:
            per.append(f"{c[0]} ({c[1]:.2f} → {got:.2f}, {100 * (c[1] / got - 1):+.0f}%)")
    best = max((s for s in fixed if (b, s) in med), key=lambda s: med[(b, s)])
    print(f"| {b} MiB | {'; '.join(per)} | {best} {med[(b, best)]:.2f} | "
          f"{med[(b, 'auto')] / med[(b, best)]:.2f}x |")

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(0)
fig, axes = plt.subplots(1, len(budgets), figsize=(5 * len(budgets), 3.6), sharey=True)
for ax, b in zip(axes if len(budgets) > 1 else [axes], budgets):
    names = [s for s in ["auto"] + fixed if (b, s) in rows]
    for j, s in enumerate(names):
        v = [x for x in rows[(b, s)] if x is not None]
        ax.bar(j, med[(b, s)], color="tab:green" if s == "auto" else "tab:gray", alpha=0.7)
        ax.scatter([j] * len(v), v, color="black", s=12, zorder=3)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([n.replace("autoregressive-pipelined", "AR-pipelined") for n in names],
                       rotation=20, fontsize=8)
    ax.set_title(f"{b} MiB, cgroup v1, uncapped")
    ax.set_ylabel("tok/s (bar: median of runs, dots: each run)")
fig.suptitle("1.5B Q4_K_M, fresh ARBOR_HOME, 8 MT-Bench x 128 tokens, 3 runs")
fig.tight_layout()
fig.savefig(d / "runs.png", dpi=110)
print(f"\nchart: {d / 'runs.png'}")
