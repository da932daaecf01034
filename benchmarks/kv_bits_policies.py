"""Which KV quantization scheme keeps greedy output with float KV: teacher-forced, cheap.

    PYTHONPATH=. .venv/bin/python benchmarks/kv_bits_policies.py      # CASES=1,6 for some

Why: step 2 of kv_bits_bench.py decodes 20 rows x 128 tokens per width (an hour on a
loaded 2-core machine). Up to its first divergence a quantized greedy row follows the
float row, so its first divergence is the first position whose argmax, given the float
row's prefix, differs from the float token: one forward per prompt over prompt + float
row scores a scheme. Each (query, key) pair attends either the quantized-then-dequantized
K/V or the float K/V (a policy: which pairs stay float), with mlx-lm's stock SDPA over the
two concatenated under a mask. The float rows are mlx-lm's `generate_step`'s (kept in
ROWS_FILE). Prints, per case, the mean fraction of 128 tokens before the first divergence.
"""
import json
import os
import sys

import mlx.core as mx
import numpy as np

sys.path.insert(0, os.getcwd())
from benchmarks.kv_bits_bench import BACKEND, QUESTIONS
from frink_mlx.models.loader import load_model
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

settings = Settings.load()
spec = load_registry(settings).resolve(None)
loaded = load_model(spec, settings.load_config(), BACKEND)
model, tok = loaded.model, loaded.tokenizer
ROWS_FILE = os.environ.get("ROWS_FILE", "/tmp/kv_bits_float_rows.json")
N, T = int(os.environ.get("N", "20")), int(os.environ.get("T", "128"))
prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
           for q in QUESTIONS[:N]]
if not os.path.exists(ROWS_FILE):
    from mlx_lm.generate import generate_step
    rows = [[int(t) for t, _ in generate_step(mx.array(p), model, max_tokens=T)] for p in prompts]
    with open(ROWS_FILE, "w") as f:
        json.dump({"float": rows}, f)
with open(ROWS_FILE) as f:
    ref = json.load(f)["float"][:N]


def _hadamard(n):
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return mx.array((h / np.sqrt(n)).astype(np.float32))
HAD = _hadamard(64)

def fq(x, group, bits):
    if bits is None:
        return x
    if bits == "f16":
        return x.astype(mx.float16).astype(x.dtype)
    if bits == "bf16":
        return x.astype(mx.bfloat16).astype(x.dtype)
    if isinstance(bits, str) and bits.startswith("sm"):
        b, sc = int(bits[2]), SMOOTH[bits[3]][LAYER[0]]
        y = x / sc
        return mx.dequantize(*mx.quantize(y, group_size=group, bits=b), group_size=group, bits=b) * sc
    if isinstance(bits, str) and bits.startswith("mu"):
        b, mu = int(bits[2]), MEANS[bits[3]][LAYER[0]]
        y = x - mu
        return mx.dequantize(*mx.quantize(y, group_size=group, bits=b), group_size=group, bits=b) + mu
    if isinstance(bits, str) and bits.startswith("pc"):
        return per_channel(x, group, int(bits[2:]))
    if isinstance(bits, str) and bits.startswith("had"):
        b = int(bits[3:])
        r = x @ HAD
        return mx.dequantize(*mx.quantize(r, group_size=group, bits=b), group_size=group, bits=b) @ HAD.T
    return mx.dequantize(*mx.quantize(x, group_size=group, bits=bits), group_size=group, bits=bits)


def per_channel(x, group, bits):
    """KIVI's key layout: each channel quantized over groups of `group` consecutive tokens
    (a block's worth), so one outlier channel no longer widens every other channel's step.
    The last partial group is padded with its own last token (the range it already has)."""
    t = x.shape[2]
    xt = mx.swapaxes(x, 2, 3)
    pad = (-t) % group
    if pad:
        xt = mx.concatenate([xt, mx.repeat(xt[..., -1:], pad, axis=-1)], axis=-1)
    g = xt.reshape(*xt.shape[:-1], -1, group)  # affine, min/max per group (any group size)
    lo, hi = g.min(axis=-1, keepdims=True), g.max(axis=-1, keepdims=True)
    step = mx.maximum(hi - lo, 1e-12) / (2 ** bits - 1)
    back = (mx.round((g - lo) / step) * step + lo).reshape(xt.shape)
    return mx.swapaxes(back[..., :t], 2, 3)


