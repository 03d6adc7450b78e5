#include "services/preprocess/data_client.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/comm/data_key.h"
#include "services/common/grpc_status.h"

namespace loom {
DataClient::DataClient(std::shared_ptr<grpc::Channel> channel, UcxWorker* ucx,
                       absl::Duration deadline, const ModelConfig* model)
    : stub_(data::v1::PreprocessService::NewStub(channel)), ucx_(ucx), deadline_(deadline) {
  if (model != nullptr) model_ = *model;
}

absl::StatusOr<data::v1::GetBatchResponse> DataClient::GetBatch(int64_t iteration) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline_));
  data::v1::GetBatchRequest request;
  request.set_iteration(iteration);
  data::v1::GetBatchResponse response;
  grpc::Status s = stub_->GetBatch(&ctx, request, &response);
  if (!s.ok()) return FromGrpcStatus(s, "GetBatch");
  return response;
}

absl::StatusOr<std::vector<Sample>> DataClient::FetchSamples(int64_t iteration,
                                                             const std::vector<int>& indices,
                                                             bool tokens_only, bool validation,
                                                             bool output_images) {
  const absl::Duration budget = budget_ ? std::max(budget_(), deadline_) : deadline_;
  const absl::Time give_up = absl::Now() + budget;
  data::v1::FetchSamplesRequest request;
  request.set_iteration(iteration);
  for (int i : indices) request.add_indices(i);
  request.set_ucx_address(ucx_->address());
  request.set_tokens_only(tokens_only);
  request.set_validation(validation);
  request.set_output_images(output_images);
  const size_t per = output_images ? 3 : 2;  // tags per sample
  data::v1::FetchSamplesResponse response;
  for (;;) {
    // Each attempt gets its own random tags: concurrent fetches and the
    // late sends of an abandoned attempt never match its messages, and no
    // process but loom-preprocess learns them (data_key.h).
    request.clear_tags();
    const std::string random = RandomBytes(8 * per * indices.size());
    for (size_t i = 0; i < per * indices.size(); ++i) {
      uint64_t tag = 0;
      std::memcpy(&tag, random.data() + 8 * i, 8);
      request.add_tags(tag & ~(uint64_t{1} << 63));
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(std::min(absl::Now() + deadline_, give_up)));
    ctx.set_wait_for_ready(true);  // a restarted loom-preprocess comes back at the same address
    grpc::Status s = stub_->FetchSamples(&ctx, request, &response);
    if (s.ok()) break;
    const bool again = s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                       s.error_code() == grpc::StatusCode::UNAVAILABLE;
    if (!again || absl::Now() >= give_up || ucx_->cancelled()) {
      return FromGrpcStatus(s, "FetchSamples");
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  if (response.samples_size() != static_cast<int>(indices.size())) {
    return absl::DataLossError("FetchSamples: answer does not match the request");
  }
  // Owned by the receives too: one cut off mid-transfer is left to UCX.
  auto received = std::make_shared<std::vector<Sample>>(indices.size());
  std::vector<Sample>& out = *received;
  std::vector<UcxWorker::RecvBuffer> buffers;
  for (int k = 0; k < response.samples_size(); ++k) {
    const data::v1::SampleTensors& t = response.samples(k);
    const int64_t expect =
        tokens_only ? 0
                    : static_cast<int64_t>(t.num_tiles()) * 3 * t.tile_size() * t.tile_size() * 4;
    const int64_t gen_side = t.output_image_size();
    if (gen_side < 0 || gen_side > (1 << 16) || t.num_output_images() > (1 << 20)) {
      return absl::DataLossError(
          absl::StrCat("FetchSamples: inconsistent descriptor for ", t.key()));
    }
    const int64_t expect_gen =
        output_images ? int64_t{t.num_output_images()} * 3 * gen_side * gen_side * 4 : 0;
    if (t.num_tiles() < 0 || t.num_tokens() < 0 || t.tiles_bytes() != expect ||
        t.num_output_images() < 0 || t.output_images_bytes() != expect_gen ||
        (!t.loss_mask().empty() && t.loss_mask().size() != static_cast<size_t>(t.num_tokens()))) {
      return absl::DataLossError(
          absl::StrCat("FetchSamples: inconsistent descriptor for ", t.key()));
    }
    if (model_) {  // before allocating what the sender asks for
      Sample shape;
      shape.num_tiles = t.num_tiles();
      shape.tokens.resize(std::min<size_t>(t.num_tokens(), model_->llm.max_seq + 1));
      if (t.num_tiles() > 0 && t.tile_size() != model_->vit.tile_size) {
        return CheckSampleFits(shape, t.tile_size(), true, *model_, t.key());
      }
      if (output_images && t.num_output_images() > 0 &&
          (!model_->has_generator() || gen_side != model_->generator.denoiser.tile_size ||
           t.num_output_images() > model_->llm.max_seq)) {
        return SampleMisfitError(
            absl::StrCat("sample ", t.key(), " from loom-preprocess does not fit model ",
                         model_->name, ": ", t.num_output_images(), " output images of ", gen_side,
                         " px; is loom-preprocess "
                         "running with --config=",
                         model_->name, "?"));
      }
      if (t.num_tokens() > model_->llm.max_seq ||
          static_cast<int64_t>(t.num_tiles()) * model_->tokens_per_tile() > t.num_tokens()) {
        return SampleMisfitError(absl::StrCat(
            "sample ", t.key(), " from loom-preprocess does not fit model ", model_->name, ": ",
            t.num_tiles(), " tiles and ", t.num_tokens(), " tokens (the model takes at most ",
            model_->llm.max_seq, " tokens, ", model_->tokens_per_tile(),
            " per tile); is loom-preprocess running with --config=", model_->name, "?"));
      }
    }
    out[k].num_tiles = t.num_tiles();
    out[k].tiles.resize(static_cast<size_t>(t.tiles_bytes() / 4));
    out[k].tokens.resize(static_cast<size_t>(t.num_tokens()));
    out[k].loss_mask.assign(t.loss_mask().begin(), t.loss_mask().end());
    out[k].id = t.id();
    out[k].num_gen_images = t.num_output_images();
    out[k].gen_images.resize(static_cast<size_t>(t.output_images_bytes() / 4));
    if (output_images) {
      buffers.push_back({t.output_images_tag(), out[k].gen_images.data(),
                         out[k].gen_images.size() * 4, received});
    }
    if (!tokens_only) {
      buffers.push_back({t.tiles_tag(), out[k].tiles.data(), out[k].tiles.size() * 4, received});
    }
    buffers.push_back({t.tokens_tag(), out[k].tokens.data(), out[k].tokens.size() * 4, received});
  }
  if (absl::Status r = ucx_->RecvAll(buffers, std::max(deadline_, give_up - absl::Now()));
      !r.ok()) {
    return r;
  }
  for (int k = 0; model_ && k < response.samples_size(); ++k) {
    const data::v1::SampleTensors& t = response.samples(k);
    if (absl::Status s = CheckSampleFits(out[k], t.tile_size(), tokens_only, *model_, t.key());
        !s.ok()) {
      return s;
    }
  }
  return std::move(out);
}

}  // namespace loom
