#include "runtime/checkpoint/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "runtime/base/file.h"

namespace loom {
namespace {

uint64_t Fnv1a(const std::string& data) {
  uint64_t h = 14695981039346656037ULL;
  for (unsigned char c : data) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

template <typename T>
void Put(std::string* out, const T& v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void PutString(std::string* out, const std::string& s) {
  Put(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}

// Reads from a byte buffer with bounds checks.
class Reader {
 public:
  explicit Reader(const std::string& data) : data_(data) {}
  template <typename T>
  bool Get(T* v) {
    if (pos_ + sizeof(T) > data_.size()) return false;
    std::memcpy(v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetString(std::string* s, uint32_t max = 4096) {
    uint32_t n;
    if (!Get(&n) || n > max || pos_ + n > data_.size()) return false;
    s->assign(data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool GetFloats(float* dst, int64_t n) {
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    if (n < 0 || pos_ + bytes > data_.size()) return false;
    std::memcpy(dst, data_.data() + pos_, bytes);
    pos_ += bytes;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  const std::string& data_;
  size_t pos_ = 0;
};

}  // namespace

absl::Status SaveModuleCheckpoint(ParamSet& params, const std::string& module,
                                  const std::string& path) {
  std::string out;
  out.append("LOOMCKPT", 8);
  Put(&out, kCheckpointVersion);
  PutString(&out, module);
  Put(&out, static_cast<int64_t>(params.step()));
  Put(&out, static_cast<uint32_t>(params.specs().size()));
  for (const ParamSpec& s : params.specs()) {
    PutString(&out, s.name);
    Put(&out, static_cast<uint32_t>(s.shape.size()));
    for (int64_t d : s.shape) Put(&out, d);
  }
  for (const std::vector<float>* v : {&params.data(), &params.adam_m(), &params.adam_v()}) {
    if (v->empty()) {  // a frozen module's AdamW state: zeros, as it starts when unfrozen
      out.append(static_cast<size_t>(params.size()) * sizeof(float), '\0');
      continue;
    }
    out.append(reinterpret_cast<const char*>(v->data()), v->size() * sizeof(float));
  }
  Put(&out, Fnv1a(out));
  return WriteFileAtomically(path, out);
}

absl::Status LoadModuleCheckpoint(const std::string& path, const std::string& module,
                                  ParamSet* params) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("checkpoint ", path, " cannot be opened"));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  auto corrupt = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": ", what));
  };
  if (data.size() < 8 + 4 + 8 || data.compare(0, 8, "LOOMCKPT") != 0) {
    return corrupt("not a Loom checkpoint (bad magic)");
  }
  uint64_t stored;
  std::memcpy(&stored, data.data() + data.size() - 8, 8);
  if (Fnv1a(data.substr(0, data.size() - 8)) != stored) return corrupt("checksum mismatch");
  Reader r(data);
  char magic[8];
  r.Get(&magic);
  uint32_t version;
  std::string name;
  int64_t step;
  uint32_t count;
  if (!r.Get(&version)) return corrupt("truncated header");
  if (version != kCheckpointVersion) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", path, ": version ", version,
                                                      ", this build reads ", kCheckpointVersion));
  }
  if (!r.GetString(&name) || !r.Get(&step) || !r.Get(&count)) return corrupt("truncated header");
  if (name != module) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", path, " holds module '", name, "', not '", module, "'"));
  }
  if (count != params->specs().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", path, " has ", count, " tensors, the model has ", params->specs().size()));
  }
  for (const ParamSpec& s : params->specs()) {
    std::string tname;
    uint32_t ndim;
    if (!r.GetString(&tname) || !r.Get(&ndim) || ndim > 8) return corrupt("truncated table");
    Shape shape(ndim);
    for (uint32_t i = 0; i < ndim; ++i) {
      if (!r.Get(&shape[i])) return corrupt("truncated table");
    }
    if (tname != s.name || shape != s.shape) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint ", path, ": tensor '", tname, "' ",
                                                     ShapeString(shape), " where the model has '",
                                                     s.name, "' ", ShapeString(s.shape)));
    }
  }
  std::vector<float> skipped;  // a frozen module keeps no AdamW state
  if (params->frozen()) skipped.resize(params->size());
  float* m = params->frozen() ? skipped.data() : params->adam_m().data();
  float* v = params->frozen() ? skipped.data() : params->adam_v().data();
  if (!r.GetFloats(params->data().data(), params->size()) || !r.GetFloats(m, params->size()) ||
      !r.GetFloats(v, params->size())) {
    return corrupt("truncated tensor data");
  }
  if (r.pos() + 8 != data.size()) return corrupt("trailing bytes");
  params->step() = step;
  return absl::OkStatus();
}

absl::Status LoadModuleWeights(const std::string& path, const std::string& module,
                               ParamSet* params) {
  if (absl::Status s = LoadModuleCheckpoint(path, module, params); !s.ok()) return s;
  for (std::vector<float>* v : {&params->adam_m(), &params->adam_v()}) {
    std::fill(v->begin(), v->end(), 0.0f);
  }
  params->step() = 0;
  return absl::OkStatus();
}

}  // namespace loom
