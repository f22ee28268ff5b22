// Tests of the scalar reference executor against hand-computed values: it is the spec every
// VM result is compared with, so each expectation here is worked out by hand, not by code.
#include "ir/reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "dvm/kernel.h"
#include "dvm/runtime.h"
#include "ir/kernel_def.h"

namespace dvm {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::kF32;
  if constexpr (std::is_same_v<T, int32_t>) return DType::kI32;
  if constexpr (std::is_same_v<T, int64_t>) return DType::kI64;
  return DType::kBool;  // uint8_t
}

// A view of `v` (caller-owned); contiguous unless strides are given.
template <typename T>
TensorArg view(std::vector<T>& v, std::vector<int64_t> shape, std::vector<int64_t> strides = {},
               int64_t offset = 0, DType dtype = dtype_of<T>()) {
  TensorArg t;
  t.data = v.data();
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.strides = std::move(strides);
  t.offset = offset;
  t.storage_elems = static_cast<int64_t>(v.size());
  return t;
}

Status run(const Kernel& k, std::vector<TensorArg> in, std::vector<TensorArg> out,
           std::vector<ScalarArg> params = {}) {
  return run_reference(k, in, out, params);
}

// Builds or fails the test, printing the builder's error.
#define BUILD_OR_FAIL(var, kb)                                    \
  StatusOr<Kernel> var##_or = (kb).build();                       \
  ASSERT_TRUE(var##_or.is_ok()) << var##_or.status().to_string(); \
  const Kernel& var = *var##_or

#define EXPECT_OK(expr)                        \
  do {                                         \
    Status s_ = (expr);                        \
    EXPECT_TRUE(s_.is_ok()) << s_.to_string(); \
  } while (0)

// ---- Elementwise ---------------------------------------------------------------------------

TEST(Reference, AddBroadcastsRowAndColumn) {
  KernelBuilder kb("add_bcast");
  Value a = kb.load("a", DType::kF32, {2, 1});
  Value b = kb.load("b", DType::kF32, {3});
  kb.store("y", kb.add(a, b));
  BUILD_OR_FAIL(k, kb);
  std::vector<float> av = {10, 20}, bv = {1, 2, 3}, y(6, -1);
  EXPECT_OK(run(k, {view(av, {2, 1}), view(bv, {3})}, {view(y, {2, 3})}));
  EXPECT_EQ(y, (std::vector<float>{11, 12, 13, 21, 22, 23}));
}

TEST(Reference, SymbolicShapesBindPerCall) {
  KernelBuilder kb("add_sym");
  Dim n = kb.symbol("N");
  Value a = kb.load("a", DType::kF32, {n, 2});
  Value b = kb.load("b", DType::kF32, {2});
  kb.store("y", kb.mul(a, b));
  BUILD_OR_FAIL(k, kb);
  std::vector<float> av = {1, 2, 3, 4, 5, 6}, bv = {10, -1}, y(6);
  EXPECT_OK(run(k, {view(av, {3, 2}), view(bv, {2})}, {view(y, {3, 2})}));
  EXPECT_EQ(y, (std::vector<float>{10, -2, 30, -4, 50, -6}));
  std::vector<float> y1(2);
  EXPECT_OK(run(k, {view(av, {1, 2}), view(bv, {2})}, {view(y1, {1, 2})}));
  EXPECT_EQ(y1, (std::vector<float>{10, -2}));
}

TEST(Reference, StridedOffsetInputAndOutput) {
  KernelBuilder kb("strided");
  Value x = kb.load("x", DType::kF32, {2, 3});
  kb.store("y", kb.binary(BinaryOp::kAdd, x, 0.5));
  BUILD_OR_FAIL(k, kb);
  // x[i][j] = storage[1 + 5*i + 2*j]: storage 0..11 gives rows {1,3,5} and {6,8,10}.
  std::vector<float> storage(12);
  for (int i = 0; i < 12; ++i) storage[i] = static_cast<float>(i);
  // y is written transposed (column-major) at offset 2 of a 9-element buffer.
  std::vector<float> y(9, -1);
  EXPECT_OK(run(k, {view(storage, {2, 3}, {5, 2}, 1)}, {view(y, {2, 3}, {1, 2}, 2)}));
  EXPECT_EQ(y, (std::vector<float>{-1, -1, 1.5, 6.5, 3.5, 8.5, 5.5, 10.5, -1}));
}

TEST(Reference, BroadcastInputWithZeroStride) {
  KernelBuilder kb("zero_stride");
  Value x = kb.load("x", DType::kI32, {2, 3});
  kb.store("y", kb.add(x, x));
  BUILD_OR_FAIL(k, kb);
  std::vector<int32_t> row = {1, 2, 3}, y(6);
  EXPECT_OK(run(k, {view(row, {2, 3}, {0, 1})}, {view(y, {2, 3})}));
  EXPECT_EQ(y, (std::vector<int32_t>{2, 4, 6, 2, 4, 6}));
}

TEST(Reference, ComparisonsGiveBoolBytes) {
  KernelBuilder kb("cmp");
  Value a = kb.load("a", DType::kF32, {4});
  Value b = kb.load("b", DType::kF32, {4});
  kb.store("lt", kb.binary(BinaryOp::kLt, a, b));
  kb.store("ne", kb.binary(BinaryOp::kNe, a, b));
  kb.store("and", kb.binary(BinaryOp::kLogicalAnd, a, b));
  BUILD_OR_FAIL(k, kb);
  std::vector<float> av = {1, 2, kNaN, 0}, bv = {2, 2, kNaN, 5};
  std::vector<uint8_t> lt(4, 7), ne(4, 7), land(4, 7);
  EXPECT_OK(
      run(k, {view(av, {4}), view(bv, {4})}, {view(lt, {4}), view(ne, {4}), view(land, {4})}));
  EXPECT_EQ(lt, (std::vector<uint8_t>{1, 0, 0, 1}));
  EXPECT_EQ(ne, (std::vector<uint8_t>{1, 0, 1, 1}));    // NaN != NaN
  EXPECT_EQ(land, (std::vector<uint8_t>{1, 1, 1, 0}));  // NaN is true
}

TEST(Reference, IntegerFloorDivAndRemainderRoundTowardNegativeInfinity) {
  KernelBuilder kb("intdiv");
  Value a = kb.load("a", DType::kI32, {6});
  Value b = kb.load("b", DType::kI32, {6});
  kb.store("q", kb.binary(BinaryOp::kFloorDiv, a, b));
  kb.store("r", kb.binary(BinaryOp::kRemainder, a, b));
  BUILD_OR_FAIL(k, kb);
  std::vector<int32_t> av = {7, -7, 7, -7, 0, 5}, bv = {2, 2, -2, -2, 3, 1}, q(6), r(6);
  EXPECT_OK(run(k, {view(av, {6}), view(bv, {6})}, {view(q, {6}), view(r, {6})}));
  EXPECT_EQ(q, (std::vector<int32_t>{3, -4, -4, 3, 0, 5}));
  EXPECT_EQ(r, (std::vector<int32_t>{1, 1, -1, -1, 0, 0}));
  // A zero divisor is an error (torch raises ZeroDivisionError), the outputs untouched.
  bv[5] = 0;
  std::vector<int32_t> q0(6, 9), r0(6, 9);
  const Status s = run(k, {view(av, {6}), view(bv, {6})}, {view(q0, {6}), view(r0, {6})});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("floordiv by zero"), std::string::npos) << s.to_string();
  EXPECT_EQ(q0, std::vector<int32_t>(6, 9));
}

