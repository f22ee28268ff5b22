// Executable: a graph compiled once (passes, fusion, lowering, buffer plan) and run for any
// binding of its symbols.
//
// Per call: bind the symbols from the input shapes (checking every dim), look up the plan of
// that binding (concrete shapes, buffer offsets, params; cached), resolve every kernel operand
// to a strided view of an input, an output or the arena, and launch the kernels in order. The
// kernels' own caches hold the bytecode per binding, so a repeated shape costs no encoding.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>

#include "base/clock.h"
#include "base/profile.h"
#include "base/thread_pool.h"
#include "exec/native_ops.h"
#include "exec/views.h"
#include "fuser/fusion.h"
#include "fuser/lower.h"
#include "ir/kernel_def.h"
#include "passes/passes.h"
#include "runtime/arg_checks.h"

namespace dvm {

namespace {

using fuser::FusionPlan;
using fuser::KernelKind;
using fuser::Role;
using graph::GraphDef;
using graph::Node;

constexpr int64_t kAlign = 64;
constexpr size_t kMaxBindingPlans = 4096;

int64_t align_up(int64_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}

// Do two fused kernels compute the same thing from the same arguments? The same ops, dtypes,
// constants (bit for bit), symbolic shapes, attributes, argument slots and outputs; names
// aside. Such kernels (every layer of a model repeats its layer's kernels) share one
// CompiledKernel, and with it the programs encoded for each binding: a decode step's new
// length is encoded once, not once per layer.
bool same_definition(const ir::KernelDef& a, const ir::KernelDef& b) {
  if (a.symbols != b.symbols || a.nodes.size() != b.nodes.size() ||
      a.input_nodes != b.input_nodes || a.param_dtypes != b.param_dtypes ||
      a.outputs.size() != b.outputs.size()) {
    return false;
  }
  for (size_t k = 0; k < a.outputs.size(); ++k)
    if (a.outputs[k].node != b.outputs[k].node) return false;
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    const ir::Node &x = a.nodes[i], &y = b.nodes[i];
    if (x.kind != y.kind || x.dtype != y.dtype || x.op != y.op || x.keepdims != y.keepdims ||
        x.slot != y.slot || std::memcmp(&x.fconst, &y.fconst, sizeof(double)) != 0 ||
        x.iconst != y.iconst || x.inputs != y.inputs || x.shape != y.shape || x.attr != y.attr) {
      return false;
    }
  }
  return true;
}

struct Step {
  int group = -1;
  KernelKind kind = KernelKind::kVector;
  std::shared_ptr<CompiledKernel> kernel;  // VM kernels
  fuser::LoweredKernel lowered;
  int native_node = -1;  // native kernels
};

// A native step's arguments (exec/native_ops.h), resolved: its output, then its inputs; and the
// value a fill writes (a constant's, or its symbol's at this binding).
struct NativeArgs {
  std::vector<TensorArg> args;
  double value = 0.0;
};

// A call at a known binding whose arguments have a known layout, resolved once: each kernel's
// launch (programs found, bounds proven) and where each of its arguments lives, so a repeated
// call only binds addresses. Native steps (an embedding's index_select, positions' iota) keep
// their resolved arguments, the addresses rebound the same way. Made at a binding's second
// call that took the full path, for graphs without operand copies or output copies (those
// keep the full path).
struct PreparedCall {
  struct Arg {
    enum Kind : uint8_t { kInput, kOutput, kArena } kind;
    int64_t where;  // input or output index; arena: byte offset
  };
  struct Kernel {
    int step = -1;
    std::shared_ptr<const CompiledKernel::Launch> launch;
    std::vector<Arg> args;  // the kernel's inputs, then its outputs
    int num_inputs = 0;
    bool any_version = false;  // some input comes from a graph input (weights may be versioned)
    int64_t bytes_moved = 0;
    bool native = false;  // a native step: `launch` is null, `native_args` its arguments
    NativeArgs native_args;
  };
  std::vector<Kernel> kernels;                      // by step
  std::vector<std::vector<int>> stacked, in_order;  // per wave: kernel indices
  // The byte extent of every argument (inputs, then outputs): a function of the layout, so a
  // repeated call checks overlaps from its pointers alone (runtime::check_disjoint).
  std::vector<runtime::ByteExtent> extents;
};

struct BindingPlan {
  SymBindings bindings;
  std::vector<std::vector<int64_t>> shapes;  // per node
  std::vector<int64_t> slot_offset;
  int64_t arena_bytes = 0;
  std::vector<std::vector<ScalarArg>> params;  // per step
  // Runs started at this binding: the first encodes its kernels, the second prepares a call.
  // Counted here, not by who made the plan: output_shapes() makes it before the first run.
  mutable std::atomic<int64_t> runs{0};
  // Prepared calls by argument layout (layout_key).
  mutable std::mutex mu;
  mutable std::map<std::vector<int64_t>, std::shared_ptr<const PreparedCall>> prepared;
};

// A tensor's dtype, rank and shape, appended to a key (all that binding symbols reads).
void append_shape(const TensorArg& t, std::vector<int64_t>* key) {
  key->push_back(static_cast<int64_t>(t.dtype));
  key->push_back(static_cast<int64_t>(t.shape.size()));
  key->insert(key->end(), t.shape.begin(), t.shape.end());
}

// What a prepared call depends on besides the binding: every argument's dtype, shape,
// strides, offset and storage size.
void layout_key(std::span<const TensorArg> inputs, std::span<const TensorArg> outputs,
                std::vector<int64_t>* key) {
  key->clear();
  for (std::span<const TensorArg> args : {inputs, outputs}) {
    for (const TensorArg& t : args) {
      append_shape(t, key);
      key->push_back(static_cast<int64_t>(t.strides.size()));
      key->insert(key->end(), t.strides.begin(), t.strides.end());
      key->push_back(t.offset);
      key->push_back(t.storage_elems);
    }
  }
}

struct Arena {
  char* data = nullptr;
  int64_t capacity = 0;
  ~Arena() { std::free(data); }
  void reserve(int64_t bytes) {
    if (bytes <= capacity) return;
    std::free(data);
    capacity = align_up(std::max<int64_t>(bytes, capacity * 3 / 2));
    data = static_cast<char*>(std::aligned_alloc(kAlign, static_cast<size_t>(capacity)));
  }
};

}  // namespace

