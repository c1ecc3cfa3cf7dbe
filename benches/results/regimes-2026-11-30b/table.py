#!/usr/bin/env python3
"""The regime sweep's table (tok/s per target, budget and read cap; auto's
choice and estimate from each cell's log; auto / best fixed) and one chart
per target: tok/s against the budget, a line per cap (auto solid, the best
fixed strategy dashed). Reads DIR/<target>-cap<cap>.jsonl and .log."""
import glob, json, os, re, sys

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
CAPS = ["0.25", "0.5", "1", "2", "none"]
SHORT = {
    "autoregressive-pipelined": "AR-pipelined",
    "tree-no-fallback@qwen2.5-coder-0.5b-k32768-keep": "tree@slim",
    "tree-no-fallback": "tree@0.5B",
}
short = lambda s: SHORT.get(s, s)
cells = {}  # (target, budget MiB, cap) -> {strategy: row}, choice
for p in sorted(glob.glob(os.path.join(d, "*-cap*.jsonl"))):
    name = os.path.basename(p)[: -len(".jsonl")]
    target, cap = name.rsplit("-cap", 1)
    rows = [json.loads(l) for l in open(p) if l.strip()]
    log = open(p[: -len(".jsonl")] + ".log").read()
    choices = re.findall(
        r"auto: drafting with (.+?) \(([\d.]+) tok/s expected within ([\d.]+) (MiB|GiB)", log)
    fell = re.findall(r"auto: (\S+) does not fit after all", log)
    for r in rows:
        if r.get("peer"):
            continue
        mib = r["budget_bytes"] >> 20
        c = cells.setdefault((target, mib, cap), {"rows": {}, "choice": None})
        c["rows"][r["strategy"]] = r
    for label, est, amount, unit in choices:
        mib = round(float(amount) * (1024 if unit == "GiB" else 1))
        for (t, m, k), c in cells.items():
            if t == target and k == cap and abs(m - mib) <= 8:
                c["choice"] = (label.replace("qwen2.5-coder-0.5b-k32768-keep", "0.5B"), float(est))
    if fell:
        for (t, m, k), c in cells.items():
            if t == target and k == cap:
                c.setdefault("fell", fell)

fixed_order = ["autoregressive-pipelined", "ppd", "tree@lookup",
               "tree-no-fallback@qwen2.5-coder-0.5b-k32768-keep", "tree-no-fallback"]
print("| target | budget | read cap | " + " | ".join(short(f) for f in fixed_order) +
      " | auto (choice; estimate) | auto / best fixed | identical |")
print("|---|---|---|" + "---|" * len(fixed_order) + "---|---|---|")
worst = []
order = lambda k: (k[0], k[1], CAPS.index(k[2]))
for key in sorted(cells, key=order):
    target, mib, cap = key
    c = cells[key]
    rows = c["rows"]
    if "auto" not in rows:
        continue
    ran = {f: rows[f]["tok_s"] for f in fixed_order if f in rows and rows[f]["tok_s"] > 0}
    best = max(ran, key=ran.get)
    a = rows["auto"]["tok_s"]
    ch = c["choice"]
    choice = f"{ch[0]}; est {ch[1]:.2f}" if ch else "?"
    ident = min(r["identical"] for r in rows.values() if r["tok_s"] > 0)
    cells_txt = " | ".join(
        (f"{rows[f]['tok_s']:.2f}" if rows[f]["tok_s"] > 0 else "did not fit") if f in rows else "-"
        for f in fixed_order)
    cap_txt = "none" if cap == "none" else f"{cap} GB/s"
    print(f"| {target} | {mib} MiB | {cap_txt} | {cells_txt} | {a:.2f} ({choice}) | "
          f"{a / ran[best]:.2f}x ({short(best)}) | {ident}/2 |")
    worst.append((a / ran[best], key))
print()
below = [(r, k) for r, k in worst if r < 0.9]
print(f"{len(worst)} cells; auto within 10% of the best fixed strategy in "
      f"{len(worst) - len(below)}; below: " + ", ".join(f"{k[0]} {k[1]} MiB cap {k[2]} ({r:.2f}x)" for r, k in below))

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(0)
targets = sorted({k[0] for k in cells})
fig, axes = plt.subplots(1, len(targets), figsize=(5.2 * len(targets), 4.2), squeeze=False)
colors = dict(zip(CAPS, ["#d62728", "#ff7f0e", "#2ca02c", "#1f77b4", "#555555"]))
for ax, target in zip(axes[0], targets):
    budgets = sorted({k[1] for k in cells if k[0] == target})
    if len(budgets) == 1:
        # One budget: tok/s against the read cap instead.
        ks = [k for cap in CAPS for k in cells
              if k[0] == target and k[2] == cap and "auto" in cells[k]["rows"]]
        xs = range(len(ks))
        auto = [cells[k]["rows"]["auto"]["tok_s"] for k in ks]
        best = [max(r["tok_s"] for s, r in cells[k]["rows"].items() if s != "auto") for k in ks]
        ar = [cells[k]["rows"]["autoregressive-pipelined"]["tok_s"] for k in ks]
        ax.plot(xs, auto, "o-", color="#1f77b4", label="auto")
        ax.plot(xs, best, "s--", color="#555555", label="best fixed")
        ax.plot(xs, ar, "^:", color="#d62728", label="AR-pipelined")
        ax.set_xticks(list(xs), ["uncapped" if k[2] == "none" else f"{k[2]} GB/s" for k in ks])
        ax.set_xlabel(f"read cap (budget {budgets[0]} MiB)")
        ax.set_xlim(-0.5, max(len(ks) - 0.5, 1.5))
    else:
        for cap in CAPS:
            ks = sorted(k for k in cells if k[0] == target and k[2] == cap and "auto" in cells[k]["rows"])
            if not ks:
                continue
            xs = [k[1] for k in ks]
            auto = [cells[k]["rows"]["auto"]["tok_s"] for k in ks]
            best = [max(r["tok_s"] for s, r in cells[k]["rows"].items() if s != "auto") for k in ks]
            label = "uncapped" if cap == "none" else f"{cap} GB/s"
            ax.plot(xs, auto, "o-", color=colors[cap], label=f"{label}: auto")
            ax.plot(xs, best, "s--", color=colors[cap], alpha=0.6, label=f"{label}: best fixed")
        ax.set_xlabel("memory budget (MiB)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{target} (2 MT-Bench prompts x 48 tokens)")
    ax.set_ylabel("tok/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
fig.suptitle("Read cap x budget: auto (solid) against the best fixed strategy (dashed); 2-vCPU AMD EPYC VM")
fig.tight_layout()
fig.savefig(os.path.join(d, "regimes.png"), dpi=110)
