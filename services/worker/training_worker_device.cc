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

using worker::Transfer;
using worker::TransferKind;
using worker::TransferName;

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
    auto nccl = [&](const std::string& prefix, int rank,
                    int size) -> absl::StatusOr<std::unique_ptr<NcclCommunicator>> {
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
      return c;
    };
    auto connect_nccl = [&](const std::string& prefix, int rank,
                            int size) -> absl::StatusOr<std::unique_ptr<Communicator>> {
      absl::StatusOr<std::unique_ptr<NcclCommunicator>> c = nccl(prefix, rank, size);
      if (!c.ok()) return c.status();
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
    if (absl::Status s = ConnectDeviceTransfers(module_name, nccl); !s.ok()) return s;
  } else if (tp_comm != nullptr && !on_host()) {
    staged_tp = std::make_unique<HostStagedCommunicator>(tp_comm.get(), ops->backend());
    layers_tp = staged_tp.get();
  }
  return layers_tp;
}

absl::Status TrainingWorker::Impl::ConnectDeviceTransfers(const std::string& module_name,
                                                          const NcclConnect& nccl) {
  const parallel::GridShape& shape = grid();
  const int act = static_cast<int>(Transfer::kActivations);
  const int act_grad = static_cast<int>(Transfer::kActivationGrads);
  // The pipeline's links in stage order, (s-1, s) before (s, s+1), on every
  // rank alike: each initialisation waits only for ranks that have done
  // theirs before it. (The generator's stages pass their rows over UCX.)
  for (int link = pos.pp - 1; !generator && link <= pos.pp; ++link) {
    if (link < 0 || link + 1 >= shape.pp) continue;
    const bool earlier = link == pos.pp;  // this rank is the link's rank 0
    const std::string where = absl::StrCat("-tp", pos.tp, "-dp", pos.dp, "-link", link);
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> a =
        nccl(absl::StrCat(module_name, "-nccl-activations", where), earlier ? 0 : 1, 2);
    if (!a.ok()) return a.status();
    (earlier ? nccl_send[act] : nccl_recv[act]) = *std::move(a);
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> g =
        nccl(absl::StrCat(module_name, "-nccl-activation-grads", where), earlier ? 0 : 1, 2);
    if (!g.ok()) return g.status();
    (earlier ? nccl_recv[act_grad] : nccl_send[act_grad]) = *std::move(g);
  }
  // The bridge, where both modules are on GPUs of their own: the encoder's
  // last stage and the LLM's first. Colocated, encoder rank k shares LLM
  // rank k's GPU, and a NCCL group takes one rank per GPU: host memory then.
  if (!generator && (encoder ? last_stage() : first_stage()) && encoder_grid.size() > 0 &&
      llm_grid.size() > 0 && JobModuleOnGpu(job, !encoder) && !job.parallel().colocate()) {
    if (absl::Status s = ConnectBridge(nccl); !s.ok()) return s;
  }
  std::string sends, receives;
  for (int k = 0; k < worker::kTransferKinds; ++k) {
    const char* name = TransferName(static_cast<Transfer>(k));
    if (nccl_send[k] != nullptr) absl::StrAppend(&sends, sends.empty() ? "" : ", ", name);
    if (nccl_recv[k] != nullptr) absl::StrAppend(&receives, receives.empty() ? "" : ", ", name);
  }
  if (!sends.empty() || !receives.empty()) {
    LOOM_LOG(INFO).With("sends", sends).With("receives", receives)
        << "tensors between GPUs over NCCL";
  }
  return absl::OkStatus();
}

absl::Status TrainingWorker::Impl::ConnectBridge(const NcclConnect& nccl) {
  const int size = BridgeIndex(false, llm_grid.dp - 1, llm_grid.tp - 1) + 1;
  const int me = BridgeIndex(encoder, pos.dp, pos.tp);
  const std::string prefix = absl::StrCat("g", scheduler->generation(), "-nccl-");
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> e = nccl(prefix + "embeddings", me, size);
  if (!e.ok()) return e.status();
  (encoder ? nccl_send : nccl_recv)[static_cast<int>(Transfer::kEmbeddings)] = *std::move(e);
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> g = nccl(prefix + "embedding-grads", me, size);
  if (!g.ok()) return g.status();
  (encoder ? nccl_recv : nccl_send)[static_cast<int>(Transfer::kEmbeddingGrads)] = *std::move(g);
  return absl::OkStatus();
}

absl::Status TrainingWorker::Impl::SendOnDevice(Transfer what, int peer, const Buffer<float>& src,
                                                size_t n, int64_t iteration, int bin) {
  const double s0 = trace::NowMicros();
  // A copy on the device's stream: `src` is a staging slot or a module's
  // output, which the next microbatch overwrites before the peer receives.
  Buffer<float>& bytes = nccl_sending.emplace_back(ops->backend());
  bytes.resize(n);
  ops->backend()->Copy(bytes.data(), src.data(), n * sizeof(float));
  absl::Status s = nccl_send[static_cast<int>(TransferKind(what))]->SendAsync(
      bytes.data(), n * sizeof(float), peer);
  Span("send", s0, iteration, "send ", TransferName(what), " bin ", bin, " over NCCL to ", peer);
  return s;
}

absl::Status TrainingWorker::Impl::FinishDeviceSends() {
  for (std::unique_ptr<NcclCommunicator>& c : nccl_send) {
    if (c == nullptr) continue;
    StallWatch::Waiting waiting(stall.get());
    if (absl::Status s = c->SendsDone(); !s.ok()) return s;  // the bytes go with the groups
  }
  nccl_sending.clear();
  return absl::OkStatus();
}

void TrainingWorker::Impl::DropModels() {
  vit.reset();
  projector.reset();
  llm.reset();
  gen.reset();
  sets.clear();
  modules.clear();
  set_tp.clear();
  set_names.clear();
  staged_tp.reset();
  nccl_tp.reset();
  nccl_dp.reset();
  for (int k = 0; k < worker::kTransferKinds; ++k) {
    nccl_send[k].reset();
    nccl_recv[k].reset();
  }
  nccl_sending.clear();  // after the groups: nothing queued reads them now
}

void TrainingWorker::Impl::ReleaseDevice() {
  DropModels();
  for (Buffer<float>& b : staged) b.set_backend(nullptr);
  device_ops.reset();
  ops = nullptr;
}

}  // namespace loom
