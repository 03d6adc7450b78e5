// Streams of the CUDA emulation, between runtime.cc and nccl.cc: a stream
// counts its NCCL operations not yet complete (every other kind of work is
// complete when it is issued).
#ifndef LOOM_RUNTIME_BACKENDS_CUDA_EMU_STREAM_H_
#define LOOM_RUNTIME_BACKENDS_CUDA_EMU_STREAM_H_

#include <condition_variable>
#include <mutex>
#include <set>

#include "cuda_runtime.h"

struct CUstream_st {
  int device = 0;
  int pending = 0;  // under StreamRegistry().mu
};

namespace loom::cuda_emu {

struct StreamSet {
  std::mutex mu;
  std::condition_variable done;  // a stream's pending count fell
  std::set<cudaStream_t> streams;
};
StreamSet& StreamRegistry();

// The default streams and every stream created and not destroyed.
bool ValidStream(cudaStream_t s);

// An operation issued on `s`, and its completion.
void StreamBegin(cudaStream_t s);
void StreamEnd(cudaStream_t s);

}  // namespace loom::cuda_emu

#endif  // LOOM_RUNTIME_BACKENDS_CUDA_EMU_STREAM_H_
