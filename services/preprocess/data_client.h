// The worker side of loom-preprocess: global-batch metadata over gRPC and
// sample tensors over UCX into this process's UcxWorker.
#ifndef LOOM_SERVICES_PREPROCESS_DATA_CLIENT_H_
#define LOOM_SERVICES_PREPROCESS_DATA_CLIENT_H_

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "loom/data/v1/data.grpc.pb.h"
#include "runtime/comm/ucx.h"
#include "runtime/model/model.h"

namespace loom {

class DataClient {
 public:
  // `ucx` is not owned and must outlive the client. With `model` (copied),
  // every fetched sample is checked against it (data::CheckSampleFits)
  // before it is handed out.
  DataClient(std::shared_ptr<grpc::Channel> channel, UcxWorker* ucx,
             absl::Duration deadline = absl::Seconds(30), const ModelConfig* model = nullptr);

  // How long one FetchSamples may wait for loom-preprocess in all: a call
  // that runs past `deadline` (the batch not prepared yet, the service
  // stopped for a while) is asked again until then, and the tensors get as
  // long to arrive. Unset: `deadline`, one attempt. Asked at each fetch.
  void SetWaitBudget(std::function<absl::Duration()> budget) { budget_ = std::move(budget); }

  absl::StatusOr<data::v1::GetBatchResponse> GetBatch(int64_t iteration);

  // The samples at `indices` of batch `iteration`, in that order. With
  // `tokens_only` each Sample's tiles stay empty (num_tiles is still set).
  // `validation`: of validation batch `iteration` (GetBatchRequest).
  // `output_images`: each Sample's gen_images too (a generator rank; else
  // they stay empty, num_gen_images and id are always set).
  absl::StatusOr<std::vector<Sample>> FetchSamples(int64_t iteration,
                                                   const std::vector<int>& indices,
                                                   bool tokens_only = false,
                                                   bool validation = false,
                                                   bool output_images = false);

 private:
  std::unique_ptr<data::v1::PreprocessService::Stub> stub_;
  UcxWorker* ucx_;
  absl::Duration deadline_;
  std::function<absl::Duration()> budget_;
  std::optional<ModelConfig> model_;
};

}  // namespace loom

#endif  // LOOM_SERVICES_PREPROCESS_DATA_CLIENT_H_
