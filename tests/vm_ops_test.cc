// The VM checked against the scalar reference executor for every op x dtype x shape class:
// unary, binary (broadcasting, scalar constants, run-time params), select, cast, data
// movement (broadcast, reshape, permute, slice, concat), reductions and arg-reductions,
// reduce-then-broadcast patterns, strided/offset input and output views, multi-output
// kernels, the program cache, bad arguments and concurrent runs.
//
// Every comparison covers the whole output storage: VM and reference write into identically
// pre-filled buffers, so an element written outside the output view is a mismatch too.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "encoder/stage.h"
#include "vm/interpreter.h"
#include "vm_test_util.h"

// Designated initializers of CheckArgs / ShapeClass leave the defaulted members out.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace dvm::testing {
namespace {

constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16,
                                DType::kI32, DType::kI64, DType::kBool};

struct UnaryOpInfo {
  UnaryOp op;
  const char* name;
};
const std::vector<UnaryOpInfo> kUnaryOps = {
#define DVM_UNARY(Name, mnemonic, kind) {UnaryOp::k##Name, #Name},
#include "dvm/ops.def"
};

struct BinaryOpInfo {
  BinaryOp op;
  const char* name;
};
const std::vector<BinaryOpInfo> kBinaryOps = {
#define DVM_BINARY(Name, mnemonic, kind) {BinaryOp::k##Name, #Name},
#include "dvm/ops.def"
};

std::string dt(DType t) {
  return std::string(dtype_name(t));
}

// ---- tolerances ------------------------------------------------------------------------

enum class Tol {
  kExact,  // integer results, comparisons, data movement, rounding ops, max/min
  kArith,  // + - * / sqrt ...: ~1e-6 relative
  kTrans,  // transcendentals: a few ulp
  kReduce  // reductions and what depends on them: scaled to the data (see below)
};

// The reference accumulates in double, so the VM's error is its own f32 rounding. For a value
// that depends on n summed terms that error is about eps * sqrt(n) relative to the terms'
// scale (random rounding; pairwise or blocked sums do better than the n * eps worst case), so
// reductions are compared with abs = rel = 8 * eps * sqrt(n), abs taken relative to the
// largest reference output: an all-zero softmax over 4096 columns, a mean off by 1.5% or a
// sum that dropped one block of a row fail. f16/bf16 outputs add their rounding.
Tolerance tolerance(Tol c, DType out, int64_t n = 1, double out_scale = 1) {
  if (c == Tol::kExact || !is_float(out)) return Tolerance{0, 0};
  double abs = 0, rel = c == Tol::kTrans ? 2e-6 : 1e-6;
  if (c == Tol::kTrans) abs = 1e-6;
  if (c == Tol::kReduce) {
    double g = 8 * 1.2e-7 * std::sqrt(static_cast<double>(std::max<int64_t>(n, 1)));
    abs = g * out_scale + 1e-30;
    rel = std::max(rel, g);
  }
  if (out == DType::kF16) return Tolerance{abs + 1e-5 * std::max(out_scale, 1e-3), rel + 1e-3};
  if (out == DType::kBF16) return Tolerance{abs + 1e-6 * std::max(out_scale, 1e-3), rel + 1e-2};
  return Tolerance{abs, rel};
}

// ---- buffers ---------------------------------------------------------------------------

