// The graph compiler's public face: build a tensor graph with symbolic shapes once, compile it
// once (decompose, simplify, fuse, plan memory), then run it for any binding of the symbols.
//
//   dvm::GraphBuilder gb("mlp");
//   dvm::SymExpr S = gb.symbol("S", {1, 4096});
//   dvm::Tensor x = gb.input("x", dvm::DType::kF32, {S, 768});
//   dvm::Tensor w = gb.input("w", dvm::DType::kF32, {3072, 768});
//   dvm::Tensor b = gb.input("b", dvm::DType::kF32, {3072});
//   gb.output("y", gb.gelu(gb.linear(x, w, b)));
//   dvm::StatusOr<dvm::Graph> graph = gb.build();
//   auto exe = dvm::Executable::compile(*graph);        // once
//   (*exe)->run(inputs, outputs, &stats);                // any S, no recompilation
//
// Shapes are deduced symbolically (include/dvm/sym.h); broadcasting needs dims that are
// provably equal or a constant 1. Errors found while building (rank or dim contradictions,
// dtype mismatches) are recorded and returned by build(), naming the op and the dims.
// A GraphBuilder is not thread-safe; a Graph is immutable; an Executable may be run from
// several threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dvm/dtype.h"
#include "dvm/kernel.h"
#include "dvm/runtime.h"
#include "dvm/status.h"
#include "dvm/sym.h"

namespace dvm {

enum class GraphOp : uint8_t {
#define DVM_GRAPH_OP(Name, mnemonic, kind) k##Name,
#include "dvm/graph_ops.def"
};
const char* graph_op_name(GraphOp op);

// A value of a graph under construction: a handle, cheap to copy.
struct Tensor {
  int id = -1;
  bool valid() const { return id >= 0; }
};

namespace graph {
struct GraphDef;
}

// An immutable graph. Cheap to copy (shared).
class Graph {
 public:
  Graph() = default;
  explicit Graph(std::shared_ptr<const graph::GraphDef> def) : def_(std::move(def)) {}
  const graph::GraphDef& def() const { return *def_; }
  const std::string& name() const;
  int num_inputs() const;
  int num_outputs() const;
  int num_nodes() const;
  // The signature: inputs and outputs in argument order.
  std::vector<std::string> input_names() const;
  std::vector<DType> input_dtypes() const;
  std::vector<SymShape> input_shapes() const;
  std::vector<std::string> output_names() const;
  std::vector<DType> output_dtypes() const;
  std::vector<SymShape> output_shapes() const;
  // The text form (parse_graph() reads it back):
  //   graph mlp(%0: f32[s0, 768], %1: f32[3072, 768]) symbols(s0 in [1, 4096]) {
  //     %2 = matmul(%0, %1) {ints=[0, 1]} : f32[s0, 3072]
  //     return y=%2
  //   }
  std::string to_string() const;

 private:
  std::shared_ptr<const graph::GraphDef> def_;
};

StatusOr<Graph> parse_graph(std::string_view text);

class GraphBuilder {
 public:
  explicit GraphBuilder(std::string name);
  ~GraphBuilder();
  GraphBuilder(const GraphBuilder&) = delete;
  GraphBuilder& operator=(const GraphBuilder&) = delete;

  // A symbolic dimension with the range of values it may take (default: at least 1).
  SymExpr symbol(const std::string& name, SymRange range = {1, kSymMax});
  // Graph inputs, in declaration order (the order of run()'s inputs).
  Tensor input(const std::string& name, DType dtype, SymShape shape);
  // A scalar (rank-0) constant.
  Tensor constant(double value, DType dtype = DType::kF32);
  // Graph outputs, in declaration order.
  void output(const std::string& name, Tensor t);

