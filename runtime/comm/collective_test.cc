#include "runtime/comm/collective.h"

#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"
#include "runtime/comm/comm_testing.h"

namespace loom {
namespace {

using testing::OnRanks;

TEST(Gloo, AllreduceSumsAndEveryRankGetsTheSameBits) {
  for (int size : {1, 2, 3}) {
    InMemoryStore store;
    const int64_t n = 100003;  // not a multiple of the ring's chunking
    std::vector<std::vector<float>> out(size);
    std::vector<double> scalars(size);
    OnRanks(size, "g" + std::to_string(size), &store, [&](int r, Communicator* c) {
      std::vector<float> v(n);
      for (int64_t i = 0; i < n; ++i) v[i] = 0.1f * static_cast<float>((i * 7 + r * 13) % 101);
      ASSERT_TRUE(c->AllreduceSum(v.data(), n).ok());
      out[r] = v;
      double d[2] = {1.0 + r, 0.5};
      ASSERT_TRUE(c->AllreduceSum(d, 2).ok());
      scalars[r] = d[0] + d[1];
    });
    for (int64_t i = 0; i < n; i += 997) {
      double want = 0;
      for (int r = 0; r < size; ++r) want += 0.1f * static_cast<float>((i * 7 + r * 13) % 101);
      const testing::Tolerance tol = testing::kAllreduceSumF32;
      EXPECT_NEAR(out[0][i], want, tol.atol + tol.rtol * std::abs(want)) << i << ": " << tol.reason;
    }
    for (int r = 1; r < size; ++r) {
      EXPECT_EQ(out[r], out[0]) << "rank " << r << " differs from rank 0";
      EXPECT_EQ(scalars[r], scalars[0]);
    }
    EXPECT_DOUBLE_EQ(scalars[0], size * (size + 1) / 2.0 + 0.5 * size);
  }
}

// A distributed optimizer's halves: each rank's chunk after a reduce-scatter
// has the all-reduce's bits there; an all-gather brings every rank's chunk to
// every rank, under Gloo's ring and under the base class's fallback (an
// all-reduce of zeros and one chunk), for lengths shorter than the group too.
TEST(Gloo, ReduceScatterGivesTheAllreducesChunkAndAllGatherEveryChunk) {
  // The base class's AllGather over a Gloo group's AllreduceSum.
  class Fallback final : public Communicator {
   public:
    explicit Fallback(Communicator* inner) : inner_(inner) {}
    int rank() const override { return inner_->rank(); }
    int size() const override { return inner_->size(); }
    absl::Status AllreduceSum(float* d, int64_t n) override { return inner_->AllreduceSum(d, n); }
    absl::Status AllreduceSum(double* d, int64_t n) override { return inner_->AllreduceSum(d, n); }
    absl::Status AllreduceMax(float* d, int64_t n) override { return inner_->AllreduceMax(d, n); }

   private:
    Communicator* inner_;
  };
  for (int size : {1, 2, 3, 4}) {
    for (int64_t n : {int64_t{2}, int64_t{10007}}) {
      InMemoryStore store;
      auto value = [](int r, int64_t i) {
        return 0.1f * static_cast<float>((i * 7 + r * 13) % 101);
      };
      OnRanks(size, "rs" + std::to_string(size), &store, [&](int r, Communicator* c) {
        std::vector<float> all(n), scattered(n), mine(n, -1.0f), fallback(n, -2.0f);
        for (int64_t i = 0; i < n; ++i) all[i] = scattered[i] = value(r, i);
        ASSERT_TRUE(c->AllreduceSum(all.data(), n).ok());
        ASSERT_TRUE(c->ReduceScatterSum(scattered.data(), n).ok());
        const auto [begin, end] = ChunkRange(n, r, size);
        for (int64_t i = begin; i < end; ++i) {
          ASSERT_EQ(scattered[i], all[i]) << "rank " << r << " element " << i;
        }
        // Each rank's chunk: its rank number plus the element's index.
        for (int64_t i = begin; i < end; ++i) {
          mine[i] = fallback[i] = static_cast<float>(r) + 0.001f * static_cast<float>(i);
        }
        ASSERT_TRUE(c->AllGather(mine.data(), n).ok());
        Fallback f(c);
        ASSERT_TRUE(f.AllGather(fallback.data(), n).ok());
        for (int owner = 0; owner < size; ++owner) {
          const auto [b, e] = ChunkRange(n, owner, size);
          for (int64_t i = b; i < e; ++i) {
            const float want = static_cast<float>(owner) + 0.001f * static_cast<float>(i);
            ASSERT_EQ(mine[i], want) << "rank " << r << " element " << i;
            ASSERT_EQ(fallback[i], want) << "rank " << r << " element " << i;
          }
        }
      });
    }
  }
}

TEST(Gloo, TwoGroupsInOneStoreStayApart) {
  InMemoryStore store;
  std::vector<float> a(2), b(2);
  std::thread t1([&] {
    OnRanks(2, "encoder", &store, [&](int r, Communicator* c) {
      float v = 1.0f;
      ASSERT_TRUE(c->AllreduceSum(&v, 1).ok());
      a[r] = v;
    });
  });
  std::thread t2([&] {
    OnRanks(2, "llm", &store, [&](int r, Communicator* c) {
      float v = 10.0f;
      ASSERT_TRUE(c->AllreduceSum(&v, 1).ok());
      b[r] = v;
    });
  });
  t1.join();
  t2.join();
  EXPECT_EQ(a, std::vector<float>({2.0f, 2.0f}));
  EXPECT_EQ(b, std::vector<float>({20.0f, 20.0f}));
}

// A store that counts what it was given, to show the rendezvous used it.
class CountingStore final : public KeyValueStore {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    sets_.fetch_add(1);
    return store_.Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    return store_.Get(key, timeout);
  }
  absl::Status Delete(const std::vector<std::string>& keys) override {
    deletes_.fetch_add(static_cast<int>(keys.size()));
    return store_.Delete(keys);
  }
  int sets() const { return sets_.load(); }
  int deletes() const { return deletes_.load(); }
  size_t size() { return store_.size(); }

