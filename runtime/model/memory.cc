#include "runtime/model/memory.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom {
namespace {

constexpr int64_t kF = sizeof(float), kH = sizeof(uint16_t), kI = sizeof(int32_t);

// One GEMM of the stage: (M, K) x (N, K)^T, and whether its backward
// computes the input gradient.
struct Gemm {
  int64_t M, K, N;
  bool dinp = true;
};

// The CPU bf16 GEMMs' widened operands (kernels/matmul matmul_*_bf16): three
// per-thread buffers, each as large as the largest operand it ever held.
int64_t Bf16GemmScratch(const std::vector<Gemm>& gemms, bool backward, bool dweight) {
  int64_t s0 = 0, s1 = 0, s2 = 0;
  for (const Gemm& g : gemms) {
    s0 = std::max(s0, g.M * g.K);  // forward: the input rounded
    s1 = std::max(s1, g.N * g.K);  // forward: the weight widened
    if (!backward) continue;
    s0 = std::max(s0, g.M * g.N);               // backward: dout rounded
    if (dweight) s1 = std::max(s1, g.M * g.K);  // the input rounded
    if (g.dinp) s2 = std::max(s2, g.N * g.K);   // the weight widened
  }
  return (s0 + s1 + s2) * kF;
}

// Weights, their bf16 copy, gradients and moments of `params` parameters.
void AddParameters(int64_t params, bool frozen, const StageMemoryOptions& o, MemoryEstimate* e) {
  const bool bf16 = o.precision == Precision::kBf16;
  const int shards = std::max(1, o.optimizer_shards);
  const int64_t shard = (params + shards - 1) / shards;  // ChunkRange's largest chunk
  const int64_t moments = frozen || (o.device && !o.optimizer_on_device) ? 0 : 2 * kF * shard;
  e->weights += kF * params;
  e->bf16_weights += bf16 ? kH * params : 0;
  e->grads += frozen ? 0 : kF * params;
  e->moments += moments;
  if (o.device) {
    e->buffers += kF * params + (bf16 ? kH * params : 0) + (frozen ? 0 : kF * params) + moments;
  } else {
    e->buffers += bf16 ? kH * params : 0;  // Place's bf16 copy is the backend's
  }
}

// A stack of `layers` layers keeping `narrow` + `kept` floats each: every
// layer's fp32, or under bf16 one fp32 working layer and every layer's
// stash (bf16 narrow, fp32 kept).
// Such stacks for several microbatches at once (SavedActivations: a
// pipeline stage's microbatches in flight), sharing the one working layer
// (`narrow` + `kept` floats, the largest microbatch's), each layer keeping
// `stash_narrow` + `stash_kept` floats over all of them (selective
// recompute keeps fewer than `narrow`).
int64_t KeptLayers(int64_t layers, int64_t narrow, int64_t kept, int64_t stash_narrow,
                   int64_t stash_kept, Precision p) {
  if (layers == 0) return 0;
  if (p == Precision::kFp32) return layers * (stash_narrow + stash_kept) * kF;
  return (narrow + kept) * kF + layers * (stash_narrow * kH + stash_kept * kF);
}

std::string Bytes(int64_t b) {
  const double x = static_cast<double>(b);
  if (x >= (1ll << 30)) return absl::StrFormat("%.2f GiB", x / (1ll << 30));
  if (x >= (1ll << 20)) return absl::StrFormat("%.1f MiB", x / (1ll << 20));
  return absl::StrFormat("%.1f KiB", x / 1024);
}

// The rows a stage's layers hold under sequence parallelism or not
// (parallel::SequenceStream).
struct SequenceRows {
  int64_t rows, layer_rows;
  bool split;
};
SequenceRows SequenceRowsOf(int64_t T, int tp, const StageMemoryOptions& o) {
  if (!o.sequence_parallel || tp <= 1 || T == 0) return {T, T, false};
  const int64_t shard = (T + tp - 1) / tp;
  return {shard, shard * tp, true};
}

int64_t StatusField(const char* field) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  int64_t kb = -1;
  const size_t n = std::strlen(field);
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, field, n) == 0 && line[n] == ':') {
      long long v = 0;
      if (std::sscanf(line + n + 1, "%lld", &v) == 1) kb = v;
      break;
    }
  }
  std::fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}

