"""Streams a chat reply: python bindings/python/examples/chat.py [MODEL]"""
import sys

import arbor_llm

model = arbor_llm.Model(sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-0.5b", max_tokens=96)
reply = model.chat([{"role": "user", "content": "Write a Python function that reverses a string."}])
for piece in reply:
    print(piece, end="", flush=True)
stats = reply.finish()["stats"]
print(f"\n[{stats['generated_tokens']} tokens, {stats['tokens_per_second']:.1f} tok/s, {stats['stop']}]")