// Only what the outputs depend on is computed, as on the VM (whose encoder drops dead
// nodes): a division by zero no output needs is no error. Found by fuzz/fuzz_kernel.cc.
TEST(Reference, DeadIntegerDivisionByZeroIsNoError) {
  KernelBuilder kb("dead_div");
  Value a = kb.load("a", DType::kI32, {3});
  Value b = kb.load("b", DType::kI32, {3});
  kb.binary(BinaryOp::kRemainder, a, b);  // dead
  kb.store("y", kb.binary(BinaryOp::kAdd, a, b));
  BUILD_OR_FAIL(k, kb);
  std::vector<int32_t> av = {1, 2, 3}, bv = {0, 1, 0}, y(3, 9), y_vm(3, 9);
  EXPECT_OK(run(k, {view(av, {3}), view(bv, {3})}, {view(y, {3})}));
  EXPECT_EQ(y, (std::vector<int32_t>{1, 3, 3}));
  auto ck = CompiledKernel::create(k);
  ASSERT_TRUE(ck.is_ok());
  std::vector<TensorArg> in = {view(av, {3}), view(bv, {3})}, out = {view(y_vm, {3})};
  EXPECT_OK((*ck)->run(in, out));
  EXPECT_EQ(y_vm, y);
}

TEST(Reference, PredicatesAndBoolInputs) {
  KernelBuilder kb("pred");
  Value x = kb.load("x", DType::kF32, {4});
  Value m = kb.load("m", DType::kBool, {3});
  kb.store("nan", kb.unary(UnaryOp::kIsNan, x));
  kb.store("fin", kb.unary(UnaryOp::kIsFinite, x));
  kb.store("not", kb.unary(UnaryOp::kLogicalNot, m));
  kb.store("int", kb.cast(m, DType::kI32));
  BUILD_OR_FAIL(k, kb);
  std::vector<float> xv = {1, kNaN, INFINITY, -0.0f};
  std::vector<uint8_t> mv = {0, 1, 2};  // any non-zero byte is true
  std::vector<uint8_t> isnan(4), fin(4), lnot(3);
  std::vector<int32_t> as_int(3);
  EXPECT_OK(run(k, {view(xv, {4}), view(mv, {3})},
                {view(isnan, {4}), view(fin, {4}), view(lnot, {3}), view(as_int, {3})}));
  EXPECT_EQ(isnan, (std::vector<uint8_t>{0, 1, 0, 0}));
  EXPECT_EQ(fin, (std::vector<uint8_t>{1, 0, 0, 1}));
  EXPECT_EQ(lnot, (std::vector<uint8_t>{1, 0, 0}));
  EXPECT_EQ(as_int, (std::vector<int32_t>{0, 1, 1}));
}

