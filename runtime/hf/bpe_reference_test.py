"""tokenizer.json byte-level BPE: Loom (bpe_encode) against a pure-Python
byte-level BPE written here with python3-regex, on edge cases.

Builds tokenizers the way the Llama 3, Qwen2 and GPT-2 families are built
(their pre-tokenizer regexes, NFC, ignore_merges, merges in both JSON forms,
added and special tokens) with a small BPE trained here, writes each as
tokenizer.json, and requires equal ids on every case and decode(encode(x))
== x where no normalizer changes the text. A deliberately wrong reference
(GPT-2's regex for Llama 3's) must differ on some case, so the cases can see
the pre-tokenizer.

usage: bpe_reference_test.py BPE_ENCODE TMPDIR
"""
import json
import os
import subprocess
import sys
import unicodedata

import regex

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

SPECIALS = ["<|begin_of_text|>", "<|eot_id|>", "<image>", "<|im_start|>"]

CORPUS = """The quick brown fox jumps over the lazy dog. I'm sure they'll say it's
fine -- we've seen 12345 cases and 2024-11-22 was a date. Don't, won't, can't.
    indented code();  x = y + 42;\n\n\tTabbed\tline\r\nWindows line
你好，世界！今天天气很好。こんにちは世界。안녕하세요 세계
Emoji: 👍🏽 🤖🤖 🎉 and café, naïve, Ünïcödé, ελληνικά, русский текст.
""" * 3

CASES = [
    "",
    "hello",
    "Hello world",
    "12345678901 and 3.14159 and 1,000,000",
    "I'm you'll they'RE We'VE it's DON'T",
    "a  b\n\n\n  c\t\td   ",
    "trailing spaces   ",
    "   leading spaces",
    "line\r\nwindows\rcr",
    "你好世界，こんにちは",
    "👍🏽 🤖🤖 🎉🎉🎉",
    "café vs cafe\u0301 (decomposed)",
    "hi<|eot_id|>there<image>x<image><image>",
    "<|begin_of_text|>The quick brown fox",
    "special<|im_start|>inside<|eot_id|>",
    "mixed 中文 and English 123abc",
    "!!!???...---",
    "x" * 300,
    "\u00a0non-breaking\u2003em-space",
    "a qzx b",  # " qzx" is a token no merge reaches: only ignore_merges finds it
]

# In the Llama 3 variant's vocabulary without a merge path (as in Llama 3's).
UNMERGED = " qzx"


def bytes_to_unicode():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE = bytes_to_unicode()


def to_symbols(piece):
    return [BYTE[b] for b in piece.encode("utf-8")]


def train(pattern, merges_wanted):
    """A small BPE: most frequent pair first, ties by the pair itself."""
    words = {}
    for w in regex.findall(pattern, CORPUS):
        key = tuple(to_symbols(w))
        words[key] = words.get(key, 0) + 1
    merges = []
    for _ in range(merges_wanted):
        counts = {}
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + c
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        new = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] = new.get(tuple(out), 0) + c
        words = new
    vocab = {}
    for b in range(256):
        vocab.setdefault(BYTE[b], len(vocab))
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    return vocab, merges


