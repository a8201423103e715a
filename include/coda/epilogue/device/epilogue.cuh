// The device epilogue API in one include: the driver, every op, and the fused-GEMM launcher.
// A fused kernel is an op list on FusedShape, e.g. (examples/fused_geglu.cuh)
//   using Epi = FusedEpilogue<FusedShape, ScalePerRow<FusedShape>, TileStore<FusedShape, bf16>>;
//   typename Epi::Params p{};        // get<i>(p) = the i-th op's Params
//   FusedGemm<Epi, bf16>::run(a, w, p, stream);
// docs/epilogue.md describes the lifecycle and how to write an op.
#pragma once

#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/launch.cuh"
#include "coda/epilogue/device/ops/aux_reduce.cuh"
#include "coda/epilogue/device/ops/gated_pair.cuh"
#include "coda/epilogue/device/ops/quantize_tile_transposed.cuh"
#include "coda/epilogue/device/ops/reduce_over_m.cuh"
#include "coda/epilogue/device/ops/reduce_over_n.cuh"
#include "coda/epilogue/device/ops/residual_add.cuh"
#include "coda/epilogue/device/ops/rms_norm_backward.cuh"
#include "coda/epilogue/device/ops/rms_norm_backward_strips.cuh"
#include "coda/epilogue/device/ops/rope.cuh"
#include "coda/epilogue/device/ops/scalar.cuh"
#include "coda/epilogue/device/ops/scale_per_col.cuh"
#include "coda/epilogue/device/ops/scale_per_row.cuh"
#include "coda/epilogue/device/ops/select_per_row.cuh"
#include "coda/epilogue/device/ops/store.cuh"
#include "coda/epilogue/device/ops/swiglu_backward.cuh"
