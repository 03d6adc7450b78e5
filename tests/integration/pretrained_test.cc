// Hugging Face models trained end to end by `loom up` against
// loom-train-local (runtime/hf/pretrained.h), and exported.
#include "runtime/hf/pretrained.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/base/file.h"
#include "runtime/checkpoint/steps.h"
#include "runtime/data/data_testing.h"
#include "runtime/data/tokenizer.h"
#include "runtime/hf/hf_llava.h"
#include "runtime/hf/safetensors.h"
#include "runtime/model/model.h"
#include "runtime/train/train_checkpoint.h"
#include "tests/integration/binaries.h"
#include "tests/integration/training_runs.h"

namespace loom {
namespace {

using PretrainedTest = TrainingRuns;

void Put(const std::string& path, const std::string& bytes) {
  ASSERT_TRUE(MakeDirectories(path.substr(0, path.rfind('/'))).ok());
  ASSERT_TRUE(WriteFileAtomically(path, bytes).ok()) << path;
}

nlohmann::json Record(const std::string& id, nlohmann::json image,
                      const std::vector<std::pair<std::string, std::string>>& turns) {
  nlohmann::json r = {{"id", id}};
  if (!image.is_null()) r[image.is_array() ? "images" : "image"] = image;
  r["conversations"] = nlohmann::json::array();
  for (const auto& [from, value] : turns) {
    r["conversations"].push_back({{"from", from}, {"value", value}});
  }
  return r;
}

// A LLaVA-style JSON as people download it, converted by `loom-data
// convert`: captions, multi-turn and text-only conversations, multi-image
// records, a GIF, a WebP, a CMYK JPEG, an image shared by many records,
// ids with dots, and a record whose image is missing (skipped, counted).
// Returns the shards' glob.
std::string ConvertedLlavaJson() {
  const std::string root = TempPath("llava-json");
  const std::string img = root + "/images";
  const std::string seeds = "runtime/data/fuzz/regressions/image/";
  Put(img + "/coco/a.png", data::testing::TestPng(64, 48));
  Put(img + "/coco/b.jpg", data::testing::TestJpeg(80, 60));
  Put(img + "/gqa/c.png", data::testing::TestPng(40, 72));
  Put(img + "/anim.gif", ReadFile(Runfile(seeds + "seed-interlaced.gif")).value_or(""));
  Put(img + "/lossy.webp", ReadFile(Runfile(seeds + "seed-lossy.webp")).value_or(""));
  Put(img + "/cmyk.jpg", ReadFile(Runfile(seeds + "seed-cmyk.jpg")).value_or(""));
  const std::vector<std::string> images = {"coco/a.png", "coco/b.jpg", "gqa/c.png",
                                           "anim.gif",   "lossy.webp", "cmyk.jpg"};
  const std::vector<std::string> shapes = {"a red square", "two blue circles", "a green line",
                                           "a small yellow triangle", "three grey dots"};
  nlohmann::json records = nlohmann::json::array();
  for (int i = 0; i < 36; ++i) {
    const std::string id = absl::StrCat("0000", i, ".jpg.", i % 3);  // dots in ids
    const std::string image = images[i % images.size()];
    const std::string shape = shapes[i % shapes.size()];
    if (i % 6 == 4) {  // multi-turn
      records.push_back(Record(id, image,
                               {{"human", "<image>\nWhat is in the picture?"},
                                {"gpt", "It shows " + shape + "."},
                                {"human", "Where is it?"},
                                {"gpt", i % 4 == 0 ? "At the top left." : "Near the middle."}}));
    } else if (i % 6 == 5) {  // text only (LLaVA-665K's ShareGPT part)
      records.push_back(Record(
          id, nullptr, {{"human", "Name a shape."}, {"gpt", "One shape is " + shape + "."}}));
    } else if (i % 9 == 3) {  // two images
      records.push_back(Record(id, nlohmann::json::array({image, images[(i + 1) % images.size()]}),
                               {{"human", "<image>\n<image>\nAre these the same?"},
                                {"gpt", "No: the first has " + shape + "."}}));
    } else {  // LLaVA-Pretrain's caption form
      records.push_back(Record(id, image,
                               {{"human", "<image>\nDescribe the image briefly."},
                                {"gpt", "The image has " + shape + "."}}));
    }
  }
  records.push_back(Record("missing.1", "coco/nope.jpg",
                           {{"human", "<image>\nWhat is it?"}, {"gpt", "Nothing."}}));
  Put(root + "/llava_mix.json", records.dump(1));
  int rc = 0;
  const std::string out = RunToEnd(
      {Runfile("runtime/data/loom-data"), "convert", "--input=" + root + "/llava_mix.json",
       "--images=" + img, "--out=" + root + "/shards", "--name=mix", "--samples_per_shard=8"},
      "loom-data.log", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "read 37, wrote 36 in 5 shards, skipped 1 (missing_image 1)"))
      << out;
  return root + "/shards/*.tar";
}

// Hugging Face directories trained end to end on a converted LLaVA JSON
// (ConvertedLlavaJson): LLaVA's stage 1 (`plain`) on a LLaVA directory (its
// tokenizer.json and image processor feed the data), stage 2 (vicuna_v1,
// answers only) from stage 1's checkpoint, each equal to loom-train-local
// under tensor and pipeline layouts; the trained model exported as a LLaVA directory holding
// the checkpoint's weights in bf16; and a new LLaVA model made of an LLM
// directory and a CLIP directory (projector from the seed).
TEST_F(PretrainedTest, HuggingFaceModelsTrainAsTheSingleProcessRunAndExport) {
  const std::string hf_dir = TempPath("hf");
  int rc = 0;
  const std::string made =
      RunToEnd({"/usr/bin/python3", Runfile("runtime/hf/hf_fixture.py"), hf_dir}, "hf.log", &rc);
  ASSERT_EQ(rc, 0) << made;
  const std::string llava = hf_dir + "/llava";
  const std::string shards = ConvertedLlavaJson();
  // Every converted sample goes through the LLaVA directory's pipeline (the
  // GIF, the WebP and the CMYK JPEG decode; two images fit); under plain
  // the answers are most of the text, under vicuna_v1 the prompts carry no
  // loss.
  for (const char* chat : {"plain", "vicuna_v1"}) {
    const std::string scanned = TempPath(absl::StrCat("scan-", chat, ".jsonl"));
    const std::string out = RunToEnd(
        {Runfile("services/preprocess/loom-preprocess"), "scan", "--shards=" + shards,
         "--llava=" + llava, absl::StrCat("--chat_template=", chat), "--output=" + scanned},
        absl::StrCat("scan-", chat, ".log"), &rc);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_TRUE(absl::StrContains(out, "read 36, kept 36, skipped 0")) << chat << ": " << out;
    int64_t loss = 0, text = 0, two_images = 0;
    for (absl::string_view line : absl::StrSplit(ReadFile(scanned).value_or(""), '\n')) {
      if (line.empty()) continue;
      const nlohmann::json r = nlohmann::json::parse(line);
      loss += r.value("loss_tokens", int64_t{0});
      text += r.value("text_tokens", int64_t{0});
      if (r.contains("images") && r["images"].size() == 2) ++two_images;
    }
    EXPECT_GT(two_images, 0) << chat;
    EXPECT_GT(loss, 0) << chat;
    if (std::string(chat) == "plain") {  // the caption is nearly all the text
      EXPECT_GT(loss, text / 2) << chat;
    } else {
      EXPECT_LT(loss, text / 2) << chat << ": the prompts carry no loss";
    }
  }
  auto local = [&](const std::string& name, const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {Runfile("runtime/train/loom-train-local"), "--steps=10",
                                     "--seed=1", "--batch_size=16", "--shards=" + shards};
    argv.insert(argv.end(), flags.begin(), flags.end());
    int code = 0;
    const std::vector<StepResult> steps =
        Steps(StepResults(RunToEnd(argv, name + ".log", &code)), 1, 10, name);
    EXPECT_EQ(code, 0);
    return steps;
  };
  // LLaVA's stage 1 reads the conversations through the `plain` template
  // (the image, then the answer); stage 2 through the tokenizer's own
  // template, here (it has none) vicuna_v1, loss on the answers only.
  auto job = [&](const std::string& model, const std::string& parallel, const std::string& rest,
                 bool stage1) {
    return absl::StrCat("seed: 1\n", model, "\ndata { shards: '", shards, "' global_batch: 16",
                        stage1 ? " chat_template: 'plain'" : "", " }\nparallel { ", parallel,
                        " microbatches: 2 }\ncheckpoint { every: 10 }\n", rest);
  };
  auto start = [](const hf::ModelSource& source) {
    absl::StatusOr<hf::PretrainedModel> m = hf::ResolveModel(source);
    EXPECT_TRUE(m.ok()) << m.status();
    auto model = std::make_unique<MultimodalModel>(m->config);
    model->Initialize(1);
    EXPECT_TRUE(hf::LoadPretrainedWeights(*m, model.get()).ok());
    return model;
  };
  hf::ModelSource llava_source;
  llava_source.llava = llava;

  // Stage 1: the projector alone, encoder PP2 and LLM TP2.
  const std::string llava_job = "hf { llava: '" + llava + "' }";
  const std::vector<StepResult> stage1 =
      local("hf-local-1", {"--llava=" + llava, "--freeze=vision,llm", "--chat_template=plain"});
  EXPECT_LT(stage1.back().loss, stage1.front().loss) << "nothing trained";
  // LLaVA-1.5's image_aspect_ratio pad reaches the pixels the tower sees
  // (the images are not square): another first loss.
  const std::vector<StepResult> padded =
      local("hf-local-pad", {"--llava=" + llava, "--freeze=vision,llm", "--chat_template=plain",
                             "--image_aspect_ratio=pad"});
  EXPECT_NE(padded.front().loss, stage1.front().loss) << "padding changed no pixel";
  ExpectSameSteps(Steps(LoomUp("hf-stage1",
                               job(llava_job, "encoder_pp: 2 encoder_dp: 1 llm_tp: 2 llm_dp: 1",
                                   "freeze { vision: true llm: true }\n", true),
                               10),
                        1, 10, "hf stage 1"),
                  stage1, "LLaVA directory, stage 1 (encoder PP2, LLM TP2) vs loom-train-local");
  const std::string step1 = StepDir(TempPath("hf-stage1") + "/checkpoints", 10);
  ExpectOnlyTheProjectorTrained(*start(llava_source), step1);

  // Stage 2 from stage 1: encoder TP2, LLM PP2.
  const std::vector<StepResult> stage2 =
      local("hf-local-2", {"--llava=" + llava, "--freeze=vision", "--init_checkpoint=" + step1});
  ExpectSameSteps(
      Steps(LoomUp("hf-stage2",
                   job(llava_job, "encoder_tp: 2 encoder_dp: 1 llm_pp: 2 llm_dp: 1",
                       "freeze { vision: true }\ninit { checkpoint: '" + step1 + "' }\n", false),
                   10),
            1, 10, "hf stage 2"),
      stage2, "LLaVA directory, stage 2 from stage 1 (encoder TP2, LLM PP2) vs loom-train-local");

  // The export: the checkpoint's weights in bf16 under every name LLaVA
  // runs, the tokenizer and the image processor beside them.
  const std::string step2 = StepDir(TempPath("hf-stage2") + "/checkpoints", 10);
  const std::string exported = TempPath("hf-export");
  std::string out = RunToEnd({Runfile("runtime/hf/loom-model"), "export", "--hf=" + llava,
                              "--checkpoint=" + step2, "--out=" + exported},
                             "hf-export.log", &rc);
  ASSERT_EQ(rc, 0) << out;
  MultimodalModel trained(start(llava_source)->config());
  ASSERT_TRUE(LoadTrainingWeights(trained, step2).ok());

  // What the trained model says: `generate` from the checkpoint with a text
  // prompt and an image (the template's generation prompt, the image's
  // slots) gives the ids that --tokens gives for the prompt's ids, and that
  // the same weights exported in f32 give.
  const std::string image = TempPath("llava-json") + "/images/coco/a.png";
  auto generate = [&](const std::string& name, std::vector<std::string> args) {
    std::vector<std::string> argv = {Runfile("runtime/hf/loom-model"), "generate",
                                     "--image=" + image, "--max_new_tokens=6"};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string printed = RunToEnd(argv, name + ".log", &rc);
    EXPECT_EQ(rc, 0) << printed;
    const nlohmann::json j = nlohmann::json::parse(printed.substr(printed.rfind('{')), nullptr,
                                                   /*allow_exceptions=*/false);
    EXPECT_TRUE(j.is_object() && j.contains("ids") && j.contains("prompt")) << printed;
    return j;
  };
  const nlohmann::json said = generate(
      "generate-prompt",
      {"--hf=" + llava, "--checkpoint=" + step2, "--prompt=<image>\nDescribe the image briefly."});
  ASSERT_TRUE(said.contains("text") && said["text"].is_string()) << said.dump();
  absl::StatusOr<hf::LlavaConfig> llava_config = hf::ReadLlavaConfig(llava);
  ASSERT_TRUE(llava_config.ok()) << llava_config.status();
  std::vector<int32_t> prompt = said["prompt"].get<std::vector<int32_t>>();
  EXPECT_EQ(std::count(prompt.begin(), prompt.end(), llava_config->image_token_id),
            llava_config->model.tokens_per_tile())
      << "one image's slots";
  const nlohmann::json by_ids =
      generate("generate-ids",
               {"--hf=" + llava, "--checkpoint=" + step2, "--tokens=" + absl::StrJoin(prompt, ","),
                absl::StrCat("--eos=", (*data::Tokenizer::Load(llava))->eos_id())});
  EXPECT_EQ(by_ids["ids"], said["ids"]);
  const std::string exported_f32 = TempPath("hf-export-f32");
  out = RunToEnd({Runfile("runtime/hf/loom-model"), "export", "--hf=" + llava,
                  "--checkpoint=" + step2, "--out=" + exported_f32, "--dtype=f32"},
                 "hf-export-f32.log", &rc);
  ASSERT_EQ(rc, 0) << out;
  const nlohmann::json from_export = generate(
      "generate-export", {"--hf=" + exported_f32, "--prompt=<image>\nDescribe the image briefly."});
  EXPECT_EQ(from_export["prompt"], said["prompt"]);
  EXPECT_EQ(from_export["ids"], said["ids"]);

  absl::StatusOr<hf::OpenedLlava> back = hf::OpenHfLlava(exported);
  ASSERT_TRUE(back.ok()) << back.status();
  const std::vector<hf::NamedTensor> want =
      hf::LlavaToHf(trained, hf::ClassicLlavaKeys(), /*grads=*/false);
  const std::vector<hf::NamedTensor> got =
      hf::LlavaToHf(*back->model, hf::ClassicLlavaKeys(), /*grads=*/false);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].name, want[i].name);
    std::vector<float> rounded = want[i].data;
    for (float& x : rounded) x = hf::Bf16ToF32(hf::F32ToBf16(x));
    EXPECT_EQ(got[i].data, rounded) << got[i].name;
  }
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"}) {
    EXPECT_EQ(ReadFile(exported + "/" + file).value_or("missing"),
              ReadFile(llava + "/" + file).value_or(""))
        << file;
  }

  // A new LLaVA model from an LLM directory and a CLIP directory, DP 2 + 2.
  hf::ModelSource pair;
  pair.llm_from = hf_dir + "/llm";
  pair.vision_from = hf_dir + "/vision";
  const std::vector<StepResult> pair_local =
      local("hf-local-pair", {"--llm_from=" + pair.llm_from, "--vision_from=" + pair.vision_from,
                              "--freeze=vision,llm", "--chat_template=plain"});
  ExpectSameSteps(
      Steps(LoomUp("hf-pair",
                   job(absl::StrCat("hf { llm_from: '", pair.llm_from, "' vision_from: '",
                                    pair.vision_from, "' }"),
                       "encoder_dp: 2 llm_dp: 2", "freeze { vision: true llm: true }\n", true),
                   10),
            1, 10, "hf llm_from + vision_from"),
      pair_local, "llm_from + vision_from, stage 1 (DP 2 + 2) vs loom-train-local");
  const std::string pair_step = StepDir(TempPath("hf-pair") + "/checkpoints", 10);
  ExpectOnlyTheProjectorTrained(*start(pair), pair_step);
  const std::string pair_export = TempPath("hf-pair-export");
  out = RunToEnd(
      {Runfile("runtime/hf/loom-model"), "export", "--llm_from=" + pair.llm_from,
       "--vision_from=" + pair.vision_from, "--checkpoint=" + pair_step, "--out=" + pair_export},
      "hf-pair-export.log", &rc);
  ASSERT_EQ(rc, 0) << out;
  absl::StatusOr<hf::LlavaConfig> exported_config = hf::ReadLlavaConfig(pair_export);
  ASSERT_TRUE(exported_config.ok()) << exported_config.status();
  absl::StatusOr<std::unique_ptr<data::Tokenizer>> tokenizer = data::Tokenizer::Load(pair.llm_from);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(exported_config->image_token_id, (*tokenizer)->image_id());
  EXPECT_TRUE(hf::OpenHfLlava(pair_export).ok());
  // What LlavaProcessor and vLLM open beside the weights: the processor's
  // config and the chat template trained with (the sources had neither;
  // the tokenizer has no template, so vicuna_v1), which the exported
  // directory's tokenizer then carries.
  const std::string processor = ReadFile(pair_export + "/processor_config.json").value_or("");
  EXPECT_TRUE(absl::StrContains(processor, "\"processor_class\": \"LlavaProcessor\"") &&
              absl::StrContains(processor, "\"image_token\": \"<image>\"") &&
              absl::StrContains(processor, "\"patch_size\""))
      << processor;
  absl::StatusOr<std::unique_ptr<data::Tokenizer>> served = data::Tokenizer::Load(pair_export);
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_TRUE(absl::StrContains((*served)->chat_template(), "ASSISTANT: "))
      << (*served)->chat_template();

  // An LLM whose tokenizer has no <image> (as Llama 3's, Vicuna's and
  // Qwen's ship): Loom marks images with the id past the vocabulary, says
  // so, trains, and the export adds the token and its embedding row.
  const std::string bare = hf_dir + "/llm-without-image";
  ASSERT_TRUE(MakeDirectories(bare).ok());
  for (const auto& entry : std::filesystem::directory_iterator(pair.llm_from)) {
    const std::string name = entry.path().filename().string();
    std::string bytes = ReadFile(entry.path().string()).value_or("");
    if (name == "tokenizer.json") {
      nlohmann::json t = nlohmann::json::parse(bytes);
      nlohmann::json kept = nlohmann::json::array();
      for (const nlohmann::json& a : t["added_tokens"]) {
        if (a["content"] != "<image>") kept.push_back(a);
      }
      t["added_tokens"] = kept;
      bytes = t.dump(1);
    }
    Put(bare + "/" + name, bytes);
  }
  const std::string bare_log =
      RunToEnd({Runfile("runtime/train/loom-train-local"), "--steps=2", "--seed=1",
                "--batch_size=16", "--shards=" + shards, "--llm_from=" + bare,
                "--vision_from=" + pair.vision_from, "--freeze=vision,llm", "--chat_template=plain",
                "--checkpoint_dir=" + TempPath("bare-ckpt"), "--checkpoint_every=2"},
               "bare.log", &rc);
  ASSERT_EQ(rc, 0) << bare_log;
  EXPECT_TRUE(absl::StrContains(bare_log, "the tokenizer has no <image>")) << bare_log;
  const int vocab = hf::ResolveModel(pair)->config.llm.vocab;
  const std::string bare_export = TempPath("bare-export");
  out = RunToEnd(
      {Runfile("runtime/hf/loom-model"), "export", "--llm_from=" + bare,
       "--vision_from=" + pair.vision_from, "--checkpoint=" + StepDir(TempPath("bare-ckpt"), 2),
       "--out=" + bare_export, "--dtype=f32"},
      "bare-export.log", &rc);
  ASSERT_EQ(rc, 0) << out;
  absl::StatusOr<hf::OpenedLlava> bare_back = hf::OpenHfLlava(bare_export);
  ASSERT_TRUE(bare_back.ok()) << bare_back.status();
  EXPECT_EQ(bare_back->config.image_token_id, vocab);
  EXPECT_EQ(bare_back->config.model.llm.vocab, vocab + 1) << "the exported vocabulary holds it";
  absl::StatusOr<std::unique_ptr<data::Tokenizer>> bare_tok = data::Tokenizer::Load(bare_export);
  ASSERT_TRUE(bare_tok.ok()) << bare_tok.status();
  EXPECT_EQ((*bare_tok)->image_id(), vocab);
  // The trained rows as they were; the new one their mean.
  hf::ModelSource bare_source = pair;
  bare_source.llm_from = bare;
  MultimodalModel bare_trained(hf::ResolveModel(bare_source)->config);
  ASSERT_TRUE(LoadTrainingWeights(bare_trained, StepDir(TempPath("bare-ckpt"), 2)).ok());
  int compared = 0;
  for (const hf::NamedTensor& t :
       hf::LlavaToHf(*bare_back->model, hf::ClassicLlavaKeys(), /*grads=*/false)) {
    if (!absl::EndsWith(t.name, "embed_tokens.weight") && !absl::EndsWith(t.name, "lm_head.weight"))
      continue;
    for (const hf::NamedTensor& w :
         hf::LlavaToHf(bare_trained, hf::ClassicLlavaKeys(), /*grads=*/false)) {
      if (w.name != t.name) continue;
      ASSERT_EQ(t.data.size(), w.data.size() + w.data.size() / vocab);
      EXPECT_TRUE(std::equal(w.data.begin(), w.data.end(), t.data.begin())) << t.name;
      const size_t dim = w.data.size() / vocab;
      double mean0 = 0;
      for (int r = 0; r < vocab; ++r) mean0 += w.data[r * dim];
      EXPECT_NEAR(t.data[static_cast<size_t>(vocab) * dim], mean0 / vocab, 1e-6) << t.name;
      ++compared;
    }
  }
  EXPECT_EQ(compared, 2) << "embed_tokens and lm_head (the fixture's are not tied)";
  // And it serves: a prompt with an image, the <image> id inside its vocabulary.
  generate("generate-bare", {"--hf=" + bare_export, "--prompt=<image>\nDescribe the image."});
}

}  // namespace
}  // namespace loom
