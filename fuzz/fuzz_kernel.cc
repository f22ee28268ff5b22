// Fuzz target: the kernel builder, encoder, verifier and VM. The input is a program that builds
// a kernel from four inputs ([S, H] f32, [H] f32, [S, H] i32, [S, H] bool) with every
// elementwise op of ops.def, casts, broadcasts, transposes, slices, concats, reductions and
// matmuls, then binds S and H to values the input chooses.
//
// Invariants: nothing crashes or touches memory outside its tensors; a kernel the builder
// rejects is a Status error; the encoder's programs pass the verifier (an encoding that fails
// verification is an Internal error, reported here as a violation); the VM at one and two
// threads agrees bit for bit; the reference executor accepts whatever the VM ran; and an
// output whose every element is computed without rounding (Exact: small dyadic inputs through
// adds, products, moves, compares, casts, sums and matmuls) equals the reference's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "dvm/kernel.h"
#include "dvm/runtime.h"
#include "fuzz_util.h"

namespace {

using dvm::DType;
using dvm::Value;
using dvm::fuzz::Buffer;
using dvm::fuzz::Reader;

std::vector<dvm::UnaryOp> unary_ops() {
  std::vector<dvm::UnaryOp> ops;
#define DVM_UNARY(Name, mnemonic, kind) ops.push_back(dvm::UnaryOp::k##Name);
#include "dvm/ops.def"
  return ops;
}
std::vector<dvm::BinaryOp> binary_ops() {
  std::vector<dvm::BinaryOp> ops;
#define DVM_BINARY(Name, mnemonic, kind) ops.push_back(dvm::BinaryOp::k##Name);
#include "dvm/ops.def"
  return ops;
}
std::vector<dvm::ReduceOp> reduce_ops() {
  std::vector<dvm::ReduceOp> ops;
#define DVM_REDUCE(Name, mnemonic) ops.push_back(dvm::ReduceOp::k##Name);
#include "dvm/ops.def"
  return ops;
}

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16,
                             DType::kI32, DType::kI64, DType::kBool};

// What the builder knows of a value's elements without running it: whether every element is
// computed without rounding (then the VM must match the reference exactly), and bounds that
// keep it so. The inputs are multiples of 1/4 in [-2, 2] and integers in [0, 4); constants
// are multiples of 1/16. An exact value is a multiple of 2^-frac with |v| <= mag, which
// takes bits() significant bits; at most 24 keeps it exact in f32 (8 if it may be f16 or
// bf16, `half`), and |v| < 2^24 keeps integer casts and integer math exact too. Division,
// pow, means and transcendental functions round: their results are not exact. (No value is
// ever infinite: max and min over an empty axis are errors, as in torch.)
struct Exact {
  bool exact = false;
  double mag = 0;
  int frac = 0;
  bool half = false;
  int64_t extent = 40;  // a bound on every dim of the value (reduction lengths)
  double bits() const { return std::log2(std::max(mag, 1.0)) + frac + 1; }
  bool fits() const { return exact && bits() <= (half ? 8 : 24) && mag < 16777216.0; }
};

Exact inexact(int64_t extent) {
  Exact e;
  e.extent = extent;
  return e;
}

// The exactness of x + y (or x - y): magnitudes add, the finer fraction wins.
Exact sum_of(const Exact& a, const Exact& b, double n = 1) {
  Exact r = a;
  r.exact = a.exact && b.exact;
  r.mag = n * (a.mag + b.mag);
  r.frac = std::max(a.frac, b.frac);
  r.half = a.half || b.half;
  r.extent = std::max(a.extent, b.extent);
  r.exact = r.exact && r.fits();
  return r;
}

Exact product_of(const Exact& a, const Exact& b, double n = 1) {
  Exact r = sum_of(a, b);
  r.exact = a.exact && b.exact;
  r.mag = n * a.mag * b.mag;
  r.frac = a.frac + b.frac;
  r.exact = r.exact && r.fits();
  return r;
}

