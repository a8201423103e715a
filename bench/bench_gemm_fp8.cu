// coda's block-scaled FP8 GEMM (coda::gemm_fp8) against cuBLASLt's FP8 GEMM with the same block
// scaling, on the GEMM shapes of a Llama block (and two squares), beside cuBLASLt's per-tensor
// scaled FP8 GEMM and its bf16 GEMM of the same shape. Each case is D [M, N] bf16 = A [M, K] ·
// B [N, K]ᵀ in gemm_fp8's only layout (A e4m3 row-major, B e4m3 K-major; an FP8 training step
// makes K-major copies for every GEMM anyway, docs/fp8.md), with the case's M, N and K. All run
// in this process on the same random inputs, interleaved run by run; each timed run follows a
// 256 MB write that flushes L2; the median of the timed runs is reported.
//
//   bench_gemm_fp8 [--commit HASH] [--out bench/results/fp8.json] [--runs 50] [--filter SUBSTRING]
//                  [--fast-accum 0] [--shapes M,N,K;M,N,K...]
// (--shapes: forward-layout GEMMs of these sizes, named "mMxnNxkK", instead of the block's GEMMs:
// a sweep along one dimension with the others fixed)
// (flags as "--name value" or "--name=value"; --commit defaults to $CODA_COMMIT; --fast-accum 1
// runs the per-tensor cuBLASLt GEMM with CUBLASLT_MATMUL_DESC_FAST_ACCUM, no promotion out of
// the tensor cores' accumulators)
//
// Inputs: e4m3 codes uniform over the finite bytes, e8m0 scales 2^-3 .. 2^3, one per 1 x 128
// block of A ([M, ceil(K/128)] row-major bytes) and per 128 x 128 block of B
// ([ceil(N/128), ceil(K/128)]). cuBLASLt reads fp32 copies of the same scales (exact:
// 2^(byte - 127)): VEC128_32F for the activations, BLK128x128_32F for the weight. Which memory
// layout cuBLASLt expects for those fp32 tensors is not settled by its header (public notes
// disagree), so each case tries every candidate layout pair (ScaleLayout) and keeps the one whose
// D agrees with coda's: largest |D_cublas - D_coda| over all of D below kAgreeTolerance of
// max |D_coda|. Both accumulate products of codes in fp32 with a promotion per 128-deep K block;
// what is left is the tensor cores' reduced-precision partial sums and bf16 rounding, far below
// that tolerance, while a wrong layout scales most blocks by another power of two (an error of
// order 1). A case without an agreeing pair is a mismatch: printed, and written with
// "cublas_blockscaled_ms": null and "agree": false rather than timing another product. A
// configuration for which cuBLASLt's heuristic has no algorithm is null too, and said so.
//
// coda runs on each of its tiles, forced (gpu::gemm_fp8_with_tile), interleaved with the rest:
// "coda_tile128_ms" the cooperative 128 x 128 tile (what "coda_ms" measured before 2026-12-06),
// "coda_tile192_ms" the 128 x 192 tile with its halves' overlapped promotion,
// "coda_tile192_one_partial_ms" the 128 x 192 tile with one partial (docs/fp8.md, "The 128 x 192
// tile"), "coda_staged_ms" the 128 x 128 tile's consumers on the staged schedule (the epilogue in
// a fourth warpgroup, under the next tile's MMAs; sm90::Fp8Tile::n128_staged),
// and "coda_staged_one_partial_ms" the staged tile with one partial (the fused kernels' staged
// FP8 consumers, their floor). Each of those Ds must equal the 128 x 128 one bit for bit (the same
// promotions in the same order, rounded once to bf16): a case where it does not is printed as a
// TILE MISMATCH with its count of differing elements, and its column is null where the difference
// exceeds kAgreeTolerance (another product, not a timing of this one). The tile gemm_fp8 itself
// runs (its heuristic, sm90::choose_fp8_tile) is printed per case, and "coda_ms" is that tile's
// time: what a call of gemm_fp8 costs.
//
// Prints a table (TFLOP/s = 2 M N K / t of each side; cublas_blockscaled_ms / coda_ms and
// cublas_bf16_ms / coda_ms, above 1 where coda is faster; coda_tile128_ms / coda_tile192_ms,
// above 1 where the 192-column tile is faster than the cooperative 128 x 128 one;
// coda_tile128_ms / coda_staged_ms likewise) and the geometric means of those ratios over the 24
// block GEMMs, and writes
//   {"gpu", "date", "commit", "runs", "tensorwise_fast_accum", "gemm": [{"name", "m", "n", "k",
//    "scaling", "coda_ms", "cublas_ms"}] (issue 13's schema: gemm_fp8's default tile against
//    cuBLASLt's block-scaled GEMM on the same scales), "cases": [{"name", "layout", "m",
//    "n", "k", "coda_ms", "coda_tile128_ms", "coda_tile192_ms", "coda_tile192_one_partial_ms",
//    "coda_staged_ms", "coda_staged_one_partial_ms", "cublas_blockscaled_ms",
//    "cublas_tensorwise_ms", "cublas_bf16_ms", "coda_wgrad_form_ms", "coda_wgrad_blocks_ms",
//    "agree", "max_rel_err", "scale_layout"}]}
// ("layout": the bf16 GEMM the shape comes from; the FP8 GEMM is D = A Bᵀ for every case;
// "coda_wgrad_form_ms": coda on the same shape in the weight gradient's form, B scaled by rows
// and an f32 D added into, the cost of its per-column promotion and fp32 read-modify-write;
// "coda_wgrad_blocks_ms": the same f32 D added into with B scaled by 128 x 128 blocks, as a
// recipe that quantized the weight gradient's second operand by blocks would run it: the f32
// read-modify-write alone, without the per-column promotion).
// coda's output is not checked against a reference here: tests/gpu/test_gemm_fp8.cu does that;
// agreement with cuBLASLt is this benchmark's check.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "coda/coda.hpp"
#include "coda/core/fp8.hpp"
#include "gpu/backend.hpp"
#include "harness.cuh"