TEST(Reference, SelectBroadcastsConditionAndBranches) {
  KernelBuilder kb("select");
  Value c = kb.load("c", DType::kBool, {2, 1});
  Value a = kb.load("a", DType::kF32, {2, 3});
  kb.store("y", kb.select(c, a, kb.constant(-1)));
  BUILD_OR_FAIL(k, kb);
  std::vector<uint8_t> cv = {1, 0};
  std::vector<float> av = {1, 2, 3, 4, 5, 6}, y(6);
  EXPECT_OK(run(k, {view(cv, {2, 1}), view(av, {2, 3})}, {view(y, {2, 3})}));
  EXPECT_EQ(y, (std::vector<float>{1, 2, 3, -1, -1, -1}));
}

TEST(Reference, ParamsAndConstants) {
  KernelBuilder kb("params");
  Value x = kb.load("x", DType::kF32, {3});
  Value s = kb.param("s", DType::kF32);
  Value n = kb.param("n", DType::kI64);
  Value i = kb.load("i", DType::kI64, {3});
  kb.store("y", kb.add(kb.mul(x, s), kb.constant(0.25)));
  kb.store("z", kb.add(i, n));
  BUILD_OR_FAIL(k, kb);
  std::vector<float> xv = {1, 2, 3}, y(3);
  std::vector<int64_t> iv = {1, 2, 3}, z(3);
  EXPECT_OK(run(k, {view(xv, {3}), view(iv, {3})}, {view(y, {3}), view(z, {3})},
                {ScalarArg::of_float(2.5), ScalarArg::of_int(int64_t{1} << 40)}));
  EXPECT_EQ(y, (std::vector<float>{2.75f, 5.25f, 7.75f}));
  const int64_t big = int64_t{1} << 40;
  EXPECT_EQ(z, (std::vector<int64_t>{big + 1, big + 2, big + 3}));
}

