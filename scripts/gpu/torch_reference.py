#!/usr/bin/python3
"""PyTorch's training step of the shapes mfu_bench times (vit300m-llm1b):
the LLM's forward + loss + backward on one packed sequence, and the encoder's
(ViT + projector) forward + backward on a batch of tiles. In fp32 TF32 is
off, so the GEMMs are fp32 as Loom's are; --precision bf16 runs the step
under torch.autocast(bfloat16) over fp32 weights (PyTorch's AMP: bf16
GEMMs and attention, fp32 norms and loss), as Loom's bf16 is; attention is
scaled_dot_product_attention (PyTorch picks its kernel). Median seconds over
--steps after --warmup, synchronised around each.

  python3 scripts/gpu/torch_reference.py --seq 2048 --tiles 16 [--precision bf16]
"""
import contextlib
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


AUTOCAST = contextlib.nullcontext  # --precision bf16: torch.autocast


def timed(step, steps, warmup):
    t = []
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with AUTOCAST():
            step()
        torch.cuda.synchronize()
        if i >= warmup:
            t.append(time.perf_counter() - t0)
    return statistics.median(t)


def param(*shape, scale=0.02):
    return (torch.randn(*shape, device="cuda") * scale).requires_grad_(True)


def llm(seq, steps, warmup, V=32000, D=2048, L=16, H=16, Fh=5632):
    hd = D // H
    layers = [dict(n1=param(D, scale=0) + 1, qkv=param(3 * D, D), o=param(D, D), n2=param(D, scale=0) + 1,
                   g=param(Fh, D), u=param(Fh, D), d=param(D, Fh)) for _ in range(L)]
    wte, nf, head = param(V, D), param(D, scale=0) + 1, param(V, D)
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, device="cuda").float() / hd))
    ang = torch.arange(seq, device="cuda").float()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    tokens = torch.randint(0, V, (seq + 1,), device="cuda")

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def rope(x):  # (H, T, hd), rotate-half
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def step():
        x = F.embedding(tokens[:-1], wte)
        for p in layers:
            q, k, v = F.linear(rms(x, p["n1"]), p["qkv"]).view(seq, 3, H, hd).permute(1, 2, 0, 3)
            o = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
            x = x + F.linear(o.permute(1, 0, 2).reshape(seq, D), p["o"])
            h = rms(x, p["n2"])
            x = x + F.linear(F.silu(F.linear(h, p["g"])) * F.linear(h, p["u"]), p["d"])
        loss = F.cross_entropy(F.linear(rms(x, nf), head), tokens[1:])
        loss.backward()

    return timed(step, steps, warmup)


def encoder(tiles, steps, warmup, S=336, P=14, D=1024, L=24, H=16, M=4096, hidden=2048, Dl=2048):
    G, hd = S // P, D // H
    Np = G * G
    blocks = [dict(n1w=param(D, scale=0) + 1, n1b=param(D, scale=0), qkv=param(3 * D, D), qkvb=param(3 * D),
                   o=param(D, D), ob=param(D), n2w=param(D, scale=0) + 1, n2b=param(D, scale=0),
                   f1=param(M, D), f1b=param(M), f2=param(D, M), f2b=param(D)) for _ in range(L)]
    pe, peb, pos = param(D, 3 * P * P), param(D), param(Np, D)
    nfw, nfb = param(D, scale=0) + 1, param(D, scale=0)
    p1, p1b, p2, p2b = param(hidden, 4 * D), param(hidden), param(Dl, hidden), param(Dl)
    x_in = torch.randn(tiles, 3, S, S, device="cuda")
    dout = torch.randn(tiles * Np // 4, Dl, device="cuda")

    def step():
        x = x_in.reshape(tiles, 3, G, P, G, P).permute(0, 2, 4, 1, 3, 5).reshape(tiles, Np, 3 * P * P)
        x = F.linear(x, pe, peb) + pos
        for b in blocks:
            h = F.layer_norm(x, (D,), b["n1w"], b["n1b"])
            q, k, v = F.linear(h, b["qkv"], b["qkvb"]).view(tiles, Np, 3, H, hd).permute(2, 0, 3, 1, 4)
            o = F.scaled_dot_product_attention(q, k, v).permute(0, 2, 1, 3).reshape(tiles, Np, D)
            x = x + F.linear(o, b["o"], b["ob"])
            h = F.layer_norm(x, (D,), b["n2w"], b["n2b"])
            x = x + F.linear(F.gelu(F.linear(h, b["f1"], b["f1b"]), approximate="tanh"), b["f2"], b["f2b"])
        x = F.layer_norm(x, (D,), nfw, nfb)
        x = x.reshape(tiles, G // 2, 2, G // 2, 2, D).permute(0, 1, 3, 2, 4, 5).reshape(-1, 4 * D)
        y = F.linear(F.gelu(F.linear(x, p1, p1b), approximate="tanh"), p2, p2b)
        y.backward(dout)

    return timed(step, steps, warmup)


def attention(batch, seq, heads, head_dim, causal, steps, warmup, dtype):
    """scaled_dot_product_attention forward + backward in `dtype` on `batch`
    sequences: PyTorch's own choice, its math path (cuBLAS GEMMs and a
    softmax, the L x L probabilities kept) and, in bf16, FlashAttention-2
    (PyTorch's build of it)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=dtype,
                           requires_grad=True) for _ in range(3))
    g = torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=dtype)
    out = {}
    backends = [("sdpa", None), ("math", SDPBackend.MATH)]
    if dtype == torch.bfloat16:
        backends.append(("flash", SDPBackend.FLASH_ATTENTION))
    for name, backend in backends:
        def step():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            o.backward(g)
        if backend is None:
            out[name] = timed(step, steps, warmup)
        else:
            with sdpa_kernel(backend):
                out[name] = timed(step, steps, warmup)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--tiles", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--attention", default="",
                    help="SEQ,HEADS,HEAD_DIM,causal|full[,BATCH]: time attention alone")
    a = ap.parse_args()
    global AUTOCAST
    if a.precision == "bf16":
        AUTOCAST = lambda: torch.autocast(device_type="cuda", dtype=torch.bfloat16)  # noqa: E731
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}, "
          f"{'bf16 autocast' if a.precision == 'bf16' else 'fp32 (TF32 off)'}")
    if a.attention:
        seq, heads, hd, mask, *batch = a.attention.split(",")
        seq, heads, hd, causal = int(seq), int(heads), int(hd), mask == "causal"
        batch = int(batch[0]) if batch else 1
        flops = 3.5 * 4.0 * batch * seq * seq * hd * heads / (2 if causal else 1)
        dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
        for name, sec in attention(batch, seq, heads, hd, causal, a.steps, a.warmup,
                                   dtype).items():
            print(f"torch attention {name:5s} {sec:9.4f} s  {flops / sec / 1e12:8.2f} TFLOP/s  "
                  f"({batch} x {seq} tokens, {heads} x {hd}, {mask}, {a.precision})")
        return
    print(f"torch llm      {llm(a.seq, a.steps, a.warmup):9.4f} s  (seq {a.seq})")
    torch.cuda.empty_cache()
    print(f"torch encoder  {encoder(a.tiles, a.steps, a.warmup):9.4f} s  ({a.tiles} tiles)")


if __name__ == "__main__":
    main()
