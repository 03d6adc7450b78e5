#include "runtime/hf/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/matmul/bf16.h"
#include "nlohmann/json.hpp"
#include "runtime/base/file.h"

namespace loom::hf {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // safetensors' own limit
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr char kSingleFile[] = "model.safetensors";

struct DTypeInfo {
  DType dtype;
  const char* name;
  int size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kBool, "BOOL", 1},      {DType::kU8, "U8", 1},          {DType::kI8, "I8", 1},
    {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1}, {DType::kI16, "I16", 2},
    {DType::kU16, "U16", 2},        {DType::kF16, "F16", 2},        {DType::kBF16, "BF16", 2},
    {DType::kI32, "I32", 4},        {DType::kU32, "U32", 4},        {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},        {DType::kI64, "I64", 8},        {DType::kU64, "U64", 8},
};

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

std::string Errno() { return std::strerror(errno); }

// Reads exactly n bytes at `offset`; false on a short read (errno set or 0).
bool PreadAll(int fd, void* out, uint64_t n, uint64_t offset) {
  char* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, std::min<uint64_t>(n, 1 << 30), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

bool WriteAll(int fd, const void* data, uint64_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t put = ::write(fd, p, std::min<uint64_t>(n, 1 << 30));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= static_cast<uint64_t>(put);
  }
  return true;
}

bool NonNegativeInteger(const json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
}

// Parses one tensor's header entry.
absl::StatusOr<TensorEntry> ParseEntry(const std::string& path, const std::string& name,
                                       const json& v) {
  const std::string where = absl::StrCat("tensor '", name, "'");
  if (!v.is_object()) return Bad(path, absl::StrCat(where, ": not a JSON object"));
  TensorEntry e;
  e.name = name;
  auto dtype = v.find("dtype");
  if (dtype == v.end() || !dtype->is_string()) {
    return Bad(path, absl::StrCat(where, ": no \"dtype\" string"));
  }
  absl::StatusOr<DType> d = ParseDType(dtype->get<std::string>());
  if (!d.ok()) return Bad(path, absl::StrCat(where, ": ", d.status().message()));
  e.dtype = *d;
  auto shape = v.find("shape");
  if (shape == v.end() || !shape->is_array()) {
    return Bad(path, absl::StrCat(where, ": no \"shape\" array"));
  }
  for (const json& x : *shape) {
    if (!NonNegativeInteger(x)) {
      return Bad(path, absl::StrCat(where, ": shape ", shape->dump(),
                                    " has an entry that is not a non-negative integer"));
    }
    e.shape.push_back(x.get<int64_t>());
  }
  auto offsets = v.find("data_offsets");
  if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2 ||
      !NonNegativeInteger((*offsets)[0]) || !NonNegativeInteger((*offsets)[1])) {
    return Bad(path, absl::StrCat(where, ": \"data_offsets\" is not [begin, end]"));
  }
  e.begin = (*offsets)[0].get<uint64_t>();
  e.end = (*offsets)[1].get<uint64_t>();
  if (e.end < e.begin) {
    return Bad(path, absl::StrCat(where, ": data_offsets [", e.begin, ", ", e.end,
                                  "] end before they begin"));
  }
  // numel x size, without overflow.
  unsigned __int128 want = static_cast<unsigned __int128>(DTypeSize(e.dtype));
  for (int64_t n : e.shape) {
    want *= static_cast<unsigned __int128>(n);
    if (want > std::numeric_limits<uint64_t>::max()) {
      return Bad(path, absl::StrCat(where, ": shape ", shape->dump(), " is too large"));
    }
  }
  if (static_cast<uint64_t>(want) != e.bytes()) {
    return Bad(path, absl::StrCat(where, ": ", e.bytes(), " bytes at data_offsets [", e.begin, ", ",
                                  e.end, "], but shape ", shape->dump(), " of ", DTypeName(e.dtype),
                                  " needs ", static_cast<uint64_t>(want)));
  }
  return e;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