// A value moved or chosen without arithmetic (select, compares, relu, max): no new rounding.
Exact moved(const Exact& a, const Exact& b) {
  Exact r = sum_of(a, b);
  r.exact = a.exact && b.exact;
  r.mag = std::max(a.mag, b.mag);
  return r;
}

Exact unary_exactness(dvm::UnaryOp op, const Exact& a) {
  using dvm::UnaryOp;
  Exact r = a;
  switch (op) {
    case UnaryOp::kNeg:
    case UnaryOp::kAbs:
    case UnaryOp::kRelu:
      return r;
    case UnaryOp::kFloor:
    case UnaryOp::kCeil:
    case UnaryOp::kRound:
    case UnaryOp::kTrunc:
      r.mag += 1;
      r.frac = 0;
      r.exact = r.exact && r.fits();
      return r;
    case UnaryOp::kSign:
    case UnaryOp::kIsFinite:
    case UnaryOp::kIsNan:
    case UnaryOp::kLogicalNot:
      r.mag = 1;
      r.frac = 0;
      return r;
    default:
      return inexact(a.extent);
  }
}

Exact binary_exactness(dvm::BinaryOp op, const Exact& a, const Exact& b) {
  using dvm::BinaryOp;
  switch (op) {
    case BinaryOp::kAdd:
    case BinaryOp::kSub:
      return sum_of(a, b);
    case BinaryOp::kMul:
      return product_of(a, b);
    case BinaryOp::kMaximum:
    case BinaryOp::kMinimum:
      return moved(a, b);
    case BinaryOp::kEq:
    case BinaryOp::kNe:
    case BinaryOp::kLt:
    case BinaryOp::kLe:
    case BinaryOp::kGt:
    case BinaryOp::kGe:
    case BinaryOp::kLogicalAnd:
    case BinaryOp::kLogicalOr: {
      Exact r = moved(a, b);
      r.mag = 1;
      r.frac = 0;
      return r;
    }
    default:  // div, pow, floordiv, remainder round (or divide by zero)
      return inexact(std::max(a.extent, b.extent));
  }
}

// A cast to `to`: exact when the value fits the target (half floats: 8 bits, conservatively
// bf16's), integers truncate exactly below 2^24, bool is nonzero.
Exact cast_exactness(const Exact& a, DType to) {
  Exact r = a;
  if (to == DType::kBool) {
    r.mag = 1;
    r.frac = 0;
  } else if (to == DType::kI32 || to == DType::kI64) {
    r.frac = 0;
  } else if (to == DType::kF16 || to == DType::kBF16) {
    r.half = true;
    r.exact = a.exact && a.bits() <= 8 && a.mag < 16777216.0;
  }
  return r;
}

Exact reduce_exactness(dvm::ReduceOp op, const Exact& a) {
  using dvm::ReduceOp;
  const double n = static_cast<double>(a.extent);
  Exact r = a;
  switch (op) {
    case ReduceOp::kSum: {
      Exact zero;
      zero.exact = true;
      return sum_of(a, zero, n);
    }
    case ReduceOp::kMax:
    case ReduceOp::kMin:
      return r;
    case ReduceOp::kArgMax:
    case ReduceOp::kArgMin:
      r.exact = a.exact;  // an index; an empty axis is an error
      r.mag = n;
      r.frac = 0;
      r.half = false;
      return r;
    default:  // mean divides, prod's fraction grows past any format
      return inexact(a.extent);
  }
}

