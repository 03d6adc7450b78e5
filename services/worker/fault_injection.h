// Fault injection for the recovery tests: a worker kills (or stops) itself
// at a chosen phase of a chosen iteration, once per run.
//
//   LOOM_FAULTS="llm_worker:1:allreduce:7,encoder_worker:0:transfer:3:stop"
//   LOOM_FAULTS_FIRED=DIR
//
// Each entry is ROLE:RANK:PHASE:ITERATION[:ACTION]: ROLE encoder_worker,
// llm_worker or generator_worker, RANK the worker's rank, PHASE one of kFaultPhases, ITERATION
// 0-based, ACTION kill (SIGKILL, the default), stop (SIGSTOP: the process
// hangs), hang (the training thread sleeps for good while the process
// answers its health checks) or nan (PHASE allreduce only: the worker's
// gradients turn NaN before they are summed, as a diverging batch's do).
// A kill, stop or hang entry fires once: DIR/<entry> is created first, so
// the restarted process runs past the same point. A nan entry fires every
// time its iteration runs (a replay diverges again, as real data would).
// Without LOOM_FAULTS nothing happens; a malformed entry, or no
// LOOM_FAULTS_FIRED for an entry that needs it, is logged and ignored.
#ifndef LOOM_SERVICES_WORKER_FAULT_INJECTION_H_
#define LOOM_SERVICES_WORKER_FAULT_INJECTION_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace loom {

// forward: the iteration's compute begins; transfer: embeddings (encoder),
// their gradients (LLM) or the query states' gradients (generator) are
// about to be sent; allreduce: the gradients are
// about to be summed over the DP replicas; checkpoint: the worker's part of
// a checkpoint is being written (after its first file).
inline constexpr const char* kFaultPhases[] = {"forward", "transfer", "allreduce", "checkpoint"};

// Fires the entry of LOOM_FAULTS matching (role, rank, phase, iteration),
// if any has not fired yet. `role` as RoleLabel() names it. True when a nan
// entry matches: the caller makes its gradients NaN.
bool MaybeInjectFault(absl::string_view role, int rank, absl::string_view phase, int64_t iteration);

}  // namespace loom

#endif  // LOOM_SERVICES_WORKER_FAULT_INJECTION_H_
