// Graph passes: each one function in its own file, each reading a GraphDef and returning a new
// one (inference re-checks every node it emits). pipeline.cc holds the one ordered list.
#pragma once

#include <functional>

#include "graph/graph_def.h"

namespace dvm::passes {

using graph::GraphDef;

// Composite ops (softmax, layer_norm, linear, attention, ...) into meta-ops and native ops.
StatusOr<GraphDef> decompose(const GraphDef& g);
// Identity and algebraic rewrites (rules as data, see canonicalize.cc).
StatusOr<GraphDef> canonicalize(const GraphDef& g);
// Ops on scalar constants evaluated with the VM's own scalar semantics.
StatusOr<GraphDef> constant_fold(const GraphDef& g);
// Common subexpression elimination: equal ops on equal operands share one node.
StatusOr<GraphDef> cse(const GraphDef& g);
// Dead code elimination: drops nodes no output depends on (inputs are kept: they are the
// argument list).
StatusOr<GraphDef> dce(const GraphDef& g);
// Computes only the rows a slice keeps, through the row-independent ops before it (a model's
// last-token logits: its last layer's MLP and head run on that row).
StatusOr<GraphDef> narrow_rows(const GraphDef& g);

// The pipeline: decompose, then (optimize) canonicalize, constant_fold, cse, narrow_rows, and
// dce.
// DVM_DUMP_IR=1 prints the IR after each pass to stderr.
StatusOr<GraphDef> run_pipeline(const GraphDef& g, bool optimize);

// Copies a graph node by node, remapping operands; a pass decides per node what to emit.
class Rewriter {
 public:
  static constexpr int kDropped = -2;
  explicit Rewriter(const GraphDef& src);
  graph::GraphEmitter& em() { return em_; }
  const GraphDef& src() const { return src_; }
  const GraphDef& out() const { return out_; }
  int map(int old_id) const { return remap_[old_id]; }
  // Emits a copy of the source node with remapped operands.
  int copy(int old_id);
  // Calls fn(old_id) for every source node in order; fn returns the new id of its value, or
  // kDropped for a node nothing uses any more.
  StatusOr<GraphDef> run(const std::function<int(int)>& fn);

 private:
  const GraphDef& src_;
  GraphDef out_;
  graph::GraphEmitter em_{&out_};
  std::vector<int> remap_;
};

}  // namespace dvm::passes
