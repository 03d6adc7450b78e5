// The memory model (issue 42 item 7): what one rank of a module holds while
// it trains, counted from the buffers the layers and the workers keep (llm.h,
// vit.h, projector.h, params.h, services/worker), so that a plan and a job
// can be checked before anything is allocated.
//
// What it counts, per rank of one pipeline stage of one module:
//   weights       the fp32 parameters (the masters the optimizer steps)
//   bf16_weights  under bf16, the GEMMs' copy of the weights
//   grads         fp32 gradients (none when the module is frozen)
//   moments       AdamW's m and v: 8 bytes a parameter of this rank's
//                 optimizer shard (1/DP of the stage under ZeRO-1)
//   activations   what the layers keep from forward to backward: every
//                 layer's in fp32, or under bf16 one fp32 working layer and
//                 every layer's bf16 stash (precision.h ActivationStash),
//                 with attention's per-row log-sum-exp (O(L), not L x L);
//                 for the one microbatch whose activations are live under
//                 recompute full, for every microbatch in flight (with its
//                 batch and output) under none and selective, less the
//                 element-wise outputs under selective
//   workspace     the stage's kept outputs (final norm, logits) and the
//                 largest set of forward or backward temporaries alive at
//                 once (input gradients, dlogits, ...), or of the gradients'
//                 reduction over DP on the host (the Gloo ring's incoming
//                 chunk, 1/DP of the set)
//   stage_inputs  the inputs the workers keep to recompute a microbatch's
//                 forward before its backward: one per microbatch in flight
//                 (1F1B) under recompute full, the one being received
//                 otherwise, and what is in transit to and from the
//                 neighbours
//   scratch       on the CPU under bf16: the GEMMs' widened operands, kept
//                 per thread (kernels/matmul)
//
// The recompute policy (StageMemoryOptions::recompute) is the runtime's:
// under full a stage keeps each in-flight microbatch's input and one
// microbatch's activations, and recomputes the forward of any other before
// its backward; under none and selective it keeps every in-flight
// microbatch's activations (services/worker, SavedActivations).
//
// Not counted: the process itself (code, gRPC, UCX, the CUDA context),
// samples and batches (a few bytes a token), and the attention kernels'
// per-thread tiles (a few KiB). Compared against the backend's peak bytes
// (Backend::peak_bytes) and, for the whole worker, the process's peak RSS
// over its RSS before the model was built (docs/figures.md).
#ifndef LOOM_RUNTIME_MODEL_MEMORY_H_
#define LOOM_RUNTIME_MODEL_MEMORY_H_

#include <cstdint>
#include <string>

#include "runtime/model/config.h"
#include "runtime/model/precision.h"

namespace loom {

struct MemoryEstimate {
  int64_t weights = 0;
  int64_t bf16_weights = 0;
  int64_t grads = 0;
  int64_t moments = 0;
  int64_t activations = 0;
  int64_t workspace = 0;
  int64_t stage_inputs = 0;
  int64_t scratch = 0;
  // What of the above the backend's buffers hold (Backend::peak_bytes
  // measures it): the activations and the workspace, the bf16 copy, and on a
  // device the parameters' copies and the workers' staging buffers.
  int64_t buffers = 0;
  // Everything but `buffers` (which counts parts of the rest).
  int64_t total() const;
  // "weights 1.2 GiB, grads ..., total ..." for logs and errors.
  std::string ToString() const;
};

struct StageMemoryOptions {
  Precision precision = Precision::kFp32;
  int tp = 1;                     // the module's TP degree
  int optimizer_shards = 1;       // DP ranks sharing the AdamW moments (ZeRO-1); 1: not sharded
  int dp = 1;                     // the module's DP degree: its gradients' reduction
  bool frozen = false;            // no gradients, no moments (the ViT, for the encoder)
  bool projector_frozen = false;  // the encoder's last stage: the projector's set
  // On a GPU: what the device holds (the host's copies are not counted):
  // the weights, gradients and bf16 copy, the moments where the optimizer
  // steps there, the workers' staging buffers; no CPU GEMM scratch. Then
  // total() is buffers. False: the CPU backend (host memory).
  bool device = false;
  bool optimizer_on_device = false;
  int in_flight = 1;  // microbatches in flight at the stage (1F1B)
  Recompute recompute = Recompute::kFull;
  // Sequence parallelism at tp > 1 (Llm/VitEncoder::set_sequence_parallel):
  // the stream's and the norms' rows kept 1/tp as large, the TP layers'
  // rows padded to tp's multiple, the gathered rows as workspace.
  bool sequence_parallel = false;
};

// Parameters this TP rank holds of an LLM stage / ViT stage / the projector.
int64_t LlmStageParameters(const LlmConfig& c, int first, int last, int tp);
int64_t VitStageParameters(const VitConfig& c, int first, int last, int tp);
int64_t ProjectorParameters(const ModelConfig& c);

// One rank of the LLM stage holding layers [first, last), for microbatches
// of at most `tokens` tokens, `image_tokens` of them image positions.
MemoryEstimate LlmStageMemory(const LlmConfig& c, int first, int last, int64_t tokens,
                              int64_t image_tokens, const StageMemoryOptions& o);

// The generator's denoiser as an encoder whose blocks EncoderStageMemory
// prices: its pictures as tiles, its 1 + Q prefix rows, no projector (the
// patch head and the conditions' projection, about a patch embedding's
// size each, are left out).
ModelConfig DenoiserAsEncoder(const ModelConfig& c);

// One rank of the encoder stage holding ViT layers [first, last) (and the
// projector after them on the last stage), for bins of at most `tiles`
// tiles. `bins` is how many bins' inputs the stage keeps at once (the
// encoder runs every bin's forward before the backwards).
// Under recompute none or selective the stage keeps every bin's state:
// `kept_tiles`, the tiles of the bins it keeps at once (-1: `bins` bins of
// `tiles` each, the bound a check at submission has).
MemoryEstimate EncoderStageMemory(const ModelConfig& c, int first, int last, int64_t tiles,
                                  int bins, const StageMemoryOptions& o, int64_t kept_tiles = -1);

// The bytes of a process's resident set now and at its peak (VmRSS and
// VmHWM of /proc/self/status); -1 where they cannot be read.
int64_t ResidentBytes();
int64_t PeakResidentBytes();

}  // namespace loom

#endif  // LOOM_RUNTIME_MODEL_MEMORY_H_
