# Keeps N clients sending chat requests (64 new tokens, greedy) to a running
# `arbor serve` for SECS seconds, for reading the server's peak memory
# (/proc/PID/status VmHWM) under load. Usage:
#   python3 benches/serve-peak-clients.py HOST:PORT N SECS
import json, sys, threading, time, urllib.request
ADDR = sys.argv[1]; N = int(sys.argv[2]); SECS = float(sys.argv[3])
topics = ["binary search trees", "the French revolution", "photosynthesis", "TCP congestion control", "Rust lifetimes",
          "the stock market", "volcanoes", "neural networks", "medieval castles", "jazz history", "quantum computing", "gardening"]
def prompt(i):
    t = topics[i % len(topics)]
    return (f"Write a detailed, well-structured explanation of {t} for a curious high-school student. "
            f"Cover its history, the key ideas, two concrete examples, common misconceptions, and end with "
            f"three questions the student could explore next. Use headings and short paragraphs. Request {i}.")
end = time.time() + SECS
done = [0]
def client(k):
    i = k
    while time.time() < end:
        body = {"model": "qwen2.5-coder-1.5b", "max_tokens": 64, "temperature": 0,
                "messages": [{"role": "user", "content": prompt(i)}]}
        req = urllib.request.Request(f"http://{ADDR}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=600).read()
        done[0] += 1; i += N
ts = [threading.Thread(target=client, args=(k,)) for k in range(N)]
[t.start() for t in ts]; [t.join() for t in ts]
print("requests", done[0])
