// The flush: a trace becomes one graph with symbolic dims, compiled once per structure (the
// plan cache) and run through the Executable.
//
//   1. live values: pending nodes some Tensor handle refers to (the graph's outputs);
//      needed: what they depend on; everything else is dropped without being computed;
//   2. leaves: ready values the needed nodes read (the graph's inputs, zero-copy);
//   3. dim classes: every leaf dim >= 2, by value; the key encodes the trace with classes in
//      place of values (include/dvm/lazy.h says what it holds);
//   4. plan-cache lookup; a miss builds the graph (specialising classes whose relations the
//      builder cannot prove) and compiles it;
//   5. run into the stored values' memory.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "base/clock.h"
#include "base/env.h"
#include "exec/native_ops.h"
#include "exec/views.h"
#include "lazy/lazy_internal.h"

namespace dvm::lazy {

namespace detail {

namespace {

struct PlanEntry {
  std::vector<int> static_classes;  // specialised to their values below
  std::vector<int64_t> static_values;
  std::shared_ptr<Executable> exe;
};

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

// Process-wide state; never destroyed, so threads may flush during exit.
struct Global {
  std::mutex mu;
  Options options;
  std::atomic<int> max_trace_ops{4096};
  Stats stats;
  std::unordered_map<std::vector<int64_t>, std::vector<PlanEntry>, KeyHash> plans;
  size_t num_plans = 0;
};

Global& global() {
  static Global* g = new Global;
  return *g;
}

// The thread's trace. It is not flushed when the thread ends: the runtime's own thread-local
// scratch (kernel cache keys, VM registers) may already be destroyed by then. Pending nodes
// keep their trace alive, and whichever thread observes one of them flushes it.
struct TraceHolder {
  std::shared_ptr<Trace> trace = std::make_shared<Trace>();
};

// One flush's view of its trace.
struct Plan {
  std::vector<Node*> leaves;  // graph inputs
  std::vector<Node*> ops;     // needed pending nodes, in trace order
  std::vector<Node*> roots;   // stored values, in trace order
  std::unordered_map<const Node*, int> leaf_id;
  std::vector<int> op_id;     // trace index -> local id (leaves first), -1 if not needed
  std::vector<char> is_root;  // trace index -> stored
  std::vector<int64_t> class_values;
  std::vector<int64_t> key;

