// Fuzz target: graph text -> parse_graph -> Executable::compile -> a run at a binding the input
// chooses, on one and on two threads.
//
// Invariants (a violation aborts, which the fuzzer reports as a crash):
// - nothing crashes, hangs or touches memory outside its tensors (ASan/UBSan builds);
// - bad text, bad graphs and bad bindings are Status errors;
// - the one- and two-thread executables agree: both fail, or both write the same bits
//   (DVM's results are bitwise identical for any thread count).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
  if (!exe1.is_ok()) return 0;
  const dvm::SymBindings bindings = choose_bindings(*graph, data, size);
  std::vector<Buffer> out1, out2;
  const bool ok1 = run(**exe1, *graph, bindings, &out1);
  const bool ok2 = run(**exe2, *graph, bindings, &out2);
  if (ok1 != ok2) dvm::fuzz::fail("runs on one thread count only");
  for (size_t k = 0; k < out1.size(); ++k) {
    if (out1[k].bytes != out2[k].bytes) dvm::fuzz::fail("one and two threads differ");
  }
  return 0;
}
