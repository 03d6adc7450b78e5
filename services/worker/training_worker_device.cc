// A training worker's device (issue 20): its module's Ops on the job's
// device.encoder or device.llm, the communicators its device tensors are
// reduced over, and their end. See training_worker_impl.h.
#include "absl/strings/str_cat.h"
#include "runtime/backends/cuda/cuda_ops.h"
#include "runtime/backends/cuda/device.h"
#include "runtime/backends/cuda/nccl_communicator.h"
#include "runtime/base/log.h"
#include "runtime/comm/host_staged.h"
#include "services/common/job.h"
#include "services/worker/training_worker_impl.h"

namespace loom {

absl::Status TrainingWorker::Impl::OpenDevice() {
  if (ops != nullptr) return absl::OkStatus();  // opened at the first Join
  const std::string& device = JobDevice(job, encoder);
  // "cuda" is this rank's GPU on its machine (its local rank's).
  absl::StatusOr<int> index =
      ResolveDevice(device, options.local_rank, cuda::DeviceCount());  // checked with the job
  device_index = index.ok() ? *index : -1;
  const std::string opened = device_index < 0 ? "cpu" : absl::StrCat("cuda:", device_index);
  absl::StatusOr<Ops*> made = OpsForDevice(opened, &device_ops);
  if (!made.ok()) {
    // "cuda" says which GPU it stood for.
    const std::string which =
        device == opened ? ""
                         : absl::StrCat(" (", opened, ", local rank ", options.local_rank, ")");
    return absl::Status(made.status().code(),
                        absl::StrCat(encoder ? "device.encoder " : "device.llm ", device, which,
                                     ": ", made.status().message()));
  }
  ops = *made;
  LOOM_LOG(INFO)
          .With("device", opened)
          .With("job_device", device)
          .With("local_rank", options.local_rank)
      << "opened its device";
  for (Buffer<float>& b : staged) b.set_backend(ops->backend());
  return absl::OkStatus();
}

absl::StatusOr<Communicator*> TrainingWorker::Impl::DeviceGroups(KeyValueStore* store,
                                                                 const std::string& module_name) {
  const parallel::GridShape& shape = grid();
  // The layers' TP all-reduces run on their buffers: on a device, NCCL's
  // or through host memory; the gradients' DP all-reduce likewise.
  Communicator* layers_tp = tp_comm.get();
  if (!on_host() && job.device().collectives() == "nccl") {
    auto connect_nccl = [&](const std::string& prefix, int rank,
                            int size) -> absl::StatusOr<std::unique_ptr<Communicator>> {
      NcclOptions o;
      o.prefix = prefix;
      o.rank = rank;
      o.size = size;
      o.device = device_index;
      o.timeout = options.startup_timeout;
      o.cancel = &collectives;
      o.wait_limit = [this] { return stall->WaitLimit(); };
      absl::StatusOr<std::unique_ptr<NcclCommunicator>> c = ConnectNccl(store, o);
      if (!c.ok()) {
        return absl::Status(c.status().code(),
                            absl::StrCat("device.collectives nccl: ", c.status().message()));
      }
      return Watched(*std::move(c));
    };
    if (shape.tp > 1) {
      absl::StatusOr<std::unique_ptr<Communicator>> n = connect_nccl(
          absl::StrCat(module_name, "-nccl-tp-dp", pos.dp, "-pp", pos.pp), pos.tp, shape.tp);
      if (!n.ok()) return n.status();
      nccl_tp = *std::move(n);
      layers_tp = nccl_tp.get();
    }
    if (shape.dp > 1) {
      absl::StatusOr<std::unique_ptr<Communicator>> n = connect_nccl(
          absl::StrCat(module_name, "-nccl-dp-tp", pos.tp, "-pp", pos.pp), pos.dp, shape.dp);
      if (!n.ok()) return n.status();
      nccl_dp = *std::move(n);
    }
  } else if (tp_comm != nullptr && !on_host()) {
    staged_tp = std::make_unique<HostStagedCommunicator>(tp_comm.get(), ops->backend());
    layers_tp = staged_tp.get();
  }
  return layers_tp;
}

void TrainingWorker::Impl::DropModels() {
  vit.reset();
  projector.reset();
  llm.reset();
  sets.clear();
  modules.clear();
  set_tp.clear();
  staged_tp.reset();
  nccl_tp.reset();
  nccl_dp.reset();
}

void TrainingWorker::Impl::ReleaseDevice() {
  DropModels();
  for (Buffer<float>& b : staged) b.set_backend(nullptr);
  device_ops.reset();
  ops = nullptr;
}

}  // namespace loom
