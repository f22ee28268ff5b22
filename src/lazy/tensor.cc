// lazy::Tensor handles, leaves, observation, and recording ops into the thread's trace.
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "exec/native_ops.h"
#include "exec/views.h"
#include "lazy/lazy_internal.h"
#include "ops/scalar_ops.h"

namespace dvm::lazy {

using detail::AttrDim;
using detail::Node;
using detail::NodePtr;
using detail::State;

// ---------------------------------------------------------------------------------------------
// Handles

Tensor::Tensor(std::shared_ptr<detail::Node> node) : node_(std::move(node)) {
  if (node_) node_->handles.fetch_add(1, std::memory_order_relaxed);
}
Tensor::~Tensor() {
  if (node_) node_->handles.fetch_sub(1, std::memory_order_relaxed);
}
Tensor::Tensor(const Tensor& o) : Tensor(o.node_) {}
Tensor::Tensor(Tensor&& o) noexcept : node_(std::move(o.node_)) {}
Tensor& Tensor::operator=(const Tensor& o) {
  if (this != &o) *this = Tensor(o);
  return *this;
}
Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    if (node_) node_->handles.fetch_sub(1, std::memory_order_relaxed);
    node_ = std::move(o.node_);
  }
  return *this;
}

Tensor WeakTensor::lock() const {
  NodePtr n = node_.lock();
  if (!n) return Tensor();
  // A node revived while pending is stored at the next flush; a dropped one has no value.
  Tensor t(n);
  if (n->state.load() == State::kDropped) return Tensor();
  return t;
}

