// VM execution against hand-written baselines, side by side in one binary.
//
// Workloads (f32): triad y = x + 3*z (STREAM triad, the bandwidth reference); tanh_affine y =
// tanh(x*0.5 + 0.25); chain10 (10 elementwise ops); bias_gelu y = gelu_erf(x + b[col]); softmax
// over the last axis; layernorm over the last axis (row-wise workloads use rows of kCols elements).
// Sizes are total elements.
//
// Variants, all reporting the same nominal bytes (x read + y written; triad also z) so bytes/s
// ratios are time ratios:
//   dvm_st / dvm_mt     CompiledKernel::run, cache hit, 1 thread / kThreads threads
//   fused_st / fused_mt one hand-fused loop, -O3 -march=native, Highway vectors and the same
//                       class of polynomial math as the VM; mt splits the range over
//                       kThreads std::threads (a persistent pool, the caller included) when
//                       the launch has >= kGrain elements, the VM's own rule
//   eager_st / eager_mt op by op: one full pass over memory per meta-op, like an eager
//                       framework, with the same vector code per op
// kThreads = DVM_NUM_THREADS if set, else std::thread::hardware_concurrency(); reported as
// the `threads` counter. dvm variants also report `max_err` against the fused baseline.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_pool.h"
#include "dvm/kernel.h"
#include "dvm/runtime.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

