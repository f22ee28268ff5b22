// The VM against the loop a performance engineer would write, over twenty workloads of the
// shapes real models produce: elementwise chains with transcendentals, inner and outer
// broadcasts, short rows (32, 64, 96 columns) and long ones, row reductions (softmax,
// log-softmax, layernorm, rmsnorm) from 64 to 16384 columns, column and middle-axis
// reductions, a 2-D transpose and a [B,S,H,D] -> [B,H,S,D] permute feeding math, rotary
// embedding (slices + concat + broadcast), f16 and bf16 loads and stores.
//
// Baseline (`fused`): one plain C++ loop per workload, compiled -O3 -march=native -ffast-math
// (so transcendentals vectorise through glibc's libmvec), split over the same number of
// threads by a persistent pool (launches under 32K elements run on the caller, the VM's
// rule). `dvm`: CompiledKernel::run, cache hit. Both report the nominal bytes read + written,
// so bytes/s ratios are time ratios; variants _st (1 thread) and _mt (DVM_NUM_THREADS or all
// cores). dvm also reports `max_rel_err` against the baseline (a fast wrong answer must not
// look like a win). Sizes are total elements of the main input.
#include <benchmark/benchmark.h>
#ifdef __AVX__
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <regex>
#include <string>
#include <vector>

#include "bench_pool.h"
#include "dvm/kernel.h"
#include "dvm/runtime.h"
#include "encoder/stage.h"
#include "ops/scalar_ops.h"
#include "vm/interpreter.h"

namespace {

using dvm::BinaryOp;
using dvm::DType;
using dvm::KernelBuilder;
using dvm::UnaryOp;
using dvm::Value;
using dvm_bench::Pool;
using dvm_bench::split;

const int kThreads = dvm_bench::bench_threads();

// ---- half-precision storage: bf16 by the spec's conversions, f16 by the compiler's _Float16 --

inline uint16_t to_bf16(float f) {
  return dvm::ops::f32_to_bf16_bits(f);
}
inline float from_bf16(uint16_t h) {
  return dvm::ops::bf16_bits_to_f32(h);
}
inline uint16_t to_f16(float f) {
  return static_cast<uint16_t>(std::bit_cast<uint16_t>(static_cast<_Float16>(f)));
}
inline float from_f16(uint16_t h) {
  return static_cast<float>(std::bit_cast<_Float16>(h));
}

// ---- tensors -------------------------------------------------------------------------------

// 64-byte aligned storage, as PyTorch's CPU allocator gives (a std::vector's 16-byte aligned
// buffer would make every 64-byte vector load straddle two cache lines, on both sides).
template <typename T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <typename U>
  Aligned64(const Aligned64<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* p, size_t) { ::operator delete (p, std::align_val_t{64}); }
  bool operator==(const Aligned64&) const = default;
};

struct Tensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<char, Aligned64<char>> bytes;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  float* f() { return reinterpret_cast<float*>(bytes.data()); }
  uint16_t* h() { return reinterpret_cast<uint16_t*>(bytes.data()); }
  float at(int64_t i) const {
    if (dtype == DType::kF32) return reinterpret_cast<const float*>(bytes.data())[i];
    uint16_t v = reinterpret_cast<const uint16_t*>(bytes.data())[i];
    return dtype == DType::kF16 ? from_f16(v) : from_bf16(v);
  }
  dvm::TensorArg arg() { return dvm::TensorArg::contiguous(bytes.data(), dtype, shape); }
};

Tensor make(DType t, std::vector<int64_t> shape, uint32_t seed, float lo, float hi) {
  Tensor x;
  x.dtype = t;
  x.shape = std::move(shape);
  x.bytes.assign(static_cast<size_t>(std::max<int64_t>(x.numel(), 1)) * dvm::dtype_size(t), 0);
  uint32_t s = seed * 2654435761u + 1;
  for (int64_t i = 0; i < x.numel(); ++i) {
    s = s * 1664525u + 1013904223u;
    float v = lo + (hi - lo) * static_cast<float>(s >> 8) * (1.0f / 16777216.0f);
    if (t == DType::kF32) x.f()[i] = v;
    if (t == DType::kF16) x.h()[i] = to_f16(v);
    if (t == DType::kBF16) x.h()[i] = to_bf16(v);
  }
  return x;
}

// ---- workloads -----------------------------------------------------------------------------

// One workload at one size: its tensors, its DVM kernel, and its hand-written loop over the
// items [i0, i1) (rows of the output's outer dims, or elements).
struct Instance {
  std::vector<Tensor> in, out;
  std::function<dvm::StatusOr<dvm::Kernel>()> build;
  std::function<void(Instance&, int64_t, int64_t)> fused;
  int64_t items = 0;
  int64_t bytes = 0;  // nominal bytes read + written per call
};

struct Workload {
  std::string name;
  std::function<Instance(int64_t n)> make;  // n: elements of the main input
};

constexpr float kEps = 1e-5f;

int64_t nbytes(const std::vector<Tensor>& ts) {
  int64_t b = 0;
  for (const Tensor& t : ts) b += t.numel() * dvm::dtype_size(t.dtype);
  return b;
}

Instance finish(Instance w) {
  w.bytes = nbytes(w.in) + nbytes(w.out);
  return w;
}

float silu(float x) {
  return x / (1.0f + std::exp(-x));
}
float gelu_tanh(float x) {
  float y = 0.7978845608f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(y));
}
float gelu_erf(float x) {
  return 0.5f * x * (1.0f + std::erf(x * 0.70710678f));
}

// y = silu(a) * b (a gated activation).
Instance silu_mul(int64_t n) {
  Instance w;
  w.in = {make(DType::kF32, {n}, 1, -4, 4), make(DType::kF32, {n}, 2, -1, 1)};
  w.out = {make(DType::kF32, {n}, 0, 0, 0)};
  w.items = n;
  w.build = [] {
    KernelBuilder kb("silu_mul");
    dvm::Dim N = kb.symbol("N");
    // Loads in argument order, one statement each (argument evaluation order is unspecified).
    Value a = kb.load("a", DType::kF32, {N});
    Value b = kb.load("b", DType::kF32, {N});
    kb.store("y", kb.mul(kb.unary(UnaryOp::kSilu, a), b));
    return kb.build();
  };
  w.fused = [](Instance& m, int64_t i0, int64_t i1) {
    const float *a = m.in[0].f(), *b = m.in[1].f();
    float* y = m.out[0].f();
    for (int64_t i = i0; i < i1; ++i) y[i] = silu(a[i]) * b[i];
  };
  return finish(std::move(w));
}