namespace {

void* alloc_bytes(int64_t bytes) {
  size_t n = static_cast<size_t>((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
  return std::aligned_alloc(64, n);
}

Status bad_tensor(const std::string& msg) {
  std::string m = "lazy tensor: ";
  m += msg;
  return invalid_argument(std::move(m));
}

}  // namespace

Tensor Tensor::wrap(const TensorArg& arg, std::shared_ptr<void> keep_alive) {
  if (arg.shape.size() > static_cast<size_t>(kMaxRank)) {
    return error(bad_tensor("rank " + std::to_string(arg.shape.size()) + " exceeds " +
                            std::to_string(kMaxRank)));
  }
  if (!arg.strides.empty() && arg.strides.size() != arg.shape.size()) {
    return error(bad_tensor("strides do not match the rank"));
  }
  for (int64_t d : arg.shape)
    if (d < 0) return error(bad_tensor("negative dim"));
  if (arg.data == nullptr && arg.numel() > 0) return error(bad_tensor("null data"));
  auto n = std::make_shared<Node>();
  n->op = GraphOp::kInput;
  n->dtype = arg.dtype;
  n->shape = arg.shape;
  n->arg = arg;
  if (n->arg.strides.empty()) n->arg.strides = exec::contiguous_strides(arg.shape);
  n->keep = std::move(keep_alive);
  n->state = State::kReady;
  return Tensor(std::move(n));
}

Tensor Tensor::copy_of(const void* data, DType dtype, std::vector<int64_t> shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  if (count < 0) return error(bad_tensor("negative dim"));
  int64_t bytes = count * dtype_size(dtype);
  void* buf = alloc_bytes(bytes);
  if (bytes > 0) std::memcpy(buf, data, static_cast<size_t>(bytes));
  std::shared_ptr<void> keep(buf, std::free);
  return wrap(TensorArg::contiguous(buf, dtype, std::move(shape)), std::move(keep));
}

Tensor Tensor::error(Status status) {
  auto n = std::make_shared<Node>();
  if (status.is_ok()) status = internal_error("lazy tensor: error() with an ok Status");
  n->status = std::move(status);
  n->state = State::kError;
  return Tensor(std::move(n));
}

Status Tensor::status() const {
  if (!node_) return bad_tensor("undefined tensor");
  return node_->state.load() == State::kError ? node_->status : Status::ok();
}

DType Tensor::dtype() const {
  return node_ ? node_->dtype : DType::kF32;
}

const std::vector<int64_t>& Tensor::shape() const {
  static const std::vector<int64_t> kEmpty;
  return node_ ? node_->shape : kEmpty;
}

int64_t Tensor::numel() const {
  int64_t p = 1;
  for (int64_t d : shape()) p *= d;
  return p;
}

bool Tensor::is_pending() const {
  return node_ && node_->state.load() == State::kPending;
}

namespace {

Status materialise(const NodePtr& n, FlushReason reason) {
  if (!n) return bad_tensor("undefined tensor");
  if (n->state.load() == State::kPending) {
    Status st = detail::flush(*n->trace, reason);
    (void)st;  // the node's own state carries the outcome
  }
  switch (n->state.load()) {
    case State::kReady:
      return Status::ok();
    case State::kError:
      return n->status;
    default:
      return internal_error("lazy tensor: a referenced value was not stored by its flush");
  }
}

double read_element(const TensorArg& a, int64_t flat) {
  int64_t off = a.offset;
  for (int d = static_cast<int>(a.shape.size()) - 1; d >= 0; --d) {
    int64_t i = a.shape[d] ? flat % a.shape[d] : 0;
    flat = a.shape[d] ? flat / a.shape[d] : 0;
    off += i * a.strides[d];
  }
  return ops::load_element(static_cast<const char*>(a.data) + off * dtype_size(a.dtype), a.dtype);
}

std::string format_number(double v, DType t) {
  char buf[48];
  if (is_float(t)) {
    std::snprintf(buf, sizeof(buf), "%.6g", v);
  } else if (t == DType::kBool) {
    return v != 0 ? "true" : "false";
  } else {
    std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(v));
  }
  return buf;
}

}  // namespace

StatusOr<TensorArg> Tensor::data() const {
  DVM_RETURN_IF_ERROR(materialise(node_, FlushReason::kObserve));
  return node_->arg;
}

Status Tensor::copy_to(void* dst, size_t bytes) const {
  DVM_RETURN_IF_ERROR(materialise(node_, FlushReason::kObserve));
  size_t need = static_cast<size_t>(numel() * dtype_size(dtype()));
  if (bytes != need) {
    return bad_tensor("copy_to: " + std::to_string(bytes) + " bytes given, the value has " +
                      std::to_string(need));
  }
  if (need == 0) return Status::ok();
  TensorArg out = TensorArg::contiguous(dst, dtype(), shape());
  out.strides = exec::contiguous_strides(out.shape);
  exec::strided_copy(node_->arg, out);
  return Status::ok();
}

StatusOr<double> Tensor::item() const {
  DVM_RETURN_IF_ERROR(materialise(node_, FlushReason::kObserve));
  if (numel() != 1) {
    return bad_tensor("item() of a tensor with " + std::to_string(numel()) + " elements");
  }
  return read_element(node_->arg, 0);
}

std::string Tensor::to_string(int max_elements) const {
  Status st = materialise(node_, FlushReason::kObserve);
  if (!st.is_ok()) return "lazy tensor error: " + st.to_string();
  std::string s(dtype_name(dtype()));
  s += "[";
  for (int i = 0; i < rank(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape()[i]);
  }
  s += "] ";
  int64_t n = numel();
  const std::vector<int64_t>& sh = shape();
  for (int i = 0; i < rank(); ++i) s += "[";
  for (int64_t k = 0; k < n && k < max_elements; ++k) {
    if (k) {
      // Close and reopen brackets at row boundaries.
      int closed = 0;
      int64_t m = 1;
      for (int d = rank() - 1; d > 0 && k % (m * sh[d]) == 0; --d, ++closed) m *= sh[d];
      s += std::string(closed, ']');
      s += ", ";
      s += std::string(closed, '[');
    }
    s += format_number(read_element(node_->arg, k), dtype());
  }
  if (n > max_elements) s += ", ...";
  for (int i = 0; i < rank(); ++i) s += "]";
  return s;
}

StatusOr<TensorArg> Tensor::mutable_data() {
  if (!node_) return bad_tensor("undefined tensor");
  if (node_->state.load() == State::kPending) {
    DVM_RETURN_IF_ERROR(materialise(node_, FlushReason::kWrite));
  } else if (node_->state.load() == State::kReady && pending_ops() > 0) {
    Status st = sync(FlushReason::kWrite);
    (void)st;  // failures belong to the values of that trace
  }
  DVM_RETURN_IF_ERROR(status());
  // The caller writes the memory: it is no longer the constant its version promised.
  node_->arg.version = 0;
  return node_->arg;
}

Status Tensor::set_storage(const TensorArg& dst, std::shared_ptr<void> keep_alive) {
  if (!node_) return bad_tensor("undefined tensor");
  if (dst.dtype != dtype() || dst.shape != shape()) {
    return bad_tensor("set_storage: memory must be " + std::string(dtype_name(dtype())) +
                      " of the value's shape");
  }
  if (!dst.strides.empty() && dst.strides.size() != dst.shape.size()) {
    return bad_tensor("set_storage: strides do not match the rank");
  }
  std::shared_ptr<detail::Trace> tr = node_->trace;
  if (!tr) return bad_tensor("set_storage: the value is not pending");
  std::lock_guard<std::mutex> lock(tr->mu);
  if (node_->state.load() != State::kPending) {
    return bad_tensor("set_storage: the value is not pending");
  }
  node_->has_dst = true;
  node_->dst = dst;
  if (node_->dst.strides.empty()) node_->dst.strides = exec::contiguous_strides(dst.shape);
  node_->dst_keep = std::move(keep_alive);
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Recording

namespace {

NodePtr make(GraphOp op, std::vector<NodePtr> inputs) {
  auto n = std::make_shared<Node>();
  n->op = op;
  n->inputs = std::move(inputs);
  return n;
}

Status operand_error(const Node& n, const NodePtr& in) {
  if (!in) {
    std::string m = "lazy ";
    m += graph_op_name(n.op);
    m += ": an operand is undefined";
    return invalid_argument(std::move(m));
  }
  switch (in->state.load()) {
    case State::kError:
      return in->status;
    case State::kDropped:
      return internal_error("lazy: an operand was dropped by a flush");
    default:
      return Status::ok();
  }
}

Tensor record(NodePtr n, const std::vector<int64_t>& shape_attr = {}) {
  const std::shared_ptr<detail::Trace>& tr = detail::this_thread_trace();
  for (const NodePtr& in : n->inputs) {
    if (in && in->state.load() == State::kPending && in->trace != tr) {
      Status st = detail::flush(*in->trace, FlushReason::kOtherThread);
      (void)st;  // the operand's state carries it
    }
    Status st = operand_error(*n, in);
    if (!st.is_ok()) return Tensor::error(st);
  }
  Status st = detail::infer(*n, shape_attr);
  if (st.is_ok() && n->shape.size() > static_cast<size_t>(kMaxRank)) {
    st = invalid_argument("lazy: result rank exceeds " + std::to_string(kMaxRank));
  }
  if (!st.is_ok()) return Tensor::error(st);
  Tensor t(n);
  size_t size;
  {
    std::lock_guard<std::mutex> lock(tr->mu);
    n->trace = tr;
    n->index = static_cast<int>(tr->nodes.size());
    tr->nodes.push_back(n);
    size = tr->nodes.size();
  }
  detail::count_recorded();
  if (size >= static_cast<size_t>(std::max(1, detail::current_options().max_trace_ops))) {
    Status fs = detail::flush(*tr, FlushReason::kSizeBound);
    (void)fs;  // t's state carries it
  }
  return t;
}

bool ok_operand(const Tensor& t) {
  return t.defined() && t.status().is_ok();
}

Tensor constant(double v, DType t) {
  NodePtr n = make(GraphOp::kConstant, {});
  n->value = v;
  n->attr_dtype = t;
  return record(std::move(n));
}

// The dtype a scalar operand takes next to a tensor of dtype `t` (GraphBuilder's rule).
DType scalar_dtype(DType t, double v) {
  if (!is_float(t) && (std::floor(v) != v || !std::isfinite(v))) return DType::kF32;
  return t;
}

NodePtr unary_node(GraphOp op, const Tensor& x) {
  return make(op, {x.node()});
}

}  // namespace

Tensor scalar(double value, DType dtype) {
  return constant(value, dtype);
}

Tensor unary(UnaryOp op, const Tensor& x) {
  NodePtr n = unary_node(GraphOp::kUnary, x);
  n->sub = static_cast<int>(op);
  return record(std::move(n));
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  NodePtr n = make(GraphOp::kBinary, {a.node(), b.node()});
  n->sub = static_cast<int>(op);
  return record(std::move(n));
}

Tensor binary(BinaryOp op, const Tensor& a, double scalar) {
  if (!ok_operand(a)) return binary(op, a, Tensor());
  return binary(op, a, constant(scalar, scalar_dtype(a.dtype(), scalar)));
}

Tensor binary(BinaryOp op, double scalar, const Tensor& b) {
  if (!ok_operand(b)) return binary(op, Tensor(), b);
  return binary(op, constant(scalar, scalar_dtype(b.dtype(), scalar)), b);
}

Tensor select(const Tensor& cond, const Tensor& if_true, const Tensor& if_false) {
  return record(make(GraphOp::kSelect, {cond.node(), if_true.node(), if_false.node()}));
}

Tensor cast(const Tensor& x, DType dtype) {
  if (ok_operand(x) && x.dtype() == dtype) return x;
  NodePtr n = unary_node(GraphOp::kCast, x);
  n->attr_dtype = dtype;
  return record(std::move(n));
}

Tensor expand(const Tensor& x, std::vector<int64_t> shape) {
  if (ok_operand(x) && x.shape() == shape) return x;
  return record(unary_node(GraphOp::kBroadcast, x), shape);
}

Tensor reshape(const Tensor& x, std::vector<int64_t> shape) {
  if (ok_operand(x) && x.shape() == shape) return x;
  return record(unary_node(GraphOp::kReshape, x), shape);
}

Tensor permute(const Tensor& x, std::vector<int> perm) {
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == int(i);
  if (ok_operand(x) && identity && perm.size() == x.shape().size()) return x;
  NodePtr n = unary_node(GraphOp::kPermute, x);
  n->ints.assign(perm.begin(), perm.end());
  return record(std::move(n));
}

Tensor transpose(const Tensor& x, int axis0, int axis1) {
  if (!ok_operand(x)) return permute(x, {});
  int r = x.rank();
  if (axis0 < 0) axis0 += r;
  if (axis1 < 0) axis1 += r;
  if (axis0 < 0 || axis0 >= r || axis1 < 0 || axis1 >= r) {
    return Tensor::error(
        invalid_argument("lazy transpose: axes out of range for rank " + std::to_string(r)));
  }
  std::vector<int> perm(r);
  for (int i = 0; i < r; ++i) perm[i] = i;
  std::swap(perm[axis0], perm[axis1]);
  return permute(x, perm);
}

Tensor unsqueeze(const Tensor& x, int axis) {
  if (!ok_operand(x)) return reshape(x, {});
  std::vector<int64_t> s = x.shape();
  int r = x.rank();
  if (axis < 0) axis += r + 1;
  if (axis < 0 || axis > r) {
    return Tensor::error(
        invalid_argument("lazy unsqueeze: axis out of range for rank " + std::to_string(r)));
  }
  s.insert(s.begin() + axis, 1);
  return reshape(x, s);
}

Tensor squeeze(const Tensor& x, int axis) {
  if (!ok_operand(x)) return reshape(x, {});
  std::vector<int64_t> s = x.shape();
  int r = x.rank();
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r) {
    return Tensor::error(
        invalid_argument("lazy squeeze: axis out of range for rank " + std::to_string(r)));
  }
  if (s[axis] != 1) return x;
  s.erase(s.begin() + axis);
  return reshape(x, s);
}

Tensor slice(const Tensor& x, int axis, int64_t start, int64_t stop, int64_t step) {
  if (ok_operand(x) && step == 1 && start == 0) {
    int a = axis < 0 ? axis + x.rank() : axis;
    if (a >= 0 && a < x.rank() && stop >= x.shape()[a]) return x;
  }
  NodePtr n = unary_node(GraphOp::kSlice, x);
  n->axis = axis;
  n->ints = {step};
  return record(std::move(n), {start, stop});
}

Tensor concat(const std::vector<Tensor>& xs, int axis) {
  if (xs.size() == 1) return xs[0];
  std::vector<NodePtr> ins;
  for (const Tensor& t : xs) ins.push_back(t.node());
  NodePtr n = make(GraphOp::kConcat, std::move(ins));
  n->axis = axis;
  return record(std::move(n));
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int axis) {
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(slice(x, axis, start, start + s, 1));
    start += s;
  }
  return out;
}

