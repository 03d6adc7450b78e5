// Test tool: encodes texts with a tokenizer.json (runtime/hf/bpe_tokenizer.h).
//
//   bpe_encode --tokenizer tokenizer.json < texts.jsonl
//
// Each input line is one JSON string; each output line is
// {"ids": [...], "decoded": "..."} or {"error": "..."}.
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "nlohmann/json.hpp"
#include "runtime/hf/bpe_tokenizer.h"

ABSL_FLAG(std::string, tokenizer, "", "tokenizer.json");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto tok = loom::hf::BpeTokenizer::Load(absl::GetFlag(FLAGS_tokenizer));
  if (!tok.ok()) {
    std::cerr << "bpe_encode: " << tok.status().message() << "\n";
    return 2;
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    nlohmann::json in = nlohmann::json::parse(line, nullptr, false);
    if (in.is_discarded() || !in.is_string()) {
      std::cerr << "bpe_encode: not a JSON string: " << line << "\n";
      return 2;
    }
    std::vector<int32_t> ids;
    nlohmann::json out;
    if (absl::Status s = (*tok)->Encode(in.get<std::string>(), &ids); !s.ok()) {
      out["error"] = std::string(s.message());
    } else {
      out["ids"] = ids;
      // Invalid UTF-8 cannot be in a JSON string; decoding never yields it here.
      out["decoded"] = (*tok)->Decode(ids);
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}
