// loom-preprocess's gRPC service (data::v1::PreprocessService).
//
// Owns the data loader (runtime/data/loader.h) and one UCX worker. Global
// batch i is the loader's next `global_batch` kept samples after batch i-1;
// batches are made in order when first asked for, kept for
// `retained_batches` iterations, and the loader prefetches behind them.
// Skipped samples are counted in loom_preprocess_samples_skipped_total{reason}.
#ifndef LOOM_SERVICES_PREPROCESS_PREPROCESS_SERVICE_H_
#define LOOM_SERVICES_PREPROCESS_PREPROCESS_SERVICE_H_

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "loom/data/v1/data.grpc.pb.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "runtime/comm/ucx.h"
#include "runtime/data/loader.h"
#include "runtime/hf/pretrained.h"
#include "services/common/chassis.h"

namespace loom {

struct PreprocessServiceOptions {
  std::string shards;              // glob; "" serves GetInfo only (data RPCs: FAILED_PRECONDITION)
  bool exit_on_job_end = false;    // EndJob stops the process (services/common/job_end.h)
  std::string tokenizer;           // "" for the model's own
  std::string chat_template;       // "" for the tokenizer's own (runtime/data/chat_template.h)
  std::string image_aspect_ratio;  // "", crop or pad (hf::DataPipelineFor)
  data::TokenCaps caps;            // samples over them are skipped (over_token_cap)
  hf::ModelSource model;  // tile size, tokens per tile, max sequence, tokenizer, image processor
  uint64_t seed = 1;
  int global_batch = 16;
  int threads = 2;
  int prefetch = 64;
  int retained_batches = 16;
  // Resume: batch `start_iteration` starts at `cursor` (the cursor a
  // checkpoint of step start_iteration saved); earlier batches do not exist.
  int64_t start_iteration = 0;
  data::v1::DataCursor cursor;
  // A held-out set: the first validation_batches x global_batch samples
  // these shards keep, in order ("": none).
  std::string validation_shards;
  int validation_batches = 0;
};

// Thread-safe: gRPC calls its methods from many threads at once.
class PreprocessServiceImpl final : public data::v1::PreprocessService::Service {
 public:
  // `chassis` is not owned and must outlive this service. Opens the shards
  // (errors name the flag at fault).
  static absl::StatusOr<std::unique_ptr<PreprocessServiceImpl>> Create(
      Chassis* chassis, const PreprocessServiceOptions& options);
  // GetInfo only, no data.
  explicit PreprocessServiceImpl(Chassis* chassis);

  grpc::Status GetInfo(grpc::ServerContext* context, const data::v1::GetInfoRequest* request,
                       data::v1::GetInfoResponse* response) override;
  grpc::Status GetBatch(grpc::ServerContext* context, const data::v1::GetBatchRequest* request,
                        data::v1::GetBatchResponse* response) override;
  grpc::Status FetchSamples(grpc::ServerContext* context,
                            const data::v1::FetchSamplesRequest* request,
                            data::v1::FetchSamplesResponse* response) override;
  grpc::Status GetCursor(grpc::ServerContext* context, const data::v1::GetCursorRequest* request,
                         data::v1::GetCursorResponse* response) override;
  grpc::Status Rewind(grpc::ServerContext* context, const data::v1::RewindRequest* request,
                      data::v1::RewindResponse* response) override;
  grpc::Status EndJob(grpc::ServerContext* context, const data::v1::EndJobRequest* request,
                      data::v1::EndJobResponse* response) override;

 private:
  struct Batch {
    int64_t iteration = 0;
    data::v1::DataCursor cursor_before;
    data::v1::DataCursor cursor_after;  // cursor_before of the next batch
    std::vector<data::ProcessedSample> samples;
  };
  // Batch `iteration`, built (with those before it) if it is next.
  absl::StatusOr<std::shared_ptr<const Batch>> BatchFor(int64_t iteration);
  // The batch if built, an error if it cannot be, null if it is to be built.
  absl::StatusOr<std::shared_ptr<const Batch>> FindBatchLocked(int64_t iteration)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `loader`'s next global_batch kept samples as batch `iteration`.
  absl::StatusOr<std::shared_ptr<Batch>> NextBatch(data::DataLoader& loader, int64_t iteration);
  // Validation batch `index` (0 to validation_batches - 1), built with those
  // before it; a pass that starts again after its batches left the window
  // reads the set again from its start.
  absl::StatusOr<std::shared_ptr<const Batch>> ValidationBatch(int64_t index);
  absl::StatusOr<std::shared_ptr<const Batch>> AnyBatch(int64_t iteration, bool validation) {
    return validation ? ValidationBatch(iteration) : BatchFor(iteration);
  }

  Chassis* chassis_;
  PreprocessServiceOptions options_;
  int tile_size_ = 0;              // of the model config; every served tile is this size
  int gen_image_size_ = 0;         // its generator's output image side (0: none)
  int gen_patches_per_image_ = 0;  // the generator's (0: none), for the scheduler's records
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::unique_ptr<data::DataLoader> loader_;
  data::v1::DataCursor initial_cursor_;  // where this service started (Rewind's default)
  std::unique_ptr<UcxWorker> ucx_;
  prometheus::Family<prometheus::Counter>* skipped_ = nullptr;
  prometheus::Counter* samples_served_ = nullptr;
  prometheus::Counter* truncated_ = nullptr;
  prometheus::Counter* bytes_sent_ = nullptr;
  prometheus::Counter* send_failures_ = nullptr;

  // One batch is built at a time, under build_mu_ (the loader decodes ahead
  // on its own threads; Next() waits for it). mu_ guards only the built
  // batches, so a fetch of one that is built never waits behind decoding.
  // Order: build_mu_, then mu_.
  absl::Mutex build_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  std::map<int64_t, std::shared_ptr<const Batch>> batches_ ABSL_GUARDED_BY(mu_);
  int64_t next_iteration_ ABSL_GUARDED_BY(mu_) = 0;
  std::string loader_error_ ABSL_GUARDED_BY(mu_);

  // The held-out set (options_.validation_shards): its own loader, unshuffled.
  std::unique_ptr<data::DataLoader> validation_loader_;
  data::v1::DataCursor validation_start_;
  absl::Mutex validation_mu_;
  std::map<int64_t, std::shared_ptr<const Batch>> validation_ ABSL_GUARDED_BY(validation_mu_);
  int64_t validation_next_ ABSL_GUARDED_BY(validation_mu_) = 0;
};

}  // namespace loom

#endif  // LOOM_SERVICES_PREPROCESS_PREPROCESS_SERVICE_H_
