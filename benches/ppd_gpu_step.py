"""What `arbor train ppd`'s recipe costs on a GPU: one step of it, timed in
PyTorch on random weights of the Qwen2.5-Coder shapes (the cost of a step
does not depend on the weights' values, and no model file can reach the GPU
machine).

A step, as in crates/train: the sequence's real tokens run once without
gradients (the teacher's log-probabilities at the insertion rows, and every
layer's keys and values kept as constants); the prompt tokens inserted at
POINTS places (COUNT rows each) run in one pass whose rows see a prefix of
the cached keys and values and their own chain; KL(teacher || student)
weighted 0.8^i; backward to the prompt tokens only; an AdamW update.

Usage (on the device): python3 benches/ppd_gpu_step.py [LEN] [POINTS] [STEPS]
Prints one JSON line per model and precision.
"""

import json
import sys
import time

import torch

SHAPES = {
    "tiny-check": (64, 2, 4, 2, 128, 1000),
    # hidden, layers, heads, kv heads, ffn, vocab
    "qwen2.5-coder-0.5b": (896, 24, 14, 2, 4864, 151936),
    "qwen2.5-coder-1.5b": (1536, 28, 12, 2, 8960, 151936),
}
COUNT = 3
ALPHA = 0.8


def weights(shape, dtype, dev):
    hidden, layers, heads, kv, ffn, vocab = shape
    hd = hidden // heads
    g = torch.Generator(device="cpu").manual_seed(0)

    def w(*s):
        return (torch.randn(*s, generator=g) * 0.02).to(dev, dtype)

    ls = []
    for _ in range(layers):
        ls.append(
            dict(
                q=w(hidden, heads * hd), qb=w(heads * hd),
                k=w(hidden, kv * hd), kb=w(kv * hd),
                v=w(hidden, kv * hd), vb=w(kv * hd),
                o=w(heads * hd, hidden),
                gate=w(hidden, ffn), up=w(hidden, ffn), down=w(ffn, hidden),
                n1=torch.ones(hidden, device=dev, dtype=dtype),
                n2=torch.ones(hidden, device=dev, dtype=dtype),
            )
        )
    return dict(layers=ls, emb=w(vocab, hidden), head=w(hidden, vocab),
                norm=torch.ones(hidden, device=dev, dtype=dtype))


def rms(x, g):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * g


def rope(x, pos, hd):
    # x [T, h, hd]; rotate halves.
    inv = 1.0 / (1e6 ** (torch.arange(0, hd, 2, device=x.device).float() / hd))
    ang = pos.float()[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype)[:, None, :], ang.sin().to(x.dtype)[:, None, :]
    a, b = x[..., : hd // 2], x[..., hd // 2:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)


def forward(W, shape, x, pos, mask, cache=None):
    """x [T, hidden]; mask [T, cached + T] bool; cache: per-layer (k, v) to
    attend to before these rows. Returns hidden states and this pass's k, v."""
    hidden, layers, heads, kv, ffn, vocab = shape
    hd = hidden // heads
    out = []
    for i, L in enumerate(W["layers"]):
        h = rms(x, L["n1"])
        q = (h @ L["q"] + L["qb"]).view(-1, heads, hd)
        k = (h @ L["k"] + L["kb"]).view(-1, kv, hd)
        v = (h @ L["v"] + L["vb"]).view(-1, kv, hd)
        q, k = rope(q, pos, hd), rope(k, pos, hd)
        out.append((k, v))
        if cache is not None:
            k = torch.cat([cache[i][0], k], 0)
            v = torch.cat([cache[i][1], v], 0)
        rep = heads // kv
        k = k.repeat_interleave(rep, 1).transpose(0, 1)
        v = v.repeat_interleave(rep, 1).transpose(0, 1)
        a = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k[None], v[None], attn_mask=mask[None, None])
        x = x + a[0].transpose(0, 1).reshape(-1, heads * hd) @ L["o"]
        h = rms(x, L["n2"])
        x = x + (torch.nn.functional.silu(h @ L["gate"]) * (h @ L["up"])) @ L["down"]
    return rms(x, W["norm"]), out


def step(W, shape, prompts, opt, length, points, dev):
    vocab = shape[5]
    tokens = torch.randint(0, vocab, (length,), device=dev)
    at = (torch.randperm(length - 64)[:points].sort().values + 32).tolist()
    pos = torch.arange(length, device=dev)
    t0 = time.perf_counter()
    with torch.no_grad():
        causal = torch.ones(length, length, device=dev, dtype=torch.bool).tril()
        h, cache = forward(W, shape, W["emb"][tokens], pos, causal)
        rows = torch.tensor([p + i for p in at for i in range(COUNT)], device=dev)
        teacher = torch.log_softmax((h[rows] @ W["head"]).float(), -1)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    n = points * COUNT
    mask = torch.zeros(n, length + n, dtype=torch.bool)
    for b, p in enumerate(at):
        for i in range(COUNT):
            r = b * COUNT + i
            mask[r, :p] = True
            mask[r, length + b * COUNT: length + r + 1] = True
    mask = mask.to(dev)
    ppos = rows
    x = prompts[torch.arange(n, device=dev) % COUNT]
    hs, _ = forward(W, shape, x, ppos, mask, [(k.detach(), v.detach()) for k, v in cache])
    student = torch.log_softmax((hs @ W["head"]).float(), -1)
    kl = (teacher.exp() * (teacher - student)).sum(-1)
    weight = ALPHA ** (torch.arange(n, device=dev) % COUNT).float() / points
    loss = (kl * weight).sum()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_([prompts], 1.0)
    opt.step()
    torch.cuda.synchronize()
    return t1 - t0, time.perf_counter() - t1, loss.item()


def main():
    length = int(sys.argv[1]) if len(sys.argv) > 1 else 384
    points = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    dev = "cuda"
    for name, shape in SHAPES.items():
        for dtype in (torch.float32, torch.bfloat16):
            W = weights(shape, dtype, dev)
            prompts = torch.nn.Parameter(W["emb"][:COUNT].clone())
            opt = torch.optim.AdamW([prompts], lr=1e-2, weight_decay=0.0)
            for _ in range(3):
                step(W, shape, prompts, opt, length, points, dev)
            times = [step(W, shape, prompts, opt, length, points, dev) for _ in range(steps)]
            assert prompts.grad is not None and torch.isfinite(prompts.grad).all()
            teacher = sum(t[0] for t in times) / steps
            student = sum(t[1] for t in times) / steps
            print(json.dumps(dict(
                model=name, dtype=str(dtype).replace("torch.", ""), len=length,
                points=points, prompt_tokens=COUNT, steps=steps,
                teacher_s=round(teacher, 4), student_fwd_bwd_s=round(student, 4),
                step_s=round(teacher + student, 4),
                loss_first=round(times[0][2], 3), loss_last=round(times[-1][2], 3),
                gpu=torch.cuda.get_device_name(0),
                peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2))), flush=True)
            del W, prompts, opt
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


if __name__ == "__main__":
    main()