// y = act(x + b[c]) * s[r] on rows of `cols` (inner and outer broadcast, short rows).
Instance row_col_bcast(int64_t n, int64_t cols, bool gelu) {
  int64_t rows = std::max<int64_t>(1, n / cols);
  Instance w;
  w.in = {make(DType::kF32, {rows, cols}, 3, -3, 3), make(DType::kF32, {cols}, 4, -1, 1),
          make(DType::kF32, {rows, 1}, 5, 0.5, 1.5)};
  w.out = {make(DType::kF32, {rows, cols}, 0, 0, 0)};
  w.items = rows;
  w.build = [cols, gelu] {
    KernelBuilder kb("row_col_bcast");
    dvm::Dim R = kb.symbol("R");
    Value x = kb.load("x", DType::kF32, {R, cols});
    Value b = kb.load("b", DType::kF32, {cols});
    Value s = kb.load("s", DType::kF32, {R, 1});
    x = kb.add(x, b);
    x = gelu ? kb.unary(UnaryOp::kGeluTanh, x) : kb.unary(UnaryOp::kRelu, x);
    kb.store("y", kb.mul(x, s));
    return kb.build();
  };
  w.fused = [cols, gelu](Instance& m, int64_t r0, int64_t r1) {
    const float *x = m.in[0].f(), *b = m.in[1].f(), *s = m.in[2].f();
    float* y = m.out[0].f();
    for (int64_t r = r0; r < r1; ++r) {
      const float sr = s[r];
      for (int64_t c = 0; c < cols; ++c) {
        float v = x[r * cols + c] + b[c];
        v = gelu ? gelu_tanh(v) : std::max(v, 0.0f);
        y[r * cols + c] = v * sr;
      }
    }
  };
  return finish(std::move(w));
}

// Row-wise normalisations over rows of `cols`: rmsnorm, softmax (scaled), log-softmax, and
// layernorm of x + residual.
enum class Norm { kRms, kSoftmax, kLogSoftmax, kAddLayerNorm };

Instance norm(int64_t n, int64_t cols, Norm kind) {
  int64_t rows = std::max<int64_t>(1, n / cols);
  Instance w;
  w.in = {make(DType::kF32, {rows, cols}, 6, -3, 3), make(DType::kF32, {cols}, 7, 0.5, 1.5)};
  if (kind == Norm::kAddLayerNorm) w.in.push_back(make(DType::kF32, {rows, cols}, 8, -1, 1));
  w.out = {make(DType::kF32, {rows, cols}, 0, 0, 0)};
  w.items = rows;
  w.build = [cols, kind] {
    KernelBuilder kb("norm");
    dvm::Dim R = kb.symbol("R");
    Value x = kb.load("x", DType::kF32, {R, cols});
    Value g = kb.load("g", DType::kF32, {cols});
    Value res = kind == Norm::kAddLayerNorm ? kb.load("res", DType::kF32, {R, cols}) : Value{};
    Value y;
    switch (kind) {
      case Norm::kRms: {
        Value ms = kb.mean(kb.mul(x, x), {-1}, true);
        y = kb.mul(kb.mul(x, kb.unary(UnaryOp::kRsqrt, kb.binary(BinaryOp::kAdd, ms, kEps))), g);
        break;
      }
      case Norm::kSoftmax: {
        Value s = kb.binary(BinaryOp::kMul, x, 0.125);
        Value e = kb.unary(UnaryOp::kExp, kb.sub(s, kb.max(s, {-1}, true)));
        y = kb.div(e, kb.sum(e, {-1}, true));
        break;
      }
      case Norm::kLogSoftmax: {
        Value c = kb.sub(x, kb.max(x, {-1}, true));
        y = kb.sub(c, kb.unary(UnaryOp::kLog, kb.sum(kb.unary(UnaryOp::kExp, c), {-1}, true)));
        break;
      }
      case Norm::kAddLayerNorm: {
        Value h = kb.add(x, res);
        Value hc = kb.sub(h, kb.mean(h, {-1}, true));
        Value var = kb.mean(kb.mul(hc, hc), {-1}, true);
        y = kb.mul(kb.mul(hc, kb.unary(UnaryOp::kRsqrt, kb.binary(BinaryOp::kAdd, var, kEps))), g);
        break;
      }
    }
    kb.store("y", y);
    return kb.build();
  };
  w.fused = [cols, kind](Instance& m, int64_t r0, int64_t r1) {
    const float* g = m.in[1].f();
    float* out = m.out[0].f();
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = m.in[0].f() + r * cols;
      float* y = out + r * cols;
      switch (kind) {
        case Norm::kRms: {
          float ss = 0;
          for (int64_t c = 0; c < cols; ++c) ss += x[c] * x[c];
          float inv = 1.0f / std::sqrt(ss / static_cast<float>(cols) + kEps);
          for (int64_t c = 0; c < cols; ++c) y[c] = x[c] * inv * g[c];
          break;
        }
        case Norm::kSoftmax: {
          float mx = -INFINITY;
          for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, x[c] * 0.125f);
          float sum = 0;
          for (int64_t c = 0; c < cols; ++c) {
            y[c] = std::exp(x[c] * 0.125f - mx);
            sum += y[c];
          }
          float inv = 1.0f / sum;
          for (int64_t c = 0; c < cols; ++c) y[c] *= inv;
          break;
        }
        case Norm::kLogSoftmax: {
          float mx = -INFINITY;
          for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, x[c]);
          float sum = 0;
          for (int64_t c = 0; c < cols; ++c) sum += std::exp(x[c] - mx);
          float lse = std::log(sum);
          for (int64_t c = 0; c < cols; ++c) y[c] = x[c] - mx - lse;
          break;
        }
        case Norm::kAddLayerNorm: {
          const float* res = m.in[2].f() + r * cols;
          float sum = 0;
          for (int64_t c = 0; c < cols; ++c) {
            y[c] = x[c] + res[c];
            sum += y[c];
          }
          float mean = sum / static_cast<float>(cols), var = 0;
          for (int64_t c = 0; c < cols; ++c) var += (y[c] - mean) * (y[c] - mean);
          float inv = 1.0f / std::sqrt(var / static_cast<float>(cols) + kEps);
          for (int64_t c = 0; c < cols; ++c) y[c] = (y[c] - mean) * inv * g[c];
          break;
        }
      }
    }
  };
  return finish(std::move(w));
}