// Builds the kernel the input describes; `out_dtypes` receives its outputs' dtypes (each output
// is stored as a dtype the input chooses, converting) and `out_exact` whether each output is
// computed without rounding (see Exact).
dvm::StatusOr<dvm::Kernel> build(Reader& in, std::vector<DType>* out_dtypes,
                                 std::vector<bool>* out_exact) {
  static const std::vector<dvm::UnaryOp> kUnary = unary_ops();
  static const std::vector<dvm::BinaryOp> kBinary = binary_ops();
  static const std::vector<dvm::ReduceOp> kReduce = reduce_ops();
  dvm::KernelBuilder kb("fuzz");
  const dvm::Dim s = kb.symbol("S"), h = kb.symbol("H");
  std::vector<Value> pool = {kb.load("x", DType::kF32, {s, h}), kb.load("b", DType::kF32, {h}),
                             kb.load("i", DType::kI32, {s, h}), kb.load("m", DType::kBool, {s, h})};
  std::map<int, Exact> ex;  // by Value::id
  // x and b: multiples of 1/4 in [-2, 2]; i: integers in [0, 4); m: 0 or 1 (Buffer::filled).
  const double input_mag[] = {2, 2, 3, 1};
  const int input_frac[] = {2, 2, 0, 0};
  for (size_t i = 0; i < pool.size(); ++i)
    ex[pool[i].id] = Exact{true, input_mag[i], input_frac[i], false, 40};
  auto pick = [&] { return pool[in.next() % pool.size()]; };
  // The input's bytes are read in one order, left to right as the calls list them (clang's
  // order for arguments, in which the corpus was found): read inside one call's arguments,
  // GCC's order gave the same bytes another meaning, and ctest's replay of the corpus (GCC)
  // ran other kernels than the ones the fuzzer had kept.
  dvm::UnaryOp uop{};
  dvm::BinaryOp bop{};
  dvm::ReduceOp rop{};
  DType cast_to{};
  const auto next_unary = [&] { uop = kUnary[in.next() % kUnary.size()]; };
  const auto next_binary = [&] { bop = kBinary[in.next() % kBinary.size()]; };
  const auto next_reduce = [&] { rop = kReduce[in.next() % kReduce.size()]; };
  const auto next_dtype = [&] { cast_to = kDTypes[in.next() % 6]; };
  const auto info = [&](const Value& v) {
    auto it = ex.find(v.id);
    return it == ex.end() ? Exact{} : it->second;
  };
  for (int n = 0; n < 48 && !in.done(); ++n) {
    const uint8_t op = in.next() % 12;
    Exact e;
    Value v;
    switch (op) {
      case 0: {
        next_unary();
        const Value a = pick();
        v = kb.unary(uop, a);
        e = unary_exactness(uop, info(a));
        break;
      }
      case 1:
      case 2: {
        const Value a = pick();
        next_binary();
        const Value b = pick();
        v = kb.binary(bop, a, b);
        e = binary_exactness(bop, info(a), info(b));
        break;
      }
      case 3: {
        const Value a = pick();
        const double c = static_cast<double>(static_cast<int>(in.next()) - 128) / 16.0;
        next_binary();
        v = kb.binary(bop, a, c);
        Exact ce{true, std::abs(c), 4, false, 1};
        e = binary_exactness(bop, info(a), ce);
        break;
      }
      case 4: {
        const Value c = pick(), a = pick();
        Value b;
        v = kb.select(c, a, b = pick());
        e = moved(info(a), info(b));
        e.exact = e.exact && info(c).exact;
        break;
      }
      case 5: {
        const Value a = pick();
        next_dtype();
        v = kb.cast(a, cast_to);
        e = cast_exactness(info(a), cast_to);
        break;
      }
      case 6: {
        const Value a = pick();
        const int axis = in.next() % 3 - 1;  // -1, 0, 1 (and rank-0 values reject them)
        next_reduce();
        const bool keepdims = in.next() & 1;
        v = kb.reduce(rop, a, {axis}, keepdims);
        e = reduce_exactness(rop, info(a));
        break;
      }
      case 7: {
        const Value a = pick();
        v = kb.transpose(a, 0, 1);
        e = info(a);
        break;
      }
      case 8: {
        const Value a = pick();
        v = kb.broadcast(a, {s, h});
        e = info(a);
        e.extent = std::max<int64_t>(e.extent, 40);
        break;
      }
      case 9: {
        const Value a = pick();
        const int64_t start = in.next() % 4, stop = start + in.next() % 6;
        const int axis = in.next() & 1;
        const int64_t step = 1 + in.next() % 2;
        v = kb.slice(a, axis, start, stop, step);
        e = info(a);
        break;
      }
      case 10: {
        const Value a = pick();
        const Value b = pick();
        const int axis = in.next() & 1;
        v = kb.concat({a, b}, axis);
        e = moved(info(a), info(b));
        e.extent = info(a).extent + info(b).extent;
        break;
      }
      default: {
        const Value a = pick();
        const Value b = pick();
        const bool ta = in.next() & 1;
        const bool tb = in.next() & 1;
        v = kb.matmul(a, b, ta, tb);
        const Exact ea = info(a), eb = info(b);
        e = product_of(ea, eb, static_cast<double>(std::max(ea.extent, eb.extent)));
        break;
      }
    }
    pool.push_back(v);
    if (v.valid()) ex[v.id] = e;
  }
  out_dtypes->push_back(kDTypes[in.next() % 6]);
  kb.store("y", pool.back(), out_dtypes->back());
  out_exact->push_back(cast_exactness(info(pool.back()), out_dtypes->back()).exact);
  if (pool.size() > 5 && (in.next() & 1)) {
    out_dtypes->push_back(kDTypes[in.next() % 6]);
    kb.store("z", pool[pool.size() - 2], out_dtypes->back());
    out_exact->push_back(cast_exactness(info(pool[pool.size() - 2]), out_dtypes->back()).exact);
  }
  return kb.build();
}

