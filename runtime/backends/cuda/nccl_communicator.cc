#include "runtime/backends/cuda/nccl_communicator.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

#ifdef LOOM_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace loom {

absl::StatusOr<std::string> ShareNcclId(KeyValueStore* store, const NcclOptions& options,
                                        const std::function<std::string()>& make_id) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL group \"", options.prefix, "\": rank ",
                                                   options.rank, " is outside a group of ",
                                                   options.size));
  }
  const std::string key = options.prefix + "/nccl-id";
  if (options.rank == 0) {
    std::string id = make_id();
    if (id.size() != kNcclIdBytes) {
      return absl::InternalError(absl::StrCat("an ncclUniqueId of ", id.size(), " bytes"));
    }
    if (absl::Status s = store->Set(key, id); !s.ok()) return s;
    return id;
  }
  // In slices, so that a cancel is seen within 200 ms.
  const absl::Time until = absl::Now() + options.timeout;
  for (;;) {
    if (options.cancel != nullptr && options.cancel->cancelled()) {
      return absl::CancelledError(absl::StrCat("cancelled waiting for \"", key, "\""));
    }
    const absl::Duration slice =
        std::max(absl::ZeroDuration(), std::min(until - absl::Now(), absl::Milliseconds(200)));
    absl::StatusOr<std::string> v = store->Get(key, slice);
    if (v.ok()) {
      if (v->size() != kNcclIdBytes) {
        return absl::InvalidArgumentError(absl::StrCat("rendezvous key \"", key, "\": ", v->size(),
                                                       " bytes, not an ncclUniqueId (",
                                                       kNcclIdBytes, ")"));
      }
      return *std::move(v);
    }
    if (v.status().code() != absl::StatusCode::kDeadlineExceeded) return v.status();
    if (absl::Now() >= until) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rendezvous key \"", key, "\" not set within ", absl::FormatDuration(options.timeout)));
    }
  }
}

#ifdef LOOM_WITH_CUDA
namespace {

absl::Status NcclError(const std::string& what, ncclResult_t r, ncclComm_t comm) {
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  return absl::UnavailableError(
      absl::StrCat(what, ": ", ncclGetErrorString(r),
                   last != nullptr && *last ? absl::StrCat(" (", last, ")") : std::string()));
}

absl::Status CudaError(const std::string& what, cudaError_t e) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

class Nccl final : public NcclCommunicator {
 public:
  Nccl(const NcclOptions& options, ncclComm_t comm, cudaStream_t stream, cudaEvent_t ready)
      : options_(options), comm_(comm), stream_(stream), ready_(ready) {}
  ~Nccl() override {
    cudaSetDevice(options_.device);
    if (comm_ != nullptr) {
      // A clean end flushes (non-blocking: finalize answers ncclInProgress
      // and Wait polls it out); an aborted one is already gone. Finalize is
      // a barrier of the host's ranks: each destroys its own communicator.
      const ncclResult_t r = usable_ ? ncclCommFinalize(comm_) : ncclInvalidUsage;
      if ((r == ncclSuccess || r == ncclInProgress) &&
          Wait("finalize", absl::Now() + absl::Seconds(30)).ok()) {
        ncclCommDestroy(comm_);
      } else if (comm_ != nullptr) {
        ncclCommAbort(comm_);
      }
    }
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }

  absl::Status AllreduceSum(float* data, int64_t n) override {
    return Allreduce(data, n, ncclFloat32, ncclSum, "allreduce (sum, fp32)");
  }
  absl::Status AllreduceSum(double* data, int64_t n) override {
    return Allreduce(data, n, ncclFloat64, ncclSum, "allreduce (sum, fp64)");
  }
  absl::Status AllreduceMax(float* data, int64_t n) override {
    return Allreduce(data, n, ncclFloat32, ncclMax, "allreduce (max, fp32)");
  }
  absl::Status AllreduceSumBf16(uint16_t* data, int64_t n) override {
    return Allreduce(data, n, ncclBfloat16, ncclSum, "allreduce (sum, bf16)");
  }
  // One reduce (or broadcast) per rank's chunk, rooted there, in one group:
  // the chunks differ in length by one where n does not divide, which
  // ncclReduceScatter and ncclAllGather (equal counts) cannot take.
  absl::Status ReduceScatterSum(float* data, int64_t n) override {
    return Chunked(data, n, true, "reduce-scatter (sum, fp32)");
  }
  absl::Status AllGather(float* data, int64_t n) override {
    return Chunked(data, n, false, "all-gather (fp32)");
  }

