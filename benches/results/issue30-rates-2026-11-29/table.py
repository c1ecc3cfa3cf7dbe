#!/usr/bin/env python3
"""The three runs' table: tok/s per budget and strategy, auto's choice and
estimate (from each run's log), auto / best fixed, medians."""
import json, re, statistics, sys, os

d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(__file__)
runs = []
for i in (1, 2, 3):
    p = os.path.join(d, f"run{i}.jsonl")
    if not os.path.exists(p):
        continue
    rows = [json.loads(l) for l in open(p) if l.strip()]
    log = open(os.path.join(d, f"run{i}.log")).read()
    choices = re.findall(r"auto: drafting with (.+?) \(([\d.]+) tok/s expected within ([\d.]+) MiB", log)
    runs.append((i, rows, choices))

def short(s):
    s = s.replace("tree-no-fallback@qwen2.5-coder-0.5b-k32768-keep", "tree@slim")
    return s.replace("autoregressive-pipelined", "AR-pipelined")

fixed = ["autoregressive-pipelined", "ppd", "tree@lookup",
         "tree-no-fallback@qwen2.5-coder-0.5b-k32768-keep"]
print("| run | budget | " + " | ".join(short(f) for f in fixed) +
      " | auto (choice; estimate) | auto / best fixed | identical |")
print("|---|---|" + "---|" * len(fixed) + "---|---|---|")
per_budget = {}
for i, rows, choices in runs:
    for b in sorted({r["budget_bytes"] for r in rows if not r.get("peer")}):
        mib = b >> 20
        br = {r["strategy"]: r for r in rows if r["budget_bytes"] == b and not r.get("peer")}
        if "auto" not in br:
            continue
        best = max(br[f]["tok_s"] for f in fixed if f in br)
        best_name = max((f for f in fixed if f in br), key=lambda f: br[f]["tok_s"])
        ch = [c for c in choices if abs(float(c[2]) - mib) < 1]
        choice = f"{ch[0][0].replace('qwen2.5-coder-0.5b-k32768-keep', '0.5B')}; est {float(ch[0][1]):.2f}" if ch else "?"
        a = br["auto"]["tok_s"]
        ident = min(r["identical"] for r in br.values())
        print(f"| {i} | {mib} MiB | " + " | ".join(f"{br[f]['tok_s']:.2f}" if f in br else "-" for f in fixed) +
              f" | {a:.2f} ({choice}) | {a / best:.2f}x ({short(best_name)}) | {ident}/8 |")
        per_budget.setdefault(mib, []).append((a, {f: br[f]["tok_s"] for f in fixed if f in br}, ch[0][0] if ch else "?"))
print()
for mib, xs in sorted(per_budget.items()):
    med_auto = statistics.median(a for a, _, _ in xs)
    meds = {f: statistics.median(x[f] for _, x, _ in xs if f in x) for f in fixed}
    bf = max(meds, key=meds.get)
    print(f"{mib} MiB: choices {[c for _, _, c in xs]}; median auto {med_auto:.2f}, "
          f"best fixed by median {short(bf)} {meds[bf]:.2f}: {med_auto / meds[bf]:.2f}x")
