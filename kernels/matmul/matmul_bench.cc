// Benchmark (not a test): Loom's GEMM against OpenBLAS's cblas_sgemm called
// directly, on the same inputs, alternating in one run. Prints GFLOP/s of
// each and their ratio; matmul_forward adds the bias and the llm.c weight
// layout on top of sgemm, and this shows what that costs.
//
//   bazel run --config=opt //kernels/matmul:matmul_bench
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "kernels/matmul/matmul.h"

namespace {

double Seconds(const std::chrono::steady_clock::time_point& t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main() {
  struct Case {
    int M, K, N;
    const char* what;
  };
  const Case cases[] = {
      {512, 768, 768, "ViT qkv-ish, 512 tokens"},
      {1024, 1024, 1024, "square 1024"},
      {2048, 768, 3072, "MLP up, 2048 tokens"},
  };
  std::printf("%-26s %14s %14s %8s\n", "shape (M,K,N)", "loom GFLOP/s", "openblas GFLOP/s",
              "ratio");
  for (const Case& c : cases) {
    std::vector<float> inp(static_cast<size_t>(c.M) * c.K), w(static_cast<size_t>(c.N) * c.K),
        bias(c.N, 0.0f), out(static_cast<size_t>(c.M) * c.N);
    for (size_t i = 0; i < inp.size(); ++i) inp[i] = static_cast<float>(i % 13) * 0.01f;
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 7) * 0.01f;
    const double flops = 2.0 * c.M * c.K * c.N;
    double best_loom = 1e30, best_blas = 1e30;
    for (int rep = 0; rep < 7; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      loom::kernels::matmul_forward(out.data(), inp.data(), w.data(), bias.data(), c.M, c.K, c.N);
      best_loom = std::min(best_loom, Seconds(t0));
      t0 = std::chrono::steady_clock::now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c.M, c.N, c.K, 1.0f, inp.data(), c.K,
                  w.data(), c.K, 0.0f, out.data(), c.N);
      best_blas = std::min(best_blas, Seconds(t0));
    }
    char shape[64];
    std::snprintf(shape, sizeof(shape), "(%d,%d,%d)", c.M, c.K, c.N);
    std::printf("%-26s %14.1f %14.1f %8.3f   %s\n", shape, flops / best_loom * 1e-9,
                flops / best_blas * 1e-9, best_blas / best_loom, c.what);
  }
  std::printf("ratio = loom / openblas throughput (best of 7, alternating)\n");
  return 0;
}
