#!/usr/bin/python3
"""Golden test of the Hugging Face models Loom loads (runtime/hf/hf_llm.h, hf_llava.h).

For each case this script writes a tiny random Hugging Face directory
(config.json and safetensors, single-file or sharded with the index, as
transformers' save_pretrained lays them out), runs the plain-torch
reimplementation of hf_reference.py, and compares with Loom on
the same packed token sequences: every logit, the loss and the gradient of
every Hugging Face tensor (hf_golden_dump), `loom-model logits`, and
`loom-model export` back to the source bit for bit.

  hf_golden_test.py WORKDIR HF_GOLDEN_DUMP LOOM_MODEL [MUTATION]

A MUTATION changes the torch reference; the comparison must then fail
("hf golden: FAILED"), which shows the test can see that mistake.
Run with Debian's /usr/bin/python3 (python3-torch). No transformers.
"""
import json
import math
import os
import struct
import subprocess
import sys

import torch

from hf_reference import forward, head_dim, llava_forward

torch.set_default_dtype(torch.float32)

MUTATIONS = {
    "rope-pairs": "RoPE rotates interleaved pairs (2i, 2i+1) instead of halves",
    "no-rope-scaling": "the llama3 rope_scaling ignored",
    "gqa-tiled": "query head h reads key/value head h % kv instead of h // (heads / kv)",
    "no-qkv-bias": "Qwen2's q/k/v biases left out",
    "vision-last-layer": "LLaVA's image features from the tower's last layer, not the "
                         "vision_feature_layer",
    "patch-xy-swapped": "the patch embedding's kernel read with x and y swapped",
    "projector-gelu-tanh": "the projector's GELU as the tanh approximation, not the exact one",
}

DTYPES = {"F32": (torch.float32, 4), "BF16": (torch.bfloat16, 2), "F16": (torch.float16, 2)}


# ---------------------------------------------------------------- safetensors

