// The epilogue op list of each named fused kernel (coda/kernels/args.hpp has their math),
// declared once for both backends. A list names its ops in order; a backend's op family F gives
// each name its type:
//   the CPU backend's cpu::HostOps (src/cpu/executor.hpp): the host ops of coda/epilogue/ops,
//     F::List<Ops...> the executor's chain of them;
//   the GPU backend's gpu::fused::DeviceOps<Shape, T, ...> (src/gpu/fused/common.cuh): the device
//     ops of coda/epilogue/device on one tile shape and 16-bit type, F::List<Ops...> the
//     FusedEpilogue. A kernel whose device ops need their own tuning (buffer slots, a prepass,
//     staged partials) derives its family from DeviceOps and says why, beside its launch.
// Host and device twins share their names. Two names are roles, each played on the host by an op
// of another name:
//   Stage      the value rounded to the call's 16-bit type where the GPU's staged schedule hands
//              the tile over (device Stage<T>, which rounds in place on the other schedules);
//              the host's RoundTo to the output's dtype.
//   MainStore  the store of the value the staged tile holds, in place from it on the staged
//              schedule (device TileStore<..., kInPlace>); the host's TileStore.
// A backend passes each op its arguments (host Args, device Params) in list order.
#pragma once

#include <tuple>
#include <type_traits>

#include "coda/epilogue/reduce_block.hpp" // kStagedReduceBlock
#include "coda/epilogue/reduction.hpp"    // Sum, SumOfSquares, LogSumExp

namespace coda::kernels {

// An op a variant of a kernel leaves out: If<kIf, Op>.
struct Skip {};
template <bool kIf, class Op> using If = std::conditional_t<kIf, Op, Skip>;

namespace detail {
template <class F, class Kept, class... Ops> struct ListOf;
template <class F, class... Kept> struct ListOf<F, std::tuple<Kept...>> {
  using type = typename F::template List<Kept...>;
};
template <class F, class... Kept, class Op, class... Rest>
struct ListOf<F, std::tuple<Kept...>, Op, Rest...> : ListOf<F, std::tuple<Kept..., Op>, Rest...> {};
template <class F, class... Kept, class... Rest>
struct ListOf<F, std::tuple<Kept...>, Skip, Rest...> : ListOf<F, std::tuple<Kept...>, Rest...> {};
} // namespace detail

// F's list of Ops, the Skips left out.
template <class F, class... Ops>
using ListOf = typename detail::ListOf<F, std::tuple<>, Ops...>::type;

// K0 gemm_residual_rms: x = acc + residual, out = round(x), the row partials of x² from the
// unrounded x, out_scaled = round(x * gamma).
template <class F>
using ResidualRmsOps = ListOf<F, typename F::ResidualAdd, typename F::TileStore /* out */,
                              typename F::template ReduceOverN<epilogue::SumOfSquares>,
                              typename F::ScalePerCol, typename F::TileStore /* out_scaled */>;

// K1 gemm_rms_scale: out = round(rstd * acc).
template <class F>
using RmsScaleOps =
    ListOf<F, typename F::ScalePerRow, typename F::Stage, typename F::MainStore /* out */>;

// K2 gemm_rms_swiglu and its variants with another gate (K2g gemm_rms_geglu; Gate: SwigluGate,
// GegluGate): preact = z = round(rstd * acc), act = round(Gate(z[., 2j], z[., 2j + 1])) from z as
// stored.
template <class F, class Gate>
using RmsGatedOps =
    ListOf<F, typename F::ScalePerRow, typename F::Stage, typename F::MainStore /* preact */,
           typename F::template GatedPairStore<Gate> /* act */>;

// K4 gemm_rms_rope: out = round(RoPE(round(rstd * acc))).
template <class F>
using RmsRopeOps = ListOf<F, typename F::ScalePerRow, typename F::Stage, typename F::Rope,
                          typename F::MainStore /* out */>;

// K5 gemm_rms_lse: logits = round(rstd * acc), stored; the log-sum-exp partials (one per
// kStagedReduceBlock columns) and the target logit of the stored logits.
template <class F>
using RmsLseOps =
    ListOf<F, typename F::ScalePerRow, typename F::Stage, typename F::MainStore /* logits */,
           typename F::template ReduceOverN<epilogue::LogSumExp, kStagedReduceBlock>,
           typename F::SelectPerRow>;

// K6 gemm_rms_backward: g = alpha * acc (kRounded: rounded to the 16-bit type, from K =
// kRmsBackwardRoundedGradientMinK), dx = rstd (g gamma - xh zeta) and h_hat stored, the column
// partials of g xh, dx (kAccumulate: + its existing value) stored. On the GPU the rounded lists run
// as one op over strips of the staged tile (src/gpu/fused/k6.cu says why).
template <class F, bool kRounded, bool kAccumulate>
using RmsBackwardOps =
    ListOf<F, typename F::ScaleByScalar, If<kRounded, typename F::Stage>,
           typename F::template AuxReduce<typename F::RmsNormBackward,
                                          typename F::template ReduceOverM<epilogue::Sum>>,
           If<kAccumulate, typename F::ResidualAdd>, typename F::TileStore /* dx */>;

// K7 gemm_swiglu_backward: dy = round(acc); act recomputed and dpreact stored from the saved
// preact, the row partials (one per kStagedReduceBlock columns) of g dg + u du; act stored.
template <class F>
using SwigluBackwardOps =
    ListOf<F, typename F::Stage,
           typename F::template AuxReduce<
               typename F::SwigluBackward,
               typename F::template ReduceOverN<epilogue::Sum, kStagedReduceBlock>>,
           typename F::MainStore /* act */>;

} // namespace coda::kernels