namespace {

namespace hn = hwy::HWY_NAMESPACE;
using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;

constexpr int64_t kCols = 1024;
constexpr float kEps = 1e-5f;
using dvm_bench::kGrain;
using dvm_bench::Pool;
using dvm_bench::split;

const int kThreads = dvm_bench::bench_threads();

// ---------------------------------------------------------------------------------------------
// Vector math, same approximation class as the VM (Highway contrib/math polynomials).

inline V v_tanh(D d, V x) {
  return hn::Tanh(d, x);
}
inline V v_sigmoid(D d, V x) {
  const V one = hn::Set(d, 1.0f);
  return hn::Div(one, hn::Add(one, hn::Exp(d, hn::Neg(x))));
}
// erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7).
inline V v_erf(D d, V x) {
  const V ax = hn::Abs(x);
  const V t = hn::Div(hn::Set(d, 1.0f), hn::MulAdd(hn::Set(d, 0.3275911f), ax, hn::Set(d, 1.0f)));
  V p = hn::Set(d, 1.061405429f);
  p = hn::MulAdd(p, t, hn::Set(d, -1.453152027f));
  p = hn::MulAdd(p, t, hn::Set(d, 1.421413741f));
  p = hn::MulAdd(p, t, hn::Set(d, -0.284496736f));
  p = hn::MulAdd(p, t, hn::Set(d, 0.254829592f));
  p = hn::Mul(p, t);
  const V e = hn::Exp(d, hn::Neg(hn::Mul(ax, ax)));
  const V r = hn::NegMulAdd(p, e, hn::Set(d, 1.0f));
  return hn::CopySign(r, x);
}
inline V v_gelu(D d, V x) {
  const V half_x = hn::Mul(hn::Set(d, 0.5f), x);
  return hn::MulAdd(half_x, v_erf(d, hn::Mul(x, hn::Set(d, 0.70710678118654752f))), half_x);
}
inline V v_chain10(D d, V x) {
  V t = hn::Mul(x, hn::Set(d, 0.5f));   // 1 mul
  t = hn::Add(t, hn::Set(d, 0.25f));    // 2 add
  t = v_tanh(d, t);                     // 3 tanh
  t = hn::Mul(t, x);                    // 4 mul
  t = hn::Sub(t, hn::Set(d, 0.1f));     // 5 sub
  t = v_sigmoid(d, t);                  // 6 sigmoid
  t = hn::Mul(t, t);                    // 7 mul
  t = hn::Add(t, x);                    // 8 add
  t = hn::Max(t, hn::Zero(d));          // 9 maximum
  return hn::Mul(t, hn::Set(d, 1.5f));  // 10 mul
}

// y[i] = f(x[i]) over [begin, end); the tail goes through a padded lane buffer.
template <class F>
void map1(const float* x, float* y, int64_t begin, int64_t end, F f) {
  const D d;
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = begin;
  for (; i + n <= end; i += n) hn::StoreU(f(d, hn::LoadU(d, x + i)), d, y + i);
  if (i < end) {
    HWY_ALIGN float buf[HWY_MAX_BYTES / sizeof(float)] = {};
    std::copy(x + i, x + end, buf);
    hn::Store(f(d, hn::Load(d, buf)), d, buf);
    std::copy(buf, buf + (end - i), y + i);
  }
}

// y[i] = f(a[i], b[i]) over [begin, end).
template <class F>
void map2(const float* a, const float* b, float* y, int64_t begin, int64_t end, F f) {
  const D d;
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = begin;
  for (; i + n <= end; i += n) hn::StoreU(f(d, hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, y + i);
  for (; i < end; ++i) {
    HWY_ALIGN float ba[HWY_MAX_BYTES / sizeof(float)] = {a[i]};
    HWY_ALIGN float bb[HWY_MAX_BYTES / sizeof(float)] = {b[i]};
    hn::Store(f(d, hn::Load(d, ba), hn::Load(d, bb)), d, ba);
    y[i] = ba[0];
  }
}

// Rows [r0, r1) of an [rows, kCols] matrix: y[r, c] = f(x[r, c], row[r], col[c]); row/col may
// be null (then 0). kCols is a multiple of every lane count.
template <class F>
void map_rows(const float* x, const float* row, const float* col, float* y, int64_t r0, int64_t r1,
              F f) {
  const D d;
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = r0; r < r1; ++r) {
    const V rv = hn::Set(d, row ? row[r] : 0.0f);
    for (int64_t c = 0; c < kCols; c += n) {
      const V cv = col ? hn::LoadU(d, col + c) : hn::Zero(d);
      hn::StoreU(f(d, hn::LoadU(d, x + r * kCols + c), rv, cv), d, y + r * kCols + c);
    }
  }
}

inline float row_sum(const float* x) {
  const D d;
  V acc = hn::Zero(d);
  for (int64_t c = 0; c < kCols; c += hn::Lanes(d)) acc = hn::Add(acc, hn::LoadU(d, x + c));
  return hn::GetLane(hn::SumOfLanes(d, acc));
}
inline float row_max(const float* x) {
  const D d;
  V acc = hn::Set(d, -INFINITY);
  for (int64_t c = 0; c < kCols; c += hn::Lanes(d)) acc = hn::Max(acc, hn::LoadU(d, x + c));
  return hn::GetLane(hn::MaxOfLanes(d, acc));
}

// ---------------------------------------------------------------------------------------------
// Buffers and workloads.

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
using Buf = std::unique_ptr<float[], AlignedFree>;

Buf alloc(int64_t n) {
  size_t bytes = (static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float) + 63) / 64 * 64;
  return Buf(static_cast<float*>(std::aligned_alloc(64, bytes)));
}

void fill(float* p, int64_t n, uint32_t seed, float lo, float hi) {
  uint32_t s = seed * 2654435761u + 1;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    p[i] = lo + (hi - lo) * static_cast<float>(s >> 8) * (1.0f / 16777216.0f);
  }
}