  int local(const Node* n) const {
    if (n->state.load() == State::kPending) return op_id[n->index];
    return leaf_id.at(n);
  }
  int class_of(int64_t v) const {
    if (v < 2) return -1;
    for (size_t i = 0; i < class_values.size(); ++i)
      if (class_values[i] == v) return static_cast<int>(i);
    return -1;
  }
  void add_class(int64_t v) {
    if (v >= 2 && class_of(v) < 0) class_values.push_back(v);
  }
};

void select_nodes(const std::vector<NodePtr>& nodes, Plan* p) {
  std::vector<char> needed(nodes.size(), 0);
  for (size_t i = nodes.size(); i-- > 0;) {
    Node* n = nodes[i].get();
    if (n->handles.load() > 0) needed[i] = 2;
    if (!needed[i]) continue;
    for (const NodePtr& in : n->inputs) {
      if (in->state.load() == State::kPending) needed[in->index] |= 1;
    }
  }
  p->op_id.assign(nodes.size(), -1);
  p->is_root.assign(nodes.size(), 0);
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!needed[i]) continue;
    Node* n = nodes[i].get();
    for (const NodePtr& in : n->inputs) {
      if (in->state.load() == State::kPending || p->leaf_id.count(in.get())) continue;
      p->leaf_id[in.get()] = static_cast<int>(p->leaves.size());
      p->leaves.push_back(in.get());
    }
    p->ops.push_back(n);
    if (needed[i] & 2) p->roots.push_back(n);
    p->is_root[i] = (needed[i] & 2) != 0;
  }
  int next = static_cast<int>(p->leaves.size());
  for (Node* n : p->ops) p->op_id[n->index] = next++;
}

uint64_t bits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

void encode_value(const Plan& p, int64_t v, std::vector<int64_t>* key) {
  int c = p.class_of(v);
  key->push_back(c >= 0 ? 1 : 0);
  key->push_back(c >= 0 ? c : v);
}

void build_key(Plan* p) {
  for (Node* l : p->leaves)
    for (int64_t d : l->shape) p->add_class(d);
  std::vector<int64_t>& k = p->key;
  k.push_back(static_cast<int64_t>(p->leaves.size()));
  for (Node* l : p->leaves) {
    k.push_back(static_cast<int64_t>(l->dtype));
    k.push_back(static_cast<int64_t>(l->shape.size()));
    for (int64_t d : l->shape) encode_value(*p, d, &k);
  }
  k.push_back(static_cast<int64_t>(p->ops.size()));
  for (Node* n : p->ops) {
    k.insert(k.end(),
             {static_cast<int64_t>(n->op), n->sub, n->axis, n->flag ? 1 : 0,
              static_cast<int64_t>(n->attr_dtype), static_cast<int64_t>(bits(n->value)),
              static_cast<int64_t>(bits(n->value2)), static_cast<int64_t>(n->ints.size())});
    k.insert(k.end(), n->ints.begin(), n->ints.end());
    k.push_back(static_cast<int64_t>(n->dims.size()));
    for (const AttrDim& d : n->dims) {
      k.push_back(d.kind);
      if (d.kind == AttrDim::kValue) {
        encode_value(*p, d.value, &k);
      } else {
        k.push_back(d.a);
        k.push_back(d.b);
      }
    }
    k.push_back(static_cast<int64_t>(n->inputs.size()));
    for (const NodePtr& in : n->inputs) k.push_back(p->local(in.get()));
  }
  k.push_back(static_cast<int64_t>(p->roots.size()));
  for (Node* r : p->roots) k.push_back(p->local(r));
}

// ---------------------------------------------------------------------------------------------
// Graph building (plan-cache misses)

using GTensor = ::dvm::Tensor;  // a graph value (lazy::Tensor is the lazy handle)

class GraphMaker {
 public:
  GraphMaker(const Plan& p, const std::vector<char>& is_static) : p_(p), static_(is_static) {}

  // The graph, or an error; `specialise` lists classes to make constant and retry with.
  StatusOr<Graph> make(std::vector<int>* specialise);
  const SymBindings& bindings() const { return bindings_; }

 private:
  SymExpr class_expr(int c) {
    if (static_[c]) return SymExpr(p_.class_values[c]);
    return syms_[c];
  }
  SymExpr value_expr(int64_t v) {
    int c = p_.class_of(v);
    return c >= 0 ? class_expr(c) : SymExpr(v);
  }
  SymExpr attr_expr(const AttrDim& d, const SymShape& src) {
    switch (d.kind) {
      case AttrDim::kSrcDim:
        return src[d.a];
      case AttrDim::kSrcProd: {
        SymExpr e(1);
        for (int i = d.a; i < d.b; ++i) e = e * src[i];
        return e;
      }
      default:
        return value_expr(d.value);
    }
  }
  GTensor op(const Node& n, const std::vector<GTensor>& in, SymShape* attrs);
  void add_classes(const SymExpr& e, std::vector<int>* out) const {
    for (const std::string& s : e.symbols()) {
      int c = std::atoi(s.c_str() + 1);
      if (!static_[c]) out->push_back(c);
    }
  }
  std::vector<int> conflict_classes(const Node& n, const std::vector<GTensor>& in,
                                    const SymShape& attrs) const;
  Status check(const Node& n, GTensor t);

