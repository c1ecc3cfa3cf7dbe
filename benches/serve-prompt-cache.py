# Time to first token of a conversation's second turn with the prompt cache
# (right after the first turn) and without it (another conversation in
# between), against a running `arbor serve`: python3 benches/serve-prompt-cache.py HOST:PORT
import time, sys
from openai import OpenAI
addr = sys.argv[1]
c = OpenAI(base_url=f"http://{addr}/v1", api_key="x", max_retries=0)
model = c.models.list().data[0].id
doc = " ".join(["The committee reviewed the proposal for the new library building and asked for a revised budget."] * 12)
def ttft(messages):
    t = time.time(); first = None; text = ""; usage = None
    for ch in c.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True}):
        if ch.choices and ch.choices[0].delta.content and first is None:
            first = time.time() - t
        if ch.choices: text += ch.choices[0].delta.content or ""
        if ch.usage: usage = ch.usage
    return first, text, usage
rows = []
for rep in range(3):
    m1 = [{"role": "user", "content": f"({rep}) Summarise this: {doc}"}]
    _, reply, u1 = ttft(m1)
    m2 = m1 + [{"role": "assistant", "content": reply}, {"role": "user", "content": "Now in five words."}]
    with_cache, t2, u2 = ttft(m2)
    ttft([{"role": "user", "content": "Say hi."}])  # another conversation evicts the prefix
    without, t3, u3 = ttft(m2)
    rows.append((u2.prompt_tokens, u2.prompt_tokens_details.cached_tokens, with_cache, u3.prompt_tokens_details.cached_tokens, without, t2 == t3))
    print(f"turn-2 prompt {u2.prompt_tokens} tok: cached {u2.prompt_tokens_details.cached_tokens} -> TTFT {with_cache:.2f} s; cached {u3.prompt_tokens_details.cached_tokens} -> TTFT {without:.2f} s; same text {t2 == t3}", flush=True)
