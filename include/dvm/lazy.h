// Lazy tensors: runtime fusion of eagerly issued ops.
//
// Ops on lazy tensors are recorded into a pending trace of the calling thread instead of being
// executed. A flush turns the trace into ONE graph with symbolic dims, compiles it (once per
// trace structure: the plan cache) and runs it through the same fuser and Executable as static
// graphs:
//
//   dvm::lazy::Tensor x = dvm::lazy::Tensor::wrap(dvm::TensorArg::contiguous(xs, kF32, {S, 768}));
//   dvm::lazy::Tensor w = dvm::lazy::Tensor::wrap(...);
//   dvm::lazy::Tensor y = dvm::lazy::gelu(dvm::lazy::linear(x, w)) * 0.5;   // nothing runs
//   dvm::StatusOr<dvm::TensorArg> v = y.data();                           // flush: one graph
//
// Flushes happen when a value is observed (data(), copy_to(), item(), to_string()), on sync(),
// when a pending value's memory is about to be written (mutable_data()), when a pending value
// of another thread's trace is used, and when the trace exceeds Options::max_trace_ops.
// Frameworks call sync(FlushReason::kUnsupported) before running an op DVM cannot run.
//
// At a flush only trace values that some Tensor handle still refers to are stored (into a
// buffer the runtime allocates, or the memory set_storage() named); every other recorded value
// is either computed inside fused kernels without being written to memory, or not computed at
// all when nothing live needs it.
//
// Symbolic dims: every dim of the trace's leaves that is not 0 or 1 gets a symbol by value
// class (dims equal at trace time share one symbol; 1 stays the constant 1, so broadcasting
// stays provable). Attribute dims (reshape, expand and slice bounds) are taken from their
// operand's dims where they match, else from the class of their value, else kept constant.
// When a relation the graph needs cannot be proven for every binding (a dim split by a
// reshape, a slice whose bound is another tensor's dim), the classes involved are specialised
// to constants. The plan cache key is the trace's structure: ops, attributes, dataflow, leaves
// and stored values, the dim-equivalence pattern and which dims are 1 (plus the values of
// specialised classes), never the values of symbolic dims. A loop that records the same trace
// with new shapes reuses the compiled plan and only encodes bytecode per new shape.
//
// Errors: an op whose operands do not fit (shapes, dtypes, axes) returns a Tensor holding the
// error Status (status()); ops on such a tensor propagate it, observing it returns it. A flush
// that fails gives its Status to every value it should have produced. Nothing aborts.
//
// Threading: each thread records into its own trace. Tensor handles may be passed between
// threads; using a pending value of another thread's trace flushes that trace first. Stats and
// the plan cache are process-wide and thread-safe.
//
// Memory: wrap() reads the caller's memory when the trace is flushed, not when the op is
// recorded. Do not write it while pending ops read it: call mutable_data() on the wrapping
// tensor (which flushes them) or sync() first.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dvm/dtype.h"
#include "dvm/graph.h"
#include "dvm/kernel.h"
#include "dvm/runtime.h"
#include "dvm/status.h"

namespace dvm::lazy {

namespace detail {
struct Node;
}

enum class FlushReason : uint8_t {
  kObserve,      // a value was read (data, copy_to, item, to_string)
  kSync,         // explicit sync()
  kSizeBound,    // the trace reached Options::max_trace_ops
  kUnsupported,  // the caller is about to run an op DVM cannot run
  kWrite,        // memory read or produced by the trace is about to be written
  kOtherThread,  // a pending value of this trace was used from another thread
};
inline constexpr int kNumFlushReasons = 6;
const char* flush_reason_name(FlushReason reason);

struct Options {
  int max_trace_ops = 4096;          // flush when the trace holds this many recorded ops
  size_t plan_cache_capacity = 512;  // compiled plans kept (cleared when full)
  bool fuse = true;                  // false: one kernel per meta-op (the unfused baseline)
  int num_threads = 0;               // VM threads; 0: all hardware threads
};
void set_options(const Options& options);
Options options();

// Process-wide counters since the last reset_stats().
struct Stats {
  int64_t ops_recorded = 0;
  int64_t flushes = 0;
  int64_t flushes_by_reason[kNumFlushReasons] = {};
  int64_t plan_cache_hits = 0;
  int64_t plan_cache_misses = 0;
  int64_t specialised_classes = 0;   // dim classes made constant (see above), over all misses
  int64_t kernels_launched = 0;      // VM kernels
  int64_t native_launched = 0;       // native ops (gathers, copies)
  int64_t programs_encoded = 0;      // bytecode programs encoded (new shapes)
  int64_t values_stored = 0;         // trace values written to memory (still referenced)
  int64_t bytes_stored = 0;          // their bytes
  int64_t intermediates_elided = 0;  // computed inside the graph, never stored as values
  int64_t ops_dropped = 0;           // recorded but not needed by any live value: not computed
  double compile_us = 0;             // building + compiling graphs (plan-cache misses)
  double encode_us = 0;              // encoding bytecode (part of run_us)
  double run_us = 0;                 // Executable::run
  double flush_us = 0;               // whole flushes (key, lookup or compile, run)
};
Stats stats();
void reset_stats();

// Flushes the calling thread's trace.
Status sync(FlushReason reason = FlushReason::kSync);
// Ops recorded in the calling thread's trace and not yet flushed.
int pending_ops();
// Drops every compiled plan.
void clear_plan_cache();
size_t plan_cache_size();

// A lazy tensor: a shared handle to a value that is pending (recorded, not computed), ready
// (in memory), or an error. Cheap to copy. A default-constructed Tensor is "absent" (for
// optional operands such as a layer_norm bias).
class Tensor {
 public:
  Tensor() = default;
  ~Tensor();
  Tensor(const Tensor& o);
  Tensor(Tensor&& o) noexcept;
  Tensor& operator=(const Tensor& o);
  Tensor& operator=(Tensor&& o) noexcept;

