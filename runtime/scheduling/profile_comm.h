// The profile's communication (issue 43 item 1): what the workers move
// between processes, measured on this host and fitted, so that a job run
// here (loom up --profile auto, loom-schedule validate) is priced by its
// own links:
//   - all-reduces of each module's gradient size over 2 and 4 ranks (the
//     ranks as threads, Gloo's ring over TCP on 127.0.0.1: the workers'
//     gradient reduction under host collectives), fitted to a ring's
//     latency and bytes (scheduler.proto Profile);
//   - transfers between two UCX workers of this process (the transport of
//     stage-to-stage activations and the encoder's embeddings), fitted to a
//     latency and a per-byte time.
// ApplyProfileCommunication prices a plan's all-reduces and its
// embeddings' transfer by them. A profile measures one host: a cluster's
// links between nodes are the plan search's ClusterSpec's, not these.
#ifndef LOOM_RUNTIME_SCHEDULING_PROFILE_COMM_H_
#define LOOM_RUNTIME_SCHEDULING_PROFILE_COMM_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "loom/scheduler/v1/scheduler.pb.h"
#include "runtime/model/config.h"

namespace loom::sched {

struct CommProfileOptions {
  std::vector<int> allreduce_ranks = {2, 4};
  int repeats = 3;
  // The transfers' sizes (bytes); empty: an image token's embedding times
  // 64 and 1024, and one LLM row times 256 and 4096.
  std::vector<int64_t> transfer_bytes;
};

// Measures and fits into `profile` (its comm points, the fits and the
// module byte counts of `model`). Errors from Gloo's rendezvous or UCX.
absl::Status ProfileCommunication(const ModelConfig& model, const CommProfileOptions& options,
                                  scheduler::v1::Profile* profile);

// `plan`'s all-reduce seconds (each module's gradient over its DP ranks:
// the layers' 1/(tp x pp) a rank, the projector's whole; a frozen set's
// none; the generator's left as planned) and transfer_per_image_token (a
// bin's embeddings to each of the LLM's TP ranks; the per-transfer latency
// left out) from `profile`'s fits. A profile without communication leaves
// the plan as it is (returns false). For a job whose processes reduce and
// send through host memory (Gloo, UCX): not NCCL's.
bool ApplyProfileCommunication(const scheduler::v1::Profile& profile, const Frozen& frozen,
                               scheduler::v1::Plan* plan);

}  // namespace loom::sched

#endif  // LOOM_RUNTIME_SCHEDULING_PROFILE_COMM_H_
