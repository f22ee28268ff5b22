// Binding symbols from input shapes and inferring every node's concrete shape, by the shared
// rules of src/shape/shape_rules.h (the kernel builder checked what it could without values).
#include <algorithm>
#include <sstream>

#include "ir/kernel_def.h"
#include "ops/op_traits.h"
#include "shape/shape_rules.h"

namespace dvm::ir {

namespace {

constexpr int64_t kMaxElements = int64_t{1} << 48;  // keeps every byte offset in int64

std::string shape_str(const CShape& s) {
  return s.to_string();
}

std::string op_prefix(const KernelDef& def, int node) {
  return def.name + ": op %" + std::to_string(node) + " (" + node_label(def, node) + ")";
}

Status check_numel(const KernelDef& def, int node, const CShape& s) {
  int64_t n = 1;
  for (int i = 0; i < s.rank; ++i) {
    if (s.d[i] < 0) return invalid_argument(op_prefix(def, node) + ": negative dim");
    if (s.d[i] != 0 && n > kMaxElements / s.d[i]) {
      return out_of_range(op_prefix(def, node) + ": element count of " + shape_str(s) +
                          " overflows (limit 2^48)");
    }
    n *= s.d[i];
  }
  return Status::ok();
}

Status bind_input(const KernelDef& def, int slot, const TensorArg& t, Binding* b,
                  std::vector<int>* bound_by) {
  const Node& n = def.nodes[def.input_nodes[slot]];
  const std::string& name = def.input_names[slot];
  if (t.shape.size() != n.shape.size()) {
    return invalid_argument(def.name + ": input '" + name + "' has rank " +
                            std::to_string(t.shape.size()) + ", expected rank " +
                            std::to_string(n.shape.size()));
  }
  for (size_t i = 0; i < n.shape.size(); ++i) {
    const Dim& d = n.shape[i];
    int64_t got = t.shape[i];
    if (got < 0) {
      return invalid_argument(def.name + ": input '" + name + "' dim " + std::to_string(i) +
                              " is negative (" + std::to_string(got) + ")");
    }
    if (!d.is_symbol()) {
      if (d.value() != got) {
        return invalid_argument(def.name + ": input '" + name + "' dim " + std::to_string(i) +
                                " is " + std::to_string(got) + ", expected " +
                                std::to_string(d.value()));
      }
      continue;
    }
    int s = d.symbol_id();
    if ((*bound_by)[s] < 0) {
      (*bound_by)[s] = slot;
      b->symbols[s] = got;
    } else if (b->symbols[s] != got) {
      return invalid_argument(def.name + ": symbol " + def.symbols[s] + " = " +
                              std::to_string(b->symbols[s]) + " from input '" +
                              def.input_names[(*bound_by)[s]] + "' but input '" + name + "' dim " +
                              std::to_string(i) + " is " + std::to_string(got));
    }
  }
  return Status::ok();
}

int64_t eval_dim(const Binding& b, const Dim& d) {
  return d.is_symbol() ? b.symbols[d.symbol_id()] : d.value();
}

Status broadcast_into(const KernelDef& def, int node, const CShape& in, CShape* out) {
  const CShape prev = *out;
  int bad = shape::broadcast_dims(prev.dims(), in.dims(), out, shape::Unproven::kFail);
  if (bad < 0) return Status::ok();
  return invalid_argument(op_prefix(def, node) + ": cannot broadcast shapes " + shape_str(prev) +
                          " and " + shape_str(in) + " (dim " + std::to_string(bad) + ")");
}

void eval_dims(const Binding& b, const std::vector<Dim>& dims, CShape* out) {
  out->clear();
  for (const Dim& d : dims) out->push_back(eval_dim(b, d));
}

Status infer_broadcast_to(const KernelDef& def, int node, const Binding& b, CShape* out) {
  const Node& n = def.nodes[node];
  const CShape& in = b.shapes[n.inputs[0]];
  eval_dims(b, n.shape, out);
  if (shape::expand_dims(in.dims(), out->dims(), shape::Unproven::kFail) >= 0) {
    return invalid_argument(op_prefix(def, node) + ": cannot broadcast " + shape_str(in) + " to " +
                            shape_str(*out));
  }
  return Status::ok();
}

Status infer_reshape(const KernelDef& def, int node, const Binding& b, CShape* out) {
  const Node& n = def.nodes[node];
  const CShape& in = b.shapes[n.inputs[0]];
  eval_dims(b, n.shape, out);
  const CShape target = *out;
  int64_t total = in.numel();
  if (shape::resolve_reshape(total, std::span<int64_t>(out->d.data(), out->rank)) ==
      shape::ReshapeError::kNone) {
    return Status::ok();
  }
  return invalid_argument(op_prefix(def, node) + ": cannot reshape " + shape_str(in) + " (" +
                          std::to_string(total) + " elements) to " + shape_str(target));
}

Status infer_concat(const KernelDef& def, int node, const Binding& b, CShape* out) {
  const Node& n = def.nodes[node];
  int axis = static_cast<int>(n.attr[0]);
  const CShape& first = b.shapes[n.inputs[0]];
  int64_t total = 0;
  for (int in : n.inputs) {
    const CShape& s = b.shapes[in];
    if (!shape::concat_fits(first.dims(), s.dims(), axis, shape::Unproven::kFail)) {
      return invalid_argument(op_prefix(def, node) + ": concat inputs " + shape_str(first) +
                              " and " + shape_str(s) + " differ off axis " + std::to_string(axis));
    }
    total += s.d[axis];
  }
  *out = first;
  out->d[axis] = total;
  return Status::ok();
}

Status infer_matmul(const KernelDef& def, int node, const Binding& b, CShape* out) {
  const Node& n = def.nodes[node];
  const CShape& a = b.shapes[n.inputs[0]];
  const CShape& c = b.shapes[n.inputs[1]];
  if (shape::matmul_dims(a.dims(), c.dims(), false, false, out, shape::Unproven::kFail) ==
      shape::MatMulError::kNone) {
    return Status::ok();
  }
  return invalid_argument(op_prefix(def, node) + ": cannot multiply " + shape_str(a) + " x " +
                          shape_str(c));
}

Status infer_reduce(const KernelDef& def, int node, const Binding& b, CShape* out) {
  const Node& n = def.nodes[node];
  const CShape& in = b.shapes[n.inputs[0]];
  if (!ops::reduces_empty(n.reduce_op())) {
    for (int64_t axis : n.attr) {
      if (in.d[axis] != 0) continue;
      return invalid_argument(op_prefix(def, node) + ": " + reduce_op_name(n.reduce_op()) +
                              " over empty axis " + std::to_string(axis) + " of " + shape_str(in));
    }
  }
  shape::reduce_dims(in.dims(), std::span<const int64_t>(n.attr), n.keepdims, out);
  return Status::ok();
}

Status infer_node(const KernelDef& def, int node, const Binding& b, CShape* out) {
  const Node& n = def.nodes[node];
  switch (n.kind) {
    case OpKind::kLoad:
      eval_dims(b, n.shape, out);
      return Status::ok();
    case OpKind::kParam:
    case OpKind::kConst:
      out->rank = 0;
      return Status::ok();
    case OpKind::kUnary:
    case OpKind::kCast:
      *out = b.shapes[n.inputs[0]];
      return Status::ok();
    case OpKind::kBinary:
    case OpKind::kSelect:
      *out = b.shapes[n.inputs[0]];
      for (size_t i = 1; i < n.inputs.size(); ++i) {
        DVM_RETURN_IF_ERROR(broadcast_into(def, node, b.shapes[n.inputs[i]], out));
      }
      return Status::ok();
    case OpKind::kBroadcast:
      return infer_broadcast_to(def, node, b, out);
    case OpKind::kReshape:
      return infer_reshape(def, node, b, out);
    case OpKind::kPermute: {
      const CShape& in = b.shapes[n.inputs[0]];
      out->rank = in.rank;
      for (int i = 0; i < in.rank; ++i) out->d[i] = in.d[n.attr[i]];
      return Status::ok();
    }
    case OpKind::kSlice: {
      *out = b.shapes[n.inputs[0]];
      SliceBounds s = slice_bounds(n, out->d[n.attr[0]]);
      out->d[n.attr[0]] = s.count;
      return Status::ok();
    }
    case OpKind::kConcat:
      return infer_concat(def, node, b, out);
    case OpKind::kMatMul:
      return infer_matmul(def, node, b, out);
    case OpKind::kReduce:
      return infer_reduce(def, node, b, out);
  }
  return internal_error("unknown op kind");
}

}  // namespace

SliceBounds slice_bounds(const Node& n, int64_t len) {
  shape::SliceDims<int64_t> s = shape::slice_dims(len, n.attr[1], n.attr[2], n.attr[3]);
  return SliceBounds{s.start, n.attr[3], s.extent};
}

std::string CShape::to_string() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < rank; ++i) os << (i ? ", " : "") << d[i];
  os << "]";
  return os.str();
}

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::kLoad:
      return "load";
    case OpKind::kParam:
      return "param";
    case OpKind::kConst:
      return "const";
    case OpKind::kUnary:
      return "unary";
    case OpKind::kBinary:
      return "binary";
    case OpKind::kSelect:
      return "select";
    case OpKind::kCast:
      return "cast";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kReshape:
      return "reshape";
    case OpKind::kPermute:
      return "permute";
    case OpKind::kSlice:
      return "slice";
    case OpKind::kConcat:
      return "concat";
    case OpKind::kReduce:
      return "reduce";
    case OpKind::kMatMul:
      return "matmul";
  }
  return "?";
}

