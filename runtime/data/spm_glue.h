// sentencepiece, reached through the libloom_spm.so plugin (spm_plugin.cc
// says why it is a plugin loaded with RTLD_DEEPBIND). The plugin is found at
// $LOOM_SPM_PLUGIN, in the Bazel runfiles of the running binary or test, or
// beside the binary. Also keeps sentencepiece's headers, whose `namespace
// absl { using std::string_view; }` collides with Debian abseil's own
// absl::string_view, away from every file that includes abseil.
#ifndef LOOM_RUNTIME_DATA_SPM_GLUE_H_
#define LOOM_RUNTIME_DATA_SPM_GLUE_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data::spm {

class Model {
 public:
  // From a serialized ModelProto; nullptr with `error` set if invalid.
  static std::unique_ptr<Model> Load(std::string_view serialized, std::string* error);
  ~Model();

  // Thread-safe.
  bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const;
  std::string Decode(const std::vector<int>& ids) const;
  int vocab_size() const;
  int PieceToId(std::string_view piece) const;
  int unk_id() const;
  int bos_id() const;
  int eos_id() const;
  int pad_id() const;

 private:
  struct Impl;
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Trains a BPE model on `sentences` (no file needed); `args` are
// sentencepiece trainer flags ("--vocab_size=256 --model_type=bpe ...").
bool Train(const std::vector<std::string>& sentences, const std::string& args,
           std::string* serialized_model, std::string* error);

}  // namespace loom::data::spm

#endif  // LOOM_RUNTIME_DATA_SPM_GLUE_H_
