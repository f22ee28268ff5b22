// Graph, GraphBuilder and GraphEmitter: recording ops with symbolic shape deduction.
#include <cmath>
#include <cstring>

#include "graph/graph_def.h"

namespace dvm {

namespace {

constexpr const char* kGraphOpNames[] = {
#define DVM_GRAPH_OP(Name, mnemonic, kind) mnemonic,
#include "dvm/graph_ops.def"
};

}  // namespace

const char* graph_op_name(GraphOp op) {
  return kGraphOpNames[static_cast<int>(op)];
}

namespace graph {

namespace {

enum Kind { meta, native, composite };
constexpr Kind kGraphOpKinds[] = {
#define DVM_GRAPH_OP(Name, mnemonic, kind) kind,
#include "dvm/graph_ops.def"
};

bool same_bits(double a, double b) {
  return std::memcmp(&a, &b, sizeof(double)) == 0;
}

}  // namespace

OpClass op_class(GraphOp op) {
  switch (kGraphOpKinds[static_cast<int>(op)]) {
    case meta:
      return OpClass::kMeta;
    case native:
      return OpClass::kNative;
    case composite:
      return OpClass::kComposite;
  }
  return OpClass::kMeta;
}

GraphOp graph_op_from_name(std::string_view mnemonic, bool* found) {
  for (size_t i = 0; i < std::size(kGraphOpNames); ++i) {
    if (mnemonic == kGraphOpNames[i]) {
      *found = true;
      return static_cast<GraphOp>(i);
    }
  }
  *found = false;
  return GraphOp::kInput;
}

bool Node::operator==(const Node& o) const {
  return op == o.op && inputs == o.inputs && dtype == o.dtype && sub == o.sub && axis == o.axis &&
         flag == o.flag && same_bits(value, o.value) && same_bits(value2, o.value2) &&
         ints == o.ints && sym == o.sym && name == o.name;
}

const Node& GraphEmitter::failed_node() {
  static const Node kFailed;
  return kFailed;
}

int GraphEmitter::emit(Node n) {
  if (!status_.is_ok()) return -1;
  for (int i : n.inputs) {
    if (i < 0) return -1;  // an earlier failure already recorded
  }
  Status s = infer_node(*g_, n);
  if (!s.is_ok()) {
    fail(std::move(s));
    return -1;
  }
  g_->nodes.push_back(std::move(n));
  return static_cast<int>(g_->nodes.size()) - 1;
}

namespace {

Node make(GraphOp op, std::vector<int> inputs) {
  Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  return n;
}

}  // namespace

int GraphEmitter::unary(UnaryOp op, int x) {
  Node n = make(GraphOp::kUnary, {x});
  n.sub = static_cast<int>(op);
  return emit(std::move(n));
}

int GraphEmitter::binary(BinaryOp op, int a, int b) {
  Node n = make(GraphOp::kBinary, {a, b});
  n.sub = static_cast<int>(op);
  return emit(std::move(n));
}

int GraphEmitter::scalar(double v, DType dtype) {
  Node n = make(GraphOp::kConstant, {});
  n.value = v;
  n.dtype = dtype;
  return emit(std::move(n));
}

int GraphEmitter::binary_scalar(BinaryOp op, int a, double v) {
  if (a < 0) return -1;
  DType t = node(a).dtype;
  if (!is_float(t) && (std::floor(v) != v || !std::isfinite(v))) t = DType::kF32;
  return binary(op, a, scalar(v, t));
}

int GraphEmitter::select(int c, int a, int b) {
  return emit(make(GraphOp::kSelect, {c, a, b}));
}

int GraphEmitter::cast(int x, DType t) {
  if (x < 0) return -1;
  if (node(x).dtype == t) return x;
  Node n = make(GraphOp::kCast, {x});
  n.dtype = t;
  return emit(std::move(n));
}

int GraphEmitter::reduce(ReduceOp op, int x, std::vector<int64_t> axes, bool keepdims) {
  Node n = make(GraphOp::kReduce, {x});
  n.sub = static_cast<int>(op);
  n.ints = std::move(axes);
  n.flag = keepdims;
  return emit(std::move(n));
}

int GraphEmitter::matmul(int a, int b, bool ta, bool tb) {
  Node n = make(GraphOp::kMatMul, {a, b});
  n.ints = {ta ? 1 : 0, tb ? 1 : 0};
  return emit(std::move(n));
}

int GraphEmitter::reshape(int x, SymShape shape) {
  Node n = make(GraphOp::kReshape, {x});
  n.sym = std::move(shape);
  return emit(std::move(n));
}

int GraphEmitter::expand(int x, SymShape shape) {
  Node n = make(GraphOp::kBroadcast, {x});
  n.sym = std::move(shape);
  return emit(std::move(n));
}

int GraphEmitter::permute(int x, std::vector<int64_t> perm) {
  Node n = make(GraphOp::kPermute, {x});
  n.ints = std::move(perm);
  return emit(std::move(n));
}

int GraphEmitter::iota(SymShape shape, int axis, DType t) {
  Node n = make(GraphOp::kIota, {});
  n.sym = std::move(shape);
  n.axis = axis;
  n.dtype = t;
  return emit(std::move(n));
}

}  // namespace graph

// ---------------------------------------------------------------------------------------------
// Graph

const std::string& Graph::name() const {
  return def_->name;
}
int Graph::num_inputs() const {
  return static_cast<int>(def_->inputs.size());
}
int Graph::num_outputs() const {
  return static_cast<int>(def_->outputs.size());
}
int Graph::num_nodes() const {
  return static_cast<int>(def_->nodes.size());
}

std::vector<std::string> Graph::input_names() const {
  std::vector<std::string> out;
  for (int id : def_->inputs) out.push_back(def_->nodes[id].name);
  return out;
}
std::vector<DType> Graph::input_dtypes() const {
  std::vector<DType> out;
  for (int id : def_->inputs) out.push_back(def_->nodes[id].dtype);
  return out;
}
std::vector<SymShape> Graph::input_shapes() const {
  std::vector<SymShape> out;
  for (int id : def_->inputs) out.push_back(def_->nodes[id].shape);
  return out;
}
std::vector<std::string> Graph::output_names() const {
  return def_->output_names;
}
std::vector<DType> Graph::output_dtypes() const {
  std::vector<DType> out;
  for (int id : def_->outputs) out.push_back(def_->nodes[id].dtype);
  return out;
}
std::vector<SymShape> Graph::output_shapes() const {
  std::vector<SymShape> out;
  for (int id : def_->outputs) out.push_back(def_->nodes[id].shape);
  return out;
}

// ---------------------------------------------------------------------------------------------
// GraphBuilder

struct GraphBuilder::Impl {
  std::shared_ptr<graph::GraphDef> def = std::make_shared<graph::GraphDef>();
  graph::GraphEmitter em{def.get()};
  bool built = false;

