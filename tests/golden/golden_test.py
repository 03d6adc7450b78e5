#!/usr/bin/python3
"""Golden test: Loom's tiny multimodal model rebuilt in PyTorch.

A dump of tiny-gen (golden_dump --config tiny-gen) adds the generator: the
LLM's learned queries at the query positions (-2), its final-norm states
there conditioning the generator (generator_golden_test.forward), the
rectified-flow loss on the dumped draws, λ times it in the total loss, and
the generator's gradients and generation losses.

Reads a dump written by golden_dump (dump_format.md), builds the same ViT,
projector and LLM in PyTorch from Loom's exported weights, and checks, on the
same inputs: the logits, the loss, every parameter gradient, then the losses
of the training steps (AdamW with Loom's weight-decay rule, global-norm clipping,
warm-up) against Loom's.
Tolerances come from the dump (kernels/testing/tolerances.h).

Run with Debian's /usr/bin/python3 (python3-torch). Exits non-zero on any
mismatch, naming it.
"""
import math
import struct
import sys

import torch
import torch.nn.functional as F

generator_golden = None  # generator_golden_test, imported for a dump with a generator

torch.set_default_dtype(torch.float32)


def read_dump(path):
    with open(path, "rb") as f:
        buf = f.read()
    if buf[:8] != b"LOOMGOLD":
        sys.exit(f"{path}: not a Loom golden dump")
    version, n = struct.unpack_from("<II", buf, 8)
    if version != 1:
        sys.exit(f"{path}: dump version {version}, this reader knows 1")
    off, out = 16, {}
    for _ in range(n):
        (ln,) = struct.unpack_from("<I", buf, off)
        off += 4
        name = buf[off:off + ln].decode()
        off += ln
        dtype, ndim = struct.unpack_from("<BI", buf, off)
        off += 5
        dims = list(struct.unpack_from(f"<{ndim}q", buf, off))
        off += 8 * ndim
        count = math.prod(dims)
        tdtype = {0: torch.float32, 2: torch.int32}[dtype]
        t = torch.frombuffer(bytearray(buf[off:off + 4 * count]), dtype=tdtype).reshape(dims)
        off += 4 * count
        out[name] = t.clone()
    return out


class Cfg:
    def __init__(self, c, hp):
        (self.S, self.P, self.Dv, self.Lv, self.Hv, self.Mv, ps, self.Hp, self.V, self.D,
         self.L, self.H, self.Fh, self.steps, self.micro, self.warmup) = c.tolist()
        self.pixel_shuffle = bool(ps)
        self.lr, self.b1, self.b2, self.eps, self.wd, self.clip, self.theta = hp.tolist()
        self.G = self.S // self.P
        self.Np = self.G * self.G
        self.tpt = self.Np // 4 if self.pixel_shuffle else self.Np


# A deliberate change to the reference model (argv[2]), which must make the
# comparison fail: the mutation check in golden_test.sh shows the tolerances
# catch realistic modelling mistakes, the subtle RoPE layout one included.
MUTATIONS = {
    "rope-pairs": "RoPE rotates interleaved pairs (2i, 2i+1) (Meta's layout) instead of halves",
    "rms-eps": "RMSNorm eps 1e-5 instead of 1e-6",
    "no-causal": "LLM attention not causal inside a sequence",
    "gelu-erf": "exact (erf) GELU instead of the tanh approximation",
    "rope-theta": "RoPE theta doubled",
    "decay-all": "weight decay on every tensor (norms, biases, embeddings too)",
    "states-before-norm": "the generator conditioned on the LLM's states before its final norm",
}
MUTATION = sys.argv[2] if len(sys.argv) > 2 else ""


# Loom's default weight-decay rule (runtime/train/weight_decay.h), written
# again here as torch param groups: the weight matrices decay; 1-D tensors
# (norm weights, biases) and the embedding tables do not.
NO_DECAY_EMBEDDINGS = {"wte", "pos_embed", "cls_token", "gen_queries"}


def decays(name, t):
    return t.dim() >= 2 and name not in NO_DECAY_EMBEDDINGS


def adamw(cfg, P, decay_all=False):
    """AdamW over every module's parameters, decaying those decays() names."""
    named = [(name, t) for mod in P.values() for name, t in mod.items()]
    decay = [t for name, t in named if decay_all or decays(name, t)]
    rest = [t for name, t in named if not (decay_all or decays(name, t))]
    groups = [{"params": decay, "weight_decay": cfg.wd}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr,
                             betas=(cfg.b1, cfg.b2), eps=cfg.eps)


def params_of(d, prefix):
    return {k[len(prefix):]: v.clone().requires_grad_(True) for k, v in d.items()
            if k.startswith(prefix)}