  absl::Status Send(const void* data, size_t bytes, int peer) override {
    if (absl::Status s = Ready(peer, "send"); !s.ok()) return s;
    return Run(absl::StrCat("send of ", bytes, " bytes to rank ", peer),
               [&] { return ncclSend(data, bytes, ncclUint8, peer, comm_, stream_); });
  }
  absl::Status SendAsync(const void* data, size_t bytes, int peer) override {
    if (absl::Status s = Ready(peer, "send"); !s.ok()) return s;
    const absl::Time until = absl::Now() + Limit();
    return Enqueue(absl::StrCat("send of ", bytes, " bytes to rank ", peer), until,
                   [&] { return ncclSend(data, bytes, ncclUint8, peer, comm_, stream_); });
  }
  absl::Status SendsDone() override {
    if (absl::Status s = Usable("sends"); !s.ok()) return s;
    const absl::Duration limit = Limit();
    return Drain("queued sends", absl::Now() + limit, limit);
  }
  absl::Status Recv(void* data, size_t bytes, int peer) override {
    if (absl::Status s = Ready(peer, "receive"); !s.ok()) return s;
    return Run(absl::StrCat("receive of ", bytes, " bytes from rank ", peer),
               [&] { return ncclRecv(data, bytes, ncclUint8, peer, comm_, stream_); });
  }

