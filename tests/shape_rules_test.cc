// The shared shape rules (src/shape/shape_rules.h): one rule set over exact dims (kernel bind,
// lazy runtime), symbolic dims (graph IR) and builder dims (a constant or an unbound symbol).
// The central property: a rule applied to symbolic dims and then evaluated at a binding gives
// what the same rule gives on the evaluated dims.
#include "shape/shape_rules.h"

#include <gtest/gtest.h>

#include <random>

namespace dvm::shape {
namespace {

using IShape = std::vector<int64_t>;
using SShape = std::vector<SymExpr>;

IShape eval(const SShape& s, const SymBindings& b) {
  IShape r;
  for (const SymExpr& d : s) r.push_back(d.evaluate(b).value());
  return r;
}

// Operands for infer_op over plain vectors.
template <class D>
struct Vec {
  std::vector<std::vector<D>> shapes;
  std::vector<DType> dtypes;
  size_t size() const { return shapes.size(); }
  const std::vector<D>& shape(size_t i) const { return shapes[i]; }
  DType dtype(size_t i) const { return dtypes[i]; }
};

struct Sym {
  SymExpr s = SymExpr::symbol("s", {1, 64});
  SymExpr t = SymExpr::symbol("t", {1, 64});
};

TEST(ShapeRules, BroadcastRefusesOrDefersWhatItCannotProve) {
  Sym y;
  SShape out;
  // Provably equal symbolic dims and 1s broadcast; s against t cannot be proved.
  SShape a{y.s, SymExpr(1), SymExpr(4)}, b{SymExpr(3), y.s * SymExpr(1), SymExpr(4)};
  EXPECT_EQ(broadcast_dims(std::span<const SymExpr>(a), std::span<const SymExpr>(b), &out,
                           Unproven::kFail),
            0);  // s vs 3
  SShape c{y.s, SymExpr(4)}, d{SymExpr(1), SymExpr(4)};
  ASSERT_EQ(broadcast_dims(std::span<const SymExpr>(c), std::span<const SymExpr>(d), &out,
                           Unproven::kFail),
            -1);
  EXPECT_EQ(out, (SShape{y.s, SymExpr(4)}));
  // The builder's dims: a constant wins over a symbol, checked when bound; constants that
  // differ fail at once.
  std::vector<Dim> da{Dim::symbol(0), Dim(5)}, db{Dim(7), Dim(5)}, dout;
  ASSERT_EQ(
      broadcast_dims(std::span<const Dim>(da), std::span<const Dim>(db), &dout, Unproven::kDefer),
      -1);
  EXPECT_EQ(dout, (std::vector<Dim>{Dim(7), Dim(5)}));
  std::vector<Dim> dc{Dim(6)};
  EXPECT_EQ(
      broadcast_dims(std::span<const Dim>(da), std::span<const Dim>(dc), &dout, Unproven::kDefer),
      1);
  // Exact dims, into a container that aliases an input.
  IShape x{2, 1, 3}, z{4, 1};
  ASSERT_EQ(
      broadcast_dims(std::span<const int64_t>(x), std::span<const int64_t>(z), &x, Unproven::kFail),
      -1);
  EXPECT_EQ(x, (IShape{2, 4, 3}));
}

TEST(ShapeRules, ReshapeTargets) {
  IShape t{-1, 6};
  EXPECT_EQ(resolve_reshape<int64_t>(24, std::span<int64_t>(t)), ReshapeError::kNone);
  EXPECT_EQ(t, (IShape{4, 6}));
  t = {-1, -1};
  EXPECT_EQ(resolve_reshape<int64_t>(24, std::span<int64_t>(t)), ReshapeError::kSeveralInferred);
  t = {-2, 12};
  EXPECT_EQ(resolve_reshape<int64_t>(24, std::span<int64_t>(t)), ReshapeError::kNegativeDim);
  t = {-1, 5};
  EXPECT_EQ(resolve_reshape<int64_t>(24, std::span<int64_t>(t)), ReshapeError::kCannotInfer);
  t = {-1, 0};
  EXPECT_EQ(resolve_reshape<int64_t>(0, std::span<int64_t>(t)), ReshapeError::kCannotInfer);
  t = {5, 5};
  EXPECT_EQ(resolve_reshape<int64_t>(24, std::span<int64_t>(t)), ReshapeError::kSizeDiffers);
  t = {int64_t{1} << 40, int64_t{1} << 40, -1};  // the product overflows int64
  EXPECT_EQ(resolve_reshape<int64_t>(8, std::span<int64_t>(t)), ReshapeError::kSizeDiffers);
  // Symbolic: [s, 4, 6] -> [-1, 6] infers s*4; -> [-1, 5] cannot be proved.
  Sym y;
  SShape st{SymExpr(-1), SymExpr(6)};
  SymExpr total = y.s * SymExpr(24);
  EXPECT_EQ(resolve_reshape(total, std::span<SymExpr>(st)), ReshapeError::kNone);
  EXPECT_EQ(st[0], y.s * SymExpr(4));
  st = {SymExpr(-1), SymExpr(5)};
  EXPECT_EQ(resolve_reshape(total, std::span<SymExpr>(st)), ReshapeError::kCannotInfer);
}

TEST(ShapeRules, SliceBoundsArePythonsAndNeverOverflow) {
  struct Case {
    int64_t dim, start, stop, step, want_start, want_extent;
  };
  const Case cases[] = {
      {10, 2, 8, 3, 2, 2},
      {10, -3, kSliceEnd, 1, 7, 3},
      {10, -30, 30, 1, 0, 10},
      {10, 8, 2, 1, 8, 0},
      {10, 0, 10, INT64_MAX, 0, 1},
      {0, 0, kSliceEnd, 1, 0, 0},
      {10, kSymMax, kSliceEnd, 2, 10, 0},
  };
  for (const Case& c : cases) {
    SliceDims<int64_t> s = slice_dims(c.dim, c.start, c.stop, c.step);
    EXPECT_EQ(s.start, c.want_start) << c.dim << " " << c.start << ":" << c.stop << ":" << c.step;
    EXPECT_EQ(s.extent, c.want_extent) << c.dim << " " << c.start << ":" << c.stop << ":" << c.step;
  }
}

TEST(ShapeRules, AxesAndPermutations) {
  std::vector<int64_t> axes{-1, 0, 2, 0};
  ASSERT_TRUE(normalize_axes(&axes, 3));
  EXPECT_EQ(axes, (std::vector<int64_t>{0, 2}));
  axes = {3};
  EXPECT_FALSE(normalize_axes(&axes, 3));
  axes = {int64_t{1} << 33};  // not an int: out of range, not truncated to 0
  EXPECT_FALSE(normalize_axes(&axes, 3));
  std::vector<int> perm{-1, 0, 1};
  ASSERT_TRUE(normalize_permutation(std::span<int>(perm), 3));
  EXPECT_EQ(perm, (std::vector<int>{2, 0, 1}));
  perm = {0, 0, 1};
  EXPECT_FALSE(normalize_permutation(std::span<int>(perm), 3));
  perm = {0, 1};
  EXPECT_FALSE(normalize_permutation(std::span<int>(perm), 3));
}

TEST(ShapeRules, ReductionDtypes) {
  using ops::reduce_compute_dtype;
  using ops::reduce_result_dtype;
  EXPECT_EQ(reduce_result_dtype(ReduceOp::kSum, DType::kBool), DType::kI64);
  EXPECT_EQ(reduce_result_dtype(ReduceOp::kMax, DType::kBool), DType::kBool);
  EXPECT_EQ(reduce_compute_dtype(ReduceOp::kMax, DType::kBool), DType::kI32);
  EXPECT_EQ(reduce_result_dtype(ReduceOp::kMean, DType::kI32), DType::kF32);
  EXPECT_EQ(reduce_result_dtype(ReduceOp::kMean, DType::kBF16), DType::kBF16);
  EXPECT_EQ(reduce_result_dtype(ReduceOp::kArgMax, DType::kF16), DType::kI64);
  EXPECT_EQ(reduce_compute_dtype(ReduceOp::kArgMin, DType::kBool), DType::kBool);
  EXPECT_FALSE(ops::reduces_empty(ReduceOp::kMax));
  EXPECT_TRUE(ops::reduces_empty(ReduceOp::kProd));
}

// 0-d sources: a graph op's axis 0 is valid for rank 0, so the rules must not index the
// source's dims behind it (these read out of bounds before the rules were shared).
TEST(ShapeRules, ZeroDimSourcesAreRefusedNotIndexed) {
  int axis = 0;
  std::vector<int64_t> ints{1};
  IShape bounds{0, 1};
  IShape shape;
  DType dtype;
  Vec<int64_t> scalar{{{}}, {DType::kF32}};
  OpSite<int64_t> slice{GraphOp::kSlice, 0, &axis, false, &ints, &bounds, DType::kF32};
  EXPECT_FALSE(infer_op(scalar, slice, &shape, &dtype).is_ok());
  OpSite<int64_t> concat{GraphOp::kConcat, 0, &axis, false, &ints, &bounds, DType::kF32};
  EXPECT_FALSE(infer_op(scalar, concat, &shape, &dtype).is_ok());
  Vec<int64_t> indexed{{{}, {1}}, {DType::kF32, DType::kI64}};
  OpSite<int64_t> select{GraphOp::kIndexSelect, 0, &axis, false, &ints, &bounds, DType::kF32};
  EXPECT_FALSE(infer_op(indexed, select, &shape, &dtype).is_ok());
  // Reducing a 0-d value: its one axis (0 or -1) or none, nothing left to reduce over (the
  // kernel builder refuses axis 0 of a rank-0 value); any other axis is an error.
  for (std::vector<int64_t> red : {std::vector<int64_t>{}, {0}, {-1}}) {
    OpSite<int64_t> sum{
        GraphOp::kReduce, static_cast<int>(ReduceOp::kSum), &axis, false, &red, &bounds,
        DType::kF32};
    ASSERT_TRUE(infer_op(scalar, sum, &shape, &dtype).is_ok());
    EXPECT_TRUE(red.empty());
    EXPECT_TRUE(shape.empty());
  }
  std::vector<int64_t> bad{1};
  OpSite<int64_t> sum1{
      GraphOp::kReduce, static_cast<int>(ReduceOp::kSum), &axis, false, &bad, &bounds, DType::kF32};
  EXPECT_FALSE(infer_op(scalar, sum1, &shape, &dtype).is_ok());
  // A -1 in a new leading dim of an expand has nothing to keep.
  IShape target{-1, 3};
  Vec<int64_t> row{{{3}}, {DType::kF32}};
  OpSite<int64_t> expand{GraphOp::kBroadcast, 0, &axis, false, &ints, &target, DType::kF32};
  EXPECT_FALSE(infer_op(row, expand, &shape, &dtype).is_ok());
}

TEST(ShapeRules, GroupedQueryAttention) {
  Vec<int64_t> qkv{{{2, 8, 5, 16}, {2, 2, 7, 16}, {2, 2, 7, 32}},
                   {DType::kF16, DType::kF16, DType::kF16}};
  int axis = 0;
  std::vector<int64_t> ints;
  IShape dims;
  OpSite<int64_t> att{GraphOp::kAttention, 0, &axis, false, &ints, &dims, DType::kF32};
  IShape shape;
  DType dtype;
  ASSERT_TRUE(infer_op(qkv, att, &shape, &dtype).is_ok());
  EXPECT_EQ(shape, (IShape{2, 8, 5, 32}));
  EXPECT_EQ(dtype, DType::kF16);
  qkv.shapes[1][1] = qkv.shapes[2][1] = 3;  // 8 heads over 3 k/v heads
  EXPECT_FALSE(infer_op(qkv, att, &shape, &dtype).is_ok());
}

// Random ops over shapes with symbolic dims: infer_op on SymExpr, evaluated at random
// bindings, equals infer_op on the evaluated int64 dims (the graph IR and the lazy runtime
// agree); where the symbolic rule refuses, nothing is claimed for the exact one.
class Agreement {
 public:
  explicit Agreement(uint32_t seed) : rng_(seed) {}

