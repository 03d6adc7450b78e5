// loom-model: Hugging Face models as Loom loads and writes them.
//
//   loom-model logits --hf DIR --tokens 1,2,3[/4,5,...] [--pixels FILE | --image A.png,B.jpg]
//
// loads DIR (a LlamaForCausalLM or Qwen2ForCausalLM directory: config.json
// and its safetensors, runtime/hf/hf_llm.h; or a LlavaForConditionalGeneration
// one, runtime/hf/hf_llava.h, whose images come from --pixels, or from
// --image files through the directory's image processor,
// runtime/hf/hf_image.h), runs the
// token sequences ('/' separates sequences packed into one batch) and prints
// the last position's logits as one JSON object:
//   {"vocab": V, "position": T-1, "logits": [...]}
//
//   loom-model export --hf DIR --out OUT [--dtype bf16|f16|f32] [--max_shard_mb 5000]
//
// loads DIR into Loom's parameters and writes them back as a Hugging Face
// directory: safetensors in `dtype` (one file, or shards with the index as
// save_pretrained cuts them), config.json and the tokenizer and generation
// files copied. From a BF16 checkpoint with --dtype bf16 every tensor comes
// back bit for bit (a test). A LLaVA directory is written under the key
// layout of transformers before 4.52 (which later versions read too), its
// tower cut to the layers LLaVA runs (config.json says so: vision_config's
// num_hidden_layers, vision_feature_layer -1) with an identity
// post_layernorm, which LLaVA never applies.
//
//   loom-model export --checkpoint RUN/checkpoints/step-N (--hf LLAVA_DIR |
//                     --llm_from DIR --vision_from DIR) --out OUT [--dtype bf16]
//
// exports a Loom training checkpoint (any layout) of a model that started
// from those Hugging Face directories (the job's `hf`) as a LLaVA directory
// in the same form: the trained weights, the LLaVA config.json (composed
// for llm_from + vision_from, with the tokenizer's <image> id as
// image_token_index), the tokenizer's files and the image processor's, and
// what serving needs where the sources lack it: processor_config.json and
// chat_template.json (--chat_template: the template the job trained with;
// default the tokenizer's own, else vicuna_v1).
//
//   loom-model export [--config NAME] --checkpoint RUN/checkpoints/step-N --out OUT
//                     [--dtype bf16|f16|f32] [--max_shard_mb 5000]
//
// exports a checkpoint (any layout) of one of Loom's own models (the one
// its COMPLETE names unless --config says; a model
// with a generator, tiny-gen, among them: no Hugging Face family holds it)
// as safetensors with a config.json in Loom's form (runtime/hf/loom_export.h:
// every ModelConfig field, every tensor named by its checkpoint set), which
// generate --config OUT reads back.
//
//   loom-model generate --hf DIR --tokens 1,2,3 [--image A.png | --pixels FILE]
//                       [--max_new_tokens 16] [--eos ID]
//   loom-model generate --hf LLAVA_DIR [--checkpoint RUN/checkpoints/step-N]
//                       --prompt "<image>\nWhat is this?" --image A.png
//                       [--chat_template NAME|FILE] [--max_new_tokens 16]
//
// decodes greedily from the prompt (one sequence): each step runs the whole
// sequence again (no KV cache) and appends the last position's argmax,
// until --max_new_tokens or --eos; prints {"prompt": [...], "ids": [...]},
// the ids it added. A LLaVA directory takes the prompt's images as logits
// does. --prompt is a user message instead of ids: rendered by the chat
// template (as tokenize --chat; default the tokenizer's own, else
// vicuna_v1) with its generation prompt and encoded by the directory's
// tokenizer, each "<image>" (one per --image) becoming the image's slots;
// the output adds the decoded "text", and generation stops at the
// tokenizer's eos unless --eos says otherwise. --checkpoint generates with a
// Loom training checkpoint of a model that started from --hf (a
// llm_from + vision_from run: export it first).
//
//   loom-model generate --config tiny-gen [--checkpoint RUN/step-N]
//                       --prompt "image of one red square left" --out IMAGE.png
//                       [--euler_steps 20] [--seed 1] [--upscale 8]
//
// draws an image with the generator of one of Loom's own configs (at the
// seed's initial weights, or a loom-train-local / loom up checkpoint's, or
// an export's: --config OUT, a directory export --config wrote):
// the prompt's words (the synthetic captions' vocabulary) or --tokens ids
// after <bos>, or --text "a picture of two red circles." tokenized as
// loom-train-local --shards tokenizes it (a model trained on shards), the generator's query
// positions, the LLM's states there conditioning --euler_steps Euler steps from the seed's noise;
// writes the PNG and prints {"prompt": [...], "image": FILE, "euler_steps": K}.
//
//   loom-model pixels --hf DIR --image A.png[,B.jpg] --out pixel_values.safetensors
//
// writes what the directory's image processor (preprocessor_config.json)
// makes of the images, as --pixels reads it.
//
//   loom-model tokenize --tokenizer DIR [--add_special_tokens]
//   loom-model tokenize --tokenizer DIR --chat [--chat_template NAME|FILE]
//
// reads stdin a line at a time. Plain: each line a JSON string, printed as
// a JSON array of its ids; no special tokens are added unless
// --add_special_tokens (then the tokenizer's bos first, when it adds one,
// as transformers' encode does for Llama, Qwen and Mistral). --chat: each
// line {"messages": [{"role", "content"}, ...]}, printed as
// {"ids": [...], "loss_mask": [...]} (1 on the ids that carry loss) by the
// data pipeline's own code (runtime/data/preprocess.h on a sample of that
// conversation): the chat template's text, loss on the assistant turns.
// "<image>" in a conversation stands for an image there, as in the data;
// tokenize has no images, so such a line is refused. A line the tokenizer
// or the template refuses prints {"error": "..."}.
//
// A bad directory, config, token list, image or output exits 2 with the reason.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "runtime/base/file.h"
#include "runtime/data/chat_template.h"
#include "runtime/data/image.h"
#include "runtime/data/preprocess.h"
#include "runtime/data/tokenizer.h"
#include "runtime/hf/hf_image.h"
#include "runtime/hf/hf_llava.h"
#include "runtime/hf/hf_llm.h"
#include "runtime/hf/loom_export.h"
#include "runtime/hf/model_flags.h"
#include "runtime/hf/pretrained.h"
#include "runtime/hf/safetensors.h"
#include "runtime/train/synthetic_data.h"
#include "runtime/train/train_checkpoint.h"