  const Plan& p_;
  const std::vector<char>& static_;
  std::unique_ptr<GraphBuilder> gb_;
  std::vector<SymExpr> syms_;
  SymBindings bindings_;
};

GTensor GraphMaker::op(const Node& n, const std::vector<GTensor>& in, SymShape* attrs) {
  GraphBuilder& gb = *gb_;
  const SymShape src = in.empty() ? SymShape{} : gb.shape(in[0]);
  for (const AttrDim& d : n.dims) attrs->push_back(attr_expr(d, src));
  auto opt = [&](size_t i) { return i < in.size() ? in[i] : GTensor{}; };
  std::vector<int> axes(n.ints.begin(), n.ints.end());
  switch (n.op) {
    case GraphOp::kConstant:
      return gb.constant(n.value, n.attr_dtype);
    case GraphOp::kUnary:
      return gb.unary(static_cast<UnaryOp>(n.sub), in[0]);
    case GraphOp::kBinary:
      return gb.binary(static_cast<BinaryOp>(n.sub), in[0], in[1]);
    case GraphOp::kSelect:
      return gb.select(in[0], in[1], in[2]);
    case GraphOp::kCast:
      return gb.cast(in[0], n.attr_dtype);
    case GraphOp::kBroadcast:
      return gb.expand(in[0], *attrs);
    case GraphOp::kReshape:
      return gb.reshape(in[0], *attrs);
    case GraphOp::kPermute:
      return gb.permute(in[0], axes);
    case GraphOp::kSlice:
      return gb.slice(in[0], n.axis, (*attrs)[0], (*attrs)[1], n.ints[0]);
    case GraphOp::kConcat:
      return gb.concat(in, n.axis);
    case GraphOp::kReduce:
      return gb.reduce(static_cast<ReduceOp>(n.sub), in[0], axes, n.flag);
    case GraphOp::kMatMul:
      return gb.matmul(in[0], in[1], n.ints[0] != 0, n.ints[1] != 0);
    case GraphOp::kIndexSelect:
      return gb.index_select(in[0], n.axis, in[1]);
    case GraphOp::kGather:
      return gb.gather(in[0], n.axis, in[1]);
    case GraphOp::kCumsum:
      return gb.cumsum(in[0], n.axis);
    case GraphOp::kIota:
      return gb.iota(*attrs, n.axis, n.attr_dtype);
    case GraphOp::kSoftmax:
      return gb.softmax(in[0], n.axis);
    case GraphOp::kLogSoftmax:
      return gb.log_softmax(in[0], n.axis);
    case GraphOp::kLayerNorm:
      return gb.layer_norm(in[0], opt(1), opt(2), n.value, n.axis);
    case GraphOp::kRmsNorm:
      return gb.rms_norm(in[0], opt(1), n.value, n.axis);
    case GraphOp::kGelu:
      return gb.gelu(in[0], n.flag);
    case GraphOp::kSilu:
      return gb.silu(in[0]);
    case GraphOp::kSwiglu:
      return gb.swiglu(in[0], in[1]);
    case GraphOp::kLinear:
      return gb.linear(in[0], in[1], opt(2));
    case GraphOp::kEmbedding:
      return gb.embedding(in[0], in[1]);
    case GraphOp::kVariance:
      return gb.variance(in[0], axes, n.value, n.flag);
    case GraphOp::kStd:
      return gb.std_dev(in[0], axes, n.value, n.flag);
    case GraphOp::kCrossEntropy:
      return gb.cross_entropy(in[0], in[1]);
    case GraphOp::kAttention:
      return gb.attention(in[0], in[1], in[2], opt(3), n.flag, n.value);
    case GraphOp::kClamp: {
      std::optional<double> lo, hi;
      if (n.ints[0]) lo = n.value;
      if (n.ints[1]) hi = n.value2;
      return gb.clamp(in[0], lo, hi);
    }
    default:
      return {};
  }
}

// The classes of the dims a failed op relates: for reshape the source dims no target dim takes
// whole, for expand the dims it changes, for slice the sliced dim and bounds, for broadcasting
// ops the dims that are neither equal nor 1. Empty: no narrower guess (the caller takes all).
std::vector<int> GraphMaker::conflict_classes(const Node& n, const std::vector<GTensor>& in,
                                              const SymShape& attrs) const {
  std::vector<int> out;
  const SymShape& src = gb_->shape(in.empty() ? GTensor{} : in[0]);
  auto is_one = [](const SymExpr& e) { return e.is_constant() && e.constant_value() == 1; };
  switch (n.op) {
    case GraphOp::kReshape: {
      std::vector<char> covered(src.size(), 0);
      for (size_t j = 0; j < n.dims.size(); ++j) {
        const AttrDim& d = n.dims[j];
        if (d.kind == AttrDim::kSrcProd) {
          for (int i = d.a; i < d.b; ++i) covered[i] = 1;
        } else {
          add_classes(attrs[j], &out);
        }
      }
      for (size_t i = 0; i < src.size(); ++i)
        if (!covered[i]) add_classes(src[i], &out);
      break;
    }
    case GraphOp::kBroadcast: {
      size_t off = attrs.size() - std::min(attrs.size(), src.size());
      for (size_t j = 0; j < attrs.size(); ++j) {
        if (n.dims[j].kind != AttrDim::kValue) continue;
        add_classes(attrs[j], &out);
        if (j >= off) add_classes(src[j - off], &out);
      }
      break;
    }
    case GraphOp::kSlice:
      if (n.axis < static_cast<int>(src.size())) add_classes(src[n.axis], &out);
      for (const SymExpr& e : attrs) add_classes(e, &out);
      break;
    case GraphOp::kBinary:
    case GraphOp::kSelect:
    case GraphOp::kSwiglu:
    case GraphOp::kConcat: {
      size_t r = 0;
      for (GTensor x : in) r = std::max(r, gb_->shape(x).size());
      for (size_t i = 0; i < r; ++i) {
        std::vector<SymExpr> ds;
        for (GTensor x : in) {
          const SymShape& s = gb_->shape(x);
          if (i + s.size() >= r) ds.push_back(s[i + s.size() - r]);
        }
        if (n.op == GraphOp::kConcat && static_cast<int>(i) == n.axis) continue;
        for (size_t a = 0; a < ds.size(); ++a)
          for (size_t b = 0; b < ds.size(); ++b)
            if (!(ds[a] == ds[b]) && !is_one(ds[a]) && !is_one(ds[b])) add_classes(ds[a], &out);
      }
      break;
    }
    default:
      break;
  }
  return out;
}

// The symbolic result evaluated for this trace's binding must be what was recorded.
Status GraphMaker::check(const Node& n, GTensor t) {
  const SymShape& s = gb_->shape(t);
  bool same = s.size() == n.shape.size() && gb_->dtype(t) == n.dtype;
  for (size_t i = 0; same && i < s.size(); ++i) {
    StatusOr<int64_t> v = s[i].evaluate(bindings_);
    same = v.is_ok() && *v == n.shape[i];
  }
  if (same) return Status::ok();
  std::string m = "lazy: ";
  m += graph_op_name(n.op);
  m += " was recorded as ";
  m += dtype_name(n.dtype);
  m += "[";
  for (size_t i = 0; i < n.shape.size(); ++i) {
    if (i) m += ", ";
    m += std::to_string(n.shape[i]);
  }
  m += "], the graph deduces ";
  m += dtype_name(gb_->dtype(t));
  m += to_string(s);
  return internal_error(std::move(m));
}

StatusOr<Graph> GraphMaker::make(std::vector<int>* specialise) {
  // One name per compiled plan ("lazy0", "lazy1", ...): kernel names (DVM_PROFILE's rows,
  // DVM_DUMP_BYTECODE's programs) then tell different traces apart.
  static std::atomic<int64_t> plans_made{0};
  gb_ = std::make_unique<GraphBuilder>("lazy" + std::to_string(plans_made.fetch_add(1)));
  syms_.clear();
  bindings_.clear();
  for (size_t c = 0; c < p_.class_values.size(); ++c) {
    std::string name = "s";
    name += std::to_string(c);
    syms_.push_back(static_[c] ? SymExpr(0) : gb_->symbol(name, {2, kSymMax}));
    if (!static_[c]) bindings_[name] = p_.class_values[c];
  }
  std::vector<GTensor> value(p_.leaves.size() + p_.ops.size());
  for (size_t i = 0; i < p_.leaves.size(); ++i) {
    SymShape s;
    for (int64_t d : p_.leaves[i]->shape) s.push_back(value_expr(d));
    std::string name = "x";
    name += std::to_string(i);
    value[i] = gb_->input(name, p_.leaves[i]->dtype, s);
  }
  for (const Node* n : p_.ops) {
    std::vector<GTensor> in;
    for (const NodePtr& x : n->inputs) in.push_back(value[p_.local(x.get())]);
    SymShape attrs;
    GTensor t = op(*n, in, &attrs);
    if (!t.valid()) {
      // Specialise the classes behind the relation this op could not prove, if any; else it is
      // a real error.
      for (int c : conflict_classes(*n, in, attrs))
        if (!static_[c]) specialise->push_back(c);
      if (specialise->empty()) {
        for (GTensor x : in)
          for (const SymExpr& d : gb_->shape(x)) add_classes(d, specialise);
        for (const SymExpr& d : attrs) add_classes(d, specialise);
      }
      if (!specialise->empty()) return internal_error("specialise");
      StatusOr<Graph> g = gb_->build();
      return g.is_ok() ? internal_error("lazy: graph building failed") : g.status();
    }
    DVM_RETURN_IF_ERROR(check(*n, t));
    value[p_.local(n)] = t;
  }
  for (size_t r = 0; r < p_.roots.size(); ++r) {
    std::string name = "y";
    name += std::to_string(r);
    gb_->output(name, value[p_.local(p_.roots[r])]);
  }
  return gb_->build();
}

StatusOr<PlanEntry> compile_plan(const Plan& p, const Options& o) {
  std::vector<char> is_static(p.class_values.size(), 0);
  StatusOr<Graph> g = internal_error("lazy: no graph");
  for (size_t attempt = 0; attempt <= p.class_values.size(); ++attempt) {
    GraphMaker maker(p, is_static);
    std::vector<int> specialise;
    g = maker.make(&specialise);
    if (g.is_ok() || specialise.empty()) break;
    for (int c : specialise) is_static[c] = 1;
  }
  DVM_RETURN_IF_ERROR(g.status());
  GraphCompileOptions co;
  co.fuse = o.fuse;
  auto dump = [](const Graph& graph, const Executable& e) {
    if (!base::env().lazy_dump) return;
    std::fprintf(stderr, "lazy flush compiles:\n%s%s", graph.to_string().c_str(),
                 e.fusion_report().c_str());
  };
  co.num_threads = o.num_threads;
  StatusOr<std::shared_ptr<Executable>> exe = Executable::compile(*g, co);
  if (!exe.is_ok()) {
    // A symbolic graph the passes reject may still compile with every dim constant.
    bool any = std::find(is_static.begin(), is_static.end(), 0) != is_static.end();
    if (!any) return exe.status();
    std::fill(is_static.begin(), is_static.end(), 1);
    GraphMaker maker(p, is_static);
    std::vector<int> specialise;
    DVM_ASSIGN_OR_RETURN(Graph sg, maker.make(&specialise));
    DVM_ASSIGN_OR_RETURN(std::shared_ptr<Executable> e, Executable::compile(sg, co));
    exe = std::move(e);
  }
  PlanEntry entry;
  for (size_t c = 0; c < is_static.size(); ++c) {
    if (!is_static[c]) continue;
    entry.static_classes.push_back(static_cast<int>(c));
    entry.static_values.push_back(p.class_values[c]);
  }
  dump(*g, **exe);
  entry.exe = std::move(*exe);
  return entry;
}

// Looks up (or compiles and caches) the plan of `p`; `hit` tells which.
StatusOr<std::shared_ptr<Executable>> find_plan(const Plan& p, bool* hit, double* compile_us) {
  Global& g = global();
  Options o;
  {
    std::lock_guard<std::mutex> lock(g.mu);
    o = g.options;
    auto it = g.plans.find(p.key);
    if (it != g.plans.end()) {
      for (const PlanEntry& e : it->second) {
        bool match = true;
        for (size_t i = 0; match && i < e.static_classes.size(); ++i)
          match = p.class_values[e.static_classes[i]] == e.static_values[i];
        if (match) {
          *hit = true;
          return e.exe;
        }
      }
    }
  }
  *hit = false;
  double t0 = base::now_us();
  DVM_ASSIGN_OR_RETURN(PlanEntry entry, compile_plan(p, o));
  *compile_us = base::now_us() - t0;
  std::shared_ptr<Executable> exe = entry.exe;
  std::lock_guard<std::mutex> lock(g.mu);
  if (g.num_plans >= std::max<size_t>(1, g.options.plan_cache_capacity)) {
    g.plans.clear();
    g.num_plans = 0;
  }
  g.plans[p.key].push_back(std::move(entry));
  ++g.num_plans;
  g.stats.specialised_classes += static_cast<int64_t>(g.plans[p.key].back().static_classes.size());
  return exe;
}

// ---------------------------------------------------------------------------------------------
// Running

// [lo, hi) byte range a view touches (empty views touch nothing).
std::pair<uintptr_t, uintptr_t> byte_span(const TensorArg& t) {
  int64_t lo = t.offset, hi = t.offset;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (t.shape[d] == 0) return {0, 0};
    int64_t ext = (t.shape[d] - 1) * t.strides[d];
    (ext < 0 ? lo : hi) += ext;
  }
  int64_t size = dtype_size(t.dtype);
  uintptr_t base = reinterpret_cast<uintptr_t>(t.data);
  return {base + lo * size, base + (hi + 1) * size};
}

