// A training worker's part of a checkpoint (training_worker.h): its share of
// its module copied in the training thread, then written and reported in the
// background while training goes on.
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/file.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/steps.h"
#include "services/worker/training_worker_impl.h"

namespace loom {

absl::Status TrainingWorker::Impl::Checkpoint(int64_t step) {
  // Every rank holding a module writes a share of it, with no gather: the
  // rank at (dp, tp) of a pipeline stage writes DP chunk dp of its own set
  // (its TP slices of the split tensors, 1 / TP of the replicated ones; of a
  // set held whole, part dp × TP + tp of DP × TP), so the stage's DP × TP
  // parts cover its master tensors once, and the first
  // stage's rank (0, 0) writes the manifest naming every stage's parts
  // (runtime/checkpoint: the layout-independent format, so a job resumes
  // under other degrees); the scheduler adds what each part holds when the
  // step completes. The scheduler emptied the step's partial folder when it
  // marked the step and renames it into place once every rank has
  // reported. A part is a snapshot, a copy of this rank's share alone (about
  // 1 / (DP × TP) of its stage), written in the background while training
  // goes on, one checkpoint at a time. Under a sharded optimizer (ZeRO-1)
  // the DP chunk is the one whose moments the rank holds.
  stall->Work("checkpoint");  // its own limit: a write may take far longer than a step
  if (absl::Status s = AwaitCheckpointWrite(); !s.ok()) return s;
  struct Share {
    std::string module, file;
    CheckpointPart part;
    std::vector<std::string> manifest;  // the module's parts, when this rank writes it
  };
  std::vector<Share> shares;
  const parallel::GridShape& g = grid();
  const int per_stage = g.dp * g.tp, index = pos.dp * g.tp + pos.tp;
  for (size_t i = 0; i < sets.size(); ++i) {
    sets[i]->PullState();  // from the device, where the optimizer steps there
    const bool staged = modules[i] != Module::kProjector;  // the projector: last stage only
    const int stages = staged ? g.pp : 1, stage = staged ? pos.pp : 0;
    // A set held whole on every TP rank (TP 1, or the projector) is cut into
    // the stage's DP x TP parts, which nest in the DP chunks.
    const bool sliced = sets[i]->shard().size > 1;
    const auto [begin, end] = sliced ? PartRange(sets[i]->size(), pos.dp, g.dp)
                                     : PartRange(sets[i]->size(), index, per_stage);
    Share share;
    share.module = set_names[i];
    share.file = ModulePartName(share.module, stage * per_stage + index);
    share.part = CheckpointPart::Snapshot(*sets[i], begin, end);
    if (stage == 0 && index == 0) {
      for (int k = 0; k < stages * per_stage; ++k) {
        share.manifest.push_back(ModulePartName(share.module, k));
      }
    }
    shares.push_back(std::move(share));
  }
  stall->Work("step");
  checkpoint_writer = std::thread([this, step, shares = std::move(shares)]() mutable {
    const std::string dir = PartialStepDir(job.checkpoint().dir(), step);
    absl::Status s = MakeDirectories(dir);
    for (size_t k = 0; s.ok() && k < shares.size(); ++k) {
      const Share& share = shares[k];
      s = share.part.Write(share.module, absl::StrCat(dir, "/", share.file));
      if (s.ok() && !share.manifest.empty()) {
        s = WriteModuleManifest(dir, share.module, share.part.step(), share.manifest);
      }
      InjectFault("checkpoint", step - 1);  // a part written, the rest not
    }
    if (s.ok()) s = scheduler->ReportCheckpoint(options.role, options.rank, step);
    checkpoint_write_status = s;  // read after the join
  });
  return absl::OkStatus();
}

absl::Status TrainingWorker::Impl::AwaitCheckpointWrite() {
  if (!checkpoint_writer.joinable()) return absl::OkStatus();
  checkpoint_writer.join();
  absl::Status s = checkpoint_write_status;
  checkpoint_write_status = absl::OkStatus();
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("checkpoint: ", s.message()));
  return s;
}

}  // namespace loom