void set_float(Buffer& b, int64_t i, double v) {
  char* p = b.bytes.data() + i * dtype_size(b.dtype);
  switch (b.dtype) {
    case DType::kF32: {
      float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      break;
    }
    case DType::kF16: {
      uint16_t h = ops::f32_to_f16_bits(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kBF16: {
      uint16_t h = ops::f32_to_bf16_bits(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    default:
      break;
  }
}

void set_int(Buffer& b, int64_t i, int64_t v) {
  char* p = b.bytes.data() + i * dtype_size(b.dtype);
  if (b.dtype == DType::kI32) {
    int32_t x = static_cast<int32_t>(v);
    std::memcpy(p, &x, 4);
  } else if (b.dtype == DType::kI64) {
    std::memcpy(p, &v, 8);
  }
}

// Replaces about a third of the elements by special values: NaN, infinities, signed zeros,
// halves (round-half-even), values that overflow f16 or integer conversions, INT_MIN/MAX.
void add_specials(Buffer& b, std::mt19937& rng) {
  const double inf = std::numeric_limits<double>::infinity();
  static const double fs[] = {std::numeric_limits<double>::quiet_NaN(),
                              inf,
                              -inf,
                              0.0,
                              -0.0,
                              0.5,
                              -0.5,
                              1.5,
                              2.5,
                              -2.5,
                              1e30,
                              -1e30,
                              1e-30,
                              65504.0,
                              70000.0,
                              3e9,
                              -3e9,
                              1e-7,
                              3.0};
  static const int64_t is32[] = {0, 1, -1, 2, -2, INT32_MAX, INT32_MIN, 7, -7, 31, 32};
  static const int64_t is64[] = {0,         1,         -1,        2,         -2,
                                 INT64_MAX, INT64_MIN, INT32_MAX, INT32_MIN, 1LL << 40,
                                 16777217,  -16777217, 63,        64};
  int64_t n = b.arg.storage_elems;
  std::uniform_int_distribution<int> pick(0, 2);
  for (int64_t i = 0; i < n; ++i) {
    if (pick(rng) != 0) continue;
    if (is_float(b.dtype)) {
      set_float(b, i, fs[std::uniform_int_distribution<size_t>(0, std::size(fs) - 1)(rng)]);
    } else if (b.dtype == DType::kI32) {
      set_int(b, i, is32[std::uniform_int_distribution<size_t>(0, std::size(is32) - 1)(rng)]);
    } else if (b.dtype == DType::kI64) {
      set_int(b, i, is64[std::uniform_int_distribution<size_t>(0, std::size(is64) - 1)(rng)]);
    }
  }
}

// Positive inputs (for ops whose domain is x > 0), in (0.01, 4).
void make_positive(Buffer& b) {
  int64_t n = b.arg.storage_elems;
  for (int64_t i = 0; i < n; ++i) {
    double v = element(b, i);
    if (is_float(b.dtype)) set_float(b, i, std::abs(v) * 2 + 0.01);
    if (is_integer(b.dtype)) set_int(b, i, std::abs(static_cast<int64_t>(v)) + 1);
  }
}

bool all_sentinel(const Buffer& b) {
  return std::all_of(b.bytes.begin(), b.bytes.end(),
                     [](char c) { return static_cast<unsigned char>(c) == kSentinel; });
}

std::vector<TensorArg> args_of(const std::vector<Buffer>& bs) {
  std::vector<TensorArg> r;
  for (const auto& b : bs) r.push_back(b.arg);
  return r;
}

struct CheckArgs {
  Tol tol = Tol::kExact;
  // kReduce: terms per output element (default: the first input's elements per element of
  // the output).
  int64_t n = 0;
  std::vector<ScalarArg> params;
  std::vector<Out> outs;               // layout per output (default contiguous)
  const CompiledKernel* ck = nullptr;  // reuse a compiled kernel (default: create one)
  RunStats* stats = nullptr;           // VM run statistics
  std::string what;
};

// Runs `kernel` on the VM and on the reference with the same inputs and compares outputs.
// Without a.ck the VM runs at 1, 2 and 7 threads (different tilings and block counts): each
// run must match the reference and all must be bitwise equal.
void check(const Kernel& kernel, const std::vector<Buffer>& inputs, const CheckArgs& a = {}) {
  std::vector<TensorArg> in = args_of(inputs);
  std::vector<std::shared_ptr<CompiledKernel>> owned;
  std::vector<const CompiledKernel*> cks;
  if (a.ck) {
    cks.push_back(a.ck);
  } else {
    for (int threads : {1, 2, 7}) {
      CompileOptions opt;
      opt.num_threads = threads;
      auto c = CompiledKernel::create(kernel, opt);
      ASSERT_TRUE(c.is_ok()) << c.status().to_string();
      owned.push_back(*c);
      cks.push_back(owned.back().get());
    }
  }
  auto shapes = cks[0]->infer_output_shapes(in);
  ASSERT_TRUE(shapes.is_ok()) << shapes.status().to_string() << "\n" << kernel.to_string();
  std::vector<Buffer> ref_out;
  auto fresh_outputs = [&] {
    std::vector<Buffer> outs;
    for (int k = 0; k < kernel.num_outputs(); ++k) {
      Out l = k < static_cast<int>(a.outs.size()) ? a.outs[k] : Out::kContig;
      outs.push_back(make_out(dtype_of_output(kernel, k), (*shapes)[k], l));
    }
    return outs;
  };
  ref_out = fresh_outputs();
  std::vector<TensorArg> ro = args_of(ref_out);
  Status rs = run_reference(kernel, in, ro, a.params);
  ASSERT_TRUE(rs.is_ok()) << rs.to_string() << "\n" << kernel.to_string();
  std::vector<std::vector<Buffer>> runs;
  for (size_t c = 0; c < cks.size(); ++c) {
    const CompiledKernel* ck = cks[c];
    std::vector<Buffer> vm_out = fresh_outputs();
    std::vector<TensorArg> vo = args_of(vm_out);
    Status vs = ck->run(in, vo, a.params, c == 0 ? a.stats : nullptr);
    ASSERT_TRUE(vs.is_ok()) << a.what << ": " << vs.to_string() << "\n" << kernel.to_string();
    std::string run_name = a.what + (cks.size() > 1 ? " [" +
                                                          std::to_string(c == 0   ? 1
                                                                         : c == 1 ? 2
                                                                                  : 7) +
                                                          " threads]"
                                                    : "");
    for (int k = 0; k < kernel.num_outputs(); ++k) {
      int64_t n = a.n;
      if (n == 0 && !in.empty()) n = in[0].numel() / std::max<int64_t>(vo[k].numel(), 1);
      Tolerance tol = tolerance(a.tol, dtype_of_output(kernel, k), n, max_abs(ref_out[k]));
      int bad = compare_storage(vm_out[k], ref_out[k], tol,
                                run_name + " output " + std::to_string(k), "");
      if (bad) {
        auto dis = ck->disassemble(in, vo);
        ADD_FAILURE() << kernel.to_string() << (dis.is_ok() ? dis->substr(0, 8000) : "");
        return;
      }
      if (!runs.empty() && vm_out[k].bytes != runs[0][k].bytes) {
        ADD_FAILURE() << run_name << " output " << k << " differs bitwise from the 1-thread run\n"
                      << kernel.to_string();
        return;
      }
    }
    runs.push_back(std::move(vm_out));
  }
}

// Symbolic dims: one symbol per distinct extent (equal extents must agree), size-1 dims as
// the constant 1 (they broadcast).
struct Syms {
  KernelBuilder& kb;
  std::map<int64_t, Dim> by_size;
  std::vector<Dim> dims(const std::vector<int64_t>& shape, bool constant = false) {
    std::vector<Dim> r;
    for (int64_t d : shape) {
      if (d == 1 || constant) {
        r.push_back(Dim(d));
        continue;
      }
      auto it = by_size.find(d);
      if (it == by_size.end())
        it = by_size.emplace(d, kb.symbol(std::string(1, 'n').append(std::to_string(d)))).first;
      r.push_back(it->second);
    }
    return r;
  }
};

Kernel build_or_die(KernelBuilder& kb) {
  auto k = kb.build();
  EXPECT_TRUE(k.is_ok()) << k.status().to_string();
  return k.is_ok() ? *k : Kernel();
}

#define BUILD(kb, k)           \
  Kernel k = build_or_die(kb); \
  if (::testing::Test::HasFailure()) return

ScalarArg param_value(DType t) {
  if (is_float(t)) return ScalarArg::of_float(0.75);
  if (t == DType::kBool) return ScalarArg::of_int(1);
  return ScalarArg::of_int(3);
}

// ---- unary -----------------------------------------------------------------------------

struct ShapeClass {
  const char* name;
  std::vector<int64_t> a;
  std::vector<int64_t> b;  // second operand (binary); empty with `scalar` for constants
  bool transposed = false;
  int64_t offset = 0;
  bool specials = false;
  bool constant_dims = false;
  Out out = Out::kContig;
  int scalar = 0;  // binary: 1 constant rhs, 2 constant lhs, 3 run-time param rhs
};

const std::vector<ShapeClass> kUnaryShapes = {
    {"Empty", {0, 17}},
    {"Ones", {1, 1}},
    {"Rank0", {}},
    {"Tail7x17", {7, 17}},
    {"Prime1031", {1031}, {}, false, 0, false, /*constant_dims=*/true},
    {"Transposed", {17, 33}, {}, /*transposed=*/true},
    {"Offset", {5, 1031}, {}, false, /*offset=*/7},
    {"Specials", {9, 31}, {}, false, 0, /*specials=*/true},
    {"StridedOut", {13, 37}, {}, false, 0, false, false, Out::kStrided},
    {"TransInOut", {13, 37}, {}, true, 3, false, false, Out::kTransposed},
};

struct UnaryCase {
  UnaryOpInfo op;
  DType dtype;
  ShapeClass shape;
};

Tol unary_tol(UnaryOp op) {
  switch (op) {
    case UnaryOp::kNeg:
    case UnaryOp::kAbs:
    case UnaryOp::kRelu:
    case UnaryOp::kFloor:
    case UnaryOp::kCeil:
    case UnaryOp::kRound:
    case UnaryOp::kTrunc:
    case UnaryOp::kSign:
    case UnaryOp::kIsFinite:
    case UnaryOp::kIsNan:
    case UnaryOp::kLogicalNot:
      return Tol::kExact;
    case UnaryOp::kSqrt:
    case UnaryOp::kReciprocal:
      return Tol::kArith;
    default:
      return Tol::kTrans;
  }
}

bool positive_domain(UnaryOp op) {
  return op == UnaryOp::kLog || op == UnaryOp::kSqrt || op == UnaryOp::kRsqrt ||
         op == UnaryOp::kLog1p;
}

void PrintTo(const UnaryCase& c, std::ostream* os) {
  *os << c.op.name << " " << dt(c.dtype) << " " << c.shape.name;
}

class VmUnary : public ::testing::TestWithParam<UnaryCase> {};

TEST_P(VmUnary, MatchesReference) {
  const UnaryCase& c = GetParam();
  KernelBuilder kb("unary");
  Syms sy{kb, {}};
  Value x = kb.load("x", c.dtype, sy.dims(c.shape.a, c.shape.constant_dims));
  kb.store("y", kb.unary(c.op.op, x));
  BUILD(kb, k);
  std::mt19937 rng(11);
  Buffer in = make_buffer(c.dtype, c.shape.a, rng, c.shape.transposed, c.shape.offset);
  if (c.shape.specials) {
    add_specials(in, rng);
  } else if (positive_domain(c.op.op) && c.dtype != DType::kBool) {
    make_positive(in);
  }
  check(k, {in}, {.tol = unary_tol(c.op.op), .outs = {c.shape.out}});
  // Domain ops also run on random signs (NaN results compare equal).
  if (positive_domain(c.op.op) && !c.shape.specials && !::testing::Test::HasFailure()) {
    Buffer raw = make_buffer(c.dtype, c.shape.a, rng, c.shape.transposed, c.shape.offset);
    check(k, {raw}, {.tol = unary_tol(c.op.op), .outs = {c.shape.out}, .what = "signed"});
  }
}

std::vector<UnaryCase> unary_cases() {
  std::vector<UnaryCase> r;
  for (const auto& op : kUnaryOps)
    for (DType t : kAllDTypes)
      for (const auto& s : kUnaryShapes) r.push_back({op, t, s});
  return r;
}

INSTANTIATE_TEST_SUITE_P(All, VmUnary, ::testing::ValuesIn(unary_cases()),
                         [](const ::testing::TestParamInfo<UnaryCase>& i) {
                           return std::string(i.param.op.name) + "_" + dt(i.param.dtype) + "_" +
                                  i.param.shape.name;
                         });

// ---- binary ----------------------------------------------------------------------------

const std::vector<ShapeClass> kBinaryShapes = {
    {"Same7x17", {7, 17}, {7, 17}},
    {"RowBcast", {7, 17}, {17}},
    {"OuterBcast", {7, 1}, {1, 17}},
    {"RankMismatch", {3, 5, 17}, {5, 1}},
    {"ConstRhs", {7, 17}, {}, false, 0, false, false, Out::kContig, 1},
    {"ConstLhs", {7, 17}, {}, false, 0, false, false, Out::kContig, 2},
    {"ParamRhs", {7, 17}, {}, false, 0, false, false, Out::kContig, 3},
    {"Transposed", {17, 33}, {17, 33}, true, 5},
    {"Empty", {0, 17}, {17}},
    {"Prime1031", {1031}, {1031}, false, 0, false, true},
    {"Specials", {9, 31}, {9, 31}, false, 0, true},
    {"StridedOut", {13, 37}, {37}, false, 0, false, false, Out::kStrided},
};

struct BinaryCase {
  BinaryOpInfo op;
  DType dtype;
  ShapeClass shape;
};

void PrintTo(const BinaryCase& c, std::ostream* os) {
  *os << c.op.name << " " << dt(c.dtype) << " " << c.shape.name;
}

class VmBinary : public ::testing::TestWithParam<BinaryCase> {};

// Integer floor_divide and remainder by zero are errors, as torch raises ZeroDivisionError.
// The reference decides whether a divisor element the kernel reads is 0; then the VM (at 1
// and 2 threads) must fail too, naming the op. Returns whether they failed.
bool expect_same_division_error(const Kernel& k, const std::vector<Buffer>& inputs,
                                const std::vector<ScalarArg>& params, Out layout) {
  std::vector<TensorArg> in = args_of(inputs);
  auto ck = CompiledKernel::create(k);
  EXPECT_TRUE(ck.is_ok());
  auto shapes = (*ck)->infer_output_shapes(in);
  EXPECT_TRUE(shapes.is_ok());
  std::vector<Buffer> out = {make_out(dtype_of_output(k, 0), (*shapes)[0], layout)};
  const Status ref = run_reference(k, in, args_of(out), params);
  if (ref.is_ok()) return false;
  EXPECT_NE(ref.message().find("by zero"), std::string::npos) << ref.to_string();
  for (int threads : {1, 2}) {
    CompileOptions opt;
    opt.num_threads = threads;
    auto c = CompiledKernel::create(k, opt);
    EXPECT_TRUE(c.is_ok());
    const Status vm = (*c)->run(in, args_of(out), params);
    EXPECT_EQ(vm.code(), StatusCode::kInvalidArgument) << vm.to_string();
    EXPECT_NE(vm.message().find("by zero"), std::string::npos) << vm.to_string();
  }
  return true;
}

// Makes every zero element of an integer (or bool) buffer 1.
void replace_zeros(Buffer& b) {
  for (int64_t i = 0; i < b.arg.storage_elems; ++i) {
    if (element(b, i) != 0) continue;
    if (b.dtype == DType::kBool) {
      b.bytes[i] = 1;
    } else {
      set_int(b, i, 1);
    }
  }
}

TEST_P(VmBinary, MatchesReference) {
  const BinaryCase& c = GetParam();
  const ShapeClass& s = c.shape;
  KernelBuilder kb("binary");
  Syms sy{kb, {}};
  Value a = kb.load("a", c.dtype, sy.dims(s.a, s.constant_dims));
  Value y;
  double rhs = is_float(c.dtype) ? 0.75 : c.dtype == DType::kBool ? 1 : 3;
  double lhs = is_float(c.dtype) ? -1.25 : c.dtype == DType::kBool ? 1 : -7;
  std::vector<ScalarArg> params;
  switch (s.scalar) {
    case 1:
      y = kb.binary(c.op.op, a, rhs);
      break;
    case 2:
      y = kb.binary(c.op.op, lhs, a);
      break;
    case 3:
      y = kb.binary(c.op.op, a, kb.param("p", c.dtype));
      params.push_back(param_value(c.dtype));
      break;
    default:
      y = kb.binary(c.op.op, a, kb.load("b", c.dtype, sy.dims(s.b, s.constant_dims)));
  }
  kb.store("y", y);
  BUILD(kb, k);
  std::mt19937 rng(12);
  std::vector<Buffer> in;
  in.push_back(make_buffer(c.dtype, s.a, rng, s.transposed, s.offset));
  if (s.scalar == 0) in.push_back(make_buffer(c.dtype, s.b, rng, false, s.offset));
  if (s.specials)
    for (auto& b : in) add_specials(b, rng);
  // (An integer div is a true division: the builder casts its operands to f32.)
  const bool divides = c.op.op == BinaryOp::kFloorDiv || c.op.op == BinaryOp::kRemainder;
  Buffer* divisor = s.scalar == 0 ? &in[1] : s.scalar == 2 ? &in[0] : nullptr;
  if (!is_float(c.dtype) && divides && divisor != nullptr) {
    const bool failed = expect_same_division_error(k, in, params, s.out);
    if (s.specials && c.dtype != DType::kBool) {
      EXPECT_TRUE(failed) << "specials include 0";
    }
    if (failed) replace_zeros(*divisor);  // then the results are compared
  }
  Tol tol = c.op.op == BinaryOp::kPow ? Tol::kTrans : Tol::kArith;
  check(k, in, {.tol = tol, .params = params, .outs = {s.out}});
}

std::vector<BinaryCase> binary_cases() {
  std::vector<BinaryCase> r;
  for (const auto& op : kBinaryOps)
    for (DType t : kAllDTypes)
      for (const auto& s : kBinaryShapes) r.push_back({op, t, s});
  return r;
}

INSTANTIATE_TEST_SUITE_P(All, VmBinary, ::testing::ValuesIn(binary_cases()),
                         [](const ::testing::TestParamInfo<BinaryCase>& i) {
                           return std::string(i.param.op.name) + "_" + dt(i.param.dtype) + "_" +
                                  i.param.shape.name;
                         });

// A run-time param changes between runs of one compiled kernel without re-encoding.
TEST(VmBinaryParam, ChangingParamHitsCache) {
  KernelBuilder kb("param");
  Dim S = kb.symbol("S");
  Value x = kb.load("x", DType::kF32, {S, 33});
  Value p = kb.param("p", DType::kF32);
  Value q = kb.param("q", DType::kI32);
  kb.store("y", kb.add(kb.mul(x, p), q));
  BUILD(kb, k);
  auto ck = CompiledKernel::create(k);
  ASSERT_TRUE(ck.is_ok());
  std::mt19937 rng(13);
  Buffer in = make_buffer(DType::kF32, {9, 33}, rng);
  for (int i = 0; i < 4; ++i) {
    RunStats st;
    check(k, {in},
          {.tol = Tol::kArith,
           .params = {ScalarArg::of_float(0.5 * i - 1), ScalarArg::of_int(i * 7 - 3)},
           .ck = ck->get(),
           .stats = &st,
           .what = "run " + std::to_string(i)});
    EXPECT_EQ(st.cache_hit, i > 0) << "run " << i;
  }
}

// ---- select and cast -------------------------------------------------------------------

class VmSelect : public ::testing::TestWithParam<DType> {};

TEST_P(VmSelect, MatchesReference) {
  DType t = GetParam();
  std::mt19937 rng(14);
  {
    // Condition from a comparison, broadcast branches.
    KernelBuilder kb("select_cmp");
    Dim S = kb.symbol("S"), H = kb.symbol("H");
    Value a = kb.load("a", t, {S, H});
    Value b = kb.load("b", t, {H});
    Value c = kb.binary(BinaryOp::kGt, a, b);
    kb.store("y", kb.select(c, a, b));
    BUILD(kb, k);
    for (auto [s, h] : std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {1, 1}, {7, 17}, {3, 1031}})
      check(k, {make_buffer(t, {s, h}, rng), make_buffer(t, {h}, rng)},
            {.what = std::to_string(s) + "x" + std::to_string(h)});
  }
  {
    // Bool input condition (strided), scalar branch, param branch, strided output.
    KernelBuilder kb("select_bool");
    Dim S = kb.symbol("S"), H = kb.symbol("H");
    Value c = kb.load("c", DType::kBool, {S, H});
    Value a = kb.load("a", t, {S, 1});
    Value p = kb.param("p", t);
    kb.store("y", kb.select(c, a, p));
    kb.store("z", kb.select(c, kb.constant(2, t), a));
    BUILD(kb, k);
    check(
        k,
        {make_buffer(DType::kBool, {13, 37}, rng, true, 3), make_buffer(t, {13, 1}, rng, false, 2)},
        {.params = {param_value(t)}, .outs = {Out::kStrided, Out::kTransposed}});
  }
  {
    // Non-bool condition (cast to bool), mixed dtypes promoted.
    KernelBuilder kb("select_mixed");
    Dim S = kb.symbol("S");
    Value c = kb.load("c", t, {S});
    Value a = kb.load("a", DType::kI32, {S});
    Value b = kb.load("b", t, {S});
    kb.store("y", kb.select(c, a, b));
    BUILD(kb, k);
    Buffer cb = make_buffer(t, {1031}, rng);
    add_specials(cb, rng);
    check(k, {cb, make_buffer(DType::kI32, {1031}, rng), make_buffer(t, {1031}, rng)});
  }
}

INSTANTIATE_TEST_SUITE_P(All, VmSelect, ::testing::ValuesIn(kAllDTypes),
                         [](const ::testing::TestParamInfo<DType>& i) { return dt(i.param); });

struct CastCase {
  DType from, to;
  ShapeClass shape;
};

const std::vector<ShapeClass> kCastShapes = {
    {"Empty", {0, 7}},
    {"Specials", {9, 31}, {}, false, 0, true},
    {"TransInOut", {17, 33}, {}, true, 3, true, false, Out::kTransposed},
    {"StridedOut", {13, 37}, {}, false, 0, false, false, Out::kStrided},
    {"Prime1031", {1031}, {}, false, 0, false, true},
};

void PrintTo(const CastCase& c, std::ostream* os) {
  *os << dt(c.from) << "->" << dt(c.to) << " " << c.shape.name;
}

class VmCast : public ::testing::TestWithParam<CastCase> {};

TEST_P(VmCast, MatchesReference) {
  const CastCase& c = GetParam();
  KernelBuilder kb("cast");
  Syms sy{kb, {}};
  Value x = kb.load("x", c.from, sy.dims(c.shape.a, c.shape.constant_dims));
  kb.store("y", kb.cast(x, c.to));
  // The cast of a computed value, and a store-time cast.
  Value n = c.from == DType::kBool ? kb.unary(UnaryOp::kLogicalNot, x) : kb.unary(UnaryOp::kNeg, x);
  kb.store("z", n, c.to);
  BUILD(kb, k);
  std::mt19937 rng(15);
  Buffer in = make_buffer(c.from, c.shape.a, rng, c.shape.transposed, c.shape.offset);
  if (c.shape.specials) add_specials(in, rng);
  check(k, {in}, {.outs = {c.shape.out, c.shape.out}});
}

std::vector<CastCase> cast_cases() {
  std::vector<CastCase> r;
  for (DType a : kAllDTypes)
    for (DType b : kAllDTypes)
      for (const auto& s : kCastShapes) r.push_back({a, b, s});
  return r;
}

INSTANTIATE_TEST_SUITE_P(All, VmCast, ::testing::ValuesIn(cast_cases()),
                         [](const ::testing::TestParamInfo<CastCase>& i) {
                           return dt(i.param.from) + "_to_" + dt(i.param.to) + "_" +
                                  i.param.shape.name;
                         });

// ---- data movement ---------------------------------------------------------------------

// A computed value of the same dtype (forces the VM to compute, not just move).
Value computed(KernelBuilder& kb, Value x) {
  return kb.dtype(x) == DType::kBool ? kb.unary(UnaryOp::kLogicalNot, x)
                                     : kb.unary(UnaryOp::kNeg, x);
}

class VmMove : public ::testing::TestWithParam<DType> {};

TEST_P(VmMove, Broadcast) {
  DType t = GetParam();
  std::mt19937 rng(21);
  KernelBuilder kb("broadcast");
  Dim S = kb.symbol("S"), H = kb.symbol("H");
  Value r = kb.load("r", t, {H});
  Value c = kb.load("c", t, {S, 1});
  kb.store("y0", kb.broadcast(r, {S, H}));
  kb.store("y1", kb.broadcast(c, {S, H}));
  kb.store("y2", kb.broadcast(computed(kb, r), {2, S, H}));
  kb.store("y3", kb.broadcast(kb.constant(3, t), {S, 2}));
  BUILD(kb, k);
  for (auto [s, h] : std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {1, 1}, {7, 17}, {5, 1031}})
    check(k, {make_buffer(t, {h}, rng, false, 2), make_buffer(t, {s, 1}, rng)},
          {.outs = {Out::kStrided, Out::kTransposed, Out::kContig, Out::kOffset},
           .what = std::to_string(s) + "x" + std::to_string(h)});
}

TEST_P(VmMove, Reshape) {
  DType t = GetParam();
  std::mt19937 rng(22);
  KernelBuilder kb("reshape");
  Value x = kb.load("x", t, {6, 35});
  kb.store("flat", kb.reshape(x, {-1}));
  kb.store("r3", kb.reshape(x, {7, -1, 3}));
  kb.store("comp", kb.reshape(computed(kb, x), {5, -1}));
  kb.store("perm", kb.reshape(kb.transpose(x, 0, 1), {-1, 6}));
  kb.store("unsq", kb.reshape(x, {6, 1, 35, 1}));
  kb.store("then_add",
           kb.binary(BinaryOp::kMaximum, kb.reshape(x, {35, 6}), kb.reshape(x, {35, 6})));
  BUILD(kb, k);
  check(k, {make_buffer(t, {6, 35}, rng)}, {.what = "contiguous"});
  check(k, {make_buffer(t, {6, 35}, rng, /*transposed=*/true, 4)}, {.what = "transposed view"});
}

TEST_P(VmMove, ReshapeSymbolic) {
  DType t = GetParam();
  std::mt19937 rng(23);
  KernelBuilder kb("reshape_sym");
  Dim S = kb.symbol("S");
  Value x = kb.load("x", t, {S, 4, 6});
  kb.store("a", kb.reshape(x, {S, -1}));
  kb.store("b", kb.reshape(computed(kb, x), {-1, 8}));
  kb.store("c", kb.sum(kb.reshape(x, {S, 24}), {1}, true));
  BUILD(kb, k);
  {
    // -1 cannot be inferred from 0 elements: rejected, not guessed.
    std::mt19937 r0(1);
    std::vector<TensorArg> in0 = {make_buffer(t, {0, 4, 6}, r0).arg};
    auto ck = CompiledKernel::create(k);
    ASSERT_TRUE(ck.is_ok());
    EXPECT_FALSE((*ck)->infer_output_shapes(in0).is_ok());
  }
  for (int64_t s : {1, 5, 33})
    check(k, {make_buffer(t, {s, 4, 6}, rng, true, 1)},
          {.tol = Tol::kReduce, .what = "S=" + std::to_string(s)});
}

TEST_P(VmMove, Permute) {
  DType t = GetParam();
  std::mt19937 rng(24);
  KernelBuilder kb("permute");
  Dim A = kb.symbol("A"), B = kb.symbol("B"), C = kb.symbol("C");
  Value x = kb.load("x", t, {A, B, C});
  kb.store("p", kb.permute(x, {2, 0, 1}));
  kb.store("pc", kb.permute(computed(kb, x), {1, 2, 0}));
  kb.store("tt", kb.transpose(kb.transpose(x, 0, 2), 1, 2));
  Value w = kb.load("w", t, {C, B, A});
  kb.store("sum", kb.binary(BinaryOp::kMaximum, kb.permute(w, {2, 1, 0}), x));
  BUILD(kb, k);
  for (auto sh : std::vector<std::vector<int64_t>>{{2, 3, 5}, {1, 7, 1}, {0, 2, 3}, {3, 17, 33}})
    check(k,
          {make_buffer(t, sh, rng, true, 3), make_buffer(t, {sh[2], sh[1], sh[0]}, rng, false, 1)},
          {.outs = {Out::kStrided, Out::kContig, Out::kTransposed}});
}

TEST_P(VmMove, Slice) {
  DType t = GetParam();
  std::mt19937 rng(25);
  KernelBuilder kb("slice");
  Dim S = kb.symbol("S"), H = kb.symbol("H");
  Value x = kb.load("x", t, {S, H});
  kb.store("step", kb.slice(x, 1, 3, -2, 2));
  kb.store("neg", kb.slice(x, 0, -5, kSliceEnd, 3));
  kb.store("clamp", kb.slice(x, 1, -100, 100, 1));
  kb.store("empty", kb.slice(x, 1, 5, 2));
  kb.store("comp", kb.slice(computed(kb, x), 1, -7, -1, 3));
  kb.store("twice", kb.slice(kb.slice(x, 0, 1, kSliceEnd, 2), 1, 2, kSliceEnd, 5));
  kb.store("then_op",
           kb.binary(BinaryOp::kMaximum, kb.slice(x, 1, 0, -1), kb.slice(x, 1, 1, kSliceEnd)));
  BUILD(kb, k);
  for (auto [s, h] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 17}, {17, 33}, {4, 1031}}) {
    check(k, {make_buffer(t, {s, h}, rng)}, {.what = std::to_string(s) + "x" + std::to_string(h)});
    check(k, {make_buffer(t, {s, h}, rng, true, 9)},
          {.outs = {Out::kStrided, Out::kTransposed, Out::kOffset},
           .what = "transposed " + std::to_string(s) + "x" + std::to_string(h)});
  }
}

