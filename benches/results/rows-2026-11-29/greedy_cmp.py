#!/usr/bin/env python3
"""Greedy texts of arbor binaries and llama.cpp on MT-Bench first turns (raw prompts)."""
import json, os, subprocess, sys
home = os.path.expanduser("~/.cache/arbor")
model = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 48
bins = sys.argv[3:] or ["/work/arbor-rates", "/work/arbor-q6"]
path = f"{home}/models/{model}.gguf"
qs = [json.loads(l) for l in open(f"{home}/datasets/mt-bench-question.jsonl")]
prompts = [q["turns"][0] for q in qs[::10]][:8]
llama = f"{home}/llama.cpp/build/bin/llama-completion"
out = []
for p in prompts:
    row = {"prompt": p}
    r = subprocess.run([llama, "-m", path, "-p", p, "-n", str(n), "--temp", "0", "--top-k", "1", "-t", "2",
                        "--simple-io", "-no-cnv", "--no-display-prompt", "-s", "1"],
                       capture_output=True, text=True)
    row["llama"] = r.stdout
    for i, b in enumerate(bins):
        r = subprocess.run([b, "--threads", "2", "generate", "--model", model, "--prompt", p, "--max-tokens", str(n),
                            "--temperature", "0", "--strategy", "autoregressive", "--no-profile"],
                           capture_output=True, text=True)
        row[f"arbor{i}"] = r.stdout
    out.append(row)
    same = lambda a, b: a.strip() == b.strip()
    print(json.dumps({"prompt": p[:40], **{f"arbor{i}==llama": same(row[f"arbor{i}"], row["llama"]) for i in range(len(bins))},
                      "arbor0==arbor1": same(row["arbor0"], row.get("arbor1", ""))}), flush=True)
json.dump(out, open(f"/tmp/greedy-{model}.json", "w"), indent=1)
