#include "runtime/data/loader.h"

#include <glob.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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

absl::StatusOr<std::vector<DataSource>> ParseShardSources(const std::string& spec) {
  std::vector<DataSource> out;
  for (absl::string_view part : absl::StrSplit(spec, ',')) {
    DataSource source;
    std::string glob(part);
    if (const size_t eq = glob.rfind('='); eq != std::string::npos) {
      double w = 0;
      if (absl::SimpleAtod(absl::string_view(glob).substr(eq + 1), &w)) {
        if (!std::isfinite(w) || w <= 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("shards: \"", part, "\": the weight must be a finite number > 0"));
        }
        source.weight = w;
        glob.resize(eq);
      }
    }
    if (glob.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shards: \"", spec, "\" has an empty glob (GLOB or GLOB=WEIGHT,...)"));
    }
    absl::StatusOr<std::vector<std::string>> paths = ExpandShardGlob(glob);
    if (!paths.ok()) return paths.status();
    source.shards = *std::move(paths);
    source.spec = glob;
    out.push_back(std::move(source));
  }
  return out;
}

absl::StatusOr<int64_t> StepsForEpochs(double epochs, int64_t dataset_samples, int global_batch) {
  if (!std::isfinite(epochs) || epochs <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("epochs ", epochs, ": must be > 0"));
  }
  if (global_batch < 1 || dataset_samples < 1) {
    return absl::InvalidArgumentError("epochs: needs samples and a global batch >= 1");
  }
  const double steps = std::floor(epochs * static_cast<double>(dataset_samples) / global_batch);
  if (steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat(epochs, " epochs of ", dataset_samples,
                                                   " samples do not fill one batch of ",
                                                   global_batch));
  }
  if (steps > 2147483647.0) {
    return absl::InvalidArgumentError(absl::StrCat(epochs, " epochs: over 2^31 - 1 steps"));
  }
  return static_cast<int64_t>(steps);
}

DataLoader::DataLoader(LoaderOptions options, const Tokenizer* tokenizer)
    : options_(std::move(options)), preprocessor_(options_.preprocess, tokenizer) {}