TEST_P(VmMove, Concat) {
  DType t = GetParam();
  std::mt19937 rng(26);
  KernelBuilder kb("concat");
  Dim S = kb.symbol("S"), H = kb.symbol("H"), G = kb.symbol("G");
  Value a = kb.load("a", t, {S, H});
  Value b = kb.load("b", t, {S, G});
  Value c = kb.load("c", t, {2, H});
  kb.store("ax1", kb.concat({a, b}, 1));
  kb.store("ax0", kb.concat({a, c, a}, 0));
  kb.store("comp", kb.concat({computed(kb, a), b, computed(kb, b)}, -1));
  Value cat = kb.concat({a, b}, 1);
  Value further = kb.binary(BinaryOp::kMaximum, cat, kb.slice(cat, 0, 0, 1));
  kb.store("further", further);
  kb.store("reduced", kb.reduce(ReduceOp::kMax, kb.concat({a, c}, 0), {0}));
  BUILD(kb, k);
  for (auto [s, h, g] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 1}, {3, 7, 17}, {5, 0, 9}, {0, 4, 3}, {6, 1031, 33}}) {
    check(k,
          {make_buffer(t, {s, h}, rng), make_buffer(t, {s, g}, rng, true, 3),
           make_buffer(t, {2, h}, rng, false, 1)},
          {.outs = {Out::kStrided, Out::kTransposed},
           .what = std::to_string(s) + "," + std::to_string(h) + "," + std::to_string(g)});
  }
}

INSTANTIATE_TEST_SUITE_P(All, VmMove, ::testing::ValuesIn(kAllDTypes),
                         [](const ::testing::TestParamInfo<DType>& i) { return dt(i.param); });

// ---- reductions ------------------------------------------------------------------------

struct ReduceShape {
  const char* name;
  std::vector<int64_t> shape;
  bool transposed = false;
  int64_t offset = 0;
};

const std::vector<ReduceShape> kReduceShapes = {
    {"S3x37x1029", {3, 37, 1029}}, {"S2x5000x3", {2, 5000, 3}}, {"S2x3x20001", {2, 3, 20001}},
    {"S4x0x5", {4, 0, 5}},         {"S1x1x1", {1, 1, 1}},       {"S5x33x17T", {5, 33, 17}, true, 7},
};

struct AxesSet {
  const char* name;
  std::vector<int> axes;
};

const std::vector<AxesSet> kAxesSets = {
    {"A0", {0}},     {"A1", {1}},     {"A2", {2}}, {"A01", {0, 1}},
    {"A02", {0, 2}}, {"A12", {1, 2}}, {"All", {}}, {"Neg1", {-1}},
};

struct ReduceCase {
  ReduceOp op;
  DType dtype;
  ReduceShape shape;
  AxesSet axes;
  bool keepdims;
};

void PrintTo(const ReduceCase& c, std::ostream* os) {
  *os << reduce_op_name(c.op) << " " << dt(c.dtype) << " " << c.shape.name << " " << c.axes.name
      << (c.keepdims ? " keepdims" : "");
}

// Float reduction inputs away from the easy cases: sums and means of data with a non-zero
// mean (U[0, 2]: a dropped or doubled share moves the result), products of near-1 data
// (U[-2, 2] products over >= 1029 elements are exactly 0 and cannot fail).
void shift_for(ReduceOp op, Buffer& b) {
  if (!is_float(b.dtype)) return;
  int64_t n = b.arg.storage_elems;
  for (int64_t i = 0; i < n; ++i) {
    double v = element(b, i);
    set_float(b, i, op == ReduceOp::kProd ? 1 + v * 5e-4 : v * 0.5 + 1);
  }
}

class VmReduce : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(VmReduce, MatchesReference) {
  const ReduceCase& c = GetParam();
  KernelBuilder kb("reduce");
  Syms sy{kb, {}};
  Value x = kb.load("x", c.dtype, sy.dims(c.shape.shape));
  kb.store("y", kb.reduce(c.op, x, c.axes.axes, c.keepdims));
  BUILD(kb, k);
  std::mt19937 rng(31);
  bool empty_reduced = false;
  for (int a = 0; a < 3; ++a) {
    bool red = c.axes.axes.empty() ||
               std::find(c.axes.axes.begin(), c.axes.axes.end(), a) != c.axes.axes.end() ||
               (a == 2 && c.axes.axes == std::vector<int>{-1});
    empty_reduced |= red && c.shape.shape[a] == 0;
  }
  if (empty_reduced && (c.op == ReduceOp::kMax || c.op == ReduceOp::kMin)) {
    // max/min over an empty axis has no identity: rejected (as torch).
    auto ck = CompiledKernel::create(k);
    ASSERT_TRUE(ck.is_ok());
    Buffer in = make_buffer(c.dtype, c.shape.shape, rng);
    auto shapes = (*ck)->infer_output_shapes(std::vector<TensorArg>{in.arg});
    ASSERT_FALSE(shapes.is_ok());
    EXPECT_NE(shapes.status().message().find("empty"), std::string::npos);
    return;
  }
  Buffer in = make_buffer(c.dtype, c.shape.shape, rng, c.shape.transposed, c.shape.offset);
  shift_for(c.op, in);
  bool order = c.op == ReduceOp::kMax || c.op == ReduceOp::kMin;
  check(k, {in}, {.tol = order ? Tol::kExact : Tol::kReduce});
}

std::vector<ReduceCase> reduce_cases() {
  std::vector<ReduceCase> r;
  for (ReduceOp op :
       {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProd}) {
    for (const auto& s : kReduceShapes)
      for (const auto& a : kAxesSets)
        for (bool keep : {false, true}) r.push_back({op, DType::kF32, s, a, keep});
    // Other dtypes on fewer shapes (runtime under sanitizers).
    for (DType t : {DType::kF16, DType::kBF16, DType::kI32, DType::kI64, DType::kBool})
      for (const auto& s : {kReduceShapes[0], kReduceShapes[1], kReduceShapes[5]})
        for (const auto& a : kAxesSets) r.push_back({op, t, s, a, s.name[1] == '3'});
  }
  return r;
}

INSTANTIATE_TEST_SUITE_P(All, VmReduce, ::testing::ValuesIn(reduce_cases()),
                         [](const ::testing::TestParamInfo<ReduceCase>& i) {
                           return std::string(reduce_op_name(i.param.op)) + "_" +
                                  dt(i.param.dtype) + "_" + i.param.shape.name + "_" +
                                  i.param.axes.name + (i.param.keepdims ? "_Keep" : "");
                         });

// Rank-1 reductions around the single-pass limit (16384) and the tile size.
class VmReduce1D : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(VmReduce1D, AllOps) {
  auto [t, n] = GetParam();
  KernelBuilder kb("reduce1d");
  Dim N = kb.symbol("N");
  Value x = kb.load("x", t, {N});
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kProd})
    kb.store(reduce_op_name(op), kb.reduce(op, x, {0}));
  BUILD(kb, k);
  KernelBuilder ko("reduce1d_order");  // exact: no rounding in max/min
  Dim No = ko.symbol("N");
  Value xo = ko.load("x", t, {No});
  for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kArgMax, ReduceOp::kArgMin})
    ko.store(reduce_op_name(op), ko.reduce(op, xo, {0}));
  BUILD(ko, korder);
  std::mt19937 rng(32);
  if (n == 0) {
    // max/min/argmax/argmin of an empty axis have no answer; the reductions with an identity
    // do.
    KernelBuilder kb0("reduce1d_empty");
    Dim N0 = kb0.symbol("N");
    Value x0 = kb0.load("x", t, {N0});
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kProd})
      kb0.store(reduce_op_name(op), kb0.reduce(op, x0, {0}, true));
    BUILD(kb0, k0);
    check(k0, {make_buffer(t, {0}, rng)}, {.tol = Tol::kReduce});
    return;
  }
  Buffer in = make_buffer(t, {n}, rng, false, 3);
  check(korder, {in});
  shift_for(ReduceOp::kProd, in);  // near 1: the product stays finite, the sum is ~n
  check(k, {in}, {.tol = Tol::kReduce});
}

INSTANTIATE_TEST_SUITE_P(
    All, VmReduce1D,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kI32, DType::kF16),
                       ::testing::Values(0, 1, 7, 4096, 4097, 16384, 16385, 20001)),
    [](const ::testing::TestParamInfo<std::tuple<DType, int64_t>>& i) {
      return dt(std::get<0>(i.param)) + "_N" + std::to_string(std::get<1>(i.param));
    });

struct ArgCase {
  ReduceOp op;
  DType dtype;
  ReduceShape shape;
  int axis;
  bool keepdims;
  bool specials;
};

void PrintTo(const ArgCase& c, std::ostream* os) {
  *os << reduce_op_name(c.op) << " " << dt(c.dtype) << " " << c.shape.name << " axis " << c.axis;
}

class VmArgReduce : public ::testing::TestWithParam<ArgCase> {};

TEST_P(VmArgReduce, MatchesReference) {
  const ArgCase& c = GetParam();
  KernelBuilder kb("argreduce");
  Syms sy{kb, {}};
  Value x = kb.load("x", c.dtype, sy.dims(c.shape.shape));
  kb.store("i", kb.reduce(c.op, x, {c.axis}, c.keepdims));
  BUILD(kb, k);
  std::mt19937 rng(33);
  Buffer in = make_buffer(c.dtype, c.shape.shape, rng, c.shape.transposed, c.shape.offset);
  if (c.specials) add_specials(in, rng);
  check(k, {in});
}

std::vector<ArgCase> arg_cases() {
  std::vector<ArgCase> r;
  const std::vector<ReduceShape> shapes = {kReduceShapes[0], kReduceShapes[1], kReduceShapes[2],
                                           kReduceShapes[4], kReduceShapes[5]};
  for (ReduceOp op : {ReduceOp::kArgMax, ReduceOp::kArgMin}) {
    for (int axis : {0, 1, 2, -1}) {
      for (const auto& s : shapes)
        for (bool keep : {false, true}) r.push_back({op, DType::kF32, s, axis, keep, false});
      r.push_back({op, DType::kF32, kReduceShapes[5], axis, false, true});
      for (DType t : {DType::kF16, DType::kBF16, DType::kI32, DType::kI64, DType::kBool}) {
        r.push_back({op, t, kReduceShapes[0], axis, false, false});
        r.push_back({op, t, kReduceShapes[5], axis, true, t != DType::kBool});
      }
    }
  }
  return r;
}

INSTANTIATE_TEST_SUITE_P(All, VmArgReduce, ::testing::ValuesIn(arg_cases()),
                         [](const ::testing::TestParamInfo<ArgCase>& i) {
                           std::string ax =
                               i.param.axis < 0 ? "Neg1" : std::to_string(i.param.axis);
                           return std::string(reduce_op_name(i.param.op)) + "_" +
                                  dt(i.param.dtype) + "_" + i.param.shape.name + "_A" + ax +
                                  (i.param.keepdims ? "_Keep" : "") +
                                  (i.param.specials ? "_Specials" : "");
                         });

// ---- reduce-then-broadcast patterns ---------------------------------------------------

enum class Norm { kSoftmax, kLogSoftmax, kLayerNorm, kRmsNorm, kSoftmaxAxis0 };

struct NormCase {
  Norm norm;
  const char* name;
  DType dtype;
  int64_t rows, len;
  bool transposed;
};

Kernel norm_kernel(Norm norm, DType t) {
  KernelBuilder kb("norm");
  Dim S = kb.symbol("S"), H = kb.symbol("H");
  Value x = kb.load("x", t, {S, H});
  Value g = kb.load("g", t, {H});
  Value xf = kb.cast(x, DType::kF32);
  Value y;
  switch (norm) {
    case Norm::kSoftmax: {
      Value e = kb.unary(UnaryOp::kExp, kb.sub(xf, kb.max(xf, {-1}, true)));
      y = kb.div(e, kb.sum(e, {-1}, true));
      break;
    }
    case Norm::kSoftmaxAxis0: {
      Value e = kb.unary(UnaryOp::kExp, kb.sub(xf, kb.max(xf, {0}, true)));
      y = kb.div(e, kb.sum(e, {0}, true));
      break;
    }
    case Norm::kLogSoftmax: {
      Value c = kb.sub(xf, kb.max(xf, {-1}, true));
      y = kb.sub(c, kb.unary(UnaryOp::kLog, kb.sum(kb.unary(UnaryOp::kExp, c), {-1}, true)));
      break;
    }
    case Norm::kLayerNorm: {
      Value xc = kb.sub(xf, kb.mean(xf, {-1}, true));
      Value var = kb.mean(kb.mul(xc, xc), {-1}, true);
      y = kb.mul(kb.mul(xc, kb.unary(UnaryOp::kRsqrt, kb.binary(BinaryOp::kAdd, var, 1e-5))), g);
      break;
    }
    case Norm::kRmsNorm: {
      Value ms = kb.mean(kb.mul(xf, xf), {-1}, true);
      y = kb.mul(kb.mul(xf, kb.unary(UnaryOp::kRsqrt, kb.binary(BinaryOp::kAdd, ms, 1e-6))), g);
      break;
    }
  }
  kb.store("y", y, t);
  auto k = kb.build();
  EXPECT_TRUE(k.is_ok()) << k.status().to_string();
  return *k;
}

void PrintTo(const NormCase& c, std::ostream* os) {
  *os << c.name << " " << dt(c.dtype) << " " << c.rows << "x" << c.len;
}

class VmNorm : public ::testing::TestWithParam<NormCase> {};

TEST_P(VmNorm, MatchesReference) {
  const NormCase& c = GetParam();
  Kernel k = norm_kernel(c.norm, c.dtype);
  if (::testing::Test::HasFailure()) return;
  std::mt19937 rng(41);
  check(k,
        {make_buffer(c.dtype, {c.rows, c.len}, rng, c.transposed, c.transposed ? 5 : 0),
         make_buffer(c.dtype, {c.len}, rng)},
        {.tol = Tol::kReduce, .n = c.norm == Norm::kSoftmaxAxis0 ? c.rows : c.len});
}

std::vector<NormCase> norm_cases() {
  std::vector<NormCase> r;
  const std::pair<Norm, const char*> norms[] = {{Norm::kSoftmax, "Softmax"},
                                                {Norm::kLogSoftmax, "LogSoftmax"},
                                                {Norm::kLayerNorm, "LayerNorm"},
                                                {Norm::kRmsNorm, "RmsNorm"},
                                                {Norm::kSoftmaxAxis0, "SoftmaxAxis0"}};
  for (auto [n, name] : norms) {
    for (int64_t len : {1, 7, 1031, 4096, 16384, 16385, 20001})
      r.push_back({n, name, DType::kF32, len > 4096 ? 2 : 5, len, false});
    // No rows (max over an empty axis 0 is rejected, so not for the axis-0 softmax).
    if (n != Norm::kSoftmaxAxis0) r.push_back({n, name, DType::kF32, 0, 33, false});
    r.push_back({n, name, DType::kF32, 17, 1031, true});
    r.push_back({n, name, DType::kBF16, 3, 1031, false});
    r.push_back({n, name, DType::kF16, 2, 20001, false});
  }
  return r;
}

