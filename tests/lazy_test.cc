// Lazy tensors (include/dvm/lazy.h): fused traces against op-by-op execution, every flush
// trigger, alias and in-place hazards, dead intermediates, the plan cache across shapes.
#include "dvm/lazy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <thread>

namespace dvm::lazy {
namespace {

// Host data that lazy tensors wrap (kept alive by the wrapping tensor).
Tensor make_f32(std::vector<int64_t> shape, std::mt19937& rng, float lo = -1, float hi = 1) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  auto buf = std::make_shared<std::vector<float>>(n);
  std::uniform_real_distribution<float> u(lo, hi);
  for (float& v : *buf) v = u(rng);
  return Tensor::wrap(TensorArg::contiguous(buf->data(), DType::kF32, shape), buf);
}

std::vector<float> values(const Tensor& t) {
  StatusOr<std::vector<float>> v = cast(t, DType::kF32).to_vector<float>();
  EXPECT_TRUE(v.is_ok()) << v.status().to_string();
  return v.is_ok() ? *v : std::vector<float>{};
}

void expect_near(const std::vector<float>& a, const std::vector<float>& b, float tol,
                 const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    float scale = std::max(1.0f, std::fabs(b[i]));
    ASSERT_NEAR(a[i], b[i], tol * scale) << what << " at " << i;
  }
}

class LazyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(sync().is_ok());
    set_options(Options{});
    clear_plan_cache();
    reset_stats();
  }
  void TearDown() override {
    Status st = sync();
    (void)st;
    set_options(Options{});
  }
  std::mt19937 rng{1234};
};

TEST_F(LazyTest, RecordsThenFusesIntoOneKernel) {
  Tensor x = make_f32({4, 8}, rng);
  Tensor b = make_f32({8}, rng);
  std::vector<float> xv = values(x), bv = values(b);
  reset_stats();
  Tensor y = unary(UnaryOp::kTanh, (x * 2.0 + b) * x - 1.0);
  EXPECT_TRUE(y.is_pending());
  EXPECT_EQ(pending_ops(), 7);  // 2 constants, mul, add, mul, sub, tanh
  EXPECT_EQ(stats().flushes, 0);
  std::vector<float> yv = values(y);
  EXPECT_FALSE(y.is_pending());
  std::vector<float> want(32);
  for (int i = 0; i < 32; ++i) want[i] = std::tanh((xv[i] * 2 + bv[i % 8]) * xv[i] - 1);
  expect_near(yv, want, 1e-5f, "tanh chain");
  Stats s = stats();
  EXPECT_EQ(s.flushes, 1);
  EXPECT_EQ(s.flushes_by_reason[int(FlushReason::kObserve)], 1);
  EXPECT_EQ(s.kernels_launched, 1);
  EXPECT_EQ(s.values_stored, 1);
  EXPECT_EQ(s.bytes_stored, 32 * 4);
  EXPECT_EQ(s.intermediates_elided, 4);  // mul, add, sub, mul
}

// ---------------------------------------------------------------------------------------------
// Random programs: one fused flush against op by op (a flush after every op).

struct RandomProgram {
  int64_t rows, cols;
  uint32_t seed;

