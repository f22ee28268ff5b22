// Fuzz target: the kernel builder, encoder, verifier and VM. The input is a program that builds
// a kernel from four inputs ([S, H] f32, [H] f32, [S, H] i32, [S, H] bool) with every
// elementwise op of ops.def, casts, broadcasts, transposes, slices, concats, reductions and
// matmuls, then binds S and H to values the input chooses.
//
// Invariants: nothing crashes or touches memory outside its tensors; a kernel the builder
// rejects is a Status error; the encoder's programs pass the verifier (an encoding that fails
// verification is an Internal error, reported here as a violation); the VM at one and two
// threads agrees bit for bit; the reference executor accepts whatever the VM ran.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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

// Builds the kernel the input describes; `out_dtypes` receives its outputs' dtypes (each output
// is stored as a dtype the input chooses, converting).
dvm::StatusOr<dvm::Kernel> build(Reader& in, std::vector<DType>* out_dtypes) {
  static const std::vector<dvm::UnaryOp> kUnary = unary_ops();
  static const std::vector<dvm::BinaryOp> kBinary = binary_ops();
  static const std::vector<dvm::ReduceOp> kReduce = reduce_ops();
  dvm::KernelBuilder kb("fuzz");
  const dvm::Dim s = kb.symbol("S"), h = kb.symbol("H");
  std::vector<Value> pool = {kb.load("x", DType::kF32, {s, h}), kb.load("b", DType::kF32, {h}),
                             kb.load("i", DType::kI32, {s, h}), kb.load("m", DType::kBool, {s, h})};
  auto pick = [&] { return pool[in.next() % pool.size()]; };
  for (int n = 0; n < 48 && !in.done(); ++n) {
    const uint8_t op = in.next() % 12;
    switch (op) {
      case 0:
        pool.push_back(kb.unary(kUnary[in.next() % kUnary.size()], pick()));
        break;
      case 1:
      case 2: {
        const Value a = pick();
        pool.push_back(kb.binary(kBinary[in.next() % kBinary.size()], a, pick()));
        break;
      }
      case 3: {
        const Value a = pick();
        const double c = static_cast<double>(static_cast<int>(in.next()) - 128) / 16.0;
        pool.push_back(kb.binary(kBinary[in.next() % kBinary.size()], a, c));
        break;
      }
      case 4: {
        const Value c = pick(), a = pick();
        pool.push_back(kb.select(c, a, pick()));
        break;
      }
      case 5:
        pool.push_back(kb.cast(pick(), kDTypes[in.next() % 6]));
        break;
      case 6: {
        const Value a = pick();
        const int axis = in.next() % 3 - 1;  // -1, 0, 1 (and rank-0 values reject them)
        pool.push_back(kb.reduce(kReduce[in.next() % kReduce.size()], a, {axis}, in.next() & 1));
        break;
      }
      case 7:
        pool.push_back(kb.transpose(pick(), 0, 1));
        break;
      case 8:
        pool.push_back(kb.broadcast(pick(), {s, h}));
        break;
      case 9: {
        const Value a = pick();
        const int64_t start = in.next() % 4, stop = start + in.next() % 6;
        pool.push_back(kb.slice(a, in.next() & 1, start, stop, 1 + in.next() % 2));
        break;
      }
      case 10: {
        const Value a = pick();
        pool.push_back(kb.concat({a, pick()}, in.next() & 1));
        break;
      }
      default: {
        const Value a = pick();
        pool.push_back(kb.matmul(a, pick(), in.next() & 1, in.next() & 1));
        break;
      }
    }
  }
  out_dtypes->push_back(kDTypes[in.next() % 6]);
  kb.store("y", pool.back(), out_dtypes->back());
  if (pool.size() > 5 && (in.next() & 1)) {
    out_dtypes->push_back(kDTypes[in.next() % 6]);
    kb.store("z", pool[pool.size() - 2], out_dtypes->back());
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 256) return 0;
  Reader in{data, size};
  const int64_t s = in.next() % 7, h = 1 + in.next() % 40;  // S may be 0 (empty tensors)
  std::vector<DType> dtypes;
  auto kernel = build(in, &dtypes);
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
  if (ok1 && !run(&by_zero, nullptr, *kernel, dtypes, inputs, *shapes, &ref) && !by_zero) {
    dvm::fuzz::fail("the reference rejects what the VM ran");
  }
  for (size_t k = 0; ok1 && k < out1.size(); ++k) {
    if (out1[k].bytes != out2[k].bytes) dvm::fuzz::fail("one and two threads differ");
  }
  return 0;
}