def vit_forward(cfg, p, tiles):
    N = tiles.shape[0]
    G, P = cfg.G, cfg.P
    # patchify: rows (n, gy, gx), columns (c, y, x)
    x = tiles.reshape(N, 3, G, P, G, P).permute(0, 2, 4, 1, 3, 5).reshape(N * G * G, 3 * P * P)
    x = F.linear(x, p["patch_embed.weight"], p["patch_embed.bias"])
    x = (x.reshape(N, cfg.Np, cfg.Dv) + p["pos_embed"]).reshape(N * cfg.Np, cfg.Dv)
    hd = cfg.Dv // cfg.Hv
    for l in range(cfg.Lv):
        b = f"blocks.{l}."
        h = F.layer_norm(x, (cfg.Dv,), p[b + "ln1.weight"], p[b + "ln1.bias"], eps=1e-5)
        qkv = F.linear(h, p[b + "attn.qkv.weight"], p[b + "attn.qkv.bias"])
        qkv = qkv.reshape(N, cfg.Np, 3, cfg.Hv, hd).permute(2, 0, 3, 1, 4)  # 3, N, H, Np, hd
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), dim=-1)
        o = (att @ v).permute(0, 2, 1, 3).reshape(N * cfg.Np, cfg.Dv)
        x = x + F.linear(o, p[b + "attn.proj.weight"], p[b + "attn.proj.bias"])
        h = F.layer_norm(x, (cfg.Dv,), p[b + "ln2.weight"], p[b + "ln2.bias"], eps=1e-5)
        h = F.gelu(F.linear(h, p[b + "mlp.fc1.weight"], p[b + "mlp.fc1.bias"]), approximate=GELU())
        x = x + F.linear(h, p[b + "mlp.fc2.weight"], p[b + "mlp.fc2.bias"])
    return F.layer_norm(x, (cfg.Dv,), p["ln_f.weight"], p["ln_f.bias"], eps=1e-5)


def GELU():
    return "none" if MUTATION == "gelu-erf" else "tanh"


