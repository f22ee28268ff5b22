// The fuser's grouping: greedy in topological order, each compute op joins the kernel of one
// of its producers when the join is provably legal for every binding and pays; otherwise it
// starts a kernel and the reason is recorded.
//
// The cost rules (what is refused, and why):
//   - a matmul always starts a kernel: its operands come from memory (prologue fusion would
//     re-run the producer per output tile);
//   - iteration domains must be symbolically equal, or the joining op's domain the kernel's
//     with size-1 dims (row statistics such as a softmax's max); anything else would need a
//     workspace round trip inside the kernel;
//   - all reductions of a kernel reduce the same axes (different axes would spill the
//     intermediate through a workspace); after a matmul only row-wise reductions;
//   - permutes, slices and element-count-changing reshapes of a computed value are not done
//     in-kernel: the value is stored and the consumer reads it as a strided view;
//   - a join that would make the kernel graph cyclic is refused.
#include <algorithm>
#include <functional>
#include <sstream>

#include "fuser/fusion.h"

namespace dvm::fuser {

namespace {

using graph::Node;

// Widest constant row a row-wise reduction may share a matmul tile with (measured: layernorm
// after a 768-wide projection ran 0.8x the separate kernels).
constexpr int64_t kMaxFusedRow = 256;

bool is_view_op(GraphOp op) {
  return op == GraphOp::kReshape || op == GraphOp::kPermute || op == GraphOp::kSlice ||
         op == GraphOp::kBroadcast;
}

SymShape drop_ones(const SymShape& s) {
  SymShape out;
  for (const SymExpr& d : s)
    if (!(d.is_constant() && d.constant_value() == 1)) out.push_back(d);
  return out;
}

bool is_one(const SymExpr& d) {
  return d.is_constant() && d.constant_value() == 1;
}

// True when `to` is `from` with each dim split into consecutive dims (size-1 dims may appear
// or vanish anywhere): such a reshape is a strided view of any layout.
bool splits_only(const SymShape& from, const SymShape& to) {
  SymShape a = drop_ones(from), b = drop_ones(to);
  size_t j = 0;
  for (const SymExpr& d : a) {
    SymExpr prod(1);
    while (j < b.size() && !(prod == d)) prod = prod * b[j++];
    if (!(prod == d)) return false;
  }
  return j == b.size();
}

class Fuser {
 public:
  Fuser(const GraphDef& g, const FuseOptions& opt) : g_(g), opt_(opt) {}
  FusionPlan run();

 private:
  const Node& node(int id) const { return g_.nodes[id]; }
  void classify();
  void assign(int c);
  bool cheap_in_kernel(int view) const;
  // Group that `input` of a consumer can be fused with, and the views that would move in.
  int producer_group(int input, std::vector<int>* views) const;
  bool join_ok(int c, int p, std::string* why);
  void join(int c, int p, const std::vector<int>& views);
  bool has_matmul(const Group& grp) const;
  bool merge_ok(int q, int p) const;
  void try_merge(int q, int p, int via);
  int new_group(int c, const std::string& why);
  std::vector<int> input_groups(int c) const;
  void add_deps(int group, int c);
  void compute_stores();
  void order_groups();
  SymShape domain_of(int c) const {
    const Node& n = node(c);
    return n.op == GraphOp::kReduce ? node(n.inputs[0]).shape : n.shape;
  }