bool overlaps(const TensorArg& a, const std::vector<Node*>& leaves) {
  auto [alo, ahi] = byte_span(a);
  if (alo == ahi) return false;
  for (const Node* l : leaves) {
    auto [llo, lhi] = byte_span(l->arg);
    if (llo < ahi && alo < lhi) return true;
  }
  return false;
}

struct Output {
  TensorArg arg;               // where the executable writes
  std::shared_ptr<void> keep;  // runtime buffer, if any
  bool copy_to_dst = false;    // dst overlaps an input: written here, then copied
};

Output output_for(Node* r, const std::vector<Node*>& leaves) {
  Output o;
  if (r->has_dst && !overlaps(r->dst, leaves)) {
    o.arg = r->dst;
    return o;
  }
  int64_t bytes = dtype_size(r->dtype);
  for (int64_t d : r->shape) bytes *= d;
  size_t n = static_cast<size_t>((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
  void* buf = std::aligned_alloc(64, n);
  o.keep = std::shared_ptr<void>(buf, std::free);
  o.arg = TensorArg::contiguous(buf, r->dtype, r->shape);
  o.arg.strides = exec::contiguous_strides(r->shape);
  o.copy_to_dst = r->has_dst;
  return o;
}

Status run_plan(const Plan& p, const Executable& exe, GraphRunStats* gs, int64_t* stored) {
  std::vector<TensorArg> ins;
  for (const Node* l : p.leaves) ins.push_back(l->arg);
  std::vector<Output> outs;
  std::vector<TensorArg> out_args;
  for (Node* r : p.roots) {
    outs.push_back(output_for(r, p.leaves));
    out_args.push_back(outs.back().arg);
  }
  DVM_RETURN_IF_ERROR(exe.run(ins, out_args, gs));
  *stored = 0;
  for (size_t i = 0; i < p.roots.size(); ++i) {
    Node* r = p.roots[i];
    if (outs[i].copy_to_dst) exec::strided_copy(outs[i].arg, r->dst);
    if (r->has_dst) {
      r->arg = r->dst;
      r->keep = std::move(r->dst_keep);
    } else {
      r->arg = outs[i].arg;
      r->keep = std::move(outs[i].keep);
    }
    *stored += static_cast<int64_t>(r->arg.numel()) * dtype_size(r->dtype);
  }
  return Status::ok();
}

}  // namespace

const std::shared_ptr<Trace>& this_thread_trace() {
  thread_local TraceHolder holder;
  return holder.trace;
}

void count_recorded() {
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mu);
  ++g.stats.ops_recorded;
}