ABSL_FLAG(std::string, hf, "", "Hugging Face model directory (config.json + safetensors)");
ABSL_FLAG(std::string, tokens, "", "token ids: 1,2,3 ('/' between packed sequences)");
ABSL_FLAG(std::string, pixels, "",
          "logits of a LLaVA directory: safetensors with pixel_values (N, 3, S, S), normalised "
          "as the model's image processor does; image_token_index in --tokens marks the slots");
ABSL_FLAG(std::string, image, "",
          "logits and pixels of a LLaVA directory: PNG, JPEG, WebP, GIF or BMP files, "
          "comma-separated, made "
          "pixel_values by the directory's preprocessor_config.json");
ABSL_FLAG(std::string, image_aspect_ratio, "",
          "--image: crop (the image processor's own) or pad (LLaVA-1.5's: a square filled "
          "with the mean colour first), as the job's data.image_aspect_ratio");
ABSL_FLAG(std::string, out, "",
          "export: the directory to write; pixels: the file; generate --config: the PNG");
ABSL_FLAG(std::string, config, "",
          "generate: one of Loom's own model configs with a generator (tiny-gen), or a directory "
          "export --config wrote, in place of --hf: draws an image; export: the config of "
          "--checkpoint, written in Loom's form");
ABSL_FLAG(std::string, text, "",
          "generate --config: a prompt as the data has it: <s>, then --tokenizer's ids (\"\": "
          "Loom's own) of the text before its <output_image> (all of it without one), as "
          "loom-train-local --shards tokenizes it");
ABSL_FLAG(int, upscale, 1, "generate --config: write the image this many times larger (nearest)");
ABSL_FLAG(int, euler_steps, 20, "generate --config: Euler steps from noise to the image");
ABSL_FLAG(uint64_t, seed, 1, "generate --config: the initial weights' and the noise's seed");
ABSL_FLAG(std::string, dtype, "bf16", "export: bf16, f16 or f32");
ABSL_FLAG(std::string, checkpoint, "",
          "export: a Loom checkpoint step folder (RUN/checkpoints/step-N) of a model made of "
          "--hf (a LLaVA directory), --llm_from + --vision_from or --config: its weights are "
          "written");
ABSL_FLAG(int, max_new_tokens, 16, "generate: tokens to add at most");
ABSL_FLAG(std::string, prompt, "",
          "generate: a user message (\"<image>\" where each --image goes), through the chat "
          "template, in place of --tokens");
ABSL_FLAG(int, eos, -1, "generate: stop after this token id (-1: none)");
ABSL_FLAG(std::string, tokenizer, "",
          "tokenize: a tokenizer.json directory or sentencepiece model (\"\": Loom's own)");
ABSL_FLAG(bool, add_special_tokens, false, "tokenize: the tokenizer's bos first");
ABSL_FLAG(bool, chat, false, "tokenize: lines are conversations, {\"messages\": [...]}");
ABSL_FLAG(std::string, chat_template, "",
          "tokenize --chat: plain, vicuna_v1, chatml, llama3 or a Jinja file (default: the "
          "tokenizer's own chat_template, else vicuna_v1)");
ABSL_FLAG(int64_t, max_shard_mb, 5000,
          "export: largest safetensors shard, MB (save_pretrained's 5GB)");