LAYER = [0]
SMOOTH = {}


def pair_absmax(k):
    """(1, H, T, D) keys -> (1, H, 1, D) per-channel abs max, tied over RoPE's pairs (i, i + D/2)."""
    m = mx.abs(k).max(axis=2, keepdims=True)
    half = m.shape[-1] // 2
    t = mx.maximum(m[..., :half], m[..., half:])
    return mx.maximum(mx.concatenate([t, t], axis=-1), 1e-3)


class Rec:
    def __init__(self):
        self.k = None
        self.offset = 0

    def make_mask(self, N, return_array=False, window_size=None, **_):
        return "causal"

    def update_and_fetch(self, keys, values):
        self.k = keys
        self.offset += keys.shape[2]
        return keys, values


def calibrate(text_ids):
    recs = [Rec() for _ in model.layers]
    model(mx.array(text_ids)[None], cache=recs)
    MEANS["c"] = [r.k.mean(axis=2, keepdims=True) for r in recs]
    return [pair_absmax(r.k) for r in recs]


MEANS = {}


class Sim:
    def __init__(self, P, own, kg=64, kb=8, vg=64, vb=8):
        self.P, self.own, self.kq, self.vq = P, own, (kg, kb), (vg, vb)
        self.k = self.v = None
        self.offset = 0

    def make_mask(self, N, return_array=False, window_size=None, **_):
        q = np.arange(self.offset, self.offset + N)[:, None]
        k = np.arange(self.offset + N)[None]
        causal = k <= q
        own = self.own(q, k, self.P) & causal
        return mx.array(np.concatenate([causal & ~own, own], axis=1))[None, None]

    def update_and_fetch(self, keys, values):
        self.k = keys if self.k is None else mx.concatenate([self.k, keys], axis=2)
        self.v = values if self.v is None else mx.concatenate([self.v, values], axis=2)
        self.offset += keys.shape[2]
        LAYER[0] = self.layer
        if "o" in SMOOTH and self.layer not in ORACLE_DONE:
            SMOOTH["o"][self.layer] = pair_absmax(self.k)
            MEANS["o"][self.layer] = self.k.mean(axis=2, keepdims=True)
            ORACLE_DONE.add(self.layer)
        return (mx.concatenate([fq(self.k, *self.kq), self.k], axis=2),
                mx.concatenate([fq(self.v, *self.vq), self.v], axis=2))


ORACLE_DONE = set()
CAL_TEXT = open("README.md").read()[:3000]
SMOOTH["c"] = calibrate(tok.encode(CAL_TEXT)[:512])
SMOOTH["o"] = [None] * len(model.layers)
MEANS["o"] = [None] * len(model.layers)


def score(own, **kw):
    fracs = []
    for p, r in zip(prompts, ref):
        P = len(p)
        seq = mx.array(p + r[:-1])[None]
        caches = [Sim(P, own, **kw) for _ in model.layers]
        for i, c in enumerate(caches):
            c.layer = i
        ORACLE_DONE.clear()
        logits = model(seq, cache=caches)[0, P - 1:]
        pred = np.array(mx.argmax(logits, axis=-1))
        bad = np.flatnonzero(pred != np.array(r))
        fracs.append((bad[0] if bad.size else len(r)) / len(r))
    return float(np.mean(fracs)), sum(f == 1 for f in fracs)


def NONE(q, k, P):
    return np.zeros(np.broadcast(q, k).shape, bool)


def ALL(q, k, P):
    return np.ones(np.broadcast(q, k).shape, bool)


def MLXLM0(q, k, P):
    """mlx-lm's generate with quantized_kv_start=0: prompt[:-1] is prefilled in float."""
    return (q < P - 1) & (k < P - 1)


def CHUNK(q, k, P):
    """A chunk attends its own K/V in float: the prompt, then each decode token itself."""
    return ((q < P) & (k < P)) | (k == q)


def SINK(n):
    return lambda q, k, P: (k < n) | NONE(q, k, P)


