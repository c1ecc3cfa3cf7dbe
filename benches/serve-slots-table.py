# Table and chart of `arbor bench serve --json` runs over clients and slots
# (issue 31). Usage: python3 benches/serve-slots-table.py DIR [PNG]
# DIR holds REGIME-cC-sS.json files (one JSON object each, from --json).
import glob, json, os, sys

d = sys.argv[1]
rows = []
for f in sorted(glob.glob(os.path.join(d, "*.json"))):
    try:
        v = json.loads(open(f).read().strip().splitlines()[-1])
    except Exception:
        continue
    v["regime"] = os.path.basename(f).split("-c")[0]
    rows.append(v)
rows.sort(key=lambda v: (v["regime"], v["slots"], v["clients"]))
print("| regime | strategy | clients | slots | requests | errors | tok/s | TTFT p50 / p99 s | TPOT p50 / p99 s | queue wait s | requests/pass | alone = under load |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for v in rows:
    chk = v.get("verified")
    chk = f"{chk['same']}/{chk['requests']}" if isinstance(chk, dict) else ""
    print(f"| {v['regime']} | {v['strategy']} | {v['clients']} | {v['slots']} | {v['requests']} | {v['errors']} | "
          f"{v['tokens_per_s']:.2f} | {v['ttft_p50_s']:.1f} / {v['ttft_p99_s']:.1f} | "
          f"{v['tpot_p50_s']:.3f} / {v['tpot_p99_s']:.3f} | {v['queue_wait_mean_s']:.1f} | "
          f"{v['requests_per_pass']:.2f} | {chk} |")
for regime in sorted({v["regime"] for v in rows}):
    one = [v for v in rows if v["regime"] == regime and v["slots"] == 1 and v["clients"] == 4]
    four = [v for v in rows if v["regime"] == regime and v["slots"] == 4 and v["clients"] == 4]
    if one and four:
        print(f"\n{regime}: 4 slots / 1 slot (4 clients): {four[0]['tokens_per_s'] / one[0]['tokens_per_s']:.2f}x")
if len(sys.argv) > 2:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    # The sweep's regimes (repeats and variants are in the table only).
    for regime in [r for r in ("budget", "none") if any(v["regime"] == r for v in rows)]:
        pts = sorted((v["clients"], v["tokens_per_s"]) for v in rows if v["regime"] == regime and v["slots"] == v["clients"])
        label = {"budget": "900 MiB budget", "none": "no budget"}[regime]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"{label}: slots = clients")
        for v in rows:
            if v["regime"] == regime and v["slots"] == v["clients"]:
                ax.annotate(v["strategy"].replace("autoregressive", "ar"), (v["clients"], v["tokens_per_s"]),
                            fontsize=7, textcoords="offset points", xytext=(4, -10))
        base = [v for v in rows if v["regime"] == regime and v["slots"] == 1 and v["clients"] == 4]
        if base:
            ax.axhline(base[0]["tokens_per_s"], ls="--", lw=1, color=ax.lines[-1].get_color(),
                       label=f"{label}: 1 slot, 4 clients")
    ax.set_xlabel("clients (each streaming requests back to back)")
    ax.set_ylabel("total tokens/s")
    ax.set_xticks([1, 2, 4, 8])
    ax.set_title("arbor serve --slots, Qwen2.5-Coder-1.5B, 2-core VM")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print("chart:", sys.argv[2])