namespace {

int Fail(const std::string& why) {
  std::cerr << "loom-model: " << why << "\n";
  return 2;
}

std::vector<std::string> ImageFiles() {
  return absl::StrSplit(absl::GetFlag(FLAGS_image), ',', absl::SkipEmpty());
}

// The last position's logits of a LLaVA directory's model on --tokens and
// --pixels; the number of positions in *T.
absl::StatusOr<std::vector<float>> LlavaLogits(int* T) {
  absl::StatusOr<loom::hf::OpenedLlava> o = loom::hf::OpenHfLlava(absl::GetFlag(FLAGS_hf));
  if (!o.ok()) return o.status();
  std::vector<float> pixels;
  if (!absl::GetFlag(FLAGS_pixels).empty() && !absl::GetFlag(FLAGS_image).empty()) {
    return absl::InvalidArgumentError("--pixels or --image, not both");
  }
  if (!absl::GetFlag(FLAGS_pixels).empty()) {
    LOOM_HF_ASSIGN(pixels, loom::hf::ReadPixelValues(absl::GetFlag(FLAGS_pixels),
                                                     o->config.model.vit.tile_size));
  }
  if (!absl::GetFlag(FLAGS_image).empty()) {
    LOOM_HF_ASSIGN(pixels, loom::hf::PixelValuesOfImages(absl::GetFlag(FLAGS_hf), ImageFiles(),
                                                         o->config.model.vit.tile_size,
                                                         absl::GetFlag(FLAGS_image_aspect_ratio)));
  }
  absl::StatusOr<std::vector<loom::Sample>> samples =
      loom::hf::LlavaSamples(absl::GetFlag(FLAGS_tokens), o->config, pixels);
  if (!samples.ok()) return samples.status();
  std::vector<const loom::Sample*> mb;
  *T = 0;
  for (const loom::Sample& s : *samples) {
    mb.push_back(&s);
    *T += static_cast<int>(s.tokens.size());
  }
  o->model->Evaluate(mb);
  const std::vector<float> all = o->model->llm().logits();
  return std::vector<float>(all.end() - o->config.model.llm.vocab, all.end());
}

// The same of a LlamaForCausalLM / Qwen2ForCausalLM directory.
absl::StatusOr<std::vector<float>> LlmLogits(int* T) {
  absl::StatusOr<std::unique_ptr<loom::Llm>> llm = loom::hf::OpenHfLlm(absl::GetFlag(FLAGS_hf));
  if (!llm.ok()) return llm.status();
  if (!absl::GetFlag(FLAGS_pixels).empty() || !absl::GetFlag(FLAGS_image).empty()) {
    return absl::InvalidArgumentError("--pixels/--image: " + absl::GetFlag(FLAGS_hf) +
                                      " is a language model without a vision tower");
  }
  const int V = (*llm)->config().vocab;
  absl::StatusOr<loom::LlmBatch> batch = loom::hf::ParseTokenBatch(absl::GetFlag(FLAGS_tokens), V);
  if (!batch.ok()) return batch.status();
  if (absl::Status s = (*llm)->Forward(*batch, nullptr); !s.ok()) return s;
  *T = batch->T();
  const std::vector<float> logits = (*llm)->logits();
  const float* last = logits.data() + static_cast<size_t>(*T - 1) * V;
  return std::vector<float>(last, last + V);
}

int Logits() {
  if (absl::GetFlag(FLAGS_hf).empty()) return Fail("--hf DIR is required");
  if (absl::GetFlag(FLAGS_tokens).empty()) return Fail("--tokens is required");
  int T = 0;
  absl::StatusOr<std::vector<float>> logits =
      loom::hf::IsLlavaDir(absl::GetFlag(FLAGS_hf)) ? LlavaLogits(&T) : LlmLogits(&T);
  if (!logits.ok()) return Fail(std::string(logits.status().message()));
  const int V = static_cast<int>(logits->size());
  const float* last = logits->data();
  std::string out = "{\"vocab\": " + std::to_string(V) +
                    ", \"position\": " + std::to_string(T - 1) + ", \"logits\": [";
  char buf[32];
  for (int v = 0; v < V; ++v) {
    std::snprintf(buf, sizeof(buf), "%s%.9g", v == 0 ? "" : ", ", last[v]);
    out += buf;
  }
  std::cout << out << "]}\n";
  return 0;
}

// Greedy decoding on --tokens: one model opened once, the sequence run
// whole each step.
// --prompt's ids for a LLaVA directory: the user message through the chat
// template with its generation prompt, each "<image>" the image's slots.
absl::StatusOr<std::vector<int32_t>> PromptIds(const std::string& dir, const std::string& text,
                                               const loom::hf::LlavaConfig& config,
                                               const loom::data::Tokenizer& tokenizer) {
  absl::StatusOr<std::shared_ptr<const loom::data::ChatTemplate>> chat =
      loom::data::ChatTemplate::Resolve(absl::GetFlag(FLAGS_chat_template), &tokenizer);
  if (!chat.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--chat_template: ", chat.status().message()));
  }
  absl::StatusOr<std::string> rendered =
      (*chat)->RenderText({{"user", text}}, /*add_generation_prompt=*/true);
  if (!rendered.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--prompt: ", rendered.status().message()));
  }
  std::vector<int32_t> ids;
  const std::vector<std::string> pieces =
      absl::StrSplit(*rendered, std::string(loom::data::kImageMarker));
  const int images = static_cast<int>(pieces.size()) - 1;
  if (images != static_cast<int>(ImageFiles().size())) {
    return absl::InvalidArgumentError(absl::StrCat("--prompt: ", images, " <image> markers for ",
                                                   ImageFiles().size(), " --image files"));
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (i > 0) ids.insert(ids.end(), config.model.tokens_per_tile(), config.image_token_id);
    std::vector<uint8_t> marks;
    if (absl::Status s = tokenizer.EncodeMarked(pieces[i], {}, &ids, &marks); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(dir, " tokenizer: ", s.message()));
    }
  }
  return ids;
}

