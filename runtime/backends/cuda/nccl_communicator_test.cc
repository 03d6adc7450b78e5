#include "runtime/backends/cuda/nccl_communicator.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/backends/cuda/cuda_backend.h"
#include "runtime/backends/cuda/device.h"
#include "runtime/backends/cuda/gpu_testing.h"
#include "runtime/comm/collective.h"

namespace loom {
namespace {

NcclOptions Options(int rank, int size, absl::Duration timeout = absl::Seconds(30)) {
  NcclOptions o;
  o.prefix = "g0-llm-dp";
  o.rank = rank;
  o.size = size;
  o.device = rank;
  o.timeout = timeout;
  return o;
}

// The rendezvous is the same code with or without CUDA.
TEST(NcclRendezvousTest, RankZeroPublishesTheIdAndEveryRankReadsIt) {
  InMemoryStore store;
  const std::string id(kNcclIdBytes, '\x5a');
  std::vector<absl::StatusOr<std::string>> got(4, absl::UnknownError("not run"));
  std::vector<std::thread> ranks;
  for (int r = 3; r >= 0; --r) {  // the readers first: they wait for rank 0
    ranks.emplace_back([&, r] { got[r] = ShareNcclId(&store, Options(r, 4), [&] { return id; }); });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(got[r].ok()) << "rank " << r << ": " << got[r].status();
    EXPECT_EQ(*got[r], id) << "rank " << r;
  }
  EXPECT_EQ(*store.Get("g0-llm-dp/nccl-id", absl::ZeroDuration()), id);
}

TEST(NcclRendezvousTest, BadValuesTimeoutsAndCancelsAreClearErrors) {
  InMemoryStore store;
  ASSERT_TRUE(store.Set("g0-llm-dp/nccl-id", "short").ok());
  absl::StatusOr<std::string> got = ShareNcclId(&store, Options(1, 2), nullptr);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("5 bytes, not an ncclUniqueId"), std::string::npos)
      << got.status();

  InMemoryStore empty;
  got = ShareNcclId(&empty, Options(1, 2, absl::Milliseconds(300)), nullptr);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  EXPECT_NE(got.status().message().find("\"g0-llm-dp/nccl-id\" not set within 300ms"),
            std::string::npos)
      << got.status();

  Cancellation cancel;
  NcclOptions o = Options(1, 2, absl::Seconds(60));
  o.cancel = &cancel;
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(100));
    cancel.Cancel();
  });
  const absl::Time t0 = absl::Now();
  got = ShareNcclId(&empty, o, nullptr);
  canceller.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled) << got.status();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(30));

  for (auto [rank, size] : {std::pair{2, 2}, std::pair{-1, 2}, std::pair{0, 0}}) {
    got = ShareNcclId(&empty, Options(rank, size), [] { return std::string(kNcclIdBytes, 'x'); });
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
  }
}

TEST(NcclCommunicatorTest, WithoutCudaItSaysSo) {
  if (cuda::CompiledWithCuda()) GTEST_SKIP() << "built with CUDA";
  InMemoryStore store;
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> c = ConnectNccl(&store, Options(0, 1));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << c.status();
}

// Device buffers through the CUDA backend.
struct DeviceFloats {
  DeviceFloats(Backend* b, const std::vector<float>& host) : b(b), n(host.size()) {
    p = b->Allocate(n * sizeof(float));
    b->CopyFromHost(p, host.data(), n * sizeof(float));
  }
  ~DeviceFloats() { b->Free(p); }
  std::vector<float> Host() const {
    std::vector<float> out(n);
    b->CopyToHost(out.data(), p, n * sizeof(float));
    return out;
  }
  Backend* b;
  size_t n;
  void* p;
};

TEST(NcclCommunicatorTest, OneRankReducesToItselfAndRefusesItselfAsAPeer) {
  absl::StatusOr<std::unique_ptr<Backend>> b = MakeCudaBackend(0);
  LOOM_REQUIRE_GPU_OR_SKIP(b.ok(), b.status());
  InMemoryStore store;
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> c = ConnectNccl(&store, Options(0, 1));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(store.size(), 0u);  // the id is gone once the group is up
  std::vector<float> host(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = 0.25f * static_cast<float>(i) - 7.0f;
  DeviceFloats d(b->get(), host);
  ASSERT_TRUE((*c)->AllreduceSum(static_cast<float*>(d.p), 1000).ok());
  EXPECT_EQ(d.Host(), host);
  ASSERT_TRUE((*c)->AllreduceMax(static_cast<float*>(d.p), 1000).ok());
  EXPECT_EQ(d.Host(), host);
  EXPECT_EQ((*c)->Send(d.p, 16, 0).code(), absl::StatusCode::kInvalidArgument);
}

// A group whose other rank never comes: the initialisation ends at the
// timeout (the communicator is aborted), it does not hang.
TEST(NcclCommunicatorTest, AMissingRankEndsTheInitialisationAtTheTimeout) {
  absl::StatusOr<std::unique_ptr<Backend>> b = MakeCudaBackend(0);
  LOOM_REQUIRE_GPU_OR_SKIP(b.ok(), b.status());
  InMemoryStore store;
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> c =
      ConnectNccl(&store, Options(0, 2, absl::Seconds(3)));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded) << c.status();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(60));
  EXPECT_EQ(store.size(), 0u);  // the dead group's id is gone: a retry draws a new one
}