  Tensor emit(graph::Node n) { return Tensor{em.emit(std::move(n))}; }
  Tensor wrap(int id) { return Tensor{id}; }
  bool check(Tensor t, const char* op) {
    if (t.valid() && t.id < static_cast<int>(def->nodes.size())) return true;
    if (em.status().is_ok()) em.fail(invalid_argument(def->name + ": " + op + ": invalid tensor"));
    return false;
  }
};

namespace {

graph::Node make_node(GraphOp op, std::vector<Tensor> inputs) {
  graph::Node n;
  n.op = op;
  for (Tensor t : inputs) n.inputs.push_back(t.id);
  return n;
}

}  // namespace

GraphBuilder::GraphBuilder(std::string name) : impl_(std::make_unique<Impl>()) {
  impl_->def->name = std::move(name);
}
GraphBuilder::~GraphBuilder() = default;

SymExpr GraphBuilder::symbol(const std::string& name, SymRange range) {
  if (Status valid = SymExpr::validate_symbol(name, range); !valid.is_ok()) {
    impl_->em.fail(invalid_argument(impl_->def->name + ": " + valid.message()));
    return SymExpr(1);  // build() reports the error; the placeholder keeps shapes well-formed
  }
  auto it = impl_->def->symbols.find(name);
  if (it != impl_->def->symbols.end() && (it->second.lo != range.lo || it->second.hi != range.hi)) {
    impl_->em.fail(invalid_argument(impl_->def->name + ": symbol " + name +
                                    " declared twice with different ranges"));
  }
  impl_->def->symbols[name] = range;
  return SymExpr::symbol(name, range);
}

Tensor GraphBuilder::input(const std::string& name, DType dtype, SymShape shape) {
  graph::Node n = make_node(GraphOp::kInput, {});
  n.name = name;
  n.dtype = dtype;
  n.shape = std::move(shape);
  for (const SymExpr& d : n.shape) {
    for (const std::string& s : d.symbols()) {
      if (!impl_->def->symbols.count(s)) impl_->def->symbols[s] = SymRange{1, kSymMax};
    }
  }
  Tensor t = impl_->emit(std::move(n));
  if (t.valid()) impl_->def->inputs.push_back(t.id);
  return t;
}

Tensor GraphBuilder::constant(double value, DType dtype) {
  return impl_->wrap(impl_->em.scalar(value, dtype));
}

void GraphBuilder::output(const std::string& name, Tensor t) {
  if (!impl_->check(t, "output")) return;
  impl_->def->outputs.push_back(t.id);
  impl_->def->output_names.push_back(name);
}

Tensor GraphBuilder::unary(UnaryOp op, Tensor x) {
  if (!impl_->check(x, unary_op_name(op))) return {};
  return impl_->wrap(impl_->em.unary(op, x.id));
}

Tensor GraphBuilder::binary(BinaryOp op, Tensor a, Tensor b) {
  if (!impl_->check(a, binary_op_name(op)) || !impl_->check(b, binary_op_name(op))) return {};
  return impl_->wrap(impl_->em.binary(op, a.id, b.id));
}

Tensor GraphBuilder::binary(BinaryOp op, Tensor a, double scalar) {
  if (!impl_->check(a, binary_op_name(op))) return {};
  return impl_->wrap(impl_->em.binary_scalar(op, a.id, scalar));
}

Tensor GraphBuilder::binary(BinaryOp op, double scalar, Tensor b) {
  if (!impl_->check(b, binary_op_name(op))) return {};
  DType t = dtype(b);
  if (!is_float(t) && (std::floor(scalar) != scalar || !std::isfinite(scalar))) t = DType::kF32;
  return impl_->wrap(impl_->em.binary(op, impl_->em.scalar(scalar, t), b.id));
}

Tensor GraphBuilder::select(Tensor cond, Tensor if_true, Tensor if_false) {
  if (!impl_->check(cond, "select") || !impl_->check(if_true, "select") ||
      !impl_->check(if_false, "select"))
    return {};
  return impl_->wrap(impl_->em.select(cond.id, if_true.id, if_false.id));
}

Tensor GraphBuilder::cast(Tensor x, DType dtype) {
  if (!impl_->check(x, "cast")) return {};
  return impl_->wrap(impl_->em.cast(x.id, dtype));
}

Tensor GraphBuilder::expand(Tensor x, SymShape shape) {
  if (!impl_->check(x, "broadcast")) return {};
  return impl_->wrap(impl_->em.expand(x.id, std::move(shape)));
}

Tensor GraphBuilder::reshape(Tensor x, SymShape shape) {
  if (!impl_->check(x, "reshape")) return {};
  return impl_->wrap(impl_->em.reshape(x.id, std::move(shape)));
}

Tensor GraphBuilder::permute(Tensor x, std::vector<int> perm) {
  if (!impl_->check(x, "permute")) return {};
  return impl_->wrap(impl_->em.permute(x.id, std::vector<int64_t>(perm.begin(), perm.end())));
}

Tensor GraphBuilder::transpose(Tensor x, int axis0, int axis1) {
  if (!impl_->check(x, "transpose")) return {};
  int r = rank(x);
  if (axis0 < 0) axis0 += r;
  if (axis1 < 0) axis1 += r;
  if (axis0 < 0 || axis0 >= r || axis1 < 0 || axis1 >= r) {
    impl_->em.fail(invalid_argument(impl_->def->name + ": transpose: axes out of range for " +
                                    graph::shape_str(shape(x))));
    return {};
  }
  std::vector<int> perm(r);
  for (int i = 0; i < r; ++i) perm[i] = i;
  std::swap(perm[axis0], perm[axis1]);
  return permute(x, perm);
}

Tensor GraphBuilder::unsqueeze(Tensor x, int axis) {
  if (!impl_->check(x, "unsqueeze")) return {};
  SymShape s = shape(x);
  int r = static_cast<int>(s.size());
  if (axis < 0) axis += r + 1;
  if (axis < 0 || axis > r) {
    impl_->em.fail(invalid_argument(impl_->def->name + ": unsqueeze: axis out of range for " +
                                    graph::shape_str(s)));
    return {};
  }
  s.insert(s.begin() + axis, SymExpr(1));
  return reshape(x, s);
}

Tensor GraphBuilder::squeeze(Tensor x, int axis) {
  if (!impl_->check(x, "squeeze")) return {};
  SymShape s = shape(x);
  int r = static_cast<int>(s.size());
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r) {
    impl_->em.fail(invalid_argument(impl_->def->name + ": squeeze: axis out of range for " +
                                    graph::shape_str(s)));
    return {};
  }
  if (!(s[axis] == SymExpr(1))) return x;  // torch: squeezing a non-1 dim is a no-op
  s.erase(s.begin() + axis);
  return reshape(x, s);
}

