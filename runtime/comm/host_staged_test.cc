#include "runtime/comm/host_staged.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/comm/comm_testing.h"

namespace loom {
namespace {

// A device whose memory the host cannot read as numbers: every byte is
// stored XOR 0x5A, so a collective handed device memory directly (not
// staged) reduces garbage. Copies in and out translate.
class ScrambledDevice final : public Backend {
 public:
  Device device() const override { return Device{DeviceType::kCuda, 0}; }
  const char* name() const override { return "scrambled"; }
  void* Allocate(size_t bytes) override { return ::operator new(bytes == 0 ? 1 : bytes); }
  void Free(void* ptr) override { ::operator delete(ptr); }
  void CopyFromHost(void* dst, const void* src, size_t bytes) override { Xor(dst, src, bytes); }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    EXPECT_TRUE(synced_) << "copied to the host before the queued work finished";
    Xor(dst, src, bytes);
  }
  void Fill(void* dst, int byte, size_t bytes) override { std::memset(dst, byte ^ 0x5A, bytes); }
  void Copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void Synchronize() override { synced_ = true; }
  bool SupportsOp(std::string_view) const override { return false; }

  // A device buffer holding `host`.
  template <typename T>
  T* Upload(const std::vector<T>& host) {
    T* d = static_cast<T*>(Allocate(sizeof(T) * host.size()));
    CopyFromHost(d, host.data(), sizeof(T) * host.size());
    synced_ = false;  // as if kernels were queued after it
    return d;
  }
  template <typename T>
  std::vector<T> Download(const T* d, size_t n) {
    std::vector<T> host(n);
    synced_ = true;
    CopyToHost(host.data(), d, sizeof(T) * n);
    return host;
  }

 private:
  static void Xor(void* dst, const void* src, size_t bytes) {
    auto* out = static_cast<unsigned char*>(dst);
    const auto* in = static_cast<const unsigned char*>(src);
    for (size_t i = 0; i < bytes; ++i) out[i] = in[i] ^ 0x5A;
  }
  bool synced_ = false;
};

TEST(HostStaged, ReducesDeviceBuffersThroughTheHostGroup) {
  constexpr int kSize = 3;
  constexpr int64_t n = 1001;
  InMemoryStore store;
  std::vector<std::vector<float>> sums(kSize), maxes(kSize);
  std::vector<std::vector<double>> doubles(kSize);
  testing::OnRanks(kSize, "staged", &store, [&](int r, Communicator* gloo) {
    ScrambledDevice device;
    HostStagedCommunicator c(gloo, &device);
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), kSize);
    std::vector<float> v(n), m(n);
    for (int64_t i = 0; i < n; ++i) {
      v[i] = static_cast<float>((i % 17) * (r + 1));  // exact in float
      m[i] = static_cast<float>((i + 5 * r) % 11);
    }
    float* dv = device.Upload(v);
    ASSERT_TRUE(c.AllreduceSum(dv, n).ok());
    sums[r] = device.Download(dv, n);
    float* dm = device.Upload(m);
    ASSERT_TRUE(c.AllreduceMax(dm, n).ok());
    maxes[r] = device.Download(dm, n);
    double* dd = device.Upload(std::vector<double>{0.5 + r, -1.0 * r});
    ASSERT_TRUE(c.AllreduceSum(dd, 2).ok());
    doubles[r] = device.Download(dd, 2);
    for (void* p : {static_cast<void*>(dv), static_cast<void*>(dm), static_cast<void*>(dd)}) {
      device.Free(p);
    }
  });
  for (int r = 0; r < kSize; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(sums[r][i], static_cast<float>((i % 17) * 6)) << "rank " << r << " at " << i;
      float want = 0;
      for (int q = 0; q < kSize; ++q) want = std::max(want, static_cast<float>((i + 5 * q) % 11));
      ASSERT_EQ(maxes[r][i], want) << "rank " << r << " at " << i;
    }
    EXPECT_EQ(doubles[r], (std::vector<double>{4.5, -3.0})) << "rank " << r;
  }
}

// A reduce-scatter and an all-gather (sequence parallelism's, ZeRO-1's) of
// device buffers: each rank's chunk summed, every chunk gathered, through
// the host group's own; chunks of uneven length.
TEST(HostStaged, ReduceScattersAndAllGathersDeviceBuffers) {
  constexpr int kSize = 3;
  constexpr int64_t n = 1001;
  InMemoryStore store;
  std::vector<std::vector<float>> scattered(kSize), gathered(kSize);
  testing::OnRanks(kSize, "staged-chunks", &store, [&](int r, Communicator* gloo) {
    ScrambledDevice device;
    HostStagedCommunicator c(gloo, &device);
    std::vector<float> v(n), own(n, -1.0f);
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i % 13) * (r + 1));
    const auto [begin, end] = ChunkRange(n, r, kSize);
    for (int64_t i = begin; i < end; ++i) own[i] = static_cast<float>(r * 10000 + i);
    float* dv = device.Upload(v);
    ASSERT_TRUE(c.ReduceScatterSum(dv, n).ok());
    scattered[r] = device.Download(dv, n);
    float* dg = device.Upload(own);
    ASSERT_TRUE(c.AllGather(dg, n).ok());
    gathered[r] = device.Download(dg, n);
    device.Free(dv);
    device.Free(dg);
  });
  for (int r = 0; r < kSize; ++r) {
    const auto [begin, end] = ChunkRange(n, r, kSize);
    for (int64_t i = begin; i < end; ++i) {
      ASSERT_EQ(scattered[r][i], static_cast<float>((i % 13) * 6)) << "rank " << r << " at " << i;
    }
    for (int q = 0; q < kSize; ++q) {
      const auto [b, e] = ChunkRange(n, q, kSize);
      for (int64_t i = b; i < e; ++i) {
        ASSERT_EQ(gathered[r][i], static_cast<float>(q * 10000 + i)) << "rank " << r << " at " << i;
      }
    }
  }
}

// A host group that fails (a peer gone): the error comes back and nothing
// is copied up.
class FailingGroup final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  absl::Status AllreduceSum(float* data, int64_t n) override { return Fail(data, n); }
  absl::Status AllreduceSum(double* data, int64_t n) override { return Fail(data, n); }
  absl::Status AllreduceMax(float* data, int64_t n) override { return Fail(data, n); }

 private:
  template <typename T>
  absl::Status Fail(T* data, int64_t n) {
    for (int64_t i = 0; i < n; ++i) data[i] = T(-7);  // what a half-done ring leaves
    return absl::UnavailableError("peer gone");
  }
};

TEST(HostStaged, AFailedReductionIsReportedAndLeavesTheDeviceBuffer) {
  ScrambledDevice device;
  FailingGroup group;
  HostStagedCommunicator c(&group, &device);
  float* d = device.Upload(std::vector<float>{1, 2, 3});
  absl::Status s = c.AllreduceSum(d, 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(device.Download(d, 3), (std::vector<float>{1, 2, 3}));
  device.Free(d);
}

}  // namespace
}  // namespace loom
