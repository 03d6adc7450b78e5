// bf16 (bfloat16: fp32's sign and 8-bit exponent, 7 mantissa bits) as raw
// uint16 bit patterns, the storage of bf16 mixed precision on the CPU
// (runtime/model/precision.h) and of BF16 safetensors. Narrowing rounds to
// nearest even; NaN stays a quiet NaN; widening is exact.
#ifndef LOOM_KERNELS_MATMUL_BF16_H_
#define LOOM_KERNELS_MATMUL_BF16_H_

#include <cstdint>
#include <cstring>

namespace loom::kernels {

inline float Bf16ToF32(uint16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it one (quiet)
    return static_cast<uint16_t>((bits >> 16) | 0x40);
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

// `f` rounded to the nearest bf16 value, as fp32.
inline float RoundToBf16(float f) { return Bf16ToF32(F32ToBf16(f)); }

// n values each way.
void F32ToBf16(uint16_t* dst, const float* src, int64_t n);
void Bf16ToF32(float* dst, const uint16_t* src, int64_t n);
// x rounded in place, each to the nearest bf16 value.
void RoundToBf16(float* x, int64_t n);

}  // namespace loom::kernels

#endif  // LOOM_KERNELS_MATMUL_BF16_H_
