// loom-model: checks a Hugging Face model as Loom loads it.
//
//   loom-model logits --hf DIR --tokens 1,2,3[/4,5,...]
//
// loads DIR (a LlamaForCausalLM or Qwen2ForCausalLM directory: config.json
// and its safetensors, runtime/hf/hf_llm.h), runs the token sequences ('/'
// separates sequences packed into one batch) and prints the last position's
// logits as one JSON object:
//   {"vocab": V, "position": T-1, "logits": [...]}
// A bad directory, config or token list exits 2 with the reason.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "runtime/hf/hf_llm.h"

ABSL_FLAG(std::string, hf, "", "Hugging Face model directory (config.json + safetensors)");
ABSL_FLAG(std::string, tokens, "", "token ids: 1,2,3 ('/' between packed sequences)");

namespace {

int Fail(const std::string& why) {
  std::cerr << "loom-model: " << why << "\n";
  return 2;
}

int Logits() {
  if (absl::GetFlag(FLAGS_hf).empty()) return Fail("--hf DIR is required");
  if (absl::GetFlag(FLAGS_tokens).empty()) return Fail("--tokens is required");
  absl::StatusOr<std::unique_ptr<loom::Llm>> llm = loom::hf::OpenHfLlm(absl::GetFlag(FLAGS_hf));
  if (!llm.ok()) return Fail(std::string(llm.status().message()));
  const int V = (*llm)->config().vocab;
  absl::StatusOr<loom::LlmBatch> batch = loom::hf::ParseTokenBatch(absl::GetFlag(FLAGS_tokens), V);
  if (!batch.ok()) return Fail(std::string(batch.status().message()));
  if (absl::Status s = (*llm)->Forward(*batch, nullptr); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  const int T = batch->T();
  const float* last = (*llm)->logits().data() + static_cast<size_t>(T - 1) * V;
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

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("loom-model logits --hf DIR --tokens 1,2,3");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) return Fail("one command: logits");
  const std::string command = args[1];
  if (command == "logits") return Logits();
  return Fail("unknown command '" + command + "' (logits)");
}