Tensor reduce(ReduceOp op, const Tensor& x, std::vector<int> axes, bool keepdims) {
  NodePtr n = unary_node(GraphOp::kReduce, x);
  n->sub = static_cast<int>(op);
  n->ints.assign(axes.begin(), axes.end());
  n->flag = keepdims;
  return record(std::move(n));
}

Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a, bool transpose_b) {
  NodePtr n = make(GraphOp::kMatMul, {a.node(), b.node()});
  n->ints = {transpose_a ? 1 : 0, transpose_b ? 1 : 0};
  return record(std::move(n));
}

Tensor index_select(const Tensor& x, int axis, const Tensor& index) {
  NodePtr n = make(GraphOp::kIndexSelect, {x.node(), index.node()});
  n->axis = axis;
  return record(std::move(n));
}

Tensor gather(const Tensor& x, int axis, const Tensor& index) {
  NodePtr n = make(GraphOp::kGather, {x.node(), index.node()});
  n->axis = axis;
  return record(std::move(n));
}

Tensor cumsum(const Tensor& x, int axis) {
  NodePtr n = make(GraphOp::kCumsum, {x.node()});
  n->axis = axis;
  return record(std::move(n));
}

Tensor iota(std::vector<int64_t> shape, int axis, DType dtype) {
  NodePtr n = make(GraphOp::kIota, {});
  n->axis = axis;
  n->attr_dtype = dtype;
  return record(std::move(n), shape);
}

