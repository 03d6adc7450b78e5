// libloom_spm.so: sentencepiece behind a C interface, loaded by spm_glue.cc
// with dlopen(RTLD_LOCAL | RTLD_DEEPBIND).
//
// Why a plugin: Debian's libsentencepiece 0.1.97 carries its own copy of
// protobuf-lite 3.14 and exports its symbols. Linked into a process that also
// links Debian's libprotobuf 3.21 (every Loom service does, for gRPC), the
// dynamic linker binds one set of protobuf symbols for both, and the process
// aborts at start-up ("compiled against version 3.14.0 ... installed version
// 3.21.12"). Loaded with RTLD_DEEPBIND, libsentencepiece resolves protobuf
// to its own copy and the process's protobuf stays 3.21. Only plain C types
// cross this boundary.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void SetError(const std::string& msg, char* err, size_t errlen) {
  if (errlen == 0) return;
  std::strncpy(err, msg.c_str(), errlen - 1);
  err[errlen - 1] = '\0';
}

class VectorIterator : public sentencepiece::SentenceIterator {
 public:
  VectorIterator(const char* const* s, const size_t* lens, size_t n) : s_(s), lens_(lens), n_(n) {
    Load();
  }
  bool done() const override { return i_ >= n_; }
  void Next() override {
    ++i_;
    Load();
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

 private:
  void Load() {
    if (i_ < n_) value_.assign(s_[i_], lens_[i_]);
  }
  const char* const* s_;
  const size_t* lens_;
  size_t n_, i_ = 0;
  std::string value_;
};

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* loom_spm_load(const char* data, size_t n, char* err,
                                                           size_t errlen) {
  auto* p = new sentencepiece::SentencePieceProcessor();
  sentencepiece::util::Status s = p->LoadFromSerializedProto(std::string_view(data, n));
  if (!s.ok()) {
    SetError(s.ToString(), err, errlen);
    delete p;
    return nullptr;
  }
  return p;
}

// Memory the plugin returned (ids, strings, models): freed by the plugin's
// own allocator, which with RTLD_DEEPBIND is the C library's even where the
// process replaced malloc (AddressSanitizer).
__attribute__((visibility("default"))) void loom_spm_release(void* p) { std::free(p); }

__attribute__((visibility("default"))) void loom_spm_free(void* model) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(model);
}

// ids: malloc'd, freed by the caller with loom_spm_release().
__attribute__((visibility("default"))) int loom_spm_encode(void* model, const char* text, size_t n,
                                                           int** ids, size_t* count, char* err,
                                                           size_t errlen) {
  std::vector<int> out;
  sentencepiece::util::Status s =
      static_cast<sentencepiece::SentencePieceProcessor*>(model)->Encode(std::string_view(text, n),
                                                                         &out);
  if (!s.ok()) {
    SetError(s.ToString(), err, errlen);
    return 0;
  }
  *count = out.size();
  *ids = static_cast<int*>(std::malloc(sizeof(int) * (out.empty() ? 1 : out.size())));
  if (!out.empty()) std::memcpy(*ids, out.data(), sizeof(int) * out.size());
  return 1;
}

// Returns a malloc'd, NUL-terminated string (loom_spm_release), or NULL.
__attribute__((visibility("default"))) char* loom_spm_decode(void* model, const int* ids,
                                                             size_t n) {
  std::string out;
  if (!static_cast<sentencepiece::SentencePieceProcessor*>(model)
           ->Decode(std::vector<int>(ids, ids + n), &out)
           .ok()) {
    return nullptr;
  }
  return strdup(out.c_str());
}

// what: 0 vocab size, 1 unk, 2 bos, 3 eos, 4 pad.
__attribute__((visibility("default"))) int loom_spm_info(void* model, int what) {
  auto* p = static_cast<sentencepiece::SentencePieceProcessor*>(model);
  switch (what) {
    case 0:
      return p->GetPieceSize();
    case 1:
      return p->unk_id();
    case 2:
      return p->bos_id();
    case 3:
      return p->eos_id();
    case 4:
      return p->pad_id();
  }
  return -1;
}

__attribute__((visibility("default"))) int loom_spm_piece_to_id(void* model, const char* piece,
                                                                size_t n) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(model)->PieceToId(
      std::string_view(piece, n));
}

// model: malloc'd, freed by the caller with loom_spm_release().
__attribute__((visibility("default"))) int loom_spm_train(const char* const* sentences,
                                                          const size_t* lens, size_t n,
                                                          const char* args, char** model,
                                                          size_t* model_len, char* err,
                                                          size_t errlen) {
  VectorIterator it(sentences, lens, n);
  std::string serialized;
  sentencepiece::util::Status s =
      sentencepiece::SentencePieceTrainer::Train(std::string_view(args), &it, &serialized);
  if (!s.ok()) {
    SetError(s.ToString(), err, errlen);
    return 0;
  }
  *model_len = serialized.size();
  *model = static_cast<char*>(std::malloc(serialized.size() + 1));
  std::memcpy(*model, serialized.data(), serialized.size());
  return 1;
}

}  // extern "C"