Tensor GraphBuilder::slice(Tensor x, int axis, SymExpr start, SymExpr stop, int64_t step) {
  if (!impl_->check(x, "slice")) return {};
  graph::Node n = make_node(GraphOp::kSlice, {x});
  n.axis = axis;
  n.sym = {std::move(start), std::move(stop)};
  n.ints = {step};
  return impl_->emit(std::move(n));
}

Tensor GraphBuilder::concat(std::vector<Tensor> xs, int axis) {
  for (Tensor t : xs)
    if (!impl_->check(t, "concat")) return {};
  if (xs.size() == 1) return xs[0];
  graph::Node n = make_node(GraphOp::kConcat, xs);
  n.axis = axis;
  return impl_->emit(std::move(n));
}

std::vector<Tensor> GraphBuilder::split(Tensor x, std::vector<SymExpr> sizes, int axis) {
  std::vector<Tensor> out;
  if (!impl_->check(x, "split")) return out;
  SymExpr start(0);
  for (const SymExpr& s : sizes) {
    out.push_back(slice(x, axis, start, start + s, 1));
    start = start + s;
  }
  return out;
}

Tensor GraphBuilder::reduce(ReduceOp op, Tensor x, std::vector<int> axes, bool keepdims) {
  if (!impl_->check(x, reduce_op_name(op))) return {};
  return impl_->wrap(
      impl_->em.reduce(op, x.id, std::vector<int64_t>(axes.begin(), axes.end()), keepdims));
}

