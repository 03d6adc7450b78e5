"""Plain-torch reimplementations of the Hugging Face models Loom loads, from transformers'
definitions (no transformers here): LlamaForCausalLM / Qwen2ForCausalLM (RMSNorm, rotate-half
RoPE with the llama3 frequency scaling, grouped-query attention by repeat_kv, SwiGLU, tied
embeddings), CLIP and SigLIP vision towers, and LLaVA (hidden_states[vision_feature_layer], the
projector, image features scattered into the token embeddings).

`mutation` (hf_golden_test.py's MUTATIONS) makes one deliberate mistake, for the test to see.
"""
import math

import torch
import torch.nn.functional as F


def head_dim(c):
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def rope_settings(c):
    if c.get("rope_parameters"):
        r = dict(c["rope_parameters"])
        return r.pop("rope_theta"), r
    return c["rope_theta"], (c.get("rope_scaling") or {"rope_type": "default"})


def inv_freq(c, mutation):
    """Hugging Face's default frequencies, then _compute_llama3_parameters."""
    dim = head_dim(c)
    base, scaling = rope_settings(c)
    f = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if scaling.get("rope_type", scaling.get("type")) != "llama3" or mutation == "no-rope-scaling":
        return f
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / f
    scaled = torch.where(wavelen > low_wavelen, f / factor, f)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, cos, sin, mutation):
    # x: (heads, T, hd); cos/sin: (T, hd) = cat(freqs, freqs)
    if mutation == "rope-pairs":
        half = x.shape[-1] // 2
        c, s = cos[:, :half], sin[:, :half]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out
    return x * cos + rotate_half(x) * sin


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def forward(c, P, seqs, mutation, body="model.", head="lm_head.", embeds=None, image_token=None):
    """Logits (T, V) of the packed sequences and the mean next-token loss (over targets that
    are text). `embeds`: the sequences' input embeddings where the caller made them."""
    H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], head_dim(c)
    eps = c["rms_norm_eps"]
    f = inv_freq(c, mutation)
    bias = c["model_type"] == "qwen2" and mutation != "no-qkv-bias"
    logits_all, loss_sum, n = [], 0.0, 0
    for si, seq in enumerate(seqs):
        T = len(seq)
        tok = torch.tensor(seq)
        pos = torch.arange(T).float()
        freqs = pos[:, None] * f[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        x = F.embedding(tok, P[body + "embed_tokens.weight"]) if embeds is None else embeds[si]
        for i in range(c["num_hidden_layers"]):
            p = f"{body}layers.{i}."
            h = rms_norm(x, P[p + "input_layernorm.weight"], eps)
            q = F.linear(h, P[p + "self_attn.q_proj.weight"],
                         P[p + "self_attn.q_proj.bias"] if bias else None)
            k = F.linear(h, P[p + "self_attn.k_proj.weight"],
                         P[p + "self_attn.k_proj.bias"] if bias else None)
            v = F.linear(h, P[p + "self_attn.v_proj.weight"],
                         P[p + "self_attn.v_proj.bias"] if bias else None)
            q = q.view(T, H, hd).transpose(0, 1)
            k = k.view(T, KV, hd).transpose(0, 1)
            v = v.view(T, KV, hd).transpose(0, 1)
            q, k = apply_rope(q, cos, sin, mutation), apply_rope(k, cos, sin, mutation)
            if mutation == "gqa-tiled":
                k, v = k.repeat(H // KV, 1, 1), v.repeat(H // KV, 1, 1)
            else:  # repeat_kv: head h reads group h // (H / KV)
                k, v = k.repeat_interleave(H // KV, dim=0), v.repeat_interleave(H // KV, dim=0)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            s = s.masked_fill(~mask, float("-inf"))
            o = (torch.softmax(s, dim=-1) @ v).transpose(0, 1).reshape(T, H * hd)
            x = x + F.linear(o, P[p + "self_attn.o_proj.weight"])
            h = rms_norm(x, P[p + "post_attention_layernorm.weight"], eps)
            m = F.silu(F.linear(h, P[p + "mlp.gate_proj.weight"])) * \
                F.linear(h, P[p + "mlp.up_proj.weight"])
            x = x + F.linear(m, P[p + "mlp.down_proj.weight"])
        w = P[body + "embed_tokens.weight"] if c["tie_word_embeddings"] else P[head + "weight"]
        logits = F.linear(rms_norm(x, P[body + "norm.weight"], eps), w)
        logits_all.append(logits)
        keep = tok[1:] != (image_token if image_token is not None else -1)
        loss_sum = loss_sum + F.cross_entropy(logits[:-1][keep], tok[1:][keep], reduction="sum")
        n += int(keep.sum())
    return torch.cat(logits_all), loss_sum / n


def act(name, x):
    if name == "quick_gelu":
        return x * torch.sigmoid(1.702 * x)
    return F.gelu(x, approximate="tanh" if name == "gelu_pytorch_tanh" else "none")


def vision_forward(vc, P, pre, pixels, feature_layer, strategy, mutation):
    """hidden_states[feature_layer] of CLIPVisionModel / SiglipVisionModel, selected as LLaVA
    does (the class token dropped by "default")."""
    clip = vc["model_type"] == "clip_vision_model"
    D, nh, ps = vc["hidden_size"], vc["num_attention_heads"], vc["patch_size"]
    hd = D // nh
    eps = vc.get("layer_norm_eps", 1e-5 if clip else 1e-6)
    fn = vc.get("hidden_act", "quick_gelu" if clip else "gelu_pytorch_tanh")
    e = pre + "embeddings."
    w = P[e + "patch_embedding.weight"]
    if mutation == "patch-xy-swapped":
        w = w.transpose(2, 3)
    x = F.conv2d(pixels, w, None if clip else P[e + "patch_embedding.bias"], stride=ps)
    x = x.flatten(2).transpose(1, 2)  # (N, patches, D)
    N = x.shape[0]
    if clip:
        x = torch.cat([P[e + "class_embedding"].expand(N, 1, D), x], dim=1)
    x = x + P[e + "position_embedding.weight"][None]
    if clip:
        x = F.layer_norm(x, (D,), P[pre + "pre_layrnorm.weight"], P[pre + "pre_layrnorm.bias"], eps)
    L = vc["num_hidden_layers"]
    layers = L + 1 + feature_layer if feature_layer < 0 else feature_layer
    if mutation == "vision-last-layer":
        layers = L
    S = x.shape[1]
    for i in range(layers):
        p = f"{pre}encoder.layers.{i}."
        h = F.layer_norm(x, (D,), P[p + "layer_norm1.weight"], P[p + "layer_norm1.bias"], eps)
        q, k, v = (F.linear(h, P[p + f"self_attn.{z}_proj.weight"], P[p + f"self_attn.{z}_proj.bias"])
                   .view(N, S, nh, hd).transpose(1, 2) for z in "qkv")
        a = torch.softmax((q @ k.transpose(-1, -2)) * hd ** -0.5, dim=-1) @ v
        a = a.transpose(1, 2).reshape(N, S, D)
        x = x + F.linear(a, P[p + "self_attn.out_proj.weight"], P[p + "self_attn.out_proj.bias"])
        h = F.layer_norm(x, (D,), P[p + "layer_norm2.weight"], P[p + "layer_norm2.bias"], eps)
        h = F.linear(act(fn, F.linear(h, P[p + "mlp.fc1.weight"], P[p + "mlp.fc1.bias"])),
                     P[p + "mlp.fc2.weight"], P[p + "mlp.fc2.bias"])
        x = x + h
    return x[:, 1:] if strategy == "default" else x


def llava_forward(c, P, prefixes, seqs, pixels, mutation):
    """LlavaForConditionalGeneration; `prefixes`: the LLM body, lm_head, tower and projector keys."""
    body, head, vis, proj = prefixes
    feats = vision_forward(c["vision_config"], P, vis, pixels, c["vision_feature_layer"],
                           c["vision_feature_select_strategy"], mutation)
    h = F.linear(feats, P[proj + "linear_1.weight"], P[proj + "linear_1.bias"])
    h = F.gelu(h, approximate="tanh" if mutation == "projector-gelu-tanh" else "none")
    img = F.linear(h, P[proj + "linear_2.weight"], P[proj + "linear_2.bias"]).reshape(
        -1, c["text_config"]["hidden_size"])
    image_token, used, embeds = c["image_token_index"], 0, []
    for seq in seqs:
        tok = torch.tensor(seq)
        x = F.embedding(tok, P[body + "embed_tokens.weight"])
        slots = (tok == image_token).nonzero().flatten()
        x = x.index_put((slots,), img[used:used + len(slots)])  # masked_scatter, as LLaVA
        used += len(slots)
        embeds.append(x)
    assert used == img.shape[0], (used, img.shape)
    return forward(c["text_config"], P, seqs, mutation, body, head, embeds, image_token)