  // Meta-ops (same semantics as the kernel builder, include/dvm/kernel.h).
  Tensor unary(UnaryOp op, Tensor x);
  Tensor binary(BinaryOp op, Tensor a, Tensor b);
  Tensor binary(BinaryOp op, Tensor a, double scalar);
  Tensor binary(BinaryOp op, double scalar, Tensor b);
  Tensor select(Tensor cond, Tensor if_true, Tensor if_false);  // torch.where
  Tensor cast(Tensor x, DType dtype);
  Tensor expand(Tensor x, SymShape shape);  // numpy broadcast to `shape`
  // Reshape preserving the element count; one dim may be the constant -1 (inferred).
  Tensor reshape(Tensor x, SymShape shape);
  Tensor permute(Tensor x, std::vector<int> perm);
  Tensor transpose(Tensor x, int axis0, int axis1);
  Tensor unsqueeze(Tensor x, int axis);
  Tensor squeeze(Tensor x, int axis);
  // x[start:stop:step] along `axis`; bounds may be symbolic (negative constants count from
  // the end; stop is clamped to the dim).
  Tensor slice(Tensor x, int axis, SymExpr start, SymExpr stop, int64_t step = 1);
  Tensor concat(std::vector<Tensor> xs, int axis);
  // torch.split with sizes along `axis`.
  std::vector<Tensor> split(Tensor x, std::vector<SymExpr> sizes, int axis);
  Tensor reduce(ReduceOp op, Tensor x, std::vector<int> axes, bool keepdims = false);
  Tensor matmul(Tensor a, Tensor b, bool transpose_a = false, bool transpose_b = false);
  // Native data-dependent ops: rows/elements chosen by integer indices (checked at run time).
  Tensor index_select(Tensor x, int axis, Tensor index);  // torch.index_select
  Tensor gather(Tensor x, int axis, Tensor index);        // torch.gather
  Tensor cumsum(Tensor x, int axis);  // torch.cumsum: dtype kept (cast first to promote)
  // Values 0..dim-1 along `axis`, broadcast over `shape` (torch.arange + expand).
  Tensor iota(SymShape shape, int axis, DType dtype = DType::kI64);

  // Composite ops (decomposed into meta-ops by the decompose pass).
  Tensor softmax(Tensor x, int axis);
  Tensor log_softmax(Tensor x, int axis);
  // Normalises over the trailing dims with the shape of `weight` (or the last dim when there
  // is no weight). weight/bias may be invalid (absent).
  Tensor layer_norm(Tensor x, Tensor weight, Tensor bias, double eps = 1e-5, int num_axes = 1);
  Tensor rms_norm(Tensor x, Tensor weight, double eps = 1e-6, int num_axes = 1);
  Tensor gelu(Tensor x, bool tanh_approximation = false);
  Tensor silu(Tensor x);
  Tensor swiglu(Tensor gate, Tensor up);
  // x @ weight^T + bias, weight [N, K] (torch.nn.functional.linear). bias may be absent.
  Tensor linear(Tensor x, Tensor weight, Tensor bias = {});
  Tensor embedding(Tensor weight, Tensor ids);
  Tensor variance(Tensor x, std::vector<int> axes, double correction = 1, bool keepdims = false);
  Tensor std_dev(Tensor x, std::vector<int> axes, double correction = 1, bool keepdims = false);
  // Mean cross-entropy of logits [N, C] against integer targets [N].
  Tensor cross_entropy(Tensor logits, Tensor target);
  // softmax(q @ k^T * scale + mask) @ v over the last two dims; mask may be absent (bool masks
  // select, float masks add). scale <= 0 means 1/sqrt(head_dim).
  Tensor attention(Tensor q, Tensor k, Tensor v, Tensor mask = {}, bool causal = false,
                   double scale = 0);
  Tensor clamp(Tensor x, std::optional<double> lo, std::optional<double> hi);

