#include "runtime/model/precision.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/log.h"

namespace loom {

absl::StatusOr<Precision> ParsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  return absl::InvalidArgumentError(absl::StrCat("want fp32 or bf16, got \"", name, "\""));
}

const char* PrecisionName(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

namespace {

size_t Total(const std::vector<size_t>& sizes) {
  size_t n = 0;
  for (size_t s : sizes) n += s;
  return n;
}

}  // namespace

void ActivationStash::Pack(Ops* ops, const std::vector<Buffer<float>*>& narrow,
                           const std::vector<Buffer<float>*>& kept) {
  narrow_sizes_.clear();
  kept_sizes_.clear();
  for (const Buffer<float>* b : narrow) narrow_sizes_.push_back(b->size());
  for (const Buffer<float>* b : kept) kept_sizes_.push_back(b->size());
  narrow_.resize(Total(narrow_sizes_));
  kept_.resize(Total(kept_sizes_));
  size_t at = 0;
  for (const Buffer<float>* b : narrow) {
    ops->f32_to_bf16(narrow_.data() + at, b->data(), static_cast<int64_t>(b->size()));
    at += b->size();
  }
  at = 0;
  for (const Buffer<float>* b : kept) {
    ops->copy(kept_.data() + at, b->data(), static_cast<int64_t>(b->size()));
    at += b->size();
  }
}

void ActivationStash::Unpack(Ops* ops, const std::vector<Buffer<float>*>& narrow,
                             const std::vector<Buffer<float>*>& kept) const {
  LOOM_CHECK(narrow.size() == narrow_sizes_.size() && kept.size() == kept_sizes_.size())
      << "ActivationStash: unpacked into other buffers than were packed";
  size_t at = 0;
  for (size_t i = 0; i < narrow.size(); ++i) {
    narrow[i]->resize(narrow_sizes_[i]);
    ops->bf16_to_f32(narrow[i]->data(), narrow_.data() + at,
                     static_cast<int64_t>(narrow_sizes_[i]));
    at += narrow_sizes_[i];
  }
  at = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    kept[i]->resize(kept_sizes_[i]);
    ops->copy(kept[i]->data(), kept_.data() + at, static_cast<int64_t>(kept_sizes_[i]));
    at += kept_sizes_[i];
  }
}

int64_t ActivationStash::bytes() const {
  return static_cast<int64_t>(sizeof(uint16_t) * Total(narrow_sizes_) +
                              sizeof(float) * Total(kept_sizes_));
}

}  // namespace loom
