#!/usr/bin/env python3
"""ratios.png from tables.txt: arbor ÷ llama.cpp speed by rows per pass,
before and after, per model and ISA.   python3 plot.py   (needs matplotlib)"""
import os
import re

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

here = os.path.dirname(os.path.abspath(__file__))
tables, name = {}, None
for line in open(os.path.join(here, "tables.txt")):
    if line.startswith("### "):
        name = line[4:].strip()
    elif name and line.startswith("| rows per pass"):
        rows = [int(x) for x in re.findall(r"\d+", line.split("|", 2)[2])]
        tables[name] = {"rows": rows}
    elif name and "÷ llama.cpp speed" in line:
        which = "before" if "arbor[0]" in line else "after"
        tables[name][which] = [float(x) for x in re.findall(r"([\d.]+)×", line)]

fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
for ax, model in zip(axes, ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"]):
    for isa, color in [("AVX-512", "tab:blue"), ("AVX2 both", "tab:orange")]:
        t = tables[f"{model} {isa}"]
        ax.plot(t["rows"], t["before"], "--o", color=color, alpha=0.5, label=f"{isa}, before")
        ax.plot(t["rows"], t["after"], "-o", color=color, label=f"{isa}, after")
    ax.axhline(1.0, color="gray", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xticks(t["rows"], [str(n) for n in t["rows"]])
    ax.set_title(model)
    ax.set_xlabel("rows per pass")
axes[0].set_ylabel("arbor ÷ llama.cpp speed")
axes[0].legend(fontsize=8)
fig.suptitle("AMD EPYC VM, 2 threads, best of 3 (2026-11-30)")
fig.tight_layout()
fig.savefig(os.path.join(here, "ratios.png"), dpi=110)
