#include "services/preprocess/preprocess_service.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "runtime/base/log.h"
#include "services/common/grpc_status.h"
#include "services/common/job_end.h"

namespace loom {
namespace {
const grpc::Status kNoData(grpc::StatusCode::FAILED_PRECONDITION,
                           "loom-preprocess was started without --shards");
}  // namespace

PreprocessServiceImpl::PreprocessServiceImpl(Chassis* chassis) : chassis_(chassis) {}

absl::StatusOr<std::unique_ptr<PreprocessServiceImpl>> PreprocessServiceImpl::Create(
    Chassis* chassis, const PreprocessServiceOptions& options) {
  auto service = std::make_unique<PreprocessServiceImpl>(chassis);
  service->options_ = options;
  if (options.shards.empty()) return service;
  if (options.global_batch < 1) return absl::InvalidArgumentError("--global_batch must be >= 1");
  if (options.retained_batches < 1) {
    return absl::InvalidArgumentError("--retained_batches must be >= 1");
  }
  absl::StatusOr<hf::PretrainedModel> model = hf::ResolveModel(options.model);
  if (!model.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.model.pretrained() ? "--" : "--config: ", model.status().message()));
  }
  absl::StatusOr<hf::DataPipeline> pipeline = hf::DataPipelineFor(
      *model, options.tokenizer, options.chat_template, options.image_aspect_ratio);
  if (!pipeline.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--tokenizer: ", pipeline.status().message()));
  }
  service->tokenizer_ = std::move(pipeline->tokenizer);
  absl::StatusOr<std::vector<data::DataSource>> sources = data::ParseShardSources(options.shards);
  if (!sources.ok())
    return absl::InvalidArgumentError(absl::StrCat("--shards: ", sources.status().message()));

  prometheus::Registry& registry = chassis->registry();
  service->skipped_ = &prometheus::BuildCounter()
                           .Name("loom_preprocess_samples_skipped_total")
                           .Help("Samples skipped by the preprocessing pipeline, by reason.")
                           .Register(registry);
  for (std::string_view reason : data::kSkipReasons) {
    service->skipped_->Add({{"reason", std::string(reason)}});
  }
  service->samples_served_ = &prometheus::BuildCounter()
                                  .Name("loom_preprocess_samples_total")
                                  .Help("Samples preprocessed into global batches.")
                                  .Register(registry)
                                  .Add({});
  service->truncated_ = &prometheus::BuildCounter()
                             .Name("loom_preprocess_samples_truncated_total")
                             .Help("Samples cut to the maximum sequence (their text off the end).")
                             .Register(registry)
                             .Add({});
  service->bytes_sent_ = &prometheus::BuildCounter()
                              .Name("loom_preprocess_ucx_sent_bytes_total")
                              .Help("Tensor bytes sent to workers over UCX.")
                              .Register(registry)
                              .Add({});
  service->send_failures_ = &prometheus::BuildCounter()
                                 .Name("loom_preprocess_ucx_send_failures_total")
                                 .Help(
                                     "UCX sends to workers that failed after GetSamples "
                                     "returned (the receiver gone, or past the send timeout).")
                                 .Register(registry)
                                 .Add({});

  data::LoaderOptions lo;
  lo.sources = *std::move(sources);
  lo.seed = options.seed;
  lo.threads = std::max(1, options.threads);
  lo.prefetch = std::max(1, options.prefetch);
  lo.preprocess = std::move(pipeline->preprocess);
  lo.preprocess.caps = options.caps;
  service->tile_size_ = lo.preprocess.tile_size;
  service->gen_patches_per_image_ = lo.preprocess.gen_patches_per_image;
  service->gen_image_size_ = lo.preprocess.gen_image_size;
  auto* skipped = service->skipped_;
  lo.on_skip = [skipped](const data::SkippedSample& s) {
    skipped->Add({{"reason", s.reason}}).Increment();
  };
  if (!options.validation_shards.empty()) {
    if (options.validation_batches < 1) {
      return absl::InvalidArgumentError(
          "--validation_batches must be >= 1 with --validation_shards");
    }
    absl::StatusOr<std::vector<std::string>> paths =
        data::ExpandShardGlob(options.validation_shards);
    if (!paths.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--validation_shards: ", paths.status().message()));
    }
    data::LoaderOptions vo = lo;
    vo.sources.clear();
    vo.shards = *paths;
    vo.shuffle = false;
    vo.epochs = 1;  // never wraps around: a set too small to fill its batches is an error
    vo.threads = 1;
    vo.prefetch = std::max(1, options.global_batch);
    absl::StatusOr<std::unique_ptr<data::DataLoader>> v =
        data::DataLoader::Open(std::move(vo), service->tokenizer_.get());
    if (!v.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--validation_shards: ", v.status().message()));
    }
    const int64_t wanted = static_cast<int64_t>(options.validation_batches) * options.global_batch;
    if ((*v)->dataset_samples() < wanted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--validation_shards: ", (*v)->dataset_samples(), " samples, fewer than the ",
          options.validation_batches, " batches of ", options.global_batch, " asked for"));
    }
    service->validation_loader_ = std::move(*v);
    service->validation_start_ = service->validation_loader_->Cursor();
  }
  absl::StatusOr<std::unique_ptr<data::DataLoader>> loader =
      data::DataLoader::Open(std::move(lo), service->tokenizer_.get());
  if (!loader.ok())
    return absl::InvalidArgumentError(absl::StrCat("--shards: ", loader.status().message()));
  service->loader_ = std::move(*loader);
  if (options.start_iteration > 0) {
    if (absl::Status r = service->loader_->Restore(options.cursor); !r.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--cursor: ", r.message()));
    }
    absl::MutexLock lock(&service->mu_);
    service->next_iteration_ = options.start_iteration;
  }
  service->initial_cursor_ = service->loader_->Cursor();
  absl::StatusOr<std::unique_ptr<UcxWorker>> ucx = UcxWorker::Create();
  if (!ucx.ok()) return ucx.status();
  service->ucx_ = std::move(*ucx);
  LOOM_LOG(INFO)
          .With("sources", static_cast<int64_t>(service->loader_->num_sources()))
          .With("samples", service->loader_->dataset_samples())
          .With("global_batch", options.global_batch)
      << "data loader open";
  return service;
}

