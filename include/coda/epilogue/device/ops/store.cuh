// Device side of TileStore (coda/epilogue/ops/store.hpp): the fragment's current values, rounded
// once to T, written to an [M, N] tensor: the main output or a side output taken at this point
// of the op chain. Registers -> swizzled shared memory (stmatrix for 16-bit) -> TMA store, which
// clips rows and columns past the edges. kReduceAdd stores by TMA reduce-add instead
// (out += value, in T: the existing value and the sum each round once; no atomics). kInPlace
// (one store of a list, on the staged schedule) stores from the staged tile itself.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda.h>
#include <cuda/ptx>

#include "coda/epilogue/device/driver.cuh"
#include "coda/epilogue/device/tensor_maps.hpp"
#include "coda/epilogue/device/tile_io.cuh"

namespace coda::epilogue::device {

template <class Shape, class T, bool kReduceAdd = false, bool kInPlace = false>
struct TileStore : OpBase {
  using Layout = SubtileLayout<T>;
  // In place (the staged schedule's main output): the values go back into the staged subtile the
  // driver read them from, and the TMA store reads them there: no buffers of its own. Elsewhere,
  // or without kInPlace, two buffers per warpgroup (the driver alternates the slot per subtile).
  static constexpr bool kUsesStage = kInPlace && Shape::kStaged;
  static_assert(!kUsesStage || sizeof(T) == 2, "the staged tile holds 16-bit values");
  static_assert(!(kUsesStage && kReduceAdd), "in-place stores overwrite: no reduce-add");

  struct Params {
    CUtensorMap map; // subtile_map of the output
  };
  struct OwnBuffers {
    alignas(1024) uint8_t tile[Shape::kWarpgroups][2][Layout::kBytes];
  };
  using SharedStorage = std::conditional_t<kUsesStage, OpBase::SharedStorage, OwnBuffers>;

  using Ctx = OpContext<Params, SharedStorage>;

  __device__ void visit(const Ctx& c, const Subtile& st, float (&v)[16]) {
    write_subtile<T>(buffer(c, st), c.wg.thread, v);
  }

  __device__ void issue(const Ctx& c, const Subtile& st) {
    namespace ptx = cuda::ptx;
    if constexpr (kUsesStage) {
      // In place, the map's boxes are kStripRows rows, so that a warp-local epilogue stores its
      // warp's rows alone (st.rows of them; a whole subtile in kStripRows-row boxes elsewhere).
      for (int r = 0; r < st.rows; r += kStripRows)
        store_subtile(&c.params.map, st.staged + r * Layout::kRowBytes, st.col0, st.row0 + r);
      return;
    }
    const int32_t coords[2] = {st.col0, st.row0};
    if constexpr (kReduceAdd)
      ptx::cp_reduce_async_bulk_tensor(ptx::space_global, ptx::space_shared, ptx::op_add,
                                       &c.params.map, coords, buffer(c, st));
    else
      store_subtile(&c.params.map, buffer(c, st), st.col0, st.row0);
  }

  static Params params(const char* what, const TensorView& out) {
    return Params{kUsesStage ? subtile_map(what, out, kStripRows) : subtile_map(what, out)};
  }

private:
  __device__ static uint8_t* buffer(const Ctx& c, const Subtile& st) {
    if constexpr (kUsesStage)
      return st.staged;
    else
      return c.smem.tile[c.wg.index][st.slot];
  }
};

} // namespace coda::epilogue::device