Tensor GraphBuilder::matmul(Tensor a, Tensor b, bool transpose_a, bool transpose_b) {
  if (!impl_->check(a, "matmul") || !impl_->check(b, "matmul")) return {};
  return impl_->wrap(impl_->em.matmul(a.id, b.id, transpose_a, transpose_b));
}

Tensor GraphBuilder::index_select(Tensor x, int axis, Tensor index) {
  if (!impl_->check(x, "index_select") || !impl_->check(index, "index_select")) return {};
  graph::Node n = make_node(GraphOp::kIndexSelect, {x, index});
  n.axis = axis;
  return impl_->emit(std::move(n));
}

Tensor GraphBuilder::gather(Tensor x, int axis, Tensor index) {
  if (!impl_->check(x, "gather") || !impl_->check(index, "gather")) return {};
  graph::Node n = make_node(GraphOp::kGather, {x, index});
  n.axis = axis;
  return impl_->emit(std::move(n));
}

Tensor GraphBuilder::cumsum(Tensor x, int axis) {
  if (!impl_->check(x, "cumsum")) return {};
  graph::Node n = make_node(GraphOp::kCumsum, {x});
  n.axis = axis;
  return impl_->emit(std::move(n));
}

Tensor GraphBuilder::iota(SymShape shape, int axis, DType dtype) {
  return impl_->wrap(impl_->em.iota(std::move(shape), axis, dtype));
}

namespace {

graph::Node composite(GraphOp op, std::vector<Tensor> inputs) {
  std::vector<Tensor> present;
  for (Tensor t : inputs)
    if (t.valid()) present.push_back(t);
  return make_node(op, present);
}

}  // namespace

Tensor GraphBuilder::softmax(Tensor x, int axis) {
  if (!impl_->check(x, "softmax")) return {};
  graph::Node n = composite(GraphOp::kSoftmax, {x});
  n.axis = axis;
  return impl_->emit(std::move(n));
}

Tensor GraphBuilder::log_softmax(Tensor x, int axis) {
  if (!impl_->check(x, "log_softmax")) return {};
  graph::Node n = composite(GraphOp::kLogSoftmax, {x});
  n.axis = axis;
  return impl_->emit(std::move(n));
}

Tensor GraphBuilder::layer_norm(Tensor x, Tensor weight, Tensor bias, double eps, int num_axes) {
  if (!impl_->check(x, "layer_norm")) return {};
  if (!weight.valid() && bias.valid()) {
    impl_->em.fail(invalid_argument(impl_->def->name + ": layer_norm: bias without weight"));
    return {};
  }
  graph::Node n = composite(GraphOp::kLayerNorm, {x, weight, bias});
  n.axis = num_axes;
  n.value = eps;
  return impl_->emit(std::move(n));
}

