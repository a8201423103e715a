// gpu::gemm_fp8: the block-scaled FP8 GEMM (Fp8GemmArgs) on the kernels of fp8.cuh, on the tile
// sm90::choose_fp8_tile picks or the caller forces.
#include <cstdint>
#include <string>

#include "coda/core/error.hpp"
#include "gpu/backend.hpp"
#include "gpu/gemm/fp8.cuh"

namespace coda::gpu {
namespace {

// Kernel on the call's operands and block scales with `epilogue`'s parameters.
// NOTE: no stream-K (no workspace, and the plan says so): the FP8 consumer reads the scales of
// k-blocks in the order k_begin, k_begin + 1, ..., which a stream-K piece's rotated loads
// would not follow.
template <class Kernel, class EpilogueParams>
void launch(const Fp8GemmArgs& args, const EpilogueParams& epilogue, Stream stream) {
  const typename Kernel::Problem problem{args.m(), args.n(), args.k()};
  typename Kernel::Main::Params mainloop = Kernel::mainloop_params(args.a, args.b, problem);
  Kernel::Main::set_scales(mainloop, args.a_scales, args.b_scales, args.m(), args.n());
  sm90::GemmPlan plan;
  plan.stream_k = sm90::StreamKMode::off;
  plan.defer_stores = false;
  Kernel::run(mainloop, problem, epilogue, plan, TensorView{}, stream);
}

// The register epilogue: D (bf16 or f32) stored by TMA, its old value added when accumulating.
template <class Kernel, class OutT> void run(const Fp8GemmArgs& args, Stream stream) {
  using Epi = fp8::Epilogue<OutT>;
  typename Epi::Params epilogue{};
  epilogue.d = Epi::output_map("d", args.d, args.m(), args.n());
  epilogue.c = epilogue.d; // accumulate: C is D itself, read before each subtile is stored
  epilogue.alpha = 1.f;
  epilogue.beta = args.accumulate ? 1.f : 0.f;
  epilogue.load_c = args.accumulate ? 1 : 0;
  epilogue.defer_stores = 0;
  epilogue.alpha_tensor = nullptr;
  launch<Kernel>(args, epilogue, stream);
}

// A staged kernel: a bf16 D, not accumulated into (gemm_fp8_with_tile checked both).
template <class Kernel> void run_staged(const Fp8GemmArgs& args, Stream stream) {
  typename fp8::staged::Epilogue::Params epilogue{};
  epilogue::device::get<1>(epilogue) = fp8::staged::Store::params("d", args.d);
  launch<Kernel>(args, epilogue, stream);
}

bool is_staged(sm90::Fp8Tile tile) {
  return tile == sm90::Fp8Tile::n128_staged || tile == sm90::Fp8Tile::n128_staged_one_partial;
}

// Where the staged tile applies: its staged tile holds the result rounded to bf16, so the call's
// d is bf16 and not accumulated into.
bool stores_rounded_d(const Fp8GemmArgs& args) {
  return args.d.dtype == DType::bf16 && !args.accumulate;
}

template <class OutT> void run_tile(const Fp8GemmArgs& args, sm90::Fp8Tile tile, Stream stream) {
  if (args.b_scaling == Fp8BScaling::rows)
    return run<fp8::Kernel<Fp8BScaling::rows, OutT>, OutT>(args, stream);
  switch (tile) {
  case sm90::Fp8Tile::n128_staged:
    return run_staged<fp8::staged::Kernel>(args, stream);
  case sm90::Fp8Tile::n128_staged_one_partial:
    return run_staged<fp8::staged::KernelWith<1>>(args, stream);
  case sm90::Fp8Tile::n192:
    return run<fp8::Kernel<Fp8BScaling::blocks, OutT, 192>, OutT>(args, stream);
  case sm90::Fp8Tile::n192_one_partial:
    return run<fp8::Kernel<Fp8BScaling::blocks, OutT, 192, false>, OutT>(args, stream);
  default:
    return run<fp8::Kernel<Fp8BScaling::blocks, OutT, 128>, OutT>(args, stream);
  }
}

} // namespace

void gemm_fp8_with_tile(const Fp8GemmArgs& args, sm90::Fp8Tile tile, Stream stream) {
  require_device("FP8 GEMM");
  // Rows and columns are 32-bit in the kernel (tile rows, the scale rows it reads).
  constexpr int64_t kLargest = INT32_MAX - 128 * sm90::kClusterM;
  if (args.m() > kLargest || args.n() > kLargest)
    throw Error(Status::not_supported,
                "gemm_fp8: the GPU kernel takes M and N < 2^31 - 256; got M " +
                    std::to_string(args.m()) + ", N " + std::to_string(args.n()));
  if (args.b_scaling == Fp8BScaling::rows && tile != sm90::Fp8Tile::automatic &&
      tile != sm90::Fp8Tile::n128)
    throw Error(Status::not_supported,
                std::string("gemm_fp8: the ") + sm90::fp8_tile_name(tile) +
                    " tile takes B scaled by blocks; B scaled by rows runs the 128 x 128 tile");
  if (is_staged(tile) && !stores_rounded_d(args))
    throw Error(Status::not_supported,
                std::string("gemm_fp8: the ") + sm90::fp8_tile_name(tile) +
                    " tile writes a bf16 d and does not accumulate into it (its staged tile "
                    "holds the rounded result)");
  if (tile == sm90::Fp8Tile::automatic) tile = gemm_fp8_tile(args);
  if (args.d.dtype == DType::f32)
    run_tile<float>(args, tile, stream);
  else
    run_tile<bf16>(args, tile, stream);
}

sm90::Fp8Tile gemm_fp8_tile(const Fp8GemmArgs& args) {
  // (The clusters that fit at once are the same for every tile: one CTA per SM.)
  return sm90::choose_fp8_tile(args.m(), args.n(), args.k(), args.b_scaling, stores_rounded_d(args),
                               fp8::Kernel<Fp8BScaling::blocks, bf16>::max_active_clusters());
}

void gemm_fp8(const Fp8GemmArgs& args, Stream stream) {
  gemm_fp8_with_tile(args, sm90::Fp8Tile::automatic, stream);
}

} // namespace coda::gpu