struct Executable::Impl {
  Graph source;
  Graph optimized;
  const GraphDef* g = nullptr;
  GraphCompileOptions options;
  FusionPlan plan;
  std::vector<Step> steps;
  std::vector<std::string> symbols;  // binding key order
  std::vector<int> output_index;     // node -> first output slot holding it, -1
  // node -> output whose memory holds this computed value (the output reshapes it; see the
  // fuser), -1. Used when the caller's output is contiguous; else the value keeps its arena
  // slot and the output gets a copy at the end.
  std::vector<int> alias_output;
  std::vector<int> buffer_slot;   // node -> arena slot, -1
  std::vector<char> needs_shape;  // node -> its concrete shape is used per call
  std::vector<std::vector<int>> slot_buffers;
  std::vector<std::vector<int>> waves;  // steps with no dependency path between them

  mutable std::mutex mu;
  mutable std::map<std::vector<int64_t>, std::shared_ptr<const BindingPlan>> plans;
  mutable std::vector<std::unique_ptr<Arena>> arenas;
  // The plan of the last call's input dtypes and shapes (all that bind() reads): a call at
  // the previous call's shapes skips binding symbols (string-keyed evaluation of every dim).
  mutable std::vector<int64_t> last_shapes;  // guarded by mu
  mutable std::shared_ptr<const BindingPlan> last_plan;

  Status lower_all();
  void plan_memory();
  void plan_waves();
  bool stackable(const BindingPlan& p, int step) const;
  // The steps of `wave` that launch side by side (small VM kernels, at least two), in order.
  std::vector<int> stacked_steps(const BindingPlan& p, const std::vector<int>& wave) const;
  // Threads for `n` independent tasks.
  int parts_for(size_t n) const {
    int parts = std::min<int>(base::hardware_threads(), static_cast<int>(n));
    return options.num_threads > 0 ? std::min(parts, options.num_threads) : parts;
  }
  Status run_stacked(const std::vector<int>& stack, const std::vector<std::vector<TensorArg>>& in,
                     const std::vector<std::vector<TensorArg>>& out, const BindingPlan& p,
                     std::vector<RunStats>* rs) const;
  StatusOr<SymBindings> bind(std::span<const TensorArg> inputs) const;
  StatusOr<std::shared_ptr<const BindingPlan>> binding_plan(const SymBindings& b) const;
  // bind() then binding_plan(): the plan of these inputs' binding, for a run (`fresh`: the
  // binding's first run).
  StatusOr<std::shared_ptr<const BindingPlan>> bound_plan(std::span<const TensorArg> inputs,
                                                          bool* fresh) const {
    thread_local std::vector<int64_t> shapes;
    shapes.clear();
    for (const TensorArg& t : inputs) append_shape(t, &shapes);
    std::shared_ptr<const BindingPlan> plan;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (last_plan != nullptr && last_shapes == shapes) plan = last_plan;
    }
    if (plan == nullptr) {
      DVM_ASSIGN_OR_RETURN(SymBindings b, bind(inputs));
      DVM_ASSIGN_OR_RETURN(plan, binding_plan(b));
      std::lock_guard<std::mutex> lock(mu);
      last_shapes = shapes;
      last_plan = plan;
    }
    *fresh = plan->runs.fetch_add(1, std::memory_order_relaxed) == 0;
    return plan;
  }
  Status encode_concurrently(const std::vector<std::vector<TensorArg>>& in,
                             const std::vector<std::vector<TensorArg>>& out, const BindingPlan& p,
                             GraphRunStats* st, std::vector<char>* prepared) const;
  // A repeated call: only addresses are bound (see PreparedCall).
  Status run_prepared(const PreparedCall& pc, std::span<const TensorArg> inputs,
                      std::span<const TensorArg> outputs, Arena* arena, GraphRunStats* st) const;
  // The PreparedCall of a call that just ran the full path with these kernel arguments; null
  // when the graph or the call needs the full path every time.
  std::shared_ptr<const PreparedCall> prepare_call(const BindingPlan& p,
                                                   std::span<const TensorArg> inputs,
                                                   std::span<const TensorArg> outputs,
                                                   const char* arena,
                                                   const std::vector<std::vector<TensorArg>>& ins,
                                                   const std::vector<std::vector<TensorArg>>& outs,
                                                   const std::vector<NativeArgs>& natives) const;
  // Runs a call whose inputs are bound to `plan` (fresh: the plan was just made) into outputs.
  Status run_bound(std::span<const TensorArg> inputs, std::span<const TensorArg> outputs,
                   const BindingPlan& plan, bool fresh, double t0, GraphRunStats* stats) const;
  std::unique_ptr<Arena> take_arena() const;
  void give_arena(std::unique_ptr<Arena> a) const;
  std::string where(int node) const { return g->name + ": " + graph::node_str(*g, node); }
};

namespace {

int root_of(const GraphDef& g, const FusionPlan& plan, const fuser::LoadSpec& l) {
  int id = l.through_self ? g.nodes[l.node].inputs[0] : l.node;
  return fuser::storage_root(g, plan, id);
}

}  // namespace

Status Executable::Impl::lower_all() {
  fuser::FuseOptions fo;
  fo.enable = options.fuse;
  for (int attempt = 0;; ++attempt) {
    plan = fuser::fuse(*g, fo);
    steps.clear();
    int bad_view = -1;
    Status failed;
    for (size_t k = 0; k < plan.groups.size() && failed.is_ok(); ++k) {
      Step s;
      s.group = static_cast<int>(k);
      s.kind = plan.groups[k].kind;
      if (s.kind == KernelKind::kNative) {
        s.native_node = plan.groups[k].nodes[0];
      } else {
        StatusOr<fuser::LoweredKernel> l = fuser::lower_group(*g, plan, s.group, &bad_view);
        if (!l.is_ok()) {
          failed = l.status();
          break;
        }
        s.lowered = std::move(*l);
        for (const Step& done : steps) {
          if (done.kernel && same_definition(done.lowered.kernel.def(), s.lowered.kernel.def())) {
            s.kernel = done.kernel;
            break;
          }
        }
        if (!s.kernel) {
          CompileOptions co;
          co.num_threads = options.num_threads;
          DVM_ASSIGN_OR_RETURN(s.kernel, CompiledKernel::create(s.lowered.kernel, co));
        }
      }
      steps.push_back(std::move(s));
    }
    if (failed.is_ok()) return Status::ok();
    if (bad_view < 0 || attempt > 64) return failed;
    fo.no_in_kernel_views.insert(bad_view);  // keep that view out of kernels and re-fuse
  }
}