Tensor GraphBuilder::rms_norm(Tensor x, Tensor weight, double eps, int num_axes) {
  if (!impl_->check(x, "rms_norm")) return {};
  graph::Node n = composite(GraphOp::kRmsNorm, {x, weight});
  n.axis = num_axes;
  n.value = eps;
  return impl_->emit(std::move(n));
}

Tensor GraphBuilder::gelu(Tensor x, bool tanh_approximation) {
  if (!impl_->check(x, "gelu")) return {};
  graph::Node n = composite(GraphOp::kGelu, {x});
  n.flag = tanh_approximation;
  return impl_->emit(std::move(n));
}

Tensor GraphBuilder::silu(Tensor x) {
  if (!impl_->check(x, "silu")) return {};
  return impl_->emit(composite(GraphOp::kSilu, {x}));
}

Tensor GraphBuilder::swiglu(Tensor gate, Tensor up) {
  if (!impl_->check(gate, "swiglu") || !impl_->check(up, "swiglu")) return {};
  return impl_->emit(composite(GraphOp::kSwiglu, {gate, up}));
}

Tensor GraphBuilder::linear(Tensor x, Tensor weight, Tensor bias) {
  if (!impl_->check(x, "linear") || !impl_->check(weight, "linear")) return {};
  return impl_->emit(composite(GraphOp::kLinear, {x, weight, bias}));
}

Tensor GraphBuilder::embedding(Tensor weight, Tensor ids) {
  if (!impl_->check(weight, "embedding") || !impl_->check(ids, "embedding")) return {};
  return impl_->emit(composite(GraphOp::kEmbedding, {weight, ids}));
}

Tensor GraphBuilder::variance(Tensor x, std::vector<int> axes, double correction, bool keepdims) {
  if (!impl_->check(x, "variance")) return {};
  graph::Node n = composite(GraphOp::kVariance, {x});
  n.ints.assign(axes.begin(), axes.end());
  n.value = correction;
  n.flag = keepdims;
  return impl_->emit(std::move(n));
}

Tensor GraphBuilder::std_dev(Tensor x, std::vector<int> axes, double correction, bool keepdims) {
  if (!impl_->check(x, "std")) return {};
  graph::Node n = composite(GraphOp::kStd, {x});
  n.ints.assign(axes.begin(), axes.end());
  n.value = correction;
  n.flag = keepdims;
  return impl_->emit(std::move(n));
}

Tensor GraphBuilder::cross_entropy(Tensor logits, Tensor target) {
  if (!impl_->check(logits, "cross_entropy") || !impl_->check(target, "cross_entropy")) return {};
  return impl_->emit(composite(GraphOp::kCrossEntropy, {logits, target}));
}

Tensor GraphBuilder::attention(Tensor q, Tensor k, Tensor v, Tensor mask, bool causal,
                               double scale) {
  if (!impl_->check(q, "attention") || !impl_->check(k, "attention") ||
      !impl_->check(v, "attention"))
    return {};
  graph::Node n = composite(GraphOp::kAttention, {q, k, v, mask});
  n.flag = causal;
  n.value = scale;
  return impl_->emit(std::move(n));
}

Tensor GraphBuilder::clamp(Tensor x, std::optional<double> lo, std::optional<double> hi) {
  if (!impl_->check(x, "clamp")) return {};
  graph::Node n = composite(GraphOp::kClamp, {x});
  n.ints = {lo ? 1 : 0, hi ? 1 : 0};
  n.value = lo.value_or(0);
  n.value2 = hi.value_or(0);
  return impl_->emit(std::move(n));
}

const SymShape& GraphBuilder::shape(Tensor t) const {
  static const SymShape kEmpty;
  if (!t.valid() || t.id >= static_cast<int>(impl_->def->nodes.size())) return kEmpty;
  return impl_->def->nodes[t.id].shape;
}

DType GraphBuilder::dtype(Tensor t) const {
  if (!t.valid() || t.id >= static_cast<int>(impl_->def->nodes.size())) return DType::kF32;
  return impl_->def->nodes[t.id].dtype;
}

int GraphBuilder::rank(Tensor t) const {
  return static_cast<int>(shape(t).size());
}

StatusOr<Graph> GraphBuilder::build() {
  if (impl_->built) return invalid_argument(impl_->def->name + ": build() called twice");
  impl_->built = true;
  DVM_RETURN_IF_ERROR(impl_->em.status());
  if (impl_->def->outputs.empty()) {
    return invalid_argument(impl_->def->name + ": graph has no outputs");
  }
  return Graph(std::move(impl_->def));
}

}  // namespace dvm
