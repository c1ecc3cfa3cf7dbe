#!/usr/bin/env python3
"""ab.sh's rows, one line each: tok/s, the process's peak (VmHWM) and the
cgroup's peak as shares of the budget, lossless count, GiB streamed per 100
tokens. Reads r<round>-<old|new>-<target>.jsonl beside this file."""
import glob, json, os
d = os.path.dirname(os.path.abspath(__file__))
print("| target | round | binary | strategy | tok/s | process peak | cgroup peak | identical | GiB read / 100 tokens |")
print("|---|---|---|---|---|---|---|---|---|")
for f in sorted(glob.glob(os.path.join(d, "r*-*.jsonl")), key=lambda p: (p.split("-")[-1], p)):
    rnd, binary, target = os.path.basename(f)[:-6].split("-", 2)
    for line in open(f):
        r = json.loads(line)
        if r.get("peer"):
            continue
        s = r["strategy"].replace("qwen2.5-coder-0.5b-k32768-keep", "slim")
        b = r["budget_bytes"]
        print(f"| {target} | {rnd} | {binary} | {s} | {r['tok_s']:.2f} | {100*r['rss_peak_bytes']/b:.1f}% "
              f"| {100*r['peak_bytes']/b:.1f}% | {r['identical']}/{r['prompts']} | {r['streamed_gib_per_100']:.1f} |")
