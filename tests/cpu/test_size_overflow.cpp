// Sizes computed from caller-given numbers near 2^63: every one is either exact or an error,
// never a wrapped value (found by UBSan and by the C ABI fuzzer, tests/fuzz). Under the
// sanitizer build (tools/ci_sanitize.sh) the old arithmetic fails these tests as undefined
// behaviour; in a plain build they check the results and the messages.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "coda/block/llama.hpp"
#include "coda/coda.h"
#include "coda/coda.hpp"

namespace {

using namespace coda;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();

// The status and the message of a throwing call (Status::ok and "" if it did not throw).
template <class F> std::pair<Status, std::string> error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.status(), e.what()};
  }
  return {Status::ok, ""};
}

TEST(SizeOverflow, ReduceBlocksIsExactUpToInt64Max) {
  static_assert(num_reduce_blocks(0) == 0 && num_reduce_blocks(1) == 1);
  static_assert(num_reduce_blocks(128) == 1 && num_reduce_blocks(129) == 2);
  static_assert(num_reduce_blocks(kInt64Max) == kInt64Max / 128 + 1);
  static_assert(num_reduce_blocks(kInt64Max - 127) == (int64_t(1) << 56) - 1); // 128 (2^56 - 1)
  static_assert(num_reduce_blocks(kInt64Max - 126) == int64_t(1) << 56);
  EXPECT_EQ(num_reduce_blocks(kInt64Max), int64_t(1) << 56);
}

TEST(SizeOverflow, CrossEntropyWorkspaceSizeIsExactOrAnError) {
  EXPECT_EQ(cross_entropy_workspace_size(0), 0u);
  EXPECT_EQ(cross_entropy_workspace_size(1), 512u); // two 256-byte regions
  EXPECT_EQ(cross_entropy_workspace_size(65), 1024u); // 260 bytes per region, padded to 512
  // 2^60 rows: two regions of 2^62 bytes, 2^63 in all, still representable.
  EXPECT_EQ(cross_entropy_workspace_size(int64_t(1) << 60), size_t(1) << 63);
  // From 2^61 rows on the size needs 2^64 bytes or more: an error (it used to wrap to 0).
  for (int64_t m : {int64_t(1) << 61, int64_t(1) << 62, kInt64Max}) {
    const auto [status, message] = error_of([&] { cross_entropy_workspace_size(m); });
    EXPECT_EQ(status, Status::invalid_argument) << "m = " << m;
    EXPECT_NE(message.find("SIZE_MAX"), std::string::npos) << message;
    size_t bytes = 12345;
    EXPECT_EQ(coda_cross_entropy_workspace_size(m, &bytes), CODA_INVALID_ARGUMENT);
    EXPECT_EQ(bytes, 12345u) << "a failing size query must not write its result";
  }
}

// A single row's stride addresses nothing, so any multiple of 8 is a valid stride for it; the
// validator used to form stride * 2 (signed overflow for 2^62) to check the 16-byte pitch.
TEST(SizeOverflow, SingleRowWithHugeStrideRunsLikeAContiguousOne) {
  constexpr int64_t K = 16, N = 8;
  std::vector<bf16> a(K), b(N * K), d_strided(N, bf16::from(NAN)), d_plain = d_strided;
  for (int64_t i = 0; i < K; ++i) a[size_t(i)] = bf16::from(0.25f * float(i % 5) - 0.5f);
  for (int64_t i = 0; i < N * K; ++i) b[size_t(i)] = bf16::from(0.125f * float(i % 7) - 0.375f);

  GemmArgs g;
  g.a = make_view(a.data(), DType::bf16, 1, K);
  g.b = make_view(b.data(), DType::bf16, N, K);
  g.d = make_view(d_plain.data(), DType::bf16, 1, N);
  gemm(g);
  for (int64_t stride : {int64_t(1) << 62, kInt64Max - 7}) {
    g.a.stride[0] = stride;
    g.d = make_view(d_strided.data(), DType::bf16, 1, N);
    g.d.stride[0] = stride;
    gemm(g);
    EXPECT_EQ(std::memcmp(d_plain.data(), d_strided.data(), sizeof(bf16) * N), 0)
        << "stride " << stride;
  }
}

// The last element of a [2, 1] f32 view with stride[0] = 2^63 - 1 sits at offset INT64_MAX: its
// element count overflows (found by the fuzzer; the validator formed last + 1 unchecked).
TEST(SizeOverflow, ViewEndingAtInt64MaxIsTooLargeToAddress) {
  std::vector<float> partials(2), out(2);
  RowReduceArgs args;
  args.partials = make_view(partials.data(), DType::f32, 2, 1);
  args.partials.stride[0] = kInt64Max;
  args.out = make_view(out.data(), DType::f32, 2);
  const auto [status, message] = error_of([&] { reduce_row_partials(args); });
  EXPECT_EQ(status, Status::invalid_argument);
  EXPECT_NE(message.find("too large to address"), std::string::npos) << message;
}

TEST(SizeOverflow, RopeWidthThatOverflowsIsAnError) {
  RmsRopeArgs args; // the rope fields are checked before any tensor is read
  args.rope.n_q_heads = kInt32Max;
  args.rope.n_kv_heads = kInt32Max;
  args.rope.head_dim = kInt32Max - 1;
  std::vector<bf16> a(16), w(16);
  std::vector<float> partials(1);
  args.a = make_view(a.data(), DType::bf16, 1, 16);
  args.w = make_view(w.data(), DType::bf16, 1, 16);
  args.sumsq_partials = make_view(partials.data(), DType::f32, 1, 1);
  const auto [status, message] = error_of([&] { gemm_rms_rope(args); });
  EXPECT_EQ(status, Status::invalid_argument);
  EXPECT_NE(message.find("overflows 64 bits"), std::string::npos) << message;
}

TEST(SizeOverflow, BlockConfigWidthsThatOverflowAreErrors) {
  llama::Config c;
  c.hidden = 64, c.intermediate = 128, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16;
  c.vocab = 256;
  ASSERT_GT(llama::workspace_size(llama::Layer::last, llama::Pass::backward, c, 8), 0u);

  llama::Config heads = c;
  heads.n_heads = kInt32Max, heads.n_kv_heads = kInt32Max, heads.head_dim = kInt32Max - 1;
  llama::Config ffn = c;
  ffn.intermediate = kInt64Max;
  llama::Config vocab = c;
  vocab.vocab = kInt64Max;
  for (llama::Pass pass : {llama::Pass::forward, llama::Pass::backward})
    for (const llama::Config& bad : {heads, ffn}) {
      const auto [status, message] =
          error_of([&] { llama::workspace_size(llama::Layer::last, pass, bad, 8); });
      EXPECT_EQ(status, Status::invalid_argument) << message;
      EXPECT_NE(message.find("config"), std::string::npos) << message;
    }
  // The forward's [M, ceil(vocab/128)] LSE partials.
  const auto [vocab_status, vocab_message] = error_of(
      [&] { llama::workspace_size(llama::Layer::last, llama::Pass::forward, vocab, 1 << 20); });
  EXPECT_EQ(vocab_status, Status::invalid_argument) << vocab_message;
  // A token count whose scratch needs more than 2^64 bytes.
  const auto [status, message] = error_of(
      [&] { llama::workspace_size(llama::Layer::middle, llama::Pass::forward, c, kInt64Max / 4); });
  EXPECT_EQ(status, Status::invalid_argument) << message;
}

} // namespace