  // Polls until `comm_` has no operation in progress (initialisation,
  // an enqueue, finalisation) or `until`; aborts it on an error, a timeout
  // or a cancel.
  absl::Status Wait(const std::string& what, absl::Time until) {
    Cancellation::Scope scope(options_.cancel, [] {});
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r == ncclSuccess && state == ncclSuccess) return absl::OkStatus();
      if (r != ncclSuccess || state != ncclInProgress) {
        return Abort(NcclError(Describe(what), r != ncclSuccess ? r : state, comm_));
      }
      if (scope.cancelled()) return Abort(absl::CancelledError(Describe(what) + " cancelled"));
      if (absl::Now() >= until) {
        return Abort(absl::DeadlineExceededError(Describe(what) + " not done in time"));
      }
      absl::SleepFor(absl::Microseconds(100));
    }
  }

 private:
  std::string Describe(const std::string& what) const {
    return absl::StrCat("NCCL ", what, " over ", options_.size, " ranks (\"", options_.prefix,
                        "\", rank ", options_.rank, ")");
  }

  absl::Status Ready(int peer, const char* what) {
    if (absl::Status s = Usable(what); !s.ok()) return s;
    if (peer < 0 || peer >= options_.size || peer == options_.rank) {
      return absl::InvalidArgumentError(absl::StrCat(Describe(what), ": no peer rank ", peer));
    }
    return absl::OkStatus();
  }

  absl::Status Allreduce(void* data, int64_t n, ncclDataType_t type, ncclRedOp_t op,
                         const char* what) {
    if (absl::Status s = Usable(what); !s.ok()) return s;
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat(Describe(what), ": n = ", n));
    if (n == 0) return absl::OkStatus();
    return Run(what, [&] {
      return ncclAllReduce(data, data, static_cast<size_t>(n), type, op, comm_, stream_);
    });
  }

  absl::Status Chunked(float* data, int64_t n, bool reduce, const char* what) {
    if (absl::Status s = Usable(what); !s.ok()) return s;
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat(Describe(what), ": n = ", n));
    if (n == 0) return absl::OkStatus();
    return Run(what, [&] {
      ncclResult_t r = ncclGroupStart();
      for (int root = 0; r == ncclSuccess && root < options_.size; ++root) {
        const auto [begin, end] = ChunkRange(n, root, options_.size);
        if (begin == end) continue;  // every rank skips it alike
        float* chunk = data + begin;
        const size_t count = static_cast<size_t>(end - begin);
        r = reduce ? ncclReduce(chunk, chunk, count, ncclFloat32, ncclSum, root, comm_, stream_)
                   : ncclBroadcast(chunk, chunk, count, ncclFloat32, root, comm_, stream_);
        if (r == ncclInProgress) r = ncclSuccess;  // a non-blocking communicator's enqueue
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }

  // FAILED_PRECONDITION once aborted; CANCELLED (aborting) while the
  // Cancellation is set: nothing is queued against peers that have left.
  absl::Status Usable(const char* what) {
    if (!usable_) return absl::FailedPreconditionError(Describe(what) + ": aborted earlier");
    if (options_.cancel != nullptr && options_.cancel->cancelled()) {
      return Abort(absl::CancelledError(Describe(what) + " cancelled (a recovery or a stop)"));
    }
    return absl::OkStatus();
  }

  absl::Duration Limit() const {
    return options_.wait_limit ? options_.wait_limit() : options_.timeout;
  }

  // Queues one operation on the stream after the device's earlier work and
  // polls until it is done, all within one wait limit.
  absl::Status Run(const std::string& what, const std::function<ncclResult_t()>& enqueue) {
    const absl::Duration limit = Limit();
    const absl::Time until = absl::Now() + limit;
    if (absl::Status s = Enqueue(what, until, enqueue); !s.ok()) return s;
    return Drain(what, until, limit);
  }

  // Queues one operation on the stream after the device's earlier work
  // (the enqueue itself bounded by `until`).
  absl::Status Enqueue(const std::string& what, absl::Time until,
                       const std::function<ncclResult_t()>& enqueue) {
    if (cudaError_t e = cudaSetDevice(options_.device); e != cudaSuccess) {
      return CudaError(Describe(what), e);
    }
    // Ordered after what the legacy default stream already holds (the
    // producer of the buffer), through an event.
    if (cudaError_t e = cudaEventRecord(ready_, cudaStreamLegacy); e != cudaSuccess) {
      return CudaError(Describe(what), e);
    }
    if (cudaError_t e = cudaStreamWaitEvent(stream_, ready_, 0); e != cudaSuccess) {
      return CudaError(Describe(what), e);
    }
    ncclResult_t r = enqueue();
    if (r != ncclSuccess && r != ncclInProgress) return Abort(NcclError(Describe(what), r, comm_));
    return Wait(what, until);  // the enqueue itself
  }

  // Polls until the stream holds nothing (every operation queued is done)
  // or `until` (`limit` from the start, for the message).
  absl::Status Drain(const std::string& what, absl::Time until, absl::Duration limit) {
    Cancellation::Scope scope(options_.cancel, [] {});
    for (;;) {
      cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) return Abort(CudaError(Describe(what), e));
      (void)cudaGetLastError();  // not an error: keep it from a later launch check
      ncclResult_t state = ncclSuccess;
      if (ncclResult_t q = ncclCommGetAsyncError(comm_, &state); q != ncclSuccess) {
        return Abort(NcclError(Describe(what), q, comm_));
      }
      if (state != ncclSuccess && state != ncclInProgress) {
        return Abort(NcclError(Describe(what), state, comm_));
      }
      if (scope.cancelled()) {
        return Abort(absl::CancelledError(
            absl::StrCat(Describe(what), " cancelled (a recovery or a stop)")));
      }
      if (absl::Now() >= until) {
        return Abort(absl::DeadlineExceededError(
            absl::StrCat(Describe(what), " not done within ", absl::FormatDuration(limit))));
      }
      absl::SleepFor(absl::Microseconds(20));
    }
  }

  absl::Status Abort(absl::Status why) {
    if (usable_) {
      usable_ = false;
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    return why;
  }

  const NcclOptions options_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  cudaEvent_t ready_;  // orders the stream after the default stream's work
  bool usable_ = true;
};

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> ConnectNccl(KeyValueStore* store,
                                                              const NcclOptions& options) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (options.device < 0 || options.device >= devices) {
    return absl::FailedPreconditionError(absl::StrCat("NCCL group \"", options.prefix,
                                                      "\": no CUDA device ", options.device, " (",
                                                      devices, " visible)"));
  }
  if (cudaError_t e = cudaSetDevice(options.device); e != cudaSuccess) {
    return CudaError("cudaSetDevice", e);
  }
  std::string make_error;
  absl::StatusOr<std::string> id_bytes = ShareNcclId(store, options, [&] {
    ncclUniqueId id;
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      make_error = ncclGetErrorString(r);
      return std::string();
    }
    return std::string(id.internal, sizeof(id.internal));
  });
  if (!make_error.empty()) return absl::UnavailableError("ncclGetUniqueId: " + make_error);
  if (!id_bytes.ok()) return id_bytes.status();
  // Rank 0 takes the id back on every way out: once the group is up (every
  // rank read it by then), or when it failed (a retry under the same prefix
  // must not find a dead group's id).
  struct DropId {
    KeyValueStore* store;
    std::string key;
    ~DropId() {
      if (store != nullptr) (void)store->Delete({key});
    }
  } drop{options.rank == 0 ? store : nullptr, options.prefix + "/nccl-id"};
  ncclUniqueId id;
  std::memcpy(id.internal, id_bytes->data(), sizeof(id.internal));
  cudaStream_t stream = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return CudaError("cudaStreamCreate", e);
  }
  cudaEvent_t ready = nullptr;
  if (cudaError_t e = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming); e != cudaSuccess) {
    cudaStreamDestroy(stream);
    return CudaError("cudaEventCreate", e);
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait is bounded (Wait)
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, options.size, id, options.rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    cudaEventDestroy(ready);
    cudaStreamDestroy(stream);
    return NcclError(absl::StrCat("ncclCommInitRank (\"", options.prefix, "\", rank ", options.rank,
                                  " of ", options.size, ")"),
                     r, nullptr);
  }
  auto nccl = std::make_unique<Nccl>(options, comm, stream, ready);
  if (absl::Status s = nccl->Wait("initialisation", absl::Now() + options.timeout); !s.ok()) {
    return s;
  }
  return std::unique_ptr<NcclCommunicator>(std::move(nccl));
}

#else  // !LOOM_WITH_CUDA

absl::StatusOr<std::unique_ptr<NcclCommunicator>> ConnectNccl(KeyValueStore*, const NcclOptions&) {
  return absl::UnimplementedError("NCCL: built without CUDA (build with --config=cuda)");
}

#endif  // LOOM_WITH_CUDA

}  // namespace loom
