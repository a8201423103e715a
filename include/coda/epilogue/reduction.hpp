// The reductions of ReduceOverN / ReduceOverM: a state, its identity, how a value is added, how two
// partial states merge (quad shuffles on the device, partial blocks in the consumers) and the
// finished value. Host and device alike, templated on the compute type so fp64 can reuse them.
#pragma once

#include "coda/core/types.hpp"
#include "coda/epilogue/math.hpp"
#include "coda/epilogue/reduce_block.hpp"

namespace coda::epilogue {

template <class T> struct Sum {
  using State = T;
  CODA_HD static State identity() { return T(0); }
  CODA_HD static void add(State& s, T x) { s += x; }
  CODA_HD static State merge(State a, State b) { return a + b; }
  CODA_HD static T finish(State s) { return s; }
};

// The sum of squares of the values (RMSNorm statistics), squared in the compute type.
template <class T> struct SumOfSquares {
  using State = T;
  CODA_HD static State identity() { return T(0); }
  CODA_HD static void add(State& s, T x) { s += x * x; }
  CODA_HD static State merge(State a, State b) { return a + b; }
  CODA_HD static T finish(State s) { return s; }
};

// log(sum exp(x)) in one pass: the running maximum and the sum of exp(x - max), rescaled when
// the maximum grows, so no exp overflows. An empty state (max = -inf) finishes to -inf.
template <class T> struct LogSumExp {
  struct State {
    T max;
    T sum;
  };
  CODA_HD static State identity() { return {-math::infinity<T>(), T(0)}; }
  CODA_HD static void add(State& s, T x) {
    if (x == -math::infinity<T>()) return; // exp(-inf) adds nothing; also avoids -inf - -inf
    if (x > s.max) {
      s.sum = s.sum * math::exp(s.max - x) + T(1);
      s.max = x;
    } else {
      s.sum += math::exp(x - s.max); // NaN x lands here and propagates
    }
  }
  CODA_HD static State merge(State a, State b) {
    if (a.max == -math::infinity<T>()) return b;
    if (b.max == -math::infinity<T>()) return a;
    const T max = math::max(a.max, b.max);
    return {max, a.sum * math::exp(a.max - max) + b.sum * math::exp(b.max - max)};
  }
  CODA_HD static T finish(State s) { return s.max + math::log(s.sum); }
  // A finished partial as a state, to merge partials of several blocks.
  CODA_HD static State from_finished(T log_sum_exp) { return {log_sum_exp, T(1)}; }
};

} // namespace coda::epilogue
