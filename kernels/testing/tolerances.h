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

// Fast (blocked, vectorised) CPU kernel against its plain reference, fp32.
inline constexpr Tolerance kFastVsReferenceF32 = {
    1e-5, 1e-5,
    "fp32 sums of up to ~1e3 terms of O(1) values taken in another order (BLAS blocks and "
    "vectorises K): rounding grows like sqrt(K)*eps(6e-8)*|terms| ~ 2e-6 relative"};

// Analytic gradient against central finite differences of an fp32 kernel.
inline constexpr Tolerance kFiniteDifferenceF32 = {
    2e-3, 2e-2,
    "central differences with h=1e-2 on an fp32 forward (loss summed in double): truncation "
    "error O(h^2)~1e-4 plus forward rounding eps*|L|/h ~ 1e-4 relative; 2% relative covers "
    "both with margin on small gradients"};

}  // namespace loom::testing

#endif  // LOOM_KERNELS_TESTING_TOLERANCES_H_