struct Data {
  int64_t n, rows;
  Buf x, y, t1, t2, bias, gamma, beta, r1, r2;
  explicit Data(int64_t elems)
      : n(elems),
        rows(elems / kCols),
        x(alloc(elems)),
        y(alloc(elems)),
        bias(alloc(kCols)),
        gamma(alloc(kCols)),
        beta(alloc(kCols)),
        r1(alloc(elems / kCols)),
        r2(alloc(elems / kCols)) {
    fill(x.get(), n, 1, -3.0f, 3.0f);
    fill(bias.get(), kCols, 2, -1.0f, 1.0f);
    fill(gamma.get(), kCols, 3, 0.5f, 1.5f);
    fill(beta.get(), kCols, 4, -0.5f, 0.5f);
    std::fill(y.get(), y.get() + n, 0.0f);
  }
  // Intermediates for the eager variants, allocated (and touched) on first use.
  float* tmp1() { return ensure(t1); }
  float* tmp2() { return ensure(t2); }
  // Second full-size input (triad), allocated and filled on first use.
  float* z() {
    if (!zb) {
      zb = alloc(n);
      fill(zb.get(), n, 5, -1.0f, 1.0f);
    }
    return zb.get();
  }
  Buf zb;

 private:
  float* ensure(Buf& b) {
    if (!b) {
      b = alloc(n);
      std::fill(b.get(), b.get() + n, 0.0f);
    }
    return b.get();
  }
};

struct Workload {
  const char* name;
  bool rowwise;  // [n / kCols, kCols] instead of [n]
  std::function<dvm::StatusOr<dvm::Kernel>()> build;
  // Fused loop over items [begin, end) (elements, or rows when rowwise).
  std::function<void(Data&, int64_t, int64_t)> fused;
  // Op by op over the whole tensor, every pass split over the pool.
  std::function<void(Data&, Pool&)> eager;
  int streams = 2;  // full-size arrays read + written (the nominal bytes are streams * n * 4)
};

// One eager pass: fn(begin, end) over n items split across the pool.
// `elems` (the elements the pass touches) decides whether it is worth waking the workers.
void pass(Pool& pool, int64_t n, int64_t elems, const std::function<void(int64_t, int64_t)>& fn) {
  pool.run(elems, [&](int p, int parts) { fn(split(n, p, parts), split(n, p + 1, parts)); });
}

template <class F>
void eager_unary(Pool& pool, const float* x, float* y, int64_t n, F f) {
  pass(pool, n, n, [&](int64_t b, int64_t e) { map1(x, y, b, e, f); });
}
template <class F>
void eager_binary(Pool& pool, const float* a, const float* b, float* y, int64_t n, F f) {
  pass(pool, n, n, [&](int64_t lo, int64_t hi) { map2(a, b, y, lo, hi, f); });
}
template <class F>
void eager_rows(Pool& pool, const float* x, const float* row, const float* col, float* y,
                int64_t rows, F f) {
  pass(pool, rows, rows * kCols, [&](int64_t b, int64_t e) { map_rows(x, row, col, y, b, e, f); });
}

// --- tanh_affine -----------------------------------------------------------------------------

dvm::StatusOr<dvm::Kernel> build_tanh_affine() {
  dvm::KernelBuilder kb("tanh_affine");
  dvm::Value x = kb.load("x", dvm::DType::kF32, {kb.symbol("N")});
  dvm::Value t = kb.binary(dvm::BinaryOp::kAdd, kb.binary(dvm::BinaryOp::kMul, x, 0.5), 0.25);
  kb.store("y", kb.unary(dvm::UnaryOp::kTanh, t));
  return kb.build();
}
void fused_tanh_affine(Data& m, int64_t b, int64_t e) {
  map1(m.x.get(), m.y.get(), b, e,
       [](D d, V x) { return v_tanh(d, hn::MulAdd(x, hn::Set(d, 0.5f), hn::Set(d, 0.25f))); });
}
void eager_tanh_affine(Data& m, Pool& pool) {
  float* t = m.tmp1();
  eager_unary(pool, m.x.get(), t, m.n, [](D d, V x) { return hn::Mul(x, hn::Set(d, 0.5f)); });
  eager_unary(pool, t, t, m.n, [](D d, V x) { return hn::Add(x, hn::Set(d, 0.25f)); });
  eager_unary(pool, t, m.y.get(), m.n, [](D d, V x) { return v_tanh(d, x); });
}

// --- chain10 ---------------------------------------------------------------------------------

