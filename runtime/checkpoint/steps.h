// Checkpoint step folders, shared by loom-train-local and the distributed
// job (workers write module files, loom-scheduler completes the step):
//
//   DIR/RUN                 the run this folder belongs to: written when a
//                           fresh run commits its first step (replacing an
//                           earlier run's), so a fresh start that never
//                           checkpoints orphans nothing
//   DIR/step-<N>.partial/   step N being written; invisible to a resume
//   DIR/step-<N>/           step N, complete: COMPLETE names its run and the
//                           job's checkpoint identity; it appears only whole,
//                           by one rename of the partial folder
//   DIR/step-<N>.replaced/  an older step N moved aside while a new one takes
//                           its place, on file systems without an atomic
//                           exchange (NFS, Lustre, CephFS, FUSE); removed
//                           once the new one is in place, or put back if
//                           a crash left no step N
//
// A resume takes a step of the run DIR/RUN names and refuses one written by
// another run or under another identity (model, seed, batch, data), so a
// fresh run in a reused folder never resumes an older run's step, and a crash
// mid-write never leaves a step that mixes files of two writes.
#ifndef LOOM_RUNTIME_CHECKPOINT_STEPS_H_
#define LOOM_RUNTIME_CHECKPOINT_STEPS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom {

// The data cursor a step holds (a loom.data.v1.DataCursor): where the data
// continues after the step. Written by loom-train-local and loom-scheduler,
// read by them and passed to loom-preprocess on resume.
inline constexpr char kDataCursorFile[] = "data_cursor.binpb";

// One run of a job in a checkpoint folder. `identity` is what must not change
// across a resume (JobCheckpointIdentity, or the trainer's flags); the degrees
// of parallelism may.
struct CheckpointRun {
  std::string id;        // random, fixed when the run starts
  std::string identity;  // one line
};

// DIR/step-<N>: a complete step (what readers load).
std::string StepDir(const std::string& dir, int64_t step);
// DIR/step-<N>.partial: where the step's files are written before it is
// complete.
std::string PartialStepDir(const std::string& dir, int64_t step);

// A fresh run: a new id (DIR is created). The folder becomes the run's at
// its first CommitCheckpointStep.
absl::StatusOr<CheckpointRun> StartCheckpointRun(const std::string& dir,
                                                 const std::string& identity);

// The run DIR/RUN names. NOT_FOUND if there is none (no RUN file); any
// other failure to read it keeps its own code (it is no proof that no run
// was started there).
absl::StatusOr<CheckpointRun> ReadCheckpointRun(const std::string& dir);

// Empties (or creates) the step's partial folder: whatever an interrupted
// earlier write left there is dropped. Call before any part is written.
absl::Status BeginCheckpointStep(const std::string& dir, int64_t step);

// Completes step N: COMPLETE (step, run, identity) into the partial folder,
// DIR/RUN set to `run` if it names another, then the partial folder and
// DIR/step-<N> are exchanged atomically (an existing step N, an older run's,
// is removed after). Where the file system refuses the exchange
// (renameat2's RENAME_EXCHANGE: EINVAL, ENOSYS, EOPNOTSUPP), the old step is
// renamed aside to DIR/step-<N>.replaced first: a crash between the two
// renames leaves no step N for a moment, and the next commit or resume in
// DIR puts the aside one back. FAILED_PRECONDITION if the partial folder
// does not exist.
absl::Status CommitCheckpointStep(const std::string& dir, int64_t step, const CheckpointRun& run);

// Tests: commits replace an existing step by renaming it aside, as on a file
// system without RENAME_EXCHANGE. Not thread-safe against running commits.
void ForceRenameAsideForTesting(bool force);

// The step a resume continues after: `want` if > 0, else the newest complete
// step of the run DIR/RUN names. Errors name the folder and the reason:
// NOT_FOUND when no run was started in DIR or no such step of its run
// exists (listing other runs' steps if any) - the one answer that lets a
// caller start afresh; FAILED_PRECONDITION when the step belongs to another
// run or was written under another identity than `identity`; the read
// error's own code when RUN or a step's COMPLETE cannot be read. Puts back
// a step a crash left renamed aside (DIR/step-<N>.replaced) first.
absl::StatusOr<int64_t> ResumableStep(const std::string& dir, const std::string& identity,
                                      int64_t want = 0);

}  // namespace loom

#endif  // LOOM_RUNTIME_CHECKPOINT_STEPS_H_
