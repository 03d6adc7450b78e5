// A training worker's part of a checkpoint (training_worker.h): its module
// gathered into a copy in the training thread, then written and reported in
// the background while training goes on.
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
  // DP replicas hold the same weights: replica 0 gathers each module's
  // master tensors (over each stage's TP group, then over the stages into
  // the whole module) and its first rank holding the module writes them (the
  // layout-independent checkpoint) into the step's partial folder, which the
  // scheduler emptied when it marked the step and renames into place once
  // every part is written. The gathered tensors are copies: they are written
  // in the background while training goes on, one checkpoint at a time.
  stall->Work("checkpoint");  // its own limit: a write may take far longer than a step
  if (absl::Status s = AwaitCheckpointWrite(); !s.ok()) return s;
  std::vector<std::pair<std::string, ParamSet>> parts;  // (module name, the whole module)
  if (pos.dp == 0) {
    for (size_t i = 0; i < sets.size(); ++i) {
      ParamSet stage;
      if (absl::Status s = GatherMaster(*sets[i], set_tp[i], &stage); !s.ok()) return s;
      if (pos.tp != 0) continue;
      const bool staged = modules[i] != Module::kProjector;  // the projector: last stage only
      ParamSet whole;
      if (staged && pp_comm != nullptr) {
        whole = ModuleMaster(modules[i]);
        if (absl::Status s = GatherInto(stage, pp_comm.get(), &whole); !s.ok()) return s;
      } else {
        whole = std::move(stage);
      }
      if (staged && !first_stage()) continue;
      parts.emplace_back(kModuleNames[static_cast<int>(modules[i])], std::move(whole));
    }
  }
  stall->Work("step");
  checkpoint_writer = std::thread([this, step, parts = std::move(parts)]() mutable {
    const std::string dir = PartialStepDir(job.checkpoint().dir(), step);
    absl::Status s;
    for (auto& [name, whole] : parts) {
      if (s = MakeDirectories(dir); !s.ok()) break;
      if (s = SaveModuleCheckpoint(whole, name, absl::StrCat(dir, "/", name, ".ckpt")); !s.ok()) {
        break;
      }
      InjectFault("checkpoint", step - 1);  // a part written, the rest not
    }
    if (s.ok()) {
      InjectFault("checkpoint", step - 1);  // ranks writing nothing
      s = scheduler->ReportCheckpoint(options.role, options.rank, step);
    }
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