  const GraphDef& g_;
  const FuseOptions& opt_;
  FusionPlan plan_;
  std::vector<std::set<int>> deps_;  // transitive: groups a group reads from
};

void Fuser::classify() {
  size_t n = g_.nodes.size();
  plan_.role.assign(n, Role::kCompute);
  plan_.group_of.assign(n, -1);
  std::vector<char> is_output(n, 0);
  for (int o : g_.outputs) is_output[o] = 1;
  std::vector<int> uses(n, 0);
  std::vector<char> native_operand(n, 0);  // read by a native op (a gather, cumsum)
  for (const Node& nd : g_.nodes) {
    for (int in : nd.inputs) {
      ++uses[in];
      if (graph::op_class(nd.op) == graph::OpClass::kNative) native_operand[in] = 1;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const Node& nd = g_.nodes[i];
    if (nd.op == GraphOp::kInput) {
      plan_.role[i] = Role::kInput;
    } else if (nd.op == GraphOp::kConstant) {
      plan_.role[i] = is_output[i] ? Role::kCompute : Role::kScalar;
    } else if (is_view_op(nd.op) && !is_output[i]) {
      // A view of a scalar (expand(constant), torch.full) is a scalar everywhere: inlined into
      // its consumers' kernels like the constant itself; filled in memory (a native fill) for
      // a kernel whose inputs name none of its dims (lower.cc reports it: a sum or a store of
      // the broadcast value needs them) and for native ops, which read their operands there.
      if (plan_.role[nd.inputs[0]] != Role::kScalar) {
        plan_.role[i] = Role::kView;
      } else {
        const bool in_memory = opt_.no_in_kernel_views.count(static_cast<int>(i)) ||
                               (native_operand[i] && !nd.shape.empty());
        plan_.role[i] = in_memory ? Role::kCompute : Role::kScalar;
      }
    } else if (nd.op == GraphOp::kReshape && is_output[i] && uses[i] == 0 &&
               plan_.role[nd.inputs[0]] == Role::kCompute && !is_output[nd.inputs[0]]) {
      // An output that reshapes a computed value (nn.Linear on a [B, S, K] input returns its
      // 2-D matmul reshaped; a language model's logits): a view, and the kernel computing the
      // value writes it straight into the output's memory (the executable aliases them),
      // instead of a copy kernel. Only for an output nothing else reads: a view read inside a
      // kernel becomes part of that kernel (an in-kernel view), not a stored value.
      plan_.role[i] = Role::kView;
    } else if (nd.op == GraphOp::kReshape && is_output[i] && uses[i] == 0 &&
               plan_.role[nd.inputs[0]] == Role::kView && !is_output[nd.inputs[0]] &&
               !splits_only(node(nd.inputs[0]).shape, nd.shape) &&
               node(nd.inputs[0]).op != GraphOp::kReshape) {
      // An output that merges the dims of a permuted, sliced or broadcast view (attention's
      // [B, H, S, D] -> [B, S, H * D] as a partition's output): no strides express it, so the
      // view is laid out by a copy kernel, straight into the output's memory (this reshape
      // aliases it, as above). Once the output was a copy kernel of the reshape itself,
      // which had no strided view of its operand to copy from (an internal error at run time,
      // and the partition ran in PyTorch).
      plan_.role[nd.inputs[0]] = Role::kCompute;
      plan_.role[i] = Role::kView;
    }
    // A reshape of a permuted, sliced or broadcast view is not a strided view in general
    // (merging dims needs them contiguous): materialise the view it reads (a copy kernel) so
    // the reshape applies to contiguous data. Reshapes that only split dims are always views.
    if (nd.op == GraphOp::kReshape && plan_.role[i] == Role::kView &&
        !splits_only(node(nd.inputs[0]).shape, nd.shape)) {
      int src = nd.inputs[0];
      for (int v = src; plan_.role[v] == Role::kView; v = node(v).inputs[0]) {
        if (node(v).op != GraphOp::kReshape) {
          plan_.role[src] = Role::kCompute;
          break;
        }
      }
    }
  }
}

bool Fuser::cheap_in_kernel(int v) const {
  const Node& n = node(v);
  if (opt_.no_in_kernel_views.count(v)) return false;
  if (n.op == GraphOp::kBroadcast) return true;
  return n.op == GraphOp::kReshape && drop_ones(n.shape) == drop_ones(node(n.inputs[0]).shape);
}

int Fuser::producer_group(int input, std::vector<int>* views) const {
  int v = input;
  while (plan_.role[v] == Role::kView) {
    if (!cheap_in_kernel(v)) return -1;
    views->push_back(v);
    v = node(v).inputs[0];
  }
  if (plan_.role[v] != Role::kCompute) return -1;
  std::reverse(views->begin(), views->end());
  return plan_.group_of[v];
}

std::vector<int> Fuser::input_groups(int c) const {
  std::vector<int> out;
  for (int i : node(c).inputs) {
    int r = storage_root(g_, plan_, i);
    if (plan_.role[r] == Role::kCompute && plan_.group_of[r] >= 0) out.push_back(plan_.group_of[r]);
  }
  return out;
}

bool Fuser::join_ok(int c, int p, std::string* why) {
  const Group& grp = plan_.groups[p];
  const Node& n = node(c);
  if (grp.kind == KernelKind::kNative || grp.kind == KernelKind::kCopy) {
    *why = "its producer runs in a native or copy kernel";
    return false;
  }
  if (static_cast<int>(grp.nodes.size()) >= opt_.max_ops_per_kernel) {
    *why = "the producer's kernel reached the op limit";
    return false;
  }
  SymShape d = domain_of(c);
  bool matmul_group = grp.kind == KernelKind::kCube || grp.kind == KernelKind::kMix;
  // Domains that differ only by size-1 dims (a matmul on [s, N] feeding ops on [1, s, N], as
  // torch's linear over a 3-d input produces) are the same iteration space.
  bool same_rank = d.size() == grp.domain.size();
  bool equal = d == grp.domain || (!same_rank && drop_ones(d) == drop_ones(grp.domain));
  if (!same_rank && equal && (n.op == GraphOp::kReduce || grp.has_reduce)) {
    *why = "a reduction over a domain of another rank than the kernel's";
    return false;
  }
  bool subset = d.size() == grp.domain.size();
  for (size_t i = 0; subset && i < d.size(); ++i)
    if (!(d[i] == grp.domain[i]) && !is_one(d[i])) subset = false;
  bool superset = d.size() == grp.domain.size() && !grp.has_reduce && !matmul_group;
  for (size_t i = 0; superset && i < d.size(); ++i)
    if (!(d[i] == grp.domain[i]) && !is_one(grp.domain[i])) superset = false;
  if (!equal && !subset && !superset) {
    *why = "its domain " + to_string(d) + " differs from the kernel's " + to_string(grp.domain);
    return false;
  }
  if (n.op == GraphOp::kReduce) {
    if (!equal) {
      *why = "a reduction over a broadcast subset of the kernel's domain";
      return false;
    }
    if (grp.has_reduce && grp.reduce_axes != n.ints) {
      *why = "it reduces other axes than the kernel's reductions (would spill)";
      return false;
    }
    if (matmul_group && (n.ints.size() != 1 || n.ints[0] != static_cast<int64_t>(d.size()) - 1)) {
      *why = "only row-wise reductions fuse after a matmul";
      return false;
    }
    if (matmul_group && d.back().is_constant() && d.back().constant_value() > kMaxFusedRow) {
      *why =
          "a row-wise reduction over a wide row runs faster as its own vector kernel than in "
          "the matmul's tile (whole rows per tile cost the GEMM its blocking)";
      return false;
    }
  }
  for (int i : n.inputs) {
    std::vector<int> views;
    int r = storage_root(g_, plan_, i);
    bool from_p = plan_.role[r] == Role::kCompute && plan_.group_of[r] == p;
    if (from_p && producer_group(i, &views) != p) {
      *why = "it reads a permuted or sliced view of a value computed in that kernel";
      return false;
    }
  }
  for (int q : input_groups(c)) {
    if (q != p && deps_[q].count(p)) {
      *why = "joining would make the kernel graph cyclic";
      return false;
    }
  }
  return true;
}

void Fuser::add_deps(int group, int c) {
  for (int q : input_groups(c)) {
    if (q == group) continue;
    deps_[group].insert(q);
    deps_[group].insert(deps_[q].begin(), deps_[q].end());
  }
}

void Fuser::join(int c, int p, const std::vector<int>& views) {
  Group& grp = plan_.groups[p];
  // Every operand of c that reads a value of p through views reads it inside the kernel, not
  // only the candidate's: in select(reshape(m), reshape(a), reshape(b)) of three values of p,
  // a view left outside would read from memory a value the kernel never stores.
  std::vector<int> all = views;
  for (int i : node(c).inputs) {
    std::vector<int> more;
    if (producer_group(i, &more) == p) all.insert(all.end(), more.begin(), more.end());
  }
  for (int v : all) {
    if (plan_.group_of[v] == p) continue;
    plan_.role[v] = Role::kInKernelView;
    plan_.group_of[v] = p;
    grp.nodes.push_back(v);
  }
  SymShape d = domain_of(c);
  if (d.size() == grp.domain.size() && !(d == grp.domain)) {
    bool grows = true;
    for (size_t i = 0; i < d.size(); ++i)
      if (is_one(d[i]) && !is_one(grp.domain[i])) grows = false;
    if (grows) grp.domain = d;
  }
  if (node(c).op == GraphOp::kReduce) {
    grp.has_reduce = true;
    grp.reduce_axes = node(c).ints;
  }
  if (grp.kind == KernelKind::kCube) grp.kind = KernelKind::kMix;
  if (grp.kind == KernelKind::kCopy) grp.kind = KernelKind::kVector;
  grp.nodes.push_back(c);
  plan_.group_of[c] = p;
  add_deps(p, c);
}

int Fuser::new_group(int c, const std::string& why) {
  const Node& n = node(c);
  Group grp;
  bool fill =
      n.op == GraphOp::kConstant || (is_view_op(n.op) && plan_.role[n.inputs[0]] == Role::kScalar);
  grp.kind = n.op == GraphOp::kMatMul                                   ? KernelKind::kCube
             : fill || graph::op_class(n.op) == graph::OpClass::kNative ? KernelKind::kNative
             : is_view_op(n.op) || n.op == GraphOp::kConstant           ? KernelKind::kCopy
                                                                        : KernelKind::kVector;
  grp.domain = domain_of(c);
  if (n.op == GraphOp::kReduce) {
    grp.has_reduce = true;
    grp.reduce_axes = n.ints;
  }
  grp.nodes.push_back(c);
  std::string note = "%";
  note += std::to_string(c);
  note += ' ';
  note += graph_op_name(n.op);
  note += " starts a kernel: ";
  note += why;
  grp.notes.push_back(std::move(note));
  plan_.groups.push_back(std::move(grp));
  deps_.emplace_back();
  int id = static_cast<int>(plan_.groups.size()) - 1;
  plan_.group_of[c] = id;
  add_deps(id, c);
  return id;
}

void Fuser::assign(int c) {
  const Node& n = node(c);
  if (!opt_.enable) {
    new_group(c, "fusion disabled");
    return;
  }
  if (n.op == GraphOp::kMatMul) {
    new_group(c, "a matmul reads its operands from memory");
    return;
  }
  if (graph::op_class(n.op) == graph::OpClass::kNative) {
    new_group(c, "data-dependent addressing runs natively");
    return;
  }
  if (n.op == GraphOp::kConstant ||
      (is_view_op(n.op) && plan_.role[n.inputs[0]] == Role::kScalar)) {
    new_group(c, "an output filled with a constant (a native fill)");
    return;
  }
  if (n.op == GraphOp::kConcat || is_view_op(n.op)) {
    new_group(c, n.op == GraphOp::kConcat ? "concat assembles its inputs from memory"
                                          : "a view that must be materialised");
    return;
  }
  // Candidate producers, most recent kernel first.
  std::vector<std::pair<int, std::vector<int>>> cands;
  for (int i : n.inputs) {
    std::vector<int> views;
    int p = producer_group(i, &views);
    if (p >= 0) cands.emplace_back(p, std::move(views));
  }
  std::stable_sort(cands.begin(), cands.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string why = "no producer is computed in a kernel";
  for (const auto& [p, views] : cands) {
    std::string reason;
    if (join_ok(c, p, &reason)) {
      join(c, p, views);
      // The other producers' kernels may now merge into this one (c reads them all):
      // (x*2 + b) * (x - 1) is one kernel, not two with x - 1 stored in between.
      for (const auto& other : cands) {
        if (other.first != p) try_merge(other.first, p, c);
      }
      return;
    }
    why = "not fused with kernel " + std::to_string(p) + ": " + reason;
  }
  new_group(c, why);
}

bool Fuser::has_matmul(const Group& grp) const {
  return grp.kind == KernelKind::kCube || grp.kind == KernelKind::kMix;
}

// Merging q into p is legal when both are vector/mix kernels over the same domain with
// compatible reductions, at most one has a matmul (then the other has no reduction), neither
// reads the other's values through a permute or slice, and no third kernel sits on a path
// between them (the merged kernel would both feed and read it).
bool Fuser::merge_ok(int q, int p) const {
  const Group& a = plan_.groups[p];
  const Group& b = plan_.groups[q];
  auto vm_kind = [](KernelKind k) { return k != KernelKind::kNative && k != KernelKind::kCopy; };
  if (b.nodes.empty() || !vm_kind(a.kind) || !vm_kind(b.kind)) return false;
  if (!(a.domain == b.domain)) return false;
  if (a.nodes.size() + b.nodes.size() > static_cast<size_t>(opt_.max_ops_per_kernel)) return false;
  if (has_matmul(a) && has_matmul(b)) return false;
  if ((has_matmul(a) && b.has_reduce) || (has_matmul(b) && a.has_reduce)) return false;
  if (a.has_reduce && b.has_reduce && a.reduce_axes != b.reduce_axes) return false;
  for (size_t r = 0; r < plan_.groups.size(); ++r) {
    if (static_cast<int>(r) == p || static_cast<int>(r) == q) continue;
    bool p_r_q = deps_[r].count(p) && deps_[q].count(static_cast<int>(r));
    bool q_r_p = deps_[r].count(q) && deps_[p].count(static_cast<int>(r));
    if (p_r_q || q_r_p) return false;
  }
  for (int side : {p, q}) {
    int other = side == p ? q : p;
    for (int id : plan_.groups[side].nodes) {
      for (int i : node(id).inputs) {
        int root = storage_root(g_, plan_, i);
        if (plan_.role[root] != Role::kCompute || plan_.group_of[root] != other) continue;
        std::vector<int> views;
        if (producer_group(i, &views) != other) return false;
      }
    }
  }
  return true;
}

void Fuser::try_merge(int q, int p, int via) {
  if (q == p || !merge_ok(q, p)) return;
  Group& a = plan_.groups[p];
  Group& b = plan_.groups[q];
  for (int id : b.nodes) plan_.group_of[id] = p;
  a.nodes.insert(a.nodes.end(), b.nodes.begin(), b.nodes.end());
  // Views between the two halves become in-kernel views of the merged kernel.
  std::vector<int> extra;
  for (int id : a.nodes) {
    for (int i : node(id).inputs) {
      std::vector<int> views;
      if (producer_group(i, &views) != p) continue;
      for (int v : views) {
        if (plan_.group_of[v] == p) continue;
        plan_.role[v] = Role::kInKernelView;
        plan_.group_of[v] = p;
        extra.push_back(v);
      }
    }
  }
  a.nodes.insert(a.nodes.end(), extra.begin(), extra.end());
  std::sort(a.nodes.begin(), a.nodes.end());  // node ids are topological
  a.nodes.erase(std::unique(a.nodes.begin(), a.nodes.end()), a.nodes.end());
  if (b.has_reduce) {
    a.has_reduce = true;
    a.reduce_axes = b.reduce_axes;
  }
  if (has_matmul(b) || (has_matmul(a) && a.kind == KernelKind::kCube)) a.kind = KernelKind::kMix;
  std::string note = "merged with kernel ";
  note += std::to_string(q);
  note += " through %";
  note += std::to_string(via);
  a.notes.push_back(std::move(note));
  for (std::string& n : b.notes) a.notes.push_back(std::move(n));
  b.nodes.clear();
  b.notes.clear();
  b.stores.clear();
  // Dependencies: whatever read q now reads p (and everything p reads).
  deps_[p].insert(deps_[q].begin(), deps_[q].end());
  deps_[p].erase(p);
  deps_[p].erase(q);
  deps_[q].clear();
  for (size_t r = 0; r < deps_.size(); ++r) {
    if (static_cast<int>(r) == p || !(deps_[r].count(q) || deps_[r].count(p))) continue;
    deps_[r].erase(q);
    deps_[r].insert(p);
    deps_[r].insert(deps_[p].begin(), deps_[p].end());
  }
}

void Fuser::compute_stores() {
  std::vector<char> stored(g_.nodes.size(), 0);
  auto mark = [&](int id, int reader_group) {
    int r = storage_root(g_, plan_, id);
    if (plan_.role[r] == Role::kCompute && plan_.group_of[r] != reader_group) stored[r] = 1;
  };
  for (size_t i = 0; i < g_.nodes.size(); ++i) {
    int grp = plan_.group_of[i];
    if (grp < 0) continue;
    for (int in : g_.nodes[i].inputs) {
      if (plan_.group_of[in] != grp) mark(in, grp);
    }
  }
  for (int o : g_.outputs) {
    if (plan_.role[o] == Role::kCompute) stored[o] = 1;
    if (plan_.role[o] == Role::kView) mark(o, -1);  // an output reshaping a computed value
  }
  for (size_t i = 0; i < g_.nodes.size(); ++i) {
    if (stored[i]) plan_.groups[plan_.group_of[i]].stores.push_back(static_cast<int>(i));
  }
}

// Kernels run in a topological order of their data dependencies (a node may have joined a
// kernel created before one it reads from).
void Fuser::order_groups() {
  size_t n = plan_.groups.size();
  std::vector<int> order, state(n, 0);
  std::function<void(int)> visit = [&](int gi) {
    if (state[gi]) return;
    state[gi] = 1;
    for (int d : deps_[gi]) visit(d);
    order.push_back(gi);
  };
  for (size_t i = 0; i < n; ++i) visit(static_cast<int>(i));
  std::vector<int> new_index(n, -1);
  std::vector<Group> groups;
  for (size_t k = 0; k < n; ++k) {
    if (plan_.groups[order[k]].nodes.empty()) continue;  // merged into another kernel
    new_index[order[k]] = static_cast<int>(groups.size());
    groups.push_back(std::move(plan_.groups[order[k]]));
  }
  plan_.groups = std::move(groups);
  for (int& gi : plan_.group_of)
    if (gi >= 0) gi = new_index[gi];
}

FusionPlan Fuser::run() {
  classify();
  for (size_t i = 0; i < g_.nodes.size(); ++i) {
    if (plan_.role[i] == Role::kCompute) assign(static_cast<int>(i));
  }
  compute_stores();
  order_groups();
  return std::move(plan_);
}

}  // namespace

const char* kernel_kind_name(KernelKind k) {
  switch (k) {
    case KernelKind::kVector:
      return "vector";
    case KernelKind::kCube:
      return "cube";
    case KernelKind::kMix:
      return "mix";
    case KernelKind::kNative:
      return "native";
    case KernelKind::kCopy:
      return "copy";
  }
  return "?";
}

int storage_root(const GraphDef& g, const FusionPlan& plan, int id) {
  while (plan.role[id] == Role::kView || plan.role[id] == Role::kInKernelView) {
    id = g.nodes[id].inputs[0];
  }
  return id;
}

FusionPlan fuse(const GraphDef& g, const FuseOptions& options) {
  return Fuser(g, options).run();
}

std::string fusion_report(const GraphDef& g, const FusionPlan& plan) {
  std::ostringstream os;
  os << "fusion of " << g.name << ": " << plan.groups.size() << " kernels\n";
  for (size_t k = 0; k < plan.groups.size(); ++k) {
    const Group& grp = plan.groups[k];
    os << "kernel " << k << " [" << kernel_kind_name(grp.kind) << "] domain "
       << to_string(grp.domain) << "\n";
    for (int id : grp.nodes) os << "    " << graph::node_str(g, id) << "\n";
    os << "  stores:";
    for (int s : grp.stores) os << " %" << s;
    os << "\n";
    for (const std::string& note : grp.notes) os << "  why: " << note << "\n";
  }
  return os.str();
}

}  // namespace dvm::fuser