std::string node_label(const KernelDef& def, int node) {
  const Node& n = def.nodes[node];
  std::ostringstream os;
  os << "%" << node << " = ";
  switch (n.kind) {
    case OpKind::kUnary:
      os << unary_op_name(n.unary_op());
      break;
    case OpKind::kBinary:
      os << binary_op_name(n.binary_op());
      break;
    case OpKind::kReduce:
      os << reduce_op_name(n.reduce_op());
      break;
    case OpKind::kLoad:
      os << "load '" << def.input_names[n.slot] << "'";
      break;
    case OpKind::kParam:
      os << "param '" << def.param_names[n.slot] << "'";
      break;
    case OpKind::kConst:
      os << "const " << n.fconst;
      break;
    default:
      os << op_kind_name(n.kind);
      break;
  }
  os << "." << dtype_name(n.dtype);
  for (size_t i = 0; i < n.inputs.size(); ++i) os << (i ? ", %" : " %") << n.inputs[i];
  if (!n.attr.empty()) {
    os << " {";
    for (size_t i = 0; i < n.attr.size(); ++i) os << (i ? "," : "") << n.attr[i];
    os << "}";
  }
  if (n.keepdims) os << " keepdims";
  return os.str();
}

Status bind_shapes(const KernelDef& def, std::span<const TensorArg> inputs, Binding* out) {
  if (inputs.size() != def.input_nodes.size()) {
    return invalid_argument(def.name + ": expected " + std::to_string(def.input_nodes.size()) +
                            " inputs, got " + std::to_string(inputs.size()));
  }
  out->symbols.assign(def.symbols.size(), 0);
  std::vector<int> bound_by(def.symbols.size(), -1);
  for (size_t slot = 0; slot < inputs.size(); ++slot) {
    DVM_RETURN_IF_ERROR(bind_input(def, static_cast<int>(slot), inputs[slot], out, &bound_by));
  }
  out->shapes.resize(def.nodes.size());
  for (size_t i = 0; i < def.nodes.size(); ++i) {
    DVM_RETURN_IF_ERROR(infer_node(def, static_cast<int>(i), *out, &out->shapes[i]));
    DVM_RETURN_IF_ERROR(check_numel(def, static_cast<int>(i), out->shapes[i]));
  }
  return Status::ok();
}