// generate --config: an image from a Loom model's generator.
int GenerateImage() {
  const std::string name = absl::GetFlag(FLAGS_config);
  // A directory is an export (loom_export.h), which holds its weights.
  std::unique_ptr<loom::MultimodalModel> exported;
  std::error_code ec;
  if (name.find('/') != std::string::npos || std::filesystem::is_directory(name, ec)) {
    if (!loom::hf::IsLoomModelDir(name)) {
      return Fail("--config " + name +
                  ": not a Loom export (config.json with model_type \"loom\")");
    }
    if (!absl::GetFlag(FLAGS_checkpoint).empty()) {
      return Fail("--checkpoint: an export (--config " + name + ") holds its weights");
    }
    absl::StatusOr<std::unique_ptr<loom::MultimodalModel>> m = loom::hf::OpenLoomModel(name);
    if (!m.ok()) return Fail("--config: " + std::string(m.status().message()));
    exported = std::move(*m);
  }
  absl::StatusOr<loom::ModelConfig> config =
      exported != nullptr ? exported->config() : loom::ModelConfigByName(name);
  if (!config.ok()) return Fail("--config: " + std::string(config.status().message()));
  if (!config->has_generator()) {
    return Fail("--config " + name + ": has no generator to draw with (tiny-gen has one)");
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return Fail("--out IMAGE.png is required");
  const int steps = absl::GetFlag(FLAGS_euler_steps);
  if (steps < 1) return Fail("--euler_steps: must be >= 1");
  const int upscale = absl::GetFlag(FLAGS_upscale);
  if (upscale < 1 || upscale > 64) return Fail("--upscale: 1 to 64");
  const std::string words = absl::GetFlag(FLAGS_prompt), ids = absl::GetFlag(FLAGS_tokens),
                    text = absl::GetFlag(FLAGS_text);
  if (!words.empty() + !ids.empty() + !text.empty() != 1) {
    return Fail(
        "--prompt (the synthetic captions' words), --text (as the data has it) or --tokens "
        "(ids): one of them");
  }
  loom::Sample prompt;
  const std::vector<std::string>& vocab = loom::SyntheticCaptions::Vocabulary();
  prompt.tokens.push_back(1);  // <bos>
  if (!text.empty()) {
    absl::StatusOr<std::unique_ptr<loom::data::Tokenizer>> tok =
        loom::data::Tokenizer::Load(absl::GetFlag(FLAGS_tokenizer));
    if (!tok.ok()) return Fail("--tokenizer: " + std::string(tok.status().message()));
    if (absl::Status s = loom::data::CheckTokenizerFits(**tok, *config); !s.ok()) {
      return Fail("--tokenizer: " + std::string(s.message()));
    }
    prompt.tokens.clear();
    if ((*tok)->bos_id() >= 0) prompt.tokens.push_back((*tok)->bos_id());
    // The piece before the picture, exactly as preprocessing cuts it
    // ("… left. <output_image>": its space included).
    const std::string_view piece =
        std::string_view(text).substr(0, text.find(loom::data::kOutputImageMarker));
    if (absl::Status s = (*tok)->Encode(piece, &prompt.tokens); !s.ok()) {
      return Fail("--text: " + std::string(s.message()));
    }
  } else if (!words.empty()) {
    for (absl::string_view w : absl::StrSplit(words, ' ', absl::SkipWhitespace())) {
      const auto at = std::find(vocab.begin(), vocab.end(), w);
      if (at == vocab.end()) {
        return Fail(absl::StrCat("--prompt: \"", w, "\" is not a word the model knows (",
                                 absl::StrJoin(vocab, " "), ")"));
      }
      prompt.tokens.push_back(static_cast<int32_t>(at - vocab.begin()));
    }
  } else {
    for (absl::string_view t : absl::StrSplit(ids, ',')) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(t, &id))
        return Fail(absl::StrCat("--tokens: \"", t, "\" is not an id"));
      prompt.tokens.push_back(id);
    }
  }
  for (int q = 0; q < config->llm.gen_queries; ++q) prompt.tokens.push_back(loom::kQueryToken);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  if (exported == nullptr) {
    exported = std::make_unique<loom::MultimodalModel>(*config);
    exported->Initialize(seed);
    if (const std::string ckpt = absl::GetFlag(FLAGS_checkpoint); !ckpt.empty()) {
      if (absl::Status s = loom::LoadTrainingWeights(*exported, ckpt); !s.ok()) {
        return Fail("--checkpoint: " + std::string(s.message()));
      }
    }
  }
  absl::StatusOr<std::vector<float>> px = exported->GenerateImages(prompt, steps, seed);
  if (!px.ok()) return Fail(std::string(px.status().message()));
  const int S = config->generator.denoiser.tile_size, W = S * upscale;
  loom::data::Image image;
  image.width = image.height = W;
  image.rgb.resize(static_cast<size_t>(3) * W * W);
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < W; ++y) {
      for (int x = 0; x < W; ++x) {  // [-1, 1] -> 0..255, interleaved
        const size_t at = static_cast<size_t>(c) * S * S + (y / upscale) * S + x / upscale;
        const float v = std::clamp((*px)[at] * 0.5f + 0.5f, 0.f, 1.f);
        image.rgb[(static_cast<size_t>(y) * W + x) * 3 + c] =
            static_cast<uint8_t>(std::lround(v * 255.0f));
      }
    }
  }
  absl::StatusOr<std::string> png = loom::data::EncodePng(image);
  if (!png.ok()) return Fail(std::string(png.status().message()));
  if (absl::Status s = loom::WriteFileAtomically(out, *png); !s.ok()) {
    return Fail("--out: " + std::string(s.message()));
  }
  nlohmann::json j;
  j["prompt"] = prompt.tokens;
  j["image"] = out;
  j["euler_steps"] = steps;
  std::cout << j.dump() << "\n";
  return 0;
}