// Runs on `ck` (or the reference when ck is null); false when it reports an error. The
// reference computes whole intermediates and the VM only the elements the outputs read, so
// an integer division by zero in elements no output reads (e.g. sliced away) fails only on the
// reference: `by_zero` says the error was that one.
bool run(bool* by_zero, const dvm::CompiledKernel* ck, const dvm::Kernel& k,
         const std::vector<DType>& dtypes, std::vector<Buffer>& inputs,
         const std::vector<std::vector<int64_t>>& out_shapes, std::vector<Buffer>* outputs) {
  std::vector<dvm::TensorArg> in;
  for (Buffer& b : inputs) in.push_back(b.arg());
  for (size_t o = 0; o < out_shapes.size(); ++o) {
    outputs->push_back(Buffer::poisoned(dtypes[o], out_shapes[o]));
  }
  std::vector<dvm::TensorArg> out;
  for (Buffer& b : *outputs) out.push_back(b.arg());
  const dvm::Status st = ck != nullptr ? ck->run(in, out) : dvm::run_reference(k, in, out);
  if (st.code() == dvm::StatusCode::kInternal) dvm::fuzz::fail(st.to_string().c_str());
  *by_zero = !st.is_ok() && st.message().find("by zero") != std::string::npos;
  if (!st.is_ok() && std::getenv("DVM_FUZZ_VERBOSE") != nullptr) {
    std::fprintf(stderr, "%s: %s\n%s\n", ck != nullptr ? "vm" : "reference", st.to_string().c_str(),
                 k.to_string().c_str());
  }
  return st.is_ok();
}

// Bit for bit, except that any two NaNs are equal: a NaN's sign and payload may depend on
// which GEMM micro-kernel a tiling picked (docs/numerics.md, "Determinism").
bool same_bits(const Buffer& a, const Buffer& b) {
  if (a.bytes == b.bytes) return true;
  if (a.bytes.size() != b.bytes.size()) return false;
  if (a.dtype != DType::kF32 && a.dtype != DType::kF16 && a.dtype != DType::kBF16) return false;
  const int64_t size = dtype_size(a.dtype);
  for (int64_t i = 0; i < a.numel(); ++i) {
    const bool nans = std::isnan(a.value(i)) && std::isnan(b.value(i));
    if (!nans && std::memcmp(a.bytes.data() + i * size, b.bytes.data() + i * size, size) != 0)
      return false;
  }
  return true;
}

