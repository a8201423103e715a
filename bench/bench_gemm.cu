// coda's GEMM against cuBLASLt on the GEMMs of a Llama block (and a few squares), bf16 in and
// out, fp32 accumulate. Both run in this process on the same random inputs; each timed run
// follows a 256 MB write that flushes L2; the median of the timed runs is reported.
//
//   bench_gemm [--commit HASH] [--out bench/results/gemm.json] [--runs 50] [--filter SUBSTRING]
//              [--variants 1] [--variants-out bench/results/gemm_schedules.json]
// (flags as "--name value" or "--name=value"; --commit defaults to $CODA_COMMIT)
//
// Prints a table (TFLOP/s of both, cublas_ms / coda_ms) and the geometric mean of that ratio
// over the 24 block GEMMs, and writes the JSON described in docs/PERFORMANCE.md. coda runs
// what coda::gemm would (gpu::gemm's plan). With --variants 1 it also times other plans of
// the same kernels (kernel, raster group, stream-K, deferred stores: see kVariants) in the same
// interleaved loop and prints their ratios; the JSON keeps the default plan only. Each case
// also prints the algorithm cuBLASLt's heuristic chose (tile and stage ids of cublasLt.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "coda/core/error.hpp"
#include "coda/gemm/heuristic.hpp"
#include "gpu/backend.hpp"
#include "gpu/gemm/instances.hpp"
#include "harness.cuh"

