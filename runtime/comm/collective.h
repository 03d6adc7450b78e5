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
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace loom {

// The rendezvous store: each key is set once; Get waits until it exists.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // DEADLINE_EXCEEDED if `key` is not set within `timeout`.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
};

// A store inside one process (tests; threads as ranks). Thread-safe.
class InMemoryStore final : public KeyValueStore {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: data[i] = Σ over ranks of data[i]. An error (a peer gone, the
  // timeout) leaves `data` unspecified and the communicator unusable.
  virtual absl::Status AllreduceSum(float* data, int64_t n) = 0;
  virtual absl::Status AllreduceSum(double* data, int64_t n) = 0;
  // In place: data[i] = max over ranks of data[i] (vocab-parallel softmax).
  virtual absl::Status AllreduceMax(float* data, int64_t n) = 0;
};

struct GlooOptions {
  std::string prefix;  // names this group in the store: "encoder", "llm", "job"
  int rank = 0;
  int size = 1;
  std::string host;  // address peers reach this rank on; "": this machine's hostname
  absl::Duration timeout = absl::Seconds(120);  // rendezvous and each collective
};

// Connects `size` ranks in a full mesh over TCP. `store` is only used
// during the call.
absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(KeyValueStore* store,
                                                          const GlooOptions& options);

}  // namespace loom

#endif  // LOOM_RUNTIME_COMM_COLLECTIVE_H_