// Buffers of intermediate values get arena slots by liveness over the kernel order: a slot is
// reused once the last kernel reading its previous buffer has run (never by a kernel that
// still reads it, so a kernel's inputs and outputs never alias).
void Executable::Impl::plan_memory() {
  size_t n = g->nodes.size();
  output_index.assign(n, -1);
  for (size_t k = 0; k < g->outputs.size(); ++k) {
    if (output_index[g->outputs[k]] < 0) output_index[g->outputs[k]] = static_cast<int>(k);
  }
  std::vector<int> def(n, -1), last(n, -1);
  int end = static_cast<int>(steps.size());
  for (int s = 0; s < end; ++s) {
    const Step& st = steps[s];
    const fuser::Group& grp = plan.groups[st.group];
    for (int id : grp.stores) def[id] = s;
    if (st.kind == KernelKind::kNative) {
      for (int in : g->nodes[st.native_node].inputs) {
        int r = fuser::storage_root(*g, plan, in);
        last[r] = std::max(last[r], s);
      }
    } else {
      for (const fuser::LoadSpec& l : st.lowered.loads) {
        int r = root_of(*g, plan, l);
        last[r] = std::max(last[r], s);
      }
    }
  }
  for (int o : g->outputs) last[fuser::storage_root(*g, plan, o)] = end;
  alias_output.assign(n, -1);
  for (size_t k = 0; k < g->outputs.size(); ++k) {
    const int o = g->outputs[k];
    if (plan.role[o] != Role::kView || output_index[o] != static_cast<int>(k)) continue;
    const int src = g->nodes[o].inputs[0];
    if (plan.role[src] == Role::kCompute && output_index[src] < 0 && alias_output[src] < 0) {
      alias_output[src] = static_cast<int>(k);
    }
  }
  // Shapes needed per call: stored values, inputs, views (resolved to strided arguments),
  // outputs, and whatever native ops and kernel loads read.
  needs_shape.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    Role r = plan.role[i];
    if (r == Role::kInput || r == Role::kView || r == Role::kInKernelView) needs_shape[i] = 1;
  }
  for (int o : g->outputs) needs_shape[o] = 1;
  for (const Step& st : steps) {
    for (int id : plan.groups[st.group].stores) needs_shape[id] = 1;
    for (const fuser::LoadSpec& l : st.lowered.loads) needs_shape[l.node] = 1;
    if (st.native_node >= 0) {
      needs_shape[st.native_node] = 1;
      for (int in : g->nodes[st.native_node].inputs) needs_shape[in] = 1;
    }
  }
  buffer_slot.assign(n, -1);
  slot_buffers.clear();
  std::vector<int> slot_free_after;  // last step that reads the slot's current buffer
  for (int s = 0; s < end; ++s) {
    for (int id : plan.groups[steps[s].group].stores) {
      if (output_index[id] >= 0) continue;
      int slot = -1;
      for (size_t k = 0; k < slot_free_after.size(); ++k) {
        if (slot_free_after[k] < s) {
          slot = static_cast<int>(k);
          break;
        }
      }
      if (slot < 0) {
        slot = static_cast<int>(slot_buffers.size());
        slot_buffers.emplace_back();
        slot_free_after.push_back(-1);
      }
      slot_buffers[slot].push_back(id);
      slot_free_after[slot] = std::max(last[id], s);
      buffer_slot[id] = slot;
    }
  }
}

// Parallel stacking: a step depends on the steps that store what it reads and, through arena
// slot reuse, on the writer and readers of the buffer its output replaces. Steps of one wave
// have no dependency path between them, so small kernels of a wave may run concurrently.
void Executable::Impl::plan_waves() {
  size_t n = g->nodes.size();
  int end = static_cast<int>(steps.size());
  std::vector<int> producer(n, -1);
  std::vector<std::vector<int>> readers(n);
  for (int s = 0; s < end; ++s) {
    const Step& st = steps[s];
    for (int id : plan.groups[st.group].stores) producer[id] = s;
    std::vector<int> roots;
    if (st.kind == KernelKind::kNative) {
      for (int in : g->nodes[st.native_node].inputs)
        roots.push_back(fuser::storage_root(*g, plan, in));
    } else {
      for (const fuser::LoadSpec& l : st.lowered.loads) roots.push_back(root_of(*g, plan, l));
    }
    for (int r : roots) readers[r].push_back(s);
  }
  std::vector<std::vector<int>> deps(end);
  for (size_t id = 0; id < n; ++id) {
    for (int s : readers[id]) {
      if (producer[id] >= 0 && producer[id] != s) deps[s].push_back(producer[id]);
    }
  }
  for (const std::vector<int>& bufs : slot_buffers) {
    for (size_t k = 1; k < bufs.size(); ++k) {
      int writer = producer[bufs[k]];
      deps[writer].push_back(producer[bufs[k - 1]]);
      for (int t : readers[bufs[k - 1]])
        if (t != writer) deps[writer].push_back(t);
    }
  }
  std::vector<int> wave(end, 0);
  waves.clear();
  for (int s = 0; s < end; ++s) {
    for (int d : deps[s]) wave[s] = std::max(wave[s], wave[d] + 1);
    if (wave[s] >= static_cast<int>(waves.size())) waves.resize(wave[s] + 1);
    waves[wave[s]].push_back(s);
  }
}

