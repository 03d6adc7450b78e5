// Collectives inside one module's data-parallel group (the encoder's ranks,
// or the LLM's), and across the job's workers for a few scalars.
//
// A Communicator is passed explicitly to whatever reduces over it: Loom has
// two grids (encoder, LLM), never one implicit world. On CPU the
// implementation is Gloo over TCP (Debian libgloo-dev); the CUDA build adds
// NCCL (runtime/backends/cuda/nccl_communicator.h). Ranks find each other
// through a KeyValueStore (in services, loom-scheduler's SetKey/GetKey).
//
// Every rank of a communicator must call the same collectives in the same
// order. Results are bitwise identical on every rank (ring allreduce: each
// chunk is reduced once and then copied), so replicas stay in lockstep.
#ifndef LOOM_RUNTIME_COMM_COLLECTIVE_H_
#define LOOM_RUNTIME_COMM_COLLECTIVE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace loom {

// Ends blocking waits from another thread: a worker's collectives and
// rendezvous give up once the job's generation rises (a peer was lost: what
// they wait for may never come) or the worker stops. Cancel() runs every
// registered hook (a wait's way to wake up) and makes later waits fail at
// once until Clear(). Thread-safe.
class Cancellation {
 public:
  void Cancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    for (const auto& [id, hook] : hooks_) hook();
  }
  void Clear() {
    absl::MutexLock lock(&mu_);
    cancelled_ = false;
  }
  bool cancelled() const {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }

  // Registers `hook` for its lifetime; cancelled() tells a Cancel() that came
  // before the registration (the hook did not run for it).
  class Scope {
   public:
    Scope(Cancellation* c, std::function<void()> hook) : c_(c) {
      if (c_ == nullptr) return;
      absl::MutexLock lock(&c_->mu_);
      id_ = c_->next_id_++;
      c_->hooks_[id_] = std::move(hook);
    }
    ~Scope() {
      if (c_ == nullptr) return;
      absl::MutexLock lock(&c_->mu_);
      c_->hooks_.erase(id_);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    bool cancelled() const { return c_ != nullptr && c_->cancelled(); }

   private:
    Cancellation* c_;
    int64_t id_ = 0;
  };

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, std::function<void()>> hooks_ ABSL_GUARDED_BY(mu_);
};

// The rendezvous store: each key is set once; Get waits until it exists.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // DEADLINE_EXCEEDED if `key` is not set within `timeout`.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
  // Drops `keys` (absent ones are ignored).
  virtual absl::Status Delete(const std::vector<std::string>& keys) = 0;

  // Several reads at once, each of a whole value or (parts > 1) of its
  // part-th of `parts` equal parts; waits up to `timeout` for them all and
  // returns what was found by then (found false for the rest).
  // FAILED_PRECONDITION if a value found does not cut into its parts. By
  // default one Get after another; a store over the network does it in one
  // call.
  struct Read {
    std::string key;
    int part = 0;
    int parts = 1;
  };
  struct Value {
    bool found = false;
    std::string value;  // the part read
    size_t size = 0;    // the whole value's
  };
  virtual absl::StatusOr<std::vector<Value>> GetMany(const std::vector<Read>& reads,
                                                     absl::Duration timeout);
};

// The part `r` asks for of `whole` (the whole value without parts);
// FAILED_PRECONDITION when it does not cut evenly.
absl::StatusOr<std::string> PartOf(const KeyValueStore::Read& r, const std::string& whole);

// A store inside one process (tests; threads as ranks). Thread-safe.
class InMemoryStore final : public KeyValueStore {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::Status Delete(const std::vector<std::string>& keys) override;
  size_t size();

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

// The chunk of `n` elements rank `rank` of `size` owns in a reduce-scatter
// and gives in an all-gather: [n·rank/size, n·(rank+1)/size). Chunks differ
// in length by at most one; some are empty when n < size.
inline std::pair<int64_t, int64_t> ChunkRange(int64_t n, int rank, int size) {
  return {n * rank / size, n * (rank + 1) / size};
}

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: data[i] = Σ over ranks of data[i]. An error (a peer gone, the
  // timeout, a Cancellation: CANCELLED) leaves `data` unspecified and the
  // communicator unusable.
  virtual absl::Status AllreduceSum(float* data, int64_t n) = 0;
  virtual absl::Status AllreduceSum(double* data, int64_t n) = 0;
  // In place: data[i] = max over ranks of data[i] (vocab-parallel softmax).
  virtual absl::Status AllreduceMax(float* data, int64_t n) = 0;
  // In place, a distributed optimizer's two halves (ZeRO-1). ReduceScatterSum:
  // this rank's ChunkRange(n, rank, size) of `data` holds the sum over ranks
  // (under Gloo the same bits AllreduceSum gives it there); the rest of
  // `data` is left unspecified. AllGather: every rank's chunk of its `data`
  // is copied into every other rank's `data`. By default both go through
  // AllreduceSum (an all-gather as the sum of zeros and one chunk, exact; on
  // host memory); Gloo and NCCL move each chunk once instead.
  virtual absl::Status ReduceScatterSum(float* data, int64_t n) { return AllreduceSum(data, n); }
  virtual absl::Status AllGather(float* data, int64_t n);
};

struct GlooOptions {
  std::string prefix;  // names this group in the store, e.g. "g0-llm-dp-tp0-pp0"
  int rank = 0;
  int size = 1;
  std::string host;  // address peers reach this rank on; "": this machine's hostname
  absl::Duration timeout = absl::Seconds(120);  // rendezvous and each collective
  // Optional, outlives the communicator: ends the rendezvous and any
  // collective in flight with CANCELLED.
  Cancellation* cancel = nullptr;
  // Optional: each collective's wait limit, asked at every call (a worker
  // derives it from its iteration times); `timeout` otherwise.
  std::function<absl::Duration()> wait_limit;
};

// Connects `size` ranks in a full mesh over TCP. `store` is only used
// during the call: once every rank is connected (a barrier over the new
// group), each deletes the keys it set, so the store keeps nothing of a
// finished rendezvous. The allreduce is a ring (reduce-scatter, then allgather)
// over Gloo's unbound buffers, so that a Cancellation can end its waits.
// The first call makes the process ignore SIGPIPE unless it has a handler
// (a write to a peer that has gone must fail, not kill the process).
absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(KeyValueStore* store,
                                                          const GlooOptions& options);

// Runs `fn(rank, communicator)` on `size` threads of this process, each a
// rank of Gloo group `prefix` in `store` on 127.0.0.1 (`timeout`: the
// rendezvous and each collective), and waits for them: the profile's
// groups, and tests'. The first error of a connect or of an `fn`.
absl::Status OnGlooThreads(KeyValueStore* store, const std::string& prefix, int size,
                           absl::Duration timeout,
                           const std::function<absl::Status(int, Communicator*)>& fn);

}  // namespace loom

#endif  // LOOM_RUNTIME_COMM_COLLECTIVE_H_
