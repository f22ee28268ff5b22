// Random kernels: DAGs over every op of ops.def (unary, arithmetic, comparison and logical
// binary ops, select), casts between all dtypes, broadcasts, permutes, slices, reshapes,
// concats, reductions (sum, mean, max, min, prod, argmax, argmin) and matmuls, with symbolic
// dims. Each kernel runs on the VM at 1 and 2 threads and on the reference for several
// bindings, some past the tile, strip and split limits (1031 and 4099 columns, reductions over
// 300K elements that do not divide into the parts), into contiguous, strided, transposed and
// offset outputs.
//
// Tolerances are derived, not guessed: every value carries a bound on its magnitude and on the
// absolute error the VM may have accumulated against the reference (which computes in
// double), propagated op by op (Lipschitz bound times the operands' error, plus the op's own
// rounding; reductions add eps * sqrt(n) of their terms). Comparisons only ever look at exact
// values (loads, integers), so no rounding can flip them. A failure prints the kernel and the
// bytecode. DVM_RANDOM_KERNELS=N runs N kernels instead of the default.
#include <cstdlib>

#include "vm_test_util.h"

namespace dvm::testing {
namespace {

constexpr double kEps = 1.2e-7;  // f32 machine epsilon (rounded up)

// A value of the kernel under construction with its magnitude and error bounds.
struct V {
  Value v;
  double mag = 0;      // |value| <= mag
  double err = 0;      // |vm - reference| <= err
  bool exact = false;  // no rounding has happened (safe to compare or cast to an integer)
  DType dtype = DType::kF32;
};

struct Gen {
  std::mt19937 rng;
  KernelBuilder kb;
  Dim S, H;
  std::vector<V> vals;  // f32 values of shape [S, H]
  V x;                  // the f32 input (exact, |x| <= 2)
  V w;                  // [H, H] matmul weight
  V xi;                 // [S, H] i32 input
  V m;                  // [S, H] bool input
  int64_t max_h = 1;    // largest H of the bindings (bounds of reductions over H)
  int64_t max_s = 1;
  bool large = false;  // meets the large bindings

  explicit Gen(uint32_t seed) : rng(seed), kb("random" + std::to_string(seed)) {
    S = kb.symbol("S");
    H = kb.symbol("H");
  }
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); }
  const V& any() { return vals[pick(static_cast<int>(vals.size()))]; }

  // tanh(v): in [-1, 1], 1-Lipschitz; the domain every unary op is applied on.
  V bounded(const V& a) { return V{kb.unary(UnaryOp::kTanh, a.v), 1.0, a.err + 2 * kEps, false}; }

  V unary_step() {
    static std::vector<UnaryOp> ops;
    if (ops.empty()) {
#define DVM_UNARY(Name, mnemonic, kind) ops.push_back(UnaryOp::k##Name);
#include "dvm/ops.def"
    }
    UnaryOp op = ops[pick(static_cast<int>(ops.size()))];
    V t = bounded(any());
    // Ops whose domain excludes [-1, 1] or that are not continuous there read |t| + 0.5.
    switch (op) {
      case UnaryOp::kLog:
      case UnaryOp::kLog1p:
      case UnaryOp::kSqrt:
      case UnaryOp::kRsqrt:
      case UnaryOp::kReciprocal:
        t = V{kb.binary(BinaryOp::kAdd, kb.unary(UnaryOp::kAbs, t.v), 0.5), 1.5, t.err + 2 * kEps};
        break;
      case UnaryOp::kFloor:
      case UnaryOp::kCeil:
      case UnaryOp::kRound:
      case UnaryOp::kTrunc:
      case UnaryOp::kSign:
      case UnaryOp::kIsFinite:
      case UnaryOp::kIsNan:
      case UnaryOp::kLogicalNot:
        // Discontinuous: applied to an exact value only (the raw input), never to a rounded one.
        t = x;
        break;
      default:
        break;
    }
    Value r = kb.unary(op, t.v);
    if (kb.dtype(r) != DType::kF32) r = kb.cast(r, DType::kF32);
    // On the domains above every op is 4-Lipschitz with |result| <= 4.5 (exp(1) = 2.72,
    // 1/0.5 = 2, rsqrt(0.5) = 1.42, |x| + 2 for the exact ones); its own error a few ulp.
    double mag = t.exact ? 4.5 : 3.0;
    return V{r, mag, 4 * t.err + 16 * kEps * mag, t.exact && op != UnaryOp::kExp};
  }

