// loom-tokenizer: trains Loom's BPE tokenizer on loom-datagen's text.
//
//   loom-tokenizer --out tokenizer.model --vocab_size 256
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "runtime/base/file.h"
#include "runtime/data/datagen.h"
#include "runtime/data/tokenizer.h"

ABSL_FLAG(std::string, out, "", "Where to write the sentencepiece model.");
ABSL_FLAG(int, vocab_size, 256, "At most this many pieces (ids 0-4 are reserved).");
ABSL_FLAG(int, texts, 3000, "Generated texts to train on (every preset in turn).");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the generated texts.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("loom-tokenizer --out FILE [--vocab_size N]");
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_out).empty()) {
    std::fprintf(stderr, "loom-tokenizer: --out is required\n");
    return 2;
  }
  absl::StatusOr<std::string> model = loom::data::TrainTokenizer(
      loom::data::GenerateTexts(absl::GetFlag(FLAGS_seed), absl::GetFlag(FLAGS_texts)),
      absl::GetFlag(FLAGS_vocab_size));
  absl::Status written =
      model.ok() ? loom::WriteFileAtomically(absl::GetFlag(FLAGS_out), *model) : model.status();
  if (!written.ok()) {
    std::fprintf(stderr, "loom-tokenizer: %s\n", std::string(written.message()).c_str());
    return 2;
  }
  return 0;
}