namespace {

using bench::Buffer;
using bench::check;

constexpr double kAgreeTolerance = 2e-2;

// ---- Inputs.

// e4m3 codes, uniform over the bytes but the NaNs (0x7F, 0xFF), which become 0x7E and 0xFE
// (±448).
__global__ void fill_e4m3(uint8_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint8_t c = uint8_t(bench::mix(uint64_t(i) + seed) >> 56);
    if ((c & 0x7F) == 0x7F) c ^= 1;
    p[i] = c;
  }
}
// e8m0 scales 2^-3 .. 2^3 (bytes 124 .. 130).
__global__ void fill_e8m0(uint8_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = uint8_t(124 + (bench::mix(uint64_t(i) + seed) >> 40) % 7);
}
// fp32 copies of e8m0 scales src [rows, cols] (row-major bytes), exact:
// dst[r * row_stride + c * col_stride] = 2^(src[r, c] - 127).
__global__ void e8m0_to_f32(const uint8_t* src, int64_t rows, int64_t cols, float* dst,
                            int64_t row_stride, int64_t col_stride) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * row_stride + c * col_stride] = coda::e8m0_bits_to_float(src[i]);
  }
}

// How many of the n 16-bit elements of a and b differ in their bits: *out += that count.
__global__ void count_differences(const uint16_t* a, const uint16_t* b, int64_t n,
                                  unsigned long long* out) {
  unsigned long long count = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    count += a[i] != b[i];
  for (int o = 16; o > 0; o /= 2) count += __shfl_xor_sync(0xffffffffu, count, o);
  if (threadIdx.x % 32 == 0 && count > 0) atomicAdd(out, count);
}
int64_t differences(const void* a, const void* b, int64_t n, cudaStream_t s) {
  Buffer out(sizeof(unsigned long long));
  check(cudaMemsetAsync(out.p, 0, out.bytes, s), "clear");
  count_differences<<<1024, 256, 0, s>>>(static_cast<const uint16_t*>(a),
                                         static_cast<const uint16_t*>(b), n,
                                         out.as<unsigned long long>());
  check(cudaGetLastError(), "count_differences");
  unsigned long long host = 0;
  check(cudaMemcpyAsync(&host, out.p, sizeof(host), cudaMemcpyDeviceToHost, s), "copy");
  check(cudaStreamSynchronize(s), "count_differences sync");
  return int64_t(host);
}

// Distinct seeds far apart, so no tensor's elements are another's shifted by a few indices.
constexpr uint64_t seed_of(uint64_t i) { return i << 48; }

// ---- Candidate layouts of an fp32 scale tensor for cuBLASLt: one scale per (outer block r,
// K block c) of an operand stored K-contiguous, rows = its outer blocks (M rows of activations,
// N / 128 row blocks of the weight), cols = ceil(K / 128). "k_major": the K blocks of one row are
// contiguous (the bytes of coda's row-major [rows, cols]; cuBLAS-speak "column-major
// [cols, rows]"); "mn_major": the rows of one K block are contiguous ("outer-dim-major", as
// PyTorch's scaled_mm documents its 1 x 128 scales). "_pad4": the leading dimension rounded up to
// a multiple of 4 (a public note on cuBLASLt's 128 x 128 scales asks for it along K), tried only
// where it differs.
struct ScaleLayout {
  std::string name;
  int64_t row_stride, col_stride, elems;
};

std::vector<ScaleLayout> scale_layouts(int64_t rows, int64_t cols) {
  const auto pad4 = [](int64_t x) { return (x + 3) / 4 * 4; };
  std::vector<ScaleLayout> v;
  v.push_back({"k_major", cols, 1, rows * cols});
  if (pad4(cols) != cols) v.push_back({"k_major_pad4", pad4(cols), 1, rows * pad4(cols)});
  v.push_back({"mn_major", 1, rows, rows * cols});
  if (pad4(rows) != rows) v.push_back({"mn_major_pad4", 1, pad4(rows), pad4(rows) * cols});
  return v;
}

// The e8m0 scales [rows, cols] as fp32 in `layout`, zeros in any padding. The buffer has room for
// rows rounded up to 128 and cols to 4 whatever the layout, so that cuBLASLt reading a layout
// other than this one (a rejected candidate) stays inside it.
std::unique_ptr<Buffer> f32_scales(const Buffer& bytes, int64_t rows, int64_t cols,
                                   const ScaleLayout& layout, cudaStream_t s) {
  const int64_t room = std::max(layout.elems, (rows + 127) / 128 * 128 * ((cols + 3) / 4 * 4));
  auto out = std::make_unique<Buffer>(size_t(room) * 4);
  check(cudaMemsetAsync(out->p, 0, out->bytes, s), "clear scales");
  e8m0_to_f32<<<256, 256, 0, s>>>(bytes.as<uint8_t>(), rows, cols, out->as<float>(),
                                  layout.row_stride, layout.col_stride);
  check(cudaGetLastError(), "e8m0_to_f32");
  return out;
}