dvm::StatusOr<dvm::Kernel> build_chain10() {
  using dvm::BinaryOp;
  dvm::KernelBuilder kb("chain10");
  dvm::Value x = kb.load("x", dvm::DType::kF32, {kb.symbol("N")});
  dvm::Value t = kb.binary(BinaryOp::kMul, x, 0.5);
  t = kb.binary(BinaryOp::kAdd, t, 0.25);
  t = kb.unary(dvm::UnaryOp::kTanh, t);
  t = kb.mul(t, x);
  t = kb.binary(BinaryOp::kSub, t, 0.1);
  t = kb.unary(dvm::UnaryOp::kSigmoid, t);
  t = kb.mul(t, t);
  t = kb.add(t, x);
  t = kb.binary(BinaryOp::kMaximum, t, 0.0);
  kb.store("y", kb.binary(BinaryOp::kMul, t, 1.5));
  return kb.build();
}
void fused_chain10(Data& m, int64_t b, int64_t e) {
  map1(m.x.get(), m.y.get(), b, e, v_chain10);
}
void eager_chain10(Data& m, Pool& pool) {
  const int64_t n = m.n;
  float* x = m.x.get();
  float* a = m.tmp1();
  float* c = m.tmp2();
  float* y = m.y.get();
  eager_unary(pool, x, a, n, [](D d, V v) { return hn::Mul(v, hn::Set(d, 0.5f)); });
  eager_unary(pool, a, c, n, [](D d, V v) { return hn::Add(v, hn::Set(d, 0.25f)); });
  eager_unary(pool, c, a, n, [](D d, V v) { return v_tanh(d, v); });
  eager_binary(pool, a, x, c, n, [](D, V u, V v) { return hn::Mul(u, v); });
  eager_unary(pool, c, a, n, [](D d, V v) { return hn::Sub(v, hn::Set(d, 0.1f)); });
  eager_unary(pool, a, c, n, [](D d, V v) { return v_sigmoid(d, v); });
  eager_binary(pool, c, c, a, n, [](D, V u, V v) { return hn::Mul(u, v); });
  eager_binary(pool, a, x, c, n, [](D, V u, V v) { return hn::Add(u, v); });
  eager_unary(pool, c, a, n, [](D d, V v) { return hn::Max(v, hn::Zero(d)); });
  eager_unary(pool, a, y, n, [](D d, V v) { return hn::Mul(v, hn::Set(d, 1.5f)); });
}

// --- bias_gelu -------------------------------------------------------------------------------

dvm::StatusOr<dvm::Kernel> build_bias_gelu() {
  dvm::KernelBuilder kb("bias_gelu");
  dvm::Value x = kb.load("x", dvm::DType::kF32, {kb.symbol("R"), kCols});
  dvm::Value b = kb.load("b", dvm::DType::kF32, {kCols});
  kb.store("y", kb.unary(dvm::UnaryOp::kGeluErf, kb.add(x, b)));
  return kb.build();
}
void fused_bias_gelu(Data& m, int64_t r0, int64_t r1) {
  map_rows(m.x.get(), nullptr, m.bias.get(), m.y.get(), r0, r1,
           [](D d, V x, V, V b) { return v_gelu(d, hn::Add(x, b)); });
}
void eager_bias_gelu(Data& m, Pool& pool) {
  float* t = m.tmp1();
  eager_rows(pool, m.x.get(), nullptr, m.bias.get(), t, m.rows,
             [](D, V x, V, V b) { return hn::Add(x, b); });
  eager_unary(pool, t, m.y.get(), m.n, [](D d, V v) { return v_gelu(d, v); });
}

// --- softmax ---------------------------------------------------------------------------------