  // Builds the program over `in`; `step` runs after every op (op-by-op mode syncs there).
  std::vector<Tensor> run(const std::vector<Tensor>& in, const std::function<void()>& step) const {
    std::mt19937 r(seed);
    std::vector<Tensor> pool = in;  // [rows, cols], [1, cols], [rows, 1]
    auto pick = [&]() -> Tensor& { return pool[r() % pool.size()]; };
    auto full = [&]() {
      for (int k = 0; k < 8; ++k) {
        Tensor& t = pick();
        if (t.shape() == std::vector<int64_t>{rows, cols}) return t;
      }
      return pool[0];
    };
    for (int i = 0; i < 14; ++i) {
      Tensor out;
      switch (r() % 13) {
        case 0: {
          const UnaryOp ops[] = {UnaryOp::kTanh,    UnaryOp::kNeg,  UnaryOp::kAbs,
                                 UnaryOp::kSigmoid, UnaryOp::kRelu, UnaryOp::kExp};
          Tensor a = pick();
          out = unary(ops[r() % 6], clamp(a, -3.0, 3.0));
          break;
        }
        case 1: {
          const BinaryOp ops[] = {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul,
                                  BinaryOp::kMaximum, BinaryOp::kMinimum};
          Tensor a = pick(), b = pick();
          out = binary(ops[r() % 5], a, b);
          break;
        }
        case 2:
          out = pick() * 0.5 + 0.25;
          break;
        case 3:
          out = softmax(full(), r() % 2 ? -1 : 0);
          break;
        case 4:
          out = layer_norm(full());
          break;
        case 5: {
          const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax};
          out = reduce(ops[r() % 3], full(), {int(r() % 2)}, true);
          break;
        }
        case 6: {  // [rows, cols] x [cols, rows]^T-ish: a @ b^T, then back to [rows, cols]
          Tensor a = full();
          Tensor s = matmul(a, a, false, true);  // [rows, rows]
          out = matmul(s, a) * (1.0 / double(rows * cols));
          break;
        }
        case 7:
          out = transpose(reshape(transpose(full(), 0, 1), {cols, rows}), 0, 1);
          break;
        case 8: {
          Tensor a = full();
          Tensor left = slice(a, 1, 0, cols / 2), right = slice(a, 1, cols / 2);
          out = concat({right, left}, 1);
          break;
        }
        case 9: {
          Tensor a = pick(), b = full();
          out = select(binary(BinaryOp::kGt, a, 0.0), b, a);
          break;
        }
        case 10:
          out = cast(cast(pick(), DType::kBF16), DType::kF32);
          break;
        case 11:
          out = gelu(full(), r() % 2 == 0);
          break;
        case 12: {
          Tensor a = full();
          out = reshape(reshape(a, {-1}), {rows, cols});
          out = out + expand(slice(a, 0, 0, 1), {rows, cols});
          break;
        }
      }
      step();
      // Sometimes drop a value: its trace node becomes a dead intermediate.
      if (r() % 4 == 0 && pool.size() > 3) pool.erase(pool.begin() + 3 + r() % (pool.size() - 3));
      pool.push_back(out);
    }
    return pool;
  }
};

TEST_F(LazyTest, RandomProgramsMatchOpByOp) {
  int total_ops = 0;
  for (uint32_t seed = 1; seed <= 60; ++seed) {
    RandomProgram prog{int64_t(2 + seed % 7), int64_t(2 * (1 + seed % 5)), seed};
    std::mt19937 r(seed * 7919);
    std::vector<Tensor> in = {make_f32({prog.rows, prog.cols}, r), make_f32({1, prog.cols}, r),
                              make_f32({prog.rows, 1}, r)};
    reset_stats();
    std::vector<Tensor> fused = prog.run(in, [] {});
    int recorded = pending_ops();
    total_ops += recorded;
    ASSERT_TRUE(sync().is_ok());
    EXPECT_EQ(stats().flushes, 1);
    std::vector<Tensor> eager = prog.run(in, [] { ASSERT_TRUE(sync().is_ok()); });
    ASSERT_EQ(fused.size(), eager.size());
    for (size_t i = 0; i < fused.size(); ++i) {
      ASSERT_TRUE(fused[i].status().is_ok()) << fused[i].status().to_string();
      EXPECT_EQ(fused[i].shape(), eager[i].shape());
      expect_near(values(fused[i]), values(eager[i]), 2e-4f,
                  "seed " + std::to_string(seed) + " value " + std::to_string(i));
    }
  }
  EXPECT_GT(total_ops, 60 * 14);
}

// ---------------------------------------------------------------------------------------------
// Flush triggers