Options current_options() {
  Global& g = global();
  Options o;
  o.max_trace_ops = g.max_trace_ops.load();
  return o;
}

Status flush(Trace& trace, FlushReason reason) {
  std::vector<NodePtr> nodes;
  std::vector<NodePtr> graveyard;  // released after the lock: leaves may own foreign memory
  std::lock_guard<std::mutex> lock(trace.mu);
  if (trace.nodes.empty()) return Status::ok();
  double t0 = base::now_us();
  nodes.swap(trace.nodes);
  Plan p;
  select_nodes(nodes, &p);
  bool hit = false;
  double compile_us = 0;
  GraphRunStats gs;
  int64_t stored = 0;
  Status st;
  double run_us = 0;
  if (!p.roots.empty()) {
    build_key(&p);
    StatusOr<std::shared_ptr<Executable>> exe = find_plan(p, &hit, &compile_us);
    st = exe.status();
    if (st.is_ok()) {
      double r0 = base::now_us();
      st = run_plan(p, **exe, &gs, &stored);
      run_us = base::now_us() - r0;
    }
  }
  int64_t elided = 0;
  for (const NodePtr& n : nodes) {
    bool root = p.is_root[n->index] != 0;
    bool needed = p.op_id[n->index] >= 0;
    if (needed && !root && n->op != GraphOp::kConstant) ++elided;
    for (NodePtr& in : n->inputs) graveyard.push_back(std::move(in));
    n->inputs.clear();
    if (!needed || !root) {
      n->state = State::kDropped;
    } else if (st.is_ok()) {
      n->state = State::kReady;
    } else {
      n->status = st;
      n->state = State::kError;
    }
    n->dst_keep.reset();
  }
  Global& g = global();
  std::lock_guard<std::mutex> glock(g.mu);
  Stats& s = g.stats;
  ++s.flushes;
  ++s.flushes_by_reason[static_cast<int>(reason)];
  if (!p.roots.empty()) (hit ? s.plan_cache_hits : s.plan_cache_misses)++;
  s.kernels_launched += gs.kernels_launched;
  s.native_launched += gs.native_launched;
  s.programs_encoded += gs.programs_encoded;
  if (st.is_ok()) s.values_stored += static_cast<int64_t>(p.roots.size());
  s.bytes_stored += stored;
  s.intermediates_elided += elided;
  s.ops_dropped += static_cast<int64_t>(nodes.size() - p.ops.size());
  s.compile_us += compile_us;
  s.encode_us += gs.encode_us;
  s.run_us += run_us;
  s.flush_us += base::now_us() - t0;
  return st;
}

}  // namespace detail

