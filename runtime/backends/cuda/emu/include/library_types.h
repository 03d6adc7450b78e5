// The CUDA emulation's library_types.h: data types and library properties.
#ifndef LOOM_CUDA_EMU_LIBRARY_TYPES_H_
#define LOOM_CUDA_EMU_LIBRARY_TYPES_H_

typedef enum cudaDataType_t {
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16F = 2,
  CUDA_R_16BF = 14,
} cudaDataType;

typedef enum libraryPropertyType_t {
  MAJOR_VERSION,
  MINOR_VERSION,
  PATCH_LEVEL,
} libraryPropertyType;

#endif  // LOOM_CUDA_EMU_LIBRARY_TYPES_H_