// Column sum: [R, 1024] -> [1024]; middle-axis sum: [64, M, 64] -> [64, 64].
Instance col_sum(int64_t n) {
  const int64_t cols = 1024, rows = std::max<int64_t>(1, n / cols);
  Instance w;
  w.in = {make(DType::kF32, {rows, cols}, 9, -1, 1)};
  w.out = {make(DType::kF32, {cols}, 0, 0, 0)};
  w.items = cols;
  w.build = [cols] {
    KernelBuilder kb("col_sum");
    kb.store("y", kb.sum(kb.load("x", DType::kF32, {kb.symbol("R"), cols}), {0}));
    return kb.build();
  };
  w.fused = [rows, cols](Instance& m, int64_t c0, int64_t c1) {
    const float* x = m.in[0].f();
    float* y = m.out[0].f();
    for (int64_t c = c0; c < c1; ++c) y[c] = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = c0; c < c1; ++c) y[c] += x[r * cols + c];
  };
  return finish(std::move(w));
}

Instance mid_sum(int64_t n) {
  const int64_t a = 64, c = 64, mid = std::max<int64_t>(1, n / (a * c));
  Instance w;
  w.in = {make(DType::kF32, {a, mid, c}, 10, -1, 1)};
  w.out = {make(DType::kF32, {a, c}, 0, 0, 0)};
  w.items = a;
  w.build = [a, c] {
    KernelBuilder kb("mid_sum");
    kb.store("y", kb.sum(kb.load("x", DType::kF32, {a, kb.symbol("M"), c}), {1}));
    return kb.build();
  };
  w.fused = [mid, c](Instance& m, int64_t i0, int64_t i1) {
    const float* x = m.in[0].f();
    float* y = m.out[0].f();
    for (int64_t i = i0; i < i1; ++i) {
      for (int64_t k = 0; k < c; ++k) y[i * c + k] = 0;
      for (int64_t j = 0; j < mid; ++j)
        for (int64_t k = 0; k < c; ++k) y[i * c + k] += x[(i * mid + j) * c + k];
    }
  };
  return finish(std::move(w));
}

// y[r, c] = x[c, r] * 0.5 + z[r, c]: a transposed operand feeding math.
Instance transpose_add(int64_t n) {
  const int64_t cols = 1024, rows = std::max<int64_t>(1, n / cols);
  Instance w;
  w.in = {make(DType::kF32, {cols, rows}, 11, -1, 1), make(DType::kF32, {rows, cols}, 12, -1, 1)};
  w.out = {make(DType::kF32, {rows, cols}, 0, 0, 0)};
  w.items = rows;
  w.build = [cols] {
    KernelBuilder kb("transpose_add");
    dvm::Dim R = kb.symbol("R");
    Value xt = kb.transpose(kb.load("x", DType::kF32, {cols, R}), 0, 1);
    Value z = kb.load("z", DType::kF32, {R, cols});
    kb.store("y", kb.add(kb.binary(BinaryOp::kMul, xt, 0.5), z));
    return kb.build();
  };
  w.fused = [rows, cols](Instance& m, int64_t r0, int64_t r1) {
    const float *x = m.in[0].f(), *z = m.in[1].f();
    float* y = m.out[0].f();
    // Blocked so that both x's columns and y's rows stay in cache (as an engineer would).
    constexpr int64_t kB = 32;
    for (int64_t rb = r0; rb < r1; rb += kB)
      for (int64_t cb = 0; cb < cols; cb += kB)
        for (int64_t r = rb; r < std::min(rb + kB, r1); ++r)
          for (int64_t c = cb; c < std::min(cb + kB, cols); ++c)
            y[r * cols + c] = x[c * rows + r] * 0.5f + z[r * cols + c];
  };
  return finish(std::move(w));
}

// [B, S, H, D] -> [B, H, S, D], times a scale (attention's head split of q).
Instance permute_heads(int64_t n) {
  const int64_t h = 12, d = 64, s = std::max<int64_t>(1, n / (h * d));
  Instance w;
  w.in = {make(DType::kF32, {1, s, h, d}, 13, -1, 1)};
  w.out = {make(DType::kF32, {1, h, s, d}, 0, 0, 0)};
  w.items = h;
  w.build = [h, d] {
    KernelBuilder kb("permute_heads");
    Value x = kb.load("x", DType::kF32, {1, kb.symbol("S"), h, d});
    kb.store("y", kb.binary(BinaryOp::kMul, kb.permute(x, {0, 2, 1, 3}), 0.125));
    return kb.build();
  };
  w.fused = [s, h, d](Instance& m, int64_t h0, int64_t h1) {
    const float* x = m.in[0].f();
    float* y = m.out[0].f();
    for (int64_t hh = h0; hh < h1; ++hh)
      for (int64_t ss = 0; ss < s; ++ss)
        for (int64_t k = 0; k < d; ++k)
          y[(hh * s + ss) * d + k] = x[(ss * h + hh) * d + k] * 0.125f;
  };
  return finish(std::move(w));
}