  V binary_step() {
    const V& a = any();
    const V& b = any();
    switch (pick(7)) {
      case 6: {  // (|tanh a| + 0.5) ^ tanh b, in [2/3, 2]
        V ta = bounded(a), tb = bounded(b);
        Value base = kb.binary(BinaryOp::kAdd, kb.unary(UnaryOp::kAbs, ta.v), 0.5);
        return V{kb.binary(BinaryOp::kPow, base, tb.v), 2.0,
                 4 * ta.err + 1.5 * tb.err + 16 * kEps * 2.0};
      }
      case 0:
        return V{kb.add(a.v, b.v), a.mag + b.mag, a.err + b.err + kEps * (a.mag + b.mag)};
      case 1:
        return V{kb.sub(a.v, b.v), a.mag + b.mag, a.err + b.err + kEps * (a.mag + b.mag)};
      case 2: {
        V ta = bounded(a), tb = bounded(b);  // keeps products from growing without bound
        return V{kb.mul(ta.v, tb.v), 1.0, ta.err + tb.err + kEps};
      }
      case 3:
        return V{kb.binary(BinaryOp::kMaximum, a.v, b.v), std::max(a.mag, b.mag),
                 std::max(a.err, b.err)};
      case 4:
        return V{kb.binary(BinaryOp::kMinimum, a.v, b.v), std::max(a.mag, b.mag),
                 std::max(a.err, b.err)};
      default: {  // a / (|tanh b| + 0.5): |result| <= 2 |a|
        V tb = bounded(b);
        Value d = kb.binary(BinaryOp::kAdd, kb.unary(UnaryOp::kAbs, tb.v), 0.5);
        return V{kb.div(a.v, d), 2 * a.mag, 2 * a.err + 4 * a.mag * tb.err + 4 * kEps * a.mag};
      }
    }
  }