absl::StatusOr<DType> ParseDType(const std::string& name) {
  for (const DTypeInfo& d : kDTypes) {
    if (name == d.name) return d.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", name, "\""));
}

const char* DTypeName(DType d) {
  for (const DTypeInfo& x : kDTypes) {
    if (x.dtype == d) return x.name;
  }
  return "?";
}

int DTypeSize(DType d) {
  for (const DTypeInfo& x : kDTypes) {
    if (x.dtype == d) return x.size;
  }
  return 0;
}

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd_ < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::InternalError(absl::StrCat(path, ": ", Errno()));
  }
  struct stat st;
  if (::fstat(f->fd_, &st) != 0) return absl::InternalError(absl::StrCat(path, ": ", Errno()));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  unsigned char len_bytes[8];
  if (size < 8 || !PreadAll(f->fd_, len_bytes, 8, 0)) {
    return Bad(path, absl::StrCat("truncated: ", size, " bytes, shorter than the header length"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > kMaxHeaderBytes) {
    return Bad(path, absl::StrCat("header of ", n, " bytes is over the 100 MB limit"));
  }
  if (8 + n > size) {
    return Bad(path, absl::StrCat("truncated: the header needs ", n, " bytes, the file has ",
                                  size - 8, " after its length"));
  }
  std::string text(n, '\0');
  if (!PreadAll(f->fd_, text.data(), n, 8)) {
    return absl::InternalError(absl::StrCat(path, ": reading the header: ", Errno()));
  }
  json header = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Bad(path, "the header is not a JSON object");
  }
  f->data_start_ = 8 + n;
  const uint64_t data_size = size - f->data_start_;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return Bad(path, "__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return Bad(path, absl::StrCat("__metadata__ value of '", m.key(), "' is not a string"));
        }
        f->metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    absl::StatusOr<TensorEntry> e = ParseEntry(path, it.key(), *it);
    if (!e.ok()) return e.status();
    f->tensors_.push_back(std::move(*e));
  }
  std::sort(f->tensors_.begin(), f->tensors_.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return std::make_pair(a.begin, a.end) < std::make_pair(b.begin, b.end);
  });
  uint64_t at = 0;
  const TensorEntry* prev = nullptr;
  for (const TensorEntry& t : f->tensors_) {
    if (t.begin > at) {
      return Bad(path,
                 absl::StrCat("tensor '", t.name, "' begins at ", t.begin, " but ",
                              prev ? absl::StrCat("'", prev->name, "' ends") : "the data begins",
                              " at ", at, ": a gap of ", t.begin - at, " bytes"));
    }
    if (t.begin < at) {
      return Bad(path,
                 absl::StrCat("tensor '", t.name, "' at [", t.begin, ", ", t.end, ") overlaps '",
                              prev->name, "' at [", prev->begin, ", ", prev->end, ")"));
    }
    if (t.end > data_size) {
      return Bad(path, absl::StrCat("truncated: tensor '", t.name, "' ends at byte ", t.end,
                                    " of the data, which has ", data_size));
    }
    at = t.end;
    prev = &t;
  }
  if (at != data_size) {
    return Bad(path, absl::StrCat(data_size - at, " bytes after the last tensor",
                                  prev ? absl::StrCat(" ('", prev->name, "')") : "",
                                  " belong to no tensor"));
  }
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->index_[f->tensors_[i].name] = i;
  return f;
}