// ---- cuBLASLt's FP8 GEMM in gemm_fp8's layout: D [M, N] bf16 = A [M, K] · B [N, K]ᵀ, e4m3
// inputs, fp32 compute and scales. As CublasGemm's fwd (harness.cuh): cuBLASLt is column-major
// and computes Dᵀ [N, M] (column-major, ld N: D row-major) = X · Y with X = our B ([N, K]
// row-major is K x N column-major, ld K, TRANSA = T) and Y = our A (K x M column-major, ld K,
// TRANSB = N): the "TN" layout Hopper's FP8 GEMMs need. So cuBLASLt's matrix A is our weight (its
// scale mode x_mode) and its matrix B our activations (y_mode).
class CublasFp8Gemm {
public:
  CublasFp8Gemm(cublasLtHandle_t h, int64_t m, int64_t n, int64_t k, void* ws, size_t ws_bytes,
                cublasLtMatmulMatrixScale_t x_mode, cublasLtMatmulMatrixScale_t y_mode,
                const void* x_scale, const void* y_scale, bool fast_accum)
      : handle_(h), workspace_(ws), workspace_bytes_(ws_bytes) {
    check(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    const cublasOperation_t opx = CUBLAS_OP_T, opy = CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &opx, sizeof(opx)),
          "TRANSA");
    check(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &opy, sizeof(opy)),
          "TRANSB");
    check(cublasLtMatrixLayoutCreate(&lx_, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(n), k), "X");
    check(cublasLtMatrixLayoutCreate(&ly_, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(m), k), "Y");
    check(cublasLtMatrixLayoutCreate(&ld_, CUDA_R_16BF, uint64_t(n), uint64_t(m), n), "D");
    // From here on a refusal is cuBLASLt's answer about the configuration, not a bug here:
    // recorded (ok() false, why()), not thrown.
    // Per-tensor scaling is cuBLASLt's default mode: left unset, as FP8 users call it.
    const int32_t xm = int32_t(x_mode), ym = int32_t(y_mode);
    const bool scalar = x_mode == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F &&
                        y_mode == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    const int8_t fast = fast_accum ? 1 : 0;
    if ((!scalar && !attempt(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                            &xm, sizeof(xm)),
                             "A_SCALE_MODE")) ||
        (!scalar && !attempt(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                            &ym, sizeof(ym)),
                             "B_SCALE_MODE")) ||
        !attempt(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                                sizeof(fast)),
                 "FAST_ACCUM") ||
        !set_scales(x_scale, y_scale))
      return;
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (!attempt(bench::first_algo(handle_, op_, lx_, ly_, ld_, workspace_bytes_, result, found),
                 "AlgoGetHeuristic"))
      return;
    if (found == 0) {
      why_ = "cuBLASLt's heuristic has no algorithm";
      return;
    }
    algo_ = result.algo;
    waves_ = result.wavesCount;
    ok_ = true;
  }
  ~CublasFp8Gemm() {
    cublasLtMatrixLayoutDestroy(lx_), cublasLtMatrixLayoutDestroy(ly_),
        cublasLtMatrixLayoutDestroy(ld_);
    cublasLtMatmulDescDestroy(op_);
  }
  CublasFp8Gemm(const CublasFp8Gemm&) = delete;
  CublasFp8Gemm& operator=(const CublasFp8Gemm&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  std::string describe() const { return bench::describe_algo(algo_, waves_); }

  // The scale tensors of cuBLASLt's A (our weight) and B (our activations).
  bool set_scales(const void* x_scale, const void* y_scale) {
    return attempt(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                  &x_scale, sizeof(x_scale)),
                   "A_SCALE_POINTER") &&
           attempt(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                  &y_scale, sizeof(y_scale)),
                   "B_SCALE_POINTER");
  }

  // D = A · Bᵀ with a = our A [M, K], b = our B [N, K].
  void run(const void* a, const void* b, void* d, cudaStream_t s) const {
    const float alpha = 1.f, beta = 0.f;
    check(cublasLtMatmul(handle_, op_, &alpha, b, lx_, a, ly_, &beta, d, ld_, d, ld_, &algo_,
                         workspace_, workspace_bytes_, s),
          "cublasLtMatmul (FP8)");
  }
  // One run whose refusal is recorded (ok() false, why()) instead of thrown: the heuristic can
  // offer an algorithm that cublasLtMatmul then refuses (status 15, NOT_SUPPORTED, for the
  // per-tensor GEMM on the H200 with cuBLASLt 13.1, 2026-12-05).
  bool probe(const void* a, const void* b, void* d, cudaStream_t s) {
    if (!ok_) return false;
    const float alpha = 1.f, beta = 0.f;
    ok_ = attempt(cublasLtMatmul(handle_, op_, &alpha, b, lx_, a, ly_, &beta, d, ld_, d, ld_,
                                 &algo_, workspace_, workspace_bytes_, s),
                  "cublasLtMatmul") &&
          attempt(cudaStreamSynchronize(s) == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                                                          : CUBLAS_STATUS_EXECUTION_FAILED,
                  "the run");
    return ok_;
  }

private:
  bool attempt(cublasStatus_t status, const char* what) {
    if (status == CUBLAS_STATUS_SUCCESS) return true;
    why_ = std::string(what) + ": cublasLt status " + std::to_string(int(status));
    return false;
  }

  cublasLtHandle_t handle_;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t lx_ = nullptr, ly_ = nullptr, ld_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  void* workspace_;
  size_t workspace_bytes_;
  float waves_ = 0;
  bool ok_ = false;
  std::string why_;
};

// ---- One case.