void arg_strides(const TensorArg& t, int64_t* strides) {
  int r = static_cast<int>(t.shape.size());
  if (t.strides.size() == t.shape.size()) {
    for (int i = 0; i < r; ++i) strides[i] = t.strides[i];
    return;
  }
  int64_t s = 1;
  for (int i = r - 1; i >= 0; --i) {
    strides[i] = s;
    s *= t.shape[i];
  }
}

bool view_span(const TensorArg& t, int64_t* lo, int64_t* hi) {
  int64_t strides[kMaxRank];
  arg_strides(t, strides);
  *lo = *hi = t.offset;
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (t.shape[i] == 0) return false;
    int64_t ext = (t.shape[i] - 1) * strides[i];
    if (ext < 0) {
      *lo += ext;
    } else {
      *hi += ext;
    }
  }
  return true;
}

namespace {

Status check_view(const KernelDef& def, const std::string& what, const TensorArg& t) {
  if (t.shape.size() > static_cast<size_t>(kMaxRank) ||
      (!t.strides.empty() && t.strides.size() != t.shape.size())) {
    return invalid_argument(def.name + ": " + what + " has " + std::to_string(t.strides.size()) +
                            " strides for rank " + std::to_string(t.shape.size()));
  }
  for (int64_t s : t.strides) {
    if (s > kMaxElements || s < -kMaxElements) {
      return out_of_range(def.name + ": " + what + " stride " + std::to_string(s) + " too large");
    }
  }
  int64_t lo, hi;
  if (!view_span(t, &lo, &hi)) return Status::ok();  // empty view touches nothing
  if (t.data == nullptr) return invalid_argument(def.name + ": " + what + " has null data");
  int64_t storage = t.storage_elems < 0 ? hi + 1 : t.storage_elems;
  if (lo < 0 || hi >= storage) {
    return out_of_range(def.name + ": " + what + " view spans elements [" + std::to_string(lo) +
                        ", " + std::to_string(hi) + "] outside its storage of " +
                        std::to_string(storage) + " elements");
  }
  return Status::ok();
}

}  // namespace

