// safetensors (Hugging Face's tensor file format) in C++: one file, or a
// sharded set (`model-0000k-of-0000n.safetensors` and
// `model.safetensors.index.json` with its weight_map).
//
// A file is an 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {"format": "pt"},
//    "NAME": {"dtype": "BF16", "shape": [R, C], "data_offsets": [BEGIN, END]}, ...}
// (padded with spaces to a multiple of 8 bytes), then the data: every
// tensor's bytes, row-major little-endian, at [BEGIN, END) of the data with
// neither gaps nor overlaps, covering it exactly.
//
// Opening validates all of that before any tensor is read: a header over
// 100 MB, a file shorter than its header or its data, JSON that is not that
// shape, an unknown dtype, a size other than numel x the dtype's size,
// offsets with a gap or an overlap, a shard the index names that is missing
// or lacks a tensor mapped to it -- each is INVALID_ARGUMENT (NOT_FOUND for a
// missing file) naming the file and the tensor. Tensors are read with pread,
// one at a time, so a 5 GB shard costs no more memory than its largest
// tensor. Writes go to PATH.tmp, are fsynced and renamed over PATH.
#ifndef LOOM_RUNTIME_HF_SAFETENSORS_H_
#define LOOM_RUNTIME_HF_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::hf {

// The dtypes safetensors defines; Loom computes in F32 and reads or writes
// F32, BF16 and F16 (others open, and reading them as floats is an error).
enum class DType {
  kBool,
  kU8,
  kI8,
  kF8E4M3,
  kF8E5M2,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64
};

absl::StatusOr<DType> ParseDType(const std::string& name);
const char* DTypeName(DType d);
int DTypeSize(DType d);

struct TensorEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // of the data section
  int64_t numel() const;
  uint64_t bytes() const { return end - begin; }
};

// One .safetensors file, open for reading.
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorEntry>& tensors() const { return tensors_; }  // by offset
  const TensorEntry* Find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor's bytes as stored (entry.bytes() of them) into `out`.
  absl::Status ReadBytes(const TensorEntry& entry, void* out) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::vector<TensorEntry> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A model's weights: `model.safetensors`, or the shards its
// `model.safetensors.index.json` maps, in a directory (or one file's path).
class SafetensorsModel {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsModel>> Open(const std::string& dir_or_file);

  std::vector<std::string> names() const;  // sorted
  const TensorEntry* Find(const std::string& name) const;
  // NOT_FOUND naming the tensor and where it was looked for.
  absl::Status ReadBytes(const std::string& name, void* out) const;
  // The tensor as F32 (BF16 and F16 widened exactly); INVALID_ARGUMENT for
  // other dtypes.
  absl::StatusOr<std::vector<float>> ReadF32(const std::string& name) const;
  const std::string& where() const { return where_; }

 private:
  std::string where_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const SafetensorsFile*, const TensorEntry*>> tensors_;
};

// A tensor to write: `bytes` at `data` hold numel x DTypeSize(dtype).
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t bytes = 0;
};

// One file, tensors in the order given, `__metadata__` {"format": "pt"}
// plus `metadata`. INVALID_ARGUMENT for a size that does not match the shape,
// a name used twice or "__metadata__".
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Into `dir` as transformers' save_pretrained does: `model.safetensors` when
// everything fits in one shard of `max_shard_bytes`, else
// `model-0000k-of-0000n.safetensors` (tensors in the order given, a shard
// closed before it would pass the limit, a larger tensor alone) and
// `model.safetensors.index.json` {"metadata": {"total_size": ...},
// "weight_map": {name: file}}.
absl::Status WriteSafetensorsModel(const std::string& dir, const std::vector<TensorView>& tensors,
                                   uint64_t max_shard_bytes);

// Conversions (round to nearest even on narrowing; NaN stays NaN).
float Bf16ToF32(uint16_t x);
uint16_t F32ToBf16(float x);
float F16ToF32(uint16_t x);
uint16_t F32ToF16(float x);

}  // namespace loom::hf

#endif  // LOOM_RUNTIME_HF_SAFETENSORS_H_