const TensorEntry* SafetensorsFile::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::Status SafetensorsFile::ReadBytes(const TensorEntry& e, void* out) const {
  if (!PreadAll(fd_, out, e.bytes(), data_start_ + e.begin)) {
    return absl::DataLossError(
        absl::StrCat(path_, ": tensor '", e.name, "': short read (", Errno(), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SafetensorsModel>> SafetensorsModel::Open(
    const std::string& dir_or_file) {
  auto m = std::make_unique<SafetensorsModel>();
  m->where_ = dir_or_file;
  auto add_file = [&](const std::string& path) -> absl::StatusOr<const SafetensorsFile*> {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
    if (!f.ok()) return f.status();
    m->files_.push_back(std::move(*f));
    return m->files_.back().get();
  };
  if (!IsDirectory(dir_or_file)) {
    absl::StatusOr<const SafetensorsFile*> f = add_file(dir_or_file);
    if (!f.ok()) return f.status();
    for (const TensorEntry& t : (*f)->tensors()) m->tensors_[t.name] = {*f, &t};
    return m;
  }
  const std::string index_path = absl::StrCat(dir_or_file, "/", kIndexFile);
  if (!Exists(index_path)) {
    const std::string single = absl::StrCat(dir_or_file, "/", kSingleFile);
    if (!Exists(single)) {
      return absl::NotFoundError(
          absl::StrCat(dir_or_file, ": neither ", kSingleFile, " nor ", kIndexFile));
    }
    absl::StatusOr<const SafetensorsFile*> f = add_file(single);
    if (!f.ok()) return f.status();
    for (const TensorEntry& t : (*f)->tensors()) m->tensors_[t.name] = {*f, &t};
    return m;
  }
  absl::StatusOr<std::string> text = ReadFile(index_path);
  if (!text.ok()) return text.status();
  json index = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  auto map = index.is_object() ? index.find("weight_map") : index.end();
  if (index.is_discarded() || !index.is_object() || map == index.end() || !map->is_object()) {
    return Bad(index_path, "not a JSON object with a \"weight_map\" object");
  }
  std::map<std::string, const SafetensorsFile*> shards;
  for (auto it = map->begin(); it != map->end(); ++it) {
    if (!it->is_string() || it->get<std::string>().find('/') != std::string::npos ||
        it->get<std::string>().empty()) {
      return Bad(index_path, absl::StrCat("weight_map entry of tensor '", it.key(),
                                          "' is not a file name in the directory"));
    }
    const std::string shard = it->get<std::string>();
    auto s = shards.find(shard);
    if (s == shards.end()) {
      const std::string path = absl::StrCat(dir_or_file, "/", shard);
      if (!Exists(path)) {
        return absl::NotFoundError(absl::StrCat(index_path, ": shard ", shard, " (of tensor '",
                                                it.key(), "') is missing"));
      }
      absl::StatusOr<const SafetensorsFile*> f = add_file(path);
      if (!f.ok()) return f.status();
      s = shards.emplace(shard, *f).first;
    }
    const TensorEntry* t = s->second->Find(it.key());
    if (t == nullptr) {
      return Bad(index_path, absl::StrCat("weight_map puts tensor '", it.key(), "' in ", shard,
                                          ", which does not hold it"));
    }
    m->tensors_[it.key()] = {s->second, t};
  }
  return m;
}

std::vector<std::string> SafetensorsModel::names() const {
  std::vector<std::string> out;
  for (const auto& [name, where] : tensors_) out.push_back(name);
  return out;
}

const TensorEntry* SafetensorsModel::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.second;
}

absl::Status SafetensorsModel::ReadBytes(const std::string& name, void* out) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(where_, ": no tensor '", name, "'"));
  }
  return it->second.first->ReadBytes(*it->second.second, out);
}

