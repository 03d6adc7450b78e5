// The CUDA emulation's cuda_bf16.h: bf16 storage and its conversions.
#ifndef LOOM_CUDA_EMU_CUDA_BF16_H_
#define LOOM_CUDA_EMU_CUDA_BF16_H_

#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  uint16_t x;
};

// Round to nearest even; a NaN stays a (quiet) NaN.
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<uint16_t>(u >> 16)};
}

inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t u = static_cast<uint32_t>(h.x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

#endif  // LOOM_CUDA_EMU_CUDA_BF16_H_