INSTANTIATE_TEST_SUITE_P(All, VmNorm, ::testing::ValuesIn(norm_cases()),
                         [](const ::testing::TestParamInfo<NormCase>& i) {
                           return std::string(i.param.name) + "_" + dt(i.param.dtype) + "_" +
                                  std::to_string(i.param.rows) + "x" + std::to_string(i.param.len) +
                                  (i.param.transposed ? "_T" : "");
                         });

// ---- large tensors (>= 1M elements) -----------------------------------------------------

TEST(VmLarge, UnaryTransposed) {
  KernelBuilder kb("large_exp");
  Dim S = kb.symbol("S"), H = kb.symbol("H");
  kb.store("y", kb.unary(UnaryOp::kExp, kb.load("x", DType::kF32, {S, H})));
  BUILD(kb, k);
  std::mt19937 rng(51);
  check(k, {make_buffer(DType::kF32, {1024, 1031}, rng, true, 1)}, {.tol = Tol::kTrans});
}

// The tile follows the output's order, so the input is read transposed (column chunks with
// tails, row chunks): a layout the encoder picks for permute-then-math kernels.
TEST(VmTransposedLoad, UnaryIntoOutputOrder) {
  KernelBuilder kb("transposed_tanh");
  Dim S = kb.symbol("S");
  kb.store("y", kb.unary(UnaryOp::kTanh, kb.transpose(kb.load("x", DType::kF32, {S, 16}), 0, 1)));
  BUILD(kb, k);
  std::mt19937 rng(52);
  for (int64_t s : {1, 7, 64, 70, 200, 1000})
    check(k, {make_buffer(DType::kF32, {s, 16}, rng, true, 1)},
          {.tol = Tol::kTrans, .what = "S=" + std::to_string(s)});
}

// Chain pairs that run as one kernel call (a producer whose only reader is the next mul or
// fma): mul * mul, unary * x, unary(a +- b) * x, (a * b) * c + e, with the product's operands
// either way round, contiguous, row-broadcast and column-broadcast, over tails and empty tiles.
TEST(VmFusedPairs, MatchReference) {
  KernelBuilder kb("pairs");
  Dim R = kb.symbol("R"), C = kb.symbol("C");
  Value a = kb.load("a", DType::kF32, {R, C});
  Value b = kb.load("b", DType::kF32, {R, C});
  Value bias = kb.load("bias", DType::kF32, {C});
  Value s = kb.load("s", DType::kF32, {R, 1});
  kb.store("silu_mul", kb.mul(kb.unary(UnaryOp::kSilu, a), b));
  kb.store("scaled_relu", kb.mul(s, kb.unary(UnaryOp::kRelu, kb.add(a, bias))));
  kb.store("norm_apply", kb.mul(kb.mul(a, s), bias));
  kb.store("exp_sub", kb.mul(kb.unary(UnaryOp::kExp, kb.sub(a, bias)), s));
  kb.store("gelu_bias", kb.mul(b, kb.unary(UnaryOp::kGeluTanh, kb.add(bias, a))));
  // A product feeding an fma's addend (neg included): one fused_mul_add call.
  kb.store("two_products", kb.add(kb.mul(a, bias), kb.mul(b, s)));
  kb.store("neg_product", kb.add(kb.mul(b, bias), kb.mul(kb.unary(UnaryOp::kNeg, a), s)));
  // A product feeding an fma's factor (layernorm's normalised value times weight plus bias):
  // one fused_mul_fma call.
  kb.store("affine_norm", kb.add(kb.mul(kb.mul(a, s), bias), b));
  BUILD(kb, k);
  std::mt19937 rng(54);
  for (auto [r, c] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 5}, {1, 1}, {5, 7}, {33, 32}, {300, 100}, {64, 4096}}) {
    check(k,
          {make_buffer(DType::kF32, {r, c}, rng, true, 2), make_buffer(DType::kF32, {r, c}, rng),
           make_buffer(DType::kF32, {c}, rng), make_buffer(DType::kF32, {r, 1}, rng)},
          {.tol = Tol::kTrans,
           .outs = {Out::kContig, Out::kStrided, Out::kContig, Out::kStrided, Out::kContig,
                    Out::kContig, Out::kStrided, Out::kContig},
           .what = std::to_string(r) + "x" + std::to_string(c)});
  }
}

// A map whose result the next instruction reduces along the row (a fill between) runs as one
// pass that stores the map and reduces it (cpu::map_reduce_f32_rows): softmax's exp(x - max)
// and its sum, layernorm's x + r and its mean and the centred values' sum of squares, a
// scaled max, a masked softmax's x * scale + mask (an fma) and its max; contiguous and per-row
// second operands, rows of one vector, tails, short and long rows, an empty tensor. Each is checked
// against the reference at 1, 2 and 7 threads.
TEST(VmMapReduce, MatchReference) {
  const auto softmax = [](KernelBuilder& kb, Value x, Value) {
    Value e = kb.unary(UnaryOp::kExp, kb.sub(x, kb.max(x, {-1}, true)));
    return kb.div(e, kb.sum(e, {-1}, true));
  };
  const auto layernorm = [](KernelBuilder& kb, Value x, Value r) {
    Value h = kb.add(x, r);
    Value hc = kb.sub(h, kb.mean(h, {-1}, true));
    Value var = kb.mean(kb.mul(hc, hc), {-1}, true);
    return kb.mul(hc, kb.unary(UnaryOp::kRsqrt, kb.binary(BinaryOp::kAdd, var, 1e-5)));
  };
  const auto scaled_max = [](KernelBuilder& kb, Value x, Value r) {
    Value s = kb.mul(x, r);
    return kb.sub(s, kb.max(s, {-1}, true));
  };
  const auto masked_softmax = [&](KernelBuilder& kb, Value x, Value mask) {
    return softmax(kb, kb.add(kb.binary(BinaryOp::kMul, x, 0.125), mask), mask);  // an fma
  };
  using Body = std::function<Value(KernelBuilder&, Value, Value)>;
  for (auto [name, body] :
       std::vector<std::pair<std::string, Body>>{{"softmax", softmax},
                                                 {"layernorm", layernorm},
                                                 {"scaled_max", scaled_max},
                                                 {"masked_softmax", masked_softmax}}) {
    KernelBuilder kb(name);
    Dim R = kb.symbol("R"), C = kb.symbol("C");
    Value x = kb.load("x", DType::kF32, {R, C});
    Value r = kb.load("r", DType::kF32, {R, C});
    kb.store("y", body(kb, x, r));
    BUILD(kb, k);
    std::mt19937 rng(55);
    for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 5}, {1, 1}, {5, 7}, {3, 16}, {33, 17}, {300, 100}, {7, 768}, {64, 4096}}) {
      // Contiguous operands (one pass), then transposed ones (the instructions one by one).
      for (bool transposed : {false, true}) {
        check(k,
              {make_buffer(DType::kF32, {rows, cols}, rng, transposed, 2),
               make_buffer(DType::kF32, {rows, cols}, rng, transposed, 1)},
              {.tol = Tol::kReduce,
               .n = cols,
               .what = name + " " + std::to_string(rows) + "x" + std::to_string(cols) +
                       (transposed ? " transposed" : "")});
      }
    }
  }
}

// Rotary embedding: math on a concat of slices is split at the concat's boundary into one
// sink per part (the concat read in place), over [S, H, D] tiles too small to dispatch one
// by one (the S axis then loops inside a block).
TEST(VmConcatSplit, RotaryMatchesReference) {
  for (DType t : {DType::kF32, DType::kBF16}) {
    KernelBuilder kb("rotary");
    Dim S = kb.symbol("S");
    Value x = kb.load("x", t, {S, 3, 10});
    Value c = kb.load("cos", t, {S, 1, 10});
    Value sn = kb.load("sin", t, {S, 1, 10});
    Value rot =
        kb.concat({kb.unary(UnaryOp::kNeg, kb.slice(x, 2, 5, 10)), kb.slice(x, 2, 0, 5)}, 2);
    kb.store("y", kb.add(kb.mul(x, c), kb.mul(rot, sn)));
    kb.store("z", kb.sub(rot, x));
    BUILD(kb, k);
    std::mt19937 rng(53);
    for (int64_t s : {0, 1, 7, 300, 5000})
      check(k,
            {make_buffer(t, {s, 3, 10}, rng, true, 1), make_buffer(t, {s, 1, 10}, rng, false, 1),
             make_buffer(t, {s, 1, 10}, rng, true, 1)},
            {.tol = Tol::kReduce,
             .n = 2,
             .outs = {Out::kStrided, Out::kContig},
             .what = "S=" + std::to_string(s)});
  }
}

// A loop of chains over [S, H, D] tiles with more chains than a block prepares at once (two
// outputs of three concat parts each): the chains past the prepared ones resolve per batch.
TEST(VmConcatSplit, ManyChainsInALoop) {
  KernelBuilder kb("many_chains");
  Dim S = kb.symbol("S");
  Value x = kb.load("x", DType::kF32, {S, 3, 12});
  Value c = kb.load("c", DType::kF32, {S, 1, 12});
  auto parts = [&](UnaryOp f, UnaryOp g, UnaryOp h) {
    return kb.concat({kb.unary(f, kb.slice(x, 2, 8, 12)), kb.unary(g, kb.slice(x, 2, 0, 4)),
                      kb.unary(h, kb.slice(x, 2, 4, 8))},
                     2);
  };
  kb.store("y", kb.add(kb.mul(parts(UnaryOp::kNeg, UnaryOp::kAbs, UnaryOp::kSigmoid), c), x));
  kb.store("z", kb.sub(kb.mul(parts(UnaryOp::kTanh, UnaryOp::kSigmoid, UnaryOp::kAbs), x), c));
  BUILD(kb, k);
  std::mt19937 rng(57);
  for (int64_t s : {0, 1, 7, 300})
    check(k, {make_buffer(DType::kF32, {s, 3, 12}, rng), make_buffer(DType::kF32, {s, 1, 12}, rng)},
          {.tol = Tol::kReduce, .n = 2, .what = "S=" + std::to_string(s)});
}

// Memory results of large launches are streamed around the caches (non-temporal stores on
// rows that start on a vector boundary, ordinary stores elsewhere; a fence before the
// launch's barrier). With the threshold at 0 every launch streams: the results still match
// the reference, across row widths that leave rows unaligned and across threads.
TEST(VmStreamStores, MatchReference) {
  vm::set_stream_threshold_bytes(0);
  KernelBuilder kb("streamed");
  Dim R = kb.symbol("R"), C = kb.symbol("C");
  Value x = kb.load("x", DType::kF32, {R, C});
  Value g = kb.load("g", DType::kF32, {C});
  Value ms = kb.mean(kb.mul(x, x), {-1}, true);
  kb.store("norm",
           kb.mul(kb.mul(x, kb.unary(UnaryOp::kRsqrt, kb.binary(BinaryOp::kAdd, ms, 1e-5))), g));
  Value e = kb.unary(UnaryOp::kExp, kb.sub(x, kb.max(x, {-1}, true)));
  kb.store("softmax", kb.div(e, kb.sum(e, {-1}, true)));
  kb.store("silu_mul", kb.mul(kb.unary(UnaryOp::kSilu, x), g));
  kb.store("affine", kb.add(kb.binary(BinaryOp::kMul, x, 2.0), g));
  // A transposed source: its tile columns are short strided runs, prefetched rows ahead.
  kb.store("transposed", kb.binary(BinaryOp::kMul, kb.transpose(x, 0, 1), 0.5));
  BUILD(kb, k);
  std::mt19937 rng(58);
  for (auto [r, c] :
       {std::pair<int64_t, int64_t>{1, 16}, {7, 37}, {64, 64}, {300, 100}, {33, 4096}})
    check(k, {make_buffer(DType::kF32, {r, c}, rng), make_buffer(DType::kF32, {c}, rng)},
          {.tol = Tol::kReduce, .n = 2, .what = std::to_string(r) + "x" + std::to_string(c)});
  // Loops of chains stream too: rotary's chain pair over the heads' halves, and a permute
  // times a scale (chains of one member), at head sizes that leave rows unaligned.
  for (auto [s, h, d] : std::vector<std::array<int64_t, 3>>{{5, 8, 64}, {7, 3, 36}, {300, 2, 32}}) {
    KernelBuilder rb("streamed_loops");
    Dim S = rb.symbol("S"), H = rb.symbol("H");
    Value q = rb.load("q", DType::kF32, {S, H, d});
    Value cs = rb.load("cos", DType::kF32, {S, 1, d});
    Value sn = rb.load("sin", DType::kF32, {S, 1, d});
    Value rot =
        rb.concat({rb.unary(UnaryOp::kNeg, rb.slice(q, 2, d / 2, d)), rb.slice(q, 2, 0, d / 2)}, 2);
    rb.store("rotary", rb.add(rb.mul(q, cs), rb.mul(rot, sn)));
    rb.store("heads", rb.binary(BinaryOp::kMul, rb.permute(q, {1, 0, 2}), 0.125));
    BUILD(rb, loops);
    check(
        loops,
        {make_buffer(DType::kF32, {s, h, d}, rng), make_buffer(DType::kF32, {s, 1, d}, rng),
         make_buffer(DType::kF32, {s, 1, d}, rng)},
        {.tol = Tol::kReduce,
         .n = 2,
         .what = "loops " + std::to_string(s) + "x" + std::to_string(h) + "x" + std::to_string(d)});
  }
  vm::set_stream_threshold_bytes(-1);
}

// A tile of a permuted source ([S, H, D] read as [H, S, D]) reads every H-th run of D: the
// grid walks the heads right after the tile's rows, so that consecutive blocks fill those
// holes while the lines and pages are fresh, and the tile's columns stay last. A source
// read densely keeps the usual order (outer axes slowest).
TEST(VmLayout, PermutedRowsWalkTheirHolesNext) {
  KernelBuilder kb("heads");
  Value x = kb.load("x", DType::kF32, {kb.symbol("S"), 12, 64});
  kb.store("y", kb.binary(BinaryOp::kMul, kb.permute(x, {1, 0, 2}), 0.125));
  BUILD(kb, k);
  std::mt19937 rng(61);
  std::vector<Buffer> bufs = {make_buffer(DType::kF32, {300, 12, 64}, rng),
                              make_buffer(DType::kF32, {12, 300, 64}, rng)};
  const TensorArg in[] = {bufs[0].arg}, out[] = {bufs[1].arg};
  const bc::Program p = encode_for(k, in, out).programs.at(0);
  int row = -1, col = -1, heads = -1;
  for (int a = 0; a < static_cast<int>(p.axes.size()); ++a) {
    if (p.axes[a].tile == bc::AxisTile::kRow) row = a;
    if (p.axes[a].tile == bc::AxisTile::kCol) col = a;
    if (p.axes[a].tile == bc::AxisTile::kNone && p.axes[a].extent == 12) heads = a;
  }
  ASSERT_GE(row, 0);
  ASSERT_GE(heads, 0) << bc::disassemble(p);
  EXPECT_EQ(p.axes[row].extent, 300) << bc::disassemble(p);
  EXPECT_LT(row, heads) << bc::disassemble(p);
  EXPECT_LT(heads, col) << bc::disassemble(p);
  check(k, {bufs[0]}, {.what = "permuted heads"});

  KernelBuilder db("dense");
  Value z = db.load("z", DType::kF32, {db.symbol("S"), 12, 64});
  Value g = db.load("g", DType::kF32, {1, 12, 1});  // stops the axes folding into one
  db.store("y", db.mul(z, g));
  BUILD(db, dense);
  std::vector<Buffer> dbufs = {make_buffer(DType::kF32, {300, 12, 64}, rng),
                               make_buffer(DType::kF32, {1, 12, 1}, rng),
                               make_buffer(DType::kF32, {300, 12, 64}, rng)};
  const TensorArg din[] = {dbufs[0].arg, dbufs[1].arg}, dout[] = {dbufs[2].arg};
  const bc::Program q = encode_for(dense, din, dout).programs.at(0);
  int seq = -1, rows = -1;
  for (int a = 0; a < static_cast<int>(q.axes.size()); ++a) {
    if (q.axes[a].extent == 300) seq = a;
    if (q.axes[a].tile == bc::AxisTile::kRow) rows = a;
  }
  ASSERT_GE(seq, 0) << bc::disassemble(q);
  EXPECT_LT(seq, rows) << bc::disassemble(q);  // no hole: the outer axis walks slowest
  check(dense, {dbufs[0], dbufs[1]}, {.what = "dense heads"});
}

