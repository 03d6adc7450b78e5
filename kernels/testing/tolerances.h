// Every numerical tolerance Loom's tests use, in one table, each with its
// reason. A test compares |got - want| <= atol + rtol * |want|.
//
// Loosening one needs a written reason here, never a silent edit at the call
// site.
#ifndef LOOM_KERNELS_TESTING_TOLERANCES_H_
#define LOOM_KERNELS_TESTING_TOLERANCES_H_

namespace loom::testing {

struct Tolerance {
  double atol;
  double rtol;
  const char* reason;
};

// |got - want| that `t` allows for a wanted value.
constexpr double Allowed(const Tolerance& t, double want) {
  return t.atol + t.rtol * (want < 0 ? -want : want);
}

// Fast (blocked, vectorised) CPU kernel against its plain reference, fp32.
inline constexpr Tolerance kFastVsReferenceF32 = {
    1e-5, 1e-5,
    "fp32 sums of up to ~1e3 terms of O(1) values taken in another order (BLAS blocks and "
    "vectorises K): rounding grows like sqrt(K)*eps(6e-8)*|terms| ~ 2e-6 relative"};

// An fp32 kernel's few operations on O(1) values against the closed form in
// double, or a constant printed to 7 significant digits.
inline constexpr Tolerance kClosedFormF32 = {
    1e-6, 1e-6,
    "a few fp32 roundings (eps 6e-8) of values up to ~4, plus 5e-8 for 7-digit constants: "
    "~1e-6 at most; a wrong formula (a missing bias correction, erf vs tanh GELU) is >= 1e-4"};

// Double arithmetic on a few O(1) values against the exact closed form.
inline constexpr Tolerance kClosedFormF64 = {
    1e-12, 1e-12,
    "a few double roundings (eps 1.1e-16) of O(1) values: ~1e-15; 1e-12 leaves 1000x margin"};

// A normalisation's output statistics (mean 0, variance or RMS 1) over a row
// of C fp32 values, with eps added to the variance.
inline constexpr Tolerance kNormStatisticsF32 = {
    1e-5, 1e-3,
    "fp32 output summed over C <= 64 values (~1e-6 rounding), and eps = 1e-5 in the "
    "denominator shifts a variance of ~3-25 by eps/var <= 3.3e-6 relative (layer norm: 1 - "
    "var/(var+eps)); 1e-3 relative is loose for that but a missing mean or wrong divisor is O(1)"};

// A rotation applied in fp32 and scored by a dot product of 8 values: the
// score depends only on the relative position (RoPE's defining property).
inline constexpr Tolerance kRotationInvarianceF32 = {
    1e-5, 1e-5,
    "sin/cos of angles up to ~11 rad in fp32 (~1e-6 each) through a dot product of 8 O(1) "
    "terms: ~1e-6; a wrong frequency or pairing changes the score by O(1e-1)"};

// Analytic gradient against central finite differences of an fp32 kernel.
inline constexpr Tolerance kFiniteDifferenceF32 = {
    2e-3, 2e-2,
    "central differences with h=1e-2 on an fp32 forward (loss summed in double): truncation "
    "error O(h^2)~1e-4 plus forward rounding eps*|L|/h ~ 1e-4 relative; 2% relative covers "
    "both with margin on small gradients"};

// A CUDA kernel against its CPU reference, fp32 (kernels/cuda).
inline constexpr Tolerance kCudaVsCpuF32 = {
    1e-5, 1e-4,
    "fp32 on both sides, but GPU reductions sum in tree order, atomics in arbitrary order, and "
    "expf/tanhf/sincos differ from glibc by a few ulps; 1e-4 relative is ~1000 ulps"};

// A module's forward and backward on CUDA (runtime/backends/cuda:cuda_ops)
// against the same layers on the CPU kernels, fp32, a few layers deep.
inline constexpr Tolerance kCudaModelVsCpuF32 = {
    1e-4, 2e-3,
    "fp32 on both sides; kCudaVsCpuF32's per-op differences (reduction order, a few ulps in "
    "expf/tanhf) compound through two layers, attention and the loss: 20x the per-op bound. "
    "Passed on an H100 and an H200 (2026-11-26; the CUDA emulation runs it in CI); the "
    "largest difference there is not yet recorded, so it is not yet tightened"};

// The same under bf16 mixed precision: CUDA's bf16 (tensor-core GEMMs)
// against the CPU's bf16 (widened operands, sgemm).
inline constexpr Tolerance kCudaModelVsCpuBf16 = {
    1e-4, 2e-2,
    "kCudaModelVsCpuF32's fp32 differences (GEMM summation order, ulps in expf), and then each "
    "narrowing to bf16 can round an element the other way on one side: a 2^-8 = 4e-3 relative "
    "step in that element, mixed into its neighbours by the next layers (as in "
    "kTensorParallelModelBf16). Passes on an H100 (2026-11-26) and on the emulation in CI, "
    "where the sums are the CPU's; a wrong cast or a stale bf16 weight is O(1)"};

// The bf16 memory-efficient attention on tensor cores (kernels/cuda) against
// the CPU's bf16 attention (kernels/attention), which rounds at the same
// points: out, lse, dQ, dK, dV.
inline constexpr Tolerance kCudaFlashBf16VsCpuBf16 = {
    1e-3, 1e-2,
    "both sides take the same bf16 operands and round P, dO and dS to bf16 at the same points, "
    "but sum in another order (tiles of 32 and the tensor cores' accumulation vs sgemm's "
    "blocks) and take expf to other ulps: a P or dS a few fp32 ulps from a bf16 rounding "
    "boundary rounds the other way on one side, a 2^-8 = 4e-3 relative step in that element, "
    "and dS = P (dP - D) can cancel to small values whose rounding is large next to them; a "
    "missed mask, a wrong tile or a stale shared-memory read is O(1)"};

// loom-train-local on CUDA against the CPU run, step by step: the loss and
// the gradient norm as printed (loss to 6 decimals, grad_norm to 4).
inline constexpr Tolerance kCudaTrainingVsCpuF32 = {
    1e-4, 1e-3,
    "kCudaModelVsCpuF32's differences in the gradients move the AdamW update by as little "
    "(AdamW divides by the gradient's own scale), so the weights, and the next steps' losses, "
    "differ by ~1e-5 relative after a few steps; 1e-3 relative leaves room for the printed "
    "grad_norm's 4 decimals (~1e-4 absolute). Measured over 20 steps on an H100 and an H200: "
    "loss 3.1e-7 relative, grad_norm equal at its digits (train_local_device_test); three "
    "workers sharing the GPU against the CPU run: loss equal to 6 decimals, grad_norm 2.9e-5 "
    "(gpu_training_test)"};

// The same under bf16 mixed precision (runtime/model/precision.h): a TP
// layout against one bf16 rank.
inline constexpr Tolerance kTensorParallelModelBf16 = {
    1e-5, 1e-2,
    "kTensorParallelModelF32's fp32 differences, but every GEMM operand and stored activation "
    "is then rounded to bf16 (8 bits): a value a few fp32 ulps from a bf16 rounding boundary "
    "rounds the other way on another layout, a 2^-8 = 4e-3 relative step in that element, "
    "which later layers mix into their neighbours; a missing all-reduce or a wrong slice is "
    "still O(1)"};

// A model's loss and gradients under bf16 mixed precision against the same
// model in fp32 (one microbatch; and the loss a step or two after a run
// switched precision at a checkpoint). Gradients compare by the relative
// norm of their difference over a module (rtol; atol unused there).
inline constexpr Tolerance kBf16VsFp32Model = {
    1e-4, 3e-2,
    "bf16 keeps 8 significant bits: each narrowing moves a value up to 2^-9 = 2e-3 relative; a "
    "value passes ~10 narrowings (GEMM inputs, stored activations) on its way through two "
    "layers and back, which add like a random walk (~sqrt(10) x 2e-3 = 6e-3) and grow where a "
    "norm or softmax backward cancels terms; 3% is 5x that, and a wrong cast (fp16 bits read "
    "as bf16, a stale weight copy, a gradient left in bf16) is O(1)"};

// loom-train-local on CUDA against the CPU run in bf16, step by step.
inline constexpr Tolerance kCudaTrainingVsCpuBf16 = {
    1e-3, 1e-2,
    "kCudaModelVsCpuBf16's differences in the gradients, carried through AdamW into the next "
    "steps' weights and re-narrowed to bf16 each step; 1% of the loss. Measured over 20 steps "
    "on an H100 (2026-11-26, attention on tensor cores): loss 1.4e-4 relative, grad_norm "
    "2.9e-3"};

// A run trained in bf16 mixed precision against the same run in fp32: the
// mean loss of its last 20 steps (tiny-deep, 200 steps).
inline constexpr Tolerance kBf16VsFp32Training = {
    0, 4e-2,
    "kBf16VsFp32Model's per-step differences move the weights a little apart every step and "
    "training amplifies them: after 200 steps the two runs are different samples of the same "
    "training, and a single step's loss swings ~5% from the next. fp32 itself, given only "
    "another summation order (OpenBLAS on 1 vs 2 threads), ends 2.9% apart on the mean of the "
    "last 20 steps (0.7337 vs 0.7127, tiny-deep, cosine); bf16 measured 2.4% and 0.5% from "
    "those (0.7161, 0.7163). 4% is fp32's own spread plus 1%; a bf16 whose attention backward "
    "recomputed scores from other q and k than its forward's spiked (grad_norm 86) and ended "
    "5.7% high"};

// bf16 GEMM (fp32 accumulation) against the fp32 CPU GEMM of the same,
// already bf16-rounded, inputs.
inline constexpr Tolerance kCudaBf16GemmVsCpu = {
    1e-3, 1e-3,
    "inputs are exactly representable (rounded to bf16 first) and products are exact in fp32; "
    "only the fp32 accumulation order differs (tensor-core tiles), K up to 256"};

// The whole model's gradient (ViT, projector, LLM together) against central
// finite differences of its fp32 forward.
inline constexpr Tolerance kFiniteDifferenceModelF32 = {
    5e-4, 5e-2,
    "the forward runs through ~10 fp32 layers, so rounding in the loss is ~1e-6 relative and "
    "is divided by 2h=2e-2 (~1e-4 absolute on O(1) losses): atol is 5x that noise, so a zero "
    "or sign-flipped gradient above ~5e-4 fails; h=1e-2 perturbs softmax and normalisation "
    "non-linearly (O(h^2) curvature), which the 5% relative term covers; a wrong term is O(1)"};

// The same global batch's gradient accumulated over different microbatch
// splits: only the order of fp32 additions differs.
inline constexpr Tolerance kSplitInvarianceF32 = {
    1e-6, 1e-4,
    "identical math, different fp32 summation order across microbatches and packed lengths "
    "(BLAS blocks differently for different M): a few ulps per accumulated term"};

// The golden test: Loom's tiny model against the same model rebuilt in
// PyTorch (CPU, fp32) from Loom's exported weights and inputs
// (tests/golden). Written into the dump, so the Python side reads these.
inline constexpr Tolerance kGoldenLogits = {
    1e-4, 1e-4,
    "same fp32 math in another library: OpenBLAS vs MKL-free torch GEMMs and torch's own "
    "softmax/norm reductions sum in other orders; through 2+2 layers this stays ~1e-6 "
    "relative, 1e-4 leaves room without hiding a wrong term (those are O(1e-2) and up)"};
inline constexpr Tolerance kGoldenGrads = {
    1e-6, 2e-3,
    "gradients are small (1/loss_tokens scaling) and some are sums of many cancelling terms, "
    "so their relative error is larger than the logits'; 0.2% still catches a missing or "
    "wrong term"};
inline constexpr Tolerance kGoldenLosses = {
    1e-5, 1e-4,
    "ten AdamW steps compound the per-step differences above; Adam's normalisation amplifies "
    "differences on near-zero gradients, so allow 1e-4 relative on the loss"};

// Loom's image processor (runtime/hf/hf_image.h) against PIL's resize and
// the same rescale and normalisation in Python, in normalised pixel units.
inline constexpr Tolerance kImageProcessorVsPil = {
    0.016, 0,
    "bicubic keeps 8 bits between passes as PIL does and matches it to float rounding; "
    "bilinear keeps floats where PIL rounds to 8 bits between its passes in fixed point, "
    "so a pixel may land one level of 255 off, 0.015 after normalising by CLIP's std of "
    "0.26; a wrong filter, crop offset or channel order is tens of levels"};

// A tensor-parallel layer (runtime/parallel) against the same layer on one
// device: the contraction over K is split into tp partial sums that the
// all-reduce adds, so only the order of fp32 additions differs.
inline constexpr Tolerance kTensorParallelF32 = {
    1e-6, 1e-5,
    "K <= 16 products of O(1) values summed in tp parts then all-reduced: each partial sum and "
    "the reduction round at eps 6e-8 of values up to ~5, ~1e-6 absolute at most; a missing or "
    "doubled all-reduce, or a wrong slice, is O(1e-1)"};

// A whole module (the ViT, the LLM: two layers, vocab-parallel loss) split
// over tp ranks against the module on one rank.
inline constexpr Tolerance kTensorParallelModelF32 = {
    1e-6, 1e-4,
    "every row-parallel output, every column-parallel input gradient and the softmax sums are "
    "added in tp parts then all-reduced: a few fp32 roundings per layer that LayerNorm/RMSNorm "
    "backward and attention's softmax amplify on small, cancelling gradients (1e-5 relative "
    "seen on the smallest); a missing all-reduce, a doubled bias or a wrong slice is >1e-2"};

// A Gloo allreduce (ring, fp32) of N ranks' vectors against their sum in
// rank order (runtime/comm).
inline constexpr Tolerance kAllreduceSumF32 = {
    1e-5, 1e-6,
    "the ring adds the ranks' fp32 values in another order than rank order: a few ulps of "
    "sums up to ~40 (eps 6e-8 x 40 ~ 2.4e-6 per rounding, two roundings at most for 4 ranks)"};

// The same training run with its global batch split into 1 or 4
// microbatches, loss by loss over five AdamW steps (runtime/train).
inline constexpr Tolerance kSplitInvarianceTrajectoryF32 = {
    1e-7, 1e-6,
    "measured 2e-8 absolute (4e-9 relative) at worst over 5 steps of the tiny model: fp32 "
    "partial sums in another order, carried through AdamW; 1e-6 relative leaves ~250x margin "
    "while a wrong loss scale (per-microbatch instead of global token count) is O(1e-1)"};

// Disaggregated training (encoder and LLM workers, separate processes)
// against loom-train-local on the same data and seed, per-step loss over 20
// steps (tests/integration/distributed_test). Also a resumed run against an
// uninterrupted one.
inline constexpr Tolerance kDisaggregatedVsLocalLoss = {
    1e-5, 1e-5,
    "the same fp32 math; what differs is only the order of additions: bins group samples "
    "differently from the local contiguous split, each module's gradient is a ring-allreduce "
    "sum of rank partials, and the global norm adds two modules' Σg² separately. Measured "
    "equal to 6 decimals over 20 AdamW steps; 1e-5 relative still catches a wrong scale "
    "(a missing 1/loss_tokens or clip is O(1e-2) by step 2)"};

// The held-out loss (data.validation) of the same runs after the same steps:
// the same sums as a training step's loss over other samples, so the same
// bound.
inline constexpr Tolerance kDisaggregatedVsLocalValidationLoss = {
    1e-5, 1e-5,
    "a validation batch's loss is a training step's loss sum without its step: the same fp32 "
    "math in bins instead of the local contiguous split, taken after weights already equal "
    "within kDisaggregatedVsLocalLoss; measured equal to 6 decimals (LLM PP2, encoder DP2)"};

// loom up in bf16 mixed precision against loom-train-local in bf16, step
// by step: the loss and the gradient norm.
inline constexpr Tolerance kDisaggregatedVsLocalBf16 = {
    1e-4, 4e-3,
    "kDisaggregatedVsLocalLoss's reordered fp32 sums (bins, ring all-reduces, TP partial sums), "
    "but every GEMM operand and stored activation is then narrowed to bf16, so a value a few "
    "ulps from a rounding boundary rounds the other way on one side (a 2^-8 = 4e-3 step in "
    "that element: kTensorParallelModelBf16), and AdamW carries that into the next steps. "
    "Measured over 10 steps (encoder TP2 x DP2, LLM TP2 x PP2): loss 3.4e-5, grad_norm 9.8e-4 "
    "relative; the bound is that one bf16 step, 4x the grad_norm seen"};

// The same runs' global gradient norm (before clipping) step by step.
inline constexpr Tolerance kDisaggregatedVsLocalGradNorm = {
    1e-4, 1e-5,
    "loom-train-local prints grad_norm with 4 decimals (rounding <= 5e-5), loom up with 6. "
    "Measured over distributed_test: <= 5e-5 against loom-train-local in every layout (2.4e-5 "
    "relative on norms of 1.6-6, 2.4e-4 on stage 1's projector-only norms of ~0.2: the "
    "rounding), and <= 6.4e-7 relative between two loom up runs, the math's own difference. "
    "1e-4 is 2x the rounding; one module's gradients scaled by 2 move the norm by ~1 "
    "relative, where without clipping the loss stays within 6e-6"};

// The same runs' step-20 checkpoints (tests/integration/distributed_test):
// every element of every tensor of every module (weights, AdamW m and v),
// against the largest magnitude of its tensor (v is ~g^2, far below the
// weights).
inline constexpr Tolerance kDisaggregatedVsLocalCheckpoint = {
    0, 1e-4,
    "kDisaggregatedVsLocalLoss's reordered fp32 sums carried through 20 AdamW steps: measured "
    "at most 3.6e-6 (weights), 4.6e-6 (m), 2.4e-6 (v) over 3 runs, 8.3e-6 with clipping off, "
    "of a tensor's largest magnitude, on biases and norm gains; 1e-4 is 12x that. The LLM's "
    "gradients doubled after the norm moved its m by 1.0 and v by 3.0 while every loss "
    "stayed within 4e-6"};

// A bin's cost summed from the same samples in another order of double
// additions (an assignment's largest bin computed by two implementations).
inline constexpr Tolerance kSameSumOtherOrderF64 = {
    0, 1e-12,
    "the same doubles added in another order: up to ~100 terms, each rounding <= 1.1e-16 "
    "relative, so <= ~1e-14; 1e-12 cannot hide a different assignment (costs differ by >1e-6)"};

// An ILP solution from COIN-OR CBC against its known optimum.
inline constexpr Tolerance kIlpSolver = {
    1e-6, 1e-6,
    "CBC accepts a solution within its integrality and primal tolerances (1e-7 and 1e-6 by "
    "default) of the constraints, so its C can be that far above the true maximum bin"};

// The productive training time loom up prints against the sum of the kept
// iterations' times it printed (tests/integration/recovery_test).
inline constexpr Tolerance kPrintedSecondsSum = {
    1e-4, 0,
    "20 times printed with 6 decimals (each off by <= 5e-7) summed, against a sum printed "
    "with 6 decimals: <= ~1.1e-5 s; an iteration missing or counted twice is >= 1e-2 s"};

inline double ClosedFormF32(double want) { return Allowed(kClosedFormF32, want); }
inline double ClosedFormF64(double want) { return Allowed(kClosedFormF64, want); }

}  // namespace loom::testing

#endif  // LOOM_KERNELS_TESTING_TOLERANCES_H_