TEST_F(LazyTest, ObservationFlushes) {
  Tensor x = make_f32({3, 5}, rng);
  Tensor s = sum(x * x, {});
  EXPECT_TRUE(s.is_pending());
  StatusOr<double> v = s.item();
  ASSERT_TRUE(v.is_ok());
  double want = 0;
  for (float f : values(x)) want += double(f) * f;
  EXPECT_NEAR(*v, want, 1e-4);

  Tensor y = x + 1.0;
  std::string text = y.to_string();
  EXPECT_EQ(text.rfind("f32[3, 5] [[", 0), 0u) << text;
  Tensor z = x * 3.0;
  std::vector<float> buf(15);
  ASSERT_TRUE(z.copy_to(buf.data(), buf.size() * 4).is_ok());
  EXPECT_FALSE(z.copy_to(buf.data(), 4).is_ok());
  Tensor w = x - 1.0;
  StatusOr<TensorArg> d = w.data();
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(d->shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(stats().flushes_by_reason[int(FlushReason::kObserve)], 4);
}

TEST_F(LazyTest, SyncAndUnsupportedFlush) {
  Tensor x = make_f32({6}, rng);
  Tensor y = x * 2.0;
  ASSERT_TRUE(sync().is_ok());
  EXPECT_FALSE(y.is_pending());
  Tensor z = y + 1.0;
  ASSERT_TRUE(sync(FlushReason::kUnsupported).is_ok());
  EXPECT_FALSE(z.is_pending());
  ASSERT_TRUE(sync().is_ok());  // empty trace: no flush counted
  Stats s = stats();
  EXPECT_EQ(s.flushes, 2);
  EXPECT_EQ(s.flushes_by_reason[int(FlushReason::kSync)], 1);
  EXPECT_EQ(s.flushes_by_reason[int(FlushReason::kUnsupported)], 1);
  expect_near(
      values(z),
      [&] {
        std::vector<float> v = values(x);
        for (float& f : v) f = f * 2 + 1;
        return v;
      }(),
      1e-6f, "z");
}

TEST_F(LazyTest, SizeBoundFlushes) {
  Options o;
  o.max_trace_ops = 10;
  set_options(o);
  Tensor x = make_f32({16}, rng);
  std::vector<float> want = values(x);
  Tensor y = x;
  for (int i = 0; i < 25; ++i) {
    y = y * 1.5 - 0.25;
    for (float& f : want) f = f * 1.5f - 0.25f;
    EXPECT_LE(pending_ops(), 10);
  }
  EXPECT_GE(stats().flushes_by_reason[int(FlushReason::kSizeBound)], 9);
  expect_near(values(y), want, 1e-4f, "bounded chain");
}

TEST_F(LazyTest, WriteFlushesReadersFirst) {
  auto buf = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4});
  Tensor x = Tensor::wrap(TensorArg::contiguous(buf->data(), DType::kF32, {4}), buf);
  Tensor y = x * 10.0;  // reads x's memory at the flush
  StatusOr<TensorArg> m = x.mutable_data();
  ASSERT_TRUE(m.is_ok());
  EXPECT_FALSE(y.is_pending());
  static_cast<float*>(m->data)[0] = 100;
  expect_near(values(y), {10, 20, 30, 40}, 0, "y read the old x");
  expect_near(values(x * 1.0), {100, 2, 3, 4}, 0, "x after the write");
  EXPECT_EQ(stats().flushes_by_reason[int(FlushReason::kWrite)], 1);

  // A pending value written in place: flushed first.
  Tensor p = x + 1.0;
  StatusOr<TensorArg> pm = p.mutable_data();
  ASSERT_TRUE(pm.is_ok());
  static_cast<float*>(pm->data)[1] = -1;
  expect_near(values(p), {101, -1, 4, 5}, 0, "p");
}

// A weight wrapped as a constant (TensorArg::version) is packed once for every flush that
// multiplies by it; writing it through mutable_data() drops the promise, so later products
// see the new values.
TEST_F(LazyTest, ConstantWeightIsPackedOnceAndWritesAreSeen) {
  clear_weight_cache();
  auto wbuf = std::make_shared<std::vector<float>>(64 * 48, 0.5f);
  TensorArg warg = TensorArg::contiguous(wbuf->data(), DType::kF32, {64, 48});
  warg.version = 7;
  Tensor w = Tensor::wrap(warg, wbuf);
  for (int64_t rows : {9, 17, 30}) {
    auto xbuf = std::make_shared<std::vector<float>>(rows * 64, 1.0f);
    Tensor x = Tensor::wrap(TensorArg::contiguous(xbuf->data(), DType::kF32, {rows, 64}), xbuf);
    expect_near(values(matmul(x, w)), std::vector<float>(rows * 48, 32.0f), 1e-5f, "x @ w");
  }
  EXPECT_EQ(weight_cache_stats().packs, 1);
  StatusOr<TensorArg> m = w.mutable_data();
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ(m->version, 0u);
  std::fill_n(static_cast<float*>(m->data), 64 * 48, 2.0f);
  auto xbuf = std::make_shared<std::vector<float>>(9 * 64, 1.0f);
  Tensor x = Tensor::wrap(TensorArg::contiguous(xbuf->data(), DType::kF32, {9, 64}), xbuf);
  expect_near(values(matmul(x, w)), std::vector<float>(9 * 48, 128.0f), 1e-5f, "after write");
  EXPECT_EQ(weight_cache_stats().packs, 1);  // no longer a constant: packed per call
  clear_weight_cache();
}