def tensor_bytes(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def write_safetensors(path, tensors, dtype):
    """tensors: list of (name, fp32 tensor) stored as `dtype`."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors:
        b = tensor_bytes(t.to(DTYPES[dtype][0]))
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def save_model(d, tensors, dtype, shards):
    """As save_pretrained: model.safetensors, or `shards` files plus the index."""
    os.makedirs(d, exist_ok=True)
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), tensors, dtype)
        return
    per = math.ceil(len(tensors) / shards)
    weight_map, total = {}, 0
    for k in range(shards):
        part = tensors[k * per:(k + 1) * per]
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(os.path.join(d, fname), part, dtype)
        for name, t in part:
            weight_map[name] = fname
            total += t.numel() * DTYPES[dtype][1]
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack_from("<Q", buf, 0)
    header = json.loads(buf[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        assert e["dtype"] == "F32", name
        out[name] = torch.frombuffer(bytearray(buf[8 + n + b:8 + n + end]),
                                     dtype=torch.float32).reshape(e["shape"])
    return out, meta


def read_raw(d):
    """Every tensor of a directory (single file or index + shards): name -> (dtype, shape, bytes)."""
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
        else ["model.safetensors"]
    out = {}
    for fname in files:
        with open(os.path.join(d, fname), "rb") as f:
            buf = f.read()
        (n,) = struct.unpack_from("<Q", buf, 0)
        header = json.loads(buf[8:8 + n])
        header.pop("__metadata__", None)
        for name, e in header.items():
            b, end = e["data_offsets"]
            out[name] = (e["dtype"], e["shape"], buf[8 + n + b:8 + n + end])
    return out


# ------------------------------------------------------------------ the cases

def llama(**over):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 96,
         "hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 80, "hidden_act": "silu",
         "rms_norm_eps": 1e-5, "max_position_embeddings": 128, "rope_theta": 500000.0,
         "rope_scaling": None, "tie_word_embeddings": False, "attention_bias": False,
         "mlp_bias": False, "torch_dtype": "bfloat16"}
    c.update(over)
    return c


CASES = [
    # Llama 3 style: GQA, an explicit head_dim that is not hidden / heads, untied.
    ("llama-gqa", llama(head_dim=16), "BF16", 1),
    # Llama 3.2 style: tied, llama3 RoPE scaling in the newer rope_parameters
    # spelling, multi-query attention, sharded F32.
    ("llama-tied-llama3", llama(num_key_value_heads=1, tie_word_embeddings=True,
                                rope_theta=None, rope_scaling=None, torch_dtype="float32",
                                rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0,
                                                 "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0,
                                                 "original_max_position_embeddings": 16}),
     "F32", 3),
    # Qwen2 style: q/k/v biases, tied, sharded BF16.
    ("qwen2-bias-tied", {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                         "vocab_size": 80, "hidden_size": 32, "num_hidden_layers": 3,
                         "num_attention_heads": 4, "num_key_value_heads": 2,
                         "intermediate_size": 64, "hidden_act": "silu", "rms_norm_eps": 1e-6,
                         "max_position_embeddings": 256, "rope_theta": 1000000.0,
                         "rope_scaling": None, "tie_word_embeddings": True,
                         "use_sliding_window": False, "torch_dtype": "bfloat16"},
     "BF16", 2),
]


def clip_vision():
    # As LLaVA's configs write it: hidden_act and layer_norm_eps left to the family's defaults.
    return {"model_type": "clip_vision_model", "hidden_size": 32, "intermediate_size": 64,
            "num_attention_heads": 4, "num_hidden_layers": 3, "image_size": 16,
            "patch_size": 4, "projection_dim": 16}


def siglip_vision():
    return {"model_type": "siglip_vision_model", "hidden_size": 24, "intermediate_size": 40,
            "num_attention_heads": 2, "num_hidden_layers": 2, "image_size": 12,
            "patch_size": 4, "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6}


def llava(text, vision, feature_layer, strategy, patches):
    return {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
            "text_config": text, "vision_config": vision, "vision_feature_layer": feature_layer,
            "vision_feature_select_strategy": strategy, "projector_hidden_act": "gelu",
            "image_token_index": text["vocab_size"] - 1, "image_seq_length": patches}


LLAVA_CASES = [
    # LLaVA-1.5 style: CLIP tower (features of the penultimate layer, class token dropped; the
    # last layer and post_layernorm stored but not run), Llama with GQA; transformers' key
    # layout before 4.52, BF16 in 2 shards.
    ("llava-clip-llama", llava(llama(), clip_vision(), -2, "default", 16), "BF16", 2, "classic"),
    # SigLIP tower (every patch, the last layer), Qwen2 tied; the layout of transformers 4.52+,
    # F32 in one file.
    ("llava-siglip-qwen2", llava({"model_type": "qwen2", "vocab_size": 70, "hidden_size": 32,
                                  "num_hidden_layers": 2, "num_attention_heads": 4,
                                  "num_key_value_heads": 2, "intermediate_size": 48,
                                  "hidden_act": "silu", "rms_norm_eps": 1e-6,
                                  "max_position_embeddings": 256, "rope_theta": 1000000.0,
                                  "tie_word_embeddings": True, "use_sliding_window": False},
                                 siglip_vision(), -1, "full", 9), "F32", 1, "nested"),
]

LAYOUTS = {  # llm body, lm_head, vision tower, projector
    "classic": ("language_model.model.", "language_model.lm_head.", "vision_tower.vision_model.",
                "multi_modal_projector."),
    "nested": ("model.language_model.", "lm_head.", "model.vision_tower.vision_model.",
               "model.multi_modal_projector."),
}


def random_weights(c, gen, body="model.", head="lm_head."):
    """The HF tensors in save_pretrained's order, fp32 values (rounded by the dtype later)."""
    D, V, F_, L = c["hidden_size"], c["vocab_size"], c["intermediate_size"], c["num_hidden_layers"]
    H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], head_dim(c)
    bias = c["model_type"] == "qwen2"

    def rnd(*shape, std=0.08):
        return torch.randn(*shape, generator=gen) * std

    t = [(body + "embed_tokens.weight", rnd(V, D, std=0.5))]
    for i in range(L):
        p = f"{body}layers.{i}."
        t.append((p + "input_layernorm.weight", 1 + rnd(D, std=0.2)))
        t.append((p + "self_attn.q_proj.weight", rnd(H * hd, D, std=0.25)))
        t.append((p + "self_attn.k_proj.weight", rnd(KV * hd, D, std=0.25)))
        t.append((p + "self_attn.v_proj.weight", rnd(KV * hd, D)))
        if bias:
            t.append((p + "self_attn.q_proj.bias", rnd(H * hd, std=0.3)))
            t.append((p + "self_attn.k_proj.bias", rnd(KV * hd, std=0.3)))
            t.append((p + "self_attn.v_proj.bias", rnd(KV * hd, std=0.3)))
        t.append((p + "self_attn.o_proj.weight", rnd(D, H * hd)))
        t.append((p + "post_attention_layernorm.weight", 1 + rnd(D, std=0.2)))
        t.append((p + "mlp.gate_proj.weight", rnd(F_, D)))
        t.append((p + "mlp.up_proj.weight", rnd(F_, D)))
        t.append((p + "mlp.down_proj.weight", rnd(D, F_)))
    t.append((body + "norm.weight", 1 + rnd(D, std=0.2)))
    if not c["tie_word_embeddings"]:
        t.append((head + "weight", rnd(V, D, std=0.2)))
    return t