// The host ring's incoming chunk while a set's gradients are reduced over
// DP (runtime/comm/collective.cc); NCCL reduces in place.
int64_t ReduceBuffer(int64_t params, bool frozen, const StageMemoryOptions& o) {
  if (frozen || o.device || o.dp <= 1) return 0;
  return kF * (params / o.dp + 1);
}

}  // namespace

int64_t MemoryEstimate::total() const {
  return weights + bf16_weights + grads + moments + activations + workspace + stage_inputs +
         scratch;
}

std::string MemoryEstimate::ToString() const {
  return absl::StrCat("weights ", Bytes(weights), ", bf16 weights ", Bytes(bf16_weights),
                      ", grads ", Bytes(grads), ", AdamW moments ", Bytes(moments),
                      ", activations ", Bytes(activations), ", workspace ", Bytes(workspace),
                      ", stage inputs ", Bytes(stage_inputs), ", GEMM scratch ", Bytes(scratch),
                      ": total ", Bytes(total()));
}

int64_t LlmStageParameters(const LlmConfig& c, int first, int last, int tp) {
  const int64_t C = c.dim, A = int64_t{c.heads} * c.hd() / tp, QKV = c.qkv_rows() / tp,
                F = c.ffn_hidden / tp, V = c.vocab / tp;
  const int64_t layer = 2 * C + QKV * C + (c.qkv_bias ? QKV : 0) + C * A + 3 * F * C;
  int64_t n = (last - first) * layer;
  if (first == 0) n += V * C + int64_t{c.gen_queries} * C;
  if (last == c.layers) n += C + (c.tie_embeddings ? 0 : V * C);
  return n;
}

int64_t VitStageParameters(const VitConfig& c, int first, int last, int tp) {
  const int64_t D = c.dim, H = c.mlp_hidden / tp, A = D / tp;
  const int64_t layer = 4 * D + 3 * A * D + 3 * A + A * D + D + H * D + H + D * H + D;
  int64_t n = (last - first) * layer;
  if (first == 0) {
    n += D * c.patch_dim() + (c.patch_bias ? D : 0) + (c.class_token ? D : 0) + c.seq() * D +
         (c.pre_norm ? 2 * D : 0);
  }
  if (last == c.layers && c.final_norm) n += 2 * D;
  return n;
}

int64_t ProjectorParameters(const ModelConfig& c) {
  const int64_t H = c.projector.hidden, D = c.llm.dim,
                in = c.projector.pixel_shuffle ? 4 * c.vit.dim : c.vit.dim;
  return H * in + H + D * H + D;
}

