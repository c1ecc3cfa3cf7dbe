#!/usr/bin/env python3
"""Where the 0.5B's greedy texts part from llama.cpp's and between binaries, with top-2 margins.

    python3 greedy_table.py /tmp/greedy-qwen2.5-coder-0.5b.json /tmp/margins-8711.json /tmp/margins-8712.json
"""
import json, sys

greedy = json.load(open(sys.argv[1]))
runs = [json.load(open(p)) for p in sys.argv[2:4]]


def parting(tokens, text):
    """Index of the first token whose text leaves `text`, or None."""
    at = 0
    for i, t in enumerate(tokens):
        if not text[at:].startswith(t):
            return i
        at += len(t)
    return None


def margin(run, i):
    top = sorted(run["top"][i].values(), reverse=True)
    return top[0] - top[1]


print("| prompt | before = llama.cpp | after = llama.cpp | leaves llama.cpp's text at token (before / after) | top-2 margin there, before / after (logits) |")
print("|---|---|---|---|---|")
for g, b, a in zip(greedy, *runs):
    llama = g["llama"].strip()
    pb, pa = parting(b["tokens"], g["llama"]), parting(a["tokens"], g["llama"])
    same = lambda i: "yes" if i is None else "no"
    at = lambda r, i: "—" if i is None else f"{i}: {r['tokens'][i]!r}"
    mg = lambda r, i: "" if i is None else f"{margin(r, i):.3f}"
    print(f"| {g['prompt'][:32]}… | {same(pb)} | {same(pa)} | {at(b, pb)} / {at(a, pa)} | {mg(b, pb)} / {mg(a, pa)} |")
    del llama
