// Lowering: one fused group -> one kernel-builder Kernel. Every distinct symbolic dim
// expression among the kernel's input shapes becomes a kernel symbol (bound from those shapes
// at run time); symbolic scalars (variance's N - correction) become run-time params.
#include "fuser/lower.h"

#include <map>

namespace dvm::fuser {

namespace {

using graph::Node;

// Built with += (GCC 12 warns falsely about "literal" + std::string temporaries).
std::string value_name(int id, char prefix = 'v') {
  std::string s(1, prefix);
  s += std::to_string(id);
  return s;
}

class Lowerer {
 public:
  Lowerer(const GraphDef& g, const FusionPlan& plan, int group)
      : g_(g), plan_(plan), group_(group), kb_(g.name + "_k" + std::to_string(group)) {}
  StatusOr<LoweredKernel> run(int* bad_view);

 private:
  const Node& node(int id) const { return g_.nodes[id]; }
  Dim load_dim(const SymExpr& e);
  std::vector<Dim> load_dims(const SymShape& s);
  bool target_dims(const SymShape& s, bool allow_infer, std::vector<Dim>* out);
  Value value_of(int id);
  // Asks lower_all to fill broadcast scalar `id` in memory and fuse again (the kernel names
  // none of its dims): an in-kernel view it cannot lower, as *bad_view.
  Status fill_in_memory(int id, int* bad_view) {
    *bad_view = id;
    return unimplemented(g_.name + ": " + graph::node_str(g_, id) +
                         ": no input of the kernel names its dims; filled in memory instead");
  }
  Value load(int id, bool through_self);
  Status lower(int id, int* bad_view);