  Tensor add(Tensor a, Tensor b) { return binary(BinaryOp::kAdd, a, b); }
  Tensor sub(Tensor a, Tensor b) { return binary(BinaryOp::kSub, a, b); }
  Tensor mul(Tensor a, Tensor b) { return binary(BinaryOp::kMul, a, b); }
  Tensor div(Tensor a, Tensor b) { return binary(BinaryOp::kDiv, a, b); }

  const SymShape& shape(Tensor t) const;
  DType dtype(Tensor t) const;
  int rank(Tensor t) const;

  // Validates and freezes the graph (the first recorded error wins).
  StatusOr<Graph> build();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct GraphCompileOptions {
  bool fuse = true;      // false: one kernel per meta-op (the unfused baseline)
  bool optimize = true;  // false: skip canonicalise/constant-fold/CSE (decompose+DCE only)
  int num_threads = 0;   // 0: all hardware threads
};

// Per-call statistics of Executable::run().
struct GraphRunStats {
  int kernels_launched = 0;  // VM kernels (programs may be several per kernel)
  int native_launched = 0;   // native ops (gathers, iota, copies for non-viewable reshapes)
  int kernels_stacked = 0;   // small independent kernels launched side by side (parallel)
  int programs_encoded = 0;  // kernels that encoded a new program for this binding
  int cache_hits = 0;        // kernels whose program came from the cache
  // Wall-clock time spent encoding + verifying; the kernels of a binding seen for the first
  // time are encoded concurrently on the VM's threads before they run in order.
  double encode_us = 0;
  double bind_us = 0;       // binding symbols, planning buffers
  int64_t bytes_moved = 0;  // nominal bytes loaded + stored by the kernels
  int64_t peak_bytes = 0;   // intermediate buffer memory for this binding
  // The call bound addresses only: a repeated call of a binding and argument layout (the
  // binding's first run encodes, its second prepares the call that later ones take).
  bool prepared = false;
};

class Executable {
 public:
  static StatusOr<std::shared_ptr<Executable>> compile(const Graph& graph,
                                                       const GraphCompileOptions& options = {});
  ~Executable();

  // Runs the graph. Inputs in declaration order (any strides); outputs caller-allocated with
  // the shapes output_shapes() returns. An output overlapping an input or another output is
  // an error (graphs declare no aliases). If a native op fails mid-run (an index out of
  // range), outputs written by earlier kernels keep their values.
  Status run(std::span<const TensorArg> inputs, std::span<const TensorArg> outputs,
             GraphRunStats* stats = nullptr) const;
  // Makes the outputs of one call once the inputs are bound: called with the output shapes
  // (the dtypes are output_dtypes()), it fills `outputs` in output order.
  using OutputAllocator = std::function<Status(const std::vector<std::vector<int64_t>>& shapes,
                                               std::vector<TensorArg>* outputs)>;
  // Runs the graph into outputs that `allocate` makes: the inputs are bound once per call
  // (instead of output_shapes() then run()).
  Status run(std::span<const TensorArg> inputs, const OutputAllocator& allocate,
             GraphRunStats* stats = nullptr) const;
  // Binds the symbols from the input shapes and returns the output shapes.
  StatusOr<std::vector<std::vector<int64_t>>> output_shapes(
      std::span<const TensorArg> inputs) const;
  StatusOr<SymBindings> bind(std::span<const TensorArg> inputs) const;
  // Peak intermediate memory (bytes) for a binding.
  StatusOr<int64_t> peak_bytes(const SymBindings& bindings) const;

  const Graph& source() const;
  const Graph& optimized() const;  // after the pass pipeline
  std::vector<DType> output_dtypes() const;
  // The fusion result: each kernel, its kind and ops, and why each boundary exists.
  std::string fusion_report() const;
  int num_kernels() const;
  // The threads its kernels run on (the compile option, or all hardware threads for 0).
  int num_threads() const;

  struct Impl;  // implementation detail (src/exec/executable.cc)

 private:
  Executable();
  std::unique_ptr<Impl> impl_;
};

}  // namespace dvm
