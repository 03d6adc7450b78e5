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

struct LoaderOptions {
  std::vector<std::string> shards;  // tar paths, read in this order when not shuffled
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

  int64_t dataset_samples() const { return static_cast<int64_t>(refs_.size()); }
  int64_t kept() const;
  std::map<std::string, int64_t> skipped() const;  // reason -> count

 private:
  struct Ref {
    int shard;
    SampleRef sample;
  };
  struct Slot {
    bool done = false;
    Outcome outcome;
  };

  DataLoader(LoaderOptions options, const Tokenizer* tokenizer);
  void Worker();
  int64_t SampleAt(int64_t global) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountSkip(const SkippedSample& skip);

  LoaderOptions options_;
  Preprocessor preprocessor_;
  std::vector<Ref> refs_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  int64_t deliver_ ABSL_GUARDED_BY(mu_) = 0;  // global position: epoch * N + index
  int64_t claim_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Slot> window_ ABSL_GUARDED_BY(mu_);  // window_[g - deliver_]
  std::map<int64_t, std::vector<int64_t>> permutations_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t kept_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> skipped_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace loom::data

#endif  // LOOM_RUNTIME_DATA_LOADER_H_