TEST(Reference, CastsTruncateSaturateAndTestNonZero) {
  KernelBuilder kb("casts");
  Value x = kb.load("x", DType::kF32, {5});
  kb.store("i", kb.cast(x, DType::kI32));
  kb.store("b", kb.cast(x, DType::kBool));
  BUILD_OR_FAIL(k, kb);
  std::vector<float> xv = {1.7f, -1.7f, kNaN, 3e9f, -0.0f};
  std::vector<int32_t> i(5);
  std::vector<uint8_t> b(5);
  EXPECT_OK(run(k, {view(xv, {5})}, {view(i, {5}), view(b, {5})}));
  EXPECT_EQ(i, (std::vector<int32_t>{1, -1, 0, std::numeric_limits<int32_t>::max(), 0}));
  EXPECT_EQ(b, (std::vector<uint8_t>{1, 1, 1, 1, 0}));
}

// ---- f16 / bf16 ----------------------------------------------------------------------------

TEST(Reference, F16OutputRoundsToNearestEven) {
  KernelBuilder kb("to_f16");
  Value x = kb.load("x", DType::kF32, {6});
  kb.store("h", x, DType::kF16);
  kb.store("b", x, DType::kBF16);
  BUILD_OR_FAIL(k, kb);
  // 1 + 2^-11 is a tie between 1 and 1 + 2^-10 (goes to even 1.0); 1 + 3*2^-12 rounds up;
  // 65520 overflows f16 to inf; 2^-26 underflows to +0.
  std::vector<float> xv = {1.0f, 1.0f + 0x1p-11f, 1.0f + 0x3p-12f, 65520.0f, -2.0f, 0x1p-26f};
  std::vector<uint16_t> h(6), b(6);
  EXPECT_OK(run(k, {view(xv, {6})},
                {view(h, {6}, {}, 0, DType::kF16), view(b, {6}, {}, 0, DType::kBF16)}));
  EXPECT_EQ(h, (std::vector<uint16_t>{0x3C00, 0x3C00, 0x3C01, 0x7C00, 0xC000, 0x0000}));
  // bf16 keeps 8 mantissa bits: all of the small increments round back to 1.0.
  EXPECT_EQ(b, (std::vector<uint16_t>{0x3F80, 0x3F80, 0x3F80, 0x4780, 0xC000, 0x3280}));
}

TEST(Reference, F16InputComputesInF32) {
  KernelBuilder kb("f16_in");
  Value x = kb.load("x", DType::kF16, {3});
  kb.store("y", kb.binary(BinaryOp::kMul, x, 3.0), DType::kF32);
  BUILD_OR_FAIL(k, kb);
  // 1.0, -2.0, 1 + 2^-10: times 3 is 3 + 3*2^-10, exact in f32 but not in f16.
  std::vector<uint16_t> xv = {0x3C00, 0xC000, 0x3C01};
  std::vector<float> y(3);
  EXPECT_OK(run(k, {view(xv, {3}, {}, 0, DType::kF16)}, {view(y, {3})}));
  EXPECT_EQ(y, (std::vector<float>{3.0f, -6.0f, 3.0f + 0x3p-10f}));
}

// ---- Data movement -------------------------------------------------------------------------

TEST(Reference, PermuteMovesAxes) {
  KernelBuilder kb("permute");
  Value x = kb.load("x", DType::kI32, {2, 3, 4});
  kb.store("y", kb.permute(x, {2, 0, 1}));
  BUILD_OR_FAIL(k, kb);
  std::vector<int32_t> xv(24), y(24);
  for (int i = 0; i < 24; ++i) xv[i] = i;  // x[i][j][l] = 12i + 4j + l
  EXPECT_OK(run(k, {view(xv, {2, 3, 4})}, {view(y, {4, 2, 3})}));
  for (int l = 0; l < 4; ++l)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) EXPECT_EQ(y[l * 6 + i * 3 + j], 12 * i + 4 * j + l);
}