Status check_args(const KernelDef& def, const Binding& b, std::span<const TensorArg> inputs,
                  std::span<const TensorArg> outputs, std::span<const ScalarArg> params) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Node& n = def.nodes[def.input_nodes[i]];
    std::string what = "input '" + def.input_names[i] + "'";
    if (inputs[i].dtype != n.dtype) {
      return invalid_argument(def.name + ": " + what + " has dtype " +
                              std::string(dtype_name(inputs[i].dtype)) + ", expected " +
                              std::string(dtype_name(n.dtype)));
    }
    DVM_RETURN_IF_ERROR(check_view(def, what, inputs[i]));
  }
  if (outputs.size() != def.outputs.size()) {
    return invalid_argument(def.name + ": expected " + std::to_string(def.outputs.size()) +
                            " outputs, got " + std::to_string(outputs.size()));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const OutputDef& o = def.outputs[i];
    const CShape& s = b.shapes[o.node];
    std::string what = "output '" + o.name + "'";
    CShape got;
    got.rank = static_cast<int>(std::min<size_t>(outputs[i].shape.size(), kMaxRank));
    for (int k = 0; k < got.rank; ++k) got.d[k] = outputs[i].shape[k];
    if (!(got == s) || outputs[i].shape.size() != static_cast<size_t>(s.rank)) {
      return invalid_argument(def.name + ": " + what + " has shape " + got.to_string() +
                              ", expected " + s.to_string());
    }
    if (outputs[i].dtype != def.nodes[o.node].dtype) {
      return invalid_argument(def.name + ": " + what + " has dtype " +
                              std::string(dtype_name(outputs[i].dtype)) + ", expected " +
                              std::string(dtype_name(def.nodes[o.node].dtype)));
    }
    DVM_RETURN_IF_ERROR(check_view(def, what, outputs[i]));
  }
  if (params.size() != def.param_names.size()) {
    return invalid_argument(def.name + ": expected " + std::to_string(def.param_names.size()) +
                            " scalar params, got " + std::to_string(params.size()));
  }
  return Status::ok();
}

}  // namespace dvm::ir
