#!/usr/bin/python3
"""Golden test: Loom's generator (runtime/model/generator.h) rebuilt in PyTorch.

Reads a dump written by generator_dump (dump_format.md, "The generator"),
builds the same denoiser in PyTorch from Loom's weights and checks, on the
same images, timesteps, noise and LLM conditions: the rectified-flow loss,
the velocity, every parameter gradient and the condition's gradient.
Tolerances come from the dump (kernels/testing/tolerances.h).

argv[2], if given, is a deliberate change to the reference (MUTATIONS): the
comparison must then fail, so the tolerances are shown to see it.
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_test import check, read_dump, report  # noqa: E402

MUTATIONS = {
    "time-sin-first": "the timestep features as [sin, cos] instead of [cos, sin]",
    "target-noise": "the velocity target ε instead of ε - x0",
    "causal": "causal attention inside an image instead of full",
    "no-prefix-positions": "learned positions on the patches only, not the prefix",
}
MUTATION = sys.argv[2] if len(sys.argv) > 2 else ""


def forward(cfg, g, d, x_t, t, cond):
    S, P, D, L, H, M, Q, C, Fq, N = cfg
    G, K = S // P, 1 + Q
    Np = G * G
    half = Fq // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) / half)
    a = time_scale * t.double()[:, None] * freqs[None]
    parts = [torch.sin(a), torch.cos(a)] if MUTATION == "time-sin-first" else [torch.cos(a),
                                                                                 torch.sin(a)]
    feat = torch.cat(parts, -1).float()
    h = F.gelu(F.linear(feat, g["time.fc1.weight"], g["time.fc1.bias"]), approximate="tanh")
    temb = F.linear(h, g["time.fc2.weight"], g["time.fc2.bias"])
    cp = F.linear(cond, g["cond.weight"], g["cond.bias"]).reshape(N, Q, D)
    patches = x_t.reshape(N, 3, G, P, G, P).permute(0, 2, 4, 1, 3, 5).reshape(N, Np, 3 * P * P)
    pe = F.linear(patches, d["patch_embed.weight"], d["patch_embed.bias"])
    x = torch.cat([temb[:, None], cp, pe], 1)
    pos = d["pos_embed"]
    if MUTATION == "no-prefix-positions":
        x = torch.cat([x[:, :K], x[:, K:] + pos[K:]], 1)
    else:
        x = x + pos
    T, hd = K + Np, D // H
    for l in range(L):
        b = f"blocks.{l}."
        y = F.layer_norm(x, (D,), d[b + "ln1.weight"], d[b + "ln1.bias"], eps=eps)
        qkv = F.linear(y, d[b + "attn.qkv.weight"], d[b + "attn.qkv.bias"])
        q, k, v = qkv.reshape(N, T, 3, H, hd).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-1, -2) / math.sqrt(hd)
        if MUTATION == "causal":
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        o = (torch.softmax(s, -1) @ v).permute(0, 2, 1, 3).reshape(N, T, D)
        x = x + F.linear(o, d[b + "attn.proj.weight"], d[b + "attn.proj.bias"])
        y = F.layer_norm(x, (D,), d[b + "ln2.weight"], d[b + "ln2.bias"], eps=eps)
        y = F.gelu(F.linear(y, d[b + "mlp.fc1.weight"], d[b + "mlp.fc1.bias"]), approximate="tanh")
        x = x + F.linear(y, d[b + "mlp.fc2.weight"], d[b + "mlp.fc2.bias"])
    x = F.layer_norm(x, (D,), d["ln_f.weight"], d["ln_f.bias"], eps=eps)
    rows = F.linear(x[:, K:], g["head.weight"], g["head.bias"])  # (N, Np, 3 P²)
    return rows.reshape(N, G, G, 3, P, P).permute(0, 3, 1, 4, 2, 5).reshape(N, 3, S, S)


def params_of(dump, prefix):
    return {k[len(prefix):]: v.clone().requires_grad_(True) for k, v in dump.items()
            if k.startswith(prefix)}


def main():
    global time_scale, eps
    if MUTATION and MUTATION not in MUTATIONS:
        sys.exit(f"unknown mutation {MUTATION!r}; known: {', '.join(MUTATIONS)}")
    dump = read_dump(sys.argv[1])
    cfg = dump["config"].tolist()
    time_scale, eps = dump["hparams"].tolist()
    tol = {k: dump[f"tolerance/{k}"].tolist() for k in ("logits", "grads")}
    g, d = params_of(dump, "param/generator/"), params_of(dump, "param/denoiser/")
    x0, noise, t = dump["images"], dump["noise"], dump["t"]
    cond = dump["cond"].clone().requires_grad_(True)
    tt = t[:, None, None, None]
    x_t = (1 - tt) * x0 + tt * noise
    target = noise if MUTATION == "target-noise" else noise - x0
    v = forward(cfg, g, d, x_t, t, cond)
    N = x0.shape[0]
    loss = ((v - target) ** 2).mean(dim=(1, 2, 3)).sum() / N
    loss.backward()
    failures = []
    err_v = check("velocity", v.detach(), dump["velocity"], tol["logits"], failures)
    check("loss", loss.detach().reshape(1), dump["loss"], tol["logits"], failures)
    worst = 0.0
    for prefix, ps in (("generator", g), ("denoiser", d)):
        for name, p in ps.items():
            if not p.grad.abs().max() > 0:  # a comparison of zeros would prove nothing
                failures.append(f"grad/{prefix}/{name}: all zero in torch")
            worst = max(worst, check(f"grad/{prefix}/{name}", p.grad,
                                     dump[f"grad/{prefix}/{name}"], tol["grads"], failures))
    worst = max(worst, check("grad/cond", cond.grad, dump["grad/cond"], tol["grads"], failures))
    print(f"generator golden: loss torch {loss.item():.6f} loom {dump['loss'].item():.6f}, "
          f"velocity max|diff| {err_v:.3g}, worst grad |diff| {worst:.3g}")
    report(failures)


if __name__ == "__main__":
    main()