struct Result {
  bench::GemmCase c;
  double coda_ms = NAN, block_ms = NAN, tensor_ms = NAN, bf16_ms = NAN; // NaN: not timed
  // coda on each tile, and which one gemm_fp8 picks (coda_ms is that one's time).
  double tile128_ms = NAN, tile192_ms = NAN, tile192_one_partial_ms = NAN;
  double staged_ms = NAN; // the 128 x 128 tile on the staged schedule
  // The staged tile with one partial (the fused kernels' staged FP8 consumers: their floor).
  double staged_one_partial_ms = NAN;
  coda::sm90::Fp8Tile picked = coda::sm90::Fp8Tile::n128;
  bool tiles_bitwise = true; // the 192-column and staged Ds equal the 128 x 128 one bit for bit
  // coda in the weight gradient's form on the same shape: B scaled by rows, an f32 D added into.
  double coda_wgrad_form_ms = NAN;
  double coda_wgrad_blocks_ms = NAN; // the same with B scaled by blocks (the recipe's choice)
  bool agree = false;
  double max_rel_err = NAN; // the chosen layout pair's; the smallest tried where none agrees
  std::string scale_layout; // "a:<layout>,b:<layout>" (a: activations, b: weight); "": none
};

// The tiles forced besides the cooperative 128 x 128 one (coda_tile128_ms, the D each must
// equal), in the order they run, each with its column.
using Time = double Result::*;
struct OtherTile {
  coda::sm90::Fp8Tile tile;
  Time ms;
};
const OtherTile kOtherTiles[] = {
    {coda::sm90::Fp8Tile::n192, &Result::tile192_ms},
    {coda::sm90::Fp8Tile::n192_one_partial, &Result::tile192_one_partial_ms},
    {coda::sm90::Fp8Tile::n128_staged, &Result::staged_ms},
    {coda::sm90::Fp8Tile::n128_staged_one_partial, &Result::staged_one_partial_ms}};
constexpr size_t kOtherTileCount = std::size(kOtherTiles);

std::vector<bench::GemmCase> bench_cases() {
  std::vector<bench::GemmCase> cases = bench::llama_block_gemms();
  for (int64_t s : {4096, 8192}) cases.push_back(bench::square_gemm(s));
  return cases;
}

// --shapes "M,N,K;M,N,K": forward-layout cases of those sizes (each a multiple of 16).
std::vector<bench::GemmCase> shape_cases(const std::string& list) {
  std::vector<bench::GemmCase> cases;
  size_t at = 0;
  while (at < list.size()) {
    const size_t end = std::min(list.find(';', at), list.size());
    const std::string item = list.substr(at, end - at);
    long long m = 0, n = 0, k = 0;
    char tail = 0;
    if (std::sscanf(item.c_str(), "%lld,%lld,%lld%c", &m, &n, &k, &tail) != 3 || m <= 0 || n <= 0 ||
        k <= 0 || m % 16 != 0 || n % 16 != 0 || k % 16 != 0)
      throw std::runtime_error("--shapes wants M,N,K;M,N,K... (positive multiples of 16); got \"" +
                               item + "\"");
    cases.push_back({"m" + std::to_string(m) + "xn" + std::to_string(n) + "xk" + std::to_string(k),
                     coda::GemmLayout::fwd, "fwd", m, n, k});
    at = end + 1;
  }
  return cases;
}