int Generate() {
  if (!absl::GetFlag(FLAGS_config).empty()) {
    if (!absl::GetFlag(FLAGS_hf).empty()) return Fail("--config or --hf: one of them");
    return GenerateImage();
  }
  const std::string dir = absl::GetFlag(FLAGS_hf);
  if (dir.empty()) return Fail("--hf DIR is required");
  const int max_new = absl::GetFlag(FLAGS_max_new_tokens);
  if (max_new < 1) return Fail("--max_new_tokens: must be >= 1");
  const std::string prompt = absl::GetFlag(FLAGS_tokens);
  const std::string text_prompt = absl::GetFlag(FLAGS_prompt);
  if (text_prompt.empty() == prompt.empty()) {
    return Fail("--tokens (ids) or --prompt (a user message): one of them");
  }
  if (!prompt.empty() && prompt.find('/') != std::string::npos) {
    return Fail("--tokens: one sequence (1,2,3) is the prompt");
  }
  if (!text_prompt.empty() && !loom::hf::IsLlavaDir(dir)) {
    return Fail("--prompt: needs a LLaVA directory (--hf), whose tokenizer and template it uses");
  }
  const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint);
  if (!checkpoint.empty() && !loom::hf::IsLlavaDir(dir)) {
    return Fail("--checkpoint: of a model that started from a LLaVA directory (--hf)");
  }
  std::unique_ptr<loom::data::Tokenizer> tokenizer;
  int32_t eos = absl::GetFlag(FLAGS_eos);
  std::vector<int32_t> ids;
  // The last position's logits of `ids`.
  std::function<absl::StatusOr<std::vector<float>>()> last_logits;
  std::unique_ptr<loom::Llm> llm;
  std::optional<loom::hf::OpenedLlava> llava;
  std::vector<float> pixels;
  int vocab = 0;
  if (loom::hf::IsLlavaDir(dir)) {
    absl::StatusOr<loom::hf::OpenedLlava> o = loom::hf::OpenHfLlava(dir);
    if (!o.ok()) return Fail(std::string(o.status().message()));
    llava.emplace(std::move(*o));
    vocab = llava->config.model.llm.vocab;
    if (!checkpoint.empty()) {
      if (absl::Status s = loom::LoadTrainingWeights(*llava->model, checkpoint); !s.ok()) {
        return Fail("--checkpoint: " + std::string(s.message()));
      }
    }
    if (!text_prompt.empty()) {
      absl::StatusOr<std::unique_ptr<loom::data::Tokenizer>> t = loom::data::Tokenizer::Load(dir);
      if (!t.ok()) return Fail(std::string(t.status().message()));
      tokenizer = std::move(*t);
      if (eos < 0) eos = tokenizer->eos_id();
    }
    const int S = llava->config.model.vit.tile_size;
    absl::StatusOr<std::vector<float>> px = std::vector<float>();
    if (!absl::GetFlag(FLAGS_pixels).empty()) {
      px = loom::hf::ReadPixelValues(absl::GetFlag(FLAGS_pixels), S);
    } else if (!absl::GetFlag(FLAGS_image).empty()) {
      px = loom::hf::PixelValuesOfImages(dir, ImageFiles(), S,
                                         absl::GetFlag(FLAGS_image_aspect_ratio));
    }
    if (!px.ok()) return Fail(std::string(px.status().message()));
    pixels = std::move(*px);
    last_logits = [&]() -> absl::StatusOr<std::vector<float>> {
      absl::StatusOr<std::vector<loom::Sample>> samples =
          loom::hf::LlavaSamples(absl::StrJoin(ids, ","), llava->config, pixels);
      if (!samples.ok()) return samples.status();
      llava->model->Evaluate({&(*samples)[0]});
      const std::vector<float>& all = llava->model->llm().logits();
      return std::vector<float>(all.end() - vocab, all.end());
    };
  } else {
    absl::StatusOr<std::unique_ptr<loom::Llm>> o = loom::hf::OpenHfLlm(dir);
    if (!o.ok()) return Fail(std::string(o.status().message()));
    llm = std::move(*o);
    vocab = llm->config().vocab;
    last_logits = [&]() -> absl::StatusOr<std::vector<float>> {
      absl::StatusOr<loom::LlmBatch> batch =
          loom::hf::ParseTokenBatch(absl::StrJoin(ids, ","), vocab);
      if (!batch.ok()) return batch.status();
      if (absl::Status st = llm->Forward(*batch, nullptr); !st.ok()) return st;
      const std::vector<float>& logits = llm->logits();
      const float* last = logits.data() + static_cast<size_t>(batch->T() - 1) * vocab;
      return std::vector<float>(last, last + vocab);
    };
  }
  if (tokenizer != nullptr) {
    absl::StatusOr<std::vector<int32_t>> p = PromptIds(dir, text_prompt, llava->config, *tokenizer);
    if (!p.ok()) return Fail(std::string(p.status().message()));
    ids = *std::move(p);
  } else {
    absl::StatusOr<std::vector<std::vector<int32_t>>> seqs =
        loom::hf::ParseTokenSequences(prompt, vocab);
    if (!seqs.ok()) return Fail(std::string(seqs.status().message()));
    ids = (*seqs)[0];
  }
  const size_t prompt_length = ids.size();
  for (int i = 0; i < max_new; ++i) {
    absl::StatusOr<std::vector<float>> logits = last_logits();
    if (!logits.ok()) return Fail(std::string(logits.status().message()));
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin());
    ids.push_back(next);
    if (next == eos) break;
  }
  nlohmann::json out;
  out["prompt"] = std::vector<int32_t>(ids.begin(), ids.begin() + prompt_length);
  out["ids"] = std::vector<int32_t>(ids.begin() + prompt_length, ids.end());
  if (tokenizer != nullptr) {
    out["text"] = tokenizer->Decode(std::vector<int32_t>(ids.begin() + prompt_length, ids.end()));
  }
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return 0;
}

