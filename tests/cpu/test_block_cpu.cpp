// The Llama block on the CPU backend: the shared block suite (tests/common/block_suite.hpp) on
// small ragged configurations, plus argument validation (a bad call throws the right status,
// names the field and writes nothing) and the C ABI.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "coda/block/llama.h"
#include "tests/common/block_suite.hpp"

namespace {

using namespace coda_block_suite;

// GQA with M = 150 (a ragged second 128-row block) and V = 200; hidden 200 (not a multiple of
// 128) with n_heads * head_dim = 160 != hidden, in f16 with f32 weight gradients; M = 64 within
// M = 61 within one partial block. (The tolerance rule compares maxima of errors: with much fewer
// rows the two maxima are too noisy to compare. The fp64 equivalence test covers tiny M.)
const BlockCase kCases[] = {
    {"bf16_gqa", make_config(96, 160, 4, 2, 24, 200), 150, DType::bf16, DType::bf16},
    {"f16_wide", make_config(200, 136, 4, 1, 40, 136), 133, DType::f16, DType::f32},
    {"bf16_one_block", make_config(64, 64, 2, 1, 32, 72), 61, DType::bf16, DType::f32},
};

// ---------------------------------------------------------------------------------------------
// Bad arguments: the right status, a message naming the field, and nothing written.

class BlockArguments : public ::testing::Test {
protected:
  coda::test::Seeds seeds;
  Maker make{BlockCase{"args", make_config(64, 96, 2, 1, 32, 72), 13, DType::bf16, DType::f32},
             seeds};
  MiddleProblem p{make};
  HostTensor x2 = make.output(64), qkv = make.output(make.c.qkv_width());
  HostTensor x1 = make.output(64), z1 = make.output(192), r1 = make.stat(), r2 = make.stat();
  HostTensor workspace = make.workspace(llama::Layer::middle, llama::Pass::forward);

  llama::MiddleInputs inputs() { return {p.x0.view(), p.y0.view(), p.rope.view()}; }
  llama::MiddleOutputs outputs() { return {x2.view(), qkv.view()}; }
  llama::MiddleSaved saved() { return {x1.view(), z1.view(), r1.view(), r2.view()}; }

  // Runs the forward with one argument spoiled; expects `status` and `field` in the message,
  // and every output still poisoned.
  void expect_rejected(coda::Status status, const std::string& field, const llama::Config& config,
                       const llama::MiddleWeights& weights, const llama::MiddleInputs& in,
                       const llama::MiddleOutputs& out, const coda::TensorView& ws) {
    try {
      llama::middle_forward(config, weights, in, out, saved(), ws);
      ADD_FAILURE() << "accepted a call that should fail on " << field;
    } catch (const coda::Error& e) {
      EXPECT_EQ(int(e.status()), int(status)) << e.what();
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("middle_forward"), std::string::npos) << e.what();
    }
    for (HostTensor* t : {&x2, &qkv, &x1, &z1, &r1, &r2}) {
      for (double v : t->values()) ASSERT_TRUE(std::isnan(v)) << "an output was written";
      EXPECT_TRUE(t->guard_intact());
    }
  }
};

TEST_F(BlockArguments, TransposedWeightIsNamed) {
  llama::MiddleWeights w = p.weights();
  std::swap(w.w_down.shape[0], w.w_down.shape[1]);
  w.w_down.stride[0] = w.w_down.shape[1];
  expect_rejected(coda::Status::invalid_argument, "weights.w_down", make.c, w, inputs(), outputs(),
                  workspace.view());
}

TEST_F(BlockArguments, SmallWorkspaceSaysHowMuch) {
  coda::TensorView ws = workspace.view();
  ws.shape[0] -= 1;
  expect_rejected(coda::Status::invalid_argument, "workspace_size", make.c, p.weights(), inputs(),
                  outputs(), ws);
}

TEST_F(BlockArguments, MixedDtypesAreATypeError) {
  llama::MiddleInputs in = inputs();
  in.y0.dtype = DType::f16;
  expect_rejected(coda::Status::type_error, "y0", make.c, p.weights(), in, outputs(),
                  workspace.view());
}

TEST_F(BlockArguments, OddHeadDimIsRejected) {
  llama::Config config = make.c;
  config.head_dim = 31;
  expect_rejected(coda::Status::invalid_argument, "head_dim", config, p.weights(), inputs(),
                  outputs(), workspace.view());
}

TEST_F(BlockArguments, OutputOverlappingAnInputIsRejected) {
  llama::MiddleOutputs out = outputs();
  out.x2 = p.x0.view(); // x0 is still an input when x2 is written
  expect_rejected(coda::Status::invalid_argument, "x2", make.c, p.weights(), inputs(), out,
                  workspace.view());
}

TEST_F(BlockArguments, NoTokensIsRejected) {
  llama::MiddleInputs in = inputs();
  in.x0.shape[0] = 0;
  expect_rejected(coda::Status::invalid_argument, "x0", make.c, p.weights(), in, outputs(),
                  workspace.view());
}

