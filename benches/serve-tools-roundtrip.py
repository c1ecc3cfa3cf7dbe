# A tool round trip with the official client against a running `arbor serve`
# (issue 31): tool_choice auto, whole and streamed; then the tool's result
# goes back and the next turn is read. Usage:
#   arbor serve --model qwen2.5-coder-1.5b --strategy autoregressive --port 8391
#   python3 benches/serve-tools-roundtrip.py [HOST:PORT]
import json, sys, time
from openai import OpenAI
c = OpenAI(base_url=f"http://{sys.argv[1] if len(sys.argv) > 1 else '127.0.0.1:8391'}/v1", api_key="x")
model = c.models.list().data[0].id
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}]
msgs = [{"role": "user", "content": "What's the weather like in Paris right now?"}]
for stream in (False, True):
    t = time.time()
    if not stream:
        r = c.chat.completions.create(model=model, messages=msgs, tools=tools, temperature=0, max_tokens=128)
        m = r.choices[0].message
        calls = m.tool_calls; finish = r.choices[0].finish_reason; content = m.content
    else:
        content = ""; calls = []; finish = None
        for ch in c.chat.completions.create(model=model, messages=msgs, tools=tools, temperature=0, max_tokens=128, stream=True):
            d = ch.choices[0].delta if ch.choices else None
            if d is None: continue
            if d.content: content += d.content
            for tc in d.tool_calls or []: calls.append(tc)
            if ch.choices[0].finish_reason: finish = ch.choices[0].finish_reason
    print(f"stream={stream} finish={finish} content={content!r} ({time.time()-t:.1f}s)")
    for tc in calls:
        print("  call", tc.id, tc.function.name, tc.function.arguments, "valid JSON:", isinstance(json.loads(tc.function.arguments), dict))
    call = calls[0]
    follow = msgs + [{"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
                     {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"city": "Paris", "celsius": 21, "sky": "sunny"})}]
    if not stream:
        r2 = c.chat.completions.create(model=model, messages=follow, tools=tools, temperature=0, max_tokens=128)
        print("  final:", r2.choices[0].finish_reason, repr(r2.choices[0].message.content))
    else:
        text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(model=model, messages=follow, tools=tools, temperature=0, max_tokens=128, stream=True) if ch.choices)
        print("  final (streamed):", repr(text))
