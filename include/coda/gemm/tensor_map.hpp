// Host-side TMA descriptors (CUtensorMap) for row-major 2-D tensors. The driver's encoder is
// fetched through the runtime, so libcoda does not link libcuda.
#pragma once

#include <cstdint>
#include <sstream>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "coda/core/error.hpp"
#include "coda/core/types.hpp"

namespace coda::sm90 {

struct TensorMapShape {
  const void* base;
  DType dtype;
  uint64_t cols, rows; // the tensor: rows x cols, row-major
  uint64_t row_stride; // elements between rows
  uint32_t box_cols, box_rows;
  CUtensorMapSwizzle swizzle;
};

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      entry = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(entry);
  }();
  if (!fn)
    throw Error(Status::cuda_error, "cuTensorMapEncodeTiled is not available from the CUDA driver");
  return fn;
}

inline CUtensorMapDataType tensor_map_dtype(DType t) {
  switch (t) {
  case DType::bf16:
    return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  case DType::f16:
    return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  case DType::f32:
    return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  case DType::e4m3: // TMA copies bytes; only wgmma reads them as E4M3
    return CU_TENSOR_MAP_DATA_TYPE_UINT8;
  default:
    throw Error(Status::type_error, "TMA operands are bf16, f16, f32 or e4m3");
  }
}

// `what` names the operand in error messages ("A", "B", ...). Out-of-bounds elements of a box
// read as zero and are never written.
inline CUtensorMap make_tensor_map(const char* what, const TensorMapShape& s) {
  const uint64_t elem = uint64_t(dtype_size(s.dtype));
  const uint64_t stride_bytes = s.row_stride * elem;
  if (reinterpret_cast<uintptr_t>(s.base) % 16 != 0 || stride_bytes % 16 != 0 ||
      s.cols > s.row_stride) {
    std::ostringstream msg;
    msg << what << " must be 16-byte aligned with 16-byte aligned rows for TMA; got pointer "
        << s.base << " and a row stride of " << stride_bytes << " bytes";
    throw Error(Status::invalid_argument, msg.str());
  }
  CUtensorMap map;
  const cuuint64_t dims[2] = {s.cols, s.rows};
  const cuuint64_t strides[1] = {stride_bytes};
  const cuuint32_t box[2] = {s.box_cols, s.box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r =
      tensor_map_encoder()(&map, tensor_map_dtype(s.dtype), 2, const_cast<void*>(s.base), dims,
                           strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, s.swizzle,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::ostringstream msg;
    msg << "cuTensorMapEncodeTiled failed for " << what << " (error " << int(r) << ", " << s.rows
        << " x " << s.cols << ", box " << s.box_rows << " x " << s.box_cols << ")";
    throw Error(Status::internal, msg.str());
  }
  return map;
}

} // namespace coda::sm90