  const GraphDef& g_;
  const FusionPlan& plan_;
  int group_;
  KernelBuilder kb_;
  std::map<SymExpr, Dim> dims_;
  std::map<int, Value> vals_;
  int unspelled_ = -1;  // the first broadcast scalar whose shape the kernel cannot spell out
  LoweredKernel out_;
};

Dim Lowerer::load_dim(const SymExpr& e) {
  if (e.is_constant()) return Dim(e.constant_value());
  auto it = dims_.find(e);
  if (it != dims_.end()) return it->second;
  Dim d = kb_.symbol(e.to_string());
  dims_.emplace(e, d);
  return d;
}

std::vector<Dim> Lowerer::load_dims(const SymShape& s) {
  std::vector<Dim> out;
  for (const SymExpr& e : s) out.push_back(load_dim(e));
  return out;
}

// Dims of an in-kernel reshape/broadcast target: constants and dims some input provides; a
// reshape may infer one more (-1).
bool Lowerer::target_dims(const SymShape& s, bool allow_infer, std::vector<Dim>* out) {
  bool inferred = false;
  for (const SymExpr& e : s) {
    if (e.is_constant()) {
      out->push_back(Dim(e.constant_value()));
      continue;
    }
    auto it = dims_.find(e);
    if (it != dims_.end()) {
      out->push_back(it->second);
    } else if (allow_infer && !inferred) {
      out->push_back(Dim(-1));
      inferred = true;
    } else {
      return false;
    }
  }
  return true;
}

Value Lowerer::load(int id, bool through_self) {
  Value v = kb_.load(value_name(id), node(id).dtype, load_dims(node(id).shape));
  out_.loads.push_back(LoadSpec{id, through_self});
  return v;
}

Value Lowerer::value_of(int id) {
  auto it = vals_.find(id);
  if (it != vals_.end()) return it->second;
  const Node& n = node(id);
  Value v;
  if (plan_.role[id] == Role::kScalar) {
    int root = id;
    while (node(root).op != GraphOp::kConstant) root = node(root).inputs[0];
    const Node& c = node(root);
    if (!c.sym.empty()) {
      v = kb_.param(value_name(static_cast<int>(out_.params.size()), 'p'), c.dtype);
      out_.params.push_back(c.sym[0]);
    } else {
      v = kb_.constant(c.value, c.dtype);
    }
    // A broadcast scalar: spell out its shape when the kernel knows the dims; otherwise the
    // consumer's own broadcasting gives the shape (checked against the graph at run time), or,
    // where nothing else in the kernel has those dims (a sum of the broadcast value, a store
    // of values computed from scalars alone), run() has the broadcast filled in memory.
    std::vector<Dim> dims;
    if (root != id && !n.shape.empty()) {
      if (target_dims(n.shape, false, &dims)) {
        v = kb_.broadcast(v, dims);
      } else if (unspelled_ < 0) {
        unspelled_ = id;
      }
    }
  } else {
    v = load(id, false);
  }
  vals_[id] = v;
  return v;
}

Status Lowerer::lower(int id, int* bad_view) {
  const Node& n = node(id);
  auto arg = [&](size_t i) { return value_of(n.inputs[i]); };
  Value v;
  switch (n.op) {
    case GraphOp::kUnary:
      v = kb_.unary(static_cast<UnaryOp>(n.sub), arg(0));
      break;
    case GraphOp::kBinary:
      v = kb_.binary(static_cast<BinaryOp>(n.sub), arg(0), arg(1));
      break;
    case GraphOp::kSelect:
      v = kb_.select(arg(0), arg(1), arg(2));
      break;
    case GraphOp::kCast:
      v = kb_.cast(arg(0), n.dtype);
      break;
    case GraphOp::kConstant:
      v = kb_.constant(n.value, n.dtype);
      break;
    case GraphOp::kReduce:
      if (plan_.role[n.inputs[0]] == Role::kScalar) {
        std::vector<Dim> dims;
        if (!target_dims(node(n.inputs[0]).shape, false, &dims)) {
          return fill_in_memory(n.inputs[0], bad_view);
        }
      }
      v = kb_.reduce(static_cast<ReduceOp>(n.sub), arg(0),
                     std::vector<int>(n.ints.begin(), n.ints.end()), n.flag);
      break;
    case GraphOp::kMatMul:
      v = kb_.matmul(arg(0), arg(1), n.ints[0] != 0, n.ints[1] != 0);
      break;
    case GraphOp::kConcat: {
      // A concat does not broadcast its parts: a broadcast scalar part (a padding fill) whose
      // shape the kernel cannot spell out is filled in memory.
      for (int in : n.inputs) {
        std::vector<Dim> dims;
        if (plan_.role[in] == Role::kScalar && !node(in).shape.empty() &&
            !target_dims(node(in).shape, false, &dims))
          return fill_in_memory(in, bad_view);
      }
      std::vector<Value> xs;
      for (size_t i = 0; i < n.inputs.size(); ++i) xs.push_back(arg(i));
      v = kb_.concat(xs, n.axis);
      break;
    }
    case GraphOp::kReshape:
    case GraphOp::kBroadcast:
    case GraphOp::kPermute:
    case GraphOp::kSlice: {
      if (plan_.role[id] != Role::kInKernelView) {
        v = load(id, true);  // a copy kernel: the executable resolves the view
        break;
      }
      std::vector<Dim> dims;
      bool reshape = n.op == GraphOp::kReshape;
      if (!target_dims(n.shape, reshape, &dims)) {
        *bad_view = id;
        return unimplemented(g_.name + ": in-kernel " + graph_op_name(n.op) + " to " +
                             to_string(n.shape) + ": a dim is not known inside the kernel");
      }
      v = reshape ? kb_.reshape(arg(0), dims) : kb_.broadcast(arg(0), dims);
      break;
    }
    default:
      return internal_error(g_.name + ": cannot lower " + graph::node_str(g_, id));
  }
  vals_[id] = v;
  return Status::ok();
}

StatusOr<LoweredKernel> Lowerer::run(int* bad_view) {
  const Group& grp = plan_.groups[group_];
  // Declare every input first, so in-kernel views can name any dim an input provides.
  for (int id : grp.nodes) {
    bool copy_view = plan_.role[id] == Role::kCompute &&
                     (node(id).op == GraphOp::kReshape || node(id).op == GraphOp::kBroadcast ||
                      node(id).op == GraphOp::kPermute || node(id).op == GraphOp::kSlice);
    if (copy_view) continue;
    for (int i : node(id).inputs) {
      if (plan_.group_of[i] != group_ && plan_.role[i] != Role::kScalar) value_of(i);
    }
  }
  for (int id : grp.nodes) DVM_RETURN_IF_ERROR(lower(id, bad_view));
  for (int id : grp.stores) {
    std::vector<Dim> dims;
    if (unspelled_ >= 0 && !target_dims(node(id).shape, false, &dims)) {
      return fill_in_memory(unspelled_, bad_view);
    }
  }
  for (int id : grp.stores) {
    kb_.store(value_name(id), vals_.at(id), node(id).dtype);
    out_.stores.push_back(id);
  }
  DVM_ASSIGN_OR_RETURN(out_.kernel, kb_.build());
  return std::move(out_);
}

}  // namespace

StatusOr<LoweredKernel> lower_group(const GraphDef& g, const FusionPlan& plan, int group,
                                    int* bad_view) {
  Lowerer l(g, plan, group);
  return l.run(bad_view);
}

}  // namespace dvm::fuser