dvm::StatusOr<dvm::Kernel> build_softmax() {
  dvm::KernelBuilder kb("softmax");
  dvm::Value x = kb.load("x", dvm::DType::kF32, {kb.symbol("R"), kCols});
  dvm::Value e = kb.unary(dvm::UnaryOp::kExp, kb.sub(x, kb.max(x, {-1}, true)));
  kb.store("y", kb.div(e, kb.sum(e, {-1}, true)));
  return kb.build();
}
void fused_softmax(Data& m, int64_t r0, int64_t r1) {
  const D d;
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = m.x.get() + r * kCols;
    float* y = m.y.get() + r * kCols;
    const V mx = hn::Set(d, row_max(x));
    V acc = hn::Zero(d);
    for (int64_t c = 0; c < kCols; c += n) {
      const V e = hn::Exp(d, hn::Sub(hn::LoadU(d, x + c), mx));
      acc = hn::Add(acc, e);
      hn::StoreU(e, d, y + c);
    }
    const V inv = hn::Div(hn::Set(d, 1.0f), hn::SumOfLanes(d, acc));
    for (int64_t c = 0; c < kCols; c += n) hn::StoreU(hn::Mul(hn::LoadU(d, y + c), inv), d, y + c);
  }
}
void eager_softmax(Data& m, Pool& pool) {
  float* x = m.x.get();
  float* t = m.tmp1();
  float* y = m.y.get();
  float* mx = m.r1.get();
  float* sm = m.r2.get();
  pass(pool, m.rows, m.n, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) mx[r] = row_max(x + r * kCols);
  });
  eager_rows(pool, x, mx, nullptr, t, m.rows, [](D, V v, V rv, V) { return hn::Sub(v, rv); });
  eager_unary(pool, t, t, m.n, [](D d, V v) { return hn::Exp(d, v); });
  pass(pool, m.rows, m.n, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) sm[r] = row_sum(t + r * kCols);
  });
  eager_rows(pool, t, sm, nullptr, y, m.rows, [](D, V v, V rv, V) { return hn::Div(v, rv); });
}

// --- layernorm -------------------------------------------------------------------------------

dvm::StatusOr<dvm::Kernel> build_layernorm() {
  dvm::KernelBuilder kb("layernorm");
  dvm::Value x = kb.load("x", dvm::DType::kF32, {kb.symbol("R"), kCols});
  dvm::Value g = kb.load("gamma", dvm::DType::kF32, {kCols});
  dvm::Value b = kb.load("beta", dvm::DType::kF32, {kCols});
  dvm::Value xc = kb.sub(x, kb.mean(x, {-1}, true));
  dvm::Value var = kb.mean(kb.mul(xc, xc), {-1}, true);
  dvm::Value rstd =
      kb.unary(dvm::UnaryOp::kRsqrt, kb.binary(dvm::BinaryOp::kAdd, var, double{kEps}));
  kb.store("y", kb.add(kb.mul(kb.mul(xc, rstd), g), b));
  return kb.build();
}
void fused_layernorm(Data& m, int64_t r0, int64_t r1) {
  const D d;
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  const float* g = m.gamma.get();
  const float* bt = m.beta.get();
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = m.x.get() + r * kCols;
    float* y = m.y.get() + r * kCols;
    const V mean = hn::Set(d, row_sum(x) * (1.0f / kCols));
    V acc = hn::Zero(d);
    for (int64_t c = 0; c < kCols; c += n) {
      const V xc = hn::Sub(hn::LoadU(d, x + c), mean);
      acc = hn::MulAdd(xc, xc, acc);
    }
    const float var = hn::GetLane(hn::SumOfLanes(d, acc)) * (1.0f / kCols);
    const V rstd = hn::Set(d, 1.0f / std::sqrt(var + kEps));
    for (int64_t c = 0; c < kCols; c += n) {
      const V xn = hn::Mul(hn::Sub(hn::LoadU(d, x + c), mean), rstd);
      hn::StoreU(hn::MulAdd(xn, hn::LoadU(d, g + c), hn::LoadU(d, bt + c)), d, y + c);
    }
  }
}
void eager_layernorm(Data& m, Pool& pool) {
  float* x = m.x.get();
  float* xc = m.tmp1();
  float* t = m.tmp2();
  float* y = m.y.get();
  float* mean = m.r1.get();
  float* rstd = m.r2.get();
  const int64_t rows = m.rows;
  pass(pool, rows, m.n, [&](int64_t b, int64_t e) {  // mean
    for (int64_t r = b; r < e; ++r) mean[r] = row_sum(x + r * kCols) * (1.0f / kCols);
  });
  eager_rows(pool, x, mean, nullptr, xc, rows, [](D, V v, V rv, V) { return hn::Sub(v, rv); });
  eager_binary(pool, xc, xc, t, m.n, [](D, V u, V v) { return hn::Mul(u, v); });
  pass(pool, rows, m.n, [&](int64_t b, int64_t e) {  // var, + eps, rsqrt (tiny [rows] ops)
    for (int64_t r = b; r < e; ++r) {
      rstd[r] = 1.0f / std::sqrt(row_sum(t + r * kCols) * (1.0f / kCols) + kEps);
    }
  });
  eager_rows(pool, xc, rstd, nullptr, t, rows, [](D, V v, V rv, V) { return hn::Mul(v, rv); });
  eager_rows(pool, t, nullptr, m.gamma.get(), t, rows,
             [](D, V v, V, V g) { return hn::Mul(v, g); });
  eager_rows(pool, t, nullptr, m.beta.get(), y, rows, [](D, V v, V, V b) { return hn::Add(v, b); });
}

