# What a JSON schema costs per token, against a running `arbor serve`
# (issue 31): three prompts of crates/serve/tests/schemas.json, free (40
# tokens) and under their schema; prints decode tok/s and the mask's cost
# (`arbor.constraint`). Usage:
#   arbor serve --model smollm2-135m --strategy autoregressive --port 8392
#   python3 benches/serve-structured-cost.py [HOST:PORT]
import json, os, sys, time, urllib.request
ADDR = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:8392"
def post(body):
    req = urllib.request.Request(f"http://{ADDR}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t = time.time(); r = json.load(urllib.request.urlopen(req)); return time.time() - t, r
cases = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates/serve/tests/schemas.json")))
m = json.load(urllib.request.urlopen(f"http://{ADDR}/v1/models"))["data"][0]["id"]
for i in (0, 4, 10):
    c = cases[i]
    base = {"model": m, "messages": [{"role": "system", "content": "Answer in JSON."}, {"role": "user", "content": c["prompt"]}], "temperature": 0, "max_tokens": 400}
    for fmt in (None, {"type": "json_schema", "json_schema": {"name": "x", "schema": c["schema"]}}):
        b = dict(base)
        if fmt: b["response_format"] = fmt
        else: b["max_tokens"] = 40
        dt, r = post(b)
        print(i, "schema" if fmt else "free", f"{dt:.2f}s", r["usage"]["completion_tokens"], "tok", f'{r["arbor"]["decode_tokens_per_second"]:.1f} tok/s', r["arbor"].get("constraint"))