absl::StatusOr<std::unique_ptr<DataLoader>> DataLoader::Open(LoaderOptions options,
                                                             const Tokenizer* tokenizer) {
  if (options.threads < 1 || options.prefetch < 1) {
    return absl::InvalidArgumentError("loader threads and prefetch must be >= 1");
  }
  if (!options.sources.empty() && !options.shards.empty()) {
    return absl::InvalidArgumentError("loader: shards or sources, not both");
  }
  std::vector<DataSource> sources = std::move(options.sources);
  if (sources.empty()) sources.push_back({std::move(options.shards), 1.0, "shards"});
  options.sources.clear();
  options.shards.clear();
  double weights = 0;
  for (const DataSource& source : sources) {
    if (!std::isfinite(source.weight) || source.weight <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "source ", source.spec, ": weight ", source.weight, " (must be a finite number > 0)"));
    }
    weights += source.weight;
  }
  std::unique_ptr<DataLoader> loader(new DataLoader(std::move(options), tokenizer));
  LoaderOptions& o = loader->options_;
  double cumulative = 0;
  for (const DataSource& source : sources) {
    Source& into = loader->sources_.emplace_back();
    cumulative += source.weight;
    into.cumulative = cumulative / weights;
    for (const std::string& shard : source.shards) {
      const int s = static_cast<int>(o.shards.size());
      o.shards.push_back(shard);
      absl::StatusOr<ShardIndex> index = IndexShard(shard, o.preprocess.shard);
      if (!index.ok()) return index.status();
      if (!index->error.empty()) {
        LOOM_LOG(WARNING).With("shard", shard).With("error", index->error)
            << "shard is damaged; samples after the damage are lost";
      }
      for (const BrokenSample& b : index->broken) loader->CountSkip({b.key, b.reason, b.detail});
      for (const SampleRef& ref : index->samples) into.refs.push_back({s, ref});
    }
    if (into.refs.empty()) {
      return absl::FailedPreconditionError(
          sources.size() == 1 ? std::string("the shards hold no readable sample")
                              : absl::StrCat("source ", source.spec, ": no readable sample"));
    }
    loader->total_ += static_cast<int64_t>(into.refs.size());
  }
  loader->sources_.back().cumulative = 1.0;
  {
    absl::MutexLock lock(&loader->mu_);
    loader->delivered_.assign(loader->sources_.size(), 0);
    loader->claimed_.assign(loader->sources_.size(), 0);
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

int DataLoader::SourceAt(int64_t global) const {
  if (sources_.size() == 1) return 0;
  const double u = static_cast<double>(MixSeed(options_.seed, global, 0x6d17) >> 11) *
                   (1.0 / 9007199254740992.0);
  for (size_t s = 0; s + 1 < sources_.size(); ++s) {
    if (u < sources_[s].cumulative) return static_cast<int>(s);
  }
  return static_cast<int>(sources_.size()) - 1;
}

const DataLoader::Ref& DataLoader::RefAt(int source, int64_t drawn) {
  const std::vector<Ref>& refs = sources_[source].refs;
  const int64_t n = static_cast<int64_t>(refs.size());
  const int64_t epoch = drawn / n, pos = drawn % n;
  if (!options_.shuffle) return refs[pos];
  auto it = permutations_.find({source, epoch});
  if (it == permutations_.end()) {
    // Keep the permutations of the epochs in flight only.
    for (auto p = permutations_.begin(); p != permutations_.end();) {
      const int64_t in_flight =
          delivered_[p->first.first] / static_cast<int64_t>(sources_[p->first.first].refs.size());
      p = p->first.second < in_flight ? permutations_.erase(p) : std::next(p);
    }
    std::vector<int64_t> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    // Source 0's stream is the one a loader of one source always had.
    Rng rng(MixSeed(options_.seed, epoch, 0x5a3f + 0x100 * static_cast<uint64_t>(source)));
    for (int64_t i = n - 1; i > 0; --i) std::swap(perm[i], perm[rng.UniformInt(0, i)]);
    it = permutations_.emplace(std::make_pair(source, epoch), std::move(perm)).first;
  }
  return refs[it->second[pos]];
}

void DataLoader::Worker() {
  for (;;) {
    int64_t global;
    uint64_t generation;
    Ref ref;
    {
      absl::MutexLock lock(&mu_);
      const int64_t end = options_.epochs > 0 ? options_.epochs * total_ : INT64_MAX;
      while (!stop_ && (claim_ >= deliver_ + options_.prefetch || claim_ >= end)) cv_.Wait(&mu_);
      if (stop_) return;
      global = claim_++;
      generation = generation_;
      const int source = SourceAt(global);
      ref = RefAt(source, claimed_[source]++);
      while (static_cast<int64_t>(window_.size()) <= global - deliver_) window_.emplace_back();
    }
    Outcome outcome;
    absl::StatusOr<SampleFiles> files =
        ReadSample(options_.shards[ref.shard], ref.sample, options_.preprocess.shard);
    if (files.ok()) {
      outcome = preprocessor_.Process(*files, options_.decode_pixels);
      // The draw is the sample's identity for the generator's draws
      // (DrawGeneration): the same on every layout, another in each epoch.
      outcome.sample.sample.id = static_cast<uint64_t>(global);
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
  const int64_t n = total_;
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
      ++delivered_[SourceAt(deliver_)];
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
  data::v1::DataCursor c;
  c.set_seed(options_.seed);
  c.set_epoch(deliver_ / total_);
  c.set_position(deliver_ % total_);
  c.set_dataset_samples(total_);
  if (sources_.size() > 1) {
    for (size_t s = 0; s < sources_.size(); ++s) {
      data::v1::SourceCursor* sc = c.add_sources();
      sc->set_samples(static_cast<int64_t>(sources_[s].refs.size()));
      sc->set_drawn(delivered_[s]);
    }
  }
  return c;
}

absl::Status DataLoader::Restore(const data::v1::DataCursor& cursor) {
  const int64_t n = total_;
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
  const int64_t global = cursor.epoch() * n + cursor.position();
  std::vector<int64_t> drawn(sources_.size(), 0);
  if (sources_.size() == 1) {
    if (cursor.sources_size() > 0) {
      return absl::InvalidArgumentError(absl::StrCat("cursor.sources: a mixture of ",
                                                     cursor.sources_size(),
                                                     " sources; the loader reads one"));
    }
    drawn[0] = global;
  } else {
    if (cursor.sources_size() != static_cast<int>(sources_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("cursor.sources: ", cursor.sources_size(),
                                                     " sources; the loader mixes ", sources_.size(),
                                                     ": not the same data"));
    }
    int64_t sum = 0;
    for (size_t s = 0; s < sources_.size(); ++s) {
      const data::v1::SourceCursor& sc = cursor.sources(static_cast<int>(s));
      if (sc.samples() != static_cast<int64_t>(sources_[s].refs.size()) || sc.drawn() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("cursor.sources[", s, "]: ", sc.samples(), " samples, ", sc.drawn(),
                         " drawn; the loader's source ", s, " holds ", sources_[s].refs.size(),
                         ": not the same data"));
      }
      drawn[s] = sc.drawn();
      sum += sc.drawn();
    }
    if (sum != global) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cursor.sources: ", sum, " draws in all, but the cursor is at draw ", global));
    }
  }
  absl::MutexLock lock(&mu_);
  ++generation_;
  deliver_ = claim_ = global;
  delivered_ = claimed_ = drawn;
  window_.clear();
  cv_.SignalAll();
  return absl::OkStatus();
}

int64_t DataLoader::kept() const {
  absl::MutexLock lock(&mu_);
  return kept_;
}

std::vector<int64_t> DataLoader::drawn() const {
  absl::MutexLock lock(&mu_);
  return delivered_;
}

std::map<std::string, int64_t> DataLoader::skipped() const {
  absl::MutexLock lock(&mu_);
  return skipped_;
}

}  // namespace loom::data