// A cancel (a recovery) ends the communicator: the next collective is
// CANCELLED without being queued, and every later one FAILED_PRECONDITION.
TEST(NcclCommunicatorTest, ACancelEndsTheCommunicator) {
  absl::StatusOr<std::unique_ptr<Backend>> b = MakeCudaBackend(0);
  LOOM_REQUIRE_GPU_OR_SKIP(b.ok(), b.status());
  InMemoryStore store;
  Cancellation cancel;
  NcclOptions o = Options(0, 1);
  o.cancel = &cancel;
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> c = ConnectNccl(&store, o);
  ASSERT_TRUE(c.ok()) << c.status();
  DeviceFloats d(b->get(), std::vector<float>(64, 1.0f));
  ASSERT_TRUE((*c)->AllreduceSum(static_cast<float*>(d.p), 64).ok());
  cancel.Cancel();
  EXPECT_EQ((*c)->AllreduceSum(static_cast<float*>(d.p), 64).code(), absl::StatusCode::kCancelled);
  cancel.Clear();
  EXPECT_EQ((*c)->AllreduceSum(static_cast<float*>(d.p), 64).code(),
            absl::StatusCode::kFailedPrecondition);
}

// Ranks on devices 0..n-1 (NCCL takes one rank per device): sums and
// maxima over the group, and a send/receive between two ranks.
TEST(NcclCommunicatorTest, RanksOnTwoDevicesReduceAndExchange) {
  absl::StatusOr<std::unique_ptr<Backend>> first = MakeCudaBackend(0);
  LOOM_REQUIRE_GPU_OR_SKIP(first.ok(), first.status());
  if (cuda::DeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs (" << cuda::DeviceCount() << ")";
  InMemoryStore store;
  std::vector<absl::Status> results(2);
  std::vector<std::vector<float>> sums(2), maxima(2), received(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Backend>> b = MakeCudaBackend(r);
      if (!b.ok()) return void(results[r] = b.status());
      absl::StatusOr<std::unique_ptr<NcclCommunicator>> c = ConnectNccl(&store, Options(r, 2));
      if (!c.ok()) return void(results[r] = c.status());
      std::vector<float> host(4096);
      for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i % 97) * (r + 1);
      DeviceFloats sum(b->get(), host), max(b->get(), host), buf(b->get(), host);
      absl::Status s = (*c)->AllreduceSum(static_cast<float*>(sum.p), 4096);
      if (s.ok()) s = (*c)->AllreduceMax(static_cast<float*>(max.p), 4096);
      if (s.ok()) s = r == 0 ? (*c)->Send(buf.p, 4096 * 4, 1) : (*c)->Recv(buf.p, 4096 * 4, 0);
      results[r] = s;
      sums[r] = sum.Host();
      maxima[r] = max.Host();
      received[r] = buf.Host();
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
    for (size_t i = 0; i < 4096; ++i) {
      EXPECT_EQ(sums[r][i], static_cast<float>(i % 97) * 3) << r << " " << i;
      EXPECT_EQ(maxima[r][i], static_cast<float>(i % 97) * 2) << r << " " << i;
      EXPECT_EQ(received[r][i], static_cast<float>(i % 97)) << r << " " << i;  // rank 0's
    }
  }
}