// A head merge ([H, S, D] read as [S, H, D]) tiles S rows of one head: the source's rows are
// then one run, not 12 rows from 12 places (layout.cc, gathered_row_swap). An operand shared
// by the heads (broadcast along H, as rotary's cos) keeps the head rows.
TEST(VmLayout, GatheredHeadRowsTileTheLongAxis) {
  const auto row_extent = [](const bc::Program& p) {
    for (const bc::Axis& ax : p.axes)
      if (ax.tile == bc::AxisTile::kRow) return ax.extent;
    return int64_t{-1};
  };
  std::mt19937 rng(62);
  KernelBuilder kb("merge");
  dvm::Dim S = kb.symbol("S");
  Value x = kb.load("x", DType::kF32, {12, S, 64});
  Value res = kb.load("res", DType::kF32, {S, 12, 64});
  kb.store("y", kb.add(kb.permute(x, {1, 0, 2}), res));
  BUILD(kb, k);
  for (int64_t s : {1, 7, 300}) {
    std::vector<Buffer> bufs = {make_buffer(DType::kF32, {12, s, 64}, rng),
                                make_buffer(DType::kF32, {s, 12, 64}, rng),
                                make_buffer(DType::kF32, {s, 12, 64}, rng)};
    const TensorArg in[] = {bufs[0].arg, bufs[1].arg}, out[] = {bufs[2].arg};
    const bc::Program p = encode_for(k, in, out).programs.at(0);
    if (s == 300) {
      EXPECT_EQ(row_extent(p), 300) << bc::disassemble(p);
    }
    check(k, {bufs[0], bufs[1]}, {.what = "merged heads"});
  }

  KernelBuilder sb("shared");
  dvm::Dim T = sb.symbol("S");
  Value z = sb.load("z", DType::kF32, {12, T, 64});
  Value c = sb.load("c", DType::kF32, {T, 1, 64});
  sb.store("y", sb.mul(sb.permute(z, {1, 0, 2}), c));
  BUILD(sb, shared);
  std::vector<Buffer> sbufs = {make_buffer(DType::kF32, {12, 300, 64}, rng),
                               make_buffer(DType::kF32, {300, 1, 64}, rng),
                               make_buffer(DType::kF32, {300, 12, 64}, rng)};
  const TensorArg sin[] = {sbufs[0].arg, sbufs[1].arg}, sout[] = {sbufs[2].arg};
  const bc::Program q = encode_for(shared, sin, sout).programs.at(0);
  EXPECT_EQ(row_extent(q), 12) << bc::disassemble(q);
  check(shared, {sbufs[0], sbufs[1]}, {.what = "heads sharing an operand"});
}

// Rotary embedding at model head sizes, contiguous: cos and sin are the same for every head,
// so rows of whole vectors keep them in registers across the heads (MulAddRowsShared, one to
// four vectors a row); other sizes take the per-vector path.
TEST(VmConcatSplit, RotaryHeadSizes) {
  for (int64_t d : {32, 64, 128, 96, 40}) {
    KernelBuilder kb("rotary_heads");
    Dim S = kb.symbol("S");
    Value x = kb.load("x", DType::kF32, {S, 8, d});
    Value c = kb.load("cos", DType::kF32, {S, 1, d});
    Value sn = kb.load("sin", DType::kF32, {S, 1, d});
    Value rot =
        kb.concat({kb.unary(UnaryOp::kNeg, kb.slice(x, 2, d / 2, d)), kb.slice(x, 2, 0, d / 2)}, 2);
    kb.store("y", kb.add(kb.mul(x, c), kb.mul(rot, sn)));
    BUILD(kb, k);
    std::mt19937 rng(56);
    for (int64_t s : {1, 5, 300})
      check(k,
            {make_buffer(DType::kF32, {s, 8, d}, rng), make_buffer(DType::kF32, {s, 1, d}, rng),
             make_buffer(DType::kF32, {s, 1, d}, rng)},
            {.tol = Tol::kReduce,
             .n = 2,
             .what = "D=" + std::to_string(d) + " S=" + std::to_string(s)});
  }
}

// Row reductions of values computed just before them run in the same chain (exp(x - max)
// summed strip by strip without a pass through a register; x - max kept for after): log
// softmax, a sum of squares of centred values, and a max and min of scaled values, over
// short rows, tails, rows longer than a strip, and an empty tensor.
TEST(VmChainReductions, MatchReference) {
  KernelBuilder kb("chain_red");
  Dim R = kb.symbol("R"), C = kb.symbol("C");
  Value x = kb.load("x", DType::kF32, {R, C});
  Value g = kb.load("g", DType::kF32, {C});
  Value c = kb.sub(x, kb.max(x, {-1}, true));
  kb.store("logsoftmax",
           kb.sub(c, kb.unary(UnaryOp::kLog, kb.sum(kb.unary(UnaryOp::kExp, c), {-1}, true))));
  Value h = kb.sub(x, kb.mean(x, {-1}, true));
  kb.store("var", kb.sum(kb.mul(h, h), {-1}, true));
  Value s = kb.mul(x, g);
  kb.store("range", kb.sub(kb.max(s, {-1}, true),
                           kb.reduce(ReduceOp::kMin, kb.unary(UnaryOp::kTanh, s), {-1}, true)));
  BUILD(kb, k);
  std::mt19937 rng(55);
  for (bool transposed : {false, true}) {
    for (auto [r, cols] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 5}, {1, 1}, {5, 7}, {33, 32}, {7, 1100}, {3, 16384}, {2, 20000}}) {
      check(k,
            {make_buffer(DType::kF32, {r, cols}, rng, transposed, 2),
             make_buffer(DType::kF32, {cols}, rng)},
            {.tol = Tol::kReduce,
             .n = cols,
             .outs = {Out::kStrided, Out::kContig, Out::kContig},
             .what = std::to_string(r) + "x" + std::to_string(cols) +
                     (transposed ? " transposed" : "")});
    }
  }
  auto ck = CompiledKernel::create(k).value();
  Buffer xb = make_buffer(DType::kF32, {7, 1100}, rng), gb = make_buffer(DType::kF32, {1100}, rng);
  Buffer y = make_buffer(DType::kF32, {7, 1100}, rng), v = make_buffer(DType::kF32, {7, 1}, rng),
         w = make_buffer(DType::kF32, {7, 1}, rng);
  TensorArg ins[] = {xb.arg, gb.arg}, outs[] = {y.arg, v.arg, w.arg};
  auto text = ck->disassemble(ins, outs);
  ASSERT_TRUE(text.is_ok());
  EXPECT_NE(text->find("chain.f32.full body 3 keep 0"), std::string::npos) << *text;
}

// How many instructions of the programs the VM plans one way: a per-instruction plan of
// vm::LoadedProgram (chain_sum_exp, loop_col_reduce...) counted where it is set.
int count_planned(const enc::EncodedKernel& ek, std::vector<char> vm::LoadedProgram::*plan) {
  int n = 0;
  for (const bc::Program& p : ek.programs) {
    const auto lp = vm::load(p);
    for (char v : (*lp).*plan) n += v != 0;
  }
  return n;
}

// Outputs whose shapes differ only in size-1 dims share one stage: a residual sum after a
// matmul stored as [S, H] and, squared, as [1, S, H] (the norm after Llama's MLP) is one
// program that computes the matmul once, not two programs that compute it once each. The
// other way round ([1, S, H] first), and with a [S, 1, H] output too.
TEST(VmStages, OutputsDifferingInUnitDimsShareOneStage) {
  std::mt19937 rng(61);
  for (int order = 0; order < 2; ++order) {
    KernelBuilder kb("residual_then_norm_input");
    Dim S = kb.symbol("S");
    Value x = kb.load("x", DType::kF32, {S, 64});
    Value w = kb.load("w", DType::kF32, {64, 48});
    Value r = kb.load("r", DType::kF32, {S, 48});
    Value h = kb.add(r, kb.matmul(x, w));
    Value h3 = kb.reshape(h, {1, -1, 48});
    if (order == 0) {
      kb.store("h", h);
      kb.store("sq", kb.mul(h3, h3));
    } else {
      kb.store("sq", kb.mul(h3, h3));
      kb.store("h", h);
      kb.store("mid", kb.unary(UnaryOp::kNeg, kb.reshape(h, {-1, 1, 48})));
    }
    BUILD(kb, k);
    for (int64_t s : {int64_t{1}, int64_t{37}, int64_t{300}}) {
      std::vector<Buffer> in = {make_buffer(DType::kF32, {s, 64}, rng),
                                make_buffer(DType::kF32, {64, 48}, rng),
                                make_buffer(DType::kF32, {s, 48}, rng)};
      const std::string what = "order " + std::to_string(order) + " S=" + std::to_string(s);
      check(k, in, {.tol = Tol::kReduce, .n = 64, .what = what});
      std::vector<Buffer> out = {make_buffer(DType::kF32, {s, 48}, rng),
                                 make_buffer(DType::kF32, {1, s, 48}, rng)};
      if (order == 1) {
        std::swap(out[0], out[1]);
        out.push_back(make_buffer(DType::kF32, {s, 1, 48}, rng));
      }
      const enc::EncodedKernel ek = encode_for(k, args_of(in), args_of(out));
      EXPECT_EQ(ek.programs.size(), 1u) << what;
    }
  }
}

// A streamed launch of a multi-pass program queues the next block's input rows for
// prefetching once a block's first pass over them has run (LoadedProgram::prefetch_descs,
// prefetch_at; vm::block_prefetch): each block's span is exactly its rows of x, the last
// block's short; nothing is queued for outputs, for a single-pass program, or for an input
// read transposed. (Prefetches change no result: VmStreamStores runs these programs.)
TEST(VmPrefetchQueue, QueuesEachBlocksRowsOfItsInputs) {
  KernelBuilder kb("softmax");
  Dim R = kb.symbol("R"), C = kb.symbol("C");
  Value x = kb.load("x", DType::kF32, {R, C});
  Value e = kb.unary(UnaryOp::kExp, kb.sub(x, kb.max(x, {-1}, true)));
  kb.store("y", kb.div(e, kb.sum(e, {-1}, true)));
  BUILD(kb, k);
  std::mt19937 rng(59);
  const int64_t rows = 1000, cols = 100;
  Buffer xb = make_buffer(DType::kF32, {rows, cols}, rng);
  Buffer yb = make_buffer(DType::kF32, {rows, cols}, rng);
  TensorArg ins[] = {xb.arg}, outs[] = {yb.arg};
  const enc::EncodedKernel ek = encode_for(k, ins, outs);
  ASSERT_EQ(ek.programs.size(), 1u);
  const auto lp = vm::load(ek.programs[0]);
  ASSERT_EQ(lp->prefetch_descs.size(), 1u);  // x, not y
  EXPECT_GT(lp->prefetch_at, 0);
  const bc::Program& p = lp->program;
  ASSERT_GE(lp->row_axis, 0);
  const int64_t chunk = p.axes[lp->row_axis].chunk;
  ASSERT_GT(p.grid, 2);  // several blocks, the last one short
  ASSERT_NE(rows % chunk, 0);
  void* slots[] = {xb.arg.data, yb.arg.data};
  const char* base = static_cast<const char*>(xb.arg.data);
  for (int64_t b = 0; b < p.grid; ++b) {
    const vm::cpu::PrefetchQueue q = vm::block_prefetch(*lp, slots, b);
    ASSERT_EQ(q.spans, 1);
    const int64_t r0 = b * chunk, r1 = std::min(rows, r0 + chunk);
    EXPECT_EQ(q.next[0], base + r0 * cols * 4) << "block " << b;
    EXPECT_EQ(q.end[0], base + r1 * cols * 4) << "block " << b;
  }
  // One pass (silu(x) * g: a chain that reads and stores): no later pass would drain a queue.
  KernelBuilder sb("silu_mul");
  Dim N = sb.symbol("N");
  sb.store("y", sb.mul(sb.unary(UnaryOp::kSilu, sb.load("a", DType::kF32, {N})),
                       sb.load("b", DType::kF32, {N})));
  BUILD(sb, single);
  Buffer a = make_buffer(DType::kF32, {100000}, rng), bb = make_buffer(DType::kF32, {100000}, rng);
  Buffer out = make_buffer(DType::kF32, {100000}, rng);
  TensorArg sin[] = {a.arg, bb.arg}, sout[] = {out.arg};
  for (const bc::Program& sp : encode_for(single, sin, sout).programs) {
    const auto slp = vm::load(sp);
    EXPECT_TRUE(slp->prefetch_descs.empty());
    EXPECT_EQ(slp->prefetch_at, -1);
  }
  // x read transposed: its tile rows are not back to back.
  Buffer xt = make_buffer(DType::kF32, {rows, cols}, rng, /*transposed=*/true);
  TensorArg tin[] = {xt.arg};
  for (const bc::Program& tp : encode_for(k, tin, outs).programs)
    EXPECT_TRUE(vm::load(tp)->prefetch_descs.empty());
}

// Log-softmax's middle pass (x - max kept, exp, sum) runs as one map_reduce pass over whole
// rows (LoadedProgram::chain_sum_exp, cpu::kRowSumExp): results against the reference for
// short, long (several strips) and single-column rows (blocks of 256 rows), broadcast and
// strided operands; the plan is counted where the operands are contiguous.
TEST(VmMapReduce, LogSoftmaxSumsExpInOnePass) {
  for (bool plus : {false, true}) {
    KernelBuilder kb(plus ? "log_softmax_plus" : "log_softmax");
    Dim R = kb.symbol("R"), C = kb.symbol("C");
    Value x = kb.load("x", DType::kF32, {R, C});
    // x + (-max) exercises the add form of the pass.
    Value c = plus ? kb.add(x, kb.unary(UnaryOp::kNeg, kb.max(x, {-1}, true)))
                   : kb.sub(x, kb.max(x, {-1}, true));
    kb.store("y",
             kb.sub(c, kb.unary(UnaryOp::kLog, kb.sum(kb.unary(UnaryOp::kExp, c), {-1}, true))));
    BUILD(kb, k);
    std::mt19937 rng(57);
    for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 5}, {1, 1}, {5, 7}, {64, 64}, {300, 100}, {3, 5000}, {5000, 1}}) {
      for (bool transposed : {false, true}) {
        std::vector<Buffer> in = {make_buffer(DType::kF32, {rows, cols}, rng, transposed, 2)};
        const std::string what = std::string(plus ? "plus " : "") + std::to_string(rows) + "x" +
                                 std::to_string(cols) + (transposed ? " transposed" : "");
        check(k, in, {.tol = Tol::kTrans, .what = what});
        if (transposed || rows < 5 || cols == 1) continue;
        const enc::EncodedKernel ek =
            encode_for(k, args_of(in), args_of({make_buffer(DType::kF32, {rows, cols}, rng)}));
        EXPECT_EQ(count_planned(ek, &vm::LoadedProgram::chain_sum_exp), 1) << what;
      }
    }
  }
}

