// The graph IR's data: nodes in topological order, one value per node, symbolic shapes.
//
// Passes never mutate a GraphDef in place: they read one and emit a new one through a
// GraphEmitter, which infers (and so re-checks) every node's dtype and shape.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "dvm/graph.h"

namespace dvm::graph {

enum class OpClass : uint8_t { kMeta, kNative, kComposite };
OpClass op_class(GraphOp op);
GraphOp graph_op_from_name(std::string_view mnemonic, bool* found);

struct Node {
  GraphOp op = GraphOp::kInput;
  std::vector<int> inputs;  // value ids (= node indices) of earlier nodes
  DType dtype = DType::kF32;
  SymShape shape;
  // Attributes; which ones an op reads is listed in include/dvm/graph_ops.def.
  int sub = 0;  // UnaryOp / BinaryOp / ReduceOp
  int axis = 0;
  bool flag = false;
  double value = 0;
  double value2 = 0;
  std::vector<int64_t> ints;
  SymShape sym;      // target shape (broadcast, reshape, iota) or slice {start, stop}
  std::string name;  // inputs

  bool operator==(const Node& o) const;  // same op, inputs and attributes (for CSE)
};

struct GraphDef {
  std::string name;
  std::vector<Node> nodes;
  std::vector<int> inputs;  // ids of the Input nodes, in argument order
  std::vector<int> outputs;
  std::vector<std::string> output_names;
  std::map<std::string, SymRange, std::less<>> symbols;
};

// Computes n.dtype and n.shape from its inputs and attributes (normalising attributes: axes
// made non-negative and sorted, -1 reshape dims resolved, slice bounds canonicalised).
// Errors name the graph, the op and the dims.
Status infer_node(const GraphDef& g, Node& n);
// Grouped-query attention: q's heads per k/v head when q [.., Hq, S, D] has a constant multiple
// of k's Hk > 1 heads (query head h reads k/v head h / (Hq / Hk)); else 1.
int attention_groups(const SymShape& q, const SymShape& k);

// Appends nodes with inference; the first error is kept.
class GraphEmitter {
 public:
  explicit GraphEmitter(GraphDef* g) : g_(g) {}
  int emit(Node n);  // -1 after an error
  // Node `id`; for -1 (a failed emit) an empty node, so that a pass that builds on a failed
  // result reads a rank-0 placeholder instead of memory before the node array, and its own
  // emits return -1 until the recorded error surfaces.
  const Node& node(int id) const { return id >= 0 ? g_->nodes[id] : failed_node(); }
  const Status& status() const { return status_; }
  void fail(Status s) {
    if (status_.is_ok()) status_ = std::move(s);
  }

  // Helpers for passes that build meta-ops.
  int unary(UnaryOp op, int x);
  int binary(BinaryOp op, int a, int b);
  int scalar(double v, DType dtype);
  int binary_scalar(BinaryOp op, int a, double v);  // scalar in a's float dtype
  int select(int c, int a, int b);
  int cast(int x, DType t);
  int reduce(ReduceOp op, int x, std::vector<int64_t> axes, bool keepdims);
  int matmul(int a, int b, bool ta, bool tb);
  int reshape(int x, SymShape shape);
  int expand(int x, SymShape shape);
  int permute(int x, std::vector<int64_t> perm);
  int iota(SymShape shape, int axis, DType t);

 private:
  static const Node& failed_node();

  GraphDef* g_;
  Status status_;
};

std::string shape_str(const SymShape& s);
std::string node_str(const GraphDef& g, int id);  // one line of the text form

}  // namespace dvm::graph
