import json, subprocess, sys, time, urllib.request
bin_, port = sys.argv[1], sys.argv[2]
model = sys.argv[3] if len(sys.argv) > 3 else "qwen2.5-coder-1.5b"
d = json.load(open(f'/tmp/greedy-{model}.json'))
p = subprocess.Popen([bin_, "--threads", "2", "serve", "--model", model, "--port", port, "--strategy", "autoregressive"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for _ in range(120):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1); break
    except Exception:
        time.sleep(1)
mid = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models"))["data"][0]["id"]
out = []
for r in d:
    body = json.dumps({"model": mid, "prompt": r["prompt"], "max_tokens": 48, "temperature": 0, "logprobs": 2}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
    res = json.load(urllib.request.urlopen(req, timeout=600))
    lp = res["choices"][0]["logprobs"]
    out.append({"text": res["choices"][0]["text"], "tokens": lp["tokens"], "top": lp["top_logprobs"]})
p.terminate()
json.dump(out, open(f"/tmp/margins-{port}.json", "w"))
print("ok", len(out))