  void run(int ops) {
    for (int i = 0; i < ops; ++i) one();
    EXPECT_GT(checked_, ops / 4) << "too few random ops were valid to compare";
  }

 private:
  int64_t pick(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

  SymExpr dim() {
    switch (pick(0, 3)) {
      case 0:
        return s_;
      case 1:
        return s_ * SymExpr(2);
      case 2:
        return SymExpr(1);
      default:
        return SymExpr(pick(2, 5));
    }
  }
  SShape shape(int rank) {
    SShape r;
    for (int i = 0; i < rank; ++i) r.push_back(dim());
    return r;
  }

  void one() {
    const int rank = static_cast<int>(pick(1, 4));
    SShape x = shape(rank);
    Vec<SymExpr> in{{x}, {DType::kF32}};
    OpSite<SymExpr> site;
    int axis = static_cast<int>(pick(-rank, rank - 1));
    std::vector<int64_t> ints;
    SShape dims;
    site.axis = &axis;
    site.ints = &ints;
    site.dims = &dims;
    switch (pick(0, 6)) {
      case 0: {  // binary with a broadcast operand
        site.op = GraphOp::kBinary;
        site.sub = static_cast<int>(BinaryOp::kAdd);
        SShape y = x;
        for (SymExpr& d : y)
          if (pick(0, 2) == 0) d = SymExpr(1);
        y.erase(y.begin(), y.begin() + pick(0, rank - 1));
        in.shapes.push_back(y);
        in.dtypes.push_back(DType::kI32);
        break;
      }
      case 1: {  // reshape to a merge of the last two dims, or the whole as -1
        site.op = GraphOp::kReshape;
        dims = x;
        if (rank >= 2 && pick(0, 1)) {
          dims[rank - 2] = dims[rank - 2] * dims[rank - 1];
          dims.pop_back();
        }
        dims[pick(0, static_cast<int64_t>(dims.size()) - 1)] = SymExpr(-1);
        break;
      }
      case 2: {  // slice with any bounds and step
        site.op = GraphOp::kSlice;
        dims = {SymExpr(pick(-6, 6)), pick(0, 3) == 0 ? SymExpr(kSliceEnd) : SymExpr(pick(-6, 6))};
        ints = {pick(1, 3)};
        break;
      }
      case 3: {  // reduce over some axes
        site.op = GraphOp::kReduce;
        site.sub = static_cast<int>(pick(0, 1) ? ReduceOp::kSum : ReduceOp::kArgMax);
        site.flag = pick(0, 1);
        ints = {static_cast<int64_t>(axis)};
        if (pick(0, 1)) ints.push_back(pick(0, rank - 1));
        break;
      }
      case 4: {  // concat with itself along an axis
        site.op = GraphOp::kConcat;
        in.shapes.push_back(x);
        in.dtypes.push_back(DType::kF16);
        break;
      }
      case 5: {  // matmul [.., m, k] x [k, n]
        site.op = GraphOp::kMatMul;
        x.push_back(s_);
        in.shapes[0] = x;
        in.shapes.push_back(SShape{s_, dim()});
        in.dtypes.push_back(DType::kF32);
        ints = {0, 0};
        break;
      }
      default: {  // permute
        site.op = GraphOp::kPermute;
        for (int i = 0; i < rank; ++i) ints.push_back(i - (pick(0, 1) ? rank : 0));
        std::shuffle(ints.begin(), ints.end(), rng_);
        break;
      }
    }
    compare(in, site, axis, ints, dims);
  }

  void compare(const Vec<SymExpr>& in, OpSite<SymExpr> site, int axis, std::vector<int64_t> ints,
               SShape dims) {
    // The int64 twin gets the attributes as they were before normalisation.
    int iaxis = axis;
    std::vector<int64_t> iints = ints;
    SShape sdims = dims;
    SShape sshape;
    DType sdtype;
    Status st = infer_op(in, site, &sshape, &sdtype);
    if (!st.is_ok()) return;
    for (int trial = 0; trial < 3; ++trial) {
      SymBindings b{{"r", pick(1, 9)}};
      Vec<int64_t> iin;
      for (size_t i = 0; i < in.size(); ++i) iin.shapes.push_back(eval(in.shapes[i], b));
      iin.dtypes = in.dtypes;
      int a = iaxis;
      std::vector<int64_t> is = iints;
      IShape idims = eval(sdims, b);
      OpSite<int64_t> isite{site.op, site.sub, &a, site.flag, &is, &idims, site.attr_dtype};
      IShape ishape;
      DType idtype;
      Status ist = infer_op(iin, isite, &ishape, &idtype);
      ASSERT_TRUE(ist.is_ok()) << graph_op_name(site.op) << ": " << ist.to_string();
      EXPECT_EQ(ishape, eval(sshape, b)) << graph_op_name(site.op) << " " << shape_text(sshape);
      EXPECT_EQ(idtype, sdtype);
      ++checked_;
    }
  }

  std::mt19937 rng_;
  SymExpr s_ = SymExpr::symbol("r", {1, 9});
  int checked_ = 0;
};

TEST(ShapeRules, SymbolicAndExactRulesAgree) {
  for (uint32_t seed = 1; seed <= 20; ++seed) Agreement(seed).run(200);
}

}  // namespace
}  // namespace dvm::shape