grpc::Status PreprocessServiceImpl::GetInfo(grpc::ServerContext*, const data::v1::GetInfoRequest*,
                                            data::v1::GetInfoResponse* response) {
  chassis_->FillServiceInfo(response->mutable_info());
  if (loader_ != nullptr) response->set_dataset_samples(loader_->dataset_samples());
  if (validation_loader_ != nullptr) response->set_validation_batches(options_.validation_batches);
  return grpc::Status::OK;
}

absl::StatusOr<std::shared_ptr<const PreprocessServiceImpl::Batch>>
PreprocessServiceImpl::FindBatchLocked(int64_t iteration) {
  if (!loader_error_.empty()) return absl::FailedPreconditionError(loader_error_);
  if (auto it = batches_.find(iteration); it != batches_.end()) return it->second;
  if (iteration < next_iteration_) {
    return absl::OutOfRangeError(
        absl::StrCat("iteration ", iteration, " left the retention window (oldest kept: ",
                     batches_.empty() ? next_iteration_ : batches_.begin()->first, ")"));
  }
  if (iteration >= next_iteration_ + options_.retained_batches) {
    return absl::FailedPreconditionError(
        absl::StrCat("iteration ", iteration, " is more than ", options_.retained_batches,
                     " batches ahead of the next one (", next_iteration_, ")"));
  }
  return std::shared_ptr<const Batch>();
}

absl::StatusOr<std::shared_ptr<const PreprocessServiceImpl::Batch>> PreprocessServiceImpl::BatchFor(
    int64_t iteration) {
  if (iteration < 0) return absl::InvalidArgumentError("iteration: must be >= 0");
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::shared_ptr<const Batch>> found = FindBatchLocked(iteration);
    if (!found.ok() || *found) return found;
  }
  absl::MutexLock build(&build_mu_);
  for (;;) {
    int64_t next = 0;
    {
      absl::MutexLock lock(&mu_);
      // Built meanwhile by another caller, or no longer buildable.
      absl::StatusOr<std::shared_ptr<const Batch>> found = FindBatchLocked(iteration);
      if (!found.ok() || *found) return found;
      next = next_iteration_;
    }
    absl::StatusOr<std::shared_ptr<Batch>> batch = NextBatch(*loader_, next);
    if (!batch.ok()) {
      absl::MutexLock lock(&mu_);
      loader_error_ = std::string(batch.status().message());
      LOOM_LOG(ERROR).With("error", loader_error_) << "data loader failed";
      return absl::FailedPreconditionError(loader_error_);
    }
    samples_served_->Increment(options_.global_batch);
    absl::MutexLock lock(&mu_);
    batches_[next_iteration_++] = *std::move(batch);
    while (static_cast<int>(batches_.size()) > options_.retained_batches)
      batches_.erase(batches_.begin());
  }
}

