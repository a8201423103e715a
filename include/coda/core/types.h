/* The C ABI's shared vocabulary: the export macro, the stream, status codes and
 * coda_last_error(), dtypes, devices, the tensor descriptor and the scale factor. Plain C99.
 * coda/coda.h (the kernels) and coda/block/llama.h (the Llama block) both build on it; include
 * coda/coda.h for the whole C ABI. */
#ifndef CODA_CORE_TYPES_H
#define CODA_CORE_TYPES_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define CODA_API __attribute__((visibility("default")))
#else
#define CODA_API
#endif

#define CODA_MAX_RANK 4

#ifdef __cplusplus
extern "C" {
#endif

/* The same type as cudaStream_t; NULL is the default stream. */
typedef struct CUstream_st* coda_stream_t;

/* Values equal coda::Status. Python maps them to ValueError, TypeError, NotImplementedError
 * (the caller may fall back to another implementation) and RuntimeError. */
typedef enum coda_status {
  CODA_OK = 0,
  CODA_INVALID_ARGUMENT = 1, /* shape, stride, alignment, null pointer, overlap, bad scalar */
  CODA_TYPE_ERROR = 2,       /* wrong or mismatched dtype */
  CODA_NOT_SUPPORTED = 3,    /* valid, but this build or GPU cannot run it */
  CODA_CUDA_ERROR = 4,       /* the CUDA runtime or a kernel launch failed */
  CODA_INTERNAL = 5          /* a bug in coda, or out of host memory */
} coda_status;

/* Values equal coda::DType. Struct fields hold them as int32_t for a fixed layout. E4M3: FP8
 * codes; E8M0: one byte per power-of-two block scale, the value 2^(byte - 127) (docs/fp8.md). */
typedef enum coda_dtype {
  CODA_BF16 = 0,
  CODA_F16 = 1,
  CODA_F32 = 2,
  CODA_I32 = 3,
  CODA_E4M3 = 4,
  CODA_E8M0 = 5
} coda_dtype;

typedef enum coda_device { CODA_DEVICE_CPU = 0, CODA_DEVICE_CUDA = 1 } coda_device;

/* A non-owning strided view, field for field coda::TensorView. Shapes are row-major, strides in
 * elements. An optional tensor is absent when data == NULL. */
typedef struct coda_tensor {
  void* data;
  int32_t dtype; /* coda_dtype */
  int32_t rank;
  int64_t shape[CODA_MAX_RANK];
  int64_t stride[CODA_MAX_RANK];
  int32_t device; /* coda_device */
  int32_t device_index;
} coda_tensor;

/* Contiguous row-major views, the common case (device_index 0). */
static inline coda_tensor coda_matrix(void* data, coda_dtype dtype, int64_t rows, int64_t cols,
                                      coda_device device) {
  coda_tensor t;
  int i;
  for (i = 0; i < CODA_MAX_RANK; ++i) t.shape[i] = t.stride[i] = 0;
  t.data = data;
  t.dtype = (int32_t)dtype;
  t.rank = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.stride[0] = cols;
  t.stride[1] = 1;
  t.device = (int32_t)device;
  t.device_index = 0;
  return t;
}
static inline coda_tensor coda_vector(void* data, coda_dtype dtype, int64_t n, coda_device device) {
  coda_tensor t = coda_matrix(data, dtype, n, 1, device);
  t.rank = 1;
  t.stride[0] = 1;
  t.shape[1] = t.stride[1] = 0;
  return t;
}

/* A scale factor, field for field coda::Scalar: value * tensor[0] when the optional [1] f32
 * tensor (on the call's device, read there: no host synchronization) is given, value alone
 * otherwise. Used by coda_gemm_args.alpha, coda_row_reduce_args.scale and K6's alpha. */
typedef struct coda_scalar {
  float value;
  coda_tensor tensor; /* optional [1] f32: value * (*tensor) when given */
} coda_scalar;

/* A number alone: coda_scalar_value(1.0f). */
static inline coda_scalar coda_scalar_value(float value) {
  coda_scalar s;
  s.value = value;
  s.tensor = coda_vector(NULL, CODA_F32, 0, CODA_DEVICE_CPU); /* data NULL: absent */
  return s;
}
/* value * tensor[0], tensor a [1] f32 view on the call's device. */
static inline coda_scalar coda_scalar_tensor(float value, coda_tensor tensor) {
  coda_scalar s;
  s.value = value;
  s.tensor = tensor;
  return s;
}

/* The message of the last call on this thread that returned an error; successful calls leave
 * it unchanged. "" when no call on this thread has failed. Valid until the next failing call on
 * this thread. */
CODA_API const char* coda_last_error(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CODA_CORE_TYPES_H */
