// The internal form of a built kernel: a topologically ordered DAG of meta-op nodes with
// symbolic shapes. Shared by the encoder and the reference executor.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dvm/kernel.h"
#include "dvm/runtime.h"

namespace dvm::ir {

enum class OpKind : uint8_t {
  kLoad,   // input tensor slot
  kParam,  // run-time scalar slot (rank 0)
  kConst,  // scalar constant (rank 0)
  kUnary,
  kBinary,
  kSelect,  // inputs: cond, if_true, if_false
  kCast,
  kBroadcast,  // to `shape`
  kReshape,    // to `shape` (a -1 dim is stored as Dim(-1))
  kPermute,    // attr = perm
  kSlice,      // attr = {axis, start, stop, step}
  kConcat,     // attr = {axis}
  kReduce,     // attr = sorted axes, op = ReduceOp
  kMatMul,     // inputs a [..., M, K], b [..., K, N]; batch dims broadcast (numpy rules)
};

const char* op_kind_name(OpKind k);

struct Node {
  OpKind kind = OpKind::kLoad;
  DType dtype = DType::kF32;
  uint8_t op = 0;  // UnaryOp / BinaryOp / ReduceOp
  bool keepdims = false;
  int slot = -1;  // kLoad: input slot; kParam: param slot
  double fconst = 0;
  int64_t iconst = 0;
  std::vector<int> inputs;
  std::vector<Dim> shape;  // symbolic result shape (reshape/broadcast targets as given)
  std::vector<int64_t> attr;

  UnaryOp unary_op() const { return static_cast<UnaryOp>(op); }
  BinaryOp binary_op() const { return static_cast<BinaryOp>(op); }
  ReduceOp reduce_op() const { return static_cast<ReduceOp>(op); }
};

struct OutputDef {
  std::string name;
  int node = -1;
};

struct KernelDef {
  std::string name;
  std::vector<std::string> symbols;
  std::vector<Node> nodes;  // topological order: inputs precede users
  std::vector<std::string> input_names;
  std::vector<int> input_nodes;  // slot -> node
  std::vector<std::string> param_names;
  std::vector<DType> param_dtypes;
  std::vector<OutputDef> outputs;
};

// A concrete shape (rank <= kMaxRank).
struct CShape {
  int rank = 0;
  std::array<int64_t, kMaxRank> d{};
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= d[i];
    return n;
  }
  std::span<const int64_t> dims() const { return {d.data(), static_cast<size_t>(rank)}; }
  // The container interface the shared shape rules build results with.
  void clear() { rank = 0; }
  void push_back(int64_t v) { d[rank++] = v; }
  bool operator==(const CShape& o) const {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i)
      if (d[i] != o.d[i]) return false;
    return true;
  }
  std::string to_string() const;
};

// Concrete shapes of every node for one call.
struct Binding {
  std::vector<int64_t> symbols;  // value per symbol
  std::vector<CShape> shapes;    // per node
};

// Binds symbols from the input shapes and infers every node's concrete shape. Errors name the
// op (by node index and kind), the tensor and the dims.
Status bind_shapes(const KernelDef& def, std::span<const TensorArg> inputs, Binding* out);

// Checks inputs' dtypes/strides/storage and outputs' shapes/dtypes against a binding.
Status check_args(const KernelDef& def, const Binding& b, std::span<const TensorArg> inputs,
                  std::span<const TensorArg> outputs, std::span<const ScalarArg> params);

// Strides of a tensor argument (contiguous when empty).
void arg_strides(const TensorArg& t, int64_t* strides);
// Smallest and largest element offset a view touches (relative to data); false if empty.
bool view_span(const TensorArg& t, int64_t* lo, int64_t* hi);

std::string node_label(const KernelDef& def, int node);

// A slice's normalized bounds for an input axis of length `len` (python semantics).
struct SliceBounds {
  int64_t start = 0, step = 1, count = 0;
};
SliceBounds slice_bounds(const Node& n, int64_t len);

}  // namespace dvm::ir
