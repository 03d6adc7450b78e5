// The data loader: shards in, preprocessed samples out, in a deterministic
// order, with a cursor that checkpoints exactly.
//
// Open() indexes every shard (member headers only). The order of an epoch is
// a permutation of all indexed samples drawn from (seed, epoch), so it does
// not depend on thread count or timing. `threads` workers read and
// preprocess up to `prefetch` samples ahead of the consumer (bounded
// memory); Next() hands them out in permutation order, skipping (and
// counting, and logging) samples that fail preprocessing.
//
// Cursor() is the position of the next sample Next() will consider;
// Restore(cursor) continues from exactly there: a restart neither loses nor
// repeats a sample.
//
// A mixture: several sources (each a set of shards with a sampling weight).
// Draw g comes from source s with probability weight_s / sum of weights, a
// pure function of (seed, g); within a source, samples follow that source's
// own epoch permutations. An epoch of the mixture is as many draws as all
// sources hold together. The cursor keeps every source's count of draws, so
// a restore is exact under a mixture too (and may even change the weights).
//
// Thread-safety: Next(), Cursor(), Restore() and the counters may be called
// from any thread, but Next() is meant for one consumer.
#ifndef LOOM_RUNTIME_DATA_LOADER_H_
#define LOOM_RUNTIME_DATA_LOADER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "loom/data/v1/sample.pb.h"
#include "runtime/data/preprocess.h"
#include "runtime/data/shard.h"

namespace loom::data {

// One dataset of a mixture.
struct DataSource {
  std::vector<std::string> shards;  // tar paths
  double weight = 1;                // > 0; relative to the others
  std::string spec;                 // the glob it came from (for messages)
};

struct LoaderOptions {
  std::vector<std::string> shards;  // tar paths, read in this order when not shuffled
  // A mixture in place of `shards` (which must then be empty); one source
  // behaves exactly as `shards` with that source's paths.
  std::vector<DataSource> sources;
  uint64_t seed = 1;
  bool shuffle = true;
  int epochs = 0;  // 0: forever; else Next() returns OUT_OF_RANGE after this many
  int threads = 2;
  int prefetch = 64;
  bool decode_pixels = true;
  PreprocessOptions preprocess;
  // Called for every skipped sample (from Open() for damage found while
  // indexing, from Next() for the rest), on the calling thread.
  std::function<void(const SkippedSample&)> on_skip;
};

// Expands a glob ("data/*.tar") into sorted paths; NOT_FOUND if none match.
absl::StatusOr<std::vector<std::string>> ExpandShardGlob(const std::string& pattern);

// The shards flag of loom-preprocess and loom-train-local: one glob, or a
// mixture "GLOB=WEIGHT,GLOB=WEIGHT,..." (a glob without "=WEIGHT" weighs 1).
// Each glob is expanded; INVALID_ARGUMENT for an empty part or a weight
// that is not a finite number > 0, NOT_FOUND for a glob matching nothing.
absl::StatusOr<std::vector<DataSource>> ParseShardSources(const std::string& spec);

// A run given in epochs: floor(epochs x dataset_samples / global_batch)
// steps (a last batch the data cannot fill is dropped, as drop_last does).
// INVALID_ARGUMENT when epochs is not a finite number > 0 or gives no step or
// more than 2^31 - 1.
absl::StatusOr<int64_t> StepsForEpochs(double epochs, int64_t dataset_samples, int global_batch);

class DataLoader {
 public:
  // `tokenizer` is not owned and must outlive the loader. NOT_FOUND for a
  // missing shard; FAILED_PRECONDITION when the shards hold no sample.
  static absl::StatusOr<std::unique_ptr<DataLoader>> Open(LoaderOptions options,
                                                          const Tokenizer* tokenizer);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next kept sample. OUT_OF_RANGE after the last epoch (epochs > 0);
  // FAILED_PRECONDITION if an entire epoch's worth of samples in a row is
  // skipped (no usable data).
  absl::StatusOr<ProcessedSample> Next();

  data::v1::DataCursor Cursor() const;
  // INVALID_ARGUMENT if the cursor belongs to another seed or dataset size.
  absl::Status Restore(const data::v1::DataCursor& cursor);

  // Indexed samples of all sources together: the draws of one epoch.
  int64_t dataset_samples() const { return total_; }
  int num_sources() const { return static_cast<int>(sources_.size()); }
  int64_t source_samples(int s) const { return static_cast<int64_t>(sources_[s].refs.size()); }
  int64_t kept() const;
  std::map<std::string, int64_t> skipped() const;  // reason -> count
  // Samples delivered from each source (kept or skipped), in source order.
  std::vector<int64_t> drawn() const;

 private:
  struct Ref {
    int shard;  // into options_.shards
    SampleRef sample;
  };
  struct Source {
    std::vector<Ref> refs;
    double cumulative = 0;  // sum of the weights up to and including this one, normalised
  };
  struct Slot {
    bool done = false;
    Outcome outcome;
  };

  DataLoader(LoaderOptions options, const Tokenizer* tokenizer);
  void Worker();
  int SourceAt(int64_t global) const;
  const Ref& RefAt(int source, int64_t drawn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountSkip(const SkippedSample& skip);

  LoaderOptions options_;  // options_.shards: every source's paths
  Preprocessor preprocessor_;
  std::vector<Source> sources_;
  int64_t total_ = 0;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  int64_t deliver_ ABSL_GUARDED_BY(mu_) = 0;  // global draw: epoch * total_ + position
  int64_t claim_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> delivered_ ABSL_GUARDED_BY(mu_);  // per source: draws delivered
  std::vector<int64_t> claimed_ ABSL_GUARDED_BY(mu_);    // per source: draws claimed
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Slot> window_ ABSL_GUARDED_BY(mu_);  // window_[g - deliver_]
  // (source, epoch of that source) -> its order.
  std::map<std::pair<int, int64_t>, std::vector<int64_t>> permutations_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t kept_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> skipped_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace loom::data

#endif  // LOOM_RUNTIME_DATA_LOADER_H_
