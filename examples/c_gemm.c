/* The smallest use of coda's C ABI: D = A · Bᵀ (an nn.Linear forward) on host memory, which
 * runs the CPU backend, checked against a plain loop; then a bad call and the message that says
 * what to fix. The same call with device pointers (CODA_DEVICE_CUDA) runs the sm_90a GEMM. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "coda/coda.h"

/* float -> bf16, round to nearest even (finite inputs). */
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

enum { M = 3, N = 8, K = 16 };

int main(void) {
  uint16_t a[M * K], b[N * K];
  float d[M * N];
  for (int i = 0; i < M * K; ++i) a[i] = to_bf16((float)((i * 7) % 11) / 11.0f - 0.5f);
  for (int i = 0; i < N * K; ++i) b[i] = to_bf16((float)((i * 5) % 13) / 13.0f - 0.5f);

  coda_gemm_args args;
  memset(&args, 0, sizeof args);
  args.layout = CODA_GEMM_FWD;
  args.a = coda_matrix(a, CODA_BF16, M, K, CODA_DEVICE_CPU);
  args.b = coda_matrix(b, CODA_BF16, N, K, CODA_DEVICE_CPU); /* [out, in], as nn.Linear */
  args.d = coda_matrix(d, CODA_F32, M, N, CODA_DEVICE_CPU);
  args.alpha = coda_scalar_value(1.0f); /* or value * a [1] f32 tensor: coda_scalar_tensor */
  if (coda_gemm(&args, NULL) != CODA_OK) return printf("%s\n", coda_last_error()), 1;

  double worst = 0;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double ref = 0;
      for (int k = 0; k < K; ++k) ref += (double)from_bf16(a[m * K + k]) * from_bf16(b[n * K + k]);
      worst = fmax(worst, fabs(ref - d[m * N + n]));
    }
  printf("coda_gemm %dx%dx%d: max |D - reference| = %.2e\n", M, N, K, worst);

  args.b = coda_matrix(b, CODA_BF16, K, N, CODA_DEVICE_CPU); /* transposed by mistake */
  coda_status s = coda_gemm(&args, NULL);
  printf("a wrong call returns %d: %s\n", (int)s, coda_last_error());
  return worst < 1e-5 && s == CODA_INVALID_ARGUMENT ? 0 : 1;
}
