#!/usr/bin/env python3
"""Passes of n rows, arbor against llama.cpp, alternated in one run.

    benches/rows-table.py --llama-bench DIR/llama-bench [--arbor BIN ...] \
        [--model qwen2.5-coder-1.5b] [--rows 1,2,8,32,64,128,512] [--reps 3]

For every row count n, each arbor binary runs `arbor bench decode
--prompt-tokens n --tokens 1` (one pass of n prompt rows, logits of the last
row only) and llama-bench runs `-p n -n 0` (the same work: one batch, last
row's logits), in turn, `--reps` times; the best pass time of each is kept.
n = 1 is decode on either side (arbor's decode_tok_s after a 16-token prompt,
llama-bench `-p 0 -n 16`). Prints a Markdown table of milliseconds per pass
and the speed ratios against llama.cpp. Give several `--arbor` binaries
(before/after) to compare them in the same run.
"""
import argparse
import json
import os
import subprocess


def arbor_ms(binary, model, n, threads):
    args = [binary, "--threads", str(threads), "bench", "decode", "--model", model]
    if n == 1:
        args += ["--prompt-tokens", "16", "--tokens", "16"]
    else:
        args += ["--prompt-tokens", str(n), "--tokens", "1"]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    row = json.loads(out.strip().splitlines()[-1])
    if n == 1:
        return 1000.0 / row["decode_tok_s"]
    return 1000.0 * n / row["prefill_tok_s"]


def llama_ms(binary, path, n, threads):
    args = [binary, "-m", path, "-t", str(threads), "-r", "1", "-o", "json"]
    args += ["-p", "0", "-n", "16"] if n == 1 else ["-p", str(n), "-n", "0"]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    row = json.loads(out)[0]
    tok_s = row["avg_ts"]
    return 1000.0 / tok_s if n == 1 else 1000.0 * n / tok_s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--arbor", action="append")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--rows", default="1,2,8,32,64,128,512")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    arbors = a.arbor or [os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release/arbor")]
    home = os.environ.get("ARBOR_HOME", os.path.expanduser("~/.cache/arbor"))
    path = a.model if a.model.endswith(".gguf") else os.path.join(home, "models", a.model + ".gguf")
    rows = [int(n) for n in a.rows.split(",")]
    best = {}
    for rep in range(a.reps):
        for n in rows:
            for i, b in enumerate(arbors):
                ms = arbor_ms(b, a.model, n, a.threads)
                best[(i, n)] = min(best.get((i, n), ms), ms)
            ms = llama_ms(a.llama_bench, path, n, a.threads)
            best[("llama", n)] = min(best.get(("llama", n), ms), ms)
            print(f"rep {rep + 1}/{a.reps}, {n} rows done", flush=True)
    names = [os.path.basename(os.path.dirname(os.path.dirname(b))) + "/" + os.path.basename(b)
             if len(arbors) == 1 else f"arbor[{i}]" for i, b in enumerate(arbors)]
    print(f"\n{a.model}, {a.threads} threads, best of {a.reps}; arbor binaries: {arbors}\n")
    print("| rows per pass | " + " | ".join(str(n) for n in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for i, name in enumerate(names):
        print(f"| {name} ms | " + " | ".join(f"{best[(i, n)]:.1f}" for n in rows) + " |")
    print("| llama.cpp ms | " + " | ".join(f"{best[('llama', n)]:.1f}" for n in rows) + " |")
    for i, name in enumerate(names):
        print(f"| {name} ÷ llama.cpp speed | "
              + " | ".join(f"{best[('llama', n)] / best[(i, n)]:.2f}×" for n in rows) + " |")


if __name__ == "__main__":
    main()