class Reference:
    def __init__(self, vocab, merges, pattern, nfc, ignore_merges, specials):
        self.vocab = vocab
        self.rank = {m: i for i, m in enumerate(merges)}
        self.pattern = pattern
        self.nfc = nfc
        self.ignore_merges = ignore_merges
        self.specials = specials  # content -> id

    def bpe(self, piece):
        sym = to_symbols(piece)
        if self.ignore_merges and "".join(sym) in self.vocab:
            return [self.vocab["".join(sym)]]
        while len(sym) > 1:
            pairs = [(self.rank.get((a, b), 1 << 60), i) for i, (a, b) in
                     enumerate(zip(sym, sym[1:]))]
            r, i = min(pairs)
            if r == 1 << 60:
                break
            a, b = sym[i], sym[i + 1]
            out, k = [], 0
            while k < len(sym):
                if k + 1 < len(sym) and sym[k] == a and sym[k + 1] == b:
                    out.append(a + b)
                    k += 2
                else:
                    out.append(sym[k])
                    k += 1
            sym = out
        return [self.vocab[s] for s in sym]

    def encode(self, text):
        ids = []
        order = sorted(self.specials, key=lambda s: (-len(s), s))
        i = start = 0
        segments = []
        while i < len(text):
            hit = next((s for s in order if text.startswith(s, i)), None)
            if hit is None:
                i += 1
                continue
            if i > start:
                segments.append((text[start:i], None))
            segments.append((hit, self.specials[hit]))
            i += len(hit)
            start = i
        if start < len(text):
            segments.append((text[start:], None))
        for seg, sid in segments:
            if sid is not None:
                ids.append(sid)
                continue
            if self.nfc:
                seg = unicodedata.normalize("NFC", seg)
            pieces, gap = [], 0
            for m in regex.finditer(self.pattern, seg):
                if m.start() == m.end():
                    continue
                if m.start() > gap:
                    pieces.append(seg[gap:m.start()])
                pieces.append(m.group())
                gap = m.end()
            if gap < len(seg):
                pieces.append(seg[gap:])
            for p in pieces:
                ids.extend(self.bpe(p))
        return ids


def tokenizer_json(vocab, merges, pattern, nfc, ignore_merges, specials, merge_form, style):
    if style == "gpt2":
        pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
               "use_regex": True}
    else:
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for c, i in specials.items()],
        "normalizer": {"type": "NFC"} if nfc else None,
        "pre_tokenizer": pre,
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore_merges,
                  "vocab": vocab,
                  "merges": [f"{a} {b}" for a, b in merges] if merge_form == "strings"
                  else [[a, b] for a, b in merges]},
    }


def run_loom(tool, path, texts):
    out = subprocess.run([tool, "--tokenizer", path], input="".join(
        json.dumps(t) + "\n" for t in texts), capture_output=True, text=True, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


def main():
    tool, tmp = sys.argv[1], sys.argv[2]
    failures = 0
    variants = [
        ("llama3", LLAMA3, False, True, "strings", "split"),
        ("qwen2", QWEN2, True, False, "pairs", "split"),
        ("gpt2", GPT2, False, False, "strings", "gpt2"),
    ]
    for name, pattern, nfc, ignore_merges, form, style in variants:
        vocab, merges = train(pattern, 400)
        if ignore_merges:
            vocab["".join(to_symbols(UNMERGED))] = len(vocab)
        specials = {s: len(vocab) + 7 + i for i, s in enumerate(SPECIALS)}  # a gap of ids
        path = os.path.join(tmp, f"{name}.tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(tokenizer_json(vocab, merges, pattern, nfc, ignore_merges, specials, form,
                                     style), f, ensure_ascii=False)
        ref = Reference(vocab, merges, pattern, nfc, ignore_merges, specials)
        got = run_loom(tool, path, CASES)
        for text, g in zip(CASES, got):
            want = ref.encode(text)
            if g.get("ids") != want:
                failures += 1
                print(f"{name}: {text!r}\n  loom {g}\n  want {want}")
            elif not nfc and g["decoded"] != text:
                failures += 1
                print(f"{name}: decode({text!r}) = {g['decoded']!r}")
        print(f"{name}: {len(CASES)} cases, {len(vocab)} tokens, {len(merges)} merges "
              f"({form}), {sum(len(g.get('ids', [])) for g in got)} ids")
        if name == "llama3":
            wrong = Reference(vocab, merges, GPT2, nfc, ignore_merges, specials)
            if all(wrong.encode(t) == g.get("ids") for t, g in zip(CASES, got)):
                failures += 1
                print("llama3: GPT-2's regex gives the same ids on every case: "
                      "the cases cannot see the pre-tokenizer")
            no_ignore = Reference(vocab, merges, pattern, nfc, False, specials)
            if all(no_ignore.encode(t) == g.get("ids") for t, g in zip(CASES, got)):
                failures += 1
                print("llama3: ignore_merges changes no case: the cases cannot see it")
    if failures:
        print(f"bpe_reference_test: FAILED ({failures})")
        sys.exit(1)
    print("bpe_reference_test: passed")


if __name__ == "__main__":
    main()
