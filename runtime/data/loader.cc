#include "runtime/data/loader.h"

#include <glob.h>

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "runtime/base/log.h"
#include "runtime/base/rng.h"

namespace loom::data {

absl::StatusOr<std::vector<std::string>> ExpandShardGlob(const std::string& pattern) {
  glob_t g;
  std::vector<std::string> out;
  const int r = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  if (r == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.push_back(g.gl_pathv[i]);
  }
  globfree(&g);
  if (out.empty()) return absl::NotFoundError(absl::StrCat("no shard matches ", pattern));
  std::sort(out.begin(), out.end());
  return out;
}

DataLoader::DataLoader(LoaderOptions options, const Tokenizer* tokenizer)
    : options_(std::move(options)), preprocessor_(options_.preprocess, tokenizer) {}

absl::StatusOr<std::unique_ptr<DataLoader>> DataLoader::Open(LoaderOptions options,
                                                             const Tokenizer* tokenizer) {
  if (options.threads < 1 || options.prefetch < 1) {
    return absl::InvalidArgumentError("loader threads and prefetch must be >= 1");
  }
  std::unique_ptr<DataLoader> loader(new DataLoader(std::move(options), tokenizer));
  const LoaderOptions& o = loader->options_;
  for (size_t s = 0; s < o.shards.size(); ++s) {
    absl::StatusOr<ShardIndex> index = IndexShard(o.shards[s], o.preprocess.shard);
    if (!index.ok()) return index.status();
    if (!index->error.empty()) {
      LOOM_LOG(WARNING).With("shard", o.shards[s]).With("error", index->error)
          << "shard is damaged; samples after the damage are lost";
    }
    for (const BrokenSample& b : index->broken) loader->CountSkip({b.key, b.reason, b.detail});
    for (const SampleRef& ref : index->samples) {
      loader->refs_.push_back({static_cast<int>(s), ref});
    }
  }
  if (loader->refs_.empty()) {
    return absl::FailedPreconditionError("the shards hold no readable sample");
  }
  for (int t = 0; t < o.threads; ++t)
    loader->threads_.emplace_back([l = loader.get()] { l->Worker(); });
  return loader;
}

DataLoader::~DataLoader() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  for (std::thread& t : threads_) t.join();
}

int64_t DataLoader::SampleAt(int64_t global) {
  const int64_t n = static_cast<int64_t>(refs_.size());
  const int64_t epoch = global / n, pos = global % n;
  if (!options_.shuffle) return pos;
  auto it = permutations_.find(epoch);
  if (it == permutations_.end()) {
    // Keep the permutations of the epochs in flight only.
    while (!permutations_.empty() && permutations_.begin()->first < deliver_ / n) {
      permutations_.erase(permutations_.begin());
    }
    std::vector<int64_t> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    Rng rng(MixSeed(options_.seed, epoch, 0x5a3f));
    for (int64_t i = n - 1; i > 0; --i) std::swap(perm[i], perm[rng.UniformInt(0, i)]);
    it = permutations_.emplace(epoch, std::move(perm)).first;
  }
  return it->second[pos];
}

void DataLoader::Worker() {
  for (;;) {
    int64_t global;
    uint64_t generation;
    Ref ref;
    {
      absl::MutexLock lock(&mu_);
      const int64_t end =
          options_.epochs > 0 ? options_.epochs * static_cast<int64_t>(refs_.size()) : INT64_MAX;
      while (!stop_ && (claim_ >= deliver_ + options_.prefetch || claim_ >= end)) cv_.Wait(&mu_);
      if (stop_) return;
      global = claim_++;
      generation = generation_;
      ref = refs_[SampleAt(global)];
      while (static_cast<int64_t>(window_.size()) <= global - deliver_) window_.emplace_back();
    }
    Outcome outcome;
    absl::StatusOr<SampleFiles> files =
        ReadSample(options_.shards[ref.shard], ref.sample, options_.preprocess.shard);
    if (files.ok()) {
      outcome = preprocessor_.Process(*files, options_.decode_pixels);
    } else {
      outcome.skip = {ref.sample.key, "truncated_tar", std::string(files.status().message())};
    }
    absl::MutexLock lock(&mu_);
    if (generation != generation_) continue;  // a Restore() moved on
    Slot& slot = window_[global - deliver_];
    slot.outcome = std::move(outcome);
    slot.done = true;
    cv_.SignalAll();
  }
}

void DataLoader::CountSkip(const SkippedSample& skip) {
  LOOM_LOG(WARNING).With("key", skip.key).With("reason", skip.reason).With("detail", skip.detail)
      << "sample skipped";
  {
    absl::MutexLock lock(&mu_);
    ++skipped_[skip.reason];
  }
  if (options_.on_skip) options_.on_skip(skip);
}

absl::StatusOr<ProcessedSample> DataLoader::Next() {
  const int64_t n = static_cast<int64_t>(refs_.size());
  int64_t skipped_in_row = 0;
  for (;;) {
    Outcome outcome;
    {
      absl::MutexLock lock(&mu_);
      if (options_.epochs > 0 && deliver_ >= options_.epochs * n) {
        return absl::OutOfRangeError(
            absl::StrCat("end of data after ", options_.epochs, " epochs"));
      }
      while (window_.empty() || !window_.front().done) cv_.Wait(&mu_);
      outcome = std::move(window_.front().outcome);
      window_.pop_front();
      ++deliver_;
      if (outcome.ok) ++kept_;
      cv_.SignalAll();
    }
    if (outcome.ok) return std::move(outcome.sample);
    CountSkip(outcome.skip);
    if (++skipped_in_row >= n) {
      return absl::FailedPreconditionError(
          absl::StrCat("every one of the ", n, " samples in the shards was skipped"));
    }
  }
}

data::v1::DataCursor DataLoader::Cursor() const {
  absl::MutexLock lock(&mu_);
  const int64_t n = static_cast<int64_t>(refs_.size());
  data::v1::DataCursor c;
  c.set_seed(options_.seed);
  c.set_epoch(deliver_ / n);
  c.set_position(deliver_ % n);
  c.set_dataset_samples(n);
  return c;
}

absl::Status DataLoader::Restore(const data::v1::DataCursor& cursor) {
  const int64_t n = static_cast<int64_t>(refs_.size());
  if (cursor.seed() != options_.seed) {
    return absl::InvalidArgumentError(
        absl::StrCat("cursor.seed ", cursor.seed(), " != the loader's seed ", options_.seed));
  }
  if (cursor.dataset_samples() != n) {
    return absl::InvalidArgumentError(absl::StrCat("cursor.dataset_samples ",
                                                   cursor.dataset_samples(), " != ", n,
                                                   " samples in the shards: not the same data"));
  }
  if (cursor.epoch() < 0 || cursor.position() < 0 || cursor.position() >= n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cursor.epoch/position out of range: ", cursor.epoch(), "/", cursor.position()));
  }
  absl::MutexLock lock(&mu_);
  ++generation_;
  deliver_ = claim_ = cursor.epoch() * n + cursor.position();
  window_.clear();
  cv_.SignalAll();
  return absl::OkStatus();
}

int64_t DataLoader::kept() const {
  absl::MutexLock lock(&mu_);
  return kept_;
}

std::map<std::string, int64_t> DataLoader::skipped() const {
  absl::MutexLock lock(&mu_);
  return skipped_;
}

}  // namespace loom::data