// A sum (max, min) over a middle axis, [A, M, C] -> [A, C]: a loop over A whose body is one
// column reduction into a row stored to memory runs its trips without the interpreter
// (LoadedProgram::loop_col_reduce), each straight into its output row. Checked against the
// reference and bitwise across thread counts (blocks split the trips differently, each
// block's last trip going through the body), the plan counted where it applies; a
// transposed output (not contiguous along C) takes the body trip by trip.
TEST(VmLoopColReduce, MiddleAxisReductions) {
  std::mt19937 rng(73);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    KernelBuilder kb("mid_reduce");
    Dim A = kb.symbol("A"), M = kb.symbol("M"), C = kb.symbol("C");
    Value x = kb.load("x", DType::kF32, {A, M, C});
    kb.store("y", kb.reduce(op, x, {1}));
    BUILD(kb, k);
    for (auto [a, m, c] : std::vector<std::array<int64_t, 3>>{
             {1, 16, 64}, {64, 16, 64}, {5, 2, 7}, {33, 9, 100}, {200, 3, 1}, {7, 40, 33}}) {
      std::vector<Buffer> in = {make_buffer(DType::kF32, {a, m, c}, rng)};
      const std::string what = std::string(reduce_op_name(op)) + " " + std::to_string(a) + "x" +
                               std::to_string(m) + "x" + std::to_string(c);
      check(k, in, {.tol = Tol::kReduce, .what = what});
      check(k, in, {.tol = Tol::kReduce, .outs = {Out::kTransposed}, .what = what + " ^T"});
      if (a == 64 && m == 16) {
        const enc::EncodedKernel ek =
            encode_for(k, args_of(in), args_of({make_buffer(DType::kF32, {a, c}, rng)}));
        EXPECT_EQ(count_planned(ek, &vm::LoadedProgram::loop_col_reduce), 1) << what;
      }
    }
  }
}

// [B, S, H, D] -> [B, H, S, D] times a scale (attention's head split): the tile is [S, D] and
// a loop walks the heads, its body one instruction from memory to memory. Such bodies become
// chains of one (Emitter::chain_loop_bodies), so the loop runs as a loop of chains (one 3-D
// kernel call per batch of trips, not an interpreted trip each). Checked against the
// reference with tails, strided and offset outputs, and with two outputs in one body; the
// plan counted.
TEST(VmLoopOfChains, SingleInstructionBodiesRunAsChains) {
  std::mt19937 rng(97);
  for (bool two_outputs : {false, true}) {
    KernelBuilder kb(two_outputs ? "heads_two" : "heads_scale");
    Dim S = kb.symbol("S"), H = kb.symbol("H"), D = kb.symbol("D");
    Value x = kb.load("x", DType::kF32, {1, S, H, D});
    Value p = kb.permute(x, {0, 2, 1, 3});
    kb.store("y", kb.binary(BinaryOp::kMul, p, 0.125));
    if (two_outputs) kb.store("z", kb.unary(UnaryOp::kExp, p));
    BUILD(kb, k);
    for (auto [s, h, d] : std::vector<std::array<int64_t, 3>>{
             {5, 12, 64}, {1, 3, 7}, {17, 4, 33}, {300, 2, 16}, {2, 40, 3}}) {
      std::vector<Buffer> in = {make_buffer(DType::kF32, {1, s, h, d}, rng)};
      const std::string what = std::string(two_outputs ? "two " : "") + std::to_string(s) + "x" +
                               std::to_string(h) + "x" + std::to_string(d);
      for (Out o : {Out::kContig, Out::kStrided, Out::kOffset})
        check(k, in, {.tol = Tol::kTrans, .outs = {o, o}, .what = what});
      if (s == 5 && h == 12) {
        std::vector<Buffer> outs = {make_buffer(DType::kF32, {1, h, s, d}, rng)};
        if (two_outputs) outs.push_back(make_buffer(DType::kF32, {1, h, s, d}, rng));
        const enc::EncodedKernel ek = encode_for(k, args_of(in), args_of(outs));
        EXPECT_EQ(count_planned(ek, &vm::LoadedProgram::loop_of_chains), 1) << what;
      }
    }
  }
}

// Row statistics of at most 16 elements (a norm's mean, rsqrt, scale) are computed in the
// interpreter rather than by tile kernels (BlockRunner::exec_small); both paths must give
// the same bits, or a row would change with the tile it lands in. Each op the path takes
// (fill, add, sub, mul, div, fma, neg, abs, sqrt, rsqrt, reciprocal) over row and column
// vectors, with the path on and off, against the reference and bitwise.
TEST(VmSmallTiles, SmallStatisticsMatchTheKernelsBitwise) {
  for (int axis : {-1, 0}) {
    KernelBuilder kb(axis < 0 ? "row_stats" : "col_stats");
    Dim R = kb.symbol("R"), C = kb.symbol("C");
    Value x = kb.load("x", DType::kF32, {R, C});
    Value m = kb.mean(x, {axis}, true);
    Value v = kb.mean(kb.mul(x, x), {axis}, true);
    Value s = kb.unary(UnaryOp::kRsqrt, kb.add(kb.mul(v, kb.constant(0.75)), kb.constant(1e-3)));
    Value t = kb.unary(UnaryOp::kSqrt, kb.unary(UnaryOp::kAbs, m));
    Value u = kb.unary(UnaryOp::kReciprocal, kb.mul(t, kb.constant(3.0)));
    Value w = kb.div(kb.unary(UnaryOp::kNeg, s), kb.sub(u, kb.constant(-3.0)));
    kb.store("y", kb.add(kb.mul(x, w), m));
    BUILD(kb, k);
    std::mt19937 rng(101);
    for (auto [r, c] : std::vector<std::pair<int64_t, int64_t>>{
             {1, 64}, {5, 768}, {10, 64}, {16, 33}, {17, 8}, {3, 5}}) {
      const int64_t rows = axis < 0 ? r : c, cols = axis < 0 ? c : r;
      std::vector<Buffer> in = {make_buffer(DType::kF32, {rows, cols}, rng)};
      const std::string what = std::string(axis < 0 ? "rows " : "cols ") + std::to_string(rows) +
                               "x" + std::to_string(cols);
      check(k, in, {.tol = Tol::kReduce, .n = axis < 0 ? cols : rows, .what = what});
      CompileOptions one;
      one.num_threads = 1;
      auto ck = CompiledKernel::create(k, one).value();
      const auto run = [&](bool small) {
        vm::set_small_tile_path(small);
        std::vector<float> y(static_cast<size_t>(rows * cols), -1.0f);
        const TensorArg out[] = {TensorArg::contiguous(y.data(), DType::kF32, {rows, cols})};
        EXPECT_TRUE(ck->run(args_of(in), out).is_ok()) << what;
        vm::set_small_tile_path(true);
        return y;
      };
      EXPECT_EQ(run(true), run(false)) << what;
    }
  }
}

// Row programs (vm::LoadedProgram::row_steps): a block of a norm or softmax runs as one kernel
// call, band of rows by band of rows, its map and reduction steps fused in pairs. Each kernel
// here must be planned as a row program, match the reference at 1, 2 and 7 threads, and give
// the bits of the instruction-by-instruction path, at one row, tails, rows longer than a
// chain's strip, bands of one row and of many (two budgets), with a param, a strided input, a
// second output of the residual sum and a [R, 1] output.
TEST(VmRowPrograms, NormsMatchTheInstructionPathBitwise) {
  struct Case {
    const char* name;
    std::function<Kernel()> build;
    int row_inputs;  // [R, C] inputs (the first read through a strided view when asked)
    int col_inputs;  // [C] inputs
    bool param;      // a float param (the softmax scale)
  };
  const auto norm_kernel = [](const char* name, auto body) {
    KernelBuilder kb(name);
    Dim R = kb.symbol("R"), C = kb.symbol("C");
    body(kb, R, C);
    auto k = kb.build();
    EXPECT_TRUE(k.is_ok()) << k.status().to_string();
    return *k;
  };
  const std::vector<Case> cases = {
      {"add_layernorm",
       [&] {
         return norm_kernel("add_layernorm", [](KernelBuilder& kb, Dim R, Dim C) {
           Value h = kb.add(kb.load("x", DType::kF32, {R, C}), kb.load("res", DType::kF32, {R, C}));
           Value hc = kb.sub(h, kb.mean(h, {-1}, true));
           Value var = kb.mean(kb.mul(hc, hc), {-1}, true);
           Value rstd = kb.unary(UnaryOp::kRsqrt, kb.binary(BinaryOp::kAdd, var, 1e-5));
           Value g = kb.load("g", DType::kF32, {C}), b = kb.load("b", DType::kF32, {C});
           kb.store("y", kb.add(kb.mul(kb.mul(hc, rstd), g), b));
           kb.store("h", h);
         });
       },
       2, 2, false},
      {"softmax",
       [&] {
         return norm_kernel("softmax", [](KernelBuilder& kb, Dim R, Dim C) {
           Value s = kb.mul(kb.load("x", DType::kF32, {R, C}), kb.param("scale", DType::kF32));
           Value e = kb.unary(UnaryOp::kExp, kb.sub(s, kb.max(s, {-1}, true)));
           kb.store("y", kb.div(e, kb.sum(e, {-1}, true)));
         });
       },
       1, 0, true},
      {"log_softmax",
       [&] {
         return norm_kernel("log_softmax", [](KernelBuilder& kb, Dim R, Dim C) {
           Value x = kb.load("x", DType::kF32, {R, C});
           Value c = kb.sub(x, kb.max(x, {-1}, true));
           Value lse = kb.unary(UnaryOp::kLog, kb.sum(kb.unary(UnaryOp::kExp, c), {-1}, true));
           kb.store("y", kb.sub(c, lse));
         });
       },
       1, 0, false},
      {"rmsnorm",
       [&] {
         return norm_kernel("rmsnorm", [](KernelBuilder& kb, Dim R, Dim C) {
           Value x = kb.load("x", DType::kF32, {R, C});
           Value ms = kb.mean(kb.mul(x, x), {-1}, true);
           Value rstd = kb.unary(UnaryOp::kRsqrt, kb.binary(BinaryOp::kAdd, ms, 1e-6));
           kb.store("y", kb.mul(kb.mul(x, rstd), kb.load("g", DType::kF32, {C})));
           kb.store("ms", ms);
         });
       },
       1, 1, false},
      // Unary steps with and without a pre-op (add of a column, sub of a row statistic) into
      // memory and into registers, and a row step's pre-add with a constant.
      {"unary_norm",
       [&] {
         return norm_kernel("unary_norm", [](KernelBuilder& kb, Dim R, Dim C) {
           Value x = kb.load("x", DType::kF32, {R, C});
           Value mu = kb.mean(x, {-1}, true);
           kb.store("t", kb.unary(UnaryOp::kTanh, kb.sub(x, mu)));
           Value s = kb.unary(UnaryOp::kSigmoid, kb.add(x, kb.load("g", DType::kF32, {C})));
           Value r = kb.unary(UnaryOp::kRsqrt, kb.binary(BinaryOp::kAdd, kb.mul(mu, mu), 1.0));
           kb.store("y", kb.add(kb.mul(s, r), kb.unary(UnaryOp::kErf, x)));
         });
       },
       1, 1, false},
  };
  std::mt19937 rng(211);
  for (const Case& c : cases) {
    const Kernel k = c.build();
    for (auto [rows, cols, strided] :
         std::vector<std::tuple<int64_t, int64_t, bool>>{{1, 128, false},
                                                         {3, 130, true},
                                                         {17, 1000, false},
                                                         {5, 1500, true},
                                                         {300, 256, false},
                                                         {2, 4096, false},
                                                         {40, 768, true}}) {
      std::vector<Buffer> in;
      for (int i = 0; i < c.row_inputs; ++i) {
        if (strided && i == 0) {  // rows of a wider tensor: row stride cols + 7
          Buffer b = make_buffer(DType::kF32, {rows, cols + 7}, rng);
          b.arg.shape = {rows, cols};
          b.arg.strides = {cols + 7, 1};
          in.push_back(std::move(b));
        } else {
          in.push_back(make_buffer(DType::kF32, {rows, cols}, rng));
        }
      }
      for (int i = 0; i < c.col_inputs; ++i) in.push_back(make_buffer(DType::kF32, {cols}, rng));
      const std::vector<ScalarArg> params =
          c.param ? std::vector<ScalarArg>{ScalarArg::of_float(0.125)} : std::vector<ScalarArg>{};
      const std::string what = std::string(c.name) + " " + std::to_string(rows) + "x" +
                               std::to_string(cols) + (strided ? " strided" : "");
      // Planned as a row program (else the comparisons below would test nothing new), except
      // for a single row: its row axis drops out of the tile.
      std::vector<Buffer> outs;
      CompileOptions one;
      one.num_threads = 1;
      auto ck = CompiledKernel::create(k, one).value();
      const auto shapes = ck->infer_output_shapes(args_of(in)).value();
      for (const auto& shape : shapes) outs.push_back(make_out(DType::kF32, shape, Out::kContig));
      const enc::EncodedKernel ek = encode_for(k, args_of(in), args_of(outs));
      EXPECT_EQ(std::any_of(ek.programs.begin(), ek.programs.end(),
                            [](const bc::Program& p) { return !vm::load(p)->row_steps.empty(); }),
                rows > 1)
          << what << ": row program planned or not";
      check(k, in, {.tol = Tol::kReduce, .n = cols, .params = params, .what = what});
      const auto run = [&](bool row_programs, int64_t band_bytes) {
        vm::set_row_programs(row_programs);
        vm::set_row_band_bytes(band_bytes);
        std::vector<Buffer> o;
        for (const auto& shape : shapes) o.push_back(make_out(DType::kF32, shape, Out::kContig));
        std::vector<TensorArg> oa = args_of(o);
        EXPECT_TRUE(ck->run(args_of(in), oa, params).is_ok()) << what;
        vm::set_row_programs(true);
        vm::set_row_band_bytes(-1);
        std::vector<std::vector<char>> bytes;
        for (const Buffer& b : o) bytes.push_back(b.bytes);
        return bytes;
      };
      const auto plain = run(false, -1);
      EXPECT_EQ(run(true, -1), plain) << what << ": row program, default bands";
      EXPECT_EQ(run(true, 1), plain) << what << ": row program, bands of one row";
      // A launch beyond the last-level cache streams its stores and fetches its sources ahead:
      // forced here by a threshold of 0 bytes.
      vm::set_stream_threshold_bytes(0);
      EXPECT_EQ(run(true, -1), plain) << what << ": row program, streamed";
      EXPECT_EQ(run(true, 1), plain) << what << ": row program, streamed, bands of one row";
      vm::set_stream_threshold_bytes(-1);
    }
  }
}

// A transposed source ([C, R], read as [R, C]) goes through cpu::transpose_f32: 8x8 blocks,
// then 4x4 blocks for the rows those leave (or all rows when R < 8), then single elements.
// Every row count from 1 to 13 against column counts around the block sizes, exact data
// movement checked through an exact scale (x * 0.5 + z).
TEST(VmTranspose, TransposedSourcesOfEveryRowCount) {
  KernelBuilder kb("transpose_add");
  Dim R = kb.symbol("R"), C = kb.symbol("C");
  Value xt = kb.transpose(kb.load("x", DType::kF32, {C, R}), 0, 1);
  Value z = kb.load("z", DType::kF32, {R, C});
  kb.store("y", kb.add(kb.binary(BinaryOp::kMul, xt, 0.5), z));
  BUILD(kb, k);
  std::mt19937 rng(103);
  for (int64_t r = 1; r <= 13; ++r) {
    for (int64_t c : {1, 3, 4, 7, 9, 33, 1024}) {
      std::vector<Buffer> in = {make_buffer(DType::kF32, {c, r}, rng),
                                make_buffer(DType::kF32, {r, c}, rng)};
      check(k, in, {.tol = Tol::kArith, .what = std::to_string(r) + "x" + std::to_string(c)});
    }
  }
  // Tiles: 64 columns where the transposed source's lines serve many rows (square tiles); a
  // whole [C, R] source read as [R, C] with few rows is one contiguous run at any tile width,
  // so there the tile takes every column that fits (one block instead of 16 at R = 4).
  const auto col_chunk = [&](int64_t r, int64_t c) {
    const enc::EncodedKernel ek = encode_for(
        k, args_of({make_buffer(DType::kF32, {c, r}, rng), make_buffer(DType::kF32, {r, c}, rng)}),
        args_of({make_buffer(DType::kF32, {r, c}, rng)}));
    EXPECT_EQ(ek.programs.size(), 1u);
    const bc::Program& p = ek.programs[0];
    for (const bc::Axis& ax : p.axes)
      if (ax.tile == bc::AxisTile::kCol) return ax.chunk;
    return int64_t{-1};
  };
  EXPECT_EQ(col_chunk(4, 1024), 1024);
  EXPECT_EQ(col_chunk(64, 1024), 64);
}