TEST_F(LazyTest, OtherThreadValueFlushesItsTrace) {
  Tensor x = make_f32({8}, rng);
  Tensor y = x * 3.0;  // pending in this thread's trace
  Tensor z;
  std::thread t([&] { z = y + 1.0; });
  t.join();
  EXPECT_FALSE(y.is_pending());
  EXPECT_EQ(stats().flushes_by_reason[int(FlushReason::kOtherThread)], 1);
  std::vector<float> want = values(x);
  for (float& f : want) f = f * 3 + 1;
  // z is pending in the ended thread's trace; observing it here flushes that trace.
  EXPECT_TRUE(z.is_pending());
  expect_near(values(z), want, 1e-6f, "z");
  EXPECT_FALSE(z.is_pending());
}

// ---------------------------------------------------------------------------------------------
// Aliases and in-place hazards

TEST_F(LazyTest, StorageOverlappingAnInputIsWrittenAfterTheReads) {
  auto buf = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5, 6});
  Tensor x = Tensor::wrap(TensorArg::contiguous(buf->data(), DType::kF32, {2, 3}), buf);
  Tensor y = x + 1.0;
  Tensor z = x * 3.0;  // must see the old x
  ASSERT_TRUE(y.set_storage(TensorArg::contiguous(buf->data(), DType::kF32, {2, 3})).is_ok());
  ASSERT_TRUE(sync().is_ok());
  expect_near(*buf, {2, 3, 4, 5, 6, 7}, 0, "in-place result");
  expect_near(values(z), {3, 6, 9, 12, 15, 18}, 0, "reader of the old value");
  StatusOr<TensorArg> yd = y.data();
  ASSERT_TRUE(yd.is_ok());
  EXPECT_EQ(yd->data, buf->data());
  EXPECT_FALSE(y.set_storage(TensorArg::contiguous(buf->data(), DType::kF32, {2, 3})).is_ok());
  Tensor w = x + 0.0;
  EXPECT_FALSE(w.set_storage(TensorArg::contiguous(buf->data(), DType::kF32, {3, 2})).is_ok());
}

TEST_F(LazyTest, StridedAndRepeatedLeaves) {
  // A transposed view wrapped zero-copy, used twice, and stored reshaped (a view output).
  auto buf = std::make_shared<std::vector<float>>(std::vector<float>{0, 1, 2, 3, 4, 5});
  TensorArg t;
  t.data = buf->data();
  t.dtype = DType::kF32;
  t.shape = {3, 2};
  t.strides = {1, 3};  // the transpose of a [2, 3] buffer
  Tensor x = Tensor::wrap(t, buf);
  Tensor y = x * x + x;
  Tensor r = reshape(x, {6});  // a view of a leaf, stored as its own value
  expect_near(values(y), {0, 12, 2, 20, 6, 30}, 0, "strided leaf");
  expect_near(values(r), {0, 3, 1, 4, 2, 5}, 0, "reshaped strided leaf");
}

TEST_F(LazyTest, WeakHandlesDoNotKeepValues) {
  Tensor x = make_f32({4}, rng);
  WeakTensor weak;
  {
    Tensor v = x + 1.0;
    weak = WeakTensor(v);
  }
  Tensor kept = x * 2.0;
  WeakTensor weak_kept(kept);
  ASSERT_TRUE(sync().is_ok());
  EXPECT_FALSE(weak.lock().defined());
  EXPECT_TRUE(weak_kept.lock().defined());
  EXPECT_EQ(stats().values_stored, 1);
}