Tensor softmax(const Tensor& x, int axis) {
  NodePtr n = unary_node(GraphOp::kSoftmax, x);
  n->axis = axis;
  return record(std::move(n));
}

Tensor log_softmax(const Tensor& x, int axis) {
  NodePtr n = unary_node(GraphOp::kLogSoftmax, x);
  n->axis = axis;
  return record(std::move(n));
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                  int num_axes) {
  if (bias.defined() && !weight.defined()) {
    return Tensor::error(invalid_argument("lazy layer_norm: bias without weight"));
  }
  std::vector<NodePtr> ins = {x.node()};
  if (weight.defined()) ins.push_back(weight.node());
  if (bias.defined()) ins.push_back(bias.node());
  NodePtr n = make(GraphOp::kLayerNorm, std::move(ins));
  n->axis = num_axes;
  n->value = eps;
  return record(std::move(n));
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps, int num_axes) {
  std::vector<NodePtr> ins = {x.node()};
  if (weight.defined()) ins.push_back(weight.node());
  NodePtr n = make(GraphOp::kRmsNorm, std::move(ins));
  n->axis = num_axes;
  n->value = eps;
  return record(std::move(n));
}

Tensor gelu(const Tensor& x, bool tanh_approximation) {
  NodePtr n = unary_node(GraphOp::kGelu, x);
  n->flag = tanh_approximation;
  return record(std::move(n));
}