absl::StatusOr<std::shared_ptr<PreprocessServiceImpl::Batch>> PreprocessServiceImpl::NextBatch(
    data::DataLoader& loader, int64_t iteration) {
  auto batch = std::make_shared<Batch>();
  batch->iteration = iteration;
  batch->cursor_before = loader.Cursor();
  for (int i = 0; i < options_.global_batch; ++i) {
    absl::StatusOr<data::ProcessedSample> s = loader.Next();
    if (!s.ok()) return s.status();
    if (s->truncated_tokens > 0) truncated_->Increment();
    batch->samples.push_back(std::move(*s));
  }
  batch->cursor_after = loader.Cursor();
  return batch;
}

absl::StatusOr<std::shared_ptr<const PreprocessServiceImpl::Batch>>
PreprocessServiceImpl::ValidationBatch(int64_t index) {
  if (validation_loader_ == nullptr) {
    return absl::FailedPreconditionError("no held-out set (--validation_shards)");
  }
  if (index < 0 || index >= options_.validation_batches) {
    return absl::InvalidArgumentError(absl::StrCat("iteration: validation batch ", index,
                                                   " is outside 0 to ",
                                                   options_.validation_batches - 1));
  }
  absl::MutexLock lock(&validation_mu_);
  if (auto it = validation_.find(index); it != validation_.end()) return it->second;
  if (index < validation_next_) {  // a new pass, its batches gone: read the set again
    if (absl::Status s = validation_loader_->Restore(validation_start_); !s.ok()) return s;
    validation_.clear();
    validation_next_ = 0;
  }
  while (validation_next_ <= index) {
    absl::StatusOr<std::shared_ptr<Batch>> batch = NextBatch(*validation_loader_, validation_next_);
    if (!batch.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("validation data: ", batch.status().message()));
    }
    validation_[validation_next_++] = *std::move(batch);
    while (static_cast<int>(validation_.size()) > options_.retained_batches)
      validation_.erase(validation_.begin());
  }
  return validation_.at(index);
}

grpc::Status PreprocessServiceImpl::GetBatch(grpc::ServerContext*,
                                             const data::v1::GetBatchRequest* request,
                                             data::v1::GetBatchResponse* response) {
  if (loader_ == nullptr) return kNoData;
  absl::StatusOr<std::shared_ptr<const Batch>> batch =
      AnyBatch(request->iteration(), request->validation());
  if (!batch.ok()) return ToGrpcStatus(batch.status());
  response->set_iteration(request->iteration());
  *response->mutable_next_cursor() = (*batch)->cursor_after;
  for (size_t i = 0; i < (*batch)->samples.size(); ++i) {
    const data::ProcessedSample& s = (*batch)->samples[i];
    data::v1::SampleMetadata* m = response->add_samples();
    m->set_index(static_cast<int32_t>(i));
    *m->mutable_record() = data::ScanRecordOf(s, gen_patches_per_image_);
  }
  return grpc::Status::OK;
}

