#include "services/preprocess/preprocess_service.h"

#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/base/test_paths.h"
#include "runtime/data/datagen.h"
#include "services/common/chassis_testing.h"
#include "services/common/http_get.h"
#include "services/preprocess/data_client.h"

namespace loom {
namespace {

TEST(PreprocessServiceImplTest, GetInfoReportsRoleAndBoundPorts) {
  Chassis chassis(
      testing::LocalOptions("loom-preprocess", common::v1::ROLE_PREPROCESS, /*rank=*/0));
  PreprocessServiceImpl service(&chassis);
  chassis.AddService(&service, data::v1::PreprocessService::service_full_name());
  ASSERT_TRUE(chassis.Start().ok());

  auto stub = data::v1::PreprocessService::NewStub(testing::ChannelTo(chassis));
  auto ctx = testing::ContextWithDeadline();
  data::v1::GetInfoResponse response;
  grpc::Status s = stub->GetInfo(ctx.get(), data::v1::GetInfoRequest(), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.info().service_name(), "loom-preprocess");
  EXPECT_EQ(response.info().role(), common::v1::ROLE_PREPROCESS);
  EXPECT_EQ(response.info().rank(), 0);
  EXPECT_EQ(response.info().grpc_port(), chassis.grpc_port());
  EXPECT_EQ(response.info().metrics_port(), chassis.metrics_port());

  // Without --shards the data RPCs say so.
  auto ctx2 = testing::ContextWithDeadline();
  data::v1::GetBatchResponse batch;
  EXPECT_EQ(stub->GetBatch(ctx2.get(), data::v1::GetBatchRequest(), &batch).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

class ServedDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = testing::TempPath("ov");
    data::DatagenOptions g;
    g.preset = "onevision";
    g.samples = 24;
    g.seed = 2;
    g.out_dir = dir;
    g.samples_per_shard = 8;
    ASSERT_TRUE(data::WriteDataset(g).ok());
    // One bad sample in its own shard, for the skip metric.
    ASSERT_TRUE(data::WriteTar(dir + "/onevision-bad.tar",
                               {{"bad.json", "{\"text\": \"<image> x\", \"images\": [\"0.png\"]}"},
                                {"bad.0.png", ""}})
                    .ok());
    options_.shards = dir + "/*.tar";
    options_.global_batch = 4;
    options_.seed = 9;
    chassis_ = std::make_unique<Chassis>(
        testing::LocalOptions("loom-preprocess", common::v1::ROLE_PREPROCESS));
    auto service = PreprocessServiceImpl::Create(chassis_.get(), options_);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = std::move(*service);
    chassis_->AddService(service_.get(), data::v1::PreprocessService::service_full_name());
    ASSERT_TRUE(chassis_->Start().ok());
    ucx_ = *UcxWorker::Create();
    client_ = std::make_unique<DataClient>(testing::ChannelTo(*chassis_), ucx_.get());
  }

  PreprocessServiceOptions options_;
  std::unique_ptr<Chassis> chassis_;
  std::unique_ptr<PreprocessServiceImpl> service_;
  std::unique_ptr<UcxWorker> ucx_;
  std::unique_ptr<DataClient> client_;
};

// A model with a generator: the scheduler's records carry each output
// image's patches and the query positions, as scan's lines do.
TEST(ServedDataGeneratorTest, RecordsCarryOutputImages) {
  const std::string dir = testing::TempPath("gen");
  data::DatagenOptions g;
  g.preset = "generation";
  g.samples = 16;
  g.seed = 2;
  g.out_dir = dir;
  ASSERT_TRUE(data::WriteDataset(g).ok());
  PreprocessServiceOptions options;
  options.shards = dir + "/*.tar";
  options.global_batch = 16;
  options.seed = 9;
  options.model.config = "tiny-gen";
  Chassis chassis(testing::LocalOptions("loom-preprocess", common::v1::ROLE_PREPROCESS));
  auto service = PreprocessServiceImpl::Create(&chassis, options);
  ASSERT_TRUE(service.ok()) << service.status();
  chassis.AddService(service->get(), data::v1::PreprocessService::service_full_name());
  ASSERT_TRUE(chassis.Start().ok());
  auto ucx = *UcxWorker::Create();
  DataClient client(testing::ChannelTo(chassis), ucx.get());
  absl::StatusOr<data::v1::GetBatchResponse> batch = client.GetBatch(0);
  ASSERT_TRUE(batch.ok()) << batch.status();
  int with = 0;
  for (const data::v1::SampleMetadata& m : batch->samples()) {
    const auto& r = m.record();
    if (r.output_images_size() == 0) {
      EXPECT_EQ(r.query_tokens(), 0);
      continue;
    }
    ++with;
    EXPECT_EQ(r.output_images_size(), 1);
    EXPECT_EQ(r.output_images(0), 16);  // tiny-gen: 16 x 16 pictures of 4 x 4 patches
    EXPECT_EQ(r.query_tokens(), 4);
  }
  EXPECT_GT(with, 0);
  chassis.Shutdown();
}

TEST_F(ServedDataTest, BatchesFollowTheLoaderAndTensorsArriveOverUcx) {
  // The reference: the same loader in this process.
  auto tokenizer = *data::Tokenizer::Load("");
  data::LoaderOptions lo;
  lo.shards = *data::ExpandShardGlob(options_.shards);
  lo.seed = options_.seed;
  lo.preprocess = data::PreprocessOptionsFor(*ModelConfigByName("tiny"));
  auto loader = *data::DataLoader::Open(lo, tokenizer.get());
  for (int64_t it = 0; it < 3; ++it) {
    absl::StatusOr<data::v1::GetBatchResponse> batch = client_->GetBatch(it);
    ASSERT_TRUE(batch.ok()) << batch.status();
    ASSERT_EQ(batch->samples_size(), 4);
    std::vector<data::ProcessedSample> expected;
    for (int i = 0; i < 4; ++i) expected.push_back(*loader->Next());
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(batch->samples(i).record().key(), expected[i].key);
      EXPECT_EQ(batch->samples(i).record().image_tokens(), expected[i].image_tokens);
      EXPECT_EQ(batch->samples(i).record().text_tokens(), expected[i].text_tokens);
    }
    // A worker assigned samples 3 and 1.
    absl::StatusOr<std::vector<Sample>> got = client_->FetchSamples(it, {3, 1});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got)[0].tokens, expected[3].sample.tokens);
    EXPECT_EQ((*got)[0].tiles, expected[3].sample.tiles);
    EXPECT_EQ((*got)[0].num_tiles, expected[3].sample.num_tiles);
    EXPECT_EQ((*got)[1].tiles, expected[1].sample.tiles);
  }
  EXPECT_GT(ucx_->stats().bytes_received, 0);
}