  // Wraps caller memory, zero-copy. `keep_alive` is held until no trace or tensor needs the
  // memory. Rank <= kMaxRank; any strides and offset.
  static Tensor wrap(const TensorArg& arg, std::shared_ptr<void> keep_alive = {});
  // A copy of contiguous host data in memory the runtime owns.
  static Tensor copy_of(const void* data, DType dtype, std::vector<int64_t> shape);
  // A tensor holding `status` (not ok).
  static Tensor error(Status status);

  bool defined() const { return node_ != nullptr; }
  Status status() const;  // ok unless an error
  DType dtype() const;
  const std::vector<int64_t>& shape() const;
  int rank() const { return static_cast<int>(shape().size()); }
  int64_t numel() const;
  bool is_pending() const;

  // Observation: flushes the trace that holds this value (if pending), then
  // - data(): a view of the value (valid while a handle to it lives);
  // - copy_to(): copies it, contiguous row-major, to `dst` (numel() * dtype size bytes);
  // - item(): the single element as a double;
  // - to_string(): "f32[2, 3] [[1, 2, 3], [4, 5, 6]]" (at most `max_elements` elements).
  StatusOr<TensorArg> data() const;
  Status copy_to(void* dst, size_t bytes) const;
  StatusOr<double> item() const;
  std::string to_string(int max_elements = 64) const;
  template <typename T>
  StatusOr<std::vector<T>> to_vector() const {
    std::vector<T> v(static_cast<size_t>(numel()));
    if (sizeof(T) != static_cast<size_t>(dtype_size(dtype()))) {
      return invalid_argument("to_vector: element size does not match " +
                              std::string(dtype_name(dtype())));
    }
    DVM_RETURN_IF_ERROR(copy_to(v.data(), v.size() * sizeof(T)));
    return v;
  }

  // For writing the value's memory in place: flushes every pending op of the calling
  // thread's trace (they may read this memory) and returns the view; for a pending value
  // flushes its trace first. A wrapped constant (TensorArg::version) stops being one.
  StatusOr<TensorArg> mutable_data();

  // Names the memory a pending value is stored into when the flush stores it (contiguous or
  // strided, the value's dtype and shape), instead of a runtime buffer. The memory must not be
  // read or written by anything else until the value is ready. `keep_alive` is held until then.
  Status set_storage(const TensorArg& dst, std::shared_ptr<void> keep_alive = {});

  // Identity (same underlying value).
  bool same_as(const Tensor& o) const { return node_ == o.node_; }

  const std::shared_ptr<detail::Node>& node() const { return node_; }
  explicit Tensor(std::shared_ptr<detail::Node> node);  // counts as a handle

 private:
  std::shared_ptr<detail::Node> node_;
};

// A reference that does not keep a pending value alive: at a flush the value is stored only
// if some Tensor refers to it. lock() returns the Tensor while the value is pending or ready,
// an undefined Tensor once it was dropped or elided by a flush.
class WeakTensor {
 public:
  WeakTensor() = default;
  explicit WeakTensor(const Tensor& t) : node_(t.node()) {}
  Tensor lock() const;