grpc::Status PreprocessServiceImpl::FetchSamples(grpc::ServerContext*,
                                                 const data::v1::FetchSamplesRequest* request,
                                                 data::v1::FetchSamplesResponse* response) {
  if (loader_ == nullptr) return kNoData;
  absl::StatusOr<std::shared_ptr<const Batch>> batch =
      AnyBatch(request->iteration(), request->validation());
  if (!batch.ok()) return ToGrpcStatus(batch.status());
  const int n = static_cast<int>((*batch)->samples.size());
  std::set<int> seen;
  for (int index : request->indices()) {
    if (index < 0 || index >= n) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("indices: ", index, " is outside the batch of ", n));
    }
    if (!seen.insert(index).second) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("indices: ", index, " is repeated"));
    }
  }
  const int per = request->output_images() ? 3 : 2;  // tags per sample
  if (request->tags_size() != per * request->indices_size()) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("tags: want ", per, " per index (", per * request->indices_size(), "), got ",
                     request->tags_size()));
  }
  for (uint64_t tag : request->tags()) {
    if (tag >> 63 != 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("tags: ", tag, " has the top bit set (workers' own tags)"));
    }
  }
  std::shared_ptr<const void> keep = *batch;
  for (int k = 0; k < request->indices_size(); ++k) {
    const data::ProcessedSample& s = (*batch)->samples[request->indices(k)];
    data::v1::SampleTensors* t = response->add_samples();
    t->set_index(request->indices(k));
    t->set_key(s.key);
    t->set_num_tiles(s.sample.num_tiles);
    t->set_tile_size(tile_size_);
    t->set_tiles_tag(request->tags(per * k));
    const size_t tile_bytes = request->tokens_only() ? 0 : s.sample.tiles.size() * sizeof(float);
    t->set_tiles_bytes(static_cast<int64_t>(tile_bytes));
    t->set_tokens_tag(request->tags(per * k + 1));
    t->set_num_tokens(static_cast<int32_t>(s.sample.tokens.size()));
    t->set_loss_mask(std::string(s.sample.loss_mask.begin(), s.sample.loss_mask.end()));
    t->set_id(s.sample.id);
    t->set_num_output_images(s.sample.num_gen_images);
    t->set_output_image_size(gen_image_size_);
    const size_t gen_bytes =
        request->output_images() ? s.sample.gen_images.size() * sizeof(float) : 0;
    if (request->output_images()) t->set_output_images_tag(request->tags(per * k + 2));
    t->set_output_images_bytes(static_cast<int64_t>(gen_bytes));
    // The call has returned by the time a send completes: a failure is
    // counted and logged here, and the receiver's wait for it times out.
    auto count = [counter = bytes_sent_, failures = send_failures_](size_t bytes) {
      return [counter, failures, bytes](absl::Status st) {
        if (st.ok()) {
          counter->Increment(static_cast<double>(bytes));
          return;
        }
        failures->Increment();
        LOOM_LOG(WARNING)
                .With("bytes", static_cast<int64_t>(bytes))
                .With("error", std::string(st.message()))
            << "UCX send to a worker failed";
      };
    };
    const size_t token_bytes = s.sample.tokens.size() * sizeof(int32_t);
    absl::Status sent = absl::OkStatus();
    if (!request->tokens_only()) {
      sent = ucx_->Send(request->ucx_address(), t->tiles_tag(), s.sample.tiles.data(), tile_bytes,
                        keep, count(tile_bytes));
    }
    if (sent.ok()) {
      sent = ucx_->Send(request->ucx_address(), t->tokens_tag(), s.sample.tokens.data(),
                        token_bytes, keep, count(token_bytes));
    }
    if (sent.ok() && request->output_images()) {
      sent = ucx_->Send(request->ucx_address(), t->output_images_tag(), s.sample.gen_images.data(),
                        gen_bytes, keep, count(gen_bytes));
    }
    if (!sent.ok()) {
      const bool bad_address = sent.code() == absl::StatusCode::kInvalidArgument;
      return grpc::Status(
          bad_address ? grpc::StatusCode::INVALID_ARGUMENT : grpc::StatusCode::UNAVAILABLE,
          absl::StrCat(bad_address ? "ucx_address: " : "", sent.message()));
    }
  }
  return grpc::Status::OK;
}

grpc::Status PreprocessServiceImpl::GetCursor(grpc::ServerContext*,
                                              const data::v1::GetCursorRequest* request,
                                              data::v1::GetCursorResponse* response) {
  if (loader_ == nullptr) return kNoData;
  absl::StatusOr<std::shared_ptr<const Batch>> batch = BatchFor(request->iteration());
  if (!batch.ok()) return ToGrpcStatus(batch.status());
  *response->mutable_cursor() = (*batch)->cursor_before;
  return grpc::Status::OK;
}

grpc::Status PreprocessServiceImpl::EndJob(grpc::ServerContext*,
                                           const data::v1::EndJobRequest* request,
                                           data::v1::EndJobResponse* response) {
  LOOM_LOG(INFO)
          .With("job", request->job_id())
          .With("state", request->state())
          .With("exiting", options_.exit_on_job_end)
      << "the job ended";
  response->set_exiting(options_.exit_on_job_end);
  if (options_.exit_on_job_end) StopProcessSoon();
  return grpc::Status::OK;
}

grpc::Status PreprocessServiceImpl::Rewind(grpc::ServerContext*,
                                           const data::v1::RewindRequest* request,
                                           data::v1::RewindResponse*) {
  if (loader_ == nullptr) return kNoData;
  if (request->start_iteration() < 0) {
    return ToGrpcStatus(absl::InvalidArgumentError("start_iteration: must be >= 0"));
  }
  const data::v1::DataCursor& cursor = request->has_cursor() ? request->cursor() : initial_cursor_;
  absl::MutexLock build(&build_mu_);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = loader_->Restore(cursor); !s.ok()) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat("cursor: ", s.message())));
  }
  batches_.clear();  // FetchSamples in progress keep theirs (shared)
  next_iteration_ = request->start_iteration();
  loader_error_.clear();
  LOOM_LOG(INFO)
          .With("start_iteration", request->start_iteration())
          .With("epoch", cursor.epoch())
          .With("position", cursor.position())
      << "rewound";
  return grpc::Status::OK;
}

}  // namespace loom