 private:
  InMemoryStore store_;
  std::atomic<int> sets_{0}, deletes_{0};
};

TEST(Gloo, AConnectedGroupLeavesNoKeysInTheStore) {
  for (int size : {2, 5}) {
    CountingStore store;
    std::vector<std::thread> threads;
    std::vector<float> sums(size);
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        GlooOptions o;
        o.prefix = "g";
        o.rank = r;
        o.size = size;
        o.host = "127.0.0.1";
        o.timeout = absl::Seconds(20);
        absl::StatusOr<std::unique_ptr<Communicator>> c = ConnectGloo(&store, o);
        ASSERT_TRUE(c.ok()) << c.status();
        float v = 1;
        ASSERT_TRUE((*c)->AllreduceSum(&v, 1).ok());  // still connected without its keys
        sums[r] = v;
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_GE(store.sets(), size) << "the rendezvous set no keys";
    EXPECT_EQ(store.deletes(), store.sets()) << "each rank deletes what it set";
    EXPECT_EQ(store.size(), 0u);
    EXPECT_EQ(sums, std::vector<float>(size, static_cast<float>(size)));
  }
}

TEST(Gloo, BadRankAndMissingPeerAreErrors) {
  InMemoryStore store;
  GlooOptions o;
  o.prefix = "x";
  o.rank = 2;
  o.size = 2;
  EXPECT_EQ(ConnectGloo(&store, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.rank = 0;
  o.host = "127.0.0.1";
  o.timeout = absl::Milliseconds(300);  // rank 1 never comes
  absl::StatusOr<std::unique_ptr<Communicator>> c = ConnectGloo(&store, o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("cannot connect"), std::string::npos) << c.status();
}

// A rank blocked in a collective whose peer never comes (a lost worker, a
// partition) is released by a Cancellation long before the timeout, the
// communicator stays unusable, and the peer that comes late fails too.
TEST(Gloo, ACancellationEndsABlockedAllreduceAndTheRendezvous) {
  InMemoryStore store;
  Cancellation cancel;
  std::vector<std::unique_ptr<Communicator>> comms(2);
  std::vector<std::thread> connecting;
  for (int r = 0; r < 2; ++r) {
    connecting.emplace_back([&, r] {
      GlooOptions o;
      o.prefix = "c";
      o.rank = r;
      o.size = 2;
      o.host = "127.0.0.1";
      o.timeout = absl::Seconds(600);  // a test that passes did not wait for it
      if (r == 0) o.cancel = &cancel;
      absl::StatusOr<std::unique_ptr<Communicator>> c = ConnectGloo(&store, o);
      ASSERT_TRUE(c.ok()) << c.status();
      comms[r] = std::move(*c);
    });
  }
  for (std::thread& t : connecting) t.join();
  ASSERT_TRUE(comms[0] && comms[1]);

  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(300));
    cancel.Cancel();
  });
  std::vector<float> v(1000, 1.0f);
  absl::Status blocked = comms[0]->AllreduceSum(v.data(), 1000);  // rank 1 never joins it
  canceller.join();
  EXPECT_EQ(blocked.code(), absl::StatusCode::kCancelled) << blocked;
  EXPECT_EQ(comms[0]->AllreduceSum(v.data(), 1000).code(), absl::StatusCode::kFailedPrecondition);
  // Rank 0 closed its sockets: the late peer fails instead of waiting.
  EXPECT_EQ(comms[1]->AllreduceSum(v.data(), 1000).code(), absl::StatusCode::kUnavailable);

  // A rendezvous whose peer never comes ends too, named as cancelled.
  GlooOptions o;
  o.prefix = "never";
  o.size = 2;
  o.host = "127.0.0.1";
  o.timeout = absl::Seconds(600);
  o.cancel = &cancel;  // still cancelled
  EXPECT_EQ(ConnectGloo(&store, o).status().code(), absl::StatusCode::kCancelled);
  cancel.Clear();
  std::thread later([&] {
    absl::SleepFor(absl::Milliseconds(300));
    cancel.Cancel();
  });
  absl::StatusOr<std::unique_ptr<Communicator>> c = ConnectGloo(&store, o);
  later.join();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kCancelled) << c.status();
}

}  // namespace
}  // namespace loom