// Element by element: floats by value (-0 equals +0: the sign of a zero is no rounding
// matter), NaN equal to NaN; integers and bools bit for bit.
bool same_values(const Buffer& a, const Buffer& b) {
  if (a.bytes.size() != b.bytes.size()) return false;
  if (a.dtype != DType::kF32 && a.dtype != DType::kF16 && a.dtype != DType::kBF16)
    return a.bytes == b.bytes;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.value(i), y = b.value(i);
    if (!(x == y || (std::isnan(x) && std::isnan(y)))) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 256) return 0;
  Reader in{data, size};
  const int64_t s = in.next() % 7, h = 1 + in.next() % 40;  // S may be 0 (empty tensors)
  std::vector<DType> dtypes;
  std::vector<bool> exact;
  auto kernel = build(in, &dtypes, &exact);
  if (!kernel.is_ok()) return 0;
  auto [ck1, ck2] = dvm::fuzz::compile_on_one_and_two_threads([&](int threads) {
    dvm::CompileOptions o;
    o.num_threads = threads;
    return dvm::CompiledKernel::create(*kernel, o);
  });
  if (!ck1.is_ok()) return 0;
  std::vector<Buffer> inputs = {
      Buffer::filled(DType::kF32, {s, h}, 1), Buffer::filled(DType::kF32, {h}, 2),
      Buffer::filled(DType::kI32, {s, h}, 3), Buffer::filled(DType::kBool, {s, h}, 4)};
  std::vector<dvm::TensorArg> args;
  for (Buffer& b : inputs) args.push_back(b.arg());
  auto shapes = (*ck1)->infer_output_shapes(args);
  if (!shapes.is_ok()) return 0;
  for (const auto& sh : *shapes) {
    if (!dvm::fuzz::small_enough(sh)) return 0;
  }
  std::vector<Buffer> out1, out2, ref;
  bool by_zero = false;
  const bool ok1 = run(&by_zero, ck1->get(), *kernel, dtypes, inputs, *shapes, &out1);
  const bool ok2 = run(&by_zero, ck2->get(), *kernel, dtypes, inputs, *shapes, &out2);
  if (ok1 != ok2) dvm::fuzz::fail("runs on one thread count only");
  const bool ref_ok = ok1 && run(&by_zero, nullptr, *kernel, dtypes, inputs, *shapes, &ref);
  if (ok1 && !ref_ok && !by_zero) dvm::fuzz::fail("the reference rejects what the VM ran");
  for (size_t k = 0; ok1 && k < out1.size(); ++k) {
    if (!same_bits(out1[k], out2[k])) dvm::fuzz::fail("one and two threads differ");
    if (ref_ok && exact[k] && !same_values(out1[k], ref[k])) {
      if (std::getenv("DVM_FUZZ_VERBOSE") != nullptr) {
        std::fprintf(stderr, "output %zu differs from the reference (S %lld, H %lld)\n%s\n", k,
                     static_cast<long long>(s), static_cast<long long>(h),
                     kernel->to_string().c_str());
        std::vector<dvm::TensorArg> ia, oa;
        for (Buffer& b : inputs) ia.push_back(b.arg());
        for (Buffer& b : out1) oa.push_back(b.arg());
        if (auto d = (*ck1)->disassemble(ia, oa); d.is_ok()) std::fprintf(stderr, "%s", d->c_str());
        for (int64_t i = 0; i < out1[k].numel() && i < 64; ++i)
          std::fprintf(stderr, "  [%lld] vm %g reference %g\n", static_cast<long long>(i),
                       out1[k].value(i), ref[k].value(i));
      }
      dvm::fuzz::fail("an output computed without rounding differs from the reference");
    }
  }
  return 0;
}
