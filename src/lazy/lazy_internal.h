// Internals of the lazy tensor runtime (include/dvm/lazy.h): trace nodes, the per-thread
// trace, concrete shape inference at record time and the flush (graph building, plan cache).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "dvm/graph.h"
#include "dvm/lazy.h"

namespace dvm::lazy::detail {

struct Trace;

// A dim given as an op attribute (reshape/expand/iota shapes, slice bounds), with how it
// relates to the trace's dims. The flush maps it to a SymExpr; the plan key encodes the kind
// and, for kValue, the value's dim class or the literal.
struct AttrDim {
  enum Kind : uint8_t {
    kValue,    // the value itself: its dim class when it has one, else a constant
    kSrcDim,   // dim `a` of input 0
    kSrcProd,  // product of dims [a, b) of input 0 (a merge, or a dim kept by a reshape)
  };
  Kind kind = kValue;
  int64_t value = 0;
  int a = 0, b = 0;
};

enum class State : uint8_t {
  kPending,  // recorded in a trace
  kReady,    // `arg` holds the value
  kError,    // `status` holds the error
  kDropped,  // flushed without being stored (no handle referred to it)
};

struct Node {
  std::atomic<State> state{State::kPending};
  // The op, with the attribute fields of graph::Node (include/dvm/graph_ops.def).
  GraphOp op = GraphOp::kInput;
  int sub = 0;
  int axis = 0;
  bool flag = false;
  double value = 0, value2 = 0;
  DType attr_dtype = DType::kF32;  // cast target, constant and iota dtype
  std::vector<int64_t> ints;
  std::vector<AttrDim> dims;
  std::vector<std::shared_ptr<Node>> inputs;  // cleared once the node leaves its trace
  // Result, known at record time.
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // kReady: the value and what keeps its memory alive.
  TensorArg arg;
  std::shared_ptr<void> keep;
  // Where a flush stores the value (set_storage), instead of a runtime buffer.
  bool has_dst = false;
  TensorArg dst;
  std::shared_ptr<void> dst_keep;
  Status status;  // kError
  // Tensor handles (not WeakTensors, not trace edges) that refer to the node: > 0 at a flush
  // means the value is stored.
  std::atomic<int> handles{0};
  // kPending: the trace and the position in it.
  std::shared_ptr<Trace> trace;
  int index = -1;
};

using NodePtr = std::shared_ptr<Node>;

// A thread's pending ops, in record order (a topological order).
struct Trace {
  std::mutex mu;
  std::vector<NodePtr> nodes;
};

// The calling thread's trace.
const std::shared_ptr<Trace>& this_thread_trace();

// Flushes `trace` (locks it). Stored values become kReady, the rest kDropped; on failure the
// stored values become kError with the returned Status.
Status flush(Trace& trace, FlushReason reason);

// Fills n.dtype and n.shape from the inputs and attributes, normalising axes and filling
// n.dims for shape attributes. `shape_attr` is the reshape/expand/iota target as given.
Status infer(Node& n, const std::vector<int64_t>& shape_attr);

// Process-wide counters (stats()).
void count_recorded();
Options current_options();

}  // namespace dvm::lazy::detail
