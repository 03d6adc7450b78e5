#!/usr/bin/python3
"""Tiny random Hugging Face directories to train from, as a user's would be laid out.

  hf_fixture.py OUT

writes
  OUT/llm     LlamaForCausalLM (grouped-query attention, untied): config.json,
              model.safetensors, tokenizer.json (byte-level BPE with the Llama 3
              pre-tokenizer, trained on a small corpus, with <|begin_of_text|>,
              <|end_of_text|> and LLaVA's <image> added), tokenizer_config.json,
              generation_config.json
  OUT/vision  CLIPVisionModel: config.json, model.safetensors (vision_model.*),
              preprocessor_config.json (CLIPImageProcessor)
  OUT/llava   LlavaForConditionalGeneration of the two (transformers' layout before
              4.52, BF16 in two shards) with a projector, the tokenizer and the
              image processor

for the tests that train them end to end (tests/integration/pretrained_test.cc).
Run with Debian's /usr/bin/python3 (python3-torch, python3-regex).
"""
import json
import os
import shutil
import sys

import torch

from bpe_reference_test import LLAMA3, tokenizer_json, train
from hf_golden_test import (PROCESSORS, clip_vision, llama, llava, projector_weights,
                            random_weights, save_model, vision_weights)

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<image>"]


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)


def write_tokenizer(d, vocab, merges):
    specials = {s: len(vocab) + i for i, s in enumerate(SPECIALS)}
    write_json(os.path.join(d, "tokenizer.json"),
               tokenizer_json(vocab, merges, LLAMA3, False, True, specials, "strings", "split"))
    write_json(os.path.join(d, "tokenizer_config.json"),
               {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                "model_max_length": 512, "tokenizer_class": "PreTrainedTokenizerFast"})
    return specials


def main():
    out = sys.argv[1]
    for sub in ("llm", "vision", "llava"):
        shutil.rmtree(os.path.join(out, sub), ignore_errors=True)
        os.makedirs(os.path.join(out, sub))
    gen = torch.Generator().manual_seed(20261123)
    vocab, merges = train(LLAMA3, 56)
    text = llama(vocab_size=320, max_position_embeddings=512, head_dim=12,
                 torch_dtype="float32")
    assert len(vocab) + len(SPECIALS) <= text["vocab_size"]

    d = os.path.join(out, "llm")
    save_model(d, random_weights(text, gen), "F32", 1)
    write_json(os.path.join(d, "config.json"), text)
    specials = write_tokenizer(d, vocab, merges)
    write_json(os.path.join(d, "generation_config.json"),
               {"bos_token_id": specials["<|begin_of_text|>"],
                "eos_token_id": specials["<|end_of_text|>"]})

    vc = dict(clip_vision(), architectures=["CLIPVisionModel"], hidden_act="quick_gelu")
    d = os.path.join(out, "vision")
    save_model(d, vision_weights(vc, gen, "vision_model."), "F32", 1)
    write_json(os.path.join(d, "config.json"), vc)
    write_json(os.path.join(d, "preprocessor_config.json"),
               PROCESSORS["clip_vision_model"](vc["image_size"]))

    patches = (vc["image_size"] // vc["patch_size"]) ** 2
    config = llava(text, vc, -2, "default", patches)
    config["image_token_index"] = specials["<image>"]
    d = os.path.join(out, "llava")
    weights = (random_weights(text, gen, "language_model.model.", "language_model.lm_head.") +
               vision_weights(vc, gen, "vision_tower.vision_model.") +
               projector_weights(config, gen, "multi_modal_projector."))
    save_model(d, weights, "BF16", 2)
    write_json(os.path.join(d, "config.json"), config)
    write_tokenizer(d, vocab, merges)
    shutil.copy(os.path.join(out, "vision", "preprocessor_config.json"), d)
    print(f"hf_fixture: {out}/llm, {out}/vision, {out}/llava "
          f"({len(vocab) + len(SPECIALS)} tokens, {patches} image tokens)")


if __name__ == "__main__":
    main()