Result bench_case(const bench::GemmCase& c, const bench::Context& ctx, int runs, bool fast_accum) {
  const cudaStream_t s = ctx.stream;
  const int64_t m = c.m, n = c.n, k = c.k;
  const int64_t kb = coda::num_fp8_scale_blocks(k), nb = coda::num_fp8_scale_blocks(n);
  Result r;
  r.c = c;

  // Inputs: FP8 codes and e8m0 scales (both sides), bf16 operands of the same shape (the bf16
  // GEMM), fp32 ones (the per-tensor scales).
  Buffer a(size_t(m * k)), b(size_t(n * k)), a_scales(size_t(m * kb)), b_scales(size_t(nb * kb));
  Buffer d_coda(size_t(m * n * 2)), d_block(size_t(m * n * 2)), d_tensor(size_t(m * n * 2)),
      d_bf16(size_t(m * n * 2));
  Buffer a16(size_t(m * k * 2)), b16(size_t(n * k * 2)), ones(2 * sizeof(float));
  Buffer b_row_scales(size_t(n * kb)), d_f32(size_t(m * n * 4));
  fill_e4m3<<<1024, 256, 0, s>>>(a.as<uint8_t>(), m * k, seed_of(1));
  fill_e4m3<<<1024, 256, 0, s>>>(b.as<uint8_t>(), n * k, seed_of(2));
  fill_e8m0<<<256, 256, 0, s>>>(a_scales.as<uint8_t>(), m * kb, seed_of(3));
  fill_e8m0<<<256, 256, 0, s>>>(b_scales.as<uint8_t>(), nb * kb, seed_of(4));
  fill_e8m0<<<256, 256, 0, s>>>(b_row_scales.as<uint8_t>(), n * kb, seed_of(7));
  check(cudaMemsetAsync(d_f32.p, 0, d_f32.bytes, s), "zero the f32 D");
  bench::fill_uniform<<<1024, 256, 0, s>>>(a16.as<__nv_bfloat16>(), m * k, seed_of(5), -1.f, 1.f);
  bench::fill_uniform<<<1024, 256, 0, s>>>(b16.as<__nv_bfloat16>(), n * k, seed_of(6), -1.f, 1.f);
  check(cudaGetLastError(), "fill");
  const float host_ones[2] = {1.f, 1.f};
  check(cudaMemcpyAsync(ones.p, host_ones, sizeof(host_ones), cudaMemcpyHostToDevice, s), "ones");

  // coda: once through the public entry point (which validates the arguments), then the GPU
  // backend's call, as bench_gemm times gpu::gemm.
  coda::Fp8GemmArgs args;
  args.a = bench::view(a, coda::DType::e4m3, m, k);
  args.a_scales = bench::view(a_scales, coda::DType::e8m0, m, kb);
  args.b = bench::view(b, coda::DType::e4m3, n, k);
  args.b_scales = bench::view(b_scales, coda::DType::e8m0, nb, kb);
  args.d = bench::view(d_coda, coda::DType::bf16, m, n);
  check(cudaMemsetAsync(d_coda.p, 0xff, d_coda.bytes, s), "poison D"); // NaN where not written
  coda::gemm_fp8(args, s);
  check(cudaStreamSynchronize(s), "coda gemm_fp8");
  coda::Fp8GemmArgs wgrad_form = args;
  wgrad_form.b_scales = bench::view(b_row_scales, coda::DType::e8m0, n, kb);
  wgrad_form.b_scaling = coda::Fp8BScaling::rows;
  wgrad_form.d = bench::view(d_f32, coda::DType::f32, m, n);
  wgrad_form.accumulate = true;
  coda::gemm_fp8(wgrad_form, s);
  coda::Fp8GemmArgs wgrad_blocks = args; // B by blocks, into the same f32 D
  wgrad_blocks.d = wgrad_form.d;
  wgrad_blocks.accumulate = true;
  coda::gemm_fp8(wgrad_blocks, s);
  check(cudaStreamSynchronize(s), "coda gemm_fp8, the weight gradient's form");
  r.picked = coda::gpu::gemm_fp8_tile(args);
  // The other tiles' calls: args on a D of their own each (kOtherTiles' order).
  std::vector<std::unique_ptr<Buffer>> other_d;
  std::vector<coda::Fp8GemmArgs> other_args(kOtherTileCount, args);
  for (coda::Fp8GemmArgs& other : other_args) {
    other_d.push_back(std::make_unique<Buffer>(size_t(m * n * 2)));
    other.d = bench::view(*other_d.back(), coda::DType::bf16, m, n);
    check(cudaMemsetAsync(other_d.back()->p, 0xff, other_d.back()->bytes, s), "poison D");
  }

  // cuBLASLt with coda's block scales: every candidate layout pair, against coda's D.
  const std::vector<ScaleLayout> a_layouts = scale_layouts(m, kb),
                                 b_layouts = scale_layouts(nb, kb);
  std::vector<std::unique_ptr<Buffer>> a_f32, b_f32;
  for (const ScaleLayout& l : a_layouts) a_f32.push_back(f32_scales(a_scales, m, kb, l, s));
  for (const ScaleLayout& l : b_layouts) b_f32.push_back(f32_scales(b_scales, nb, kb, l, s));
  CublasFp8Gemm block(ctx.lt, m, n, k, ctx.workspace.p, ctx.kWorkspaceBytes,
                      CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                      CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, b_f32[0]->p, a_f32[0]->p, false);
  bool block_ready = false;
  if (!block.ok()) {
    std::printf("  cuBLASLt block-scaled %s: unavailable (%s): null\n", c.name.c_str(),
                block.why().c_str());
  } else {
    std::printf("  cuBLASLt block-scaled %s: %s\n", c.name.c_str(), block.describe().c_str());
    double best = INFINITY;
    size_t best_a = 0, best_b = 0;
    int agreeing = 0;
    for (size_t ia = 0; ia < a_layouts.size(); ++ia)
      for (size_t ib = 0; ib < b_layouts.size(); ++ib) {
        const std::string pair = "a:" + a_layouts[ia].name + ",b:" + b_layouts[ib].name;
        double err = INFINITY;
        if (!block.set_scales(b_f32[ib]->p, a_f32[ia]->p)) {
          std::printf("    scales %-34s refused (%s)\n", pair.c_str(), block.why().c_str());
          continue;
        }
        check(cudaMemsetAsync(d_block.p, 0xff, d_block.bytes, s), "poison D");
        try {
          block.run(a.p, b.p, d_block.p, s);
          check(cudaStreamSynchronize(s), "cuBLASLt block-scaled");
          err = bench::max_rel_diff_all(d_block.p, d_coda.p, m * n, s);
        } catch (const std::exception& e) {
          std::printf("    scales %-34s failed (%s)\n", pair.c_str(), e.what());
          continue;
        }
        std::printf("    scales %-34s max rel err %.3e%s\n", pair.c_str(), err,
                    err < kAgreeTolerance ? "  agrees" : "");
        agreeing += err < kAgreeTolerance;
        if (err < best) best = err, best_a = ia, best_b = ib;
      }
    r.max_rel_err = best;
    if (best < kAgreeTolerance) {
      r.agree = true;
      r.scale_layout = "a:" + a_layouts[best_a].name + ",b:" + b_layouts[best_b].name;
      block_ready = block.set_scales(b_f32[best_b]->p, a_f32[best_a]->p);
      std::printf("  scale layout %s (%d of %zu pairs agree)\n", r.scale_layout.c_str(), agreeing,
                  a_layouts.size() * b_layouts.size());
    } else {
      std::printf("  MISMATCH %s: no scale layout pair agrees with coda (smallest max rel err "
                  "%.3e, tolerance %.0e): cublas_blockscaled_ms null\n",
                  c.name.c_str(), best, kAgreeTolerance);
    }
  }

  // cuBLASLt per tensor (scales 1.0) and bf16: no block scales, so no comparison of D.
  CublasFp8Gemm tensor(ctx.lt, m, n, k, ctx.workspace.p, ctx.kWorkspaceBytes,
                       CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F,
                       CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, ones.as<float>(),
                       ones.as<float>() + 1, fast_accum);
  if (tensor.probe(a.p, b.p, d_tensor.p, s))
    std::printf("  cuBLASLt per-tensor %s: %s\n", c.name.c_str(), tensor.describe().c_str());
  else
    std::printf("  cuBLASLt per-tensor %s: unavailable (%s): null\n", c.name.c_str(),
                tensor.why().c_str());
  std::unique_ptr<bench::CublasGemm> bf16;
  try {
    bf16 = std::make_unique<bench::CublasGemm>(ctx.lt, coda::GemmLayout::fwd, m, n, k,
                                               ctx.workspace.p, ctx.kWorkspaceBytes);
    std::printf("  cuBLASLt bf16 %s: %s\n", c.name.c_str(), bf16->describe().c_str());
  } catch (const std::exception& e) {
    std::printf("  cuBLASLt bf16 %s: unavailable (%s): null\n", c.name.c_str(), e.what());
  }

  using coda::sm90::Fp8Tile;
  auto run_coda = [&] { coda::gpu::gemm_fp8_with_tile(args, Fp8Tile::n128, s); };
  auto run_other = [&](size_t t) {
    coda::gpu::gemm_fp8_with_tile(other_args[t], kOtherTiles[t].tile, s);
  };
  auto run_wgrad_form = [&] { coda::gpu::gemm_fp8(wgrad_form, s); };
  auto run_wgrad_blocks = [&] { coda::gpu::gemm_fp8(wgrad_blocks, s); };
  auto run_block = [&] { block.run(a.p, b.p, d_block.p, s); };
  auto run_tensor = [&] { tensor.run(a.p, b.p, d_tensor.p, s); };
  auto run_bf16 = [&] { bf16->run(a16.p, b16.p, d_bf16.p, s); };
  for (int i = 0; i < 5; ++i) {
    run_coda();
    for (size_t t = 0; t < kOtherTileCount; ++t) run_other(t);
    run_wgrad_form();
    run_wgrad_blocks();
    if (block_ready) run_block();
    if (tensor.ok()) run_tensor();
    if (bf16) run_bf16();
  }
  check(cudaStreamSynchronize(s), "warm-up");

  bench::Timer timer = ctx.timer();
  std::vector<float> t_coda, t_block, t_tensor, t_bf16, t_wgrad_form, t_wgrad_blocks;
  std::vector<std::vector<float>> t_other(kOtherTileCount);
  for (int i = 0; i < runs; ++i) { // interleaved
    timer.timed(run_coda, t_coda);
    for (size_t t = 0; t < kOtherTileCount; ++t) timer.timed([&] { run_other(t); }, t_other[t]);
    timer.timed(run_wgrad_form, t_wgrad_form);
    timer.timed(run_wgrad_blocks, t_wgrad_blocks);
    if (block_ready) timer.timed(run_block, t_block);
    if (tensor.ok()) timer.timed(run_tensor, t_tensor);
    if (bf16) timer.timed(run_bf16, t_bf16);
  }
  r.tile128_ms = bench::median(t_coda);
  for (size_t t = 0; t < kOtherTileCount; ++t) r.*kOtherTiles[t].ms = bench::median(t_other[t]);
  r.coda_wgrad_form_ms = bench::median(t_wgrad_form);
  r.coda_wgrad_blocks_ms = bench::median(t_wgrad_blocks);

  // The other tiles' D against the 128 x 128 one's, after the timed runs.
  for (size_t t = 0; t < kOtherTileCount; ++t) {
    const auto [tile, ms] = kOtherTiles[t];
    const Buffer* d = other_d[t].get();
    const int64_t differ = differences(d->p, d_coda.p, m * n, s);
    if (differ == 0) continue;
    r.tiles_bitwise = false;
    const double err = bench::max_rel_diff_all(d->p, d_coda.p, m * n, s);
    const bool same_product = err < kAgreeTolerance;
    std::printf("  TILE MISMATCH %s: %s's D differs from the 128 x 128 tile's in %lld of %lld "
                "elements (max rel err %.3e)%s\n",
                c.name.c_str(), coda::sm90::fp8_tile_name(tile), (long long)differ,
                (long long)(m * n), err, same_product ? "" : ": another product, its time null");
    if (!same_product) r.*ms = NAN;
  }
  // The default's time, after the check above (a differing tile is null).
  r.coda_ms = r.tile128_ms;
  for (const auto& [tile, ms] : kOtherTiles)
    if (tile == r.picked) r.coda_ms = r.*ms;
  std::printf("  gemm_fp8's tile: %s; the other tiles' Ds %s the 128 x 128 one's\n",
              coda::sm90::fp8_tile_name(r.picked),
              r.tiles_bitwise ? "equal, bit for bit," : "differ from");
  r.block_ms = bench::median(t_block); // NaN where empty
  r.tensor_ms = bench::median(t_tensor);
  r.bf16_ms = bench::median(t_bf16);

  // The D of the last timed runs must still agree (a launch that differs from the first one
  // would show here); if not, the case is a mismatch as above.
  if (block_ready) {
    const double err = bench::max_rel_diff_all(d_block.p, d_coda.p, m * n, s);
    r.max_rel_err = std::max(r.max_rel_err, err);
    if (!(err < kAgreeTolerance)) {
      r.agree = false, r.block_ms = NAN;
      std::printf("  MISMATCH %s after the timed runs: max rel err %.3e: cublas_blockscaled_ms "
                  "null\n",
                  c.name.c_str(), err);
    }
  }
  return r;
}