// Whether a launch streams its results is decided on the bytes it moves
// (LoadedProgram::bytes_per_work): every operand walked along the tile's rows and columns,
// once per tensor at its element size; an operand broadcast along the rows (a norm's weight)
// does not count; a matmul's work counts multiply-adds, so its programs count nothing.
TEST(VmStreaming, BytesPerWorkCountsEachFullOperandOnce) {
  std::mt19937 rng(5);
  const auto bytes = [&](const Kernel& k, std::vector<Buffer> in, const std::vector<int64_t>& out) {
    const enc::EncodedKernel ek =
        encode_for(k, args_of(in), args_of({make_buffer(DType::kF32, out, rng)}));
    EXPECT_EQ(ek.programs.size(), 1u);
    return ek.programs.empty() ? int64_t{-1} : vm::load(ek.programs[0])->bytes_per_work;
  };
  {
    KernelBuilder kb("gate");
    Dim R = kb.symbol("R"), C = kb.symbol("C");
    Value a = kb.load("a", DType::kF32, {R, C});
    kb.store("y", kb.mul(kb.unary(UnaryOp::kSilu, a), kb.load("b", DType::kBF16, {R, C})));
    BUILD(kb, k);
    EXPECT_EQ(
        bytes(k,
              {make_buffer(DType::kF32, {64, 256}, rng), make_buffer(DType::kBF16, {64, 256}, rng)},
              {64, 256}),
        4 + 2 + 4);
  }
  {
    KernelBuilder kb("scale_rows");
    Dim R = kb.symbol("R"), C = kb.symbol("C");
    Value x = kb.load("x", DType::kF32, {R, C});
    kb.store("y", kb.mul(kb.add(x, x), kb.load("g", DType::kF32, {C})));
    BUILD(kb, k);
    EXPECT_EQ(
        bytes(k, {make_buffer(DType::kF32, {64, 256}, rng), make_buffer(DType::kF32, {256}, rng)},
              {64, 256}),
        8);
  }
  {
    KernelBuilder kb("mm");
    Dim M = kb.symbol("M");
    Value x = kb.load("x", DType::kF32, {M, 64});
    kb.store("y", kb.matmul(x, kb.load("w", DType::kF32, {64, 32})));
    BUILD(kb, k);
    EXPECT_EQ(
        bytes(k, {make_buffer(DType::kF32, {48, 64}, rng), make_buffer(DType::kF32, {64, 32}, rng)},
              {48, 32}),
        0);
  }
}

// A launch with less work than the target's min_parallel_work runs on one thread, so the
// encoder keeps it in as few blocks as its tile allows instead of splitting it for threads
// or for balance between them (each block costs its own dispatch); larger ones are still
// split for every thread, into up to enc::kBlocksPerThread blocks a thread of at least
// enc::kMinBlockElems elements.
TEST(VmTiling, LaunchesTooSmallForThreadsAreNotSplit) {
  KernelBuilder kb("bias_relu_scale");
  Dim R = kb.symbol("R"), C = kb.symbol("C");
  Value x = kb.load("x", DType::kF32, {R, C});
  Value b = kb.load("b", DType::kF32, {C});
  Value s = kb.load("s", DType::kF32, {R, 1});
  kb.store("y", kb.mul(kb.unary(UnaryOp::kRelu, kb.add(x, b)), s));
  BUILD(kb, k);
  std::mt19937 rng(91);
  const int64_t min_work = vm::cpu_target().min_parallel_work;
  ASSERT_GT(min_work, 4096);
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {42, 96}, {64, 64}, {200, 160}, {300, 128}, {1024, 160}, {1024, 512}}) {
    std::vector<Buffer> in = {make_buffer(DType::kF32, {rows, cols}, rng),
                              make_buffer(DType::kF32, {cols}, rng),
                              make_buffer(DType::kF32, {rows, 1}, rng)};
    const std::string what = std::to_string(rows) + "x" + std::to_string(cols);
    check(k, in, {.what = what});
    const auto grid = [&](int threads) {
      const enc::EncodedKernel ek = encode_for(
          k, args_of(in), args_of({make_buffer(DType::kF32, {rows, cols}, rng)}), threads);
      EXPECT_EQ(ek.programs.size(), 1u) << what;
      return ek.programs.empty() ? int64_t{-1} : ek.programs[0].grid;
    };
    const int64_t one_thread = grid(1);
    if (rows * cols <= 4096) {
      EXPECT_EQ(one_thread, 1) << what;  // one tile: one block
    }
    for (int threads : {2, 4}) {
      if (rows * cols < min_work) {
        EXPECT_EQ(grid(threads), one_thread) << what << ", " << threads << " threads";
      } else {
        const int64_t per_thread = std::clamp<int64_t>(
            rows * cols / (enc::kMinBlockElems * threads), 1, enc::kBlocksPerThread);
        const int64_t blocks = grid(threads);
        EXPECT_GE(blocks, per_thread * threads) << what << ", " << threads << " threads";
        if (rows * cols >= 4 * enc::kMinBlockElems * threads) {
          EXPECT_GE(per_thread, 4) << what;  // a large launch keeps the slack
        }
      }
    }
  }
}

// The encoder sizes blocks to amortise the interpreter's fixed work per block: rows reduced
// along their columns get tiles of up to kRowReduceTileElems, and a loop of chains whose only
// registers are chain-local (held in strip scratch) runs 16 tiles of trips per block. Each
// program still matches the reference.
TEST(VmTiling, BlocksAmortiseTheDispatch) {
  std::mt19937 rng(93);
  {
    KernelBuilder kb("rms_rows");
    Dim R = kb.symbol("R");
    Value x = kb.load("x", DType::kF32, {R, 64});
    Value ms = kb.mean(kb.mul(x, x), {-1}, true);
    kb.store("y", kb.mul(x, kb.unary(UnaryOp::kRsqrt, kb.add(ms, kb.constant(1e-6)))));
    BUILD(kb, k);
    std::vector<Buffer> in = {make_buffer(DType::kF32, {1024, 64}, rng)};
    check(k, in, {.tol = Tol::kReduce, .n = 64, .what = "rms 1024x64"});
    const enc::EncodedKernel ek =
        encode_for(k, args_of(in), args_of({make_buffer(DType::kF32, {1024, 64}, rng)}));
    ASSERT_EQ(ek.programs.size(), 1u);
    EXPECT_EQ(ek.programs[0].grid, 4);  // 256 rows a block (kRowReduceTileElems 16K / 64)
  }
  {
    KernelBuilder kb("rotary");
    Dim S = kb.symbol("S");
    Value x = kb.load("x", DType::kF32, {S, 8, 64});
    Value cs = kb.load("cos", DType::kF32, {S, 1, 64});
    Value sn = kb.load("sin", DType::kF32, {S, 1, 64});
    Value rot =
        kb.concat({kb.unary(UnaryOp::kNeg, kb.slice(x, 2, 32, 64)), kb.slice(x, 2, 0, 32)}, 2);
    kb.store("y", kb.add(kb.mul(x, cs), kb.mul(rot, sn)));
    BUILD(kb, k);
    for (int64_t s : {int64_t{1}, int64_t{300}, int64_t{1000}}) {
      std::vector<Buffer> in = {make_buffer(DType::kF32, {s, 8, 64}, rng),
                                make_buffer(DType::kF32, {s, 1, 64}, rng),
                                make_buffer(DType::kF32, {s, 1, 64}, rng)};
      // A sum of two products, fused into an fma: compared as a 2-term sum (cancellation).
      check(k, in, {.tol = Tol::kReduce, .n = 2, .what = "rotary S=" + std::to_string(s)});
      const enc::EncodedKernel ek =
          encode_for(k, args_of(in), args_of({make_buffer(DType::kF32, {s, 8, 64}, rng)}));
      ASSERT_EQ(ek.programs.size(), 1u);
      // Tiles of 8 x 32 (a head's half rows): 16 * kTileElems (4K) / 256 trips of S a block.
      const int64_t per_block = 256;
      EXPECT_EQ(ek.programs[0].grid, (s + per_block - 1) / per_block) << "S=" << s;
    }
  }
}

// f16/bf16 loads and stores convert strip by strip inside chains (no pass through a tile
// register), plain and over strided views.
TEST(VmChainHalfLoads, MatchReference) {
  KernelBuilder kb("half_chain");
  Dim R = kb.symbol("R"), C = kb.symbol("C");
  Value x = kb.cast(kb.load("x", DType::kBF16, {R, C}), DType::kF32);
  Value y = kb.cast(kb.load("y", DType::kF16, {R, C}), DType::kF32);
  Value g = kb.mul(kb.unary(UnaryOp::kSilu, x), y);
  kb.store("g16", g, DType::kF16);
  kb.store("a32", kb.binary(BinaryOp::kAdd, kb.binary(BinaryOp::kMul, x, 2.0), 1.0));
  kb.store("gb16", kb.unary(UnaryOp::kGeluErf, y), DType::kBF16);
  BUILD(kb, k);
  std::mt19937 rng(56);
  for (bool transposed : {false, true}) {
    for (auto [r, c] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 3}, {1, 1}, {3, 7}, {17, 33}, {5, 1100}, {2, 40000}}) {
      check(k,
            {make_buffer(DType::kBF16, {r, c}, rng, transposed, 1),
             make_buffer(DType::kF16, {r, c}, rng)},
            {.tol = Tol::kTrans,
             .outs = {Out::kContig, Out::kStrided, Out::kContig},
             .what =
                 std::to_string(r) + "x" + std::to_string(c) + (transposed ? " transposed" : "")});
    }
  }
  auto ck = CompiledKernel::create(k).value();
  Buffer xb = make_buffer(DType::kBF16, {5, 1100}, rng),
         yb = make_buffer(DType::kF16, {5, 1100}, rng);
  Buffer o1 = make_buffer(DType::kF16, {5, 1100}, rng),
         o2 = make_buffer(DType::kF32, {5, 1100}, rng),
         o3 = make_buffer(DType::kBF16, {5, 1100}, rng);
  TensorArg ins[] = {xb.arg, yb.arg}, outs[] = {o1.arg, o2.arg, o3.arg};
  auto text = ck->disassemble(ins, outs);
  ASSERT_TRUE(text.is_ok());
  EXPECT_NE(text->find("    load.f32"), std::string::npos) << *text;  // a load in a chain
}

// The chain plans of `k`'s programs for inputs `in` (outputs `out`): how many members read an
// f16/bf16 load's memory themselves, and how many write an f16/bf16 store's memory themselves.
std::pair<int, int> half_members(const Kernel& k, const std::vector<Buffer>& in,
                                 const std::vector<Buffer>& out) {
  std::pair<int, int> n{0, 0};
  for (const bc::Program& p : encode_for(k, args_of(in), args_of(out)).programs) {
    const auto lp = vm::load(p);
    for (const vm::LoadedProgram::HalfPlan& h : lp->chain_half) {
      n.first += h.load >= 0;
      n.second += h.store >= 0;
    }
  }
  return n;
}

// Converting loads and stores that run inside the member that consumes or produces their
// value (LoadedProgram::chain_half, cpu::half_map_f32_rows): activations, add/sub/mul (a
// commutative op's half operand on either side), fma, f16 and bf16 on either side, broadcast
// operands, tails, many rows. Strided (transposed) memory keeps the strip path.
TEST(VmChainHalfKernels, MatchReference) {
  struct Case {
    const char* name;
    DType in_t, out_t;
    std::function<Value(KernelBuilder&, Value, Value, Value)> body;  // x (half), row, col
    int loads, stores;  // the members that run a load or a store inside (contiguous inputs)
  };
  const std::vector<Case> cases = {
      {"fma", DType::kBF16, DType::kF32,
       [](KernelBuilder& kb, Value x, Value, Value) {
         return kb.binary(BinaryOp::kAdd, kb.binary(BinaryOp::kMul, x, 2.0), 1.0);
       },
       1, 0},
      {"gelu", DType::kF16, DType::kF16,
       [](KernelBuilder& kb, Value x, Value, Value) { return kb.unary(UnaryOp::kGeluErf, x); }, 1,
       1},
      {"silu", DType::kBF16, DType::kBF16,
       [](KernelBuilder& kb, Value x, Value, Value) { return kb.unary(UnaryOp::kSilu, x); }, 1, 1},
      {"mul_col", DType::kBF16, DType::kBF16,
       [](KernelBuilder& kb, Value x, Value, Value c) { return kb.mul(x, c); }, 1, 1},
      {"col_plus_x", DType::kF16, DType::kF32,
       [](KernelBuilder& kb, Value x, Value, Value c) { return kb.add(c, x); }, 1, 0},
      {"row_minus_x", DType::kF16, DType::kF16,
       [](KernelBuilder& kb, Value x, Value r, Value) { return kb.sub(r, x); }, 0, 0},
      {"x_minus_row", DType::kBF16, DType::kF32,
       [](KernelBuilder& kb, Value x, Value r, Value) { return kb.sub(x, r); }, 1, 0},
      {"affine_store", DType::kF32, DType::kBF16,
       [](KernelBuilder& kb, Value x, Value r, Value c) {
         return kb.add(kb.mul(x, c), r);  // one fma, stored as bf16
       },
       0, 1},
  };
  std::mt19937 rng(61);
  for (const Case& cs : cases) {
    KernelBuilder kb(cs.name);
    Dim R = kb.symbol("R"), C = kb.symbol("C");
    Value x = kb.cast(kb.load("x", cs.in_t, {R, C}), DType::kF32);
    Value r = kb.load("r", DType::kF32, {R, 1});
    Value c = kb.load("c", DType::kF32, {C});
    kb.store("y", cs.body(kb, x, r, c), cs.out_t);
    BUILD(kb, k);
    for (bool transposed : {false, true}) {
      for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
               {0, 3}, {1, 1}, {3, 7}, {17, 33}, {5, 1100}, {2, 40000}, {300, 64}}) {
        std::vector<Buffer> in = {make_buffer(cs.in_t, {rows, cols}, rng, transposed, 1),
                                  make_buffer(DType::kF32, {rows, 1}, rng),
                                  make_buffer(DType::kF32, {cols}, rng)};
        const std::string what = std::string(cs.name) + " " + std::to_string(rows) + "x" +
                                 std::to_string(cols) + (transposed ? " transposed" : "");
        check(k, in, {.tol = Tol::kTrans, .outs = {Out::kContig}, .what = what});
        if (transposed || rows < 3) continue;
        auto [loads, stores] = half_members(k, in, {make_buffer(cs.out_t, {rows, cols}, rng)});
        EXPECT_EQ(loads, cs.loads) << what;
        EXPECT_EQ(stores, cs.stores) << what;
      }
    }
  }
}

// The same inside loops of chains: small [S, D] tiles walked over B, several trips per kernel
// call (cpu::Rows::outer), each operand stepped by its stride between trips.
TEST(VmChainHalfKernels, LoopsOfChains) {
  KernelBuilder kb("half_loop");
  Dim B = kb.symbol("B"), S = kb.symbol("S"), D = kb.symbol("D");
  Value x = kb.cast(kb.load("x", DType::kBF16, {B, S, D}), DType::kF32);
  Value w = kb.load("w", DType::kF32, {S, 1});
  kb.store("y", kb.mul(x, w), DType::kBF16);
  BUILD(kb, k);
  std::mt19937 rng(62);
  for (auto [b, s, d] : std::vector<std::array<int64_t, 3>>{
           {64, 4, 16}, {37, 3, 5}, {2, 300, 64}, {9, 1, 1}, {0, 4, 16}}) {
    std::vector<Buffer> in = {make_buffer(DType::kBF16, {b, s, d}, rng),
                              make_buffer(DType::kF32, {s, 1}, rng)};
    const std::string what = std::to_string(b) + "x" + std::to_string(s) + "x" + std::to_string(d);
    check(k, in, {.tol = Tol::kArith, .outs = {Out::kContig}, .what = what});
    if (b == 64) {
      auto [loads, stores] = half_members(k, in, {make_buffer(DType::kBF16, {b, s, d}, rng)});
      EXPECT_EQ(loads, 1) << what;
      EXPECT_EQ(stores, 1) << what;
    }
  }
}