const char* flush_reason_name(FlushReason reason) {
  switch (reason) {
    case FlushReason::kObserve:
      return "observe";
    case FlushReason::kSync:
      return "sync";
    case FlushReason::kSizeBound:
      return "size_bound";
    case FlushReason::kUnsupported:
      return "unsupported";
    case FlushReason::kWrite:
      return "write";
    case FlushReason::kOtherThread:
      return "other_thread";
  }
  return "?";
}

void set_options(const Options& options) {
  detail::Global& g = detail::global();
  std::lock_guard<std::mutex> lock(g.mu);
  g.options = options;
  g.max_trace_ops = options.max_trace_ops;
}

Options options() {
  detail::Global& g = detail::global();
  std::lock_guard<std::mutex> lock(g.mu);
  return g.options;
}

Stats stats() {
  detail::Global& g = detail::global();
  std::lock_guard<std::mutex> lock(g.mu);
  return g.stats;
}

void reset_stats() {
  detail::Global& g = detail::global();
  std::lock_guard<std::mutex> lock(g.mu);
  g.stats = Stats{};
}

Status sync(FlushReason reason) {
  return detail::flush(*detail::this_thread_trace(), reason);
}

int pending_ops() {
  detail::Trace& t = *detail::this_thread_trace();
  std::lock_guard<std::mutex> lock(t.mu);
  return static_cast<int>(t.nodes.size());
}

void clear_plan_cache() {
  detail::Global& g = detail::global();
  std::lock_guard<std::mutex> lock(g.mu);
  g.plans.clear();
  g.num_plans = 0;
}

size_t plan_cache_size() {
  detail::Global& g = detail::global();
  std::lock_guard<std::mutex> lock(g.mu);
  return g.num_plans;
}

}  // namespace dvm::lazy