namespace {

using bench::Buffer;
using bench::check;
using bench::CublasGemm;

using BenchCase = bench::GemmCase;

std::vector<BenchCase> bench_cases() {
  std::vector<BenchCase> cases = bench::llama_block_gemms();
  for (int64_t s : {2048, 4096, 8192}) cases.push_back(bench::square_gemm(s));
  return cases;
}

// Plans timed with --variants 1 besides gpu::gemm's own.
struct Variant {
  const char* name;
  coda::sm90::GemmPlan (*plan)(const coda::GemmArgs&);
};

// The plan of worklog step 3: ping-pong for poor waves, group ~ one wave, no stream-K, stores
// not deferred.
coda::sm90::GemmPlan previous_plan(const coda::GemmArgs& args) {
  using namespace coda::sm90;
  const int64_t m = args.m(), n = args.n(), sms = 132;
  GemmPlan plan;
  const int64_t tiles_m = coda::ceil_div<int64_t>(m, 128);
  const double wide = wave_efficiency(tiles_m * coda::ceil_div<int64_t>(n, 256), sms);
  const double narrow = wave_efficiency(tiles_m * coda::ceil_div<int64_t>(n, 128), sms);
  if (wide < 0.8 && narrow > wide + 0.15) plan.kernel = KernelId::pingpong;
  const int64_t tiles_n = coda::ceil_div<int64_t>(n, plan.kernel == KernelId::wide ? 256 : 128);
  const int64_t units_m = coda::ceil_div<int64_t>(tiles_m, 2);
  int64_t g = coda::ceil_div<int64_t>(sms / 2, tiles_n);
  g = g < 2 ? 2 : g > 16 ? 16 : g;
  plan.group_m = int32_t(g > units_m ? std::max<int64_t>(units_m, 1) : g);
  plan.stream_k = StreamKMode::off;
  plan.defer_stores = false;
  return plan;
}

template <bool kDefer, coda::sm90::StreamKMode kStreamK, int kGroup>
coda::sm90::GemmPlan variant_plan(const coda::GemmArgs& args) {
  coda::sm90::GemmPlan plan = coda::gpu::default_plan(args);
  plan.defer_stores = kDefer;
  plan.stream_k = kStreamK;
  if (kGroup > 0) plan.group_m = kGroup;
  return plan;
}

coda::sm90::GemmPlan pingpong_plan(const coda::GemmArgs& args) {
  coda::sm90::GemmPlan plan = coda::gpu::default_plan(args);
  plan.kernel = coda::sm90::KernelId::pingpong;
  plan.stream_k = coda::sm90::StreamKMode::off;
  return plan;
}

// A kernel of the schedule study (docs/gemm-worklog.md, step 9) with the default plan's
// stream-K rule and a raster group for its own tile width.
template <coda::sm90::KernelId kKernel>
coda::sm90::GemmPlan study_plan(const coda::GemmArgs& args) {
  coda::sm90::GemmPlan plan = coda::gpu::default_plan(args);
  plan.kernel = kKernel;
  plan.group_m = coda::sm90::group_m_for(kKernel, args.m(), 132);
  return plan;
}
// The same without stream-K: the floor of a fused kernel on that schedule (the fused launches
// take no workspace, so no stream-K).
template <coda::sm90::KernelId kKernel>
coda::sm90::GemmPlan study_plan_no_sk(const coda::GemmArgs& args) {
  coda::sm90::GemmPlan plan = study_plan<kKernel>(args);
  plan.stream_k = coda::sm90::StreamKMode::off;
  return plan;
}

using coda::sm90::KernelId;
using coda::sm90::StreamKMode;
const Variant kVariants[] = {
    {"same", variant_plan<true, StreamKMode::automatic, 0>}, // the default again: order bias
    {"wide", study_plan<KernelId::wide>}, // the wide tile, where the default picks another
    {"previous", previous_plan},
    {"no_defer", variant_plan<false, StreamKMode::automatic, 0>},
    {"no_sk", variant_plan<true, StreamKMode::off, 0>},
    {"sk_always", variant_plan<true, StreamKMode::always, 0>},
    {"group4", variant_plan<true, StreamKMode::automatic, 4>},
    {"group16", variant_plan<true, StreamKMode::automatic, 16>},
    {"pingpong", pingpong_plan},
    {"wide_3stages", study_plan<KernelId::wide_3stages>},
    {"wide192", study_plan<KernelId::wide192>},
    {"staged", study_plan<KernelId::staged>},
    {"staged192", study_plan<KernelId::staged192>},
    {"staged192_no_sk", study_plan_no_sk<KernelId::staged192>},
    {"pingpong_wide", study_plan_no_sk<KernelId::pingpong_wide>}, // ping-pong: no stream-K
    {"staged_wide", study_plan<KernelId::staged_wide>},
    {"staged_wide_no_sk", study_plan_no_sk<KernelId::staged_wide>},
    {"staged128", study_plan<KernelId::staged128>},
};
constexpr int kNumVariants = int(sizeof(kVariants) / sizeof(kVariants[0]));

struct Result {
  BenchCase c;
  double coda_ms, cublas_ms, max_rel_diff;
  std::vector<double> variant_ms;   // kVariants order, when timed
  std::vector<double> variant_diff; // max relative difference from cuBLASLt's D
};

Result bench_case(const BenchCase& c, const bench::Context& ctx, int runs, bool variants) {
  const cudaStream_t s = ctx.stream;
  Buffer a(size_t(c.m * c.k * 2)), b(size_t(c.n * c.k * 2)), d(size_t(c.m * c.n * 2)),
      d_ref(size_t(c.m * c.n * 2));
  bench::fill_uniform<<<1024, 256, 0, s>>>(a.as<__nv_bfloat16>(), c.m * c.k, 1, -1.f, 1.f);
  bench::fill_uniform<<<1024, 256, 0, s>>>(b.as<__nv_bfloat16>(), c.n * c.k, 2, -1.f, 1.f);
  check(cudaGetLastError(), "fill");

  coda::GemmArgs args;
  args.layout = c.layout;
  const bool a_km = c.layout == coda::GemmLayout::wgrad, b_nk = c.layout == coda::GemmLayout::fwd;
  args.a = a_km ? coda::make_view(a.p, coda::DType::bf16, c.k, c.m, coda::Device::cuda)
                : coda::make_view(a.p, coda::DType::bf16, c.m, c.k, coda::Device::cuda);
  args.b = b_nk ? coda::make_view(b.p, coda::DType::bf16, c.n, c.k, coda::Device::cuda)
                : coda::make_view(b.p, coda::DType::bf16, c.k, c.n, coda::Device::cuda);
  args.d = coda::make_view(d.p, coda::DType::bf16, c.m, c.n, coda::Device::cuda);
  CublasGemm cublas(ctx.lt, c.layout, c.m, c.n, c.k, ctx.workspace.p, ctx.kWorkspaceBytes);
  std::printf("  cuBLASLt %s: %s\n", c.name.c_str(), cublas.describe().c_str());

  auto run_coda = [&] { coda::gpu::gemm(args, s); };
  auto run_cublas = [&] { cublas.run(a.p, b.p, d_ref.p, s); };
  std::vector<coda::sm90::GemmPlan> plans;
  if (variants)
    for (const Variant& v : kVariants) plans.push_back(v.plan(args));
  // One stream-K workspace (as coda::gemm's callers pass) for the default plan and every variant.
  size_t coda_ws_bytes = coda::gpu::gemm_workspace_size(args);
  for (const auto& plan : plans)
    coda_ws_bytes = std::max(coda_ws_bytes, coda::gpu::gemm_workspace_size(args, plan));
  Buffer coda_ws(std::max<size_t>(coda_ws_bytes, 16));
  if (coda_ws_bytes > 0)
    args.workspace = coda::make_view(coda_ws.p, coda::DType::f32, int64_t(coda_ws_bytes / 4),
                                     coda::Device::cuda);
  for (int i = 0; i < 5; ++i) {
    run_coda(), run_cublas();
    for (const auto& plan : plans) coda::gpu::gemm_with_plan(args, plan, s);
  }
  check(cudaStreamSynchronize(s), "warm-up");
  // Each variant computes the same D (up to fp32 summation order): its largest relative
  // difference from cuBLASLt's, after a poisoned D.
  std::vector<double> variant_diff;
  for (const auto& plan : plans) {
    check(cudaMemsetAsync(d.p, 0xff, d.bytes, s), "poison D");
    coda::gpu::gemm_with_plan(args, plan, s);
    check(cudaStreamSynchronize(s), "variant run");
    variant_diff.push_back(bench::max_rel_diff(d.p, d_ref.p, c.m * c.n));
  }

  bench::Timer timer = ctx.timer();
  std::vector<float> t_coda, t_cublas;
  std::vector<std::vector<float>> t_variants(plans.size());
  auto timed = [&](auto&& fn, std::vector<float>& out) { timer.timed(fn, out); };
  for (int i = 0; i < runs; ++i) {
    timed(run_coda, t_coda), timed(run_cublas, t_cublas); // interleaved
    for (size_t j = 0; j < plans.size(); ++j) { // rotated, so no variant always runs first
      const size_t v = (j + size_t(i)) % plans.size();
      timed([&] { coda::gpu::gemm_with_plan(args, plans[v], s); }, t_variants[v]);
    }
  }
  // The variants write D too: recompute it with the default plan, which the JSON reports.
  run_coda();
  check(cudaStreamSynchronize(s), "final run");
  Result r{c,
           bench::median(t_coda),
           bench::median(t_cublas),
           bench::max_rel_diff(d.p, d_ref.p, c.m * c.n),
           {}};
  for (const auto& t : t_variants) r.variant_ms.push_back(bench::median(t));
  r.variant_diff = variant_diff;
  return r;
}

double tflops(const BenchCase& c, double ms) {
  return 2.0 * double(c.m) * double(c.n) * double(c.k) / (ms * 1e9);
}

} // namespace