// ---------------------------------------------------------------------------------------------
// Dead intermediates

TEST_F(LazyTest, DeadIntermediatesAreNotStored) {
  Tensor x = make_f32({64, 32}, rng);
  Tensor w = make_f32({32}, rng);
  reset_stats();
  Tensor y = x;
  for (int i = 0; i < 10; ++i) y = unary(UnaryOp::kTanh, y * w + 0.5);
  Tensor dead = x * 7.0;  // recorded, then dropped before the flush
  dead = Tensor();
  ASSERT_TRUE(sync().is_ok());
  Stats s = stats();
  EXPECT_EQ(s.values_stored, 1);
  EXPECT_EQ(s.bytes_stored, 64 * 32 * 4);
  EXPECT_EQ(s.intermediates_elided, 29);  // 10 x (mul, add, tanh), y itself stored
  EXPECT_EQ(s.ops_dropped, 2);            // the dead mul and its constant
  EXPECT_EQ(s.kernels_launched, 1);

  // Two live values of one chain: both stored, nothing else.
  reset_stats();
  Tensor a = x * 2.0;
  Tensor b = unary(UnaryOp::kExp, a);
  Tensor c = b + 1.0;
  b = Tensor();
  ASSERT_TRUE(sync().is_ok());
  EXPECT_EQ(stats().values_stored, 2);
  EXPECT_EQ(stats().intermediates_elided, 1);
  // Nothing live: nothing runs.
  reset_stats();
  { Tensor gone = x + 1.0; }
  ASSERT_TRUE(sync().is_ok());
  EXPECT_EQ(stats().kernels_launched, 0);
  EXPECT_EQ(stats().plan_cache_misses + stats().plan_cache_hits, 0);
}

// ---------------------------------------------------------------------------------------------
// Plan cache

TEST_F(LazyTest, PlanCacheHitsAcrossShapes) {
  Tensor w = make_f32({64}, rng), b = make_f32({64}, rng);
  const int64_t seqs[] = {5, 9, 17, 33, 7, 9, 120};
  for (int64_t s : seqs) {
    Tensor x = make_f32({s, 64}, rng);
    Tensor y = softmax(layer_norm(x, w, b) * 2.0, -1);
    Tensor m = amax(y, {1});
    std::vector<float> got = values(m);
    // Reference: op by op.
    Tensor ye = layer_norm(x, w, b);
    ASSERT_TRUE(sync().is_ok());
    ye = ye * 2.0;
    ASSERT_TRUE(sync().is_ok());
    ye = softmax(ye, -1);
    ASSERT_TRUE(sync().is_ok());
    expect_near(got, values(amax(ye, {1})), 1e-5f, "seq " + std::to_string(s));
  }
  reset_stats();
  clear_plan_cache();
  for (int64_t s : seqs) {
    Tensor x = make_f32({s, 64}, rng);
    Tensor y = softmax(layer_norm(x, w, b) * 2.0, -1);
    ASSERT_TRUE(y.status().is_ok());
    ASSERT_TRUE(sync().is_ok());
  }
  Stats st = stats();
  EXPECT_EQ(st.plan_cache_misses, 1);
  EXPECT_EQ(st.plan_cache_hits, 6);
  EXPECT_EQ(plan_cache_size(), 1u);
  EXPECT_GT(st.programs_encoded, 0);
  // A seq equal to the hidden size merges two dim classes: another structure.
  Tensor x = make_f32({64, 64}, rng);
  Tensor y = softmax(layer_norm(x, w, b) * 2.0, -1);
  ASSERT_TRUE(sync().is_ok());
  EXPECT_EQ(stats().plan_cache_misses, 2);
  // A seq of 1 is a constant 1: another structure as well.
  Tensor x1 = make_f32({1, 64}, rng);
  Tensor y1 = softmax(layer_norm(x1, w, b) * 2.0, -1);
  ASSERT_TRUE(sync().is_ok());
  EXPECT_EQ(stats().plan_cache_misses, 3);
}