def RECENT(bs):
    """The row's last, partly filled block of `bs` slots kept float."""
    return lambda q, k, P: (k // bs == q // bs)


def OR(*fs):
    return lambda q, k, P: np.logical_or.reduce([f(q, k, P) for f in fs])


cases = [
    ("float (sanity)", ALL, {}),
    ("engine today: all quantized, g64 b8", NONE, {}),
    ("mlx-lm start=0: prompt[:-1] float", MLXLM0, {}),
    ("chunk attends own float", CHUNK, {}),
    ("K only quantized", NONE, dict(vb=None)),
    ("V only quantized", NONE, dict(kb=None)),
    ("g32 b8", NONE, dict(kg=32, vg=32)),
    ("K g32, V g64", NONE, dict(kg=32)),
    ("sink 16 float", SINK(16), {}),
    ("sink 4 float", SINK(4), {}),
    ("recent block(16) float", RECENT(16), {}),
    ("chunk + sink16", OR(CHUNK, SINK(16)), {}),
    ("g32 + chunk", CHUNK, dict(kg=32, vg=32)),
    ("g32 + chunk + sink16", OR(CHUNK, SINK(16)), dict(kg=32, vg=32)),
    ("g32 + recent16 + sink16", OR(RECENT(16), SINK(16)), dict(kg=32, vg=32)),
    ("f16 K/V", NONE, dict(kb="f16", vb="f16")),
    ("bf16 K/V", NONE, dict(kb="bf16", vb="bf16")),
    ("hadamard-rotated K/V g64 b8", NONE, dict(kb="had8", vb="had8")),
    ("hadamard-rotated K/V g32 b8", NONE, dict(kb="had8", vb="had8", kg=32, vg=32)),
    ("hadamard K g64, V plain g64", NONE, dict(kb="had8")),
    ("hadamard 4-bit g64", NONE, dict(kb="had4", vb="had4")),
    ("hadamard 4-bit g32", NONE, dict(kb="had4", vb="had4", kg=32, vg=32)),
    ("4-bit g64 all", NONE, dict(kb=4, vb=4)),
    ("4-bit g32 all", NONE, dict(kb=4, vb=4, kg=32, vg=32)),
    ("K per channel over 16 tokens, V g32", NONE, dict(kb="pc8", kg=16, vg=32)),
    ("K per channel over 32 tokens, V g32", NONE, dict(kb="pc8", kg=32, vg=32)),
    ("K per channel 16 + recent16 float", RECENT(16), dict(kb="pc8", kg=16, vg=32)),
    ("K per channel 16, V per channel 16", NONE, dict(kb="pc8", kg=16, vb="pc8", vg=16)),
    ("4-bit: K per channel 16, V g32", NONE, dict(kb="pc4", kg=16, vb=4, vg=32)),
    ("K smoothed (oracle absmax) g32, V g32", NONE, dict(kb="sm8o", kg=32, vg=32)),
    ("K smoothed (calibrated) g32, V g32", NONE, dict(kb="sm8c", kg=32, vg=32)),
    ("K smoothed (calibrated) g32 + recent16", RECENT(16), dict(kb="sm8c", kg=32, vg=32)),
    ("K smoothed (calibrated) g64, V g64", NONE, dict(kb="sm8c")),
    ("4-bit K smoothed (calibrated) g32, V g32", NONE, dict(kb="sm4c", kg=32, vb=4, vg=32)),
    ("K minus oracle channel mean g32, V g32", NONE, dict(kb="mu8o", kg=32, vg=32)),
    ("K minus calibrated channel mean g32, V g32", NONE, dict(kb="mu8c", kg=32, vg=32)),
    ("K minus calibrated mean g64, V g64", NONE, dict(kb="mu8c")),
    ("4-bit K minus calibrated mean g32, V g32", NONE, dict(kb="mu4c", kg=32, vb=4, vg=32)),
]
sel = os.environ.get("CASES")
for i, (name, own, kw) in enumerate(cases):
    if sel and str(i) not in sel.split(","):
        continue
    m, full = score(own, **kw)
    print(f"[{i}] {name:40s} mean frac {m:.3f}  identical {full}/{N}", flush=True)
