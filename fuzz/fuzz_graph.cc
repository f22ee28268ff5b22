// Fuzz target: graph text -> parse_graph -> Executable::compile -> a run at a binding the input
// chooses, on one and on two threads.
//
// Invariants (a violation aborts, which the fuzzer reports as a crash):
// - nothing crashes, hangs or touches memory outside its tensors (ASan/UBSan builds);
// - bad text, bad graphs and bad bindings are Status errors;
// - the one- and two-thread executables agree: both fail, or both write the same bits
//   (DVM's results are bitwise identical for any thread count);
// - fusion loses nothing the unfused executable (one kernel per meta-op: the fuser's oracle)
//   has: where it runs, the fused one runs too, and writes every output element it writes.
//   Values are not compared: fused kernels contract a * b + c into one rounding and may sum in
//   another order, and a comparison or a cast downstream can turn an ulp into any difference.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "dvm/graph.h"
#include "fuzz_util.h"

namespace {

using dvm::fuzz::Buffer;

// Every symbol of the inputs' shapes gets 1 + (byte % 9) from the input's last bytes: small
// bindings, so a run stays cheap, and the fuzzer controls them.
dvm::SymBindings choose_bindings(const dvm::Graph& g, const uint8_t* data, size_t size) {
  std::set<std::string> names;
  for (const dvm::SymShape& s : g.input_shapes()) {
    for (const dvm::SymExpr& d : s) {
      for (std::string& n : d.symbols()) names.insert(std::move(n));
    }
  }
  dvm::SymBindings b;
  size_t i = 0;
  for (const std::string& n : names) {
    const uint8_t byte = size > 0 ? data[size - 1 - (i++ % size)] : 0;
    b[n] = 1 + byte % 9;
  }
  return b;
}

// Runs `exe` on inputs made for `bindings`; false (and no outputs) when it reports an error.
bool run(const dvm::Executable& exe, const dvm::Graph& g, const dvm::SymBindings& bindings,
         std::vector<Buffer>* outputs) {
  std::vector<Buffer> inputs;
  const std::vector<dvm::SymShape> shapes = g.input_shapes();
  const std::vector<dvm::DType> dtypes = g.input_dtypes();
  for (size_t k = 0; k < shapes.size(); ++k) {
    std::vector<int64_t> dims;
    for (const dvm::SymExpr& d : shapes[k]) {
      auto v = d.evaluate(bindings);
      if (!v.is_ok() || *v < 0 || *v > (1 << 12)) return false;
      dims.push_back(*v);
    }
    if (!dvm::fuzz::small_enough(dims)) return false;
    inputs.push_back(Buffer::filled(dtypes[k], dims, static_cast<uint32_t>(k)));
  }
  std::vector<dvm::TensorArg> in;
  for (Buffer& b : inputs) in.push_back(b.arg());
  auto out_shapes = exe.output_shapes(in);
  if (!out_shapes.is_ok()) return false;
  const std::vector<dvm::DType> out_dtypes = exe.output_dtypes();
  for (size_t k = 0; k < out_shapes->size(); ++k) {
    if (!dvm::fuzz::small_enough((*out_shapes)[k])) return false;
    outputs->push_back(Buffer::poisoned(out_dtypes[k], (*out_shapes)[k]));
  }
  std::vector<dvm::TensorArg> out;
  for (Buffer& b : *outputs) out.push_back(b.arg());
  if (!exe.run(in, out).is_ok()) {
    outputs->clear();
    return false;
  }
  return true;
}

// The unfused executable of g (one kernel per meta-op) run at `bindings`: its outputs, or
// nothing where it does not compile or run.
std::optional<std::vector<Buffer>> run_unfused(const dvm::Graph& g,
                                               const dvm::SymBindings& bindings) {
  dvm::GraphCompileOptions o;
  o.fuse = false;
  o.num_threads = 1;
  auto exe = dvm::Executable::compile(g, o);
  if (!exe.is_ok()) return std::nullopt;
  std::vector<Buffer> out;
  if (!run(**exe, g, bindings, &out)) return std::nullopt;
  return out;
}

// The fused run against the unfused one (both ran): the same outputs, and no element that the
// unfused executable wrote left unwritten by the fused one.
void check_against_unfused(const std::vector<Buffer>& fused, const std::vector<Buffer>& unfused) {
  if (fused.size() != unfused.size()) dvm::fuzz::fail("fused and unfused output counts differ");
  for (size_t k = 0; k < fused.size(); ++k) {
    if (fused[k].shape != unfused[k].shape || fused[k].dtype != unfused[k].dtype)
      dvm::fuzz::fail("fused and unfused outputs differ in shape or dtype");
    for (int64_t i = 0; i < fused[k].numel(); ++i) {
      if (fused[k].unwritten(i) && !unfused[k].unwritten(i))
        dvm::fuzz::fail("fusion left an output element unwritten");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16384) return 0;  // long texts only slow the search down
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto graph = dvm::parse_graph(text);
  if (!graph.is_ok()) return 0;
  auto [exe1, exe2] = dvm::fuzz::compile_on_one_and_two_threads([&](int threads) {
    dvm::GraphCompileOptions o;
    o.num_threads = threads;
    return dvm::Executable::compile(*graph, o);
  });
  const dvm::SymBindings bindings = choose_bindings(*graph, data, size);
  if (!exe1.is_ok()) {
    if (run_unfused(*graph, bindings)) {
      std::fprintf(stderr, "fused: %s\n", exe1.status().to_string().c_str());
      dvm::fuzz::fail("the unfused graph compiles and runs, the fused one does not compile");
    }
    return 0;
  }
  std::vector<Buffer> out1, out2;
  const bool ok1 = run(**exe1, *graph, bindings, &out1);
  const bool ok2 = run(**exe2, *graph, bindings, &out2);
  if (ok1 != ok2) dvm::fuzz::fail("runs on one thread count only");
  for (size_t k = 0; k < out1.size(); ++k) {
    if (out1[k].bytes != out2[k].bytes) dvm::fuzz::fail("one and two threads differ");
  }
  const std::optional<std::vector<Buffer>> unfused = run_unfused(*graph, bindings);
  if (!unfused) return 0;  // it may fail where the fused one runs (larger intermediates)
  if (!ok1) dvm::fuzz::fail("the unfused executable runs and the fused one does not");
  check_against_unfused(out1, *unfused);
  return 0;
}