  // Comparisons and logical ops over exact operands, then a select of computed values.
  V compare_step() {
    static std::vector<BinaryOp> cmp;
    if (cmp.empty()) {
#define DVM_BINARY(Name, mnemonic, kind) \
  if (kind != 0) cmp.push_back(BinaryOp::k##Name);
#include "dvm/ops.def"
    }
    BinaryOp op = cmp[pick(static_cast<int>(cmp.size()))];
    Value c;
    if (op == BinaryOp::kLogicalAnd || op == BinaryOp::kLogicalOr) {
      c = kb.binary(op, m.v, kb.binary(BinaryOp::kGt, x.v, 0.0));
    } else {
      c = kb.binary(op, x.v, kb.transpose(kb.transpose(x.v, 0, 1), 0, 1));
      if (pick(2)) c = kb.binary(op, xi.v, 3.0);
    }
    const V& a = any();
    const V& b = any();
    return V{kb.select(c, a.v, b.v), std::max(a.mag, b.mag), std::max(a.err, b.err)};
  }

  // An exact integer path: cast of 8x (a power of two: exact) of the input, integer ops,
  // floor division and modulo by a nonzero constant, back to f32.
  V integer_step() {
    DType it = pick(2) ? DType::kI32 : DType::kI64;
    Value i = kb.cast(kb.binary(BinaryOp::kMul, x.v, 8.0), it);
    Value j = kb.cast(xi.v, it);
    static const BinaryOp kInt[] = {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul,
                                    BinaryOp::kMaximum, BinaryOp::kMinimum};
    Value r = kb.binary(kInt[pick(5)], i, j);
    if (pick(2)) r = kb.binary(pick(2) ? BinaryOp::kFloorDiv : BinaryOp::kRemainder, r, 7.0);
    return V{kb.cast(r, DType::kF32), 16 * 50 + 50 * 16 + 1000, 0, true};
  }

  // A reduction over one axis (kept, so it broadcasts back) or an arg-reduction.
  V reduce_step() {
    int axis = pick(2);
    int64_t n = axis == 0 ? max_s : max_h;
    const V& a = any();
    switch (pick(6)) {
      case 0: {
        Value r = kb.reduce(ReduceOp::kSum, a.v, {axis}, true);
        double mag = n * a.mag;
        return V{kb.sub(a.v, kb.binary(BinaryOp::kMul, r, 1.0 / static_cast<double>(n))),
                 a.mag + a.mag,
                 2 * a.err + 8 * kEps * std::sqrt(double(n)) * a.mag +
                     kEps * mag / static_cast<double>(n)};
      }
      case 1: {
        Value r = kb.reduce(ReduceOp::kMean, a.v, {axis}, true);
        return V{kb.sub(a.v, r), 2 * a.mag,
                 2 * a.err + 8 * kEps * std::sqrt(double(n)) * a.mag + 2 * kEps * a.mag};
      }
      case 2:
        return V{kb.sub(a.v, kb.reduce(ReduceOp::kMax, a.v, {axis}, true)), 2 * a.mag,
                 2 * a.err + 2 * kEps * a.mag};
      case 3:
        return V{kb.sub(a.v, kb.reduce(ReduceOp::kMin, a.v, {axis}, true)), 2 * a.mag,
                 2 * a.err + 2 * kEps * a.mag};
      case 4: {  // product of 1 + t/4096: stays within e^(n/4096) of 1
        V t = bounded(a);
        Value f = kb.binary(BinaryOp::kAdd, kb.binary(BinaryOp::kMul, t.v, 1.0 / 4096), 1.0);
        Value r = kb.reduce(ReduceOp::kProd, f, {axis}, true);
        double mag = std::exp(static_cast<double>(n) / 4096);
        double e = mag * (static_cast<double>(n) * t.err / 4096 + 8 * kEps * std::sqrt(double(n)) +
                          2 * kEps * double(n) / 64);
        return V{kb.binary(BinaryOp::kMul, a.v, r), a.mag * mag, a.err * mag + e * a.mag};
      }
      default: {  // argmax/argmin of the exact input (ties have probability ~0), plus x
        Value r = kb.reduce(pick(2) ? ReduceOp::kArgMax : ReduceOp::kArgMin, x.v, {axis}, true);
        double mag = static_cast<double>(n) + 2;
        return V{kb.add(x.v, kb.cast(r, DType::kF32)), mag, kEps * mag};
      }
    }
  }

  V move_step() {
    const V& a = any();
    switch (pick(5)) {
      case 0:  // transpose twice through a computed value
        return V{kb.transpose(kb.unary(UnaryOp::kNeg, kb.transpose(a.v, 0, 1)), 0, 1), a.mag, a.err,
                 a.exact};
      case 1:  // reshape of a computed value and back
        return V{kb.reshape(kb.reshape(kb.unary(UnaryOp::kAbs, a.v), {Dim(-1)}), {S, H}), a.mag,
                 a.err, a.exact};
      case 2: {  // concat of two slices that cover the rows
        const V& b = any();
        return V{kb.concat({kb.slice(a.v, 0, 0, kSliceEnd, 1), kb.slice(b.v, 0, 0, 0, 1)}, 0),
                 std::max(a.mag, b.mag), std::max(a.err, b.err), a.exact && b.exact};
      }
      case 3: {  // through f16 or bf16 and back: the rounding is the error
        DType t = pick(2) ? DType::kF16 : DType::kBF16;
        V c = bounded(a);
        double round = t == DType::kF16 ? 4.9e-4 : 3.9e-3;
        return V{kb.cast(kb.cast(c.v, t), DType::kF32), 1.0, c.err * 1.01 + round};
      }
      default: {  // a row vector (sum over rows) broadcast back
        V t = bounded(a);
        Value r = kb.reduce(ReduceOp::kSum, t.v, {0}, false);
        double n = static_cast<double>(max_s);
        return V{kb.mul(t.v, kb.unary(UnaryOp::kTanh, kb.binary(BinaryOp::kMul, r, 1.0 / n))), 1.0,
                 t.err + t.err + 8 * kEps * std::sqrt(n) + 4 * kEps};
      }
    }
  }

  V matmul_step() {
    V t = bounded(any());
    double k = static_cast<double>(max_h);
    return V{kb.matmul(t.v, w.v), 2 * k,
             k * 2 * t.err + 8 * kEps * std::sqrt(k) * 2 * k + 4 * kEps * 2 * k};
  }

  V step() {
    switch (pick(12)) {
      case 0:
      case 1:
      case 2:
        return unary_step();
      case 3:
      case 4:
        return binary_step();
      case 5:
        return compare_step();
      case 6:
        return integer_step();
      case 7:
      case 8:
        return reduce_step();
      case 9:
      case 10:
        return move_step();
      default:
        return large ? move_step() : matmul_step();  // the reference's matmul is slow
    }
  }
};

struct Binding {
  int64_t s, h;
};

// Runs the kernel at 1 and 2 threads into outputs of the given layouts and compares each
// output over its whole storage with the reference (tolerance: the derived bound).
void run_case(const Kernel& k, const std::vector<Buffer>& in, const std::vector<Out>& layouts,
              const std::vector<double>& bounds, const std::string& what) {
  std::vector<TensorArg> args;
  for (const Buffer& b : in) args.push_back(b.arg);
  for (int threads : {1, 2}) {
    CompileOptions opt;
    opt.num_threads = threads;
    auto ck = CompiledKernel::create(k, opt).value();
    auto shapes = ck->infer_output_shapes(args);
    ASSERT_TRUE(shapes.is_ok()) << shapes.status().to_string();
    std::vector<Buffer> vm, ref;
    for (int o = 0; o < k.num_outputs(); ++o) {
      vm.push_back(make_out(dtype_of_output(k, o), (*shapes)[o], layouts[o]));
      ref.push_back(make_out(dtype_of_output(k, o), (*shapes)[o], layouts[o]));
    }
    std::vector<TensorArg> vo, ro;
    for (auto& b : vm) vo.push_back(b.arg);
    for (auto& b : ref) ro.push_back(b.arg);
    Status rs = run_reference(k, args, ro);
    ASSERT_TRUE(rs.is_ok()) << what << ": " << rs.to_string() << "\n" << k.to_string();
    Status vs = ck->run(args, vo);
    ASSERT_TRUE(vs.is_ok()) << what << ": " << vs.to_string() << "\n" << k.to_string();
    for (int o = 0; o < k.num_outputs(); ++o) {
      std::string label =
          what + " [" + std::to_string(threads) + " threads] output " + std::to_string(o);
      if (compare_storage(vm[o], ref[o], Tolerance{bounds[o], 0}, label, "")) {
        auto dis = ck->disassemble(args, vo);
        ADD_FAILURE() << "bound " << bounds[o] << "\n"
                      << k.to_string() << (dis.is_ok() ? dis->substr(0, 6000) : "");
        return;
      }
    }
  }
}

TEST(VmRandom, KernelsMatchReference) {
  int kernels = 1000;
  if (const char* n = std::getenv("DVM_RANDOM_KERNELS")) kernels = std::atoi(n);
  for (uint32_t seed = 1; seed <= static_cast<uint32_t>(kernels); ++seed) {
    // Every twentieth kernel also meets the large bindings (strips, splits, many blocks).
    const bool large = seed % 20 == 0;
    std::vector<Binding> bindings = {{1, 5}, {7, 33}, {40, 20}};
    if (large) bindings.insert(bindings.end(), {{3, 1031}, {2, 4099}, {1001, 300}});
    Gen g(seed);
    g.large = large;
    for (const Binding& b : bindings) {
      g.max_s = std::max(g.max_s, b.s);
      g.max_h = std::max(g.max_h, b.h);
    }
    // x in f16 or bf16 memory for some seeds (converting loads, read inside the member that
    // consumes them where chain_half allows); exact in f32 once loaded.
    const DType x_t = seed % 13 == 0 ? DType::kF16 : seed % 17 == 0 ? DType::kBF16 : DType::kF32;
    Value x = g.kb.load("x", x_t, {g.S, g.H});
    g.x = V{x_t == DType::kF32 ? x : g.kb.cast(x, DType::kF32), 2.0, 0, true};
    g.w = V{g.kb.load("w", DType::kF32, {g.H, g.H}), 2.0, 0, true};
    g.xi = V{g.kb.load("xi", DType::kI32, {g.S, g.H}), 50, 0, true};
    g.m = V{g.kb.load("m", DType::kBool, {g.S, g.H}), 1, 0, true};
    g.vals = {g.x};
    int steps = 2 + g.pick(6);
    for (int i = 0; i < steps; ++i) g.vals.push_back(g.step());
    const V& y = g.vals.back();
    std::vector<double> bounds;
    std::vector<Out> layouts;
    // The result, stored as f32 or rounded to f16/bf16 on the way out.
    DType out_t = seed % 7 == 0 ? DType::kF16 : seed % 11 == 0 ? DType::kBF16 : DType::kF32;
    g.kb.store("y", y.v, out_t);
    double round = out_t == DType::kF16 ? 4.9e-4 : out_t == DType::kBF16 ? 3.9e-3 : 0;
    bounds.push_back(1.01 * y.err + round * y.mag + 1e-30);
    layouts.push_back(static_cast<Out>(seed % 4));
    if (large || g.pick(2)) {  // a second output: a reduction of a middle value
      const V& z = g.vals[g.vals.size() / 2];
      // Large kernels reduce everything (300K elements: split across blocks, uneven parts).
      double n = static_cast<double>(large ? g.max_s * g.max_h : g.max_s);
      g.kb.store("z", large ? g.kb.reduce(ReduceOp::kSum, z.v, {0, 1})
                            : g.kb.reduce(ReduceOp::kSum, z.v, {0}));
      bounds.push_back(1.01 * (n * z.err + 8 * kEps * std::sqrt(n) * n * z.mag) + 1e-30);
      layouts.push_back(static_cast<Out>((seed / 4) % 4));
    }
    auto k = g.kb.build();
    ASSERT_TRUE(k.is_ok()) << "seed " << seed << ": " << k.status().to_string();
    std::mt19937 rng(seed);
    for (const Binding& b : bindings) {
      std::vector<Buffer> in = {make_buffer(x_t, {b.s, b.h}, rng, seed % 3 == 0, seed % 5),
                                make_buffer(DType::kF32, {b.h, b.h}, rng),
                                make_buffer(DType::kI32, {b.s, b.h}, rng),
                                make_buffer(DType::kBool, {b.s, b.h}, rng)};
      run_case(*k, in, layouts, bounds,
               "seed " + std::to_string(seed) + " S=" + std::to_string(b.s) +
                   " H=" + std::to_string(b.h));
      if (::testing::Test::HasFailure()) return;
    }
  }
}

}  // namespace
}  // namespace dvm::testing