// [B, H, S, D] -> [B, S, H, D] plus a residual (attention's head merge, before the output
// projection): the permute of permute_heads the other way, reading rows of one head.
Instance merge_heads(int64_t n) {
  const int64_t h = 12, d = 64, s = std::max<int64_t>(1, n / (h * d));
  Instance w;
  w.in = {make(DType::kF32, {1, h, s, d}, 17, -1, 1), make(DType::kF32, {1, s, h, d}, 18, -1, 1)};
  w.out = {make(DType::kF32, {1, s, h, d}, 0, 0, 0)};
  w.items = s;
  w.build = [h, d] {
    KernelBuilder kb("merge_heads");
    dvm::Dim S = kb.symbol("S");
    Value x = kb.load("x", DType::kF32, {1, h, S, d});
    Value res = kb.load("res", DType::kF32, {1, S, h, d});
    kb.store("y", kb.add(kb.permute(x, {0, 2, 1, 3}), res));
    return kb.build();
  };
  w.fused = [s, h, d](Instance& m, int64_t s0, int64_t s1) {
    const float *x = m.in[0].f(), *res = m.in[1].f();
    float* y = m.out[0].f();
    for (int64_t ss = s0; ss < s1; ++ss)
      for (int64_t hh = 0; hh < h; ++hh)
        for (int64_t k = 0; k < d; ++k) {
          const int64_t o = (ss * h + hh) * d + k;
          y[o] = x[(hh * s + ss) * d + k] + res[o];
        }
  };
  return finish(std::move(w));
}

// Rotary embedding on [S, H, 64]: y = x * cos[s] + rotate_half(x) * sin[s], rotate_half(x) =
// concat(-x[..., 32:], x[..., :32]); cos/sin [S, 1, 64] broadcast over the heads.
Instance rotary(int64_t n) {
  const int64_t h = 8, d = 64, s = std::max<int64_t>(1, n / (h * d));
  Instance w;
  w.in = {make(DType::kF32, {s, h, d}, 14, -1, 1), make(DType::kF32, {s, 1, d}, 15, -1, 1),
          make(DType::kF32, {s, 1, d}, 16, -1, 1)};
  w.out = {make(DType::kF32, {s, h, d}, 0, 0, 0)};
  w.items = s;
  w.build = [h, d] {
    KernelBuilder kb("rotary");
    dvm::Dim S = kb.symbol("S");
    Value x = kb.load("x", DType::kF32, {S, h, d});
    Value cs = kb.load("cos", DType::kF32, {S, 1, d});
    Value sn = kb.load("sin", DType::kF32, {S, 1, d});
    Value rot =
        kb.concat({kb.unary(UnaryOp::kNeg, kb.slice(x, 2, d / 2, d)), kb.slice(x, 2, 0, d / 2)}, 2);
    kb.store("y", kb.add(kb.mul(x, cs), kb.mul(rot, sn)));
    return kb.build();
  };
  w.fused = [h, d](Instance& m, int64_t s0, int64_t s1) {
    const float *x = m.in[0].f(), *cs = m.in[1].f(), *sn = m.in[2].f();
    float* y = m.out[0].f();
    const int64_t half = d / 2;
    for (int64_t ss = s0; ss < s1; ++ss)
      for (int64_t hh = 0; hh < h; ++hh) {
        const float* xr = x + (ss * h + hh) * d;
        float* yr = y + (ss * h + hh) * d;
        const float *c = cs + ss * d, *sv = sn + ss * d;
        for (int64_t k = 0; k < half; ++k) yr[k] = xr[k] * c[k] - xr[k + half] * sv[k];
        for (int64_t k = half; k < d; ++k) yr[k] = xr[k] * c[k] + xr[k - half] * sv[k];
      }
  };
  return finish(std::move(w));
}

// Half-precision storage: gelu of f16 into f16; bf16 in, f32 affine out.
Instance half_io(int64_t n, DType in_t, DType out_t) {
  Instance w;
  w.in = {make(in_t, {n}, 17, -3, 3)};
  w.out = {make(out_t, {n}, 0, 0, 0)};
  w.items = n;
  w.build = [in_t, out_t] {
    KernelBuilder kb("half_io");
    Value x = kb.cast(kb.load("x", in_t, {kb.symbol("N")}), DType::kF32);
    Value y = out_t == DType::kF16
                  ? kb.unary(UnaryOp::kGeluErf, x)
                  : kb.binary(BinaryOp::kAdd, kb.binary(BinaryOp::kMul, x, 2.0), 1.0);
    kb.store("y", y, out_t);
    return kb.build();
  };
  w.fused = [in_t, out_t](Instance& m, int64_t i0, int64_t i1) {
    const uint16_t* x = m.in[0].h();
    if (out_t == DType::kF16) {
      uint16_t* y = m.out[0].h();
      for (int64_t i = i0; i < i1; ++i) y[i] = to_f16(gelu_erf(from_f16(x[i])));
    } else {
      float* y = m.out[0].f();
      for (int64_t i = i0; i < i1; ++i)
        y[i] = (in_t == DType::kBF16 ? from_bf16(x[i]) : from_f16(x[i])) * 2.0f + 1.0f;
    }
  };
  return finish(std::move(w));
}

const std::vector<Workload>& workloads() {
  static const std::vector<Workload> all = {
      {"silu_mul", silu_mul},
      {"bcast_relu_c32", [](int64_t n) { return row_col_bcast(n, 32, false); }},
      {"bcast_relu_c64", [](int64_t n) { return row_col_bcast(n, 64, false); }},
      {"bcast_relu_c96", [](int64_t n) { return row_col_bcast(n, 96, false); }},
      {"bcast_gelu_c768", [](int64_t n) { return row_col_bcast(n, 768, true); }},
      {"rmsnorm_c64", [](int64_t n) { return norm(n, 64, Norm::kRms); }},
      {"rmsnorm_c4096", [](int64_t n) { return norm(n, 4096, Norm::kRms); }},
      {"rmsnorm_c16384", [](int64_t n) { return norm(n, 16384, Norm::kRms); }},
      {"softmax_c128", [](int64_t n) { return norm(n, 128, Norm::kSoftmax); }},
      {"softmax_c512", [](int64_t n) { return norm(n, 512, Norm::kSoftmax); }},
      {"logsoftmax_c64", [](int64_t n) { return norm(n, 64, Norm::kLogSoftmax); }},
      {"logsoftmax_c16384", [](int64_t n) { return norm(n, 16384, Norm::kLogSoftmax); }},
      {"add_layernorm_c256", [](int64_t n) { return norm(n, 256, Norm::kAddLayerNorm); }},
      {"add_layernorm_c768", [](int64_t n) { return norm(n, 768, Norm::kAddLayerNorm); }},
      {"col_sum", col_sum},
      {"mid_sum", mid_sum},
      {"transpose_add", transpose_add},
      {"permute_heads", permute_heads},
      {"merge_heads", merge_heads},
      {"rotary", rotary},
      {"f16_gelu", [](int64_t n) { return half_io(n, DType::kF16, DType::kF16); }},
      {"bf16_affine", [](int64_t n) { return half_io(n, DType::kBF16, DType::kF32); }},
  };
  return all;
}

