// NCCL communicators behind runtime/comm's Communicator, for ranks whose
// tensors live on a CUDA device (Gloo stays the CPU path).
//
// Ranks find each other through a KeyValueStore, as Gloo's do (in services,
// loom-scheduler's rendezvous keys over mutual TLS): rank 0 draws the
// ncclUniqueId and sets it under "<prefix>/nccl-id"; the others read it;
// rank 0 deletes it once the communicator is up (which needs every rank, so
// every rank has read it by then).
//
// No call waits without a bound: the communicator is created non-blocking
// and every wait (its initialisation, each collective on its stream) polls
// with the options' timeout (or wait_limit) and the Cancellation; on a
// timeout, a cancel (also one set before the call: nothing is queued) or an
// asynchronous NCCL error the communicator is aborted (ncclCommAbort: what it waits on may never
// come, a peer being gone), the call fails and the communicator is unusable, as Communicator says.
//
// Buffers are device memory on `options.device`. Collectives run on the
// communicator's own stream, ordered after the work already queued on the
// device's legacy default stream, and return once done.
//
// Built without --config=cuda: ConnectNccl is UNIMPLEMENTED; ShareNcclId
// (the rendezvous) is the same code.
#ifndef LOOM_RUNTIME_BACKENDS_CUDA_NCCL_COMMUNICATOR_H_
#define LOOM_RUNTIME_BACKENDS_CUDA_NCCL_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/comm/collective.h"

namespace loom {

struct NcclOptions {
  std::string prefix;  // names this group in the store, e.g. "g0-llm-dp-tp0-pp0"
  int rank = 0;
  int size = 1;
  int device = 0;                               // the CUDA device of this rank's buffers
  absl::Duration timeout = absl::Seconds(120);  // rendezvous and each collective
  // Optional, outlives the communicator: ends the rendezvous and any
  // collective in flight with CANCELLED (and aborts the communicator).
  Cancellation* cancel = nullptr;
  // Optional: each collective's wait limit, asked at every call; `timeout`
  // otherwise.
  std::function<absl::Duration()> wait_limit;
};

// The bytes of an ncclUniqueId.
inline constexpr size_t kNcclIdBytes = 128;

// The rendezvous: rank 0 sets `make_id()` (kNcclIdBytes bytes) under
// "<prefix>/nccl-id"; every other rank reads it. INVALID_ARGUMENT for bad
// options or a value read of another size (INTERNAL if `make_id` made one);
// DEADLINE_EXCEEDED when rank 0 never sets it within the timeout; CANCELLED.
absl::StatusOr<std::string> ShareNcclId(KeyValueStore* store, const NcclOptions& options,
                                        const std::function<std::string()>& make_id);

class NcclCommunicator : public Communicator {
 public:
  // Sends or receives `bytes` bytes to or from `peer` of this communicator
  // (pipeline stages, encoder <-> LLM); the other side makes the matching
  // call. Same failure rules as the collectives.
  virtual absl::Status Send(const void* data, size_t bytes, int peer) = 0;
  virtual absl::Status Recv(void* data, size_t bytes, int peer) = 0;
  // A send that does not wait: queued on the communicator's stream after
  // the device's earlier work, it is done once `peer` has received it.
  // `data` must keep its bytes until SendsDone() returns. A pipeline's
  // stages send this way, so that a send never waits for its receiver while
  // the receiver waits for this rank. Every operation of a communicator
  // runs on its one stream, in order: a receive on it waits behind the
  // sends queued before, so a rank that sends and receives at once uses a
  // communicator for each direction.
  virtual absl::Status SendAsync(const void* data, size_t bytes, int peer) = 0;
  // Waits until every send queued is done (the collectives' wait limit and
  // failure rules).
  virtual absl::Status SendsDone() = 0;
  // In place over bf16 values (uint16_t bit patterns), summed by NCCL in
  // bf16 (mixed-precision gradients reduce in fp32 through AllreduceSum).
  virtual absl::Status AllreduceSumBf16(uint16_t* data, int64_t n) = 0;
};

// Connects `options.size` ranks (one per call, each on its own device, as
// NCCL requires) through `store`. UNIMPLEMENTED without CUDA;
// FAILED_PRECONDITION when the device is not there.
absl::StatusOr<std::unique_ptr<NcclCommunicator>> ConnectNccl(KeyValueStore* store,
                                                              const NcclOptions& options);

}  // namespace loom

#endif  // LOOM_RUNTIME_BACKENDS_CUDA_NCCL_COMMUNICATOR_H_