TEST_F(BlockArguments, WorkspaceSizeChecksItsArguments) {
  EXPECT_THROW(llama::workspace_size(llama::Layer::middle, llama::Pass::forward, make.c, 0),
               coda::Error);
  EXPECT_THROW(llama::workspace_size(llama::Layer(7), llama::Pass::forward, make.c, 16),
               coda::Error);
  llama::Config no_vocab = make.c;
  no_vocab.vocab = 0;
  EXPECT_THROW(llama::workspace_size(llama::Layer::last, llama::Pass::forward, no_vocab, 16),
               coda::Error);
  EXPECT_NO_THROW(llama::workspace_size(llama::Layer::middle, llama::Pass::forward, no_vocab, 16));
  llama::Config huge = make.c;
  huge.vocab = int64_t(1) << 40;
  EXPECT_THROW(llama::workspace_size(llama::Layer::last, llama::Pass::forward, huge, 1 << 30),
               coda::Error); // 2^70 bytes of logits partials: an error, not a wrapped size
}

// ---------------------------------------------------------------------------------------------
// The C ABI: the same bits as the C++ API, statuses instead of exceptions.

coda_tensor c_tensor(const coda::TensorView& v) {
  coda_tensor t{};
  t.data = v.data;
  t.dtype = int32_t(v.dtype);
  t.rank = v.rank;
  for (int i = 0; i < CODA_MAX_RANK; ++i) t.shape[i] = v.shape[i], t.stride[i] = v.stride[i];
  t.device = int32_t(v.device);
  t.device_index = v.device_index;
  return t;
}

coda_llama_config c_config(const llama::Config& c) {
  return {c.hidden,     c.intermediate, c.n_heads,
          c.n_kv_heads, c.head_dim,     c.vocab,
          c.eps,        c.ignore_index, int32_t(c.loss_reduction)};
}

TEST_F(BlockArguments, CAbiMatchesCpp) {
  const coda_llama_config config = c_config(make.c);
  size_t bytes = 0;
  ASSERT_EQ(coda_llama_workspace_size(CODA_LLAMA_MIDDLE, CODA_LLAMA_FORWARD, &config, 13, &bytes),
            CODA_OK);
  EXPECT_EQ(bytes, llama::workspace_size(llama::Layer::middle, llama::Pass::forward, make.c, 13));

  const llama::MiddleWeights w = p.weights();
  const coda_llama_middle_weights cw{c_tensor(w.w_out),     c_tensor(w.ffn_norm),
                                     c_tensor(w.w_gate_up), c_tensor(w.w_down),
                                     c_tensor(w.attn_norm), c_tensor(w.w_qkv)};
  const llama::MiddleInputs in = inputs();
  const coda_llama_middle_inputs ci{
      c_tensor(in.x0), c_tensor(in.y0), {c_tensor(in.rope.positions), c_tensor(in.rope.inv_freq)}};
  const coda_llama_middle_outputs co{c_tensor(x2.view()), c_tensor(qkv.view())};
  const coda_llama_middle_saved cs{c_tensor(x1.view()), c_tensor(z1.view()), c_tensor(r1.view()),
                                   c_tensor(r2.view())};
  const coda_tensor cws = c_tensor(workspace.view());
  ASSERT_EQ(coda_llama_middle_forward(&config, &cw, &ci, &co, &cs, &cws, nullptr), CODA_OK)
      << coda_last_error();

  HostTensor x2_cpp = make.output(64), qkv_cpp = make.output(make.c.qkv_width());
  HostTensor x1_cpp = make.output(64), z1_cpp = make.output(192);
  HostTensor r1_cpp = make.stat(), r2_cpp = make.stat();
  llama::middle_forward(make.c, w, in, {x2_cpp.view(), qkv_cpp.view()},
                        {x1_cpp.view(), z1_cpp.view(), r1_cpp.view(), r2_cpp.view()},
                        workspace.view());
  EXPECT_TRUE(same_bits(x2, x2_cpp));
  EXPECT_TRUE(same_bits(qkv, qkv_cpp));
  EXPECT_TRUE(same_bits(z1, z1_cpp));
  EXPECT_TRUE(same_bits(r2, r2_cpp));
}

TEST_F(BlockArguments, CAbiReportsInsteadOfThrowing) {
  const coda_llama_config config = c_config(make.c);
  EXPECT_EQ(
      coda_llama_middle_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
      CODA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(coda_last_error()).find("is NULL"), std::string::npos);

  size_t bytes = 0;
  EXPECT_EQ(coda_llama_workspace_size(CODA_LLAMA_LAST, CODA_LLAMA_BACKWARD, &config, -1, &bytes),
            CODA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(coda_last_error()).find("tokens"), std::string::npos);
  EXPECT_EQ(coda_llama_workspace_size(CODA_LLAMA_LAST, CODA_LLAMA_BACKWARD, &config, 16, nullptr),
            CODA_INVALID_ARGUMENT);

  coda_llama_config odd = config;
  odd.head_dim = 31;
  const coda_tensor none{};
  const coda_llama_first_weights w{none, none};
  const coda_llama_first_inputs in{none, {none, none}};
  const coda_llama_first_outputs out{none};
  const coda_llama_first_saved saved{none};
  EXPECT_EQ(coda_llama_first_forward(&odd, &w, &in, &out, &saved, &none, nullptr),
            CODA_INVALID_ARGUMENT);
  EXPECT_NE(std::string(coda_last_error()).find("head_dim"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Cpu, Block, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<BlockCase>& info) {
                           return std::string(info.param.name);
                         });

} // namespace