TEST_F(ServedDataTest, BadRequestsGetClearCodes) {
  EXPECT_EQ(client_->FetchSamples(0, {4}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->FetchSamples(0, {1, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->GetBatch(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->GetBatch(1000).status().code(), absl::StatusCode::kFailedPrecondition);
  for (int64_t it = 0; it < 20; ++it) ASSERT_TRUE(client_->GetBatch(it).ok());
  EXPECT_EQ(client_->GetBatch(0).status().code(), absl::StatusCode::kOutOfRange);
  // Bytes that are not a UCX address.
  auto stub = data::v1::PreprocessService::NewStub(testing::ChannelTo(*chassis_));
  auto ctx = testing::ContextWithDeadline();
  data::v1::FetchSamplesRequest request;
  request.set_iteration(19);
  request.add_indices(0);
  request.set_ucx_address(ucx_->address());
  data::v1::FetchSamplesResponse response;
  // Tags: two per index, top bit clear.
  grpc::Status s = stub->FetchSamples(ctx.get(), request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("tags: want 2 per index (2), got 0"), std::string::npos)
      << s.error_message();
  request.add_tags(7);
  request.add_tags(uint64_t{1} << 63);
  s = stub->FetchSamples(testing::ContextWithDeadline().get(), request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("top bit"), std::string::npos) << s.error_message();
  request.set_tags(1, 8);
  request.set_ucx_address("garbage");
  s = stub->FetchSamples(testing::ContextWithDeadline().get(), request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("ucx_address"), std::string::npos);
  // The bad sample was counted, with its reason, on /metrics: once per epoch
  // (80 samples asked for from 25: it was met 3 times).
  absl::StatusOr<HttpResponse> metrics =
      HttpGet("127.0.0.1", chassis_->metrics_port(), "/metrics", absl::Seconds(5));
  ASSERT_TRUE(metrics.ok());
  EXPECT_NE(metrics->body.find("loom_preprocess_samples_skipped_total{reason=\"empty_image\"} 3"),
            std::string::npos)
      << metrics->body;
}

// A rewind to a batch long out of the window, from that batch's cursor,
// and one to the start (no cursor): each serves the same batches again.
TEST_F(ServedDataTest, RewindServesTheSameBatchesAgain) {
  std::vector<std::vector<std::string>> keys;
  data::v1::DataCursor cursor_of_3;
  auto stub = data::v1::PreprocessService::NewStub(testing::ChannelTo(*chassis_));
  for (int64_t it = 0; it < 24; ++it) {
    absl::StatusOr<data::v1::GetBatchResponse> batch = client_->GetBatch(it);
    ASSERT_TRUE(batch.ok()) << batch.status();
    keys.emplace_back();
    for (const auto& m : batch->samples()) keys.back().push_back(m.record().key());
    if (it == 3) {
      auto ctx = testing::ContextWithDeadline();
      data::v1::GetCursorRequest request;
      request.set_iteration(3);
      data::v1::GetCursorResponse response;
      ASSERT_TRUE(stub->GetCursor(ctx.get(), request, &response).ok());
      cursor_of_3 = response.cursor();
    }
  }
  ASSERT_EQ(client_->GetBatch(3).status().code(), absl::StatusCode::kOutOfRange);
  auto rewind = [&](int64_t start, const data::v1::DataCursor* cursor) {
    auto ctx = testing::ContextWithDeadline();
    data::v1::RewindRequest request;
    request.set_start_iteration(start);
    if (cursor != nullptr) *request.mutable_cursor() = *cursor;
    data::v1::RewindResponse response;
    return stub->Rewind(ctx.get(), request, &response);
  };
  for (const auto& [start, cursor] : std::vector<std::pair<int64_t, const data::v1::DataCursor*>>{
           {3, &cursor_of_3}, {0, nullptr}}) {
    grpc::Status s = rewind(start, cursor);
    ASSERT_TRUE(s.ok()) << s.error_message();
    for (int64_t it = start; it < start + 6; ++it) {
      absl::StatusOr<data::v1::GetBatchResponse> batch = client_->GetBatch(it);
      ASSERT_TRUE(batch.ok()) << batch.status();
      std::vector<std::string> got;
      for (const auto& m : batch->samples()) got.push_back(m.record().key());
      EXPECT_EQ(got, keys[it]) << "batch " << it << " after a rewind to " << start;
    }
  }
  // Another run's cursor is refused, naming it; so is a negative start.
  data::v1::DataCursor other = cursor_of_3;
  other.set_seed(other.seed() + 1);
  grpc::Status s = rewind(3, &other);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("cursor: cursor.seed"), std::string::npos) << s.error_message();
  EXPECT_EQ(rewind(-1, nullptr).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// The held-out set: the first validation_batches x global_batch samples of
// the validation shards in order, the same batches in every pass, read again
// from its start when a pass's batches have left the window.
TEST(ValidationBatchesTest, TheSameHeldOutBatchesEveryPass) {
  auto write = [](const std::string& name, int samples, uint64_t seed) {
    data::DatagenOptions g;
    g.preset = "onevision";
    g.samples = samples;
    g.seed = seed;
    g.out_dir = testing::TempPath(name);
    g.samples_per_shard = 8;
    EXPECT_TRUE(data::WriteDataset(g).ok());
    return g.out_dir + "/*.tar";
  };
  PreprocessServiceOptions o;
  o.shards = write("train", 16, 2);
  o.validation_shards = write("held-out", 12, 3);
  o.validation_batches = 2;
  o.global_batch = 4;
  o.retained_batches = 1;  // every pass reads the set again
  Chassis chassis(testing::LocalOptions("loom-preprocess", common::v1::ROLE_PREPROCESS));
  auto service = PreprocessServiceImpl::Create(&chassis, o);
  ASSERT_TRUE(service.ok()) << service.status();
  chassis.AddService(service->get(), data::v1::PreprocessService::service_full_name());
  ASSERT_TRUE(chassis.Start().ok());
  auto stub = data::v1::PreprocessService::NewStub(testing::ChannelTo(chassis));
  auto keys = [&](int64_t index, grpc::StatusCode* code) {
    grpc::ClientContext ctx;
    data::v1::GetBatchRequest r;
    r.set_iteration(index);
    r.set_validation(true);
    data::v1::GetBatchResponse batch;
    *code = stub->GetBatch(&ctx, r, &batch).error_code();
    std::vector<std::string> out;
    for (const auto& s : batch.samples()) out.push_back(s.record().key());
    return out;
  };
  // The reference: the validation shards read in order.
  auto tokenizer = *data::Tokenizer::Load("");
  data::LoaderOptions lo;
  lo.shards = *data::ExpandShardGlob(o.validation_shards);
  lo.shuffle = false;
  lo.preprocess = data::PreprocessOptionsFor(*ModelConfigByName("tiny"));
  auto reference = *data::DataLoader::Open(lo, tokenizer.get());
  std::vector<std::string> want;
  std::vector<data::ProcessedSample> samples;
  for (int i = 0; i < 8; ++i) {
    samples.push_back(*reference->Next());
    want.push_back(samples.back().key);
  }
  for (int pass = 0; pass < 3; ++pass) {
    std::vector<std::string> got;
    for (int64_t b = 0; b < 2; ++b) {
      grpc::StatusCode code;
      for (const std::string& k : keys(b, &code)) got.push_back(k);
      EXPECT_EQ(code, grpc::StatusCode::OK);
    }
    EXPECT_EQ(got, want) << "pass " << pass;
  }
  // Its tensors travel as a training batch's do; the training batches are
  // untouched by it.
  auto ucx = *UcxWorker::Create();
  DataClient client(testing::ChannelTo(chassis), ucx.get());
  absl::StatusOr<std::vector<Sample>> got =
      client.FetchSamples(1, {2, 0}, /*tokens_only=*/false, /*validation=*/true);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].tokens, samples[6].sample.tokens);
  EXPECT_EQ((*got)[1].tiles, samples[4].sample.tiles);
  absl::StatusOr<data::v1::GetBatchResponse> train = client.GetBatch(0);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_NE(train->samples(0).record().key(), want[0]);
  grpc::StatusCode code;
  keys(2, &code);
  EXPECT_EQ(code, grpc::StatusCode::INVALID_ARGUMENT) << "only 2 validation batches";
  grpc::ClientContext ctx;
  data::v1::GetInfoResponse info;
  ASSERT_TRUE(stub->GetInfo(&ctx, data::v1::GetInfoRequest(), &info).ok());
  EXPECT_EQ(info.validation_batches(), 2);
  EXPECT_EQ(info.dataset_samples(), 16);
  chassis.Shutdown();
  // A set that cannot fill its batches is refused at start, not wrapped.
  o.validation_batches = 4;  // 16 samples of the 12
  Chassis other(testing::LocalOptions("loom-preprocess", common::v1::ROLE_PREPROCESS));
  absl::Status refused = PreprocessServiceImpl::Create(&other, o).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("--validation_shards: 12 samples, fewer than"),
            std::string::npos)
      << refused;
}

}  // namespace
}  // namespace loom
