/* coda.h must stay plain C99: this file is only compiled (ctest c_header_is_c99), never run.
 * The block's header comes first: it stands alone (on coda/core/types.h), with no include loop. */
#include "coda/block/llama.h"
#include "coda/coda.h"

/* C99 has no static_assert: a negative array size fails the compile instead. */
typedef char coda_tensor_layout_is_fixed[sizeof(coda_tensor) == 88 ? 1 : -1];
typedef char coda_stream_is_a_pointer[sizeof(coda_stream_t) == sizeof(void*) ? 1 : -1];
typedef char coda_scalar_layout_is_fixed[sizeof(coda_scalar) == 96 ? 1 : -1];

coda_status coda_header_check_scalars(float* factor, float* partials, float* out);

/* coda_scalar_value and coda_scalar_tensor are C99 too. */
coda_status coda_header_check_scalars(float* factor, float* partials, float* out) {
  coda_row_reduce_args args;
  args.partials = coda_matrix(partials, CODA_F32, 2, 1, CODA_DEVICE_CPU);
  args.scale = coda_scalar_value(0.5f);
  args.scale = coda_scalar_tensor(0.5f, coda_vector(factor, CODA_F32, 1, CODA_DEVICE_CPU));
  args.out = coda_vector(out, CODA_F32, 2, CODA_DEVICE_CPU);
  return coda_reduce_row_partials(&args, (coda_stream_t)0);
}

coda_status coda_header_check_call(float* stacked_rows, float* fused_rows);

coda_status coda_header_check_call(float* stacked_rows, float* fused_rows) {
  const coda_tensor stacked = coda_matrix(stacked_rows, CODA_F32, 2, 8, CODA_DEVICE_CPU);
  const coda_tensor fused = coda_matrix(fused_rows, CODA_F32, 2, 8, CODA_DEVICE_CPU);
  return coda_interleave_gate_up(&stacked, &fused, (coda_stream_t)0);
}