Tensor silu(const Tensor& x) {
  return record(unary_node(GraphOp::kSilu, x));
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  return record(make(GraphOp::kSwiglu, {gate.node(), up.node()}));
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  std::vector<NodePtr> ins = {x.node(), weight.node()};
  if (bias.defined()) ins.push_back(bias.node());
  return record(make(GraphOp::kLinear, std::move(ins)));
}

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  return record(make(GraphOp::kEmbedding, {weight.node(), ids.node()}));
}

namespace {

Tensor moments(GraphOp op, const Tensor& x, std::vector<int> axes, double correction,
               bool keepdims) {
  NodePtr n = unary_node(op, x);
  n->ints.assign(axes.begin(), axes.end());
  n->value = correction;
  n->flag = keepdims;
  return record(std::move(n));
}

}  // namespace

Tensor variance(const Tensor& x, std::vector<int> axes, double correction, bool keepdims) {
  return moments(GraphOp::kVariance, x, std::move(axes), correction, keepdims);
}

Tensor std_dev(const Tensor& x, std::vector<int> axes, double correction, bool keepdims) {
  return moments(GraphOp::kStd, x, std::move(axes), correction, keepdims);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target) {
  return record(make(GraphOp::kCrossEntropy, {logits.node(), target.node()}));
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                 double scale) {
  std::vector<NodePtr> ins = {q.node(), k.node(), v.node()};
  if (mask.defined()) ins.push_back(mask.node());
  NodePtr n = make(GraphOp::kAttention, std::move(ins));
  n->flag = causal;
  n->value = scale;
  return record(std::move(n));
}

Tensor clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi) {
  NodePtr n = unary_node(GraphOp::kClamp, x);
  n->ints = {lo ? 1 : 0, hi ? 1 : 0};
  n->value = lo.value_or(0);
  n->value2 = hi.value_or(0);
  return record(std::move(n));
}

}  // namespace dvm::lazy