// ---- benchmark bodies ----------------------------------------------------------------------

void run_fused(Instance& w, Pool& pool) {
  const std::function<void(int, int)> job = [&](int p, int parts) {
    w.fused(w, split(w.items, p, parts), split(w.items, p + 1, parts));
  };
  pool.run(w.in[0].numel(), job);
}

void bm_fused(benchmark::State& st, const Workload& wl, int threads) {
  Instance w = wl.make(st.range(0));
  Pool pool(threads);
  run_fused(w, pool);  // first touch outside the timing
  for (auto _ : st) {
    run_fused(w, pool);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * w.bytes);
  st.counters["threads"] = threads;
}

void bm_dvm(benchmark::State& st, const Workload& wl, int threads) {
  Instance w = wl.make(st.range(0));
  auto kernel = w.build();
  if (!kernel.is_ok()) return st.SkipWithError(kernel.status().to_string().c_str());
  dvm::CompileOptions opts;
  opts.num_threads = threads;
  auto ck = dvm::CompiledKernel::create(*kernel, opts);
  if (!ck.is_ok()) return st.SkipWithError(ck.status().to_string().c_str());
  std::vector<dvm::TensorArg> in, out;
  for (Tensor& t : w.in) in.push_back(t.arg());
  for (Tensor& t : w.out) out.push_back(t.arg());
  // Correctness guard against the baseline.
  Pool one(1);
  run_fused(w, one);
  std::vector<Tensor> want = w.out;
  dvm::Status s = (*ck)->run(in, out);
  if (!s.is_ok()) return st.SkipWithError(s.to_string().c_str());
  double err = 0, scale = 0;
  for (size_t k = 0; k < want.size(); ++k)
    for (int64_t i = 0; i < want[k].numel(); ++i)
      scale = std::max(scale, std::fabs(double(want[k].at(i))));
  for (size_t k = 0; k < want.size(); ++k)
    for (int64_t i = 0; i < want[k].numel(); ++i)
      err =
          std::max(err, std::fabs(double(w.out[k].at(i)) - want[k].at(i)) / std::max(scale, 1e-30));
  if (std::getenv("DVM_SUITE_DEBUG"))
    std::fprintf(stderr, "%s: want %g %g got %g %g\n", wl.name.c_str(), want[0].at(0),
                 want[0].at(1), w.out[0].at(0), w.out[0].at(1));
  for (auto _ : st) {
    dvm::Status r = (*ck)->run(in, out);
    if (!r.is_ok()) return st.SkipWithError(r.to_string().c_str());
  }
  st.SetBytesProcessed(st.iterations() * w.bytes);
  st.counters["threads"] = threads;
  st.counters["max_rel_err"] = err;
}

// The machine's copy bandwidth, the yardstick of memory-bound kernels at 16M elements: n
// floats copied over the same pool, by glibc's memcpy (kMemcpy), a plain loop the compiler
// vectorises (normal stores: each line is read before it is written) or a loop of streaming
// stores (kStream, AVX: no read for ownership, as DVM's large outputs are written); the
// report takes the fastest. Bytes are counted read + written, as the workloads count theirs.
enum class Copy { kMemcpy, kLoop, kStream };

void stream_copy(float* d, const float* s, int64_t n) {
  int64_t i = 0;
#ifdef __AVX__
  for (; i < n && reinterpret_cast<uintptr_t>(d + i) % 32 != 0; ++i) d[i] = s[i];
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(d + i, _mm256_loadu_ps(s + i));
  _mm_sfence();
#endif
  for (; i < n; ++i) d[i] = s[i];
}