MemoryEstimate LlmStageMemory(const LlmConfig& c, int first, int last, int64_t tokens,
                              int64_t image_tokens, const StageMemoryOptions& o) {
  MemoryEstimate e;
  const int tp = std::max(1, o.tp);
  const bool first_stage = first == 0, last_stage = last == c.layers;
  const int64_t T = tokens, C = c.dim, HD = c.hd(), NH = c.heads / tp, NKV = c.kv() / tp,
                D = NH * HD, W = (NH + 2 * NKV) * HD, F = c.ffn_hidden / tp, V = c.vocab / tp,
                I = first_stage ? image_tokens : 0, L = last - first;
  const int64_t P = LlmStageParameters(c, first, last, tp);
  AddParameters(P, o.frozen, o, &e);
  const bool keep = o.recompute != Recompute::kFull,
             selective = o.recompute == Recompute::kSelective;
  const int64_t in_flight = keep ? std::max(1, o.in_flight) : 1;
  // Under sequence parallelism R of the stream's rows on this rank, Tf
  // through the TP layers (T padded); otherwise both T.
  const SequenceRows sr = SequenceRowsOf(T, tp, o);
  const int64_t R = sr.rows, Tf = sr.layer_rows;
  // Llm::LayerActs: x, r1, x1, r2 (R rows), qkv, atto, gate, up, s (Tf
  // rows: narrow under bf16; selective keeps none of r1, r2 and s); rr1,
  // rr2 (R), lse (T) (per row, kept fp32).
  const int64_t narrow = R * 4 * C + Tf * (W + D + 3 * F), rows = T * NH + 2 * R;
  e.activations =
      KeptLayers(L, narrow, rows, in_flight * (selective ? narrow - R * 2 * C - Tf * F : narrow),
                 in_flight * rows, o.precision);
  // Kept between calls, for each microbatch whose activations are kept:
  // the batch (tokens, targets, positions), the image rows, the output;
  // the last stage's final norm and logits; and RoPE's frequencies.
  int64_t kept = 3 * T * kI + I * kI + T * C * kF;
  if (last_stage) kept += (T * C + T + T * V) * kF;
  kept = in_flight * kept + HD / 2 * kF;
  // Forward: the residual stream beside the last output (and under
  // selective in fp32 one element-wise output until it is released).
  // Backward: dx and dtmp, then dlogits (the head), then the layers' ds,
  // dgate, dup, datto, dqkv (and under selective the output computed
  // again, with its rows' statistics).
  const int64_t elementwise = std::max(R * C, Tf * F);  // r1, r2 or s
  const int64_t again = selective && L > 0 ? (elementwise + R) * kF : 0;
  // Under sequence parallelism the stream's gathered rows and one rank's
  // rows of a reduce-scatter (SequenceStream), beside the whole stream
  // where the stage starts and ends; and the norms' partial gradients.
  const int64_t stream = sr.split ? (Tf * C + R * C) * kF : 0;
  const int64_t released = selective && o.precision == Precision::kFp32 ? elementwise : 0;
  const int64_t forward =
      stream + (sr.split ? std::max(T * C, R * C + released) : T * C + released) * kF;
  const int64_t layers_backward =
      sr.split ? (T * C + Tf * C) * kF + stream + 2 * L * C * kF : 2 * T * C * kF;
  const int64_t backward =
      std::max(last_stage ? (2 * T * C + T * V) * kF : 0,
               layers_backward + (L > 0 ? (3 * Tf * F + Tf * D + Tf * W) * kF + again : 0));
  e.buffers += e.activations + kept + std::max(forward, backward);
  e.workspace = kept + std::max({forward, backward, ReduceBuffer(P, o.frozen, o)});
  // The workers' copies: each in-flight microbatch's input (image
  // embeddings on the first stage, hidden states on the others), and what
  // passes to the neighbours (the output sent on and the gradient coming
  // back; the input gradient sent back, or the image embeddings' gradient).
  const int64_t input = first_stage ? I * C * kF : T * C * kF;
  const int64_t transit =
      (last_stage ? 0 : 2 * T * C * kF) + (first_stage ? I * C * kF : T * C * kF);
  if (o.device) {
    // On the host, not the device; the device holds one staging buffer per
    // role (training_worker_impl.h kStage*).
    e.stage_inputs = input + transit;
    e.buffers += e.stage_inputs;
  } else {
    // Under none and selective an input is freed after its forward.
    e.stage_inputs = (keep ? 1 : std::max(1, o.in_flight)) * input + transit;
  }
  if (!o.device && o.precision == Precision::kBf16) {
    std::vector<Gemm> g;
    if (L > 0) g = {{Tf, C, W}, {Tf, D, C}, {Tf, C, F}, {Tf, C, F}, {Tf, F, C}};
    if (last_stage) g.push_back({T, C, V});
    e.scratch = Bf16GemmScratch(g, /*backward=*/true, /*dweight=*/!o.frozen);
  }
  return e;
}

