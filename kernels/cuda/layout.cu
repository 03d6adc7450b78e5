// Copies, sums and layout changes the layers need besides the big kernels:
// the ViT's patches and positions, the projector's pixel shuffle, the
// vocab-parallel embedding, residual adds and biases. Each element is
// written by one thread (no atomics), so results are deterministic; the
// reductions over tiles (position gradients) loop in a fixed order.
#include "kernels/cuda/common.h"
#include "kernels/cuda/ops.h"

namespace loom::kernels::cuda {
namespace {

__global__ void Patchify(float* patches, const float* tiles, int N, int S, int P) {
  const int G = S / P;
  const int64_t row = 3LL * P * P;
  LOOM_GRID_LOOP(i, static_cast<int64_t>(N) * G * G * row) {
    const int64_t patch = i / row;
    const int k = static_cast<int>(i % row);
    const int n = static_cast<int>(patch / (G * G)), g = static_cast<int>(patch % (G * G));
    const int gy = g / G, gx = g % G, c = k / (P * P), y = (k / P) % P, x = k % P;
    patches[i] = tiles[((static_cast<int64_t>(n) * 3 + c) * S + gy * P + y) * S + gx * P + x];
  }
}

__global__ void AddPositionForward(float* x, const float* pos, int64_t per_tile, int64_t n) {
  LOOM_GRID_LOOP(i, n) x[i] += pos[i % per_tile];
}

__global__ void AddPositionBackward(float* dpos, const float* dx, int N, int64_t per_tile) {
  LOOM_GRID_LOOP(i, per_tile) {
    float s = 0.0f;
    for (int n = 0; n < N; ++n) s += dx[static_cast<int64_t>(n) * per_tile + i];
    dpos[i] += s;
  }
}

// The offset in the shuffled (N, G/2, G/2, 4C) output of in[n, y, x, c].
__device__ int64_t ShuffledOffset(int64_t i, int G, int C) {
  const int c = static_cast<int>(i % C);
  const int64_t p = i / C;
  const int x = static_cast<int>(p % G), y = static_cast<int>((p / G) % G);
  const int64_t n = p / (static_cast<int64_t>(G) * G);
  const int H = G / 2;
  return ((n * H + y / 2) * H + x / 2) * 4 * C + ((y % 2) * 2 + x % 2) * C + c;
}

__global__ void PixelShuffleForward(float* out, const float* inp, int64_t n, int G, int C) {
  LOOM_GRID_LOOP(i, n) out[ShuffledOffset(i, G, C)] = inp[i];
}

__global__ void PixelShuffleBackward(float* dinp, const float* dout, int64_t n, int G, int C) {
  LOOM_GRID_LOOP(i, n) dinp[i] += dout[ShuffledOffset(i, G, C)];
}

__global__ void VocabEmbeddingForward(float* out, const int32_t* tokens, const float* table, int T,
                                      int C, int vocab_start, int v_shard) {
  LOOM_GRID_LOOP(i, static_cast<int64_t>(T) * C) {
    const int t = static_cast<int>(i / C), c = static_cast<int>(i % C);
    const int v = tokens[t] - vocab_start;
    out[i] =
        tokens[t] >= 0 && v >= 0 && v < v_shard ? table[static_cast<int64_t>(v) * C + c] : 0.0f;
  }
}

// One thread per (run, column): a run's dout rows summed in token order,
// then added to its table row (deterministic, unlike atomics; O(T·C)).
__global__ void EmbeddingBackwardRuns(float* dtable, const float* dout, const int32_t* rows,
                                      const int32_t* offsets, const int32_t* order, int runs,
                                      int C) {
  LOOM_GRID_LOOP(i, static_cast<int64_t>(runs) * C) {
    const int r = static_cast<int>(i / C), c = static_cast<int>(i % C);
    float s = 0.0f;
    for (int k = offsets[r]; k < offsets[r + 1]; ++k)
      s += dout[static_cast<int64_t>(order[k]) * C + c];
    dtable[static_cast<int64_t>(rows[r]) * C + c] += s;
  }
}

__global__ void ScatterRows(float* dst, const float* src, const int32_t* rows, int n, int C) {
  LOOM_GRID_LOOP(i, static_cast<int64_t>(n) * C) {
    const int64_t r = i / C, c = i % C;
    dst[static_cast<int64_t>(rows[r]) * C + c] = src[i];
  }
}

__global__ void GatherAddRows(float* dst, const float* src, const int32_t* rows, int n, int C) {
  LOOM_GRID_LOOP(i, static_cast<int64_t>(n) * C) {
    const int64_t r = i / C, c = i % C;
    dst[i] += src[static_cast<int64_t>(rows[r]) * C + c];
  }
}

__global__ void Add(float* x, const float* y, int64_t n) { LOOM_GRID_LOOP(i, n) x[i] += y[i]; }

__global__ void AddBias(float* out, const float* bias, int64_t n, int N) {
  LOOM_GRID_LOOP(i, n) out[i] += bias[i % N];
}

}  // namespace

void patchify(float* patches, const float* tiles, int N, int S, int P) {
  const int64_t n = static_cast<int64_t>(N) * (S / P) * (S / P) * 3 * P * P;
  LOOM_LAUNCH(Patchify, GridFor(n), kThreads, patches, tiles, N, S, P);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void add_position_forward(float* x, const float* pos, int N, int Np, int C) {
  const int64_t per_tile = static_cast<int64_t>(Np) * C;
  LOOM_LAUNCH(AddPositionForward, GridFor(per_tile * N), kThreads, x, pos, per_tile, per_tile * N);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void add_position_backward(float* dpos, const float* dx, int N, int Np, int C) {
  const int64_t per_tile = static_cast<int64_t>(Np) * C;
  LOOM_LAUNCH(AddPositionBackward, GridFor(per_tile), kThreads, dpos, dx, N, per_tile);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void pixel_shuffle_forward(float* out, const float* inp, int N, int G, int C) {
  const int64_t n = static_cast<int64_t>(N) * G * G * C;
  LOOM_LAUNCH(PixelShuffleForward, GridFor(n), kThreads, out, inp, n, G, C);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void pixel_shuffle_backward(float* dinp, const float* dout, int N, int G, int C) {
  const int64_t n = static_cast<int64_t>(N) * G * G * C;
  LOOM_LAUNCH(PixelShuffleBackward, GridFor(n), kThreads, dinp, dout, n, G, C);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void vocab_embedding_forward(float* out, const int32_t* tokens, const float* table, int T, int C,
                             int vocab_start, int v_shard) {
  LOOM_LAUNCH(VocabEmbeddingForward, GridFor(static_cast<int64_t>(T) * C), kThreads, out, tokens,
              table, T, C, vocab_start, v_shard);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void embedding_backward_runs(float* dtable, const float* dout, const int32_t* rows,
                             const int32_t* offsets, const int32_t* order, int runs, int C) {
  if (runs == 0) return;
  LOOM_LAUNCH(EmbeddingBackwardRuns, GridFor(static_cast<int64_t>(runs) * C), kThreads, dtable,
              dout, rows, offsets, order, runs, C);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void scatter_rows(float* dst, const float* src, const int32_t* rows, int n, int C) {
  if (n == 0) return;
  LOOM_LAUNCH(ScatterRows, GridFor(static_cast<int64_t>(n) * C), kThreads, dst, src, rows, n, C);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void gather_add_rows(float* dst, const float* src, const int32_t* rows, int n, int C) {
  if (n == 0) return;
  LOOM_LAUNCH(GatherAddRows, GridFor(static_cast<int64_t>(n) * C), kThreads, dst, src, rows, n, C);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void add(float* x, const float* y, int64_t n) {
  LOOM_LAUNCH(Add, GridFor(n), kThreads, x, y, n);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void add_bias(float* out, const float* bias, int M, int N) {
  const int64_t n = static_cast<int64_t>(M) * N;
  LOOM_LAUNCH(AddBias, GridFor(n), kThreads, out, bias, n, N);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace loom::kernels::cuda
