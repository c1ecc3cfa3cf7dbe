#!/usr/bin/env python3
"""The A/B's rows side by side: tok/s, peaks (cgroup, process), GiB read per
100 tokens, tokens per pass, and the plan's memory line. Usage: table.py DIR"""
import json, pathlib, sys

d = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
rows = {}
for f in sorted(d.glob("r*-*-*.jsonl")):
    r, b, cell = f.stem.split("-", 2)
    for line in f.read_text().splitlines():
        j = json.loads(line)
        if "strategy" not in j or j.get("peer"):
            continue
        rows.setdefault((cell, j["strategy"]), []).append((r, b, j))
print(f"{'cell':5} {'strategy':48} {'run':6} {'tok/s':>6} {'cg%':>6} {'rss%':>6} {'GiB/100':>8} {'tok/pass':>8}")
for (cell, s), runs in sorted(rows.items()):
    for r, b, j in sorted(runs, key=lambda x: (x[1], x[0])):
        print(f"{cell:5} {s[:48]:48} {r}-{b:3} {j['tok_s']:6.2f} {100*j['peak_bytes']/j['budget_bytes']:6.1f}"
              f" {100*j['rss_peak_bytes']/j['budget_bytes']:6.1f} {j['streamed_gib_per_100']:8.1f} {j['mean_accepted']:8.2f}")
    for b in sorted({bb for _, bb, _ in runs}):
        v = [j["tok_s"] for _, bb, j in runs if bb == b]
        if v:
            print(f"{'':5} {'':48} {b+' mean':6} {sum(v)/len(v):6.2f}")
