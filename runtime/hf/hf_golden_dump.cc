// Test tool for hf_golden_test: loads a Hugging Face LLM directory with
// Loom (runtime/hf/hf_llm.h), runs one packed batch forward and backward
// (mean cross-entropy over the next-token targets) and writes F32
// safetensors: "logits" (T, V), "loss" (1) and "grad.<name>" for every
// Hugging Face tensor (LlmToHf: the fused q|k|v split back), with the
// golden tolerances (kernels/testing/tolerances.h) as metadata
// "tolerance.logits", "tolerance.grads" (and "tolerance.pixels", the image
// processor against PIL) = "atol rtol".
//
// A LLaVA directory takes its images from --pixels (a safetensors file with
// pixel_values (N, 3, S, S)); image_token_index in --tokens marks the slots.
//
//   hf_golden_dump --hf DIR --tokens 1,2,3/4,5 [--pixels FILE] --out FILE
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "kernels/testing/tolerances.h"
#include "runtime/hf/hf_llava.h"
#include "runtime/hf/hf_llm.h"
#include "runtime/hf/safetensors.h"

ABSL_FLAG(std::string, hf, "", "Hugging Face model directory");
ABSL_FLAG(std::string, tokens, "", "token ids, '/' between sequences");
ABSL_FLAG(std::string, out, "", "output .safetensors");
ABSL_FLAG(std::string, pixels, "", "LLaVA: safetensors with pixel_values (N, 3, S, S)");

namespace {

absl::Status Write(const std::vector<float>& logits, int64_t T, int64_t V, float mean,
                   const std::vector<loom::hf::NamedTensor>& grads) {
  std::vector<loom::hf::TensorView> views;
  views.push_back({"logits",
                   loom::hf::DType::kF32,
                   {T, V},
                   logits.data(),
                   static_cast<uint64_t>(logits.size() * 4)});
  views.push_back({"loss", loom::hf::DType::kF32, {1}, &mean, 4});
  for (const loom::hf::NamedTensor& g : grads) {
    views.push_back({"grad." + g.name, loom::hf::DType::kF32, g.shape, g.data.data(),
                     static_cast<uint64_t>(g.data.size() * 4)});
  }
  const loom::testing::Tolerance tl = loom::testing::kGoldenLogits,
                                 tg = loom::testing::kGoldenGrads,
                                 tp = loom::testing::kImageProcessorVsPil;
  return loom::hf::WriteSafetensors(absl::GetFlag(FLAGS_out), views,
                                    {{"tolerance.logits", absl::StrCat(tl.atol, " ", tl.rtol)},
                                     {"tolerance.grads", absl::StrCat(tg.atol, " ", tg.rtol)},
                                     {"tolerance.pixels", absl::StrCat(tp.atol, " ", tp.rtol)}});
}

// A LLaVA directory: image tokens in --tokens, the images from --pixels.
absl::Status DumpLlava(const std::string& dir) {
  absl::StatusOr<loom::hf::OpenedLlava> o = loom::hf::OpenHfLlava(dir);
  if (!o.ok()) return o.status();
  loom::MultimodalModel& m = *o->model;
  absl::StatusOr<std::vector<float>> pixels =
      loom::hf::ReadPixelValues(absl::GetFlag(FLAGS_pixels), m.config().vit.tile_size);
  if (!pixels.ok()) return pixels.status();
  absl::StatusOr<std::vector<loom::Sample>> samples =
      loom::hf::LlavaSamples(absl::GetFlag(FLAGS_tokens), o->config, *pixels);
  if (!samples.ok()) return samples.status();
  std::vector<const loom::Sample*> mb;
  int64_t loss_tokens = 0, T = 0;
  for (const loom::Sample& s : *samples) {
    mb.push_back(&s);
    loss_tokens += loom::LossTokens(s);
    T += static_cast<int64_t>(s.tokens.size());
  }
  if (loss_tokens == 0) return absl::InvalidArgumentError("no next-token targets");
  m.ZeroGrad();
  const loom::kernels::LossSum loss = m.ForwardBackward(mb, 1.0f / loss_tokens);
  return Write(m.llm().logits(), T, m.config().llm.vocab,
               static_cast<float>(loss.sum / loss_tokens),
               loom::hf::LlavaToHf(m, o->keys, /*grads=*/true));
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto fail = [](const absl::Status& s) {
    std::cerr << "hf_golden_dump: " << s.message() << "\n";
    return 2;
  };
  if (loom::hf::IsLlavaDir(absl::GetFlag(FLAGS_hf))) {
    const absl::Status s = DumpLlava(absl::GetFlag(FLAGS_hf));
    return s.ok() ? 0 : fail(s);
  }
  absl::StatusOr<std::unique_ptr<loom::Llm>> llm = loom::hf::OpenHfLlm(absl::GetFlag(FLAGS_hf));
  if (!llm.ok()) return fail(llm.status());
  loom::Llm& m = **llm;
  absl::StatusOr<loom::LlmBatch> batch =
      loom::hf::ParseTokenBatch(absl::GetFlag(FLAGS_tokens), m.config().vocab);
  if (!batch.ok()) return fail(batch.status());
  int loss_tokens = 0;
  for (int32_t t : batch->targets) loss_tokens += t >= 0;
  if (loss_tokens == 0) return fail(absl::InvalidArgumentError("no next-token targets"));
  if (absl::Status s = m.Forward(*batch, nullptr); !s.ok()) return fail(s);
  std::vector<float> logits = m.logits();
  m.params().ZeroGrad();
  absl::StatusOr<loom::kernels::LossSum> loss = m.Backward(1.0f / loss_tokens, nullptr);
  if (!loss.ok()) return fail(loss.status());
  const float mean = static_cast<float>(loss->sum / loss_tokens);

  const absl::Status s =
      Write(logits, batch->T(), m.config().vocab, mean,
            loom::hf::LlmToHf(m.config(), m.params(), loom::hf::CausalLmKeys(), /*grads=*/true));
  return s.ok() ? 0 : fail(s);
}