ModelConfig DenoiserAsEncoder(const ModelConfig& c) {
  ModelConfig g = c;
  g.vit = c.generator.denoiser;
  g.vit.prefix = 1 + c.generator.queries;
  g.projector.pixel_shuffle = false;
  g.projector.hidden = 0;
  return g;
}

MemoryEstimate EncoderStageMemory(const ModelConfig& m, int first, int last, int64_t tiles,
                                  int bins, const StageMemoryOptions& o, int64_t kept_tiles) {
  MemoryEstimate e;
  const VitConfig& c = m.vit;
  const int tp = std::max(1, o.tp);
  const bool first_stage = first == 0, last_stage = last == c.layers;
  const int64_t N = tiles, Np = c.patches_per_tile(), S = c.seq(), T = N * S, Dv = c.dim,
                NH = c.heads / tp, A = Dv / tp, H = c.mlp_hidden / tp, L = last - first,
                TD = T * Dv, out_rows = N * Np;
  const bool vit_backward = !o.frozen;
  const bool projector_backward = last_stage && !o.projector_frozen;
  const int64_t P = VitStageParameters(c, first, last, tp);
  AddParameters(P, o.frozen, o, &e);
  int64_t reduce = ReduceBuffer(P, o.frozen, o);
  // Under none and selective every bin's activations are kept (the ViT's
  // where it trains, the projector's).
  const bool keep = (vit_backward || projector_backward) && o.recompute != Recompute::kFull;
  const bool selective = o.recompute == Recompute::kSelective;
  // The tiles whose state the stage keeps at once: the bins' (each bin
  // the largest, unless the caller knows their sum), or the live bin's.
  const int64_t kept_n = !keep ? N : kept_tiles >= 0 ? kept_tiles : std::max(1, bins) * N;
  const int64_t vit_n = keep && vit_backward ? kept_n : N;
  // VitEncoder::LayerActs: x, ln1, qkv (3A), atto, x1, ln2, h, g (narrow;
  // selective keeps none of ln1, ln2 and g); mean1, rstd1, lse, mean2,
  // rstd2 (kept), per row.
  // A bin's: under sequence parallelism x, ln1, x1, ln2 and the
  // statistics on R rows, the TP layers' on Tf (T padded); the kept bins'
  // in proportion.
  const SequenceRows sr = SequenceRowsOf(T, tp, o);
  const int64_t R = sr.rows, Tf = sr.layer_rows;
  const int64_t narrow = R * 4 * Dv + Tf * (4 * A + 2 * H),
                narrow_kept = narrow - R * 2 * Dv - Tf * H, rows = 4 * R + T * NH;
  auto kept_bins = [&](int64_t per_bin) { return N > 0 ? vit_n * per_bin / N : 0; };
  e.activations = KeptLayers(L, narrow, rows, kept_bins(selective ? narrow_kept : narrow),
                             kept_bins(rows), o.precision);
  // Per tile kept: the output, the tiles' boundaries; the patches, ln_pre's
  // input and statistics; ln_f's statistics.
  int64_t per_tile = S * Dv * kF + kI;
  if (first_stage) {
    per_tile += Np * c.patch_dim() * kF;
    if (c.pre_norm) per_tile += (S * Dv + 2 * S) * kF;
  }
  if (last_stage && c.final_norm) per_tile += 2 * S * kF;
  int64_t kept = vit_n * per_tile + kI;
  // Under selective in fp32 one element-wise output until it is released
  // (forward), and one computed again with its statistics (backward).
  const int64_t elementwise = selective && L > 0 ? std::max(R * Dv, Tf * H) * kF : 0;
  // Under sequence parallelism the stream's gathered rows and one rank's
  // rows (SequenceStream), beside the whole stream where the stage starts
  // and ends.
  const int64_t stream = sr.split ? (Tf * Dv + R * Dv) * kF : 0;
  int64_t forward =
      TD * kF + stream +
      std::max({first_stage ? out_rows * Dv * kF : 0, last_stage && c.final_norm ? TD * kF : 0,
                o.precision == Precision::kFp32 ? elementwise : 0});
  // Backward: dx; dy (the last stage's), then the layers' dtmp, dg, dh,
  // dqkv and datto, which stay while the first stage's tail runs (ln_pre's
  // dx0, then the patch embedding's gradient).
  int64_t backward = 0;
  if (vit_backward || !first_stage) {
    const int64_t layers = L > 0 ? (Tf * Dv + 2 * Tf * H + 4 * Tf * A) * kF +
                                       (elementwise > 0 ? elementwise + 2 * R * kF : 0) +
                                       (sr.split ? stream + 4 * L * Dv * kF : 0)
                                 : 0;
    const int64_t tail = first_stage ? std::max(c.pre_norm ? TD : 0, out_rows * Dv) * kF : 0;
    backward = TD * kF + std::max(last_stage ? TD * kF : 0, layers + tail);
  }
  std::vector<Gemm> g;
  if (first_stage) g.push_back({out_rows, c.patch_dim(), Dv, /*dinp=*/false});
  if (L > 0) {
    for (Gemm x :
         std::initializer_list<Gemm>{{Tf, Dv, 3 * A}, {Tf, A, Dv}, {Tf, Dv, H}, {Tf, H, Dv}})
      g.push_back(x);
  }
  // The projector on the last stage: its own parameters, its kept input
  // and hidden layer, its temporaries.
  const int64_t Tp = N * m.tokens_per_tile(), Hp = m.projector.hidden, C = m.llm.dim,
                Din = m.projector.pixel_shuffle ? 4 * Dv : Dv;
  if (last_stage) {
    AddParameters(ProjectorParameters(m), o.projector_frozen, o, &e);
    reduce = std::max(reduce, ReduceBuffer(ProjectorParameters(m), o.projector_frozen, o));
    kept += (keep ? kept_n : N) * (Np * Dv + 2 * m.tokens_per_tile() * Hp) * kF;
    forward = std::max(forward, m.projector.pixel_shuffle ? out_rows * Dv * kF : 0);
    if (projector_backward) {
      backward = std::max(backward, (2 * Tp * Hp + out_rows * Dv) * kF);
    }
    g.push_back({Tp, Din, Hp, vit_backward});
    g.push_back({Tp, Hp, C});
  }
  e.buffers += e.activations + kept + std::max(forward, backward);
  e.workspace = kept + std::max({forward, backward, reduce});
  // The worker keeps every bin's input until its backward (pixels on the
  // first stage, hidden states on the others; the tower's output instead
  // where only the projector trains), and one bin in transit each way.
  const int64_t pixels = N * 3 * int64_t{c.tile_size} * c.tile_size * kF;
  int64_t input = 0;
  if (vit_backward) {
    input = first_stage ? pixels : TD * kF;
  } else if (projector_backward) {
    input = out_rows * Dv * kF;
  }
  int64_t transit = 0;
  if (last_stage) {
    // The tower's output, the embeddings sent and their scratch, the
    // embeddings' gradient and the tower output's.
    transit = (2 * out_rows * Dv + 3 * Tp * C) * kF;
  } else {
    transit = 3 * TD * kF;  // the output sent, its gradient back, the input gradient
  }
  if (!first_stage) transit += TD * kF;  // the received input
  if (o.device) {
    e.stage_inputs = input + transit;  // one staging buffer per role
    e.buffers += e.stage_inputs;
  } else {
    // Under none and selective an input is freed after its forward.
    e.stage_inputs = (keep ? 1 : std::max(1, bins)) * input + transit;
  }
  if (!o.device && o.precision == Precision::kBf16) {
    e.scratch = Bf16GemmScratch(g, vit_backward || projector_backward, true);
  }
  return e;
}

int64_t ResidentBytes() { return StatusField("VmRSS"); }
int64_t PeakResidentBytes() { return StatusField("VmHWM"); }

}  // namespace loom
