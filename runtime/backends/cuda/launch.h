// Kernel launches through one macro, so that the same CUDA source builds
// for a GPU (nvcc: the <<<>>> syntax) and for the CUDA emulation
// (--config=cuda_emu, runtime/backends/cuda/emu/emu.h: a call that runs the
// grid on the host). A kernel whose name has a comma (template arguments)
// goes through an alias.
//   LOOM_LAUNCH(kernel, grid, block, args...)
//   LOOM_LAUNCH_ON(kernel, grid, block, shared_bytes, stream, args...)
#ifndef LOOM_RUNTIME_BACKENDS_CUDA_LAUNCH_H_
#define LOOM_RUNTIME_BACKENDS_CUDA_LAUNCH_H_

#ifdef LOOM_CUDA_EMU
#include "runtime/backends/cuda/emu/emu.h"

#define LOOM_LAUNCH_ON(kernel, grid, block, shared_bytes, stream, ...)                         \
  ::loom::cuda_emu::Launch(#kernel, dim3(grid), dim3(block), (shared_bytes), (stream), kernel, \
                           __VA_ARGS__)
#else
#define LOOM_LAUNCH_ON(kernel, grid, block, shared_bytes, stream, ...) \
  kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__)
#endif

#define LOOM_LAUNCH(kernel, grid, block, ...) \
  LOOM_LAUNCH_ON(kernel, grid, block, 0, nullptr, __VA_ARGS__)

#endif  // LOOM_RUNTIME_BACKENDS_CUDA_LAUNCH_H_