StatusOr<SymBindings> Executable::Impl::bind(std::span<const TensorArg> inputs) const {
  if (inputs.size() != g->inputs.size()) {
    return invalid_argument(g->name + ": expected " + std::to_string(g->inputs.size()) +
                            " inputs, got " + std::to_string(inputs.size()));
  }
  SymBindings b;
  auto dim_error = [&](size_t k, size_t d, const std::string& what) {
    const Node& n = g->nodes[g->inputs[k]];
    return invalid_argument(g->name + ": input " + std::to_string(k) + " '" + n.name + "' " +
                            std::string(dtype_name(n.dtype)) + to_string(n.shape) + ": dim " +
                            std::to_string(d) + " " + what);
  };
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Node& n = g->nodes[g->inputs[k]];
    if (inputs[k].dtype != n.dtype) {
      return invalid_argument(g->name + ": input " + std::to_string(k) + " '" + n.name +
                              "': expected dtype " + std::string(dtype_name(n.dtype)) + ", got " +
                              std::string(dtype_name(inputs[k].dtype)));
    }
    if (inputs[k].shape.size() != n.shape.size()) {
      return invalid_argument(g->name + ": input " + std::to_string(k) + " '" + n.name +
                              "': expected rank " + std::to_string(n.shape.size()) + " " +
                              to_string(n.shape) + ", got rank " +
                              std::to_string(inputs[k].shape.size()));
    }
    for (size_t d = 0; d < n.shape.size(); ++d) {
      if (n.shape[d].is_symbol() && !b.count(n.shape[d].symbol_name())) {
        b[n.shape[d].symbol_name()] = inputs[k].shape[d];
      }
    }
  }
  // Dims such as s0*2 or s0+1 bind a symbol no plain dim bound (solved as a linear form and
  // verified below).
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Node& n = g->nodes[g->inputs[k]];
    for (size_t d = 0; d < n.shape.size(); ++d) {
      std::vector<std::string> unbound;
      for (const std::string& s : n.shape[d].symbols())
        if (!b.count(s)) unbound.push_back(s);
      if (unbound.size() != 1) continue;
      SymRange r = g->symbols.count(unbound[0]) ? g->symbols.at(unbound[0]) : SymRange{};
      SymBindings t = b;
      t[unbound[0]] = r.lo;
      StatusOr<int64_t> e0 = n.shape[d].evaluate(t);
      t[unbound[0]] = r.lo + 1;
      StatusOr<int64_t> e1 = n.shape[d].evaluate(t);
      if (!e0.is_ok() || !e1.is_ok() || *e1 == *e0) continue;
      int64_t slope = *e1 - *e0, delta = inputs[k].shape[d] - *e0;
      if (delta % slope == 0) b[unbound[0]] = r.lo + delta / slope;
    }
  }
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Node& n = g->nodes[g->inputs[k]];
    for (size_t d = 0; d < n.shape.size(); ++d) {
      StatusOr<int64_t> v = n.shape[d].evaluate(b);
      if (!v.is_ok()) return dim_error(k, d, "cannot be bound: " + v.status().message());
      if (*v != inputs[k].shape[d]) {
        return dim_error(k, d,
                         "is " + n.shape[d].to_string() + " = " + std::to_string(*v) +
                             " by the other inputs, got " + std::to_string(inputs[k].shape[d]));
      }
    }
  }
  return b;
}

StatusOr<std::shared_ptr<const BindingPlan>> Executable::Impl::binding_plan(
    const SymBindings& b) const {
  std::vector<int64_t> key;
  for (const std::string& s : symbols) {
    auto it = b.find(s);
    key.push_back(it == b.end() ? -1 : it->second);
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
  }
  auto p = std::make_shared<BindingPlan>();
  p->bindings = b;
  p->shapes.resize(g->nodes.size());
  for (size_t i = 0; i < g->nodes.size(); ++i) {
    if (!needs_shape[i]) continue;  // values inside kernels: the kernels infer their shapes
    for (const SymExpr& d : g->nodes[i].shape) {
      StatusOr<int64_t> v = d.evaluate(b);
      if (!v.is_ok()) return invalid_argument(where(i) + ": " + v.status().message());
      if (*v < 0) {
        return invalid_argument(where(i) + ": dim " + d.to_string() + " = " + std::to_string(*v) +
                                " is negative for this binding");
      }
      p->shapes[i].push_back(*v);
    }
  }
  int64_t offset = 0;
  for (const std::vector<int>& bufs : slot_buffers) {
    int64_t size = 0;
    for (int id : bufs) {
      int64_t numel = 1;
      for (int64_t d : p->shapes[id]) numel *= d;
      size = std::max(size, numel * dtype_size(g->nodes[id].dtype));
    }
    p->slot_offset.push_back(offset);
    offset += align_up(size);
  }
  p->arena_bytes = offset;
  for (const Step& st : steps) {
    std::vector<ScalarArg> params;
    for (const SymExpr& e : st.lowered.params) {
      DVM_ASSIGN_OR_RETURN(int64_t v, e.evaluate(b));
      params.push_back(ScalarArg::of_float(static_cast<double>(v)));
    }
    p->params.push_back(std::move(params));
  }
  std::lock_guard<std::mutex> lock(mu);
  if (plans.size() >= kMaxBindingPlans) plans.clear();
  plans[key] = p;
  return std::shared_ptr<const BindingPlan>(p);
}

std::unique_ptr<Arena> Executable::Impl::take_arena() const {
  std::lock_guard<std::mutex> lock(mu);
  if (arenas.empty()) return std::make_unique<Arena>();
  std::unique_ptr<Arena> a = std::move(arenas.back());
  arenas.pop_back();
  return a;
}

void Executable::Impl::give_arena(std::unique_ptr<Arena> a) const {
  std::lock_guard<std::mutex> lock(mu);
  arenas.push_back(std::move(a));
}

// A new binding usually means every kernel encodes a program: encode them on all threads
// before launching in order (the arguments depend on shapes and addresses, not on data).
Status Executable::Impl::encode_concurrently(const std::vector<std::vector<TensorArg>>& in,
                                             const std::vector<std::vector<TensorArg>>& out,
                                             const BindingPlan& p, GraphRunStats* st,
                                             std::vector<char>* prepared) const {
  // Steps sharing a kernel (same_definition) after its first: encoded after the first ones,
  // where they find its programs, instead of encoding the same program side by side.
  std::vector<int> vm, first, again;
  for (size_t s = 0; s < steps.size(); ++s) {
    if (!steps[s].kernel) continue;
    vm.push_back(static_cast<int>(s));
    bool seen = false;
    for (int f : first) seen = seen || steps[f].kernel == steps[s].kernel;
    (seen ? again : first).push_back(static_cast<int>(s));
  }
  if (vm.size() < 2) return Status::ok();
  std::vector<RunStats> rs(steps.size());
  std::vector<Status> sts(steps.size());
  double t0 = base::now_us();
  for (const std::vector<int>* list : {&first, &again}) {
    const int parts = parts_for(list->size());
    base::parallel_for(parts, [&](int part) {
      for (size_t i = part; i < list->size(); i += parts) {
        int s = (*list)[i];
        sts[s] = steps[s].kernel->prepare(in[s], out[s], p.params[s], &rs[s]);
      }
    });
  }
  for (int s : vm) {
    DVM_RETURN_IF_ERROR(sts[s]);
    (rs[s].cache_hit ? st->cache_hits : st->programs_encoded)++;
    (*prepared)[s] = 1;
  }
  st->encode_us += base::now_us() - t0;
  return Status::ok();
}

// A kernel small enough that the VM runs it on the calling thread alone: several of them
// from one wave fill the threads better side by side than one after another.
bool Executable::Impl::stackable(const BindingPlan& p, int step) const {
  constexpr int64_t kStackMaxElems = int64_t{1} << 15;
  int64_t elems = 0;
  for (int id : steps[step].lowered.stores) {
    int64_t numel = 1;
    for (int64_t d : p.shapes[id]) numel *= d;
    elems += numel;
  }
  return elems < kStackMaxElems;
}

