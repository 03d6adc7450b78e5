// The CUDA emulation's semantics (emu.h), with kernels written as for nvcc.
#include "emu.h"

#include <cblas.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cublas_v2.h"
#include "gtest/gtest.h"
#include "nccl.h"

namespace loom::cuda_emu {
namespace {

#define LAUNCH(kernel, grid, block, ...) \
  Launch(#kernel, dim3(grid), dim3(block), 0, nullptr, kernel, __VA_ARGS__)

template <typename T>
class Dev {
 public:
  explicit Dev(const std::vector<T>& h) : n_(h.size()) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), sizeof(T) * n_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p_, h.data(), sizeof(T) * n_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p_); }
  T* get() { return p_; }
  std::vector<T> Host() const {
    std::vector<T> h(n_);
    EXPECT_EQ(cudaMemcpy(h.data(), p_, sizeof(T) * n_, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// A block sum as the kernels do it: warp shuffles, then shared memory.
__global__ void BlockSums(const int* x, int* out) {
  __shared__ int partial[32];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  int v = x[i];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    int s = 0;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) s += partial[w];
    out[blockIdx.x] = s;
  }
}

TEST(CudaEmulationTest, ShufflesAndBarriersSumEveryBlock) {
  std::vector<int> x(4 * 256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<int>(i * 7 % 1000);
  Dev<int> dx(x), out(std::vector<int>(4));
  LAUNCH(BlockSums, 4, 256, dx.get(), out.get());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<int> got = out.Host();
  for (int b = 0; b < 4; ++b) {
    int want = 0;
    for (int t = 0; t < 256; ++t) want += x[b * 256 + t];
    EXPECT_EQ(got[b], want) << "block " << b;
  }
}

__global__ void Shuffles(int* out) {
  const int lane = threadIdx.x;
  out[lane] = __shfl_down_sync(0xffffffff, lane, 3);
  out[32 + lane] = __shfl_up_sync(0xffffffff, lane, 5);
  out[64 + lane] = __shfl_sync(0xffffffff, lane * 10, 7);
  out[96 + lane] = __shfl_xor_sync(0xffffffff, lane, 1, 8);
  out[128 + lane] = static_cast<int>(__ballot_sync(0xffffffff, lane % 3 == 0));
}

TEST(CudaEmulationTest, ShufflesFollowCudasLaneRules) {
  Dev<int> out(std::vector<int>(160));
  LAUNCH(Shuffles, 1, 32, out.get());
  const std::vector<int> got = out.Host();
  unsigned ballot = 0;
  for (int l = 0; l < 32; l += 3) ballot |= 1u << l;
  for (int l = 0; l < 32; ++l) {
    EXPECT_EQ(got[l], l + 3 < 32 ? l + 3 : l) << l;  // past the end: own value
    EXPECT_EQ(got[32 + l], l >= 5 ? l - 5 : l) << l;
    EXPECT_EQ(got[64 + l], 70) << l;
    EXPECT_EQ(got[96 + l], l ^ 1) << l;
    EXPECT_EQ(static_cast<unsigned>(got[128 + l]), ballot) << l;
  }
}

// Each thread reads its neighbour's shared value: right with the barrier,
// stale without it (threads run in a shuffled order, as warps may).
template <bool kBarrier>
__global__ void Neighbours(int* out) {
  int* s = static_cast<int*>(DynamicShared());
  const int t = threadIdx.x;
  s[t] = t;
  if (kBarrier) __syncthreads();
  out[t] = s[(t + 1) % blockDim.x];
}

TEST(CudaEmulationTest, AMissingBarrierReadsStaleSharedMemory) {
  for (bool barrier : {true, false}) {
    Dev<int> out(std::vector<int>(128, 0));
    Launch("Neighbours", dim3(1), dim3(128), 128 * sizeof(int), nullptr,
           barrier ? Neighbours<true> : Neighbours<false>, out.get());
    const std::vector<int> got = out.Host();
    int right = 0;
    for (int t = 0; t < 128; ++t) right += got[t] == (t + 1) % 128;
    if (barrier) {
      EXPECT_EQ(right, 128);
    } else {
      EXPECT_LT(right, 128) << "every read came after its write: no race shown";
      EXPECT_GT(right, 0);
    }
  }
}

__global__ void EarlyExitThenBarrier(int* out) {
  if (threadIdx.x < 16) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

// Death tests fork: the child re-runs the test, as other threads (OpenBLAS's)
// exist.
TEST(CudaEmulationDeathTest, ABarrierNotEveryThreadReachesEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Dev<int> out(std::vector<int>(64));
  EXPECT_DEATH(LAUNCH(EarlyExitThenBarrier, 1, 64, out.get()),
               "kernel EarlyExitThenBarrier, block \\(0,0,0\\) of \\(1,1,1\\), 64 threads: a "
               "barrier that not every thread reaches: 48 threads wait at __syncthreads, 0 at a "
               "warp operation, 16 have returned");
}

__global__ void Nothing(int) {}

TEST(CudaEmulationTest, LaunchLimitsAreConfigurationErrors) {
  (void)cudaGetLastError();
  LAUNCH(Nothing, 1, 2048, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read once, as CUDA
  LAUNCH(Nothing, dim3(1, 70000), 32, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  LAUNCH(Nothing, 0, 32, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  Launch("Nothing", dim3(1), dim3(32), 64 << 10, nullptr, Nothing, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
}

__global__ void AtomicSum(const float* x, float* sum, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(sum, x[i]);
}

// Float atomics add in the schedule's order: two schedules give different
// bits, as two runs on a GPU do. (Loom's kernels must not depend on them
// where results must be reproducible.)
TEST(CudaEmulationTest, FloatAtomicsDependOnTheSchedule) {
  std::vector<float> x(4096);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 2 ? 1e-3f : 1e3f) * (1.0f + i * 1e-4f);
  Dev<float> dx(x);
  std::vector<float> sums;
  for (uint64_t seed : {1, 2, 1}) {
    SetScheduleSeed(seed);
    Dev<float> sum(std::vector<float>(1, 0.0f));
    LAUNCH(AtomicSum, 64, 64, dx.get(), sum.get(), 4096);
    sums.push_back(sum.Host()[0]);
  }
  SetScheduleSeed(1);
  EXPECT_NE(sums[0], sums[1]);
  EXPECT_NEAR(sums[0], sums[1], 1e-3f * std::abs(sums[0]));
}

TEST(CudaEmulationTest, CopiesAndFreesOutsideDeviceMemoryAreErrors) {
  std::vector<float> host(16, 1.0f);
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 8 * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, host.data(), 8 * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, host.data(), 9 * sizeof(float), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);  // past the allocation's end
  EXPECT_EQ(cudaMemcpy(host.data(), host.data() + 8, 4, cudaMemcpyDeviceToHost),
            cudaErrorInvalidValue);  // the source is host memory
  EXPECT_EQ(cudaMemset(d + 4, 0, 5 * sizeof(float)), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(d + 1), cudaErrorInvalidDevicePointer);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  void* big = nullptr;
  EXPECT_EQ(cudaMalloc(&big, size_t{81} << 30), cudaErrorMemoryAllocation);  // 80 GiB device
  size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  EXPECT_EQ(total, size_t{80} << 30);
}

#if defined(__SANITIZE_ADDRESS__)
TEST(CudaEmulationDeathTest, HostCodeReadingDeviceMemoryIsReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), 64), cudaSuccess);
  EXPECT_DEATH(
      {
        volatile float x = d[3];
        (void)x;
      },
      "use-after-poison");
  cudaFree(d);
}
#endif

TEST(CudaEmulationTest, CublasGemmsAreOpenBlasOnes) {
  const int m = 5, n = 3, k = 4;
  std::vector<float> a(k * m), b(n * k), c(m * n, 1.0f), want = c;
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.5f * i - 2;
  for (size_t i = 0; i < b.size(); ++i) b[i] = 1.0f - 0.25f * i;
  // C (m,n) = Aᵀ B + 2 C, A stored (k, m) column-major.
  cblas_sgemm(CblasColMajor, CblasTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(), k,
              2.0f, want.data(), m);
  Dev<float> da(a), db(b), dc(c);
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  const float one = 1.0f, two = 2.0f;
  EXPECT_EQ(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, da.get(), k, db.get(), k, &two,
                        dc.get(), m),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(dc.Host(), want);
  // A leading dimension that runs past B's allocation fails, by name.
  EXPECT_EQ(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, da.get(), k, db.get(), k + 2,
                        &two, dc.get(), m),
            CUBLAS_STATUS_EXECUTION_FAILED);
  EXPECT_EQ(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
}

TEST(CudaEmulationTest, NcclRanksInThreadsReduceAndExchange) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::vector<float>> sums(2), got(2);
  std::vector<ncclResult_t> results(2, ncclInternalError);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      ncclComm_t comm;
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      ncclResult_t res = ncclCommInitRankConfig(&comm, 2, id, r, &config);
      ncclResult_t state = ncclInProgress;
      while (res == ncclInProgress || state == ncclInProgress) {
        res = ncclCommGetAsyncError(comm, &state);
        if (res != ncclSuccess) break;
      }
      cudaStream_t s;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      Dev<float> x(std::vector<float>(100, 1.5f * (r + 1))), buf(std::vector<float>(100, r));
      ncclAllReduce(x.get(), x.get(), 100, ncclFloat32, ncclSum, comm, s);
      if (r == 0) {
        ncclSend(buf.get(), 400, ncclUint8, 1, comm, s);
      } else {
        ncclRecv(buf.get(), 400, ncclUint8, 0, comm, s);
      }
      while (cudaStreamQuery(s) == cudaErrorNotReady) std::this_thread::yield();
      sums[r] = x.Host();
      got[r] = buf.Host();
      results[r] = ncclCommDestroy(comm);
      cudaStreamDestroy(s);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r], ncclSuccess);
    EXPECT_EQ(sums[r], std::vector<float>(100, 4.5f)) << r;
    EXPECT_EQ(got[r], std::vector<float>(100, 0.0f)) << r;  // rank 0's
  }
  // An id from a process that is not there: refused, by name.
  const int64_t gone = 0x7ffffff0;  // above any pid_max
  std::memcpy(id.internal + 16, &gone, sizeof(gone));
  ncclComm_t comm;
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 0), ncclSystemError);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("cannot reach the NCCL id's process"),
            std::string::npos)
      << ncclGetLastError(nullptr);
}

