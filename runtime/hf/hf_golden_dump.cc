// Test tool for hf_golden_test: loads a Hugging Face LLM directory with
// Loom (runtime/hf/hf_llm.h), runs one packed batch forward and backward
// (mean cross-entropy over the next-token targets) and writes F32
// safetensors: "logits" (T, V), "loss" (1) and "grad.<name>" for every
// Hugging Face tensor (LlmToHf: the fused q|k|v split back), with the
// golden tolerances (kernels/testing/tolerances.h) as metadata
// "tolerance.logits" and "tolerance.grads" = "atol rtol".
//
//   hf_golden_dump --hf DIR --tokens 1,2,3/4,5 --out FILE
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "kernels/testing/tolerances.h"
#include "runtime/hf/hf_llm.h"
#include "runtime/hf/safetensors.h"

ABSL_FLAG(std::string, hf, "", "Hugging Face model directory");
ABSL_FLAG(std::string, tokens, "", "token ids, '/' between sequences");
ABSL_FLAG(std::string, out, "", "output .safetensors");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto fail = [](const absl::Status& s) {
    std::cerr << "hf_golden_dump: " << s.message() << "\n";
    return 2;
  };
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

  std::vector<loom::hf::NamedTensor> grads =
      loom::hf::LlmToHf(m.config(), m.params(), loom::hf::CausalLmKeys(), /*grads=*/true);
  std::vector<loom::hf::TensorView> views;
  const int64_t T = batch->T(), V = m.config().vocab;
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
                                 tg = loom::testing::kGoldenGrads;
  if (absl::Status s =
          loom::hf::WriteSafetensors(absl::GetFlag(FLAGS_out), views,
                                     {{"tolerance.logits", absl::StrCat(tl.atol, " ", tl.rtol)},
                                      {"tolerance.grads", absl::StrCat(tg.atol, " ", tg.rtol)}});
      !s.ok()) {
    return fail(s);
  }
  return 0;
}