absl::StatusOr<std::vector<float>> SafetensorsModel::ReadF32(const std::string& name) const {
  const TensorEntry* e = Find(name);
  if (e == nullptr) return absl::NotFoundError(absl::StrCat(where_, ": no tensor '", name, "'"));
  const int64_t n = e->numel();
  std::vector<float> out(static_cast<size_t>(n));
  if (e->dtype == DType::kF32) {
    if (absl::Status s = ReadBytes(name, out.data()); !s.ok()) return s;
    return out;
  }
  if (e->dtype != DType::kBF16 && e->dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": tensor '", name, "' is ",
                                                   DTypeName(e->dtype),
                                                   "; Loom reads F32, BF16 and F16"));
  }
  std::vector<uint16_t> raw(static_cast<size_t>(n));
  if (absl::Status s = ReadBytes(name, raw.data()); !s.ok()) return s;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = e->dtype == DType::kBF16 ? Bf16ToF32(raw[i]) : F16ToF32(raw[i]);
  }
  return out;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  json meta = json::object();
  meta["format"] = "pt";
  for (const auto& [k, v] : metadata) meta[k] = v;
  header["__metadata__"] = meta;
  uint64_t at = 0;
  for (const TensorView& t : tensors) {
    if (t.name == "__metadata__" || header.contains(t.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor name '", t.name, "' is used twice or reserved"));
    }
    uint64_t want = static_cast<uint64_t>(DTypeSize(t.dtype));
    for (int64_t s : t.shape) {
      if (s < 0)
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor '", t.name, "' has a negative dimension"));
      want *= static_cast<uint64_t>(s);
    }
    if (want != t.bytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", t.name, "' has ", t.bytes,
                                                     " bytes; its shape needs ", want));
    }
    header[t.name] = {
        {"dtype", DTypeName(t.dtype)}, {"shape", t.shape}, {"data_offsets", {at, at + t.bytes}}};
    at += t.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(text.size() >> (8 * i));

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat(tmp, ": ", Errno()));
  bool ok = WriteAll(fd, len, 8) && WriteAll(fd, text.data(), text.size());
  for (size_t i = 0; ok && i < tensors.size(); ++i) {
    ok = WriteAll(fd, tensors[i].data, tensors[i].bytes);
  }
  ok = ok && ::fsync(fd) == 0;
  const std::string error = ok ? "" : Errno();
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat(path, ": writing: ", ok ? Errno() : error));
  }
  return absl::OkStatus();
}

absl::Status WriteSafetensorsModel(const std::string& dir, const std::vector<TensorView>& tensors,
                                   uint64_t max_shard_bytes) {
  if (absl::Status s = MakeDirectories(dir); !s.ok()) return s;
  std::vector<std::vector<TensorView>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const TensorView& t : tensors) {
    if (!shards.back().empty() && in_shard + t.bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += t.bytes;
    total += t.bytes;
  }
  if (shards.size() == 1) return WriteSafetensors(absl::StrCat(dir, "/", kSingleFile), tensors);
  json weight_map = json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string name = absl::StrFormat(
        "model-%05d-of-%05d.safetensors", static_cast<int>(k + 1), static_cast<int>(shards.size()));
    if (absl::Status s = WriteSafetensors(absl::StrCat(dir, "/", name), shards[k]); !s.ok()) {
      return s;
    }
    for (const TensorView& t : shards[k]) weight_map[t.name] = name;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  return WriteFileAtomically(absl::StrCat(dir, "/", kIndexFile), index.dump(2) + "\n");
}

float Bf16ToF32(uint16_t x) { return kernels::Bf16ToF32(x); }

uint16_t F32ToBf16(float f) { return kernels::F32ToBf16(f); }

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const int exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal, exact
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits |= sign;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  uint32_t bits;
  if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf or NaN
  } else {
    bits = sign | (static_cast<uint32_t>(exp - 15 + 127) << 23) | (mant << 13);
  }
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t F32ToF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  if (std::isnan(f)) return sign | 0x7e00;
  const float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7c00;  // rounds to infinity
  if (a < std::ldexp(1.0f, -14)) {
    // Subnormal (or zero): a / 2^-24 rounded to nearest even.
    const float q = a * std::ldexp(1.0f, 24);
    return sign | static_cast<uint16_t>(std::nearbyint(q));
  }
  const uint32_t abits = bits & 0x7fffffffu;
  uint32_t r = abits + 0xfff + ((abits >> 13) & 1);  // round the 13 dropped bits to even
  r -= (127 - 15) << 23;
  return sign | static_cast<uint16_t>(r >> 13);
}

}  // namespace loom::hf