// A GPT-style attention block: a reshape splits the hidden dim into heads (its class is
// specialised), the sequence stays symbolic, so every new length hits the plan.
Tensor attention_block(const Tensor& x, const Tensor& wqkv, const Tensor& wo, int heads) {
  int64_t t = x.shape()[1], c = x.shape()[2];
  Tensor h = layer_norm(x);
  Tensor qkv = linear(h, wqkv);  // [1, T, 3C]
  std::vector<Tensor> parts = split(qkv, {c, c, c}, 2);
  auto heads_of = [&](const Tensor& p) {
    return transpose(reshape(p, {1, t, heads, c / heads}), 1, 2);
  };
  Tensor a = attention(heads_of(parts[0]), heads_of(parts[1]), heads_of(parts[2]), {}, true);
  Tensor o = reshape(transpose(a, 1, 2), {1, t, c});
  return x + linear(o, wo);
}

TEST_F(LazyTest, GrowingSequenceReusesThePlan) {
  const int64_t c = 48;
  const int heads = 3;  // head dim 16: no sequence length below coincides with a model dim
  Tensor wqkv = make_f32({3 * c, c}, rng, -0.2f, 0.2f), wo = make_f32({c, c}, rng, -0.2f, 0.2f);
  Tensor x = make_f32({1, 5, c}, rng);
  reset_stats();
  for (int step = 0; step < 6; ++step) {
    Tensor y = attention_block(x, wqkv, wo, heads);
    Tensor last = slice(y, 1, -1);  // [1, 1, C]
    x = concat({x, last * 0.5}, 1);
    ASSERT_TRUE(x.status().is_ok()) << x.status().to_string();
    std::vector<float> got = values(x);
    ASSERT_EQ(got.size(), size_t((6 + step) * c));
  }
  Stats s = stats();
  EXPECT_EQ(s.plan_cache_misses, 1);
  EXPECT_EQ(s.plan_cache_hits, 5);
  EXPECT_GE(s.specialised_classes, 1);
  // The fused result matches op by op.
  // A length equal to the number of heads merges two dim classes: another structure.
  Tensor x3 = make_f32({1, 3, c}, rng);
  ASSERT_TRUE(attention_block(x3, wqkv, wo, heads).data().is_ok());
  EXPECT_EQ(stats().plan_cache_misses, 2);
  Tensor x0 = make_f32({1, 5, c}, rng);
  std::vector<float> fused = values(attention_block(x0, wqkv, wo, heads));
  Options o;
  o.max_trace_ops = 1;  // every op flushes on its own
  set_options(o);
  std::vector<float> eager = values(attention_block(x0, wqkv, wo, heads));
  expect_near(fused, eager, 1e-4f, "attention block");
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST_F(LazyTest, ErrorsAreStatusValues) {
  Tensor a = make_f32({2, 3}, rng), b = make_f32({4}, rng);
  Tensor bad = a + b;
  EXPECT_FALSE(bad.status().is_ok());
  EXPECT_NE(bad.status().message().find("broadcast"), std::string::npos) << bad.status().message();
  Tensor worse = unary(UnaryOp::kExp, bad) * 2.0;
  EXPECT_EQ(worse.status().message(), bad.status().message());
  EXPECT_FALSE(worse.item().is_ok());
  EXPECT_FALSE(worse.data().is_ok());
  EXPECT_FALSE(Tensor().status().is_ok());
  EXPECT_FALSE((a + Tensor()).status().is_ok());
  EXPECT_FALSE(reshape(a, {5}).status().is_ok());
  EXPECT_FALSE(matmul(a, a).status().is_ok());
  EXPECT_FALSE(reduce(ReduceOp::kSum, a, {3}).status().is_ok());
  EXPECT_FALSE(transpose(a, 0, 5).status().is_ok());
  EXPECT_EQ(pending_ops(), 0);

  // A run-time error (an index out of range) reaches every value of the flush.
  std::vector<int64_t> idx = {0, 7};
  Tensor ids = Tensor::copy_of(idx.data(), DType::kI64, {2});
  Tensor rows = index_select(a, 0, ids) + 1.0;
  Status st = sync();
  EXPECT_FALSE(st.is_ok());
  EXPECT_FALSE(rows.status().is_ok());
  EXPECT_FALSE(rows.item().is_ok());
  // The runtime keeps working.
  Tensor ok = a * 2.0;
  EXPECT_TRUE(ok.data().is_ok());
}

}  // namespace
}  // namespace dvm::lazy
