#include "runtime/data/spm_glue.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include "runtime/base/runfiles.h"

namespace loom::data::spm {
namespace {

struct Api {
  void* (*load)(const char*, size_t, char*, size_t);
  void (*free_model)(void*);
  void (*release)(void*);
  int (*encode)(void*, const char*, size_t, int**, size_t*, char*, size_t);
  char* (*decode)(void*, const int*, size_t);
  int (*info)(void*, int);
  int (*piece_to_id)(void*, const char*, size_t);
  int (*train)(const char* const*, const size_t*, size_t, const char*, char**, size_t*, char*,
               size_t);
};

// dlopen(RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND). Under AddressSanitizer
// (the CUDA emulation's build) the sanitizer's dlopen refuses RTLD_DEEPBIND,
// because a library bound that way allocates with the C library's malloc:
// the plugin frees everything it allocates itself (loom_spm_release), so the
// C library's own dlopen is called.
void* DlopenDeep(const char* path) {
  constexpr int kFlags = RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND;
#if defined(__SANITIZE_ADDRESS__)
  using Dlopen = void* (*)(const char*, int);
  for (const char* version : {"GLIBC_2.34", "GLIBC_2.2.5"}) {
    if (auto* real = reinterpret_cast<Dlopen>(::dlvsym(RTLD_DEFAULT, "dlopen", version))) {
      return real(path, kFlags);
    }
  }
#endif
  return ::dlopen(path, kFlags);
}

const Api* LoadApi(std::string* error) {
  static Api api;
  static std::string load_error;
  static std::once_flag once;
  std::call_once(once, [] {
    void* handle = nullptr;
    std::string tried;
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("LOOM_SPM_PLUGIN")) candidates.push_back(env);
    for (const std::string& c : RunfileCandidates("runtime/data/libloom_spm.so")) {
      candidates.push_back(c);
    }
    for (const std::string& path : candidates) {
      if (::access(path.c_str(), R_OK) != 0) {
        tried += " " + path;
        continue;
      }
      handle = DlopenDeep(path.c_str());
      if (handle != nullptr) break;
      tried += " " + path + " (" + ::dlerror() + ")";
    }
    if (handle == nullptr) {
      load_error = "cannot load libloom_spm.so (the sentencepiece plugin); tried:" + tried +
                   "; set LOOM_SPM_PLUGIN to its path";
      return;
    }
    auto sym = [&](const char* name) { return ::dlsym(handle, name); };
    api.load = reinterpret_cast<decltype(api.load)>(sym("loom_spm_load"));
    api.free_model = reinterpret_cast<decltype(api.free_model)>(sym("loom_spm_free"));
    api.release = reinterpret_cast<decltype(api.release)>(sym("loom_spm_release"));
    api.encode = reinterpret_cast<decltype(api.encode)>(sym("loom_spm_encode"));
    api.decode = reinterpret_cast<decltype(api.decode)>(sym("loom_spm_decode"));
    api.info = reinterpret_cast<decltype(api.info)>(sym("loom_spm_info"));
    api.piece_to_id = reinterpret_cast<decltype(api.piece_to_id)>(sym("loom_spm_piece_to_id"));
    api.train = reinterpret_cast<decltype(api.train)>(sym("loom_spm_train"));
    if (!api.load || !api.free_model || !api.release || !api.encode || !api.decode || !api.info ||
        !api.piece_to_id || !api.train) {
      load_error = "libloom_spm.so lacks an expected symbol";
    }
  });
  if (!load_error.empty()) {
    *error = load_error;
    return nullptr;
  }
  return &api;
}

}  // namespace

struct Model::Impl {
  const Api* api;
  void* model;
  ~Impl() { api->free_model(model); }
};

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

std::unique_ptr<Model> Model::Load(std::string_view serialized, std::string* error) {
  const Api* api = LoadApi(error);
  if (api == nullptr) return nullptr;
  char err[512] = {0};
  void* m = api->load(serialized.data(), serialized.size(), err, sizeof(err));
  if (m == nullptr) {
    *error = err;
    return nullptr;
  }
  auto impl = std::make_unique<Impl>();
  impl->api = api;
  impl->model = m;
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

bool Model::Encode(std::string_view text, std::vector<int>* ids, std::string* error) const {
  int* out = nullptr;
  size_t count = 0;
  char err[512] = {0};
  if (!impl_->api->encode(impl_->model, text.data(), text.size(), &out, &count, err, sizeof(err))) {
    *error = err;
    return false;
  }
  ids->assign(out, out + count);
  impl_->api->release(out);
  return true;
}

std::string Model::Decode(const std::vector<int>& ids) const {
  char* s = impl_->api->decode(impl_->model, ids.data(), ids.size());
  if (s == nullptr) return "";
  std::string out(s);
  impl_->api->release(s);
  return out;
}

int Model::vocab_size() const { return impl_->api->info(impl_->model, 0); }
int Model::unk_id() const { return impl_->api->info(impl_->model, 1); }
int Model::bos_id() const { return impl_->api->info(impl_->model, 2); }
int Model::eos_id() const { return impl_->api->info(impl_->model, 3); }
int Model::pad_id() const { return impl_->api->info(impl_->model, 4); }
int Model::PieceToId(std::string_view piece) const {
  return impl_->api->piece_to_id(impl_->model, piece.data(), piece.size());
}

bool Train(const std::vector<std::string>& sentences, const std::string& args,
           std::string* serialized_model, std::string* error) {
  const Api* api = LoadApi(error);
  if (api == nullptr) return false;
  std::vector<const char*> ptrs;
  std::vector<size_t> lens;
  for (const std::string& s : sentences) {
    ptrs.push_back(s.data());
    lens.push_back(s.size());
  }
  char* model = nullptr;
  size_t len = 0;
  char err[512] = {0};
  if (!api->train(ptrs.data(), lens.data(), ptrs.size(), args.c_str(), &model, &len, err,
                  sizeof(err))) {
    *error = err;
    return false;
  }
  serialized_model->assign(model, len);
  api->release(model);
  return true;
}

}  // namespace loom::data::spm
