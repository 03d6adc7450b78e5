// The independent reference for loom-model tokenize: transformers.js's
// tokenizers (npm @lenml/tokenizers, unpacked by ./loom setup).
// Reads {"dir": D, "texts": [...], "decode": [[ids]...]} on stdin; writes
// {"ids": [[...]...], "decoded": [...]}: each text encoded without special
// tokens, each id list decoded without skipping any.
const fs = require("fs");
const { TokenizerLoader } = require("/usr/local/share/loom/npm/tokenizers/dist/main.js");
const req = JSON.parse(fs.readFileSync(0, "utf8"));
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(req.dir + "/tokenizer.json", "utf8")),
  tokenizerConfig: JSON.parse(fs.readFileSync(req.dir + "/tokenizer_config.json", "utf8")),
});
const out = {
  ids: req.texts.map((t) => Array.from(tok.encode(t, { add_special_tokens: false }))),
  decoded: (req.decode || []).map((ids) =>
    tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false })),
};
process.stdout.write(JSON.stringify(out));
