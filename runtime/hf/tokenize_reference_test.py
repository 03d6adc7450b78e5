"""loom-model tokenize on real tokenizer.json files against independent
references: transformers.js's tokenizers (npm @lenml/tokenizers, run by
node) for the ids, python3-jinja2 (configured as transformers configures it)
for the chat template's text.

For each model (Llama 3, Qwen3, and the sentencepiece-style Llama 2, from
npm @lenml/tokenizer-*):
  - plain: every hard string's ids equal the reference's, without special
    tokens; with --add_special_tokens, the bos first where the model adds one;
  - --chat (Llama 3, Qwen3: Llama 2 ships no template): the ids equal the reference's ids of the jinja2-rendered
    conversation, and the ids marked for loss are exactly the assistant
    turns: one run per assistant message, each decoding to that message as
    the template writes it followed by its end-of-turn token.

usage: tokenize_reference_test.py LOOM_MODEL REFERENCE_JS
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
from transformers_jinja import environment  # pylint: disable=wrong-import-position

NPM = "/usr/local/share/loom/npm"

HARD = [
    "", "hello", "Hello world", "  leading and trailing  ", "a  b\n\n\n  c\t\td   ",
    "line\r\nwindows\rcr", "12345678901 and 3.14159 and 1,000,000", "2024-11-25T21:52:11Z",
    "I'm you'll they'RE We'VE it's DON'T", "你好世界，こんにちは。안녕하세요", "👍🏽 🤖🤖 🎉🎉🎉 👨‍👩‍👧",
    "café vs cafe\u0301 (decomposed) Å vs A\u030a", "e\u0301\u0301\u0301 stacked marks",
    "control \u0001\u0002\u007f chars\u0000nul", "\u00a0non-breaking\u2003em-space\u3000ideographic",
    "<|eot_id|> literal <|begin_of_text|> special <|im_start|>x<|im_end|>", "<image>\n<image>",
    "!!!???...--- $$$ ### @@@", "x" * 500, "mixed 中文 and English 123abc ١٢٣ arabic digits",
    "tab\tseparated\tvalues\n" * 3, "'s 't 're 've 'm 'll 'd", "\n", " ", "\t\t",
    "<think>\nreasoning\n</think>\n\nanswer",
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"}],
    [{"role": "system", "content": "You are a careful assistant."},
     {"role": "user", "content": "What is in the picture?\n"},
     {"role": "assistant", "content": "Two red circles in the top left."},
     {"role": "user", "content": "  And the colour?  "},
     {"role": "assistant", "content": "  Red, été 🤖.\n"}],
    [{"role": "user", "content": "数字 12345"}, {"role": "assistant", "content": "一二三四五"},
     {"role": "user", "content": "again"}, {"role": "assistant", "content": "done"}],
]

# How each model's template writes an assistant message, and the token
# that ends its turn.
MODELS = {
    "llama3": (lambda c: c.strip(), "<|eot_id|>", "<|begin_of_text|>"),
    "qwen3": (lambda c: c, "<|im_end|>", None),
    # Sentencepiece-style tokenizer.json (Prepend + Replace normalizer,
    # byte_fallback); it ships no chat template.
    "llama2": (None, None, "<s>"),
}


def loom(binary, directory, lines, *flags):
    proc = subprocess.run([binary, "tokenize", "--tokenizer", directory, *flags],
                          input="".join(json.dumps(l, ensure_ascii=False) + "\n" for l in lines),
                          capture_output=True, text=True, check=True)
    return [json.loads(l) for l in proc.stdout.splitlines()]


def reference(js, directory, texts, decode=()):
    proc = subprocess.run(["node", js], input=json.dumps(
        {"dir": directory, "texts": texts, "decode": list(decode)}),
        capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def runs(ids, mask):
    out, run = [], None
    for i, m in zip(ids, mask):
        if m and run is None:
            run = []
            out.append(run)
        if m:
            run.append(i)
        else:
            run = None
    return out


def main():
    binary, js = sys.argv[1], sys.argv[2]
    env = environment()
    failures = 0

    def check(ok, what):
        nonlocal failures
        if not ok:
            failures += 1
            print("FAIL:", what)

    for name, (as_written, end_of_turn, bos) in MODELS.items():
        directory = "%s/tokenizer-%s/models" % (NPM, name)
        with open(directory + "/tokenizer_config.json", encoding="utf-8") as f:
            config = json.load(f)
        want = reference(js, directory, HARD)["ids"]
        got = loom(binary, directory, HARD)
        for text, w, g in zip(HARD, want, got):
            check(w == g, "%s %r: reference %s, loom %s" % (name, text[:40], w[:20], g))
        with_special = loom(binary, directory, HARD[:3], "--add_special_tokens")
        for w, g in zip(want[:3], with_special):
            bos_ids = [] if bos is None else reference(js, directory, [bos])["ids"][0]
            check(g == bos_ids + w, "%s --add_special_tokens: %s" % (name, g))
        print("%s: %d strings equal the reference" % (name, len(HARD)))
        if as_written is None:
            continue

        template = env.from_string(config["chat_template"])
        specials = {k: config[k] for k in ("bos_token", "eos_token") if config.get(k)}
        texts = [template.render(messages=c, add_generation_prompt=False, tools=None,
                                 documents=None, **specials) for c in CONVERSATIONS]
        ref = reference(js, directory, texts)["ids"]
        got = loom(binary, directory, [{"messages": c} for c in CONVERSATIONS], "--chat")
        decode = []
        for conversation, text, w, g in zip(CONVERSATIONS, texts, ref, got):
            check("ids" in g, "%s --chat: %s" % (name, g))
            if "ids" not in g:
                continue
            check(g["ids"] == w, "%s --chat ids differ from the rendered template's:\n  %r\n  %s\n  %s"
                  % (name, text, w, g["ids"]))
            check(len(g["loss_mask"]) == len(g["ids"]), "%s: one mark per id" % name)
            decode.extend(runs(g["ids"], g["loss_mask"]))
        decoded = reference(js, directory, [], decode)["decoded"]
        expected = [as_written(m["content"]) + end_of_turn
                    for c in CONVERSATIONS for m in c if m["role"] == "assistant"]
        check(decoded == expected, "%s loss runs:\n  want %r\n  got  %r" % (name, expected, decoded))
        print("%s: %d conversations, %d assistant turns marked" % (name, len(CONVERSATIONS), len(decoded)))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
