// The Llama block on the GPU backend (issue: backward kernels and the whole block on the GPU):
//  * the shared block suite (tests/common/block_suite.hpp: first, middle and last layer, forward
//    and backward, against the fp64 textbook block under ARCHITECTURE section 7's rule) on small
//    ragged configurations with GQA, both 16-bit dtypes and f32 / bf16 weight gradients;
//  * each GPU result against the CPU backend's on the same inputs, under the same rule;
//  * the Llama-1B shape (hidden 2048, MLP 8192, 32 / 8 heads of 64) against the textbook block;
//  * bitwise-identical outputs and gradients over 20 repeated runs;
//  * tiny *SmallForSanitizer* runs for compute-sanitizer.
// The GPU RoPE epilogue needs head_dim 64 or 128, so the GPU cases use those.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/common/block_suite.hpp"

namespace {

using namespace coda_block_suite;
using coda::test::DeviceMirror;
using coda::test::HostViews;

// GQA 2:1 with M = 150 (a ragged second 128-row block), F and V not multiples of a tile; hidden
// 200 with 4 x 64 = 256 != hidden and 4:1 GQA in f16 with f32 weight gradients; head_dim 128
// with M = 61 inside one partial block.
const BlockCase kGpuCases[] = {
    {"bf16_gqa", make_config(128, 352, 4, 2, 64, 264), 150, DType::bf16, DType::bf16, true},
    {"f16_wide", make_config(200, 136, 4, 1, 64, 136), 133, DType::f16, DType::f32, true},
    {"bf16_hd128", make_config(256, 200, 2, 1, 128, 72), 61, DType::bf16, DType::f32, true},
};

INSTANTIATE_TEST_SUITE_P(Gpu, Block, ::testing::ValuesIn(kGpuCases),
                         [](const ::testing::TestParamInfo<BlockCase>& info) {
                           return std::string(info.param.name);
                         });

class BlockGpu : public ::testing::TestWithParam<BlockCase> {
protected:
  void SetUp() override {
    if (!coda::test::gpu_backend_available()) GTEST_SKIP() << "no sm_90 GPU";
  }
  coda::test::Seeds seeds;
};

// Every result of the GPU run against the CPU backend's on the same inputs: max |gpu - cpu| <=
// 2 max |unfused - cpu| + 1e-6 (the rule, with the CPU backend as the reference), where
// `unfused` is the textbook block in the case's 16-bit dtype.
void expect_close_to_cpu(const std::string& name, const HostTensor& gpu, HostTensor& cpu,
                         const Values& unfused) {
  CODA_EXPECT_PASSES(coda::test::check_against_baseline(name + " vs the CPU backend", gpu.values(),
                                                        cpu.values(), unfused));
}

TEST_P(BlockGpu, MiddleLayerMatchesTheCpuBackend) {
  Maker make(GetParam(), seeds);
  MiddleProblem p(make);
  MiddleResult gpu;
  {
    DeviceMirror mirror;
    gpu = run_middle(make, p, GetParam().grad_dtype, false);
  }
  MiddleResult cpu = run_middle(make, p, GetParam().grad_dtype, false);

  const llama::Config& c = make.c;
  const ref::LlamaConfig rc = ref_config(c);
  const ref::Rounding lowp = coda::test::lowp(make.dt);
  const ref::MiddleForward lf =
      ref::middle_forward(rc, p.textbook(), p.rope.textbook(), p.x0.values(), p.y0.values(), lowp);
  const ref::MiddleBackward lb =
      ref::middle_backward(rc, p.textbook(), p.rope.textbook(), p.x0.values(), p.y0.values(),
                           p.dx2.values(), p.dqkv.values(), lowp);
  expect_close_to_cpu("outputs.x2", gpu.x2, cpu.x2, lf.mlp.x2);
  expect_close_to_cpu("outputs.qkv", gpu.qkv, cpu.qkv, lf.qkv);
  expect_close_to_cpu("saved.x1", gpu.x1, cpu.x1, lf.mlp.x1);
  expect_close_to_cpu("saved.r1", gpu.r1, cpu.r1, lf.mlp.rstd1);
  expect_close_to_cpu("saved.r2", gpu.r2, cpu.r2, lf.rstd2);
  expect_close_to_cpu("grads.dx", gpu.dx, cpu.dx, lb.dx0);
  expect_close_to_cpu("grads.dy0", gpu.dy0, cpu.dy0, lb.dy0);
  expect_close_to_cpu("d w_out", gpu.d_out.tensor, cpu.d_out.tensor, lb.grads.w_o);
  expect_close_to_cpu("d w_down", gpu.d_down.tensor, cpu.d_down.tensor, lb.grads.w_down);
  expect_close_to_cpu("d w_qkv", gpu.d_qkv.tensor, cpu.d_qkv.tensor, lb.grads.w_qkv_next);
  expect_close_to_cpu("d attn_norm", gpu.d_attn.tensor, cpu.d_attn.tensor, lb.grads.next_attn_norm);
  expect_close_to_cpu("d ffn_norm", gpu.d_ffn.tensor, cpu.d_ffn.tensor, lb.grads.ffn_norm);
}

TEST_P(BlockGpu, LastLayerMatchesTheCpuBackend) {
  Maker make(GetParam(), seeds);
  LastProblem p(make, ref::Reduction::mean);
  LastResult gpu;
  {
    DeviceMirror mirror;
    gpu = run_last(make, p, GetParam().grad_dtype, false, {0.75f, {}}, true);
  }
  LastResult cpu = run_last(make, p, GetParam().grad_dtype, false, {0.75f, {}}, true);

  const ref::LlamaConfig rc = ref_config(make.c);
  const ref::Rounding lowp = coda::test::lowp(make.dt);
  const ref::LastForward lf =
      ref::last_forward(rc, p.textbook(), p.x0.values(), p.y0.values(), p.loss, lowp);
  const ref::LastBackward lb =
      ref::last_backward(rc, p.textbook(), p.x0.values(), p.y0.values(), p.loss, 0.75f, lowp);
  expect_close_to_cpu("outputs.logits", gpu.logits, cpu.logits, lf.logits);
  expect_close_to_cpu("saved.x2", gpu.x2, cpu.x2, lf.mlp.x2);
  expect_close_to_cpu("saved.r2", gpu.r2, cpu.r2, lf.rstd2);
  expect_close_to_cpu("grads.dx", gpu.dx, cpu.dx, lb.dx0);
  expect_close_to_cpu("grads.dy0", gpu.dy0, cpu.dy0, lb.dy0);
  expect_close_to_cpu("d final_norm", gpu.d_final.tensor, cpu.d_final.tensor, lb.grads.final_norm);
  expect_close_to_cpu("d lm_head", gpu.d_head.tensor, cpu.d_head.tensor, lb.grads.w_lm);
  expect_close_to_cpu("d w_down", gpu.d_down.tensor, cpu.d_down.tensor, lb.grads.w_down);
  EXPECT_TRUE(same_bits(gpu.grad_scale, cpu.grad_scale));
}

// 20 runs of the middle and the last layer, forward and backward: every output and gradient has
// the bits of the first run (no atomics, fixed reduction orders, stream-K in worker order).
TEST_P(BlockGpu, TwentyRunsAreBitwiseIdentical) {
  Maker make(GetParam(), seeds);
  MiddleProblem mp(make);
  LastProblem lp(make, ref::Reduction::mean);
  DeviceMirror mirror;
  MiddleResult middle = run_middle(make, mp, GetParam().grad_dtype, false);
  LastResult last = run_last(make, lp, GetParam().grad_dtype, false, {1.f, {}}, true);
  for (int run = 1; run < 20; ++run) {
    MiddleResult m = run_middle(make, mp, GetParam().grad_dtype, false);
    LastResult l = run_last(make, lp, GetParam().grad_dtype, false, {1.f, {}}, true);
    const std::vector<HostTensor*> a = middle.all(), b = m.all(), d = last.all(), e = l.all();
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(same_bits(*a[i], *b[i])) << "middle result " << i << ", run " << run;
    for (size_t i = 0; i < d.size(); ++i)
      EXPECT_TRUE(same_bits(*d[i], *e[i])) << "last result " << i << ", run " << run;
    EXPECT_TRUE(same_bits(last.logits, l.logits)) << "logits, run " << run;
  }
}

INSTANTIATE_TEST_SUITE_P(Gpu, BlockGpu, ::testing::ValuesIn(kGpuCases),
                         [](const ::testing::TestParamInfo<BlockCase>& info) {
                           return std::string(info.param.name);
                         });

// The Llama-1B shape: hidden 2048, MLP 8192, 32 query / 8 key-value heads of 64, 64 tokens
// (the fp64 textbook block on the host bounds M), vocabulary 8192 for the last layer (the LM head's
// shape is the only difference from 128256, and the host reference's cost scales with it).
TEST(BlockGpuLlama1B, MiddleAndLastLayerMatchTheTextbookBlock) {
  if (!coda::test::gpu_backend_available()) GTEST_SKIP() << "no sm_90 GPU";
  coda::test::Seeds seeds;
  const BlockCase llama1b{
      "llama1b", make_config(2048, 8192, 32, 8, 64, 8192), 64, DType::bf16, DType::f32, true};
  Maker make(llama1b, seeds);
  DeviceMirror mirror;
  expect_middle_layer(make, llama1b.grad_dtype, false);
  expect_last_layer(make, llama1b.grad_dtype,
                    LastLayerCase{true, false, false, "mean loss, dloss value, writing gradients"});
}

// Tiny runs of every layer (and the middle backward's two parts) for compute-sanitizer
// (memcheck, racecheck, synccheck): the results are checked against the CPU backend only loosely
// here (the suites above hold the numerics).
TEST(BlockGpuSmallForSanitizer, EveryLayerForwardAndBackward) {
  if (!coda::test::gpu_backend_available()) GTEST_SKIP() << "no sm_90 GPU";
  coda::test::Seeds seeds;
  const BlockCase tiny{"tiny", make_config(64, 64, 1, 1, 64, 72), 40, DType::bf16, DType::f32,
                       true};
  Maker make(tiny, seeds);
  MiddleProblem mp(make);
  LastProblem lp(make, ref::Reduction::mean);
  DeviceMirror mirror;
  MiddleResult m = run_middle(make, mp, tiny.grad_dtype, true);
  MiddleResult parts = run_middle(make, mp, tiny.grad_dtype, true, BackwardCalls::two_parts);
  LastResult l = run_last(make, lp, tiny.grad_dtype, false, {1.f, {}}, true);
  for (HostTensor* t : m.all())
    for (double v : t->values()) ASSERT_TRUE(std::isfinite(v));
  for (HostTensor* t : parts.all())
    for (double v : t->values()) ASSERT_TRUE(std::isfinite(v));
  for (HostTensor* t : l.all())
    for (double v : t->values()) ASSERT_TRUE(std::isfinite(v));
}

} // namespace