void bm_copy(benchmark::State& st, int threads, Copy how) {
  const int64_t n = st.range(0);
  std::vector<float> src(static_cast<size_t>(n), 1.0f), dst(static_cast<size_t>(n), 0.0f);
  Pool pool(threads);
  float* d = dst.data();
  const float* s = src.data();
  const std::function<void(int, int)> job = [&](int p, int parts) {
    const int64_t a = split(n, p, parts), b = split(n, p + 1, parts);
    if (how == Copy::kMemcpy) {
      std::memcpy(d + a, s + a, static_cast<size_t>(b - a) * sizeof(float));
    } else if (how == Copy::kStream) {
      stream_copy(d + a, s + a, b - a);
    } else {
      for (int64_t i = a; i < b; ++i) d[i] = s[i];
    }
  };
  pool.run(n, job);
  for (auto _ : st) {
    pool.run(n, job);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(st.iterations() * n * 2 * static_cast<int64_t>(sizeof(float)));
  st.counters["threads"] = threads;
}

void register_all() {
  const int64_t sizes[] = {4096, int64_t{1} << 16, int64_t{1} << 20, int64_t{1} << 24};
  using Fn = void (*)(benchmark::State&, const Workload&, int);
  struct Variant {
    const char* name;
    Fn fn;
    int threads;
  };
  const Variant variants[] = {{"dvm_st", bm_dvm, 1},
                              {"fused_st", bm_fused, 1},
                              {"dvm_mt", bm_dvm, kThreads},
                              {"fused_mt", bm_fused, kThreads}};
  for (Copy how : {Copy::kMemcpy, Copy::kLoop, Copy::kStream}) {
    for (int threads : {1, kThreads}) {
      const std::string name = std::string("suite/copy/") +
                               (how == Copy::kMemcpy ? "memcpy"
                                : how == Copy::kLoop ? "loop"
                                                     : "stream") +
                               (threads == 1 ? "_st" : "_mt");
      benchmark::RegisterBenchmark(
          name.c_str(), [threads, how](benchmark::State& st) { bm_copy(st, threads, how); })
          ->Arg(int64_t{1} << 24)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (const Workload& w : workloads()) {
    for (const Variant& v : variants) {
      std::string name = "suite/" + w.name + "/" + v.name;
      auto* b = benchmark::RegisterBenchmark(
          name.c_str(), [&w, v](benchmark::State& st) { v.fn(st, w, v.threads); });
      for (int64_t n : sizes) b->Arg(n);
      b->UseRealTime()->Unit(benchmark::kMicrosecond);
    }
  }
}

// ---- in-process A/B of an encoder tiling knob ----------------------------------------------
//
//   vm_suite_bench --ab=KNOB:A,B [--ab_filter=REGEX] [--ab_sizes=N,N] [--ab_threads=T]
//                  [--ab_rounds=R] [--ab_chain]
//
// Compiles each matching workload twice, with the knob (a dvm::enc::TileTuning field) at A and
// at B, then times the two kernels in alternation over R rounds in this one process (the
// machine's speed drifts between processes and within seconds). Prints per workload and size
// the median time of each and the median of the per-round ratios A/B (> 1: B faster).

// A knob: an encoder tiling constant (field, set while encoding) or a VM setting (set, called
// before each timed run).
struct Knob {
  int64_t* field = nullptr;
  void (*set)(int64_t) = nullptr;
  bool valid() const { return field != nullptr || set != nullptr; }
  void apply(int64_t v) const {
    if (field != nullptr) *field = v;
    if (set != nullptr) set(v);
  }
};

Knob tuning_knob(const std::string& name) {
  dvm::enc::TileTuning& t = dvm::enc::tile_tuning();
  if (name == "row_reduce_tile_elems") return {&t.row_reduce_tile_elems};
  if (name == "reg_budget_bytes") return {&t.reg_budget_bytes};
  if (name == "row_reg_budget_bytes") return {&t.row_reg_budget_bytes};
  if (name == "long_row_cols") return {&t.long_row_cols};
  if (name == "blocks_per_thread") return {&t.blocks_per_thread};
  if (name == "min_block_elems") return {&t.min_block_elems};
  if (name == "small_tiles")
    return {nullptr, [](int64_t v) { dvm::vm::set_small_tile_path(v != 0); }};
  if (name == "row_programs")
    return {nullptr, [](int64_t v) { dvm::vm::set_row_programs(v != 0); }};
  if (name == "row_band_bytes") return {nullptr, [](int64_t v) { dvm::vm::set_row_band_bytes(v); }};
  if (name == "row_block_prefetch")
    return {nullptr, [](int64_t v) { dvm::vm::set_row_block_prefetch(v != 0); }};
  if (name == "stream_counts_operands")
    return {nullptr, [](int64_t v) { dvm::vm::set_stream_counts_operands(v != 0); }};
  if (name == "stream_threshold_bytes")
    return {nullptr, [](int64_t v) { dvm::vm::set_stream_threshold_bytes(v); }};
  return {};
}

// Microseconds per call of f, timed over at least 2 ms of back-to-back calls.
template <class F>
double time_calls(F f) {
  using Clock = std::chrono::steady_clock;
  int64_t iters = 0;
  const Clock::time_point t0 = Clock::now();
  double us = 0;
  do {
    for (int i = 0; i < 8; ++i) f();
    iters += 8;
    us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  } while (us < 2000);
  return us / static_cast<double>(iters);
}

double time_runs(dvm::CompiledKernel& ck, const std::vector<dvm::TensorArg>& in,
                 const std::vector<dvm::TensorArg>& out) {
  return time_calls([&] { (void)ck.run(in, out); });
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  size_t p = 0;
  while (p < s.size()) {
    size_t q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    v.push_back(std::atoll(s.substr(p, q - p).c_str()));
    p = q + 1;
  }
  return v;
}

// Compiles `kernel` for `threads` threads into *ck and runs it once on in / out, which encodes
// it under the knob's current value. False (the error printed, `what` naming it): it failed.
bool compile_encoded(const std::string& what, const dvm::StatusOr<dvm::Kernel>& kernel, int threads,
                     const std::vector<dvm::TensorArg>& in, const std::vector<dvm::TensorArg>& out,
                     std::shared_ptr<dvm::CompiledKernel>* ck) {
  dvm::Status s = kernel.status();
  if (s.is_ok()) {
    dvm::CompileOptions opts;
    opts.num_threads = threads;
    auto c = dvm::CompiledKernel::create(*kernel, opts);
    s = c.status();
    if (s.is_ok()) *ck = std::move(*c);
  }
  if (s.is_ok()) s = (*ck)->run(in, out);
  if (!s.is_ok()) std::fprintf(stderr, "%s: %s\n", what.c_str(), s.to_string().c_str());
  return s.is_ok();
}

// Times side 0 (knob at values[0]) and side 1 alternately over `rounds` rounds, which side
// goes first alternating too, and prints the medians and the median per-round ratio.
void alternate(const std::string& what, int64_t n, const Knob& knob,
               const std::vector<int64_t>& values, int rounds,
               const std::function<double(int)>& time_side) {
  std::vector<double> ta, tb, ratio;
  for (int r = 0; r < rounds; ++r) {
    const bool a_first = r % 2 == 0;
    const auto timed = [&](int v) {
      knob.apply(values[static_cast<size_t>(v)]);
      return time_side(v);
    };
    const double x = timed(a_first ? 0 : 1);
    const double y = timed(a_first ? 1 : 0);
    ta.push_back(a_first ? x : y);
    tb.push_back(a_first ? y : x);
    ratio.push_back(ta.back() / tb.back());
  }
  std::printf("%-20s %9lld %10.2f %10.2f %7.3f\n", what.c_str(), static_cast<long long>(n),
              median(ta), median(tb), median(ratio));
  std::fflush(stdout);
}

// One workload at n elements: encodes it with *field at values[0] and at values[1], then
// times the two alternately over `rounds` rounds and prints a line. False: it did not run.
bool ab_one(const Workload& wl, int64_t n, const Knob& knob, const std::vector<int64_t>& values,
            int threads, int rounds) {
  Instance w = wl.make(n);
  std::vector<dvm::TensorArg> in, out;
  for (Tensor& t : w.in) in.push_back(t.arg());
  for (Tensor& t : w.out) out.push_back(t.arg());
  std::shared_ptr<dvm::CompiledKernel> ck[2];
  for (int v = 0; v < 2; ++v) {
    knob.apply(values[static_cast<size_t>(v)]);
    if (!compile_encoded(wl.name, w.build(), threads, in, out, &ck[v])) return false;
  }
  alternate(wl.name, n, knob, values, rounds, [&](int v) { return time_runs(*ck[v], in, out); });
  return true;
}

// ---- a producer -> consumer chain under a knob -------------------------------------------
//
//   vm_suite_bench --ab=KNOB:A,B --ab_chain [--ab_sizes=N,N] [--ab_threads=T] [--ab_rounds=R]
//
// Three kernels, each reading its producer's output as a model's ops do: y = silu(a) * b,
// z = rmsnorm(y) * g, w = z + a over [N / 4096, 4096]; one call is the three in turn. Timed
// like --ab (each knob value's kernels encoded under it, the two alternating round by round):
// what a single-kernel A/B cannot show, e.g. whether a result streamed around the caches costs
// its consumer more than the producer saves.
bool ab_chain(int64_t n, const Knob& knob, const std::vector<int64_t>& values, int threads,
              int rounds) {
  constexpr int64_t kCols = 4096;
  const int64_t rows = std::max<int64_t>(1, n / kCols);
  Tensor a = make(DType::kF32, {rows, kCols}, 31, -2, 2),
         b = make(DType::kF32, {rows, kCols}, 32, -1, 1);
  Tensor g = make(DType::kF32, {kCols}, 33, 0.5f, 1.5f);
  Tensor y = make(DType::kF32, {rows, kCols}, 0, 0, 0), z = y, w = y;
  const auto build = [](int which) {
    KernelBuilder kb(which == 0 ? "gate" : which == 1 ? "rmsnorm" : "residual");
    dvm::Dim R = kb.symbol("R");
    Value x = kb.load("x", DType::kF32, {R, kCols});
    if (which == 0) {
      kb.store("y", kb.mul(kb.unary(UnaryOp::kSilu, x), kb.load("b", DType::kF32, {R, kCols})));
    } else if (which == 1) {
      Value ms = kb.mean(kb.mul(x, x), {-1}, true);
      Value r = kb.unary(UnaryOp::kRsqrt, kb.binary(BinaryOp::kAdd, ms, 1e-6));
      kb.store("y", kb.mul(kb.mul(x, r), kb.load("g", DType::kF32, {kCols})));
    } else {
      kb.store("y", kb.add(x, kb.load("b", DType::kF32, {R, kCols})));
    }
    return kb.build();
  };
  const std::vector<dvm::TensorArg> in[3] = {
      {a.arg(), b.arg()}, {y.arg(), g.arg()}, {z.arg(), a.arg()}};
  const std::vector<dvm::TensorArg> out[3] = {{y.arg()}, {z.arg()}, {w.arg()}};
  std::shared_ptr<dvm::CompiledKernel> ck[2][3];
  for (int v = 0; v < 2; ++v) {
    knob.apply(values[static_cast<size_t>(v)]);
    for (int k = 0; k < 3; ++k)
      if (!compile_encoded("chain", build(k), threads, in[k], out[k], &ck[v][k])) return false;
  }
  alternate("chain", rows * kCols, knob, values, rounds, [&](int v) {
    return time_calls([&] {
      for (int k = 0; k < 3; ++k) (void)ck[v][k]->run(in[k], out[k]);
    });
  });
  return true;
}

// ---- in-process DVM against the plain fused loop ---------------------------------------
//
//   vm_suite_bench --vs_fused [--ab_filter=REGEX] [--ab_sizes=N,N] [--ab_threads=T]
//                  [--ab_rounds=R] [--set=KNOB:V] [--vs_out=FILE]
//
// Times each matching workload's DVM kernel and its fused loop alternately over R rounds in
// this one process, at T threads each. Prints the median times and the median of the
// per-round ratios fused/DVM (> 1: DVM faster), then their geomean. --set: a knob of --ab at V.
// --vs_out: the rows also as JSON (bench/run_vs_fused.sh, scripts/perf_report.py).

struct VsRow {
  std::string workload;
  int64_t elements;
  double dvm_us, fused_us, ratio;
  // The same kernel through a prepared launch (CompiledKernel::run_launch, what the graph
  // executor calls per kernel): run()'s per-call binding (argument checks, the shape key's
  // lookup, the overlap proof) left out.
  double launch_us = 0, launch_ratio = 0;
};

// One workload at n elements; its row (ratio -1 when it did not run).
VsRow vs_fused_one(const Workload& wl, int64_t n, int threads, int rounds) {
  Instance w = wl.make(n);
  std::vector<dvm::TensorArg> in, out;
  for (Tensor& t : w.in) in.push_back(t.arg());
  for (Tensor& t : w.out) out.push_back(t.arg());
  auto kernel = w.build();
  dvm::CompileOptions opts;
  opts.num_threads = threads;
  dvm::Status s = kernel.status();
  std::shared_ptr<dvm::CompiledKernel> ck;
  if (s.is_ok()) {
    auto c = dvm::CompiledKernel::create(*kernel, opts);
    s = c.status();
    if (s.is_ok()) ck = std::move(*c);
  }
  if (s.is_ok()) s = ck->run(in, out);
  if (!s.is_ok()) {
    std::fprintf(stderr, "%s: %s\n", wl.name.c_str(), s.to_string().c_str());
    return VsRow{wl.name, n, 0, 0, -1};
  }
  auto launch = ck->prepare_launch(in, out);
  if (!launch.status().is_ok()) {
    std::fprintf(stderr, "%s: %s\n", wl.name.c_str(), launch.status().to_string().c_str());
    return VsRow{wl.name, n, 0, 0, -1};
  }
  std::vector<void*> data;
  for (const dvm::TensorArg& t : in) data.push_back(t.data);
  for (const dvm::TensorArg& t : out) data.push_back(t.data);
  Pool pool(threads);
  run_fused(w, pool);
  std::vector<double> tv, tf, tl, ratio, lratio;
  for (int r = 0; r < rounds; ++r) {
    // Three sides, each round in a rotated order: none is always first after the others.
    double t[3] = {0, 0, 0};
    for (int k = 0; k < 3; ++k) {
      const int side = (r + k) % 3;
      if (side == 0) t[0] = time_runs(*ck, in, out);
      if (side == 1) t[1] = time_calls([&] { run_fused(w, pool); });
      if (side == 2) t[2] = time_calls([&] { (void)ck->run_launch(**launch, data); });
    }
    tv.push_back(t[0]);
    tf.push_back(t[1]);
    tl.push_back(t[2]);
    ratio.push_back(t[1] / t[0]);
    lratio.push_back(t[1] / t[2]);
  }
  VsRow row{wl.name, n, median(tv), median(tf), median(ratio)};
  row.launch_us = median(tl);
  row.launch_ratio = median(lratio);
  std::printf("%-20s %9lld %10.2f %10.2f %7.3f %10.2f %7.3f\n", wl.name.c_str(),
              static_cast<long long>(n), row.dvm_us, row.fused_us, row.ratio, row.launch_us,
              row.launch_ratio);
  std::fflush(stdout);
  return row;
}

void write_vs_json(const std::string& path, const std::vector<VsRow>& rows, int threads,
                   int rounds) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return;
  }
  std::fprintf(f, "{\"threads\": %d, \"rounds\": %d, \"rows\": [", threads, rounds);
  for (size_t i = 0; i < rows.size(); ++i) {
    const VsRow& r = rows[i];
    std::fprintf(f,
                 "%s\n  {\"workload\": \"%s\", \"elements\": %lld, \"dvm_us\": %.4f, "
                 "\"fused_us\": %.4f, \"ratio\": %.4f, \"launch_us\": %.4f, "
                 "\"launch_ratio\": %.4f}",
                 i ? "," : "", r.workload.c_str(), static_cast<long long>(r.elements), r.dvm_us,
                 r.fused_us, r.ratio, r.launch_us, r.launch_ratio);
  }
  std::fprintf(f, "\n]}\n");
  std::fclose(f);
}

int run_vs_fused(const std::string& filter, const std::vector<int64_t>& sizes, int threads,
                 int rounds, const std::string& out) {
  const std::regex re(filter);
  std::printf("%-20s %9s %10s %10s %7s %10s %7s  (%d thread(s), %d rounds)\n", "workload",
              "elements", "DVM us", "fused us", "fused/DVM", "launch us", "f/launch", threads,
              rounds);
  double log_sum = 0, log_launch = 0;
  std::vector<VsRow> rows;
  for (const Workload& wl : workloads()) {
    if (!std::regex_search(wl.name, re)) continue;
    for (int64_t n : sizes) {
      rows.push_back(vs_fused_one(wl, n, threads, rounds));
      if (rows.back().ratio <= 0) return 1;
      log_sum += std::log(rows.back().ratio);
      log_launch += std::log(rows.back().launch_ratio);
    }
  }
  if (!rows.empty()) {
    std::printf("geomean fused/DVM %.3f (prepared launches %.3f) over %zu\n",
                std::exp(log_sum / double(rows.size())), std::exp(log_launch / double(rows.size())),
                rows.size());
  }
  if (!out.empty()) write_vs_json(out, rows, threads, rounds);
  return 0;
}

int run_ab(int argc, char** argv) {
  std::string knob, filter = ".*";
  std::vector<int64_t> values, sizes = {int64_t{1} << 16, int64_t{1} << 20};
  int threads = 1, rounds = 15;
  bool vs_fused = false, chain = false;
  std::string vs_out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto val = [&](const char* key) {
      const std::string k = std::string(key) + "=";
      return a.rfind(k, 0) == 0 ? a.substr(k.size()) : std::string();
    };
    if (!val("--ab").empty()) {
      const std::string v = val("--ab");
      knob = v.substr(0, v.find(':'));
      values = parse_list(v.substr(v.find(':') + 1));
    } else if (!val("--ab_filter").empty()) {
      filter = val("--ab_filter");
    } else if (!val("--ab_sizes").empty()) {
      sizes = parse_list(val("--ab_sizes"));
    } else if (!val("--ab_threads").empty()) {
      threads = std::atoi(val("--ab_threads").c_str());
    } else if (!val("--ab_rounds").empty()) {
      rounds = std::atoi(val("--ab_rounds").c_str());
    } else if (a == "--vs_fused") {
      vs_fused = true;
    } else if (a == "--ab_chain") {
      chain = true;
    } else if (!val("--vs_out").empty()) {
      vs_out = val("--vs_out");
    } else if (!val("--set").empty()) {
      const std::string v = val("--set");
      const Knob k = tuning_knob(v.substr(0, v.find(':')));
      const int64_t x = std::atoll(v.substr(v.find(':') + 1).c_str());
      k.apply(x);
    }
  }
  if (vs_fused) return run_vs_fused(filter, sizes, threads, rounds, vs_out);
  const Knob k = tuning_knob(knob);
  if (!k.valid() || values.size() != 2) {
    std::fprintf(
        stderr,
        "--ab=KNOB:A,B with KNOB a dvm::enc::TileTuning field or a VM setting (tuning_knob)\n");
    return 1;
  }
  const int64_t saved = k.field != nullptr ? *k.field : 1;
  const std::regex re(filter);
  std::printf("%-20s %9s %10s %10s %7s  (%s: A=%lld B=%lld, %d thread(s), %d rounds)\n", "workload",
              "elements", "A us", "B us", "A/B", knob.c_str(), static_cast<long long>(values[0]),
              static_cast<long long>(values[1]), threads, rounds);
  if (chain) {
    for (int64_t n : sizes) {
      const bool ok = ab_chain(n, k, values, threads, rounds);
      k.apply(saved);
      if (!ok) return 1;
    }
    return 0;
  }
  for (const Workload& wl : workloads()) {
    if (!std::regex_search(wl.name, re)) continue;
    for (int64_t n : sizes) {
      const bool ok = ab_one(wl, n, k, values, threads, rounds);
      k.apply(saved);
      if (!ok) return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--ab=", 0) == 0 || a == "--vs_fused") return run_ab(argc, argv);
  }
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("bench_threads", std::to_string(kThreads));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
