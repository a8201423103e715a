// Host side: the TMA descriptors of the tiles epilogue ops load and store, one subtile per box.
#pragma once

#include <string>

#include "coda/core/error.hpp"
#include "coda/core/tensor.hpp"
#include "coda/gemm/tensor_map.hpp"

namespace coda::epilogue::device {

// A [rows, cols] row-major tensor moved in 64 x 32 subtiles, swizzled by the subtile's row bytes
// (64 for 16-bit elements, 128 for fp32), as coda/epilogue/device/tile_io.cuh lays them out; or
// in boxes of `box_rows` rows of such a subtile (a multiple of 8: the swizzle pattern repeats
// every 8 rows, so a box of whole 8-row groups keeps the subtile's layout).
inline CUtensorMap subtile_map(const char* what, const TensorView& t, uint32_t box_rows = 64) {
  const bool wide = dtype_size(t.dtype) == 4;
  return sm90::make_tensor_map(
      what, sm90::TensorMapShape{t.data, t.dtype, uint64_t(t.shape[1]), uint64_t(t.shape[0]),
                                 uint64_t(t.stride[0]), 32, box_rows,
                                 wide ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B});
}

// A 16-bit [rows, cols] tensor written in 64 x 16 boxes (the half-width output of a pairwise
// 2 -> 1 op), 32-byte rows with the 32-byte swizzle (GatedPairStore's layout).
inline CUtensorMap half_subtile_map(const char* what, const TensorView& t) {
  return sm90::make_tensor_map(
      what, sm90::TensorMapShape{t.data, t.dtype, uint64_t(t.shape[1]), uint64_t(t.shape[0]),
                                 uint64_t(t.stride[0]), 16, 64, CU_TENSOR_MAP_SWIZZLE_32B});
}

// A 16-bit [rows, 2 cols] tensor of (even, odd) element pairs, e.g. the interleaved (gate, up)
// pre-activation, moved as a [rows, cols] tensor of 32-bit containers: element (m, j) of the
// map is the pair (2j, 2j + 1) of row m, so its 64 x 32 subtiles line up with the accumulator's
// (SubtileLayout<float>: 128-byte rows, 128-byte swizzle). TMA moves the bits as they are.
inline CUtensorMap pair_subtile_map(const char* what, const TensorView& t) {
  if (dtype_size(t.dtype) != 2 || t.shape[1] % 2 != 0 || t.stride[0] % 2 != 0)
    throw Error(Status::internal, std::string(what) +
                                      ": pair containers need a 16-bit tensor with an even "
                                      "number of columns and an even row stride");
  return sm90::make_tensor_map(
      what, sm90::TensorMapShape{t.data, DType::f32, uint64_t(t.shape[1] / 2), uint64_t(t.shape[0]),
                                 uint64_t(t.stride[0] / 2), 32, 64, CU_TENSOR_MAP_SWIZZLE_128B});
}

} // namespace coda::epilogue::device