std::vector<int> Executable::Impl::stacked_steps(const BindingPlan& p,
                                                 const std::vector<int>& wave) const {
  std::vector<int> small;
  for (int s : wave) {
    if (steps[s].kernel && stackable(p, s)) small.push_back(s);
  }
  if (small.size() < 2) small.clear();
  return small;
}

Status Executable::Impl::run_stacked(const std::vector<int>& stack,
                                     const std::vector<std::vector<TensorArg>>& in,
                                     const std::vector<std::vector<TensorArg>>& out,
                                     const BindingPlan& p, std::vector<RunStats>* rs) const {
  if (stack.empty()) return Status::ok();
  std::vector<Status> sts(stack.size());
  int parts = parts_for(stack.size());
  base::parallel_for(parts, [&](int part) {
    for (size_t i = part; i < stack.size(); i += parts) {
      int s = stack[i];
      sts[i] = steps[s].kernel->run(in[s], out[s], p.params[s], &(*rs)[s]);
    }
  });
  for (const Status& s : sts) DVM_RETURN_IF_ERROR(s);
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// One call.

namespace {

class CallState {
 public:
  CallState(const Executable::Impl& x, const BindingPlan& p, std::span<const TensorArg> in,
            std::span<const TensorArg> out, Arena* arena)
      : x_(x), p_(p), in_(in), out_(out), arena_(arena), resolved_(x.g->nodes.size()) {}
  StatusOr<TensorArg> resolve(int id);
  StatusOr<TensorArg> resolve_load(const fuser::LoadSpec& l);
  TensorArg storage(int id);
  // The output whose memory holds computed value `id` at this call (an output reshaping it,
  // contiguous), or -1.
  int output_alias(int id) const;
  const SymBindings& bindings() const { return p_.bindings; }
  bool copied_operands() const { return !temps_.empty(); }

 private:
  StatusOr<TensorArg> view_of(int id, int src);
  const Executable::Impl& x_;
  const BindingPlan& p_;
  std::span<const TensorArg> in_, out_;
  Arena* arena_;
  std::vector<std::optional<TensorArg>> resolved_;
  std::vector<std::unique_ptr<char[]>> temps_;
};

TensorArg with_strides(TensorArg t) {
  if (t.strides.empty()) t.strides = exec::contiguous_strides(t.shape);
  return t;
}

// Row-major contiguous (a caller's output may have any strides)?
bool is_contiguous(const TensorArg& t) {
  return t.strides.empty() || t.strides == exec::contiguous_strides(t.shape);
}

int CallState::output_alias(int id) const {
  const int k = x_.alias_output[id];
  return k >= 0 && is_contiguous(out_[k]) ? k : -1;
}

// Where a compute node's value lives: the caller's output (its own, or one that reshapes it,
// when contiguous) or its arena slot.
TensorArg CallState::storage(int id) {
  const Node& n = x_.g->nodes[id];
  if (x_.output_index[id] >= 0) return with_strides(out_[x_.output_index[id]]);
  TensorArg t;
  t.dtype = n.dtype;
  t.shape = p_.shapes[id];
  t.strides = exec::contiguous_strides(t.shape);
  const int alias = output_alias(id);
  if (alias >= 0) {
    t.data = out_[alias].data;
    t.offset = out_[alias].offset;
    t.storage_elems = out_[alias].storage_elems;
    return t;
  }
  t.data = arena_->data + p_.slot_offset[x_.buffer_slot[id]];
  return t;
}

StatusOr<TensorArg> CallState::view_of(int id, int src) {
  DVM_ASSIGN_OR_RETURN(TensorArg t, resolve(src));
  const Node& n = x_.g->nodes[id];
  if (exec::apply_view(n, p_.shapes[id], p_.bindings, &t)) return t;
  // Not expressible with strides (a reshape of an input with an unusual layout): copy the
  // operand to contiguous scratch memory first. Operands are resolved before any kernel runs,
  // so only inputs may be copied here; computed values are contiguous unless the caller passed
  // a strided output.
  int root = fuser::storage_root(*x_.g, x_.plan, src);
  if (x_.plan.role[root] != Role::kInput) {
    if (x_.output_index[root] < 0) {
      return internal_error(x_.where(id) + ": a contiguous intermediate needs a copy to view");
    }
    return unimplemented(x_.where(id) + ": reshapes output '" +
                         x_.g->output_names[x_.output_index[root]] +
                         "', whose strides the caller chose; pass a contiguous output");
  }
  int64_t numel = 1;
  for (int64_t d : t.shape) numel *= d;
  temps_.push_back(std::make_unique<char[]>(std::max<int64_t>(numel, 1) * dtype_size(t.dtype)));
  TensorArg c;
  c.data = temps_.back().get();
  c.dtype = t.dtype;
  c.shape = t.shape;
  c.strides = exec::contiguous_strides(t.shape);
  exec::strided_copy(t, c);
  if (!exec::apply_view(n, p_.shapes[id], p_.bindings, &c)) {
    return internal_error(x_.where(id) + ": view of contiguous data failed");
  }
  return c;
}

StatusOr<TensorArg> CallState::resolve(int id) {
  if (resolved_[id]) return *resolved_[id];
  TensorArg t;
  switch (x_.plan.role[id]) {
    case Role::kInput: {
      size_t k = std::find(x_.g->inputs.begin(), x_.g->inputs.end(), id) - x_.g->inputs.begin();
      t = with_strides(in_[k]);
      break;
    }
    case Role::kCompute:
      // A kernel reading a value that no kernel stores is a fusion-plan defect: refuse it
      // rather than address memory that was never planned.
      if (x_.output_index[id] < 0 && output_alias(id) < 0 && x_.buffer_slot[id] < 0)
        return internal_error(x_.where(id) + ": read from memory but stored by no kernel");
      t = storage(id);
      break;
    case Role::kView:
    case Role::kInKernelView: {
      DVM_ASSIGN_OR_RETURN(t, view_of(id, x_.g->nodes[id].inputs[0]));
      break;
    }
    case Role::kScalar:
      return internal_error(x_.where(id) + ": a scalar has no storage");
  }
  resolved_[id] = t;
  return t;
}

StatusOr<TensorArg> CallState::resolve_load(const fuser::LoadSpec& l) {
  if (!l.through_self) return resolve(l.node);
  return view_of(l.node, x_.g->nodes[l.node].inputs[0]);
}

// A native step's arguments at this call (NativeArgs): its output's storage and its inputs.
StatusOr<NativeArgs> native_args(const Executable::Impl& x, CallState& cs, int id) {
  const Node& n = x.g->nodes[id];
  NativeArgs a;
  a.args.push_back(cs.storage(id));
  switch (n.op) {
    case GraphOp::kIota:
      return a;
    case GraphOp::kConstant:
    case GraphOp::kBroadcast:
    case GraphOp::kReshape:
    case GraphOp::kPermute:
    case GraphOp::kSlice: {  // a constant, or a view of one: fill
      int root = id;
      while (x.g->nodes[root].op != GraphOp::kConstant) root = x.g->nodes[root].inputs[0];
      const Node& c = x.g->nodes[root];
      a.value = c.value;
      if (!c.sym.empty()) {
        DVM_ASSIGN_OR_RETURN(int64_t e, c.sym[0].evaluate(cs.bindings()));
        a.value = static_cast<double>(e);
      }
      return a;
    }
    case GraphOp::kCumsum:
    case GraphOp::kIndexSelect:
    case GraphOp::kGather:
      for (int in : n.inputs) {
        DVM_ASSIGN_OR_RETURN(TensorArg t, cs.resolve(in));
        a.args.push_back(std::move(t));
      }
      return a;
    default:
      return internal_error(x.where(id) + ": not a native op");
  }
}

// Runs native step `id` on its arguments (native_args, or a prepared call's rebound copy).
Status exec_native_untimed(const Executable::Impl& x, int id, const NativeArgs& a) {
  const Node& n = x.g->nodes[id];
  const std::vector<TensorArg>& t = a.args;
  switch (n.op) {
    case GraphOp::kIota:
      exec::iota(t[0], n.axis);
      return Status::ok();
    case GraphOp::kCumsum:
      exec::cumsum(t[1], n.axis, t[0]);
      return Status::ok();
    case GraphOp::kIndexSelect:
      return exec::index_select(x.where(id), t[1], t[2], n.axis, t[0]);
    case GraphOp::kGather:
      return exec::gather(x.where(id), t[1], t[2], n.axis, t[0]);
    default:  // a fill (native_args refused every other op)
      exec::fill(t[0], a.value);
      return Status::ok();
  }
}

// exec_native_untimed, recorded under DVM_PROFILE as "<graph> native <op>".
Status exec_native(const Executable::Impl& x, int id, const NativeArgs& a) {
  if (!base::profiling()) return exec_native_untimed(x, id, a);
  const double t0 = base::now_us();
  Status s = exec_native_untimed(x, id, a);
  base::profile_record(x.g->name + " native " + graph_op_name(x.g->nodes[id].op),
                       base::now_us() - t0, 0);
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Executable

Executable::Executable() : impl_(std::make_unique<Impl>()) {}
Executable::~Executable() = default;

StatusOr<std::shared_ptr<Executable>> Executable::compile(const Graph& graph,
                                                          const GraphCompileOptions& options) {
  std::shared_ptr<Executable> exe(new Executable());
  Impl& x = *exe->impl_;
  x.source = graph;
  x.options = options;
  DVM_ASSIGN_OR_RETURN(GraphDef opt, passes::run_pipeline(graph.def(), options.optimize));
  x.optimized = Graph(std::make_shared<GraphDef>(std::move(opt)));
  x.g = &x.optimized.def();
  for (const auto& [name, range] : x.g->symbols) x.symbols.push_back(name);
  DVM_RETURN_IF_ERROR(x.lower_all());
  x.plan_memory();
  x.plan_waves();
  return exe;
}

Status Executable::run(std::span<const TensorArg> inputs, std::span<const TensorArg> outputs,
                       GraphRunStats* stats) const {
  const Impl& x = *impl_;
  double t0 = base::now_us();
  bool fresh = false;
  DVM_ASSIGN_OR_RETURN(std::shared_ptr<const BindingPlan> p, x.bound_plan(inputs, &fresh));
  return x.run_bound(inputs, outputs, *p, fresh, t0, stats);
}

Status Executable::run(std::span<const TensorArg> inputs, const OutputAllocator& allocate,
                       GraphRunStats* stats) const {
  const Impl& x = *impl_;
  double t0 = base::now_us();
  bool fresh = false;
  DVM_ASSIGN_OR_RETURN(std::shared_ptr<const BindingPlan> p, x.bound_plan(inputs, &fresh));
  std::vector<std::vector<int64_t>> shapes;
  shapes.reserve(x.g->outputs.size());
  for (int o : x.g->outputs) shapes.push_back(p->shapes[o]);
  std::vector<TensorArg> outputs;
  DVM_RETURN_IF_ERROR(allocate(shapes, &outputs));
  return x.run_bound(inputs, outputs, *p, fresh, t0, stats);
}

std::shared_ptr<const PreparedCall> Executable::Impl::prepare_call(
    const BindingPlan& p, std::span<const TensorArg> inputs, std::span<const TensorArg> outputs,
    const char* arena, const std::vector<std::vector<TensorArg>>& ins,
    const std::vector<std::vector<TensorArg>>& outs, const std::vector<NativeArgs>& natives) const {
  // Arguments are told apart by address: the call's own must be distinct and present.
  std::vector<const void*> bases;
  for (std::span<const TensorArg> args : {inputs, outputs})
    for (const TensorArg& t : args) bases.push_back(t.data);
  std::vector<const void*> sorted = bases;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() ||
      (!sorted.empty() && sorted[0] == nullptr)) {
    return nullptr;
  }
  auto pc = std::make_shared<PreparedCall>();
  pc->kernels.resize(steps.size());
  for (std::span<const TensorArg> args : {inputs, outputs})
    for (const TensorArg& t : args) pc->extents.push_back(runtime::byte_extent(t));
  const auto where = [&](const TensorArg& t, PreparedCall::Arg* a) {
    for (size_t k = 0; k < bases.size(); ++k) {
      if (t.data != bases[k]) continue;
      *a = k < inputs.size()
               ? PreparedCall::Arg{PreparedCall::Arg::kInput, int64_t(k)}
               : PreparedCall::Arg{PreparedCall::Arg::kOutput, int64_t(k - inputs.size())};
      return true;
    }
    const char* c = static_cast<const char*>(t.data);
    if (c < arena || c >= arena + p.arena_bytes) return false;
    *a = PreparedCall::Arg{PreparedCall::Arg::kArena, c - arena};
    return true;
  };
  for (size_t s = 0; s < steps.size(); ++s) {
    PreparedCall::Kernel& k = pc->kernels[s];
    k.step = static_cast<int>(s);
    if (steps[s].kind == KernelKind::kNative) {
      if (natives[s].args.empty()) return nullptr;  // not run by the call
      k.native = true;
      k.native_args = natives[s];
      for (const TensorArg& t : k.native_args.args) {
        PreparedCall::Arg a{};
        if (!where(t, &a)) return nullptr;
        k.args.push_back(a);
      }
      continue;
    }
    if (!steps[s].kernel) return nullptr;
    RunStats rs;
    StatusOr<std::shared_ptr<const CompiledKernel::Launch>> l =
        steps[s].kernel->prepare_launch(ins[s], outs[s], p.params[s], &rs);
    if (!l.is_ok()) return nullptr;
    k.launch = *l;
    k.bytes_moved = rs.bytes_moved;
    k.num_inputs = static_cast<int>(ins[s].size());
    for (const auto* list : {&ins[s], &outs[s]}) {
      for (const TensorArg& t : *list) {
        PreparedCall::Arg a{};
        if (!where(t, &a)) return nullptr;
        k.any_version = k.any_version || (list == &ins[s] && a.kind == PreparedCall::Arg::kInput);
        k.args.push_back(a);
      }
    }
  }
  for (const std::vector<int>& wave : waves) {
    std::vector<int> small = stacked_steps(p, wave), rest;
    for (int s : wave)
      if (std::find(small.begin(), small.end(), s) == small.end()) rest.push_back(s);
    pc->stacked.push_back(std::move(small));
    pc->in_order.push_back(std::move(rest));
  }
  return pc;
}

Status Executable::Impl::run_prepared(const PreparedCall& pc, std::span<const TensorArg> inputs,
                                      std::span<const TensorArg> outputs, Arena* arena,
                                      GraphRunStats* st) const {
  const auto arg_data = [&](const PreparedCall::Arg& a) -> void* {
    switch (a.kind) {
      case PreparedCall::Arg::kInput:
        return inputs[a.where].data;
      case PreparedCall::Arg::kOutput:
        return outputs[a.where].data;
      case PreparedCall::Arg::kArena:
        break;
    }
    return arena->data + a.where;
  };
  const auto launch_native = [&](const PreparedCall::Kernel& k) -> Status {
    thread_local NativeArgs a;
    a = k.native_args;
    for (size_t j = 0; j < k.args.size(); ++j) a.args[j].data = arg_data(k.args[j]);
    return exec_native(*this, steps[k.step].native_node, a);
  };
  const auto launch = [&](const PreparedCall::Kernel& k) -> Status {
    if (k.native) return launch_native(k);
    thread_local std::vector<void*> data;
    thread_local std::vector<uint64_t> versions;
    data.resize(k.args.size());
    if (k.any_version) versions.assign(static_cast<size_t>(k.num_inputs), 0);
    for (size_t j = 0; j < k.args.size(); ++j) {
      const PreparedCall::Arg& a = k.args[j];
      data[j] = arg_data(a);
      if (k.any_version && a.kind == PreparedCall::Arg::kInput && j < versions.size())
        versions[j] = inputs[a.where].version;
    }
    const CompiledKernel& kernel = *steps[k.step].kernel;
    const uint64_t* v = k.any_version ? versions.data() : nullptr;
    if (!base::profiling()) return kernel.run_launch(*k.launch, data, v);
    const double t0 = base::now_us();
    Status s = kernel.run_launch(*k.launch, data, v);
    base::profile_record(kernel.kernel().name(), base::now_us() - t0, k.bytes_moved);
    return s;
  };
  for (size_t w = 0; w < pc.stacked.size(); ++w) {
    const std::vector<int>& small = pc.stacked[w];
    if (!small.empty()) {
      int parts = parts_for(small.size());
      std::mutex mu;  // guards `failed`, written only by a launch that fails
      Status failed;
      base::parallel_for(parts, [&](int part) {
        for (size_t i = part; i < small.size(); i += parts) {
          Status s = launch(pc.kernels[small[i]]);
          if (s.is_ok()) continue;
          std::lock_guard<std::mutex> lock(mu);
          if (failed.is_ok()) failed = std::move(s);
          return;
        }
      });
      DVM_RETURN_IF_ERROR(failed);
    }
    int natives = 0;
    for (int s : pc.in_order[w]) {
      DVM_RETURN_IF_ERROR(launch(pc.kernels[s]));
      natives += pc.kernels[s].native ? 1 : 0;
    }
    for (int s : small) st->bytes_moved += pc.kernels[s].bytes_moved;
    for (int s : pc.in_order[w]) st->bytes_moved += pc.kernels[s].bytes_moved;
    const int vm = static_cast<int>(small.size() + pc.in_order[w].size()) - natives;
    st->kernels_launched += vm;
    st->cache_hits += vm;
    st->native_launched += natives;
    st->kernels_stacked += static_cast<int>(small.size());
  }
  return Status::ok();
}

Status Executable::Impl::run_bound(std::span<const TensorArg> inputs,
                                   std::span<const TensorArg> outputs, const BindingPlan& plan,
                                   bool fresh, double t0, GraphRunStats* stats) const {
  const Impl& x = *this;
  const BindingPlan* p = &plan;
  if (outputs.size() != x.g->outputs.size()) {
    return invalid_argument(x.g->name + ": expected " + std::to_string(x.g->outputs.size()) +
                            " outputs, got " + std::to_string(outputs.size()));
  }
  for (size_t k = 0; k < outputs.size(); ++k) {
    int o = x.g->outputs[k];
    if (outputs[k].dtype != x.g->nodes[o].dtype || outputs[k].shape != p->shapes[o]) {
      return invalid_argument(x.g->name + ": output " + std::to_string(k) + " '" +
                              x.g->output_names[k] + "' must be " +
                              std::string(dtype_name(x.g->nodes[o].dtype)) +
                              to_string(x.g->nodes[o].shape) + " for this binding");
    }
  }
  thread_local std::vector<int64_t> key;
  layout_key(inputs, outputs, &key);
  std::shared_ptr<const PreparedCall> pc;
  {
    std::lock_guard<std::mutex> lock(p->mu);
    auto it = p->prepared.find(key);
    if (it != p->prepared.end()) pc = it->second;
  }
  if (pc) {  // the layout's checks passed when it was prepared; the pointers are this call's
    thread_local std::vector<void*> data;
    data.clear();
    for (std::span<const TensorArg> args : {inputs, outputs})
      for (const TensorArg& t : args) data.push_back(t.data);
    DVM_RETURN_IF_ERROR(runtime::check_disjoint(x.g->name, inputs.size(), data, pc->extents, {}));
  } else {
    DVM_RETURN_IF_ERROR(runtime::check_no_overlap(x.g->name, inputs, outputs));
  }
  std::unique_ptr<Arena> arena = x.take_arena();
  arena->reserve(p->arena_bytes);
  GraphRunStats st;
  st.peak_bytes = p->arena_bytes;
  st.bind_us = base::now_us() - t0;
  if (pc) {
    st.prepared = true;
    const Status status = x.run_prepared(*pc, inputs, outputs, arena.get(), &st);
    x.give_arena(std::move(arena));
    if (stats) *stats = st;
    return status;
  }
  CallState cs(x, *p, inputs, outputs, arena.get());
  Status status;
  size_t n = x.steps.size();
  std::vector<std::vector<TensorArg>> ins(n), outs(n);
  for (size_t s = 0; s < n && status.is_ok(); ++s) {
    const Step& step = x.steps[s];
    if (!step.kernel) continue;
    for (const fuser::LoadSpec& l : step.lowered.loads) {
      StatusOr<TensorArg> t = cs.resolve_load(l);
      if (!t.is_ok()) {
        status = t.status();
        break;
      }
      ins[s].push_back(std::move(*t));
    }
    for (int id : step.lowered.stores) outs[s].push_back(cs.storage(id));
  }
  std::vector<char> prepared(n, 0);
  std::vector<NativeArgs> natives(n);
  if (status.is_ok() && fresh) status = x.encode_concurrently(ins, outs, *p, &st, &prepared);
  std::vector<RunStats> rs(n);
  auto account = [&](size_t s) {
    ++st.kernels_launched;
    if (!prepared[s]) {
      (rs[s].cache_hit ? st.cache_hits : st.programs_encoded)++;
      st.encode_us += rs[s].encode_us;
    }
    st.bytes_moved += rs[s].bytes_moved;
  };
  for (size_t w = 0; w < x.waves.size() && status.is_ok(); ++w) {
    const std::vector<int> small = x.stacked_steps(*p, x.waves[w]);
    status = x.run_stacked(small, ins, outs, *p, &rs);
    for (int s : small) account(s);
    st.kernels_stacked += static_cast<int>(small.size());
    for (int s : x.waves[w]) {
      if (!status.is_ok()) break;
      if (std::find(small.begin(), small.end(), s) != small.end()) continue;
      const Step& step = x.steps[s];
      const double t_start = base::profiling() ? base::now_us() : 0.0;
      if (step.kind == KernelKind::kNative) {
        StatusOr<NativeArgs> a = native_args(x, cs, step.native_node);
        status = a.is_ok() ? exec_native(x, step.native_node, *a) : a.status();
        if (a.is_ok()) natives[s] = std::move(*a);
        ++st.native_launched;
        continue;
      }
      status = step.kernel->run(ins[s], outs[s], p->params[s], &rs[s]);
      if (base::profiling()) {
        // First calls at a binding include their encoding.
        base::profile_record(step.kernel->kernel().name(), base::now_us() - t_start,
                             rs[s].bytes_moved);
      }
      account(s);
    }
  }
  // Outputs that are inputs, or the same value listed twice, are copied.
  bool output_copies = false;
  for (size_t k = 0; k < outputs.size() && status.is_ok(); ++k) {
    int o = x.g->outputs[k];
    if (x.plan.role[o] == Role::kCompute && x.output_index[o] == static_cast<int>(k)) continue;
    if (x.plan.role[o] == Role::kView &&
        cs.output_alias(x.g->nodes[o].inputs[0]) == static_cast<int>(k)) {
      continue;  // its kernel wrote it in place
    }
    StatusOr<TensorArg> src = cs.resolve(o);
    if (!src.is_ok()) {
      status = src.status();
      break;
    }
    exec::strided_copy(*src, with_strides(outputs[k]));
    ++st.native_launched;
    output_copies = true;
  }
  // Prepared at a binding's second full call, not its first: a decode step meets a new length
  // every call, and preparing each (every kernel's launch looked up and proven again) cost
  // more than the repeated calls it never had.
  if (status.is_ok() && !fresh && !output_copies && !cs.copied_operands()) {
    std::shared_ptr<const PreparedCall> made =
        x.prepare_call(*p, inputs, outputs, arena->data, ins, outs, natives);
    if (made) {
      std::lock_guard<std::mutex> lock(p->mu);
      if (p->prepared.size() >= kMaxBindingPlans) p->prepared.clear();
      p->prepared.emplace(key, std::move(made));
    }
  }
  x.give_arena(std::move(arena));
  if (stats) *stats = st;
  return status;
}

StatusOr<std::vector<std::vector<int64_t>>> Executable::output_shapes(
    std::span<const TensorArg> inputs) const {
  DVM_ASSIGN_OR_RETURN(SymBindings b, impl_->bind(inputs));
  DVM_ASSIGN_OR_RETURN(std::shared_ptr<const BindingPlan> p, impl_->binding_plan(b));
  std::vector<std::vector<int64_t>> out;
  for (int o : impl_->g->outputs) out.push_back(p->shapes[o]);
  return out;
}

StatusOr<SymBindings> Executable::bind(std::span<const TensorArg> inputs) const {
  return impl_->bind(inputs);
}

StatusOr<int64_t> Executable::peak_bytes(const SymBindings& bindings) const {
  DVM_ASSIGN_OR_RETURN(std::shared_ptr<const BindingPlan> p, impl_->binding_plan(bindings));
  return p->arena_bytes;
}

const Graph& Executable::source() const {
  return impl_->source;
}
const Graph& Executable::optimized() const {
  return impl_->optimized;
}

std::vector<DType> Executable::output_dtypes() const {
  std::vector<DType> out;
  for (int o : impl_->g->outputs) out.push_back(impl_->g->nodes[o].dtype);
  return out;
}

std::string Executable::fusion_report() const {
  std::string s = fuser::fusion_report(*impl_->g, impl_->plan);
  s += "buffers: " + std::to_string(impl_->slot_buffers.size()) + " arena slots\n";
  s += "waves (independent kernels; small ones launch side by side):";
  for (const std::vector<int>& w : impl_->waves) {
    s += " [";
    for (size_t i = 0; i < w.size(); ++i) {
      if (i) s += ' ';
      s += std::to_string(w[i]);
    }
    s += ']';
  }
  s += '\n';
  return s;
}

int Executable::num_kernels() const {
  return static_cast<int>(impl_->steps.size());
}

int Executable::num_threads() const {
  return base::kernel_threads(impl_->options.num_threads);
}

}  // namespace dvm
