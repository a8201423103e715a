// partial reductions
// STUB: replaced by the GPU implementation in progress.
#include "coda/core/error.hpp"
#include "gpu/kernels_aux.hpp"

namespace coda::gpu {
void rstd_from_partials(const RstdArgs&, Stream) {
  throw Error(Status::not_supported, "rstd_from_partials: not yet on the GPU");
}
void reduce_row_partials(const RowReduceArgs&, Stream) {
  throw Error(Status::not_supported, "reduce_row_partials: not yet on the GPU");
}
void reduce_col_partials(const ColReduceArgs&, Stream) {
  throw Error(Status::not_supported, "reduce_col_partials: not yet on the GPU");
}
} // namespace coda::gpu
