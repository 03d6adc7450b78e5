// A Communicator over device buffers through a host one: each call copies
// the buffer from its backend's memory to the host, runs the host
// communicator (Gloo) there and copies the result back. The fallback where
// no device collective reaches: NCCL wants a GPU per rank, so ranks that
// share a GPU (or a build without NCCL) reduce through host memory - slower
// by two copies per call, the same sums (the host communicator's).
//
// A worker on a GPU hands its model this, not the group itself, for the
// layers' tensor-parallel all-reduces (their buffers are device memory);
// its own host-side reductions (the job's scalars) use the group directly.
#ifndef LOOM_RUNTIME_COMM_HOST_STAGED_H_
#define LOOM_RUNTIME_COMM_HOST_STAGED_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "runtime/comm/collective.h"
#include "runtime/tensor/backend.h"

namespace loom {

class HostStagedCommunicator final : public Communicator {
 public:
  // `host` and `backend` (not owned) outlive this; `host` takes host memory.
  HostStagedCommunicator(Communicator* host, Backend* backend) : host_(host), backend_(backend) {}

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  absl::Status AllreduceSum(float* data, int64_t n) override {
    return Staged(data, n, &floats_,
                  [this](float* h, int64_t k) { return host_->AllreduceSum(h, k); });
  }
  absl::Status AllreduceSum(double* data, int64_t n) override {
    return Staged(data, n, &doubles_,
                  [this](double* h, int64_t k) { return host_->AllreduceSum(h, k); });
  }
  absl::Status AllreduceMax(float* data, int64_t n) override {
    return Staged(data, n, &floats_,
                  [this](float* h, int64_t k) { return host_->AllreduceMax(h, k); });
  }
  // The host group's own (each chunk moved once), the whole buffer staged
  // (the base class's defaults would write device memory from the host).
  absl::Status ReduceScatterSum(float* data, int64_t n) override {
    return Staged(data, n, &floats_,
                  [this](float* h, int64_t k) { return host_->ReduceScatterSum(h, k); });
  }
  absl::Status AllGather(float* data, int64_t n) override {
    return Staged(data, n, &floats_,
                  [this](float* h, int64_t k) { return host_->AllGather(h, k); });
  }

 private:
  // Down (after the device's queued work), `op` on the host, back up. On an
  // error the device buffer is left as it was (Communicator: unspecified).
  template <typename T, typename Op>
  absl::Status Staged(T* data, int64_t n, std::vector<T>* host, Op op) {
    host->resize(static_cast<size_t>(n));
    const size_t bytes = sizeof(T) * static_cast<size_t>(n);
    backend_->Synchronize();
    backend_->CopyToHost(host->data(), data, bytes);
    if (absl::Status s = op(host->data(), n); !s.ok()) return s;
    backend_->CopyFromHost(data, host->data(), bytes);
    return absl::OkStatus();
  }

  Communicator* host_;
  Backend* backend_;
  std::vector<float> floats_;  // staging, reused (one caller at a time)
  std::vector<double> doubles_;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_COMM_HOST_STAGED_H_