// --- triad (STREAM) --------------------------------------------------------------------------

dvm::StatusOr<dvm::Kernel> build_triad() {
  dvm::KernelBuilder kb("triad");
  dvm::Dim n = kb.symbol("N");
  dvm::Value x = kb.load("x", dvm::DType::kF32, {n});
  dvm::Value z = kb.load("z", dvm::DType::kF32, {n});
  kb.store("y", kb.add(x, kb.binary(dvm::BinaryOp::kMul, z, 3.0)));
  return kb.build();
}
void fused_triad(Data& m, int64_t b, int64_t e) {
  map2(m.x.get(), m.z(), m.y.get(), b, e,
       [](D d, V x, V z) { return hn::MulAdd(z, hn::Set(d, 3.0f), x); });
}
void eager_triad(Data& m, Pool& pool) {
  float* t = m.tmp1();
  eager_unary(pool, m.z(), t, m.n, [](D d, V v) { return hn::Mul(v, hn::Set(d, 3.0f)); });
  eager_binary(pool, m.x.get(), t, m.y.get(), m.n, [](D, V u, V v) { return hn::Add(u, v); });
}

const Workload kWorkloads[] = {
    {"triad", false, build_triad, fused_triad, eager_triad, 3},
    {"tanh_affine", false, build_tanh_affine, fused_tanh_affine, eager_tanh_affine},
    {"chain10", false, build_chain10, fused_chain10, eager_chain10},
    {"bias_gelu", true, build_bias_gelu, fused_bias_gelu, eager_bias_gelu},
    {"softmax", true, build_softmax, fused_softmax, eager_softmax},
    {"layernorm", true, build_layernorm, fused_layernorm, eager_layernorm},
};

// ---------------------------------------------------------------------------------------------
// Benchmark bodies.

int64_t items(const Workload& w, const Data& m) {
  return w.rowwise ? m.rows : m.n;
}

void report(benchmark::State& st, const Data& m, int threads, int streams) {
  st.SetBytesProcessed(st.iterations() * streams * m.n * static_cast<int64_t>(sizeof(float)));
  st.SetItemsProcessed(st.iterations() * m.n);
  st.counters["threads"] = threads;
}

void bm_fused(benchmark::State& st, const Workload& w, int threads) {
  Data m(st.range(0));
  Pool pool(threads);
  const int64_t n = items(w, m);
  const std::function<void(int, int)> job = [&](int p, int parts) {
    w.fused(m, split(n, p, parts), split(n, p + 1, parts));
  };
  pool.run(m.n, job);  // warm-up: first touch of every buffer happens outside the timing
  for (auto _ : st) {
    pool.run(m.n, job);
    benchmark::ClobberMemory();
  }
  report(st, m, threads, w.streams);
}