// Two pipeline stages sending to each other at once (activations one way,
// gradients the other, a communicator each way), each before it receives:
// sends that waited for their receivers would wait for each other; queued
// ones do not. Each rank's messages arrive in the order sent.
TEST(NcclCommunicatorTest, QueuedSendsCrossWithoutWaitingForTheirReceivers) {
  absl::StatusOr<std::unique_ptr<Backend>> first = MakeCudaBackend(0);
  LOOM_REQUIRE_GPU_OR_SKIP(first.ok(), first.status());
  if (cuda::DeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs (" << cuda::DeviceCount() << ")";
  constexpr int kMessages = 3, kFloats = 2048;
  InMemoryStore store;
  std::vector<absl::Status> results(2);
  std::vector<std::vector<std::vector<float>>> received(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Backend>> b = MakeCudaBackend(r);
      if (!b.ok()) return void(results[r] = b.status());
      // Rank 0 sends on the first communicator, rank 1 on the second.
      std::unique_ptr<NcclCommunicator> c[2];
      for (int k = 0; k < 2; ++k) {
        NcclOptions o = Options(r, 2, absl::Seconds(20));
        o.prefix = k == 0 ? "g0-llm-act-pp0" : "g0-llm-grad-pp0";
        absl::StatusOr<std::unique_ptr<NcclCommunicator>> made = ConnectNccl(&store, o);
        if (!made.ok()) return void(results[r] = made.status());
        c[k] = *std::move(made);
      }
      NcclCommunicator* sends = c[r].get();
      NcclCommunicator* receives = c[1 - r].get();
      std::vector<std::unique_ptr<DeviceFloats>> out, in;
      absl::Status s;
      for (int m = 0; s.ok() && m < kMessages; ++m) {
        out.push_back(std::make_unique<DeviceFloats>(
            b->get(), std::vector<float>(kFloats, static_cast<float>(100 * r + m))));
        s = sends->SendAsync(out.back()->p, kFloats * sizeof(float), 1 - r);
      }
      for (int m = 0; s.ok() && m < kMessages; ++m) {
        in.push_back(std::make_unique<DeviceFloats>(b->get(), std::vector<float>(kFloats, -1)));
        s = receives->Recv(in.back()->p, kFloats * sizeof(float), 1 - r);
      }
      if (s.ok()) s = sends->SendsDone();
      results[r] = s;
      for (const auto& d : in) received[r].push_back(d->Host());
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
    ASSERT_EQ(received[r].size(), static_cast<size_t>(kMessages));
    for (int m = 0; m < kMessages; ++m) {
      EXPECT_EQ(received[r][m], std::vector<float>(kFloats, static_cast<float>(100 * (1 - r) + m)))
          << "rank " << r << " message " << m;
    }
  }
}

// A distributed optimizer's halves over three ranks and an odd length (the
// chunks differ by one element): each rank's chunk after the reduce-scatter
// is the sum; the all-gather gives every rank every rank's chunk.
TEST(NcclCommunicatorTest, ReduceScatterAndAllGatherMoveUnevenChunks) {
  absl::StatusOr<std::unique_ptr<Backend>> first = MakeCudaBackend(0);
  LOOM_REQUIRE_GPU_OR_SKIP(first.ok(), first.status());
  constexpr int kRanks = 3;
  if (cuda::DeviceCount() < kRanks) {
    GTEST_SKIP() << "needs " << kRanks << " GPUs (" << cuda::DeviceCount() << ")";
  }
  constexpr int64_t n = 1001;
  InMemoryStore store;
  std::vector<absl::Status> results(kRanks);
  std::vector<std::vector<float>> scattered(kRanks), gathered(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      absl::StatusOr<std::unique_ptr<Backend>> b = MakeCudaBackend(r);
      if (!b.ok()) return void(results[r] = b.status());
      absl::StatusOr<std::unique_ptr<NcclCommunicator>> c = ConnectNccl(&store, Options(r, kRanks));
      if (!c.ok()) return void(results[r] = c.status());
      std::vector<float> values(n), own(n, -1.0f);
      for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(i % 89) * (r + 1);
      const auto [begin, end] = ChunkRange(n, r, kRanks);
      for (int64_t i = begin; i < end; ++i) own[i] = static_cast<float>(r * 10000 + i);
      DeviceFloats rs(b->get(), values), ag(b->get(), own);
      absl::Status s = (*c)->ReduceScatterSum(static_cast<float*>(rs.p), n);
      if (s.ok()) s = (*c)->AllGather(static_cast<float*>(ag.p), n);
      results[r] = s;
      scattered[r] = rs.Host();
      gathered[r] = ag.Host();
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r];
    const auto [begin, end] = ChunkRange(n, r, kRanks);
    for (int64_t i = begin; i < end; ++i) {
      EXPECT_EQ(scattered[r][i], static_cast<float>(i % 89) * 6) << r << " " << i;
    }
    for (int owner = 0; owner < kRanks; ++owner) {
      const auto [b, e] = ChunkRange(n, owner, kRanks);
      for (int64_t i = b; i < e; ++i) {
        EXPECT_EQ(gathered[r][i], static_cast<float>(owner * 10000 + i)) << r << " " << i;
      }
    }
  }
}

}  // namespace
}  // namespace loom