TEST(VmLarge, BinaryBroadcastF16StridedOut) {
  KernelBuilder kb("large_add");
  Dim S = kb.symbol("S"), H = kb.symbol("H");
  Value x = kb.load("x", DType::kF16, {S, H});
  Value b = kb.load("b", DType::kF16, {H});
  kb.store("y", kb.add(x, b));
  BUILD(kb, k);
  std::mt19937 rng(52);
  check(k, {make_buffer(DType::kF16, {1000, 1031}, rng), make_buffer(DType::kF16, {1031}, rng)},
        {.tol = Tol::kArith, .outs = {Out::kStrided}});
}

// A reduction nested in another over axes of equal extent keeps an axis of its own for its
// reduced dim: sum(argmin(x, 1), 0) on a square x once walked x's diagonal (the inner
// argmin shared the outer sum's axis; found by fuzz_kernel's exact-output check).
TEST(VmStages, NestedReductionsOfEqualExtentsKeepTheirAxes) {
  std::mt19937 rng(31);
  for (ReduceOp inner : {ReduceOp::kArgMin, ReduceOp::kArgMax, ReduceOp::kMax, ReduceOp::kSum}) {
    for (int outer_axis : {0, 1}) {
      KernelBuilder kb("nested");
      Dim S = kb.symbol("S");
      Value x = kb.load("x", DType::kF32, {S, S});
      Value r = kb.cast(kb.reduce(inner, x, {1 - outer_axis}), DType::kF32);
      kb.store("y", kb.sum(r, {0}));
      kb.store("z", kb.sum(kb.cast(kb.reduce(inner, x, {outer_axis}, true), DType::kF32), {0}));
      Kernel k = kb.build().value();
      for (int64_t n : {1, 3, 17, 64}) {
        expect_matches_reference(k, {make_buffer(DType::kF32, {n, n}, rng)}, Tolerance{1e-4, 1e-5},
                                 {},
                                 std::string(reduce_op_name(inner)) + " n " + std::to_string(n));
      }
    }
  }
}

TEST(VmLarge, Reductions) {
  KernelBuilder kb("large_reduce");
  Dim S = kb.symbol("S"), H = kb.symbol("H");
  Value x = kb.load("x", DType::kF32, {S, H});
  kb.store("col", kb.sum(x, {0}));
  kb.store("row", kb.max(x, {1}));
  kb.store("arg", kb.reduce(ReduceOp::kArgMin, x, {0}));
  BUILD(kb, k);
  std::mt19937 rng(53);
  check(k, {make_buffer(DType::kF32, {1024, 1024}, rng)}, {.tol = Tol::kReduce});
}

// ---- multi-output kernels --------------------------------------------------------------

TEST(VmMultiOutput, TwoElementwiseStores) {
  KernelBuilder kb("two_stores");
  Dim S = kb.symbol("S"), H = kb.symbol("H");
  Value x = kb.load("x", DType::kF32, {S, H});
  Value b = kb.load("b", DType::kF32, {H});
  kb.store("prod", kb.mul(x, b));
  kb.store("exp", kb.unary(UnaryOp::kExp, x), DType::kF16);
  kb.store("copy", x);
  BUILD(kb, k);
  std::mt19937 rng(61);
  for (auto [s, h] : std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {1, 1}, {7, 17}, {33, 1031}})
    check(k, {make_buffer(DType::kF32, {s, h}, rng, true, 2), make_buffer(DType::kF32, {h}, rng)},
          {.tol = Tol::kTrans, .outs = {Out::kStrided, Out::kContig, Out::kTransposed}});
}

TEST(VmMultiOutput, ReductionAndElementwise) {
  KernelBuilder kb("red_and_elem");
  Dim S = kb.symbol("S"), H = kb.symbol("H");
  Value x = kb.load("x", DType::kF32, {S, H});
  Value m = kb.max(x, {-1}, true);
  Value e = kb.unary(UnaryOp::kExp, kb.sub(x, m));
  Value s = kb.sum(e, {-1});
  kb.store("sum", s);
  kb.store("softmax", kb.div(e, kb.reshape(s, {S, 1})));
  kb.store("shifted", kb.sub(x, m));
  kb.store("colmax", kb.max(x, {0}));  // a second reduction set: its own stage
  BUILD(kb, k);
  std::mt19937 rng(62);
  for (auto [r, h] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 17}, {5, 1031}, {2, 20001}}) {
    check(k, {make_buffer(DType::kF32, {r, h}, rng)}, {.tol = Tol::kReduce, .n = std::max(r, h)});
    check(k, {make_buffer(DType::kF32, {r, h}, rng, true, 3)},
          {.tol = Tol::kReduce,
           .n = std::max(r, h),
           .outs = {Out::kStrided, Out::kTransposed, Out::kOffset, Out::kStrided},
           .what = "views"});
  }
}

// ---- one compiled kernel, many bindings ------------------------------------------------

TEST(VmCache, ThirtyBindingsRandomOrder) {
  KernelBuilder kb("cache");
  Dim S = kb.symbol("S"), H = kb.symbol("H");
  Value x = kb.load("x", DType::kF32, {S, H});
  Value b = kb.load("b", DType::kF32, {H});
  kb.store("y", kb.add(kb.unary(UnaryOp::kTanh, kb.mul(x, b)), b));
  kb.store("s", kb.sum(x, {-1}));
  BUILD(kb, k);
  auto ck = CompiledKernel::create(k);
  ASSERT_TRUE(ck.is_ok());
  struct Variant {
    int64_t s, h;
    bool transposed;
    int64_t offset;
  };
  const std::vector<Variant> variants = {
      {1, 1, false, 0},    {7, 17, false, 0}, {7, 17, true, 0},    {7, 17, false, 3},
      {7, 17, false, 5},   {0, 5, false, 0},  {33, 128, false, 0}, {3, 20000, false, 0},
      {64, 1031, true, 1}, {5, 1, false, 0}};
  std::mt19937 rng(71);
  std::set<int> seen;
  int hits = 0, misses = 0;
  for (int it = 0; it < 30; ++it) {
    int v = std::uniform_int_distribution<int>(0, static_cast<int>(variants.size()) - 1)(rng);
    const Variant& var = variants[v];
    RunStats st;
    check(k,
          {make_buffer(DType::kF32, {var.s, var.h}, rng, var.transposed, var.offset),
           make_buffer(DType::kF32, {var.h}, rng)},
          {.tol = Tol::kReduce,
           .n = var.h,
           .ck = ck->get(),
           .stats = &st,
           .what = "iteration " + std::to_string(it) + " variant " + std::to_string(v)});
    EXPECT_EQ(st.cache_hit, seen.count(v) > 0) << "iteration " << it << " variant " << v;
    (st.cache_hit ? hits : misses)++;
    seen.insert(v);
  }
  EXPECT_GT(hits, 0);
  EXPECT_GT(misses, 1);
  EXPECT_GE((*ck)->cached_programs(), seen.size());
}

// ---- bad arguments ---------------------------------------------------------------------

TEST(VmBadArgs, RejectedWithoutWriting) {
  KernelBuilder kb("bad");
  Dim S = kb.symbol("S");
  Value x = kb.load("x", DType::kF32, {S, 16});
  Value w = kb.load("w", DType::kF32, {S, 16});
  Value b = kb.load("b", DType::kF32, {16});
  Value p = kb.param("p", DType::kF32);
  kb.store("y", kb.add(kb.mul(kb.add(x, w), b), p));
  BUILD(kb, k);
  auto ck = CompiledKernel::create(k);
  ASSERT_TRUE(ck.is_ok());
  std::mt19937 rng(81);
  auto good = [&] {
    return std::vector<Buffer>{make_buffer(DType::kF32, {4, 16}, rng),
                               make_buffer(DType::kF32, {4, 16}, rng),
                               make_buffer(DType::kF32, {16}, rng)};
  };
  std::vector<ScalarArg> params = {ScalarArg::of_float(1.5)};
  struct Bad {
    std::string name;
    std::vector<Buffer> inputs;
    std::string expect;  // substring of the message
    int outputs = 1;
    std::vector<int64_t> out_shape = {4, 16};
    int64_t out_storage = -1;
    int num_params = 1;
  };
  std::vector<Bad> cases;
  {
    auto in = good();
    in[0] = make_buffer(DType::kF32, {64}, rng);
    cases.push_back({"wrong rank", in, "'x'"});
  }
  {
    auto in = good();
    in[2] = make_buffer(DType::kF32, {15}, rng);
    cases.push_back({"wrong constant dim", in, "'b'"});
  }
  {
    auto in = good();
    in[1] = make_buffer(DType::kF32, {5, 16}, rng);
    cases.push_back({"inconsistent symbol", in, "'w'"});
  }
  {
    auto in = good();
    in[1] = make_buffer(DType::kF16, {4, 16}, rng);
    cases.push_back({"wrong dtype", in, "'w'"});
  }
  {
    auto in = good();
    in.pop_back();
    cases.push_back({"too few inputs", in, "input"});
  }
  {
    auto in = good();
    in[0].arg.storage_elems = 63;
    cases.push_back({"view outside storage", in, "'x'"});
  }
  {
    auto in = good();
    in[1].arg.offset = 3;  // storage_elems stays 64
    cases.push_back({"offset view outside storage", in, "'w'"});
  }
  {
    auto in = good();
    in[0].arg.strides = {17, 1};
    cases.push_back({"strided view outside storage", in, "'x'"});
  }
  cases.push_back({"wrong output shape", good(), "'y'", 1, {4, 15}});
  cases.push_back({"output outside storage", good(), "'y'", 1, {4, 16}, 60});
  cases.push_back({"too few outputs", good(), "output", 0});
  cases.push_back({"too few params", good(), "param", 1, {4, 16}, -1, 0});
  for (auto& c : cases) {
    std::vector<Buffer> outs;
    for (int o = 0; o < c.outputs; ++o) {
      outs.push_back(make_out(DType::kF32, c.out_shape, Out::kContig));
      if (c.out_storage >= 0) outs.back().arg.storage_elems = c.out_storage;
    }
    std::vector<ScalarArg> ps(params.begin(), params.begin() + c.num_params);
    Status s = (*ck)->run(args_of(c.inputs), args_of(outs), ps);
    EXPECT_FALSE(s.is_ok()) << c.name;
    EXPECT_NE(s.message().find(c.expect), std::string::npos)
        << c.name << ": message '" << s.message() << "' does not name " << c.expect;
    for (const auto& o : outs) EXPECT_TRUE(all_sentinel(o)) << c.name << ": output written";
    // The reference executor rejects the same arguments.
    if (c.outputs > 0) {
      std::vector<Buffer> ro;
      ro.push_back(make_out(DType::kF32, c.out_shape, Out::kContig));
      if (c.out_storage >= 0) ro.back().arg.storage_elems = c.out_storage;
      EXPECT_FALSE(run_reference(k, args_of(c.inputs), args_of(ro), ps).is_ok()) << c.name;
    }
  }
  // The compiled kernel still works after the failures.
  check(k, good(), {.tol = Tol::kArith, .params = params, .ck = ck->get()});
}

// ---- concurrency -----------------------------------------------------------------------

TEST(VmConcurrency, FourThreadsDifferentShapes) {
  KernelBuilder kb("concurrent");
  Dim S = kb.symbol("S"), H = kb.symbol("H");
  Value x = kb.load("x", DType::kF32, {S, H});
  Value g = kb.load("g", DType::kF32, {H});
  Value xc = kb.sub(x, kb.mean(x, {-1}, true));
  Value var = kb.mean(kb.mul(xc, xc), {-1}, true);
  kb.store("y",
           kb.mul(kb.mul(xc, kb.unary(UnaryOp::kRsqrt, kb.binary(BinaryOp::kAdd, var, 1e-5))), g));
  kb.store("s", kb.sum(x, {0}));
  BUILD(kb, k);
  auto ck = CompiledKernel::create(k);
  ASSERT_TRUE(ck.is_ok());
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 7}, {13, 1031}, {64, 128}, {3, 20001}};
  constexpr int kIters = 6;
  std::mt19937 rng(91);
  struct Job {
    std::vector<Buffer> in;
    std::vector<std::vector<Buffer>> out;  // per iteration
    std::vector<Buffer> ref;
    std::vector<Status> st;
  };
  std::vector<Job> jobs(shapes.size());
  for (size_t j = 0; j < shapes.size(); ++j) {
    auto [s, h] = shapes[j];
    Job& job = jobs[j];
    job.in = {make_buffer(DType::kF32, {s, h}, rng, j % 2 == 1, j),
              make_buffer(DType::kF32, {h}, rng)};
    job.ref = {make_out(DType::kF32, {s, h}, Out::kContig),
               make_out(DType::kF32, {h}, Out::kContig)};
    ASSERT_TRUE(run_reference(k, args_of(job.in), args_of(job.ref)).is_ok());
    for (int i = 0; i < kIters; ++i)
      job.out.push_back(
          {make_out(DType::kF32, {s, h}, Out::kContig), make_out(DType::kF32, {h}, Out::kContig)});
  }
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (size_t j = 0; j < shapes.size(); ++j) {
    threads.emplace_back([&, j] {
      Job& job = jobs[j];
      ready.fetch_add(1);
      while (ready.load() < static_cast<int>(shapes.size())) std::this_thread::yield();
      for (int i = 0; i < kIters; ++i)
        job.st.push_back((*ck)->run(args_of(job.in), args_of(job.out[i])));
    });
  }
  for (auto& t : threads) t.join();
  for (size_t j = 0; j < shapes.size(); ++j) {
    for (int i = 0; i < kIters; ++i) {
      ASSERT_TRUE(jobs[j].st[i].is_ok()) << jobs[j].st[i].to_string();
      std::string what = "job " + std::to_string(j) + " iteration " + std::to_string(i);
      for (int o = 0; o < 2; ++o)
        compare_storage(
            jobs[j].out[i][o], jobs[j].ref[o],
            tolerance(Tol::kReduce, DType::kF32, std::max(shapes[j].first, shapes[j].second),
                      max_abs(jobs[j].ref[o])),
            what + " output " + std::to_string(o), "");
    }
  }
}

// Reductions over axes of extent 1 at a binding (a batch of one, one head) in their input's
// dtype are the input itself: the program has no reduce instruction, and the values (NaN
// included) are the reference's. Other bindings of the same kernel still reduce.
TEST(VmReduce, ReductionsOverUnitAxesAreTheInput) {
  std::mt19937 rng(41);
  for (ReduceOp op :
       {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProd}) {
    for (bool keep : {false, true}) {
      KernelBuilder kb("unit_reduce");
      Dim m = kb.symbol("M");
      Value x = kb.load("x", DType::kF32, {4, m, 24});
      kb.store("y", kb.binary(BinaryOp::kMul, kb.reduce(op, x, {1}, keep), 2.0));
      Kernel k = kb.build().value();
      for (int64_t extent : {1, 3}) {
        Buffer xb = make_buffer(DType::kF32, {4, extent, 24}, rng);
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::memcpy(xb.bytes.data() + 5 * sizeof(float), &nan, sizeof(float));
        expect_matches_reference(k, {xb}, {}, {},
                                 std::string(reduce_op_name(op)) + (keep ? " keepdims" : "") +
                                     " over " + std::to_string(extent));
        auto ck = CompiledKernel::create(k).value();
        Buffer y = make_buffer(
            DType::kF32, keep ? std::vector<int64_t>{4, 1, 24} : std::vector<int64_t>{4, 24}, rng);
        TensorArg ins[] = {xb.arg}, outs[] = {y.arg};
        auto text = ck->disassemble(ins, outs);
        ASSERT_TRUE(text.is_ok());
        EXPECT_EQ(text->find("reduce.") == std::string::npos, extent == 1) << *text;
      }
    }
  }
}

}  // namespace
}  // namespace dvm::testing
