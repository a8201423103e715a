#include "cpu/executor.hpp"

#include "coda/epilogue/host_tensor.hpp"

namespace coda::cpu {

using epilogue::load_float;

GemmMainloop::GemmMainloop(GemmLayout layout, const TensorView& a, const TensorView& b, int64_t m,
                           int64_t n, int64_t k)
    : k_(k), a_(size_t(m * k)), b_t_(size_t(n * k)) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t kk = 0; kk < k; ++kk)
      a_[size_t(i * k + kk)] =
          layout == GemmLayout::wgrad ? load_float(a, kk, i) : load_float(a, i, kk);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t kk = 0; kk < k; ++kk)
      b_t_[size_t(j * k + kk)] =
          layout == GemmLayout::fwd ? load_float(b, j, kk) : load_float(b, kk, j);
}

void GemmMainloop::operator()(const epilogue::HostFragment& frag) const {
  const epilogue::TileCoord& tile = frag.tile;
  for (int64_t r = 0; r < tile.rows; ++r) {
    const float* a_row = a_.data() + (tile.m0 + r) * k_;
    for (int64_t c = 0; c < tile.cols; ++c) {
      const float* b_col = b_t_.data() + (tile.n0 + c) * k_;
      float acc = 0.f;
      for (int64_t kk = 0; kk < k_; ++kk) acc += a_row[kk] * b_col[kk];
      frag.value(r, c) = acc;
    }
  }
}

void TensorMainloop::operator()(const epilogue::HostFragment& frag) const {
  const epilogue::TileCoord& tile = frag.tile;
  for (int64_t r = 0; r < tile.rows; ++r)
    for (int64_t c = 0; c < tile.cols; ++c)
      frag.value(r, c) = load_float(x_, tile.m0 + r, tile.n0 + c);
}

ep::Rope::Args rope_args(const RopeSpec& rope, bool inverse) {
  ep::Rope::Args args;
  args.positions = rope.positions;
  args.inv_freq = rope.inv_freq;
  args.head_dim = rope.head_dim;
  args.rotated_cols = (int64_t(rope.n_q_heads) + rope.n_kv_heads) * rope.head_dim; // Q and K
  args.inverse = inverse;
  return args;
}

void require(bool ok, const std::string& message) {
  if (!ok) throw Error(Status::invalid_argument, message);
}

Tile checked_tile(Tile tile, const char* kernel) {
  require(tile.m >= 1 && tile.n >= 2 && tile.n % 2 == 0,
          std::string("cpu::") + kernel +
              ": the tile must be at least 1 x 2 with an even width "
              "(column pairs never straddle tiles); got " +
              std::to_string(tile.m) + " x " + std::to_string(tile.n));
  return tile;
}

namespace {

// `partials` is [rows, blocks] with rows and blocks as the tile grid makes them.
void require_partials(const TensorView& partials, int64_t rows, int64_t blocks, const char* kernel,
                      const char* name) {
  require(partials.rank == 2 && partials.shape[0] == rows && partials.shape[1] == blocks,
          std::string("cpu::") + kernel + ": " + name + " must be [" + std::to_string(rows) + ", " +
              std::to_string(blocks) + "] for this tile; got rank " +
              std::to_string(partials.rank) + " [" + std::to_string(partials.shape[0]) + ", " +
              std::to_string(partials.shape[1]) + "]");
}

} // namespace

namespace {
std::variant<GemmMainloop, Fp8GemmMainloop> mainloop_for(GemmLayout layout, const TensorView& a,
                                                         const TensorView& w, int64_t m, int64_t n,
                                                         int64_t k, const TensorView& a_scales,
                                                         const TensorView& w_scales) {
  if (a.dtype == DType::e4m3)
    return Fp8GemmMainloop(
        Fp8GemmArgs{.a = a, .a_scales = a_scales, .b = w, .b_scales = w_scales, .d = {}});
  return GemmMainloop(layout, a, w, m, n, k);
}
} // namespace

FusedGemm::FusedGemm(const char* kernel, GemmLayout layout, const TensorView& a,
                     const TensorView& w, Tile tile, const TensorView& a_scales,
                     const TensorView& w_scales)
    : m(a.shape[0]),
      n(layout == GemmLayout::dgrad && a.dtype != DType::e4m3 ? w.shape[1] : w.shape[0]),
      k(a.shape[1]), kernel_(kernel), tile_(checked_tile(tile, kernel)),
      mainloop_(mainloop_for(layout, a, w, m, n, k, a_scales, w_scales)) {}

void FusedGemm::require_row_partials(const TensorView& partials, const char* name) const {
  require_partials(partials, m, ceil_div(n, tile_.n), kernel_, name);
}

void FusedGemm::require_col_partials(const TensorView& partials, const char* name) const {
  require_partials(partials, n, ceil_div(m, tile_.m), kernel_, name);
}

} // namespace coda::cpu