void bm_eager(benchmark::State& st, const Workload& w, int threads) {
  Data m(st.range(0));
  Pool pool(threads);
  w.eager(m, pool);  // warm-up: allocates and touches the intermediates
  for (auto _ : st) {
    w.eager(m, pool);
    benchmark::ClobberMemory();
  }
  report(st, m, threads, w.streams);
}

void bm_dvm(benchmark::State& st, const Workload& w, int threads) {
  Data m(st.range(0));
  auto kernel = w.build();
  if (!kernel.is_ok()) return st.SkipWithError(kernel.status().to_string().c_str());
  dvm::CompileOptions opts;
  opts.num_threads = threads;
  auto ck = dvm::CompiledKernel::create(*kernel, opts);
  if (!ck.is_ok()) return st.SkipWithError(ck.status().to_string().c_str());

  std::vector<int64_t> shape =
      w.rowwise ? std::vector<int64_t>{m.rows, kCols} : std::vector<int64_t>{m.n};
  std::vector<dvm::TensorArg> in = {dvm::TensorArg::contiguous(m.x.get(), dvm::DType::kF32, shape)};
  if (std::string(w.name) == "bias_gelu") {
    in.push_back(dvm::TensorArg::contiguous(m.bias.get(), dvm::DType::kF32, {kCols}));
  } else if (std::string(w.name) == "triad") {
    in.push_back(dvm::TensorArg::contiguous(m.z(), dvm::DType::kF32, shape));
  } else if (std::string(w.name) == "layernorm") {
    in.push_back(dvm::TensorArg::contiguous(m.gamma.get(), dvm::DType::kF32, {kCols}));
    in.push_back(dvm::TensorArg::contiguous(m.beta.get(), dvm::DType::kF32, {kCols}));
  }
  const dvm::TensorArg out[] = {dvm::TensorArg::contiguous(m.y.get(), dvm::DType::kF32, shape)};

  // Correctness guard: a fast wrong answer must not look like a win.
  w.fused(m, 0, items(w, m));
  std::vector<float> want(m.y.get(), m.y.get() + m.n);
  std::fill(m.y.get(), m.y.get() + m.n, 0.0f);
  dvm::Status s = (*ck)->run(in, out);
  if (!s.is_ok()) return st.SkipWithError(s.to_string().c_str());
  double err = 0;
  for (int64_t i = 0; i < m.n; ++i) {
    double e = std::fabs(static_cast<double>(m.y[i]) - want[i]);
    if (!(e <= err)) err = std::isnan(e) ? INFINITY : e;
  }

  for (auto _ : st) {
    dvm::Status r = (*ck)->run(in, out);
    if (!r.is_ok()) {
      st.SkipWithError(r.to_string().c_str());
      break;
    }
  }
  report(st, m, threads, w.streams);
  st.counters["max_err"] = err;
}

void register_all() {
  const int64_t sizes[] = {4096, 65536, int64_t{1} << 20, int64_t{1} << 24};
  using Fn = void (*)(benchmark::State&, const Workload&, int);
  struct Variant {
    const char* name;
    Fn fn;
    int threads;
  };
  const Variant variants[] = {
      {"dvm_st", bm_dvm, 1},     {"dvm_mt", bm_dvm, kThreads},
      {"fused_st", bm_fused, 1}, {"fused_mt", bm_fused, kThreads},
      {"eager_st", bm_eager, 1}, {"eager_mt", bm_eager, kThreads},
  };
  for (const Workload& w : kWorkloads) {
    for (const Variant& v : variants) {
      std::string name = std::string("vm/") + w.name + "/" + v.name;
      auto* b = benchmark::RegisterBenchmark(
          name.c_str(), [&w, v](benchmark::State& st) { v.fn(st, w, v.threads); });
      for (int64_t n : sizes) b->Arg(n);
      b->UseRealTime()->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("bench_threads", std::to_string(kThreads));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
