#!/usr/bin/env python3
"""One-off cross-check of arbor's dequantizers against the numpy ones in the
`gguf` PyPI package (pip install gguf). Not run by `cargo test`.

    python3 crates/gguf/tests/compare_with_gguf_py.py [MODEL.gguf ...]

Part 1 feeds pseudo-random blocks of every type gguf-py can dequantize
through both and prints the max abs difference, the count of elements whose
bits differ (NaNs compare equal) and an FNV-1a hash of the values (the
constants in tests/golden.rs come from here). Part 2 streams every tensor of
each model file through both and reports the same per tensor type. Models
default to $ARBOR_HOME/models/*.gguf (ARBOR_HOME defaults to ~/.cache/arbor).
"""

import glob
import os
import subprocess
import sys

import numpy as np
from gguf import GGMLQuantizationType as T, GGUFReader
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
EXE = os.path.join(TARGET, "release", "examples", "dequant_dump")

# Types both sides know. gguf-py has no dequantizer for Q8_1 or Q8_K.
TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def noise(n, seed):
    """The xorshift64 byte stream of tests/golden.rs."""
    out = bytearray(n)
    m = (1 << 64) - 1
    for i in range(n):
        seed ^= (seed << 13) & m
        seed ^= seed >> 7
        seed ^= (seed << 17) & m
        out[i] = (seed >> 24) & 0xFF
    return bytes(out)


def canon_bits(y):
    y = np.asarray(y, dtype=np.float32)
    bits = y.view(np.uint32).copy()
    bits[np.isnan(y)] = 0x7FC00000
    return bits


def fnv1a(bits):
    h = 0xCBF29CE484222325
    for b in bits.astype("<u4").tobytes():
        h = ((h ^ b) * 0x100000001B3) & ((1 << 64) - 1)
    return h


def compare(a, b):
    a = np.asarray(a, dtype=np.float32).ravel()
    b = np.asarray(b, dtype=np.float32).ravel()
    assert a.shape == b.shape, (a.shape, b.shape)
    ok = np.isfinite(a) & np.isfinite(b)
    diff = float(np.max(np.abs(a[ok] - b[ok]))) if ok.any() else 0.0
    nbits = int(np.count_nonzero(canon_bits(a) != canon_bits(b)))
    return diff, nbits


def random_blocks():
    print("== pseudo-random blocks (16, or 256 for float types; seed 0x5eed + type number) ==")
    for name in TYPES:
        ty = T[name]
        bl, bb = GGML_QUANT_SIZES[ty]
        nb = 16 if bl > 1 else 256
        raw = noise(nb * bb, 0x5EED + int(ty))
        with np.errstate(all="ignore"):
            ref = dequantize(np.frombuffer(raw, dtype=np.uint8).reshape(nb, bb), ty)
        got = subprocess.run([EXE, "--raw", name, str(nb * bl)], input=raw,
                             capture_output=True, check=True).stdout
        got = np.frombuffer(got, dtype="<f4")
        diff, nbits = compare(got, ref)
        print(f"{name:5} max|diff| {diff:.3g}  differing bits {nbits}/{nb * bl}  "
              f"fnv 0x{fnv1a(canon_bits(ref)):016x}")


def model(path):
    print(f"== {os.path.basename(path)} ==")
    reader = GGUFReader(path)
    proc = subprocess.Popen([EXE, path], stdout=subprocess.PIPE)
    stats = {}
    for t in reader.tensors:
        ty = t.tensor_type
        data = t.data  # rows of raw bytes (quantized) or typed values
        rows = data.reshape(-1, data.shape[-1]) if data.ndim > 1 else data.reshape(1, -1)
        s = stats.setdefault(ty.name, [0, 0, 0.0, 0, 0.0])
        for r0 in range(0, rows.shape[0], 2048):
            ref = dequantize(rows[r0:r0 + 2048], ty).astype(np.float32).ravel()
            got = np.frombuffer(proc.stdout.read(ref.size * 4), dtype="<f4")
            diff, nbits = compare(got, ref)
            s[2] = max(s[2], diff)
            s[3] += nbits
            s[4] = max(s[4], float(np.max(np.abs(ref))))
            s[1] += ref.size
        s[0] += 1
    assert proc.stdout.read(1) == b"", "arbor wrote more than gguf-py"
    proc.wait()
    for name, (nt, ne, diff, nbits, amax) in sorted(stats.items()):
        print(f"{name:5} tensors {nt:4}  elements {ne:11}  max|diff| {diff:.3g}  "
              f"differing bits {nbits}  max|x| {amax:.3g}")


def main():
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "arbor-gguf",
                    "--example", "dequant_dump"], cwd=ROOT, check=True)
    random_blocks()
    paths = sys.argv[1:]
    if not paths:
        home = os.path.join(os.environ.get("ARBOR_HOME") or os.path.expanduser("~/.cache/arbor"), "models")
        paths = sorted(glob.glob(os.path.join(home, "*.gguf")))
    for p in paths:
        model(p)


if __name__ == "__main__":
    main()