 private:
  std::weak_ptr<detail::Node> node_;
};

// ---------------------------------------------------------------------------------------------
// Ops. Same semantics as the GraphBuilder ops of include/dvm/graph.h (numpy broadcasting, the
// promotion lattice of include/dvm/dtype.h), on concrete shapes.

// A rank-0 constant (its value is part of the plan key, like the scalars of binary()).
Tensor scalar(double value, DType dtype = DType::kF32);
Tensor unary(UnaryOp op, const Tensor& x);
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
Tensor binary(BinaryOp op, const Tensor& a, double scalar);
Tensor binary(BinaryOp op, double scalar, const Tensor& b);
Tensor select(const Tensor& cond, const Tensor& if_true, const Tensor& if_false);
Tensor cast(const Tensor& x, DType dtype);
Tensor expand(const Tensor& x, std::vector<int64_t> shape);   // -1 keeps a dim
Tensor reshape(const Tensor& x, std::vector<int64_t> shape);  // one dim may be -1
Tensor permute(const Tensor& x, std::vector<int> perm);
Tensor transpose(const Tensor& x, int axis0, int axis1);
Tensor unsqueeze(const Tensor& x, int axis);
Tensor squeeze(const Tensor& x, int axis);  // no-op on a dim that is not 1
// x[start:stop:step] along axis (negative bounds count from the end; clamped; step >= 1).
Tensor slice(const Tensor& x, int axis, int64_t start, int64_t stop = kSliceEnd, int64_t step = 1);
Tensor concat(const std::vector<Tensor>& xs, int axis);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int axis);
Tensor reduce(ReduceOp op, const Tensor& x, std::vector<int> axes, bool keepdims = false);
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
Tensor index_select(const Tensor& x, int axis, const Tensor& index);
Tensor gather(const Tensor& x, int axis, const Tensor& index);
Tensor cumsum(const Tensor& x, int axis);  // dtype kept (cast first to promote)
Tensor iota(std::vector<int64_t> shape, int axis, DType dtype = DType::kI64);

Tensor softmax(const Tensor& x, int axis);
Tensor log_softmax(const Tensor& x, int axis);
Tensor layer_norm(const Tensor& x, const Tensor& weight = {}, const Tensor& bias = {},
                  double eps = 1e-5, int num_axes = 1);
Tensor rms_norm(const Tensor& x, const Tensor& weight = {}, double eps = 1e-6, int num_axes = 1);
Tensor gelu(const Tensor& x, bool tanh_approximation = false);
Tensor silu(const Tensor& x);
Tensor swiglu(const Tensor& gate, const Tensor& up);
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});
Tensor embedding(const Tensor& weight, const Tensor& ids);
Tensor variance(const Tensor& x, std::vector<int> axes, double correction = 1,
                bool keepdims = false);
Tensor std_dev(const Tensor& x, std::vector<int> axes, double correction = 1,
               bool keepdims = false);
Tensor cross_entropy(const Tensor& logits, const Tensor& target);
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask = {},
                 bool causal = false, double scale = 0);
Tensor clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi);

inline Tensor sum(const Tensor& x, std::vector<int> axes, bool keepdims = false) {
  return reduce(ReduceOp::kSum, x, std::move(axes), keepdims);
}
inline Tensor mean(const Tensor& x, std::vector<int> axes, bool keepdims = false) {
  return reduce(ReduceOp::kMean, x, std::move(axes), keepdims);
}
inline Tensor amax(const Tensor& x, std::vector<int> axes, bool keepdims = false) {
  return reduce(ReduceOp::kMax, x, std::move(axes), keepdims);
}

inline Tensor operator+(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::kAdd, a, b);
}
inline Tensor operator-(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::kSub, a, b);
}
inline Tensor operator*(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::kMul, a, b);
}
inline Tensor operator/(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::kDiv, a, b);
}
inline Tensor operator+(const Tensor& a, double b) {
  return binary(BinaryOp::kAdd, a, b);
}
inline Tensor operator-(const Tensor& a, double b) {
  return binary(BinaryOp::kSub, a, b);
}
inline Tensor operator*(const Tensor& a, double b) {
  return binary(BinaryOp::kMul, a, b);
}
inline Tensor operator/(const Tensor& a, double b) {
  return binary(BinaryOp::kDiv, a, b);
}
inline Tensor operator+(double a, const Tensor& b) {
  return binary(BinaryOp::kAdd, a, b);
}
inline Tensor operator-(double a, const Tensor& b) {
  return binary(BinaryOp::kSub, a, b);
}
inline Tensor operator*(double a, const Tensor& b) {
  return binary(BinaryOp::kMul, a, b);
}
inline Tensor operator/(double a, const Tensor& b) {
  return binary(BinaryOp::kDiv, a, b);
}
inline Tensor operator-(const Tensor& x) {
  return unary(UnaryOp::kNeg, x);
}

}  // namespace dvm::lazy