def vision_weights(vc, gen, pre):
    """A CLIP or SigLIP tower's tensors, every layer and post_layernorm included."""
    clip = vc["model_type"] == "clip_vision_model"
    D, H, P = vc["hidden_size"], vc["intermediate_size"], vc["patch_size"]
    n = (vc["image_size"] // P) ** 2 + (1 if clip else 0)

    def rnd(*shape, std=0.1):
        return torch.randn(*shape, generator=gen) * std

    e = pre + "embeddings."
    t = []
    if clip:
        t.append((e + "class_embedding", rnd(D, std=0.5)))
    t.append((e + "patch_embedding.weight", rnd(D, 3, P, P, std=0.2)))
    if not clip:
        t.append((e + "patch_embedding.bias", rnd(D, std=0.2)))
    t.append((e + "position_embedding.weight", rnd(n, D, std=0.3)))
    if clip:
        t.append((pre + "pre_layrnorm.weight", 1 + rnd(D, std=0.2)))
        t.append((pre + "pre_layrnorm.bias", rnd(D, std=0.2)))
    for i in range(vc["num_hidden_layers"]):
        p = f"{pre}encoder.layers.{i}."
        for x in "kvq":
            t.append((p + f"self_attn.{x}_proj.weight", rnd(D, D, std=0.25)))
            t.append((p + f"self_attn.{x}_proj.bias", rnd(D, std=0.2)))
        t.append((p + "self_attn.out_proj.weight", rnd(D, D, std=0.15)))
        t.append((p + "self_attn.out_proj.bias", rnd(D)))
        t.append((p + "layer_norm1.weight", 1 + rnd(D, std=0.2)))
        t.append((p + "layer_norm1.bias", rnd(D)))
        t.append((p + "mlp.fc1.weight", rnd(H, D, std=0.2)))
        t.append((p + "mlp.fc1.bias", rnd(H)))
        t.append((p + "mlp.fc2.weight", rnd(D, H, std=0.15)))
        t.append((p + "mlp.fc2.bias", rnd(D)))
        t.append((p + "layer_norm2.weight", 1 + rnd(D, std=0.2)))
        t.append((p + "layer_norm2.bias", rnd(D)))
    t.append((pre + "post_layernorm.weight", 1 + rnd(D, std=0.2)))
    t.append((pre + "post_layernorm.bias", rnd(D)))
    return t


def projector_weights(c, gen, pre):
    Dv, D = c["vision_config"]["hidden_size"], c["text_config"]["hidden_size"]
    return [(pre + "linear_1.weight", torch.randn(D, Dv, generator=gen) * 0.2),
            (pre + "linear_1.bias", torch.randn(D, generator=gen) * 0.1),
            (pre + "linear_2.weight", torch.randn(D, D, generator=gen) * 0.2),
            (pre + "linear_2.bias", torch.randn(D, generator=gen) * 0.1)]


# ----------------------------------------------------------------- comparing

def check(name, got, want, tol, failures):
    atol, rtol = tol
    if got.shape != want.shape:
        failures.append(f"{name}: shape torch {list(got.shape)} vs loom {list(want.shape)}")
        return 0.0
    bad = (got - want).abs() > atol + rtol * want.abs()
    if bad.any():
        i = int(bad.flatten().nonzero()[0])
        failures.append(f"{name}: {int(bad.sum())} of {bad.numel()} off; first [{i}] torch "
                        f"{got.flatten()[i].item():.7g} vs loom {want.flatten()[i].item():.7g}")
    return float((got - want).abs().max()) if got.numel() else 0.0


def llm_case(work, name, config, dtype, shards, mutation):
    """A LlamaForCausalLM / Qwen2ForCausalLM directory: (weights, sequences, reference, args)."""
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    d = os.path.join(work, name)
    weights = random_weights(config, gen)
    save_model(d, weights, dtype, shards)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({k: v for k, v in config.items() if v is not None or k == "rope_scaling"}, f,
                  indent=2)
    V = config["vocab_size"]
    seqs = [torch.randint(0, V, (n,), generator=gen).tolist() for n in (23, 9)]
    return weights, seqs, lambda P, s=seqs: forward(config, P, s, mutation), []


def check_generate(loom_model, name, d, P, reference, prompt, tol, failures):
    """loom-model generate's greedy ids: at each step the token torch ranks first on the same
    prefix, or one whose torch logit is within the logits tolerance of the first (a near tie
    may fall either way in fp32)."""
    n = 8
    r = subprocess.run([loom_model, "generate", "--hf", d, "--tokens", ",".join(map(str, prompt)),
                        "--max_new_tokens", str(n)], check=True, capture_output=True, text=True)
    out = json.loads(r.stdout)
    if out["prompt"] != prompt or len(out["ids"]) != n:
        failures.append(f"{name} generate: printed {out}")
        return
    prefix = list(prompt)
    with torch.no_grad():
        for i, tok in enumerate(out["ids"]):
            last = reference(P, [prefix])[0][-1]
            best = int(last.argmax())
            atol, rtol = tol
            if tok != best and last[best] - last[tok] > atol + rtol * abs(last[best]):
                failures.append(f"{name} generate: token {i} is {tok}, torch's greedy choice "
                                f"{best} (logits {last[tok]:.6g} vs {last[best]:.6g})")
                return
            prefix.append(tok)
    print(f"hf golden {name}: loom-model generate's {n} greedy tokens are torch's")


def llava_case(work, name, config, dtype, shards, layout, mutation):
    """A LlavaForConditionalGeneration directory in `layout`, three images in two sequences."""
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    d = os.path.join(work, name)
    body, head, vis, proj = LAYOUTS[layout]
    weights = (random_weights(config["text_config"], gen, body, head) +
               vision_weights(config["vision_config"], gen, vis) +
               projector_weights(config, gen, proj))
    save_model(d, weights, dtype, shards)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    S, per = config["vision_config"]["image_size"], config["image_seq_length"]
    image = config["image_token_index"]

    def text(n):
        return torch.randint(0, image, (n,), generator=gen).tolist()

    seqs = [text(5) + [image] * per + text(6), [image] * per + text(3) + [image] * per + text(4)]
    pixels = torch.randn(3, 3, S, S, generator=gen)
    px = os.path.join(work, name + ".pixels.safetensors")
    write_safetensors(px, [("pixel_values", pixels)], "F32")
    return (weights, seqs, lambda P: llava_forward(config, P, LAYOUTS[layout], seqs, pixels, mutation),
            ["--pixels", px])


def to_classic(n):
    """A tensor name of transformers' LLaVA layout from 4.52 in the earlier one."""
    for new, old in (("model.language_model.", "language_model.model."),
                     ("lm_head.", "language_model.lm_head."),
                     ("model.vision_tower.", "vision_tower."),
                     ("model.multi_modal_projector.", "multi_modal_projector.")):
        if n.startswith(new):
            return old + n[len(new):]
    return n


def check_export(loom_model, name, d, dtype, tokens, extra, printed, failures):
    """`loom-model export` of d: the same tensors bit for bit (a LLaVA tower cut to the layers
    it runs, under the pre-4.52 keys, with an identity post_layernorm), and a LLaVA export
    computes the same logits."""
    back = d + ".export"
    subprocess.run([loom_model, "export", "--hf", d, "--out", back, "--dtype", dtype.lower(),
                    "--max_shard_mb", "1"], check=True, capture_output=True)
    src, got = read_raw(d), read_raw(back)
    config = json.load(open(os.path.join(d, "config.json")))
    exported = json.load(open(os.path.join(back, "config.json")))
    if config.get("model_type") == "llava":
        vc = config["vision_config"]
        used = vc["num_hidden_layers"] + 1 + config["vision_feature_layer"]
        want = {}
        for n, v in src.items():
            n = to_classic(n)
            parts = n.split(".")
            if "post_layernorm" in parts or ("layers" in parts and "vision_tower" in parts and
                                             int(parts[parts.index("layers") + 1]) >= used):
                continue
            want[n] = v
        D = vc["hidden_size"]
        p = "vision_tower.vision_model.post_layernorm."
        want[p + "weight"] = (dtype, [D], tensor_bytes(torch.ones(D).to(DTYPES[dtype][0])))
        want[p + "bias"] = (dtype, [D], tensor_bytes(torch.zeros(D).to(DTYPES[dtype][0])))
        config["vision_config"]["num_hidden_layers"] = used
        config["vision_feature_layer"] = -1
        r = subprocess.run([loom_model, "logits", "--hf", back, "--tokens", tokens] + extra,
                           check=True, capture_output=True, text=True)
        if json.loads(r.stdout) != printed:
            failures.append(f"{name} export: the exported directory computes other logits")
    else:
        want = src
    if config != exported:
        failures.append(f"{name} export: config.json is not the source's (with the tower cut)")
    if set(want) != set(got):
        failures.append(f"{name} export: keys differ: {sorted(set(want) ^ set(got))[:4]}")
    diff = [k for k in want if k in got and want[k] != got[k]]
    if diff:
        failures.append(f"{name} export: {len(diff)} tensors differ in dtype, shape or bytes, "
                        f"first {diff[0]}")
    print(f"hf golden {name}: exported {len(got)} tensors, "
          f"{'bit-identical' if not diff and set(want) == set(got) else 'DIFFERENT'}")


def run_case(work, dump, loom_model, name, dtype, shards, mutation, failures, case,
             generate=False):
    weights, seqs, reference, extra = case
    d = os.path.join(work, name)
    tokens = "/".join(",".join(map(str, s)) for s in seqs)
    out = os.path.join(work, name + ".loom.safetensors")
    subprocess.run([dump, "--hf", d, "--tokens", tokens, "--out", out] + extra, check=True)
    loom, meta = read_safetensors(out)
    tol_logits = [float(x) for x in meta["tolerance.logits"].split()]
    tol_grads = [float(x) for x in meta["tolerance.grads"].split()]

    # The reference reads the stored (dtype-rounded) values as fp32, as Loom does.
    P = {n: t.to(DTYPES[dtype][0]).float().requires_grad_(True) for n, t in weights}
    logits, loss = reference(P)
    loss.backward()
    err = check(f"{name} logits", logits.detach(), loom["logits"], tol_logits, failures)
    check(f"{name} loss", loss.detach().reshape(1), loom["loss"], tol_logits, failures)
    want_names = {"grad." + n for n, t in P.items() if t.grad is not None}  # not: unused
    got_names = {n for n in loom if n.startswith("grad.")}
    if want_names != got_names:
        failures.append(f"{name}: gradient tensors differ: only torch "
                        f"{sorted(want_names - got_names)}, only loom {sorted(got_names - want_names)}")
    worst = 0.0
    for n, t in P.items():
        if "grad." + n in loom:
            g = t.grad if t.grad is not None else torch.zeros_like(t)  # unused by a mutation
            worst = max(worst, check(f"{name} grad {n}", g, loom["grad." + n], tol_grads,
                                     failures))

    # The user's check: loom-model logits prints the last position's logits.
    r = subprocess.run([loom_model, "logits", "--hf", d, "--tokens", tokens] + extra, check=True,
                       capture_output=True, text=True)
    printed = json.loads(r.stdout)
    if printed["position"] != logits.shape[0] - 1 or printed["vocab"] != logits.shape[1]:
        failures.append(f"{name}: loom-model logits printed position {printed['position']}")
    check(f"{name} loom-model logits", logits[-1].detach(), torch.tensor(printed["logits"]),
          tol_logits, failures)
    if generate:
        check_generate(loom_model, name, d, P, reference, seqs[1], tol_logits, failures)
    # Hugging Face -> Loom -> Hugging Face: every tensor back bit for bit.
    if not mutation:
        check_export(loom_model, name, d, dtype, tokens, extra, printed, failures)
    print(f"hf golden {name} ({dtype}, {shards} file{'s' if shards > 1 else ''}): logits "
          f"max|diff| {err:.3g}, loss torch {loss.item():.6f} loom {loom['loss'].item():.6f}, "
          f"worst grad |diff| {worst:.3g}")


# preprocessor_config.json of the two towers' processors, as their checkpoints ship them
# (CLIP: shortest edge, center crop, bicubic; SigLIP: a square resize, here bilinear).
PROCESSORS = {
    "clip_vision_model": lambda S: {
        "image_processor_type": "CLIPImageProcessor", "do_resize": True,
        "size": {"shortest_edge": S}, "resample": 3, "do_center_crop": True,
        "crop_size": {"height": S, "width": S}, "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "do_convert_rgb": True},
    "siglip_vision_model": lambda S: {
        "image_processor_type": "SiglipImageProcessor", "do_resize": True,
        "size": {"height": S, "width": S}, "resample": 2, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5]},
}


def pil_pixels(proc, path, pad=False):
    """What transformers' processor computes (PIL resize, crop, rescale, normalise); with `pad`,
    after LLaVA-1.5's expand2square (image_aspect_ratio "pad") of the mean colour."""
    import numpy
    from PIL import Image
    img = Image.open(path).convert("RGB")
    w, h = img.size
    if pad and w != h:
        side = max(w, h)
        square = Image.new(img.mode, (side, side), tuple(int(x * 255) for x in proc["image_mean"]))
        square.paste(img, ((side - w) // 2, (side - h) // 2))
        img = square
        w, h = img.size
    if "shortest_edge" in proc["size"]:  # get_resize_output_image_size(default_to_square=False)
        s = proc["size"]["shortest_edge"]
        size = (int(s * w / h), s) if w >= h else (s, int(s * h / w))
    else:
        size = (proc["size"]["width"], proc["size"]["height"])
    img = img.resize(size, resample=proc["resample"])
    if proc.get("do_center_crop"):
        ch, cw = proc["crop_size"]["height"], proc["crop_size"]["width"]
        top, left = (img.size[1] - ch) // 2, (img.size[0] - cw) // 2
        img = img.crop((left, top, left + cw, top + ch))
    a = numpy.asarray(img, dtype=numpy.float32) * proc["rescale_factor"]
    a = (a - numpy.array(proc["image_mean"])) / numpy.array(proc["image_std"])
    return torch.tensor(a.transpose(2, 0, 1), dtype=torch.float32)


def check_images(work, loom_model, name, config, tokens, failures):
    """`loom-model pixels` against PIL on a PNG and a JPEG, one shrunk and one enlarged, not
    square; then `logits --image` equals `logits --pixels` of those pixels."""
    import numpy
    from PIL import Image
    d = os.path.join(work, name)
    vc = config["vision_config"]
    proc = PROCESSORS[vc["model_type"]](vc["image_size"])
    with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
        json.dump(proc, f, indent=2)
    rng = numpy.random.default_rng(7)
    files = []
    for i, (w, h, ext) in enumerate(((50, 37, "png"), (9, 13, "jpg"))):
        y, x = numpy.mgrid[0:h, 0:w]
        smooth = numpy.stack([x * 255 / w, y * 255 / h, (x + y) * 127 / (w + h)], axis=-1)
        a = numpy.clip(smooth + rng.normal(0, 40, (h, w, 3)), 0, 255).astype(numpy.uint8)
        files.append(os.path.join(work, f"{name}.image{i}.{ext}"))
        Image.fromarray(a).save(files[-1], **({"quality": 90} if ext == "jpg" else {}))
    _, meta = read_safetensors(os.path.join(work, name + ".loom.safetensors"))
    tol = [float(x) for x in meta["tolerance.pixels"].split()]
    px = os.path.join(work, name + ".image-pixels.safetensors")
    subprocess.run([loom_model, "pixels", "--hf", d, "--image", ",".join(files), "--out", px],
                   check=True)
    got = read_safetensors(px)[0]["pixel_values"]
    want = torch.stack([pil_pixels(proc, f) for f in files])
    err = check(f"{name} image processor vs PIL", want, got, tol, failures)
    subprocess.run([loom_model, "pixels", "--hf", d, "--image", ",".join(files),
                    "--image_aspect_ratio", "pad", "--out", px], check=True)
    padded = read_safetensors(px)[0]["pixel_values"]
    pad_err = check(f"{name} image processor with image_aspect_ratio pad vs PIL",
                    torch.stack([pil_pixels(proc, f, pad=True) for f in files]), padded, tol,
                    failures)
    print(f"hf golden {name}: image_aspect_ratio pad vs PIL's expand2square max|diff| "
          f"{pad_err:.3g} (normalised units)")
    if torch.equal(padded, got):
        failures.append(f"{name}: image_aspect_ratio pad changed nothing")
    three = ",".join([files[0], files[1], files[0]])  # the case's three image slots
    subprocess.run([loom_model, "pixels", "--hf", d, "--image", three, "--out", px], check=True)
    printed = [json.loads(subprocess.run(
        [loom_model, "logits", "--hf", d, "--tokens", tokens] + extra, check=True,
        capture_output=True, text=True).stdout)["logits"]
        for extra in (["--image", three], ["--pixels", px])]
    if printed[0] != printed[1]:
        failures.append(f"{name}: logits --image differ from logits --pixels of the same pixels")
    print(f"hf golden {name}: image processor vs PIL max|diff| {err:.3g} (normalised units)")
    # generate on a LLaVA directory agrees with its logits path, token by token (a text prompt).
    image_token = config.get("image_token_index", config.get("image_token_id"))
    prompt = [t for t in map(int, tokens.split("/")[0].split(",")) if t != image_token][:12]
    out = json.loads(subprocess.run(
        [loom_model, "generate", "--hf", d, "--tokens", ",".join(map(str, prompt)),
         "--max_new_tokens", "3"], check=True, capture_output=True, text=True).stdout)
    prefix = list(prompt)
    for tok in out["ids"]:
        last = json.loads(subprocess.run(
            [loom_model, "logits", "--hf", d, "--tokens", ",".join(map(str, prefix))], check=True,
            capture_output=True, text=True).stdout)["logits"]
        if tok != max(range(len(last)), key=last.__getitem__):
            failures.append(f"{name}: generate chose {tok} after {prefix}, not logits' argmax")
            break
        prefix.append(tok)
    if len(out["ids"]) != 3:
        failures.append(f"{name}: generate printed {out}")
    print(f"hf golden {name}: loom-model generate's tokens {out['ids']} are its logits' argmax")


def main():
    work, dump, loom_model = sys.argv[1:4]
    mutation = sys.argv[4] if len(sys.argv) > 4 else ""
    if mutation and mutation not in MUTATIONS:
        sys.exit(f"unknown mutation {mutation!r}; known: {', '.join(MUTATIONS)}")
    failures = []
    for name, config, dtype, shards in CASES:
        run_case(work, dump, loom_model, name, dtype, shards, mutation, failures,
                 llm_case(work, name, config, dtype, shards, mutation), generate=True)
    for name, config, dtype, shards, layout in LLAVA_CASES:
        case = llava_case(work, name, config, dtype, shards, layout, mutation)
        run_case(work, dump, loom_model, name, dtype, shards, mutation, failures, case)
        if not mutation:
            tokens = "/".join(",".join(map(str, s)) for s in case[1])
            check_images(work, loom_model, name, config, tokens, failures)
    if failures:
        print("hf golden: FAILED\n  " + "\n  ".join(failures[:12]))
        sys.exit(1)
    print("hf golden: all match")


if __name__ == "__main__":
    main()
