// The runtime operator compiler. See encoder.h for the pipeline; the stages of it are the
// sections of this file, in order: views, stage construction (visit), domain layout (order,
// fold, tile, grid), scheduling and emission, register allocation, program assembly.
// Over the ~1,000-line guideline: the sections share the stage types, which are private to
// this translation unit so that the encoder's hot path inlines; splitting it into
// stages / layout / emitter files behind an internal header is the next refactor.
#include "encoder/encoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "bytecode/verifier.h"
#include "vm/cpu/gemm.h"

namespace dvm::enc {

namespace {

using bc::Operand;
using bc::TileClass;
using ir::CShape;
using ir::Node;
using ir::OpKind;

constexpr int kMaxDomAxes = bc::kMaxAxes;
constexpr int64_t kTileElems = 4096;        // elements per register for streaming stages
constexpr int64_t kMaxReduceChunk = 16384;  // a reduced row up to this fits one pass
// Live tile registers should stay in L2 (1 MiB per core on the machines we measured). Keeping
// them in L1 instead meant 1-row tiles whose dispatch overhead cost more than the L2 traffic
// (layernorm over 1024 columns: 888 us at 20 KiB vs 494 us at 256 KiB per 1M elements).
constexpr int64_t kRegBudgetBytes = 128 * 1024;
// Reductions with fewer outputs than kSplitParts over at least kSplitMinElems inputs are
// split across kSplitParts blocks and combined by a second program.
constexpr int64_t kSplitParts = 16;
// A row-wise reduction of a matmul's output shares its tile up to this row length.
constexpr int64_t kMaxMatmulRow = 2048;
constexpr int64_t kSplitMinElems = int64_t{1} << 17;

// ---- affine maps and views -------------------------------------------------------------

// Index of a node's dim as a function of the stage domain: start + step * dom[axis].
// axis < 0: the dim is fixed at `start` (it has no domain axis of its own).
struct MapEntry {
  int axis = -1;
  int64_t start = 0;
  int64_t step = 0;
  bool operator==(const MapEntry&) const = default;
};

struct NodeMap {
  int rank = 0;
  MapEntry e[kMaxRank];
  bool operator==(const NodeMap& o) const {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i)
      if (!(e[i] == o.e[i])) return false;
    return true;
  }
};

// A strided view of an argument slot.
struct View {
  int slot = -1;
  DType dtype = DType::kF32;
  CShape shape;
  int64_t stride[kMaxRank] = {};
  int64_t offset = 0;
};

View arg_view(int slot, const TensorArg& t) {
  View v;
  v.slot = slot;
  v.dtype = t.dtype;
  v.shape.rank = static_cast<int>(t.shape.size());
  for (int i = 0; i < v.shape.rank; ++i) v.shape.d[i] = t.shape[i];
  ir::arg_strides(t, v.stride);
  v.offset = t.offset;
  return v;
}

View contiguous_view(int slot, DType dtype, const CShape& s) {
  View v;
  v.slot = slot;
  v.dtype = dtype;
  v.shape = s;
  int64_t st = 1;
  for (int i = s.rank - 1; i >= 0; --i) {
    v.stride[i] = st;
    st *= s.d[i];
  }
  return v;
}

// Strides of `v` reshaped to `to` without copying, if the layout allows it (the same rule as
// torch's view()).
bool reshape_view(const View& v, const CShape& to, View* out) {
  *out = v;
  out->shape = to;
  if (v.shape.numel() == 0) return true;
  int view_d = to.rank - 1;
  int64_t chunk_base = v.shape.rank ? v.stride[v.shape.rank - 1] : 1;
  int64_t tensor_numel = 1, view_numel = 1;
  for (int td = v.shape.rank - 1; td >= 0; --td) {
    tensor_numel *= v.shape.d[td];
    if (td == 0 || (v.shape.d[td - 1] != 1 && v.stride[td - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || to.d[view_d] == 1)) {
        out->stride[view_d] = view_numel * chunk_base;
        view_numel *= to.d[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (td > 0) {
        chunk_base = v.stride[td - 1];
        tensor_numel = view_numel = 1;
      }
    }
  }
  while (view_d >= 0 && to.d[view_d] == 1) out->stride[view_d--] = 0;
  return view_d == -1;
}

// ---- stages ----------------------------------------------------------------------------

enum class InstKind : uint8_t { kLoad, kScalar, kCompute, kReduce, kMatMul };

// One node evaluated in a stage under one map.
struct Inst {
  int node = -1;
  NodeMap map;
  InstKind kind = InstKind::kCompute;
  std::vector<int> inputs;               // instance ids
  uint32_t vary = 0;                     // domain axes the value depends on
  uint32_t reduced = 0;                  // kReduce: domain axes reduced
  int contract = -1;                     // kMatMul: the contraction axis
  View view;                             // kLoad
  int64_t dom_stride[kMaxDomAxes] = {};  // kLoad: element stride per domain axis
  int64_t dom_offset = 0;
  int level = 0;
  int uses = 0;
};

struct Sink {
  int inst = -1;
  int slot = -1;
  DType dtype = DType::kF32;
  int64_t dom_stride[kMaxDomAxes] = {};
  int64_t dom_offset = 0;
};

struct DomAxis {
  int64_t extent = 1;
  bool reduced = false;
  bool no_fold = false;    // reduced by an arg-reduction: its index must stay logical
  bool grid_only = false;  // splits a reduction across blocks: never a tile axis
  int8_t mm_role = 0;      // a matmul's 1: M (tile rows), 2: N (tile cols), 3: K (contracted)
};

struct Stage {
  CShape root;
  bool joinable = false;
  std::vector<DomAxis> axes;
  std::vector<Inst> insts;
  std::vector<Sink> sinks;
  uint32_t reduce_set = 0;
  bool has_reduce = false;
  // Computes per-block partial reductions (split across blocks along `split_axis`); a later
  // stage combines them.
  bool partial = false;
  int split_axis = -1;
  // A matmul's output tile is the stage's tile: every matmul of a stage shares M and N.
  bool has_matmul = false;
  int mm_m = -1, mm_n = -1;
};

struct Workspace {
  int slot;
  View view;
};

class Encoder {
 public:
  Encoder(const ir::KernelDef& def, const ir::Binding& b, std::span<const TensorArg> inputs,
          std::span<const TensorArg> outputs, const EncodeOptions& opt)
      : def_(def), b_(b), inputs_(inputs), outputs_(outputs), opt_(opt) {}

  Status run(EncodedKernel* out);

 private:
  // stage construction
  Status add_sink(int node, const View& dst, bool joinable);
  Status visit(int stage, int node, const NodeMap& map, int* inst);
  Status visit_reduce(int stage, int node, const NodeMap& map, int* inst);
  bool should_split(int stage, int node) const;
  Status visit_matmul(int stage, int node, const NodeMap& map, int* inst);
  Status operand_view(int node, View* v);
  void plan_matmuls();
  bool reduce_fits_matmul_tile(int node) const;
  Status visit_split_reduce(int stage, int node, const NodeMap& map, int* inst);
  Status visit_reshape(int stage, int node, const NodeMap& map, int* inst);
  Status load_inst(int stage, int node, const View& v, const NodeMap& map, int* inst);
  Status materialize(int node, View* ws);
  bool resolve_view(int node, View* v);
  int add_inst(int stage, Inst inst);
  NodeMap broadcast_map(int out_node, int in_node, const NodeMap& m) const;
  int new_axis(int stage, int64_t extent);
  Status emit_stage(int stage, EncodedKernel* out);

  const ir::KernelDef& def_;
  const ir::Binding& b_;
  std::span<const TensorArg> inputs_;
  std::span<const TensorArg> outputs_;
  const EncodeOptions& opt_;
  std::vector<Stage> stages_;
  std::vector<int> order_;                               // stage execution order
  std::vector<std::pair<int, Workspace>> materialized_;  // node -> workspace
  std::vector<Workspace> workspaces_;
  // Per node: a matmul whose result feeds a reduction that cannot share its tile is computed
  // once into a workspace, instead of once in every stage that needs it.
  std::vector<char> mm_alone_;
  int computing_root_ = -1;  // the node a materialisation stage is being built for
};

const CShape& shape_of(const ir::Binding& b, int node) {
  return b.shapes[node];
}

NodeMap identity_map(const CShape& s) {
  NodeMap m;
  m.rank = s.rank;
  for (int i = 0; i < s.rank; ++i) m.e[i] = s.d[i] == 1 ? MapEntry{i, 0, 0} : MapEntry{i, 0, 1};
  return m;
}

int Encoder::add_inst(int stage, Inst inst) {
  auto& insts = stages_[stage].insts;
  for (size_t i = 0; i < insts.size(); ++i) {
    if (insts[i].node == inst.node && insts[i].map == inst.map && insts[i].kind == inst.kind)
      return static_cast<int>(i);
  }
  for (int in : inst.inputs) insts[in].uses++;
  insts.push_back(std::move(inst));
  return static_cast<int>(insts.size()) - 1;
}

int Encoder::new_axis(int stage, int64_t extent) {
  auto& axes = stages_[stage].axes;
  if (static_cast<int>(axes.size()) >= kMaxDomAxes) return -1;
  axes.push_back(DomAxis{extent, false, false});
  return static_cast<int>(axes.size()) - 1;
}

Status Encoder::add_sink(int node, const View& dst, bool joinable) {
  const Node& n = def_.nodes[node];
  if (n.kind == OpKind::kConcat) {
    // Each part is stored straight into its slice of the destination.
    int axis = static_cast<int>(n.attr[0]);
    int64_t at = 0;
    for (int part : n.inputs) {
      View v = dst;
      v.shape = shape_of(b_, part);
      v.offset += at * dst.stride[axis];
      at += v.shape.d[axis];
      DVM_RETURN_IF_ERROR(add_sink(part, v, joinable));
    }
    return Status::ok();
  }
  const CShape& s = shape_of(b_, node);
  int stage = -1;
  if (joinable) {
    for (size_t i = 0; i < stages_.size(); ++i)
      if (stages_[i].joinable && stages_[i].root == s) stage = static_cast<int>(i);
  }
  if (stage < 0) {
    stages_.emplace_back();
    stage = static_cast<int>(stages_.size()) - 1;
    stages_[stage].root = s;
    stages_[stage].joinable = joinable;
    for (int i = 0; i < s.rank; ++i) new_axis(stage, s.d[i]);
  }
  NodeMap m = identity_map(s);
  int inst;
  DVM_RETURN_IF_ERROR(visit(stage, node, m, &inst));
  Sink sink;
  sink.inst = inst;
  sink.slot = dst.slot;
  sink.dtype = dst.dtype;
  sink.dom_offset = dst.offset;
  for (int i = 0; i < s.rank; ++i) sink.dom_stride[i] = s.d[i] == 1 ? 0 : dst.stride[i];
  stages_[stage].insts[inst].uses++;
  stages_[stage].sinks.push_back(sink);
  if (!joinable) order_.push_back(stage);
  return Status::ok();
}

NodeMap Encoder::broadcast_map(int out_node, int in_node, const NodeMap& m) const {
  const CShape& os = shape_of(b_, out_node);
  const CShape& is = shape_of(b_, in_node);
  NodeMap r;
  r.rank = is.rank;
  int off = os.rank - is.rank;
  for (int k = 0; k < is.rank; ++k) {
    r.e[k] = m.e[k + off];
    if (is.d[k] == 1) r.e[k] = MapEntry{m.e[k + off].axis, 0, 0};
  }
  return r;
}

bool Encoder::resolve_view(int node, View* v) {
  const Node& n = def_.nodes[node];
  switch (n.kind) {
    case OpKind::kLoad:
      *v = arg_view(n.slot, inputs_[n.slot]);
      return true;
    case OpKind::kPermute: {
      View in;
      if (!resolve_view(n.inputs[0], &in)) return false;
      *v = in;
      for (int i = 0; i < in.shape.rank; ++i) {
        v->shape.d[i] = in.shape.d[n.attr[i]];
        v->stride[i] = in.stride[n.attr[i]];
      }
      return true;
    }
    case OpKind::kSlice: {
      View in;
      if (!resolve_view(n.inputs[0], &in)) return false;
      int axis = static_cast<int>(n.attr[0]);
      ir::SliceBounds sb = ir::slice_bounds(n, in.shape.d[axis]);
      *v = in;
      v->offset += sb.start * in.stride[axis];
      v->stride[axis] *= sb.step;
      v->shape.d[axis] = sb.count;
      return true;
    }
    case OpKind::kReshape: {
      View in;
      if (!resolve_view(n.inputs[0], &in)) return false;
      return reshape_view(in, shape_of(b_, node), v);
    }
    case OpKind::kBroadcast: {
      View in;
      if (!resolve_view(n.inputs[0], &in)) return false;
      const CShape& s = shape_of(b_, node);
      *v = in;
      v->shape = s;
      int off = s.rank - in.shape.rank;
      for (int i = 0; i < s.rank; ++i) {
        int k = i - off;
        v->stride[i] = (k < 0 || in.shape.d[k] == 1) ? 0 : in.stride[k];
      }
      return true;
    }
    default:
      return false;
  }
}

Status Encoder::load_inst(int stage, int node, const View& v, const NodeMap& map, int* inst) {
  Inst in;
  in.node = node;
  in.map = map;
  in.kind = InstKind::kLoad;
  in.view = v;
  in.dom_offset = v.offset;
  for (int j = 0; j < map.rank; ++j) {
    const MapEntry& e = map.e[j];
    in.dom_offset += e.start * v.stride[j];
    if (e.axis >= 0 && e.step != 0 && v.stride[j] != 0) {
      in.dom_stride[e.axis] += e.step * v.stride[j];
      in.vary |= 1u << e.axis;
    }
  }
  *inst = add_inst(stage, std::move(in));
  return Status::ok();
}

Status Encoder::materialize(int node, View* ws) {
  for (auto& [n, w] : materialized_) {
    if (n == node) {
      *ws = w.view;
      return Status::ok();
    }
  }
  const Node& nd = def_.nodes[node];
  int slot = static_cast<int>(inputs_.size() + outputs_.size() + workspaces_.size());
  View v = contiguous_view(slot, ctype_dtype(compute_type(nd.dtype)), shape_of(b_, node));
  workspaces_.push_back(Workspace{slot, v});
  materialized_.push_back({node, Workspace{slot, v}});
  computing_root_ = node;
  DVM_RETURN_IF_ERROR(add_sink(node, v, /*joinable=*/false));
  *ws = v;
  return Status::ok();
}

// A reduction shares a matmul's tile (a single pass, row-wise: softmax of x @ W) when it
// reduces the matmul output's last axis and a whole row fits one tile.
bool Encoder::reduce_fits_matmul_tile(int node) const {
  const Node& n = def_.nodes[node];
  const CShape& in = shape_of(b_, n.inputs[0]);
  return in.rank >= 2 && n.attr.size() == 1 && n.attr[0] == in.rank - 1 &&
         in.d[in.rank - 1] <= kMaxMatmulRow;
}

// Marks the matmuls that feed, through elementwise ops, a reduction that cannot share their
// tile.
void Encoder::plan_matmuls() {
  mm_alone_.assign(def_.nodes.size(), 0);
  for (size_t r = 0; r < def_.nodes.size(); ++r) {
    if (def_.nodes[r].kind != OpKind::kReduce || reduce_fits_matmul_tile(static_cast<int>(r)))
      continue;
    std::vector<int> todo = {def_.nodes[r].inputs[0]};
    while (!todo.empty()) {
      int x = todo.back();
      todo.pop_back();
      const Node& n = def_.nodes[x];
      if (n.kind == OpKind::kMatMul) mm_alone_[x] = 1;
      bool elementwise = n.kind == OpKind::kUnary || n.kind == OpKind::kBinary ||
                         n.kind == OpKind::kSelect || n.kind == OpKind::kCast;
      if (elementwise) todo.insert(todo.end(), n.inputs.begin(), n.inputs.end());
    }
  }
}

Status Encoder::visit_reshape(int stage, int node, const NodeMap& map, int* inst) {
  const Node& n = def_.nodes[node];
  const CShape& out = shape_of(b_, node);
  const CShape& in = shape_of(b_, n.inputs[0]);
  // Only size-1 dims inserted or removed: remap the non-1 dims in order.
  int nin = 0, nout = 0;
  int64_t din[kMaxRank], dout[kMaxRank];
  int iout[kMaxRank];
  for (int i = 0; i < in.rank; ++i)
    if (in.d[i] != 1) din[nin++] = in.d[i];
  for (int i = 0; i < out.rank; ++i)
    if (out.d[i] != 1) {
      iout[nout] = i;
      dout[nout++] = out.d[i];
    }
  bool squeeze_only = nin == nout && std::equal(din, din + nin, dout);
  if (squeeze_only && in.numel() != 0) {
    NodeMap m;
    m.rank = in.rank;
    int k = 0;
    // A removed 1-dim takes the map of an inserted 1-dim at the same place when there is one
    // (keepdims reductions squeezed and unsqueezed again keep their broadcast axis).
    std::vector<int> ones_out;
    for (int i = 0; i < out.rank; ++i)
      if (out.d[i] == 1) ones_out.push_back(i);
    size_t next_one = 0;
    for (int i = 0; i < in.rank; ++i) {
      if (in.d[i] != 1) {
        m.e[i] = map.e[iout[k++]];
      } else if (next_one < ones_out.size()) {
        m.e[i] = MapEntry{map.e[ones_out[next_one++]].axis, 0, 0};
      } else {
        m.e[i] = MapEntry{-1, 0, 0};
      }
    }
    return visit(stage, n.inputs[0], m, inst);
  }
  View v;
  if (resolve_view(node, &v)) return load_inst(stage, node, v, map, inst);
  View ws;
  DVM_RETURN_IF_ERROR(materialize(n.inputs[0], &ws));
  View r;
  if (!reshape_view(ws, out, &r)) return internal_error("reshape of a contiguous workspace");
  return load_inst(stage, node, r, map, inst);
}

// A reduction with too few outputs to give every thread a block, over enough elements to be
// worth it, is split: blocks reduce contiguous shares into a workspace of partials, and a
// later stage combines them in a fixed order (deterministic for any thread count).
// The decision and the number of parts depend only on shapes, never on the thread count, so
// results are bitwise identical however many threads run them.
bool Encoder::should_split(int stage, int node) const {
  const Node& n = def_.nodes[node];
  if (stages_[stage].partial) return false;
  if (n.reduce_op() == ReduceOp::kArgMax || n.reduce_op() == ReduceOp::kArgMin) return false;
  int64_t in = shape_of(b_, n.inputs[0]).numel(), out = shape_of(b_, node).numel();
  return out > 0 && in >= kSplitMinElems && out < kSplitParts;
}

Status Encoder::visit_split_reduce(int stage, int node, const NodeMap& map, int* inst) {
  if (stages_[stage].has_reduce) {  // the combine needs its own reduction axis
    View ws;
    DVM_RETURN_IF_ERROR(materialize(node, &ws));
    return load_inst(stage, node, ws, map, inst);
  }
  const Node& n = def_.nodes[node];
  const CShape& out = shape_of(b_, node);
  const int64_t parts = kSplitParts;
  stages_.emplace_back();
  int ps = static_cast<int>(stages_.size()) - 1;
  stages_[ps].partial = true;
  int gaxis = new_axis(ps, parts);
  stages_[ps].split_axis = gaxis;
  stages_[ps].axes[gaxis].grid_only = stages_[ps].axes[gaxis].no_fold = true;
  NodeMap pm;
  pm.rank = out.rank;
  for (int i = 0; i < out.rank; ++i) {
    int a = new_axis(ps, out.d[i]);
    pm.e[i] = out.d[i] == 1 ? MapEntry{a, 0, 0} : MapEntry{a, 0, 1};
  }
  int pinst;
  DVM_RETURN_IF_ERROR(visit(ps, node, pm, &pinst));
  CShape ws_shape;
  ws_shape.rank = out.rank + 1;
  ws_shape.d[0] = parts;
  for (int i = 0; i < out.rank; ++i) ws_shape.d[i + 1] = out.d[i];
  int slot = static_cast<int>(inputs_.size() + outputs_.size() + workspaces_.size());
  View wv = contiguous_view(slot, ctype_dtype(compute_type(n.dtype)), ws_shape);
  workspaces_.push_back(Workspace{slot, wv});
  Sink sink;
  sink.inst = pinst;
  sink.slot = slot;
  sink.dtype = wv.dtype;
  sink.dom_stride[gaxis] = wv.stride[0];
  for (int i = 0; i < out.rank; ++i)
    if (out.d[i] != 1) sink.dom_stride[pm.e[i].axis] = wv.stride[i + 1];
  stages_[ps].insts[pinst].uses++;
  stages_[ps].sinks.push_back(sink);
  order_.push_back(ps);
  // Combine: reduce the partials over a new axis of this stage.
  int raxis = new_axis(stage, parts);
  if (raxis < 0) return unimplemented(def_.name + ": too many iteration axes");
  Stage& st = stages_[stage];
  st.axes[raxis].reduced = true;
  st.has_reduce = true;
  st.reduce_set = 1u << raxis;
  NodeMap lm;
  lm.rank = out.rank + 1;
  lm.e[0] = MapEntry{raxis, 0, 1};
  for (int i = 0; i < out.rank; ++i) lm.e[i + 1] = map.e[i];
  int load;
  DVM_RETURN_IF_ERROR(load_inst(stage, node, wv, lm, &load));
  Inst r;
  r.node = node;
  r.map = map;
  r.kind = InstKind::kReduce;
  r.inputs = {load};
  r.reduced = 1u << raxis;
  r.vary = stages_[stage].insts[load].vary & ~r.reduced;
  *inst = add_inst(stage, std::move(r));
  return Status::ok();
}

Status Encoder::visit_reduce(int stage, int node, const NodeMap& map, int* inst) {
  const Stage& ms = stages_[stage];
  bool row_reduce = ms.has_matmul && reduce_fits_matmul_tile(node) &&
                    (!ms.has_reduce || ms.reduce_set == (1u << ms.mm_n)) &&
                    def_.nodes[node].keepdims && map.e[map.rank - 1].axis == ms.mm_n;
  if (ms.has_matmul && !row_reduce) {  // a matmul stage's tiles never loop: reduce elsewhere
    View ws;
    DVM_RETURN_IF_ERROR(materialize(node, &ws));
    return load_inst(stage, node, ws, map, inst);
  }
  if (should_split(stage, node)) return visit_split_reduce(stage, node, map, inst);
  const Node& n = def_.nodes[node];
  const CShape& in = shape_of(b_, n.inputs[0]);
  Stage& st = stages_[stage];
  const size_t axes_before = st.axes.size();
  NodeMap im;
  im.rank = in.rank;
  uint32_t reduced = 0;
  int k = 0;
  for (int i = 0; i < in.rank; ++i) {
    bool red = std::find(n.attr.begin(), n.attr.end(), i) != n.attr.end();
    if (!red) {
      im.e[i] = map.e[k++];
      continue;
    }
    int axis = -1;
    if (n.keepdims) {
      const MapEntry& e = map.e[k++];
      if (e.axis >= 0 && st.axes[e.axis].extent == in.d[i]) axis = e.axis;
    }
    if (axis < 0 || (reduced >> axis & 1)) axis = new_axis(stage, in.d[i]);
    if (axis < 0) return unimplemented(def_.name + ": too many iteration axes");
    reduced |= 1u << axis;
    im.e[i] = in.d[i] == 1 ? MapEntry{axis, 0, 0} : MapEntry{axis, 0, 1};
  }
  Stage& s2 = stages_[stage];
  // A partial stage splits its loops between blocks, so it can hold only one reduction level.
  if (s2.has_reduce && (s2.reduce_set != reduced || s2.partial)) {
    // A second reduction over other axes cannot share the accumulators: split the stage.
    // Drop the reduced axes just added for it: nothing in this stage iterates them, and a
    // leftover axis would make every block redo (and race on) the whole stage.
    s2.axes.resize(axes_before);
    View ws;
    DVM_RETURN_IF_ERROR(materialize(node, &ws));
    return load_inst(stage, node, ws, map, inst);
  }
  s2.has_reduce = true;
  s2.reduce_set = reduced;
  bool arg = n.reduce_op() == ReduceOp::kArgMax || n.reduce_op() == ReduceOp::kArgMin;
  for (int a = 0; a < kMaxDomAxes; ++a) {
    if (reduced >> a & 1) {
      s2.axes[a].reduced = true;
      s2.axes[a].no_fold |= arg;
    }
  }
  int child;
  DVM_RETURN_IF_ERROR(visit(stage, n.inputs[0], im, &child));
  Inst r;
  r.node = node;
  r.map = map;
  r.kind = InstKind::kReduce;
  r.inputs = {child};
  r.reduced = reduced;
  r.vary = stages_[stage].insts[child].vary & ~reduced;
  *inst = add_inst(stage, std::move(r));
  return Status::ok();
}

// A matmul operand must be addressable memory: a view of an input, else a workspace.
Status Encoder::operand_view(int node, View* v) {
  if (resolve_view(node, v)) return Status::ok();
  return materialize(node, v);
}

// Whether a map entry walks its domain axis plainly (index = dom[axis]), as tile axes must.
bool plain_entry(const MapEntry& e, int64_t extent) {
  return e.axis >= 0 && e.start == 0 && (e.step == 1 || (extent == 1 && e.step == 0));
}

Status Encoder::visit_matmul(int stage, int node, const NodeMap& map, int* inst) {
  const Node& n = def_.nodes[node];
  const CShape& out = shape_of(b_, node);
  const int r = out.rank;
  const MapEntry em = map.e[r - 2];
  const MapEntry en = map.e[r - 1];
  const Stage& st = stages_[stage];
  bool alone = mm_alone_[node] && computing_root_ != node;
  if (computing_root_ == node) computing_root_ = -1;
  bool reduce_ok =
      !st.has_reduce || (st.reduce_set == (1u << en.axis) && out.d[r - 1] <= kMaxMatmulRow);
  bool fits = !alone && reduce_ok && plain_entry(em, out.d[r - 2]) &&
              plain_entry(en, out.d[r - 1]) && em.axis != en.axis &&
              (!st.has_matmul || (st.mm_m == em.axis && st.mm_n == en.axis));
  for (int i = 0; i < r - 2; ++i) fits &= map.e[i].start == 0 && map.e[i].step >= 0;
  if (!fits) {  // not the stage's tile (or the stage reduces): compute it in its own stage
    View ws;
    DVM_RETURN_IF_ERROR(materialize(node, &ws));
    return load_inst(stage, node, ws, map, inst);
  }
  if (shape_of(b_, n.inputs[0]).d[shape_of(b_, n.inputs[0]).rank - 1] == 0) {
    Inst zero;  // an empty contraction: zeros (a scalar constant of the matmul node: 0)
    zero.node = node;
    zero.kind = InstKind::kScalar;
    *inst = add_inst(stage, std::move(zero));
    return Status::ok();
  }
  const auto& existing = stages_[stage].insts;
  for (size_t i = 0; i < existing.size(); ++i) {  // visited before: reuse (and its K axis)
    if (existing[i].kind == InstKind::kMatMul && existing[i].node == node &&
        existing[i].map == map) {
      *inst = static_cast<int>(i);
      return Status::ok();
    }
  }
  View va, vb;
  DVM_RETURN_IF_ERROR(operand_view(n.inputs[0], &va));
  DVM_RETURN_IF_ERROR(operand_view(n.inputs[1], &vb));
  const int64_t k = va.shape.d[va.shape.rank - 1];
  int kaxis = new_axis(stage, k);
  if (kaxis < 0) return unimplemented(def_.name + ": too many iteration axes");
  Stage& s = stages_[stage];
  s.has_matmul = true;
  s.mm_m = em.axis;
  s.mm_n = en.axis;
  s.axes[em.axis].mm_role = 1;
  s.axes[en.axis].mm_role = 2;
  s.axes[kaxis].mm_role = 3;
  s.axes[em.axis].no_fold = s.axes[en.axis].no_fold = s.axes[kaxis].no_fold = true;
  // Operand maps: batch dims broadcast against the output's; M/N from the output; K shared.
  auto operand_map = [&](const View& v, bool is_a) {
    NodeMap m;
    m.rank = v.shape.rank;
    int off = r - v.shape.rank;
    for (int i = 0; i < v.shape.rank - 2; ++i) {
      const MapEntry& e = map.e[i + off];
      m.e[i] = v.shape.d[i] == 1 ? MapEntry{e.axis, 0, 0} : e;
    }
    MapEntry kk{kaxis, 0, 1};
    m.e[v.shape.rank - 2] = is_a ? em : kk;
    m.e[v.shape.rank - 1] = is_a ? kk : en;
    return m;
  };
  int ia, ib;
  DVM_RETURN_IF_ERROR(load_inst(stage, n.inputs[0], va, operand_map(va, true), &ia));
  DVM_RETURN_IF_ERROR(load_inst(stage, n.inputs[1], vb, operand_map(vb, false), &ib));
  Inst mm;
  mm.node = node;
  mm.map = map;
  mm.kind = InstKind::kMatMul;
  mm.inputs = {ia, ib};
  mm.contract = kaxis;
  const auto& insts = stages_[stage].insts;
  mm.vary = (insts[ia].vary | insts[ib].vary) & ~(1u << kaxis);
  *inst = add_inst(stage, std::move(mm));
  return Status::ok();
}

Status Encoder::visit(int stage, int node, const NodeMap& map, int* inst) {
  const Node& n = def_.nodes[node];
  switch (n.kind) {
    case OpKind::kLoad:
      return load_inst(stage, node, arg_view(n.slot, inputs_[n.slot]), map, inst);
    case OpKind::kParam:
    case OpKind::kConst: {
      Inst s;
      s.node = node;
      s.kind = InstKind::kScalar;
      *inst = add_inst(stage, std::move(s));
      return Status::ok();
    }
    case OpKind::kUnary:
    case OpKind::kCast:
    case OpKind::kBinary:
    case OpKind::kSelect: {
      Inst c;
      c.node = node;
      c.map = map;
      for (int in : n.inputs) {
        int child;
        DVM_RETURN_IF_ERROR(visit(stage, in, broadcast_map(node, in, map), &child));
        c.inputs.push_back(child);
        c.vary |= stages_[stage].insts[child].vary;
      }
      *inst = add_inst(stage, std::move(c));
      return Status::ok();
    }
    case OpKind::kBroadcast:
      return visit(stage, n.inputs[0], broadcast_map(node, n.inputs[0], map), inst);
    case OpKind::kPermute: {
      NodeMap m;
      m.rank = map.rank;
      for (int i = 0; i < map.rank; ++i) m.e[n.attr[i]] = map.e[i];
      return visit(stage, n.inputs[0], m, inst);
    }
    case OpKind::kSlice: {
      NodeMap m = map;
      int axis = static_cast<int>(n.attr[0]);
      ir::SliceBounds sb = ir::slice_bounds(n, shape_of(b_, n.inputs[0]).d[axis]);
      m.e[axis].start = sb.start + sb.step * map.e[axis].start;
      m.e[axis].step = sb.step * map.e[axis].step;
      return visit(stage, n.inputs[0], m, inst);
    }
    case OpKind::kReshape:
      return visit_reshape(stage, node, map, inst);
    case OpKind::kConcat: {
      View ws;
      DVM_RETURN_IF_ERROR(materialize(node, &ws));
      return load_inst(stage, node, ws, map, inst);
    }
    case OpKind::kReduce:
      return visit_reduce(stage, node, map, inst);
    case OpKind::kMatMul:
      return visit_matmul(stage, node, map, inst);
  }
  return internal_error("unknown op kind");
}

}  // namespace

namespace {

// ---- domain layout ---------------------------------------------------------------------

struct FinalAxis {
  int64_t extent = 1;
  bool reduced = false;
  bool no_fold = false;
  bool grid_only = false;
  int8_t mm_role = 0;
  uint32_t orig = 0;  // original domain axes merged into this one
  int inner = -1;     // the innermost of them: the folded axis walks with its stride
};

struct Layout {
  std::vector<FinalAxis> axes;  // outer to inner
  int final_of[kMaxDomAxes];    // original axis -> final axis (-1: dropped, extent 1)
  int row = -1, col = -1;
  bool loop_mode = false;
  std::vector<bc::Axis> bc_axes;
};

struct StrideSet {
  const int64_t* strides;  // per original domain axis
};

int64_t order_key(int64_t stride) {
  return stride == 0 ? INT64_MAX : (stride < 0 ? -stride : stride);
}

std::vector<int> order_axes(const Stage& st, const std::vector<StrideSet>& sets, int ref) {
  std::vector<int> live;
  for (size_t a = 0; a < st.axes.size(); ++a)
    if (st.axes[a].extent != 1 || st.axes[a].mm_role != 0) live.push_back(static_cast<int>(a));
  if (ref >= 0) {
    const int64_t* s = sets[ref].strides;
    std::stable_sort(live.begin(), live.end(),
                     [&](int x, int y) { return order_key(s[x]) > order_key(s[y]); });
  }
  // A matmul's contraction axis first (it is walked inside the instruction), M and N last:
  // they are the tile's rows and columns.
  auto rank_of = [&](int a) {
    int role = st.axes[a].mm_role;
    return role == 3 ? 0 : role == 1 ? 2 : role == 2 ? 3 : 1;
  };
  std::stable_sort(live.begin(), live.end(), [&](int x, int y) { return rank_of(x) < rank_of(y); });
  return live;
}

bool can_fold(const std::vector<StrideSet>& sets, int outer, int inner, int64_t inner_extent) {
  for (const StrideSet& s : sets)
    if (s.strides[outer] != s.strides[inner] * inner_extent) return false;
  return true;
}

// Orders the live axes (innermost = smallest stride of the widest access) and folds adjacent
// axes whose every access is contiguous across them.
void fold_axes(const Stage& st, const std::vector<StrideSet>& sets, int ref, Layout* L) {
  std::fill(std::begin(L->final_of), std::end(L->final_of), -1);
  std::vector<int> order = order_axes(st, sets, ref);
  std::vector<std::vector<int>> groups;
  for (int a : order) {
    if (!groups.empty()) {
      int prev = groups.back().front();  // fold rule checked against the group's outer axis
      int inner_of_prev = groups.back().back();
      const DomAxis& pa = st.axes[prev];
      const DomAxis& xa = st.axes[a];
      int64_t ext = xa.extent;
      if (pa.reduced == xa.reduced && !pa.no_fold && !xa.no_fold &&
          can_fold(sets, inner_of_prev, a, ext)) {
        groups.back().push_back(a);
        continue;
      }
    }
    groups.push_back({a});
  }
  for (auto& g : groups) {
    FinalAxis f;
    f.reduced = st.axes[g[0]].reduced;
    f.no_fold = st.axes[g[0]].no_fold;
    f.grid_only = st.axes[g[0]].grid_only;
    f.mm_role = st.axes[g[0]].mm_role;
    f.inner = g.back();
    for (int a : g) {
      f.extent *= st.axes[a].extent;
      f.orig |= 1u << a;
      L->final_of[a] = static_cast<int>(L->axes.size());
    }
    L->axes.push_back(f);
  }
}

int64_t round16(int64_t x) {
  return (x + 15) / 16 * 16;
}

int64_t grid_size(const Layout& L, const std::vector<int64_t>& chunk) {
  int64_t g = 1;
  for (size_t a = 0; a < L.axes.size(); ++a) {
    if (L.axes[a].reduced || L.axes[a].mm_role == 3) continue;
    int64_t e = L.axes[a].extent;
    g *= e == 0 ? 0 : (e + chunk[a] - 1) / chunk[a];
  }
  return g;
}

// Picks the tile (rows x cols), chunk sizes and which axes the grid or loops walk.
// A matmul stage's tile is the GEMM kernel's preferred output block, shrunk for parallelism.
void choose_matmul_tiling(Layout* L, int threads) {
  int n = static_cast<int>(L->axes.size());
  std::vector<int64_t> chunk(n, 1);
  for (int a = 0; a < n; ++a) {
    if (L->axes[a].mm_role == 1) L->row = a;
    if (L->axes[a].mm_role == 2) L->col = a;
  }
  vm::cpu::GemmTile t = vm::cpu::gemm_preferred_tile();
  vm::cpu::GemmTile micro = vm::cpu::gemm_micro_tile();
  // Equal chunks (rounded up to the micro-tile) rather than full tiles plus a small tail:
  // blocks are dealt to threads in contiguous ranges, so a 112 + 16 row split of M = 128
  // would leave one thread idle most of the time.
  auto balanced = [](int64_t extent, int64_t pref, int64_t align) {
    if (extent <= pref) return std::max<int64_t>(1, extent);
    int64_t parts = (extent + pref - 1) / pref;
    int64_t c = (extent + parts - 1) / parts;
    return std::min(pref, (c + align - 1) / align * align);
  };
  chunk[L->row] = balanced(L->axes[L->row].extent, t.m, micro.m);
  chunk[L->col] = balanced(L->axes[L->col].extent, t.n, 16);
  // A row-wise reduction in the tile needs whole rows (a single pass).
  if (L->axes[L->col].reduced) chunk[L->col] = std::max<int64_t>(1, L->axes[L->col].extent);
  while (grid_size(*L, chunk) < 2 * threads) {
    if (chunk[L->row] >= 32) {
      chunk[L->row] = (chunk[L->row] + 1) / 2;
    } else if (chunk[L->col] >= 64) {
      chunk[L->col] = round16(chunk[L->col] / 2);
    } else {
      break;
    }
  }
  L->loop_mode = false;
  for (int a = 0; a < n; ++a) {
    bc::Axis ax;
    ax.extent = L->axes[a].extent;
    ax.chunk = chunk[a];
    ax.tile = a == L->col   ? bc::AxisTile::kCol
              : a == L->row ? bc::AxisTile::kRow
                            : bc::AxisTile::kNone;
    ax.iter = L->axes[a].mm_role == 3 ? bc::AxisIter::kContract : bc::AxisIter::kGrid;
    L->bc_axes.push_back(ax);
  }
}

void choose_tiling(Layout* L, int threads, bool partial) {
  for (const FinalAxis& f : L->axes) {
    if (f.mm_role != 0) {
      choose_matmul_tiling(L, threads);
      return;
    }
  }
  std::vector<int> cand;
  for (size_t a = 0; a < L->axes.size(); ++a)
    if (!L->axes[a].grid_only) cand.push_back(static_cast<int>(a));
  if (cand.empty()) {  // a scalar stage: one 1x1 tile
    L->axes.push_back(FinalAxis{});
    cand.push_back(static_cast<int>(L->axes.size()) - 1);
  }
  int n = static_cast<int>(L->axes.size());
  L->col = cand.back();
  L->row = cand.size() >= 2 ? cand[cand.size() - 2] : -1;
  std::vector<int64_t> chunk(n, 1);
  const FinalAxis& c = L->axes[L->col];
  // A partial (split) reduction must loop so that its trips can be shared between blocks.
  int64_t single_pass_limit = partial ? 0 : kMaxReduceChunk;
  chunk[L->col] = c.reduced ? (c.extent <= single_pass_limit ? c.extent : kTileElems)
                            : std::min(c.extent, kTileElems);
  chunk[L->col] = std::max<int64_t>(1, chunk[L->col]);
  if (L->row >= 0) {
    int64_t cap = std::max<int64_t>(1, kTileElems / round16(chunk[L->col]));
    chunk[L->row] = std::max<int64_t>(1, std::min(L->axes[L->row].extent, cap));
  }
  // Enough blocks for every thread (and some slack for balance), not tiles too small to
  // amortise dispatch.
  while (grid_size(*L, chunk) < 4 * threads) {
    if (!L->axes[L->col].reduced && chunk[L->col] >= 1024) {
      chunk[L->col] = round16(chunk[L->col] / 2);
    } else if (L->row >= 0 && !L->axes[L->row].reduced && chunk[L->row] >= 2 &&
               chunk[L->row] * chunk[L->col] >= 1024) {
      chunk[L->row] /= 2;
    } else {
      break;
    }
  }
  L->loop_mode = false;
  for (int a = 0; a < n; ++a) {
    const FinalAxis& f = L->axes[a];
    if (!f.reduced) continue;
    bool tile = a == L->row || a == L->col;
    if (!tile || f.extent == 0 || (f.extent + chunk[a] - 1) / chunk[a] > 1) L->loop_mode = true;
  }
  for (int a = 0; a < n; ++a) {
    bc::Axis ax;
    ax.extent = L->axes[a].extent;
    ax.chunk = chunk[a];
    ax.tile = a == L->col   ? bc::AxisTile::kCol
              : a == L->row ? bc::AxisTile::kRow
                            : bc::AxisTile::kNone;
    ax.iter = L->axes[a].reduced && L->loop_mode ? bc::AxisIter::kLoop : bc::AxisIter::kGrid;
    L->bc_axes.push_back(ax);
  }
  if (!partial) return;
  int split = -1;
  for (int a = 0; a < n; ++a)
    if (L->axes[a].grid_only) split = a;
  for (int a = 0; a < n && split >= 0; ++a) {
    if (L->bc_axes[a].iter == bc::AxisIter::kLoop) {  // the outermost loop is shared out
      L->bc_axes[a].split_by = static_cast<int8_t>(split);
      break;
    }
  }
}

}  // namespace

namespace {

// ---- scheduling and emission -----------------------------------------------------------

bool is_predicate(UnaryOp op) {
  return op == UnaryOp::kIsFinite || op == UnaryOp::kIsNan || op == UnaryOp::kLogicalNot;
}

class Emitter {
 public:
  Emitter(const ir::KernelDef& def, const ir::Binding& b, Stage& st, Layout& L, int num_slots)
      : def_(def), b_(b), st_(st), L_(L) {
    prog_.num_slots = num_slots;
    prog_.num_params = static_cast<int>(def.param_names.size());
    vreg_.assign(st.insts.size(), -1);
    direct_.assign(st.insts.size(), -1);
    operand_.resize(st.insts.size());
  }

  Status emit();
  bc::Program& program() { return prog_; }
  int64_t bytes_moved() const { return bytes_; }

 private:
  uint32_t final_mask(uint32_t orig) const {
    uint32_t m = 0;
    for (int a = 0; a < kMaxDomAxes; ++a)
      if ((orig >> a & 1) && L_.final_of[a] >= 0) m |= 1u << L_.final_of[a];
    return m;
  }
  TileClass class_of(int i) const {
    uint32_t m = final_mask(st_.insts[i].vary);
    return bc::make_class(L_.row >= 0 && (m >> L_.row & 1), m >> L_.col & 1);
  }
  bool r_varying(int i) const { return final_mask(st_.insts[i].vary) & reduced_mask_; }
  CType ctype_of(int i) const { return compute_type(def_.nodes[st_.insts[i].node].dtype); }
  int add_desc(int slot, DType dtype, int64_t offset, const int64_t* dom_stride);
  int new_vreg() { return num_vregs_++; }
  void push(bc::Opcode op, CType t, TileClass cls, uint16_t aux, Operand d, Operand a = {},
            Operand b = {}, Operand c = {}) {
    code_.push_back(bc::Instr{op, t, cls, 0, aux, d, a, b, c});
  }
  int add_const(double f, int64_t i);
  Operand ensure(int i);
  Operand emit_compute(int i);
  Operand emit_cast(int i, Operand src);
  void emit_reduce_begin(int i);
  void emit_reduce_step(int i);
  Operand emit_reduce_end(int i);
  void emit_store(const Sink& s);
  void compute_levels();
  void emit_single_pass();
  void emit_loop_passes();
  void emit_pass_body(int pass);
  bool needed_in_pass(int i, int pass) const;
  void direct_store_peephole();
  void fma_peephole();
  void dot_peephole();
  void fit_tile_to_cache();
  Status allocate_registers();

  const ir::KernelDef& def_;
  const ir::Binding& b_;
  Stage& st_;
  Layout& L_;
  bc::Program prog_;
  std::vector<bc::Instr> code_;
  std::vector<int> vreg_;    // inst -> vreg holding its value in the current scope
  std::vector<int> direct_;  // inst -> descriptor read directly (loads)
  std::vector<Operand> operand_;
  std::vector<int> acc_idx_;  // reduce inst -> index accumulator vreg (arg reductions)
  std::vector<int> sink_desc_;
  int num_vregs_ = 0;
  uint32_t reduced_mask_ = 0;
  int max_level_ = 0;
  int64_t bytes_ = 0;
};

int Emitter::add_desc(int slot, DType dtype, int64_t offset, const int64_t* dom_stride) {
  bc::Descriptor d;
  d.slot = static_cast<uint16_t>(slot);
  d.dtype = dtype;
  d.offset = offset;
  int64_t touched = 1;
  for (int a = 0; a < kMaxDomAxes; ++a) {
    int f = L_.final_of[a];
    if (f < 0 || dom_stride[a] == 0) continue;
    d.stride[f] = dom_stride[L_.axes[f].inner];  // a folded axis walks like its innermost
  }
  for (size_t f = 0; f < L_.axes.size(); ++f)
    if (d.stride[f] != 0) touched *= L_.axes[f].extent;
  bytes_ += touched * dtype_size(dtype);
  prog_.descs.push_back(d);
  return static_cast<int>(prog_.descs.size()) - 1;
}

int Emitter::add_const(double f, int64_t i) {
  bc::Constant c;
  c.f32 = static_cast<float>(f);
  c.i32 = static_cast<int32_t>(static_cast<uint64_t>(i));
  c.i64 = i;
  prog_.consts.push_back(c);
  return static_cast<int>(prog_.consts.size()) - 1;
}

Operand Emitter::ensure(int i) {
  const Inst& in = st_.insts[i];
  if (vreg_[i] >= 0) return operand_[i];
  const Node& n = def_.nodes[in.node];
  if (in.kind == InstKind::kScalar) {
    if (n.kind == OpKind::kParam) return Operand::param(n.slot);
    return Operand::constant(add_const(n.fconst, n.iconst));
  }
  if (in.kind == InstKind::kLoad) {
    if (direct_[i] < 0)
      direct_[i] = add_desc(in.view.slot, in.view.dtype, in.dom_offset, in.dom_stride);
    const bc::Descriptor& d = prog_.descs[direct_[i]];
    int64_t cs = d.stride[L_.col];
    bool direct = in.view.dtype == ctype_dtype(ctype_of(i)) && (cs == 0 || cs == 1);
    if (direct) return Operand::desc(direct_[i]);
    Operand dst = Operand::reg(new_vreg(), class_of(i));
    push(bc::Opcode::kLoad, ctype_of(i), class_of(i), 0, dst, Operand::desc(direct_[i]));
    vreg_[i] = dst.index;
    operand_[i] = dst;
    return dst;
  }
  if (in.kind == InstKind::kMatMul) {
    const Inst& a = st_.insts[in.inputs[0]];
    const Inst& b = st_.insts[in.inputs[1]];
    int da = add_desc(a.view.slot, a.view.dtype, a.dom_offset, a.dom_stride);
    int db = add_desc(b.view.slot, b.view.dtype, b.dom_offset, b.dom_stride);
    Operand dst = Operand::reg(new_vreg(), class_of(i));
    push(bc::Opcode::kMatMul, CType::kF32, class_of(i),
         static_cast<uint16_t>(L_.final_of[in.contract]), dst, Operand::desc(da),
         Operand::desc(db));
    vreg_[i] = dst.index;
    operand_[i] = dst;
    return dst;
  }
  if (in.kind == InstKind::kReduce) {
    if (L_.loop_mode) return operand_[i];  // computed by its pass
    emit_reduce_begin(i);
    emit_reduce_step(i);
    return emit_reduce_end(i);
  }
  Operand r = emit_compute(i);
  vreg_[i] = r.index;
  operand_[i] = r;
  return r;
}

Operand Emitter::emit_cast(int i, Operand src) {
  const Inst& in = st_.insts[i];
  const Node& n = def_.nodes[in.node];
  CType from = ctype_of(in.inputs[0]);
  CType to = compute_type(n.dtype);
  TileClass cls = class_of(i);
  if (n.dtype == DType::kBool) {
    Operand d = Operand::reg(new_vreg(), cls);
    push(bc::Opcode::kBNe, from, cls, 0, d, src, Operand::constant(add_const(0, 0)));
    return d;
  }
  if (from != to) {
    Operand d = Operand::reg(new_vreg(), cls);
    push(bc::Opcode::kCast, from, cls, static_cast<uint16_t>(to), d, src);
    src = d;
  }
  if (n.dtype == DType::kF16 || n.dtype == DType::kBF16) {
    Operand d = Operand::reg(new_vreg(), cls);
    push(n.dtype == DType::kF16 ? bc::Opcode::kRoundF16 : bc::Opcode::kRoundBF16, CType::kF32, cls,
         0, d, src);
    return d;
  }
  if (src.kind != bc::OperandKind::kReg) {
    Operand d = Operand::reg(new_vreg(), cls);  // keep every computed value in a register
    push(bc::Opcode::kMov, to, cls, 0, d, src);
    return d;
  }
  return src;
}

Operand Emitter::emit_compute(int i) {
  const Inst& in = st_.insts[i];
  const Node& n = def_.nodes[in.node];
  Operand srcs[3];
  for (size_t k = 0; k < in.inputs.size(); ++k) srcs[k] = ensure(in.inputs[k]);
  TileClass cls = class_of(i);
  if (n.kind == OpKind::kCast) return emit_cast(i, srcs[0]);
  Operand d = Operand::reg(new_vreg(), cls);
  CType t = ctype_of(in.inputs[0]);
  switch (n.kind) {
    case OpKind::kUnary:
      push(static_cast<bc::Opcode>(bc::kFirstUnary + n.op), t, cls, 0, d, srcs[0]);
      break;
    case OpKind::kBinary: {
      TileClass dc = class_of(in.inputs[1]);
      bool narrow_divisor = n.binary_op() == BinaryOp::kDiv && t == CType::kF32 &&
                            srcs[1].kind == bc::OperandKind::kReg && dc != cls;
      if (narrow_divisor) {
        // x / s with s broadcast along the tile (softmax's row sums): one reciprocal per s,
        // then a multiply per element (division costs several multiplies). Differs from
        // true division by at most one rounding (<= 1 ulp).
        Operand r = Operand::reg(new_vreg(), dc);
        push(bc::Opcode::kUReciprocal, t, dc, 0, r, srcs[1]);
        push(bc::Opcode::kBMul, t, cls, 0, d, srcs[0], r);
        break;
      }
      push(static_cast<bc::Opcode>(bc::kFirstBinary + n.op), t, cls, 0, d, srcs[0], srcs[1]);
      break;
    }
    case OpKind::kSelect:
      push(bc::Opcode::kSelect, ctype_of(i), cls, 0, d, srcs[0], srcs[1], srcs[2]);
      break;
    default:
      break;
  }
  return d;
}

void Emitter::emit_reduce_begin(int i) {
  const Inst& in = st_.insts[i];
  ReduceOp op = def_.nodes[in.node].reduce_op();
  CType t = ctype_of(in.inputs[0]);
  TileClass cls = class_of(i);
  if (op == ReduceOp::kMean) op = ReduceOp::kSum;
  Operand acc = Operand::reg(new_vreg(), cls);
  push(bc::Opcode::kFill, t, cls, bc::reduce_aux(op, false, false), acc);
  vreg_[i] = acc.index;
  operand_[i] = acc;
  if (op == ReduceOp::kArgMax || op == ReduceOp::kArgMin) {
    Operand idx = Operand::reg(new_vreg(), cls);
    push(bc::Opcode::kFill, CType::kI64, cls, bc::reduce_aux(ReduceOp::kSum, false, false), idx);
    acc_idx_[i] = idx.index;
  }
}

void Emitter::emit_reduce_step(int i) {
  const Inst& in = st_.insts[i];
  ReduceOp op = def_.nodes[in.node].reduce_op();
  if (op == ReduceOp::kMean) op = ReduceOp::kSum;
  CType t = ctype_of(in.inputs[0]);
  uint32_t red = final_mask(in.reduced);
  bool rows = L_.row >= 0 && (red >> L_.row & 1);
  bool cols = red >> L_.col & 1;
  Operand src = ensure(in.inputs[0]);
  TileClass sc = class_of(in.inputs[0]);
  TileClass wide = bc::make_class(bc::class_has_rows(sc) || rows, bc::class_has_cols(sc) || cols);
  if (wide != sc) {
    // The input does not vary along a reduced tile axis: broadcast it to the tile first.
    Operand w = Operand::reg(new_vreg(), wide);
    push(bc::Opcode::kMov, t, wide, 0, w, src);
    src = w;
  }
  Operand acc = Operand::reg(vreg_[i], class_of(i));
  if (op == ReduceOp::kArgMax || op == ReduceOp::kArgMin) {
    int axis = 0;
    for (int a = 0; a < static_cast<int>(L_.axes.size()); ++a)
      if (red >> a & 1) axis = a;
    if (red == 0) return;  // reduced axis of extent 1: index 0, as filled
    push(bc::Opcode::kArgReduce, t, wide, bc::reduce_aux(op, rows, cols, axis), acc, src,
         Operand::reg(acc_idx_[i], class_of(i)));
    return;
  }
  push(bc::Opcode::kReduce, t, wide, bc::reduce_aux(op, rows, cols), acc, src);
}

Operand Emitter::emit_reduce_end(int i) {
  const Inst& in = st_.insts[i];
  ReduceOp op = def_.nodes[in.node].reduce_op();
  TileClass cls = class_of(i);
  Operand r = operand_[i];
  if (op == ReduceOp::kArgMax || op == ReduceOp::kArgMin) {
    r = Operand::reg(acc_idx_[i], cls);
  } else if (op == ReduceOp::kMean && !st_.partial) {
    int64_t count = 1;
    const CShape& s = b_.shapes[def_.nodes[in.node].inputs[0]];
    for (int64_t a : def_.nodes[in.node].attr) count *= s.d[a];
    Operand d = Operand::reg(new_vreg(), cls);
    double inv = 1.0 / static_cast<double>(count);  // count 0: inf, and 0 * inf = NaN
    push(bc::Opcode::kBMul, CType::kF32, cls, 0, d, r, Operand::constant(add_const(inv, 0)));
    r = d;
  }
  vreg_[i] = r.index;
  operand_[i] = r;
  return r;
}

void Emitter::emit_store(const Sink& s) {
  Operand src = ensure(s.inst);
  int d = add_desc(s.slot, s.dtype, s.dom_offset, s.dom_stride);
  // The destination may vary along a tile axis the value does not (a broadcast stored): the
  // store walks the destination's tile, reading the value with stride 0 along that axis.
  uint32_t dst = 0;
  for (int a = 0; a < kMaxDomAxes; ++a)
    if (s.dom_stride[a] != 0) dst |= 1u << a;
  dst = final_mask(dst);
  TileClass cls = class_of(s.inst);
  cls = bc::make_class(bc::class_has_rows(cls) || (L_.row >= 0 && (dst >> L_.row & 1)),
                       bc::class_has_cols(cls) || (dst >> L_.col & 1));
  push(bc::Opcode::kStore, ctype_of(s.inst), cls, 0, Operand::desc(d), src);
}

}  // namespace

namespace {

void Emitter::compute_levels() {
  for (size_t i = 0; i < st_.insts.size(); ++i) {
    Inst& in = st_.insts[i];
    int lvl = 0;
    for (int c : in.inputs) lvl = std::max(lvl, st_.insts[c].level);
    in.level = in.kind == InstKind::kReduce ? lvl + 1 : lvl;
    max_level_ = std::max(max_level_, in.level);
  }
}

void Emitter::emit_single_pass() {
  for (const Sink& s : st_.sinks) emit_store(s);
}

void Emitter::emit_pass_body(int pass) {
  std::vector<int> reduces;
  for (size_t i = 0; i < st_.insts.size(); ++i) {
    const Inst& in = st_.insts[i];
    if (in.kind == InstKind::kReduce && in.level == pass + 1)
      reduces.push_back(static_cast<int>(i));
  }
  std::vector<const Sink*> stores;
  for (const Sink& s : st_.sinks)
    if (r_varying(s.inst) && st_.insts[s.inst].level == pass) stores.push_back(&s);
  if (reduces.empty() && stores.empty()) return;
  for (int r : reduces) emit_reduce_begin(r);
  for (size_t i = 0; i < st_.insts.size(); ++i)
    if (r_varying(static_cast<int>(i))) vreg_[i] = -1;
  int loops = 0;
  for (size_t a = 0; a < L_.bc_axes.size(); ++a) {
    if (L_.bc_axes[a].iter != bc::AxisIter::kLoop) continue;
    push(bc::Opcode::kLoop, CType::kF32, TileClass::kScalar, static_cast<uint16_t>(a), Operand{});
    ++loops;
  }
  for (int r : reduces) emit_reduce_step(r);
  for (const Sink* s : stores) emit_store(*s);
  for (int k = 0; k < loops; ++k)
    push(bc::Opcode::kEndLoop, CType::kF32, TileClass::kScalar, 0, Operand{});
  for (size_t i = 0; i < st_.insts.size(); ++i)
    if (r_varying(static_cast<int>(i))) vreg_[i] = -1;
  for (int r : reduces) emit_reduce_end(r);
}

void Emitter::emit_loop_passes() {
  compute_levels();
  for (int pass = 0; pass <= max_level_; ++pass) {
    // Values that do not vary along the reduced axes are computed once, outside the loops.
    for (size_t i = 0; i < st_.insts.size(); ++i) {
      const Inst& in = st_.insts[i];
      if (in.level <= pass && !r_varying(static_cast<int>(i)) && in.kind != InstKind::kReduce)
        ensure(static_cast<int>(i));
    }
    emit_pass_body(pass);
  }
  for (const Sink& s : st_.sinks)
    if (!r_varying(s.inst)) emit_store(s);
}

// Field usage per operand format: bit 0 d, 1 a, 2 b, 3 c.
int used_fields(bc::Opcode op) {
  switch (bc::kOpInfo[static_cast<int>(op)].format) {
    case bc::OperandFormat::kNone:
    case bc::OperandFormat::kAxis:
      return 0;
    case bc::OperandFormat::kDst:
      return 1;
    case bc::OperandFormat::kDstSrc:
      return 3;
    case bc::OperandFormat::kDstSrc2:
      return 7;
    case bc::OperandFormat::kDstSrc3:
      return 15;
  }
  return 0;
}

Operand* field(bc::Instr& in, int k) {
  switch (k) {
    case 0:
      return &in.d;
    case 1:
      return &in.a;
    case 2:
      return &in.b;
    default:
      return &in.c;
  }
}

// Per virtual register: how many instructions read it (accumulators count as read by their
// reductions) and where it is defined (last definition).
void count_uses(const std::vector<bc::Instr>& code, int num_vregs, std::vector<int>* reads,
                std::vector<int>* def_at) {
  reads->assign(num_vregs, 0);
  def_at->assign(num_vregs, -1);
  for (size_t pc = 0; pc < code.size(); ++pc) {
    bc::Instr in = code[pc];
    int used = used_fields(in.op);
    for (int k = 1; k < 4; ++k) {
      Operand* o = field(in, k);
      if ((used >> k & 1) && o->kind == bc::OperandKind::kReg) (*reads)[o->index]++;
    }
    bool acc = in.op == bc::Opcode::kReduce || in.op == bc::Opcode::kArgReduce ||
               in.op == bc::Opcode::kReduceDot;
    if (acc) (*reads)[in.d.index]++;
    if ((used & 1) && in.d.kind == bc::OperandKind::kReg)
      (*def_at)[in.d.index] = static_cast<int>(pc);
  }
}

void drop_dead(const std::vector<bool>& dead, std::vector<bc::Instr>* code) {
  std::vector<bc::Instr> out;
  for (size_t pc = 0; pc < code->size(); ++pc)
    if (!dead[pc]) out.push_back((*code)[pc]);
  *code = std::move(out);
}

bool writes_result(const bc::Instr& in) {
  bc::Family f = bc::kOpInfo[static_cast<int>(in.op)].family;
  if (f == bc::Family::kUnary || f == bc::Family::kBinary) return true;
  return f == bc::Family::kData && in.op != bc::Opcode::kLoad && in.op != bc::Opcode::kStore;
}

CType result_ctype(const bc::Instr& in) {
  if (in.op == bc::Opcode::kCast) return static_cast<CType>(in.aux);
  int op = static_cast<int>(in.op);
  if (op >= bc::kFirstBinary && static_cast<BinaryOp>(op - bc::kFirstBinary) >= BinaryOp::kEq)
    return CType::kI32;
  if (op >= bc::kFirstUnary && op < bc::kFirstBinary &&
      is_predicate(static_cast<UnaryOp>(op - bc::kFirstUnary)))
    return CType::kI32;
  return in.ctype;
}

// A value computed only to be stored is written straight to the output by its last op.
void Emitter::direct_store_peephole() {
  std::vector<int> reads, def_at;
  count_uses(code_, num_vregs_, &reads, &def_at);
  std::vector<bc::Instr> out;
  for (bc::Instr& in : code_) {
    if (in.op == bc::Opcode::kStore && !out.empty() && in.a.kind == bc::OperandKind::kReg) {
      bc::Instr& prev = out.back();
      const bc::Descriptor& d = prog_.descs[in.d.index];
      bool cols_ok = !bc::class_has_cols(in.cls) || d.stride[L_.col] == 1;
      if (writes_result(prev) && prev.d.kind == bc::OperandKind::kReg &&
          prev.d.index == in.a.index && reads[in.a.index] == 1 && prev.cls == in.cls &&
          d.dtype == ctype_dtype(result_ctype(prev)) && cols_ok) {
        prev.d = in.d;
        continue;
      }
    }
    out.push_back(in);
  }
  code_ = std::move(out);
}

// x * y + z with the product used once becomes one fused multiply-add: one pass over the
// tile instead of two (f32 only; the rounding is that of a true FMA).
void Emitter::fma_peephole() {
  std::vector<int> reads, def_at;
  count_uses(code_, num_vregs_, &reads, &def_at);
  std::vector<bool> dead(code_.size(), false);
  for (bc::Instr& in : code_) {
    if (in.op != bc::Opcode::kBAdd || in.ctype != CType::kF32) continue;
    for (int k = 0; k < 2; ++k) {
      Operand prod = k == 0 ? in.a : in.b;
      Operand other = k == 0 ? in.b : in.a;
      if (prod.kind != bc::OperandKind::kReg || reads[prod.index] != 1) continue;
      int at = def_at[prod.index];
      if (at < 0 || dead[at]) continue;
      const bc::Instr& mul = code_[at];
      if (mul.op != bc::Opcode::kBMul || mul.ctype != CType::kF32 || mul.cls != in.cls) continue;
      in = bc::Instr{bc::Opcode::kFma, CType::kF32, in.cls, 0, 0, in.d, mul.a, mul.b, other};
      dead[at] = true;
      break;
    }
  }
  drop_dead(dead, &code_);
}

// sum(x * y) with the product read only by the reduction becomes one reduce.dot pass (the
// variance of layernorm, the sum of squares of rmsnorm): no product tile is written.
void Emitter::dot_peephole() {
  std::vector<int> reads, def_at;
  count_uses(code_, num_vregs_, &reads, &def_at);
  std::vector<bool> dead(code_.size(), false);
  for (bc::Instr& in : code_) {
    if (in.op != bc::Opcode::kReduce || in.ctype != CType::kF32 ||
        bc::aux_reduce_op(in.aux) != ReduceOp::kSum || in.a.kind != bc::OperandKind::kReg ||
        reads[in.a.index] != 1)
      continue;
    int at = def_at[in.a.index];
    if (at < 0 || dead[at]) continue;
    const bc::Instr& mul = code_[at];
    if (mul.op != bc::Opcode::kBMul || mul.ctype != CType::kF32 || mul.cls != in.cls) continue;
    in = bc::Instr{bc::Opcode::kReduceDot, CType::kF32, in.cls, 0, in.aux, in.d, mul.a, mul.b, {}};
    dead[at] = true;
  }
  drop_dead(dead, &code_);
}

// Shrinks parallel tile chunks until the live registers fit the L1 budget.
void Emitter::fit_tile_to_cache() {
  bc::Axis& col = L_.bc_axes[L_.col];
  bc::Axis* row = L_.row >= 0 ? &L_.bc_axes[L_.row] : nullptr;
  auto bytes = [&] {
    return static_cast<int64_t>(std::max(1, prog_.num_regs)) * (row ? row->chunk : 1) *
           round16(col.chunk) * 4;
  };
  while (bytes() > kRegBudgetBytes) {
    if (row && !L_.axes[L_.row].reduced && row->chunk > 1) {
      row->chunk = (row->chunk + 1) / 2;
    } else if (!L_.axes[L_.col].reduced && col.chunk >= 1024) {
      col.chunk = round16(col.chunk / 2);
    } else {
      break;
    }
  }
}

Status Emitter::allocate_registers() {
  int n = num_vregs_;
  std::vector<int> first(n, INT32_MAX), last(n, -1);
  auto touch = [&](int v, int pc) {
    first[v] = std::min(first[v], pc);
    last[v] = std::max(last[v], pc);
  };
  std::vector<std::pair<int, int>> loops;
  std::vector<int> open;
  for (int pc = 0; pc < static_cast<int>(code_.size()); ++pc) {
    bc::Instr& in = code_[pc];
    if (in.op == bc::Opcode::kLoop) open.push_back(pc);
    if (in.op == bc::Opcode::kEndLoop) {
      loops.push_back({open.back(), pc});
      open.pop_back();
    }
    int used = used_fields(in.op);
    for (int k = 0; k < 4; ++k) {
      Operand* o = field(in, k);
      if ((used >> k & 1) && o->kind == bc::OperandKind::kReg) touch(o->index, pc);
    }
  }
  // A value live into a loop stays live for the whole loop (later iterations read it).
  for (auto [ls, le] : loops)
    for (int v = 0; v < n; ++v)
      if (first[v] < ls && last[v] > ls && last[v] < le) last[v] = le;
  std::vector<int> order(n);
  for (int v = 0; v < n; ++v) order[v] = v;
  std::sort(order.begin(), order.end(), [&](int x, int y) { return first[x] < first[y]; });
  std::vector<int> phys(n, -1), busy_until;
  for (int v : order) {
    if (last[v] < 0) continue;
    int r = -1;
    for (size_t p = 0; p < busy_until.size(); ++p)
      if (busy_until[p] < first[v]) {
        r = static_cast<int>(p);
        break;
      }
    if (r < 0) {
      r = static_cast<int>(busy_until.size());
      busy_until.push_back(0);
    }
    busy_until[r] = last[v];
    phys[v] = r;
  }
  if (busy_until.size() > static_cast<size_t>(bc::kMaxOperandIndex))
    return unimplemented(def_.name + ": kernel needs too many tile registers");
  for (bc::Instr& in : code_) {
    int used = used_fields(in.op);
    for (int k = 0; k < 4; ++k) {
      Operand* o = field(in, k);
      if ((used >> k & 1) && o->kind == bc::OperandKind::kReg)
        o->index = static_cast<uint16_t>(phys[o->index]);
    }
    prog_.emit(in);
  }
  prog_.num_regs = static_cast<int>(busy_until.size());
  return Status::ok();
}

Status Emitter::emit() {
  for (int a = 0; a < kMaxDomAxes; ++a)
    if (L_.final_of[a] >= 0 && L_.axes[L_.final_of[a]].reduced)
      reduced_mask_ |= 1u << L_.final_of[a];
  acc_idx_.assign(st_.insts.size(), -1);
  if (L_.loop_mode) {
    emit_loop_passes();
  } else {
    emit_single_pass();
  }
  if (num_vregs_ > bc::kMaxOperandIndex * 4)
    return unimplemented(def_.name + ": kernel too large for one program");
  dot_peephole();
  fma_peephole();
  direct_store_peephole();
  DVM_RETURN_IF_ERROR(allocate_registers());
  if (!st_.has_matmul) fit_tile_to_cache();
  prog_.axes = L_.bc_axes;
  const bc::Axis& col = prog_.axes[L_.col];
  int64_t row_chunk = L_.row >= 0 ? prog_.axes[L_.row].chunk : 1;
  prog_.reg_row_stride = round16(col.chunk);
  if ((prog_.reg_row_stride * 4) % 4096 == 0) prog_.reg_row_stride += 16;  // 4K aliasing
  prog_.reg_elems = std::max<int64_t>(16, row_chunk * prog_.reg_row_stride);
  prog_.grid = 1;
  for (const bc::Axis& ax : prog_.axes)
    if (ax.iter == bc::AxisIter::kGrid) prog_.grid *= ax.trips();
  return Status::ok();
}

}  // namespace

namespace {

std::shared_ptr<vm::LoadedProgram> load_program(bc::Program p) {
  auto lp = std::make_shared<vm::LoadedProgram>();
  lp->program = std::move(p);
  const bc::Program& prog = lp->program;
  lp->instrs.reserve(prog.num_instrs());
  lp->loop_end.assign(prog.num_instrs(), -1);
  std::vector<int32_t> open;
  for (size_t i = 0; i < prog.num_instrs(); ++i) {
    lp->instrs.push_back(prog.instr(i));
    if (lp->instrs.back().op == bc::Opcode::kLoop) open.push_back(static_cast<int32_t>(i));
    if (lp->instrs.back().op == bc::Opcode::kEndLoop && !open.empty()) {
      lp->loop_end[open.back()] = static_cast<int32_t>(i);
      lp->loop_end[i] = open.back();
      open.pop_back();
    }
  }
  for (size_t a = 0; a < prog.axes.size(); ++a) {
    if (prog.axes[a].tile == bc::AxisTile::kRow) lp->row_axis = static_cast<int>(a);
    if (prog.axes[a].tile == bc::AxisTile::kCol) lp->col_axis = static_cast<int>(a);
  }
  return lp;
}

}  // namespace

Status Encoder::emit_stage(int stage, EncodedKernel* out) {
  Stage& st = stages_[stage];
  std::vector<StrideSet> sets;
  int ref = -1, best = -1;
  for (const Inst& in : st.insts) {
    if (in.kind != InstKind::kLoad) continue;
    int nz = __builtin_popcount(in.vary);
    if (nz > best) {
      best = nz;
      ref = static_cast<int>(sets.size());
    }
    sets.push_back(StrideSet{in.dom_stride});
  }
  for (const Sink& s : st.sinks) {
    int nz = 0;
    for (int a = 0; a < kMaxDomAxes; ++a) nz += s.dom_stride[a] != 0;
    if (nz > best) {
      best = nz;
      ref = static_cast<int>(sets.size());
    }
    sets.push_back(StrideSet{s.dom_stride});
  }
  Layout L;
  fold_axes(st, sets, ref, &L);
  choose_tiling(&L, opt_.num_threads, st.partial);
  int num_slots = static_cast<int>(inputs_.size() + outputs_.size() + workspaces_.size());
  Emitter em(def_, b_, st, L, num_slots);
  DVM_RETURN_IF_ERROR(em.emit());
  bc::Program& prog = em.program();
  prog.name = def_.name + "#" + std::to_string(out->programs.size());
  std::vector<std::pair<int64_t, int64_t>> spans;
  DVM_RETURN_IF_ERROR(bc::verify(prog, &spans));
  for (size_t s = 0; s < spans.size() && s < out->slot_spans.size(); ++s) {
    auto& u = out->slot_spans[s];
    if (spans[s].first > spans[s].second) continue;
    u.first = std::min(u.first, spans[s].first);
    u.second = std::max(u.second, spans[s].second);
  }
  out->bytes_moved += em.bytes_moved();
  out->programs.push_back(load_program(std::move(prog)));
  return Status::ok();
}

Status Encoder::run(EncodedKernel* out) {
  int ni = static_cast<int>(inputs_.size());
  plan_matmuls();
  for (size_t k = 0; k < def_.outputs.size(); ++k) {
    View v = arg_view(ni + static_cast<int>(k), outputs_[k]);
    DVM_RETURN_IF_ERROR(add_sink(def_.outputs[k].node, v, /*joinable=*/true));
  }
  for (size_t s = 0; s < stages_.size(); ++s)
    if (stages_[s].joinable) order_.push_back(static_cast<int>(s));
  out->num_inputs = ni;
  out->num_outputs = static_cast<int>(outputs_.size());
  size_t slots = inputs_.size() + outputs_.size() + workspaces_.size();
  out->slot_spans.assign(slots, {INT64_MAX, INT64_MIN});
  for (const Workspace& w : workspaces_)
    out->workspace_bytes.push_back(w.view.shape.numel() * dtype_size(w.view.dtype));
  for (int s : order_) DVM_RETURN_IF_ERROR(emit_stage(s, out));
  return Status::ok();
}

Status encode(const ir::KernelDef& def, const ir::Binding& binding,
              std::span<const TensorArg> inputs, std::span<const TensorArg> outputs,
              const EncodeOptions& options, EncodedKernel* out) {
  Encoder e(def, binding, inputs, outputs, options);
  return e.run(out);
}

}  // namespace dvm::enc