int main(int argc, char** argv) {
  std::string commit, out_path, filter, variants_out;
  int runs = 50;
  bool variants = false;
  try {
    const bench::Flags flags(
        argc, argv, {"--commit", "--out", "--runs", "--filter", "--variants", "--variants-out"});
    commit = flags.commit();
    out_path = flags.get("--out", "bench/results/gemm.json");
    runs = std::max(1, flags.get_int("--runs", runs));
    filter = flags.get("--filter", "");
    variants = flags.get_int("--variants", 0) != 0;
    variants_out = flags.get("--variants-out", "");
  } catch (const std::exception& e) {
    return std::fprintf(stderr, "bench_gemm: %s\n", e.what()), 2;
  }
  try {
    if (!coda::gpu::device_supported())
      return std::fprintf(stderr, "bench_gemm needs an sm_90 GPU\n"), 1;
    const bench::Context ctx;

    std::vector<Result> results;
    std::printf("%-24s %6s %6s %6s  %9s %9s  %7s %9s\n", "case", "M", "N", "K", "coda TF/s",
                "cuBLAS", "ratio", "rel diff");
    for (const BenchCase& c : bench_cases()) {
      if (c.name.find(filter) == std::string::npos) continue;
      const Result r = bench_case(c, ctx, runs, variants);
      results.push_back(r);
      std::printf("%-24s %6lld %6lld %6lld  %9.1f %9.1f  %7.3f %9.2e\n", c.name.c_str(),
                  (long long)c.m, (long long)c.n, (long long)c.k, tflops(c, r.coda_ms),
                  tflops(c, r.cublas_ms), r.cublas_ms / r.coda_ms, r.max_rel_diff);
      for (size_t v = 0; v < r.variant_ms.size(); ++v)
        std::printf("    variant %-12s ratio %.3f  rel diff %.2e\n", kVariants[v].name,
                    r.cublas_ms / r.variant_ms[v], r.variant_diff[v]);
      std::fflush(stdout);
    }
    double log_sum = 0, worst = 1e30;
    int blocks = 0;
    for (const Result& r : results)
      if (std::strcmp(r.c.layout_name, "square") != 0) {
        log_sum += std::log(r.cublas_ms / r.coda_ms), ++blocks;
        worst = std::min(worst, r.cublas_ms / r.coda_ms);
      }
    std::printf("geomean cublas_ms/coda_ms over %d block GEMMs: %.3f (min %.3f)\n", blocks,
                std::exp(log_sum / std::max(blocks, 1)), worst);
    for (int v = 0; variants && v < kNumVariants; ++v) {
      double sum = 0, low = 1e30;
      for (const Result& r : results)
        if (std::strcmp(r.c.layout_name, "square") != 0) {
          sum += std::log(r.cublas_ms / r.variant_ms[size_t(v)]);
          low = std::min(low, r.cublas_ms / r.variant_ms[size_t(v)]);
        }
      std::printf("variant %-12s geomean %.3f (min %.3f)\n", kVariants[v].name,
                  std::exp(sum / std::max(blocks, 1)), low);
    }
    // The variants' times, for the schedule table of docs/gemm-worklog.md.
    if (variants && !variants_out.empty()) {
      FILE* vf = bench::open_json(variants_out, ctx.prop, commit, runs);
      for (size_t i = 0; i < results.size(); ++i) {
        const Result& r = results[i];
        std::fprintf(vf,
                     "    {\"name\": \"%s\", \"layout\": \"%s\", \"m\": %lld, \"n\": %lld, "
                     "\"k\": %lld, \"coda_ms\": %.5f, \"cublas_ms\": %.5f, \"variants\": {",
                     r.c.name.c_str(), r.c.layout_name, (long long)r.c.m, (long long)r.c.n,
                     (long long)r.c.k, r.coda_ms, r.cublas_ms);
        for (size_t v = 0; v < r.variant_ms.size(); ++v)
          std::fprintf(vf, "\"%s\": {\"ms\": %.5f, \"max_rel_diff\": %.3e}%s", kVariants[v].name,
                       r.variant_ms[v], r.variant_diff[v], v + 1 < r.variant_ms.size() ? ", " : "");
        std::fprintf(vf, "}}%s\n", i + 1 < results.size() ? "," : "");
      }
      bench::close_json(vf);
    }

    FILE* f = bench::open_json(out_path, ctx.prop, commit, runs);
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::fprintf(
          f,
          "    {\"name\": \"%s\", \"layout\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, "
          "\"coda_ms\": %.5f, \"cublas_ms\": %.5f}%s\n",
          r.c.name.c_str(), r.c.layout_name, (long long)r.c.m, (long long)r.c.n, (long long)r.c.k,
          r.coda_ms, r.cublas_ms, i + 1 < results.size() ? "," : "");
    }
    bench::close_json(f);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm: %s\n", e.what());
    return 1;
  }
}