// The files of a Hugging Face directory that describe it beside the weights.
constexpr const char* kSideFiles[] = {"config.json",
                                      "generation_config.json",
                                      "tokenizer.json",
                                      "tokenizer_config.json",
                                      "special_tokens_map.json",
                                      "tokenizer.model",
                                      "preprocessor_config.json",
                                      "processor_config.json",
                                      "chat_template.json"};

// What transformers' LlavaProcessor and vLLM open beside the weights, where
// the sources did not ship it: processor_config.json (from the exported
// config.json: the tower's patch size, its feature strategy, the CLS token
// CLIP adds) and chat_template.json (the --chat_template the job trained
// with; not written over a tokenizer_config.json that holds one).
absl::Status WriteServingFiles(const std::string& out, const std::string& config) {
  std::error_code ec;
  if (!std::filesystem::exists(out + "/processor_config.json", ec)) {
    const nlohmann::json c = nlohmann::json::parse(config, nullptr, /*allow_exceptions=*/false);
    if (!c.is_object() || !c.contains("vision_config")) {
      return absl::InvalidArgumentError("the exported config.json has no vision_config");
    }
    const std::string strategy = c.value("vision_feature_select_strategy", "default");
    const nlohmann::json processor = {
        {"image_token", "<image>"},
        {"num_additional_image_tokens", strategy == "default" ? 1 : 0},
        {"patch_size", c["vision_config"].value("patch_size", 14)},
        {"processor_class", "LlavaProcessor"},
        {"vision_feature_select_strategy", strategy}};
    if (absl::Status s =
            loom::WriteFileAtomically(out + "/processor_config.json", processor.dump(2) + "\n");
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<std::string> tc = loom::ReadFile(out + "/tokenizer_config.json");
  const nlohmann::json t = tc.ok() ? nlohmann::json::parse(*tc, nullptr, false) : nlohmann::json();
  const bool has_template = std::filesystem::exists(out + "/chat_template.json", ec) ||
                            (t.is_object() && t.contains("chat_template"));
  if (has_template) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<loom::data::Tokenizer>> tok = loom::data::Tokenizer::Load(out);
  if (!tok.ok()) return tok.status();
  absl::StatusOr<std::shared_ptr<const loom::data::ChatTemplate>> chat =
      loom::data::ChatTemplate::Resolve(absl::GetFlag(FLAGS_chat_template), tok->get());
  if (!chat.ok()) return chat.status();
  return loom::WriteFileAtomically(
      out + "/chat_template.json",
      nlohmann::json({{"chat_template", (*chat)->source()}}).dump(2) + "\n");
}

// A trained checkpoint's weights as a LLaVA model of `source`'s form.
absl::Status CheckpointTensors(const loom::hf::ModelSource& source, const std::string& step,
                               std::vector<loom::hf::NamedTensor>* tensors, std::string* config,
                               std::vector<loom::hf::SideFile>* side,
                               std::map<std::string, std::string>* rewritten) {
  absl::StatusOr<loom::hf::PretrainedModel> m = loom::hf::ResolveModel(source);
  if (!m.ok()) return m.status();
  loom::MultimodalModel model(m->config);
  if (absl::Status s = loom::LoadTrainingWeights(model, step); !s.ok()) {
    return absl::Status(s.code(), "--checkpoint: " + std::string(s.message()));
  }
  *tensors = loom::hf::LlavaToHf(model, loom::hf::ClassicLlavaKeys(), /*grads=*/false);
  for (loom::hf::NamedTensor& t : loom::hf::LlavaExportExtras(m->llava)) {
    tensors->push_back(std::move(t));
  }
  absl::StatusOr<std::string> c = loom::hf::LlavaExportConfig(m->llava_config_json, m->llava);
  if (!c.ok()) return c.status();
  *config = *c;
  *side = loom::hf::ExportSideFiles(*m);
  return loom::hf::AddImageTokenToExport(*m, tensors, config, rewritten);
}

// The Loom config a checkpoint step was trained with, from its COMPLETE
// identity ("model=tiny-gen ..."); "" when it names none of Loom's own (a
// Hugging Face source) or cannot be read.
std::string CheckpointLoomConfig(const std::string& step) {
  absl::StatusOr<std::string> complete = loom::ReadFile(step + "/COMPLETE");
  if (!complete.ok()) return "";
  for (absl::string_view line : absl::StrSplit(*complete, '\n')) {
    if (!absl::ConsumePrefix(&line, "identity ")) continue;
    for (absl::string_view token : absl::StrSplit(line, ' ')) {
      if (!absl::ConsumePrefix(&token, "model=")) continue;
      const std::string name(token);
      return loom::ModelConfigByName(name).ok() ? name : "";
    }
  }
  return "";
}

int Export() {
  const std::string in = absl::GetFlag(FLAGS_hf), out = absl::GetFlag(FLAGS_out);
  const std::string step = absl::GetFlag(FLAGS_checkpoint);
  std::string loom_config = absl::GetFlag(FLAGS_config);
  loom::hf::ModelSource source = loom::hf::ModelSourceFromFlags("");
  if (!in.empty()) source.llava = in;
  // A checkpoint of one of Loom's own models says which.
  if (loom_config.empty() && !step.empty() && !source.pretrained()) {
    loom_config = CheckpointLoomConfig(step);
  }
  if (!loom_config.empty() && (source.pretrained() || step.empty() || out.empty())) {
    return Fail(
        "export --config NAME (one of Loom's own models) needs --checkpoint and --out, and "
        "no --hf, --llm_from or --vision_from");
  }
  if (loom_config.empty() &&
      (out.empty() || (in.empty() && (step.empty() || !source.pretrained())))) {
    return Fail(
        "export needs --out DIR and --hf DIR, or --checkpoint with --llm_from and "
        "--vision_from, or --checkpoint of one of Loom's own models (--config NAME where its "
        "COMPLETE does not say)");
  }
  if (step.empty() && !source.llm_from.empty()) {
    return Fail("--llm_from/--vision_from: export of a checkpoint only (--checkpoint)");
  }
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  loom::hf::DType dt = loom::hf::DType::kBF16;
  if (dtype == "f16") {
    dt = loom::hf::DType::kF16;
  } else if (dtype == "f32") {
    dt = loom::hf::DType::kF32;
  } else if (dtype != "bf16") {
    return Fail("--dtype: '" + dtype + "' (bf16, f16 or f32)");
  }
  if (absl::GetFlag(FLAGS_max_shard_mb) < 1) return Fail("--max_shard_mb must be >= 1");
  std::vector<loom::hf::NamedTensor> tensors;
  std::string config;  // empty: copy the source's
  std::vector<loom::hf::SideFile> side;
  std::map<std::string, std::string> rewritten;  // side files with new contents
  if (!in.empty()) {
    for (const char* name : kSideFiles) side.push_back({in + "/" + name, name});
  }
  if (!loom_config.empty()) {
    absl::StatusOr<loom::ModelConfig> c = loom::ModelConfigByName(loom_config);
    if (!c.ok()) return Fail("--config: " + std::string(c.status().message()));
    loom::MultimodalModel model(*c);
    if (absl::Status s = loom::LoadTrainingWeights(model, step); !s.ok()) {
      return Fail("--checkpoint: " + std::string(s.message()));
    }
    tensors = loom::hf::LoomModelTensors(model);
    config = loom::hf::LoomConfigJson(*c, dt == loom::hf::DType::kBF16  ? "bfloat16"
                                          : dt == loom::hf::DType::kF16 ? "float16"
                                                                        : "float32");
  } else if (!step.empty()) {
    if (absl::Status s = CheckpointTensors(source, step, &tensors, &config, &side, &rewritten);
        !s.ok()) {
      return Fail(std::string(s.message()));
    }
  } else if (loom::hf::IsLlavaDir(in)) {
    absl::StatusOr<loom::hf::OpenedLlava> o = loom::hf::OpenHfLlava(in);
    if (!o.ok()) return Fail(std::string(o.status().message()));
    tensors = loom::hf::LlavaToHf(*o->model, loom::hf::ClassicLlavaKeys(), /*grads=*/false);
    for (loom::hf::NamedTensor& t : loom::hf::LlavaExportExtras(o->config)) {
      tensors.push_back(std::move(t));
    }
    absl::StatusOr<std::string> source = loom::ReadFile(in + "/config.json");
    if (!source.ok()) return Fail(std::string(source.status().message()));
    absl::StatusOr<std::string> c = loom::hf::LlavaExportConfig(*source, o->config);
    if (!c.ok()) return Fail(std::string(c.status().message()));
    config = *c;
  } else {
    absl::StatusOr<std::unique_ptr<loom::Llm>> llm = loom::hf::OpenHfLlm(in);
    if (!llm.ok()) return Fail(std::string(llm.status().message()));
    tensors = loom::hf::LlmToHf((*llm)->config(), (*llm)->params(), loom::hf::CausalLmKeys(),
                                /*grads=*/false);
  }
  std::vector<std::vector<uint16_t>> narrow(tensors.size());
  std::vector<loom::hf::TensorView> views;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const loom::hf::NamedTensor& t = tensors[i];
    loom::hf::TensorView v{t.name, dt, t.shape, t.data.data(), t.data.size() * sizeof(float)};
    if (dt != loom::hf::DType::kF32) {
      narrow[i].resize(t.data.size());
      for (size_t k = 0; k < t.data.size(); ++k) {
        narrow[i][k] = dt == loom::hf::DType::kBF16 ? loom::hf::F32ToBf16(t.data[k])
                                                    : loom::hf::F32ToF16(t.data[k]);
      }
      v.data = narrow[i].data();
      v.bytes = narrow[i].size() * sizeof(uint16_t);
    }
    views.push_back(std::move(v));
  }
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return Fail(out + ": " + ec.message());
  const uint64_t shard = static_cast<uint64_t>(absl::GetFlag(FLAGS_max_shard_mb)) * 1000 * 1000;
  if (absl::Status s = loom::hf::WriteSafetensorsModel(out, views, shard); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  if (!config.empty()) {
    if (absl::Status s = loom::WriteFileAtomically(out + "/config.json", config); !s.ok()) {
      return Fail(std::string(s.message()));
    }
  }
  for (const loom::hf::SideFile& f : side) {
    if (!std::filesystem::exists(f.from)) continue;
    if (!config.empty() && f.name == "config.json") continue;
    if (rewritten.count(f.name) > 0) continue;
    absl::StatusOr<std::string> text = loom::ReadFile(f.from);
    if (!text.ok()) return Fail(std::string(text.status().message()));
    if (absl::Status s = loom::WriteFileAtomically(out + "/" + f.name, *text); !s.ok()) {
      return Fail(std::string(s.message()));
    }
  }
  for (const auto& [name, text] : rewritten) {
    if (absl::Status s = loom::WriteFileAtomically(out + "/" + name, text); !s.ok()) {
      return Fail(std::string(s.message()));
    }
  }
  if (!step.empty() && loom_config.empty()) {
    if (absl::Status s = WriteServingFiles(out, config); !s.ok()) {
      return Fail("serving files: " + std::string(s.message()));
    }
  }
  std::cout << "loom-model: wrote " << tensors.size() << " tensors (" << dtype << ") to " << out
            << "\n";
  return 0;
}

}  // namespace

// pixel_values (N, 3, S, S) F32 of --image as DIR's processor makes them.
int Pixels() {
  const std::string dir = absl::GetFlag(FLAGS_hf), out = absl::GetFlag(FLAGS_out);
  if (dir.empty() || out.empty() || absl::GetFlag(FLAGS_image).empty()) {
    return Fail("pixels needs --hf DIR, --image FILES and --out FILE");
  }
  if (!loom::hf::IsLlavaDir(dir)) return Fail(dir + ": not a LLaVA directory");
  absl::StatusOr<loom::hf::LlavaConfig> config = loom::hf::ReadLlavaConfig(dir);
  if (!config.ok()) return Fail(std::string(config.status().message()));
  const int S = config->model.vit.tile_size;
  const std::vector<std::string> files = ImageFiles();
  absl::StatusOr<std::vector<float>> px =
      loom::hf::PixelValuesOfImages(dir, files, S, absl::GetFlag(FLAGS_image_aspect_ratio));
  if (!px.ok()) return Fail(std::string(px.status().message()));
  loom::hf::TensorView v{"pixel_values",
                         loom::hf::DType::kF32,
                         {static_cast<int64_t>(files.size()), 3, S, S},
                         px->data(),
                         px->size() * sizeof(float)};
  absl::Status s = loom::hf::WriteSafetensors(out, {v});
  if (!s.ok()) return Fail(std::string(s.message()));
  return 0;
}

int Tokenize() {
  absl::StatusOr<std::unique_ptr<loom::data::Tokenizer>> tok =
      loom::data::Tokenizer::Load(absl::GetFlag(FLAGS_tokenizer));
  if (!tok.ok()) return Fail("--tokenizer: " + std::string(tok.status().message()));
  std::shared_ptr<const loom::data::ChatTemplate> chat;
  if (absl::GetFlag(FLAGS_chat)) {
    absl::StatusOr<std::shared_ptr<const loom::data::ChatTemplate>> c =
        loom::data::ChatTemplate::Resolve(absl::GetFlag(FLAGS_chat_template), tok->get());
    if (!c.ok()) return Fail("--chat_template: " + std::string(c.status().message()));
    chat = *c;
  }
  // The pipeline's preprocessing, for conversations without images and of
  // any length.
  loom::data::PreprocessOptions options;
  options.max_seq = std::numeric_limits<int>::max() / 2;
  options.chat = chat;
  const loom::data::Preprocessor pre(options, tok->get());
  std::string line;
  for (int64_t n = 1; std::getline(std::cin, line); ++n) {
    const nlohmann::json in = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    nlohmann::json out;
    if (chat == nullptr) {
      std::vector<int32_t> ids;
      if (!in.is_string()) {
        out["error"] = absl::StrCat("line ", n, ": not a JSON string");
      } else if (absl::GetFlag(FLAGS_add_special_tokens) && (*tok)->bos_id() >= 0) {
        ids.push_back((*tok)->bos_id());
      }
      if (in.is_string()) {
        if (absl::Status s = (*tok)->Encode(in.get<std::string>(), &ids); !s.ok()) {
          out["error"] = absl::StrCat("line ", n, ": ", s.message());
        } else {
          out = ids;
        }
      }
    } else if (!in.is_object() || !in.contains("messages")) {
      out["error"] = absl::StrCat("line ", n, ": not {\"messages\": [...]}");
    } else {
      loom::data::SampleFiles files;
      files.key = absl::StrCat("line-", n);
      files.files["json"] = nlohmann::json{{"messages", in["messages"]}}.dump();
      const loom::data::Outcome o = pre.Process(files, /*decode_pixels=*/false);
      if (!o.ok) {
        out["error"] = absl::StrCat("line ", n, ": ", o.skip.reason, ": ", o.skip.detail);
      } else {
        out["ids"] = o.sample.sample.tokens;
        out["loss_mask"] = o.sample.sample.loss_mask;
      }
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "loom-model logits --hf DIR --tokens 1,2,3 | export --hf DIR [--checkpoint STEP_DIR] --out "
      "DIR [--dtype bf16] | "
      "pixels --hf DIR --image A.png --out FILE | generate --hf DIR --tokens 1,2,3 | "
      "tokenize --tokenizer DIR [--chat]");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) return Fail("one command: logits, generate, export, pixels or tokenize");
  const std::string command = args[1];
  if (command == "logits") return Logits();
  if (command == "generate") return Generate();
  if (command == "export") return Export();
  if (command == "pixels") return Pixels();
  if (command == "tokenize") return Tokenize();
  return Fail("unknown command '" + command + "' (logits, generate, export, pixels, tokenize)");
}
