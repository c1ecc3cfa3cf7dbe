#!/usr/bin/env python3
"""Optional yardstick: llama.cpp (through the PyPI package llama-cpp-python)
on the same GGUF files, measured the way `arbor bench decode` measures.

    pip install llama-cpp-python==0.3.36   # builds llama.cpp from source
    python3 benches/llamacpp_bench.py MODEL.gguf [--threads 2] [--prompt-tokens 128] [--tokens 64]

Prints one JSON object like arbor's, with prefill_tok_s and decode_tok_s.
`benches/compare.sh` runs both and prints the ratios.
"""
import argparse
import json
import time

from llama_cpp import Llama

FILLER = ("The quick brown fox jumps over the lazy dog. "
          "def add(a, b):\n    return a + b\n\n"
          "In 1887 the committee met in the old town hall to discuss the budget. ")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    llm = Llama(model_path=a.model, n_ctx=1024, n_threads=a.threads, n_threads_batch=a.threads,
                n_batch=512, verbose=False)
    filler = llm.tokenize(FILLER.encode(), add_bos=False)
    prompt = (filler * (a.prompt_tokens // len(filler) + 1))[: a.prompt_tokens]
    # Warm-up, as arbor does.
    llm.reset()
    llm.eval(prompt[:16])
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(a.tokens):
        nxt = int(llm.scores[llm.n_tokens - 1].argmax())
        llm.eval([nxt])
    decode = time.perf_counter() - start
    print(json.dumps({
        "model": a.model, "engine": "llama.cpp", "threads": a.threads,
        "prompt_tokens": a.prompt_tokens, "decode_tokens": a.tokens,
        "prefill_tok_s": a.prompt_tokens / prefill, "decode_tok_s": a.tokens / decode,
    }))


if __name__ == "__main__":
    main()