double tflops(const bench::GemmCase& c, double ms) {
  return 2.0 * double(c.m) * double(c.n) * double(c.k) / (ms * 1e9);
}

// A JSON number, or null for NaN / infinity.
std::string json_number(double x, const char* format) {
  if (!std::isfinite(x)) return "null";
  char text[32];
  std::snprintf(text, sizeof(text), format, x);
  return text;
}

} // namespace

int main(int argc, char** argv) {
  std::string commit, out_path, filter;
  std::vector<bench::GemmCase> cases;
  int runs = 50;
  bool fast_accum = false;
  try {
    const bench::Flags flags(
        argc, argv, {"--commit", "--out", "--runs", "--filter", "--fast-accum", "--shapes"});
    const std::string shapes = flags.get("--shapes", "");
    cases = shapes.empty() ? bench_cases() : shape_cases(shapes);
    commit = flags.commit();
    out_path = flags.get("--out", "bench/results/fp8.json");
    runs = std::max(1, flags.get_int("--runs", runs));
    filter = flags.get("--filter", "");
    fast_accum = flags.get_int("--fast-accum", 0) != 0;
  } catch (const std::exception& e) {
    return std::fprintf(stderr, "bench_gemm_fp8: %s\n", e.what()), 2;
  }
  try {
    if (!coda::gpu::device_supported())
      return std::fprintf(stderr, "bench_gemm_fp8 needs an sm_90 GPU\n"), 1;
    const bench::Context ctx;
    int cublas_major = 0, cublas_minor = 0, cublas_patch = 0;
    cublasLtGetProperty(MAJOR_VERSION, &cublas_major);
    cublasLtGetProperty(MINOR_VERSION, &cublas_minor);
    cublasLtGetProperty(PATCH_LEVEL, &cublas_patch);
    std::printf("cuBLASLt %d.%d.%d; per-tensor FP8 with fast accumulation %s\n", cublas_major,
                cublas_minor, cublas_patch, fast_accum ? "on" : "off");

    std::vector<Result> results;
    for (const bench::GemmCase& c : cases) {
      if (c.name.find(filter) == std::string::npos) continue;
      std::printf("%s: M %lld N %lld K %lld\n", c.name.c_str(), (long long)c.m, (long long)c.n,
                  (long long)c.k);
      results.push_back(bench_case(c, ctx, runs, fast_accum));
      std::fflush(stdout);
    }

    // TFLOP/s of each side; ratios over coda's time (above 1: coda faster); "-" for null.
    const auto cell = [](double x, const char* format) {
      char text[32];
      if (std::isfinite(x))
        std::snprintf(text, sizeof(text), format, x);
      else
        std::snprintf(text, sizeof(text), "-");
      return std::string(text);
    };
    std::printf("\n%-22s %6s %6s %6s  %9s %9s %9s %9s %9s  %10s %9s %8s %8s %8s %8s  %-16s  "
                "%9s  %s\n",
                "case", "M", "N", "K", "coda TF/s", "192 TF/s", "blockwise", "tensor", "bf16",
                "block/coda", "bf16/coda", "128/192", "128/192a", "128/stg", "1p/stg", "pick",
                "rel err", "scale layout");
    for (const Result& r : results)
      std::printf(
          "%-22s %6lld %6lld %6lld  %9s %9s %9s %9s %9s  %10s %9s %8s %8s %8s %8s  %-16s  %9s  "
          "%s\n",
          r.c.name.c_str(), (long long)r.c.m, (long long)r.c.n, (long long)r.c.k,
          cell(tflops(r.c, r.coda_ms), "%.1f").c_str(),
          cell(tflops(r.c, r.tile192_ms), "%.1f").c_str(),
          cell(tflops(r.c, r.block_ms), "%.1f").c_str(),
          cell(tflops(r.c, r.tensor_ms), "%.1f").c_str(),
          cell(tflops(r.c, r.bf16_ms), "%.1f").c_str(),
          cell(r.block_ms / r.coda_ms, "%.3f").c_str(), cell(r.bf16_ms / r.coda_ms, "%.3f").c_str(),
          cell(r.tile128_ms / r.tile192_ms, "%.3f").c_str(),
          cell(r.tile128_ms / r.tile192_one_partial_ms, "%.3f").c_str(),
          cell(r.tile128_ms / r.staged_ms, "%.3f").c_str(),
          cell(r.staged_one_partial_ms / r.staged_ms, "%.3f").c_str(),
          coda::sm90::fp8_tile_name(r.picked), cell(r.max_rel_err, "%.2e").c_str(),
          r.agree ? r.scale_layout.c_str() : "MISMATCH");
    std::printf("(128/192: coda_tile128_ms / coda_tile192_ms; 128/192a: coda_tile128_ms / "
                "coda_tile192_one_partial_ms; 128/stg: coda_tile128_ms / coda_staged_ms; 1p/stg: "
                "coda_staged_one_partial_ms / coda_staged_ms (above 1: slower than the two "
                "partials); pick: gemm_fp8's tile, whose time coda TF/s and the ratios over coda "
                "are)\n");
    // Geometric means over the block GEMMs (not the squares) of num / den where both are timed.
    const auto geomean = [&](auto num, auto den, const char* what) {
      double log_sum = 0, worst = INFINITY;
      int count = 0, blocks = 0;
      for (const Result& r : results) {
        if (std::strcmp(r.c.layout_name, "square") == 0) continue;
        ++blocks;
        const double ratio = num(r) / den(r);
        if (!std::isfinite(ratio)) continue;
        log_sum += std::log(ratio), ++count, worst = std::min(worst, ratio);
      }
      if (count == 0)
        std::printf("geomean %s: no block GEMM timed\n", what);
      else
        std::printf("geomean %s over %d of %d block GEMMs: %.3f (min %.3f)\n", what, count, blocks,
                    std::exp(log_sum / count), worst);
    };
    const auto field = [](double Result::*f) { return [f](const Result& r) { return r.*f; }; };
    const auto coda = field(&Result::coda_ms); // gemm_fp8's tile
    const auto tile128 = field(&Result::tile128_ms);
    geomean(field(&Result::block_ms), coda, "cublas_blockscaled_ms/coda_ms");
    geomean(field(&Result::tensor_ms), coda, "cublas_tensorwise_ms/coda_ms");
    geomean(field(&Result::bf16_ms), coda, "cublas_bf16_ms/coda_ms");
    geomean(field(&Result::coda_wgrad_form_ms), coda, "coda_wgrad_form_ms/coda_ms");
    geomean(field(&Result::coda_wgrad_form_ms), field(&Result::coda_wgrad_blocks_ms),
            "coda_wgrad_form_ms/coda_wgrad_blocks_ms");
    geomean(field(&Result::block_ms), field(&Result::tile192_ms),
            "cublas_blockscaled_ms/coda_tile192_ms");
    geomean(field(&Result::block_ms), field(&Result::tile192_one_partial_ms),
            "cublas_blockscaled_ms/coda_tile192_one_partial_ms");
    geomean(field(&Result::block_ms), tile128, "cublas_blockscaled_ms/coda_tile128_ms");
    geomean(tile128, field(&Result::tile192_ms), "coda_tile128_ms/coda_tile192_ms");
    geomean(tile128, field(&Result::tile192_one_partial_ms),
            "coda_tile128_ms/coda_tile192_one_partial_ms");
    geomean(tile128, field(&Result::staged_ms), "coda_tile128_ms/coda_staged_ms");
    geomean(field(&Result::block_ms), field(&Result::staged_ms),
            "cublas_blockscaled_ms/coda_staged_ms");
    geomean(field(&Result::staged_one_partial_ms), field(&Result::staged_ms),
            "coda_staged_one_partial_ms/coda_staged_ms");
    int tile_mismatches = 0;
    for (const Result& r : results) tile_mismatches += !r.tiles_bitwise;
    if (tile_mismatches > 0)
      std::printf("%d case(s) where another tile's D differs from the 128 x 128 one's\n",
                  tile_mismatches);
    int mismatches = 0;
    for (const Result& r : results) mismatches += !r.agree;
    if (mismatches > 0)
      std::printf("%d case(s) without a cuBLASLt block-scaled result that agrees with coda\n",
                  mismatches);

    // Issue 13's summary schema first ("gemm": gemm_fp8 as it runs by default against cuBLASLt
    // at the same block scaling), then every column ("cases").
    std::string extra = std::string("  \"tensorwise_fast_accum\": ") +
                        (fast_accum ? "true" : "false") + ",\n  \"gemm\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      extra += "    {\"name\": \"" + r.c.name + "\", \"m\": " + std::to_string(r.c.m) +
               ", \"n\": " + std::to_string(r.c.n) + ", \"k\": " + std::to_string(r.c.k) +
               ", \"scaling\": \"blocks: a 1x128, b 128x128, e8m0\", \"coda_ms\": " +
               json_number(r.coda_ms, "%.5f") +
               ", \"cublas_ms\": " + json_number(r.block_ms, "%.5f") +
               (i + 1 < results.size() ? "},\n" : "}\n");
    }
    extra += "  ],\n";
    FILE* f = bench::open_json(out_path, ctx.prop, commit, runs, extra);
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      const std::string layout = r.agree ? "\"" + r.scale_layout + "\"" : "null";
      std::fprintf(
          f,
          "    {\"name\": \"%s\", \"layout\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": "
          "%lld, \"coda_ms\": %s, \"coda_tile128_ms\": %s, \"coda_tile192_ms\": %s, "
          "\"coda_tile192_one_partial_ms\": %s, \"coda_staged_ms\": %s, "
          "\"coda_staged_one_partial_ms\": %s, \"cublas_blockscaled_ms\": %s, "
          "\"cublas_tensorwise_ms\": %s, \"cublas_bf16_ms\": %s, "
          "\"coda_wgrad_form_ms\": %s, \"coda_wgrad_blocks_ms\": %s, \"agree\": %s, "
          "\"max_rel_err\": %s, \"scale_layout\": %s}%s\n",
          r.c.name.c_str(), r.c.layout_name, (long long)r.c.m, (long long)r.c.n, (long long)r.c.k,
          json_number(r.coda_ms, "%.5f").c_str(), json_number(r.tile128_ms, "%.5f").c_str(),
          json_number(r.tile192_ms, "%.5f").c_str(),
          json_number(r.tile192_one_partial_ms, "%.5f").c_str(),
          json_number(r.staged_ms, "%.5f").c_str(),
          json_number(r.staged_one_partial_ms, "%.5f").c_str(),
          json_number(r.block_ms, "%.5f").c_str(), json_number(r.tensor_ms, "%.5f").c_str(),
          json_number(r.bf16_ms, "%.5f").c_str(), json_number(r.coda_wgrad_form_ms, "%.5f").c_str(),
          json_number(r.coda_wgrad_blocks_ms, "%.5f").c_str(), r.agree ? "true" : "false",
          json_number(r.max_rel_err, "%.3e").c_str(), layout.c_str(),
          i + 1 < results.size() ? "," : "");
    }
    bench::close_json(f);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm_fp8: %s\n", e.what());
    return 1;
  }
}