// Ranks in two processes: this test binary again, running NcclChildRank
// with the id in LOOM_EMU_NCCL_ID (hex) and what to do in
// LOOM_EMU_NCCL_CHILD: "work" (an all-reduce, a receive, a send, a clean
// end) or "die" (the all-reduce, then the process ends without leaving).
constexpr int kFloats = 3000;  // 12 KB: more than one socket read

ncclComm_t JoinOrDie(const ncclUniqueId& id, int rank) {
  ncclComm_t comm = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t res = ncclCommInitRankConfig(&comm, 2, id, rank, &config);
  ncclResult_t state = ncclInProgress;
  while (res == ncclInProgress || (res == ncclSuccess && state == ncclInProgress)) {
    res = ncclCommGetAsyncError(comm, &state);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (res != ncclSuccess || state != ncclSuccess) {
    std::fprintf(stderr, "rank %d: init %d/%d: %s\n", rank, res, state, ncclGetLastError(comm));
    std::_Exit(10);
  }
  return comm;
}

// Waits for `s` while the group is whole; the communicator's state at the end.
ncclResult_t Drain(ncclComm_t comm, cudaStream_t s) {
  for (;;) {
    if (cudaStreamQuery(s) == cudaSuccess) return ncclSuccess;
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm, &state);
    if (state != ncclSuccess && state != ncclInProgress) return state;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(CudaEmulationTest, NcclChildRank) {
  const char* mode = std::getenv("LOOM_EMU_NCCL_CHILD");
  if (mode == nullptr) GTEST_SKIP() << "NcclRanksInProcesses runs it";
  const std::string hex = std::getenv("LOOM_EMU_NCCL_ID");
  ncclUniqueId id;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) {
    id.internal[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  ncclComm_t comm = JoinOrDie(id, 1);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  Dev<float> x(std::vector<float>(kFloats, 2.0f)), buf(std::vector<float>(kFloats, 0.0f));
  ncclAllReduce(x.get(), x.get(), kFloats, ncclFloat32, ncclSum, comm, s);
  if (std::string(mode) == "die") {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::_Exit(0);  // no ncclCommDestroy: the hub sees the connection end
  }
  ncclRecv(buf.get(), kFloats, ncclFloat32, 0, comm, s);
  ASSERT_EQ(Drain(comm, s), ncclSuccess) << ncclGetLastError(comm);
  std::vector<float> got = buf.Host();
  for (float& v : got) v += 1.0f;
  Dev<float> reply(got);
  ncclSend(reply.get(), kFloats, ncclFloat32, 0, comm, s);
  ASSERT_EQ(Drain(comm, s), ncclSuccess) << ncclGetLastError(comm);
  EXPECT_EQ(x.Host(), std::vector<float>(kFloats, 3.5f));
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  cudaStreamDestroy(s);
}

pid_t SpawnChild(const ncclUniqueId& id, const char* mode) {
  std::string hex;
  char b[3];
  for (char c : id.internal) {
    std::snprintf(b, sizeof(b), "%02x", static_cast<unsigned char>(c));
    hex += b;
  }
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("LOOM_EMU_NCCL_ID", hex.c_str(), 1);
    setenv("LOOM_EMU_NCCL_CHILD", mode, 1);
    execl("/proc/self/exe", "emu_test", "--gtest_filter=CudaEmulationTest.NcclChildRank",
          static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  return pid;
}

// Rank 0 here, rank 1 a child process doing `mode`.
struct RankZero {
  pid_t child = -1;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};
RankZero StartRanks(const char* mode) {
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  RankZero r;
  r.child = SpawnChild(id, mode);
  if (r.child <= 0) return r;
  r.comm = JoinOrDie(id, 0);
  cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking);
  return r;
}

TEST(CudaEmulationTest, NcclRanksInProcessesReduceAndExchange) {
  const RankZero r = StartRanks("work");
  ASSERT_GT(r.child, 0);
  const pid_t child = r.child;
  ncclComm_t comm = r.comm;
  cudaStream_t s = r.stream;
  std::vector<float> mine(kFloats);
  for (int i = 0; i < kFloats; ++i) mine[i] = 0.25f * i;
  Dev<float> x(std::vector<float>(kFloats, 1.5f)), out(mine), back(std::vector<float>(kFloats, 0));
  ncclAllReduce(x.get(), x.get(), kFloats, ncclFloat32, ncclSum, comm, s);
  ncclSend(out.get(), kFloats, ncclFloat32, 1, comm, s);
  ncclRecv(back.get(), kFloats, ncclFloat32, 1, comm, s);
  ASSERT_EQ(Drain(comm, s), ncclSuccess) << ncclGetLastError(comm);
  EXPECT_EQ(x.Host(), std::vector<float>(kFloats, 3.5f));
  std::vector<float> want = mine;
  for (float& v : want) v += 1.0f;
  EXPECT_EQ(back.Host(), want);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  cudaStreamDestroy(s);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
}

TEST(CudaEmulationTest, NcclRankProcessThatEndsBreaksTheGroup) {
  const RankZero r = StartRanks("die");
  ASSERT_GT(r.child, 0);
  const pid_t child = r.child;
  ncclComm_t comm = r.comm;
  cudaStream_t s = r.stream;
  Dev<float> x(std::vector<float>(kFloats, 1.5f)), in(std::vector<float>(kFloats, 0));
  ncclAllReduce(x.get(), x.get(), kFloats, ncclFloat32, ncclSum, comm, s);
  ncclRecv(in.get(), kFloats, ncclFloat32, 1, comm, s);  // never sent
  EXPECT_EQ(Drain(comm, s), ncclRemoteError);
  EXPECT_EQ(x.Host(), std::vector<float>(kFloats, 3.5f));  // the all-reduce before it ended
  EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace loom::cuda_emu