def projector_forward(cfg, p, x, N):
    if cfg.pixel_shuffle:
        G, C = cfg.G, cfg.Dv
        x = x.reshape(N, G // 2, 2, G // 2, 2, C).permute(0, 1, 3, 2, 4, 5)
        x = x.reshape(N * (G // 2) * (G // 2), 4 * C)
    h = F.gelu(F.linear(x, p["fc1.weight"], p["fc1.bias"]), approximate=GELU())
    return F.linear(h, p["fc2.weight"], p["fc2.bias"])


def rms_norm(x, w, eps=1e-6):
    eps = 1e-5 if MUTATION == "rms-eps" else eps
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta):
    # x: (T, H, hd), Hugging Face's rotate-half layout: pairs (i, i + hd/2),
    # angle = pos * theta^(-2i/hd)
    hd = x.shape[-1]
    i = torch.arange(hd // 2, dtype=torch.float64)
    theta = 2 * theta if MUTATION == "rope-theta" else theta
    ang = pos.to(torch.float64)[:, None] * torch.pow(torch.tensor(theta, dtype=torch.float64),
                                                      -2.0 * i / hd)[None, :]
    c, s = torch.cos(ang).float()[:, None, :], torch.sin(ang).float()[:, None, :]
    first, second = (slice(0, None, 2), slice(1, None, 2)) if MUTATION == "rope-pairs" else \
        (slice(0, hd // 2), slice(hd // 2, hd))
    x0, x1 = x[..., first], x[..., second]
    out = torch.empty_like(x)
    out[..., first] = x0 * c - x1 * s
    out[..., second] = x0 * s + x1 * c
    return out


def llm_forward(cfg, p, tokens, positions, seq_ids, image_emb, states=None):
    """The logits; with `states` (a list), the final norm's rows at the query
    positions are appended to it."""
    T = tokens.shape[0]
    x = F.embedding(tokens.clamp(min=0).long(), p["wte"])
    img = (tokens == -1)
    if image_emb is not None and img.any():
        x = x.clone()
        x[img] = image_emb
    query = (tokens == -2)
    if query.any():
        Q = p["gen_queries"].shape[0]
        x = x.clone()
        x[query] = p["gen_queries"].repeat(int(query.sum()) // Q, 1)
    hd = cfg.D // cfg.H
    same = seq_ids[:, None] == seq_ids[None, :]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    mask = same if MUTATION == "no-causal" else same & causal
    for l in range(cfg.L):
        b = f"layers.{l}."
        h = rms_norm(x, p[b + "attn_norm.weight"])
        qkv = F.linear(h, p[b + "attn.qkv.weight"]).reshape(T, 3, cfg.H, hd)
        q = rope(qkv[:, 0], positions, cfg.theta).transpose(0, 1)  # H, T, hd
        k = rope(qkv[:, 1], positions, cfg.theta).transpose(0, 1)
        v = qkv[:, 2].transpose(0, 1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        s = s.masked_fill(~mask, float("-inf"))
        o = (torch.softmax(s, dim=-1) @ v).transpose(0, 1).reshape(T, cfg.D)
        x = x + F.linear(o, p[b + "attn.proj.weight"])
        h = rms_norm(x, p[b + "mlp_norm.weight"])
        m = F.silu(F.linear(h, p[b + "mlp.gate.weight"])) * F.linear(h, p[b + "mlp.up.weight"])
        x = x + F.linear(m, p[b + "mlp.down.weight"])
    h = rms_norm(x, p["norm.weight"])
    if states is not None:
        states.append((x if MUTATION == "states-before-norm" else h)[query])
    return F.linear(h, p["lm_head.weight"])


def pack(samples):
    """samples: list of (tiles, tokens). Returns tiles, tokens, targets, positions, seq_ids."""
    tiles = [s[0] for s in samples if s[0].shape[0] > 0]
    toks, tgts, pos, sid = [], [], [], []
    for i, (_, tk, _) in enumerate(samples):
        L = tk.shape[0]
        nxt = torch.cat([tk[1:], torch.tensor([-1], dtype=torch.int32)])
        toks.append(tk)
        tgts.append(torch.where(nxt >= 0, nxt, torch.tensor(-1, dtype=torch.int32)))
        pos.append(torch.arange(L))
        sid.append(torch.full((L,), i))
    return (torch.cat(tiles) if tiles else None, torch.cat(toks), torch.cat(tgts), torch.cat(pos),
            torch.cat(sid))


def step_samples(d, s):
    """(tiles, tokens, output images) per sample; the output images are
    (images, t, noise), the draws of the step, or None."""
    counts = d[f"step{s}/tile_counts"].tolist()
    lengths = d[f"step{s}/lengths"].tolist()
    tiles, tokens = d[f"step{s}/tiles"], d[f"step{s}/tokens"]
    gen_counts = d[f"step{s}/gen_counts"].tolist() if f"step{s}/gen_counts" in d else [0] * len(counts)
    out, ti, to, gi = [], 0, 0, 0
    for c, L, g in zip(counts, lengths, gen_counts):
        gen = None
        if g > 0:
            gen = (d[f"step{s}/gen_images"][gi:gi + g], d[f"step{s}/gen_t"][gi:gi + g],
                   d[f"step{s}/gen_noise"][gi:gi + g])
        out.append((tiles[ti:ti + c], tokens[to:to + L], gen))
        ti += c
        to += L
        gi += g
    return out


def generation_loss_sum(d, P, states, samples):
    """Σ over the microbatch's output images of each one's mean squared
    error, conditioned on the LLM's query states (in sample order)."""
    gens = [s[2] for s in samples if s[2] is not None]
    if not gens:
        return None, 0
    x0 = torch.cat([g[0] for g in gens])
    t = torch.cat([g[1] for g in gens])
    noise = torch.cat([g[2] for g in gens])
    tt = t[:, None, None, None]
    x_t = (1 - tt) * x0 + tt * noise
    gcfg = d["gen/config"].tolist()
    gcfg[-1] = x0.shape[0]
    v = generator_golden.forward(gcfg, P["generator"], P["generator_denoiser"], x_t, t,
                                 torch.cat(states))
    return ((v - (noise - x0)) ** 2).mean(dim=(1, 2, 3)).sum(), x0.shape[0]


def microbatch_loss_sum(cfg, P, samples, d=None):
    """The logits, the LM loss sum and its token count; with the dump `d` of
    a model with a generator also the generation loss sum and image count."""
    tiles, tokens, targets, positions, seq_ids = pack(samples)
    image_emb = None
    if tiles is not None:
        image_emb = projector_forward(cfg, P["projector"], vit_forward(cfg, P["vit"], tiles),
                                      tiles.shape[0])
    states = []
    logits = llm_forward(cfg, P["llm"], tokens, positions, seq_ids, image_emb, states)
    loss = F.cross_entropy(logits, targets.long(), ignore_index=-1, reduction="sum")
    if d is None or "gen/config" not in d:
        return logits, loss, int((targets >= 0).sum())
    gen, images = generation_loss_sum(d, P, states, samples)
    return logits, loss, int((targets >= 0).sum()), gen, images


def report(failures):
    """Exits 1 naming every failure ("golden: FAILED"), or says all match."""
    if failures:
        print("golden: FAILED\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("golden: all match")


def check(name, got, want, tol, failures):
    atol, rtol = tol
    bad = (got - want).abs() > atol + rtol * want.abs()
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        failures.append(f"{name}: {int(bad.sum())} of {bad.numel()} off; first [{i}] torch "
                        f"{got.flatten()[i].item():.7g} vs loom {want.flatten()[i].item():.7g}")
    return float((got - want).abs().max()) if got.numel() else 0.0


def modules(d):
    return ("vit", "projector", "llm") + (("generator", "generator_denoiser")
                                          if "gen/config" in d else ())


def step_counts(samples):
    """The global batch's loss tokens and output images."""
    n = sum(int(((torch.cat([s[1][1:], torch.tensor([-1], dtype=torch.int32)])) >= 0).sum())
            for s in samples)
    return n, sum(s[2][0].shape[0] for s in samples if s[2] is not None)


def backward_step(cfg, P, d, samples, lam):
    """Loom's microbatched step: each microbatch's LM loss over the global
    loss tokens plus λ times its generation loss over the global output
    images, backward; returns the LM and generation loss sums."""
    n, images = step_counts(samples)
    M = cfg.micro
    lm = gen = 0.0
    for m in range(M):
        mb = samples[len(samples) * m // M: len(samples) * (m + 1) // M]
        out = microbatch_loss_sum(cfg, P, mb, d)
        total = out[1] / n
        if len(out) > 3 and out[3] is not None:
            total = total + lam * out[3] / images
            gen += out[3].item()
        total.backward()
        lm += out[1].item()
    return lm / n, (gen / images if images else 0.0)


def main():
    if MUTATION and MUTATION not in MUTATIONS:
        sys.exit(f"unknown mutation {MUTATION!r}; known: {', '.join(MUTATIONS)}")
    d = read_dump(sys.argv[1])
    cfg = Cfg(d["config"], d["hparams"])
    tol = {k: d[f"tolerance/{k}"].tolist() for k in ("logits", "grads", "losses")}
    lam = 0.0
    if "gen/config" in d:
        global generator_golden
        import generator_golden_test as generator_golden  # the generator's reference
        generator_golden.time_scale, generator_golden.eps, lam = d["gen/hparams"].tolist()
    P = {m: params_of(d, f"param/{m}/") for m in modules(d)}
    failures = []

    # 1. Logits and loss at the initial weights, step 0's batch as one microbatch.
    samples = step_samples(d, 0)
    logits, loss_sum, n = microbatch_loss_sum(cfg, P, samples)[:3]
    err_logits = check("logits", logits.detach(), d["logits"], tol["logits"], failures)
    loss0 = loss_sum.item() / n
    check("loss", torch.tensor([loss0]), d["loss"], tol["logits"], failures)

    # 2. Gradients: microbatched as Loom does, each scaled by 1 / global loss
    # tokens (and λ / global output images).
    backward_step(cfg, P, d, samples, lam)
    worst = 0.0
    for mod in P:
        for name, t in P[mod].items():
            if t.grad is None or not t.grad.abs().max() > 0:
                failures.append(f"grad/{mod}/{name}: none in torch")
                continue
            worst = max(worst, check(f"grad/{mod}/{name}", t.grad, d[f"grad/{mod}/{name}"],
                                     tol["grads"], failures))

    # 3. Training steps from the same initial weights.
    P = {m: params_of(d, f"param/{m}/") for m in modules(d)}
    all_params = [t for mod in P.values() for t in mod.values()]
    opt = adamw(cfg, P, decay_all=MUTATION == "decay-all")
    losses, gen_losses = [], []
    for s in range(cfg.steps):
        opt.zero_grad()
        lm, gen = backward_step(cfg, P, d, step_samples(d, s), lam)
        losses.append(lm)
        gen_losses.append(gen)
        torch.nn.utils.clip_grad_norm_(all_params, cfg.clip)
        warm = min(1.0, (s + 1) / cfg.warmup) if cfg.warmup > 0 else 1.0
        for g in opt.param_groups:
            g["lr"] = cfg.lr * warm
        opt.step()
    check("losses", torch.tensor(losses), d["losses"], tol["losses"], failures)
    if "gen/losses" in d:
        check("gen/losses", torch.tensor(gen_losses), d["gen/losses"], tol["losses"], failures)

    print(f"golden: logits max|diff| {err_logits:.3g}, loss torch {loss0:.6f} loom "
          f"{d['loss'].item():.6f}, worst grad |diff| {worst:.3g}")
    print("golden: losses torch " + " ".join(f"{x:.5f}" for x in losses))
    print("golden: losses loom  " + " ".join(f"{x:.5f}" for x in d["losses"].tolist()))
    if "gen/losses" in d:
        print("golden: generation losses torch " + " ".join(f"{x:.5f}" for x in gen_losses))
        print("golden: generation losses loom  " +
              " ".join(f"{x:.5f}" for x in d["gen/losses"].tolist()))
    report(failures)


if __name__ == "__main__":
    main()
