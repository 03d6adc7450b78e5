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

absl::StatusOr<Recompute> ParseRecompute(const std::string& name) {
  if (name.empty() || name == "full") return Recompute::kFull;
  if (name == "none") return Recompute::kNone;
  if (name == "selective") return Recompute::kSelective;
  return absl::InvalidArgumentError(
      absl::StrCat("want full, none or selective, got \"", name, "\""));
}

const char* RecomputeName(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      break;
  }
  return "full";
}

void SavedActivations::Take(const Lists& from) {
  LOOM_CHECK(empty()) << "SavedActivations: taken twice";
  for (Buffer<float>* b : from.floats) {
    floats_.emplace_back(nullptr);
    floats_.back().swap(*b);
    b->set_backend(floats_.back().backend());
  }
  for (Buffer<int32_t>* b : from.ints) {
    ints_.emplace_back(nullptr);
    ints_.back().swap(*b);
    b->set_backend(ints_.back().backend());
  }
  for (ActivationStash* st : from.stashes) {
    stashes_.emplace_back();
    stashes_.back().swap(*st);
    st->Bind(stashes_.back().backend());
  }
}

void SavedActivations::Restore(const Lists& to) {
  LOOM_CHECK(to.floats.size() == floats_.size() && to.ints.size() == ints_.size() &&
             to.stashes.size() == stashes_.size())
      << "SavedActivations: restored into other buffers than were taken";
  for (size_t i = 0; i < floats_.size(); ++i) to.floats[i]->swap(floats_[i]);
  for (size_t i = 0; i < ints_.size(); ++i) to.ints[i]->swap(ints_[i]);
  for (size_t i = 0; i < stashes_.size(); ++i) to.stashes[i]->swap(stashes_[i]);
  floats_.clear();  // what the module held before
  ints_.clear();
  stashes_.clear();
}

int64_t SavedActivations::bytes() const {
  int64_t n = 0;
  for (const Buffer<float>& b : floats_) n += static_cast<int64_t>(b.size() * sizeof(float));
  for (const Buffer<int32_t>& b : ints_) n += static_cast<int64_t>(b.size() * sizeof(int32_t));
  for (const ActivationStash& st : stashes_) n += st.bytes();
  return n;
}

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
