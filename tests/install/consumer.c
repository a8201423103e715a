/* A C program against an installed coda: the headers and the library it was built with agree
 * on the version, a small GEMM on the CPU backend is right, and a wrong call is an error with a
 * message. Exit 0 when all hold. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "coda/coda.h"

static int fail(const char* what) {
  printf("c_consumer: %s\n", what);
  return 1;
}

int main(void) {
  enum { M = 3, N = 8, K = 8 };
  float a[M * K], b[N * K], d[M * N];
  coda_gemm_args args;
  int i, j, k;
  if (strcmp(coda_version(), CODA_VERSION_STRING) != 0) return fail("version mismatch");
  for (i = 0; i < M * K; ++i) a[i] = (float)(i % 5) - 2.f;
  for (i = 0; i < N * K; ++i) b[i] = (float)(i % 3) - 1.f;
  memset(&args, 0, sizeof args);
  args.layout = CODA_GEMM_FWD;
  args.alpha = coda_scalar_value(1.f);
  /* f32 operands are not GEMM inputs: the call must fail and say why. */
  args.a = coda_matrix(a, CODA_F32, M, K, CODA_DEVICE_CPU);
  args.b = coda_matrix(b, CODA_F32, N, K, CODA_DEVICE_CPU);
  args.d = coda_matrix(d, CODA_F32, M, N, CODA_DEVICE_CPU);
  if (coda_gemm(&args, NULL) != CODA_TYPE_ERROR || strlen(coda_last_error()) == 0)
    return fail("an f32 operand was not a type error");
  {
    /* bf16 inputs: the values above are exact in bf16 (the high half of the f32 bits). */
    unsigned short a16[M * K], b16[N * K];
    unsigned int bits;
    for (i = 0; i < M * K; ++i) memcpy(&bits, &a[i], 4), a16[i] = (unsigned short)(bits >> 16);
    for (i = 0; i < N * K; ++i) memcpy(&bits, &b[i], 4), b16[i] = (unsigned short)(bits >> 16);
    args.a = coda_matrix(a16, CODA_BF16, M, K, CODA_DEVICE_CPU);
    args.b = coda_matrix(b16, CODA_BF16, N, K, CODA_DEVICE_CPU);
    if (coda_gemm(&args, NULL) != CODA_OK) return fail(coda_last_error());
  }
  for (i = 0; i < M; ++i)
    for (j = 0; j < N; ++j) {
      float ref = 0.f;
      for (k = 0; k < K; ++k) ref += a[i * K + k] * b[j * K + k];
      if (fabsf(d[i * N + j] - ref) > 0.f) return fail("wrong GEMM result");
    }
  printf("c_consumer: coda %s, GEMM and error path ok\n", coda_version());
  return 0;
}