TEST(Reference, TransposeThenReshapeReadsRowMajor) {
  KernelBuilder kb("t_reshape");
  Value x = kb.load("x", DType::kF32, {2, 3});
  kb.store("y", kb.reshape(kb.transpose(x, 0, 1), {-1}));
  kb.store("z", kb.reshape(x, {3, 2}));
  BUILD_OR_FAIL(k, kb);
  std::vector<float> xv = {0, 1, 2, 3, 4, 5}, y(6), z(6);
  EXPECT_OK(run(k, {view(xv, {2, 3})}, {view(y, {6}), view(z, {3, 2})}));
  EXPECT_EQ(y, (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(z, xv);
}

TEST(Reference, SliceWithStepAndNegativeBounds) {
  KernelBuilder kb("slice");
  Value x = kb.load("x", DType::kI64, {10});
  Value m = kb.load("m", DType::kI64, {4, 3});
  kb.store("a", kb.slice(x, 0, -7, kSliceEnd, 3));  // indices 3, 6, 9
  kb.store("b", kb.slice(x, 0, -100, -2, 4));       // start clamps to 0: 0, 4
  kb.store("c", kb.slice(m, 0, 1, -1));             // rows 1, 2
  kb.store("d", kb.slice(m, -1, 1, kSliceEnd, 5));  // column 1
  BUILD_OR_FAIL(k, kb);
  std::vector<int64_t> xv(10), mv(12), a(3), b(2), c(6), d(4);
  for (int i = 0; i < 10; ++i) xv[i] = 100 + i;
  for (int i = 0; i < 12; ++i) mv[i] = i;
  EXPECT_OK(run(k, {view(xv, {10}), view(mv, {4, 3})},
                {view(a, {3}), view(b, {2}), view(c, {2, 3}), view(d, {4, 1})}));
  EXPECT_EQ(a, (std::vector<int64_t>{103, 106, 109}));
  EXPECT_EQ(b, (std::vector<int64_t>{100, 104}));
  EXPECT_EQ(c, (std::vector<int64_t>{3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(d, (std::vector<int64_t>{1, 4, 7, 10}));
}

TEST(Reference, SliceOfSymbolicDim) {
  KernelBuilder kb("slice_sym");
  Dim n = kb.symbol("N");
  Value x = kb.load("x", DType::kF32, {n});
  kb.store("y", kb.slice(x, 0, -3, kSliceEnd, 2));
  BUILD_OR_FAIL(k, kb);
  std::vector<float> xv = {0, 1, 2, 3, 4}, y(2);
  EXPECT_OK(run(k, {view(xv, {5})}, {view(y, {2})}));
  EXPECT_EQ(y, (std::vector<float>{2, 4}));
  std::vector<float> y1(1);  // N = 2: start clamps to 0, one element
  EXPECT_OK(run(k, {view(xv, {2})}, {view(y1, {1})}));
  EXPECT_EQ(y1, (std::vector<float>{0}));
}

TEST(Reference, ConcatAlongEachAxis) {
  KernelBuilder kb("concat");
  Value a = kb.load("a", DType::kI32, {2, 1});
  Value b = kb.load("b", DType::kI32, {2, 2});
  kb.store("cols", kb.concat({a, b}, 1));
  kb.store("rows", kb.concat({b, kb.transpose(b, 0, 1)}, 0));
  BUILD_OR_FAIL(k, kb);
  std::vector<int32_t> av = {1, 2}, bv = {3, 4, 5, 6}, cols(6), rows(8);
  EXPECT_OK(run(k, {view(av, {2, 1}), view(bv, {2, 2})}, {view(cols, {2, 3}), view(rows, {4, 2})}));
  EXPECT_EQ(cols, (std::vector<int32_t>{1, 3, 4, 2, 5, 6}));
  EXPECT_EQ(rows, (std::vector<int32_t>{3, 4, 5, 6, 3, 5, 4, 6}));
}

TEST(Reference, ExplicitBroadcast) {
  KernelBuilder kb("bcast");
  Value x = kb.load("x", DType::kF32, {3, 1});
  kb.store("y", kb.broadcast(x, {2, 3, 2}));
  BUILD_OR_FAIL(k, kb);
  std::vector<float> xv = {1, 2, 3}, y(12);
  EXPECT_OK(run(k, {view(xv, {3, 1})}, {view(y, {2, 3, 2})}));
  EXPECT_EQ(y, (std::vector<float>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
}

// ---- Reductions ----------------------------------------------------------------------------

struct ReduceCase {
  ReduceOp op;
  int axis;
  bool keepdims;
  std::vector<int64_t> out_shape;
  std::vector<double> expected;
};

// x = [[1, 5, 3], [4, 2, 6]]
const ReduceCase kReduceCases[] = {
    {ReduceOp::kSum, 0, false, {3}, {5, 7, 9}},
    {ReduceOp::kSum, 1, false, {2}, {9, 12}},
    {ReduceOp::kSum, 0, true, {1, 3}, {5, 7, 9}},
    {ReduceOp::kSum, -1, true, {2, 1}, {9, 12}},
    {ReduceOp::kMean, 0, false, {3}, {2.5, 3.5, 4.5}},
    {ReduceOp::kMean, 1, true, {2, 1}, {3, 4}},
    {ReduceOp::kMax, 0, false, {3}, {4, 5, 6}},
    {ReduceOp::kMax, 1, true, {2, 1}, {5, 6}},
    {ReduceOp::kMin, 1, false, {2}, {1, 2}},
    {ReduceOp::kProd, 0, false, {3}, {4, 10, 18}},
    {ReduceOp::kArgMax, 0, false, {3}, {1, 0, 1}},
    {ReduceOp::kArgMax, 1, true, {2, 1}, {1, 2}},
    {ReduceOp::kArgMin, 1, false, {2}, {0, 1}},
};

TEST(Reference, ReduceEachAxisWithAndWithoutKeepdims) {
  for (const ReduceCase& c : kReduceCases) {
    SCOPED_TRACE(std::string(reduce_op_name(c.op)) + " axis " + std::to_string(c.axis) +
                 (c.keepdims ? " keepdims" : ""));
    KernelBuilder kb("reduce");
    Value x = kb.load("x", DType::kF32, {2, 3});
    Value r = kb.reduce(c.op, x, {c.axis}, c.keepdims);
    kb.store("y", kb.cast(r, DType::kF32));
    BUILD_OR_FAIL(k, kb);
    std::vector<float> xv = {1, 5, 3, 4, 2, 6}, y(c.expected.size(), -1);
    EXPECT_OK(run(k, {view(xv, {2, 3})}, {view(y, c.out_shape)}));
    for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], c.expected[i]) << "element " << i;
  }
}

TEST(Reference, ReduceOverSeveralAxesAndAll) {
  KernelBuilder kb("reduce_multi");
  Value x = kb.load("x", DType::kI32, {2, 2, 2});
  kb.store("outer", kb.sum(x, {0, 2}));
  kb.store("all", kb.sum(x, {}, true));
  BUILD_OR_FAIL(k, kb);
  std::vector<int32_t> xv = {0, 1, 2, 3, 4, 5, 6, 7}, outer(2), all(1);
  EXPECT_OK(run(k, {view(xv, {2, 2, 2})}, {view(outer, {2}), view(all, {1, 1, 1})}));
  EXPECT_EQ(outer, (std::vector<int32_t>{10, 18}));  // {0,1,4,5} and {2,3,6,7}
  EXPECT_EQ(all, (std::vector<int32_t>{28}));
}

TEST(Reference, FloatSumAccumulatesInDouble) {
  KernelBuilder kb("sum_exact");
  Value x = kb.load("x", DType::kF32, {3});
  kb.store("y", kb.sum(x, {0}));
  BUILD_OR_FAIL(k, kb);
  std::vector<float> xv = {1e8f, 1.0f, -1e8f}, y(1);  // f32 accumulation would give 0
  EXPECT_OK(run(k, {view(xv, {3})}, {view(y, {})}));
  EXPECT_EQ(y[0], 1.0f);
}

TEST(Reference, IntegerSumWraps) {
  KernelBuilder kb("sum_wrap");
  Value x = kb.load("x", DType::kI32, {2});
  kb.store("y", kb.sum(x, {0}));
  BUILD_OR_FAIL(k, kb);
  std::vector<int32_t> xv = {std::numeric_limits<int32_t>::max(), 1}, y(1);
  EXPECT_OK(run(k, {view(xv, {2})}, {view(y, {})}));
  EXPECT_EQ(y[0], std::numeric_limits<int32_t>::min());
}

TEST(Reference, MaxAndArgReductionsTreatNaNAsExtreme) {
  KernelBuilder kb("nan_reduce");
  Value x = kb.load("x", DType::kF32, {6});
  kb.store("max", kb.max(x, {0}));
  kb.store("argmax", kb.reduce(ReduceOp::kArgMax, x, {0}));
  kb.store("argmin", kb.reduce(ReduceOp::kArgMin, x, {0}));
  BUILD_OR_FAIL(k, kb);
  std::vector<float> xv = {1, 9, kNaN, 3, kNaN, 9}, mx(1);
  std::vector<int64_t> amax(1), amin(1);
  EXPECT_OK(run(k, {view(xv, {6})}, {view(mx, {}), view(amax, {}), view(amin, {})}));
  EXPECT_TRUE(std::isnan(mx[0]));
  EXPECT_EQ(amax[0], 2);  // the first NaN wins
  EXPECT_EQ(amin[0], 2);
}

TEST(Reference, ArgMaxTiesKeepFirstIndex) {
  KernelBuilder kb("argmax_tie");
  Value x = kb.load("x", DType::kI64, {2, 3});
  kb.store("y", kb.reduce(ReduceOp::kArgMax, x, {1}));
  BUILD_OR_FAIL(k, kb);
  std::vector<int64_t> xv = {2, 7, 7, 5, 5, 5}, y(2);
  EXPECT_OK(run(k, {view(xv, {2, 3})}, {view(y, {2})}));
  EXPECT_EQ(y, (std::vector<int64_t>{1, 0}));
}

TEST(Reference, ReduceOfScalarIsIdentity) {
  KernelBuilder kb("reduce_scalar");
  Value p = kb.param("p", DType::kF32);
  kb.store("sum", kb.sum(p, {}));
  kb.store("arg", kb.reduce(ReduceOp::kArgMax, kb.reshape(p, {1}), {0}));
  BUILD_OR_FAIL(k, kb);
  std::vector<float> sum(1);
  std::vector<int64_t> arg(1, -1);
  EXPECT_OK(run(k, {}, {view(sum, {}), view(arg, {})}, {ScalarArg::of_float(-3.5)}));
  EXPECT_EQ(sum[0], -3.5f);
  EXPECT_EQ(arg[0], 0);
}

// ---- Empty tensors -------------------------------------------------------------------------

TEST(Reference, EmptyTensorsComputeNothingAndReduceToIdentities) {
  KernelBuilder kb("empty");
  Dim n = kb.symbol("N");
  Value x = kb.load("x", DType::kF32, {n, 3});
  Value b = kb.load("b", DType::kF32, {3});
  kb.store("y", kb.add(x, b));
  kb.store("sum", kb.sum(x, {0}));
  kb.store("mean", kb.mean(x, {0}));
  kb.store("prod", kb.reduce(ReduceOp::kProd, x, {0}));
  kb.store("s", kb.slice(b, 0, 2, 1));
  BUILD_OR_FAIL(k, kb);
  std::vector<float> xv, bv = {1, 2, 3}, y, sum(3, -1), mean(3, -1), prod(3, -1), s;
  EXPECT_OK(run(k, {view(xv, {0, 3}), view(bv, {3})},
                {view(y, {0, 3}), view(sum, {3}), view(mean, {3}), view(prod, {3}), view(s, {0})}));
  EXPECT_EQ(sum, (std::vector<float>{0, 0, 0}));
  for (float m : mean) EXPECT_TRUE(std::isnan(m));  // 0 / 0
  EXPECT_EQ(prod, (std::vector<float>{1, 1, 1}));
}

TEST(Reference, MaxOverEmptyAxisIsAnError) {
  KernelBuilder kb("empty_max");
  Dim n = kb.symbol("N");
  Value x = kb.load("x", DType::kF32, {n, 2});
  kb.store("y", kb.max(x, {0}));
  BUILD_OR_FAIL(k, kb);
  std::vector<float> xv, y(2, -1);
  Status s = run(k, {view(xv, {0, 2})}, {view(y, {2})});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("max"), std::string::npos) << s.message();
  EXPECT_EQ(y, (std::vector<float>{-1, -1}));
}

// ---- Errors --------------------------------------------------------------------------------

TEST(Reference, WrongInputShapeIsAnErrorAndWritesNothing) {
  KernelBuilder kb("bad_shape");
  Value x = kb.load("x", DType::kF32, {2, 3});
  kb.store("y", kb.unary(UnaryOp::kNeg, x));
  BUILD_OR_FAIL(k, kb);
  std::vector<float> xv(8, 1), y(6, 7);
  Status s = run(k, {view(xv, {2, 4})}, {view(y, {2, 3})});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("'x'"), std::string::npos) << s.message();
  EXPECT_EQ(y, std::vector<float>(6, 7));
}

TEST(Reference, WrongDtypeAndOutputShapeAreErrors) {
  KernelBuilder kb("bad_args");
  Value x = kb.load("x", DType::kF32, {2});
  kb.store("y", kb.unary(UnaryOp::kAbs, x));
  BUILD_OR_FAIL(k, kb);
  std::vector<int32_t> xi(2);
  std::vector<float> xv(2), y(3, 7);
  EXPECT_EQ(run(k, {view(xi, {2})}, {view(y, {2})}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(run(k, {view(xv, {2})}, {view(y, {3})}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(y, std::vector<float>(3, 7));
}

// ---- evaluate_reference --------------------------------------------------------------------

TEST(Reference, EvaluateReferenceExposesEveryNode) {
  KernelBuilder kb("values");
  Value x = kb.load("x", DType::kI32, {2});
  Value d = kb.div(x, kb.constant(2, DType::kI32));  // true division: cast to f32 first
  kb.store("y", d);
  BUILD_OR_FAIL(k, kb);
  std::vector<int32_t> xv = {3, -5};
  std::vector<TensorArg> in = {view(xv, {2})};
  ir::Binding binding;
  ASSERT_TRUE(ir::bind_shapes(k.def(), in, &binding).is_ok());
  std::vector<ir::RefValue> values;
  EXPECT_OK(ir::evaluate_reference(k.def(), binding, in, {}, &values));
  ASSERT_EQ(values.size(), k.def().nodes.size());
  const ir::RefValue& out = values[k.def().outputs[0].node];
  EXPECT_EQ(out.ctype(), CType::kF32);
  EXPECT_EQ(out.shape.rank, 1);
  EXPECT_EQ(out.f32(), (std::vector<float>{1.5f, -2.5f}));
  EXPECT_EQ(values[0].i32(), xv);
  EXPECT_EQ(values[0].as_double(1), -5.0);
}

}  // namespace
}  // namespace dvm
