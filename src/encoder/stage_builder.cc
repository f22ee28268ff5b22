// Stage construction: affine maps through views, reductions (split across blocks when
// outputs are few), matmuls (cube/mix), materialisation through workspaces.
#include <algorithm>

#include "encoder/encoder_impl.h"
#include "ops/dtype_rules.h"

namespace dvm::enc {

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

namespace {

const CShape& shape_of(const ir::Binding& b, int node) {
  return b.shapes[node];
}

NodeMap identity_map(const CShape& s) {
  NodeMap m;
  m.rank = s.rank;
  for (int i = 0; i < s.rank; ++i) m.e[i] = s.d[i] == 1 ? MapEntry{i, 0, 0} : MapEntry{i, 0, 1};
  return m;
}

// The map of a value of shape `s` into a stage whose root has the same extents once size-1
// dims are dropped ([S, H] into a stage of [1, S, H]): the non-1 dims in order, each 1-dim on
// a 1-axis of the root where one is left (as visit_reshape maps a squeeze, so that the values
// both reach through a reshape are the same instances). False if the extents differ.
bool squeezed_map(const CShape& s, const CShape& root, NodeMap* m) {
  int axes[kMaxRank], ones[kMaxRank];
  int n_axes = 0, n_ones = 0;
  for (int i = 0; i < root.rank; ++i) (root.d[i] == 1 ? ones[n_ones++] : axes[n_axes++]) = i;
  m->rank = s.rank;
  int k = 0, one = 0;
  for (int i = 0; i < s.rank; ++i) {
    if (s.d[i] != 1) {
      if (k == n_axes || root.d[axes[k]] != s.d[i]) return false;
      m->e[i] = MapEntry{axes[k++], 0, 1};
    } else {
      m->e[i] = one < n_ones ? MapEntry{ones[one++], 0, 0} : MapEntry{-1, 0, 0};
    }
  }
  return k == n_axes;
}

}  // namespace

int Encoder::find_inst(int stage, int node, const NodeMap& map, InstKind kind) const {
  const auto& insts = stages_[stage].insts;
  for (size_t i = 0; i < insts.size(); ++i) {
    if (insts[i].node == node && insts[i].map == map && insts[i].kind == kind)
      return static_cast<int>(i);
  }
  return -1;
}

int Encoder::add_inst(int stage, Inst inst) {
  int existing = find_inst(stage, inst.node, inst.map, inst.kind);
  if (existing >= 0) return existing;
  return push_inst(stage, std::move(inst));
}

// Appends an instance known to be new (no search).
int Encoder::push_inst(int stage, Inst inst) {
  auto& insts = stages_[stage].insts;
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
  // An elementwise expression of a concat: each part's slice of the output is its own
  // sink, on which the concat reads one part in place (no workspace copy of the concat).
  int axis = -1;
  std::vector<int64_t> parts;
  std::vector<char> searched(def_.nodes.size(), 0);
  if (find_concat_split(node, 0, 0, &searched, &axis, &parts) && !reads_reduction(node)) {
    int64_t at = 0;
    for (int64_t len : parts) {
      View v = dst;
      v.shape.d[axis] = len;
      v.offset += at * dst.stride[axis];
      DVM_RETURN_IF_ERROR(add_sink_at(node, v, joinable, axis, at));
      at += len;
    }
    return Status::ok();
  }
  return add_sink_at(node, dst, joinable, -1, 0);
}

// Does the value of `node` involve a reduction or a matmul (whose tiles a split sink would
// cut or compute twice)?
bool Encoder::reads_reduction(int node) const {
  std::vector<char> seen(def_.nodes.size(), 0);
  std::vector<int> todo = {node};
  while (!todo.empty()) {
    const int x = todo.back();
    todo.pop_back();
    if (seen[x]) continue;
    seen[x] = 1;
    const Node& n = def_.nodes[x];
    if (n.kind == OpKind::kReduce || n.kind == OpKind::kMatMul) return true;
    for (int in : n.inputs) todo.push_back(in);
  }
  return false;
}

// The most parts a concat may be split into at a sink (each part becomes a sink).
constexpr size_t kMaxConcatSplit = 8;

// Looks through elementwise ops and broadcasts from `node` (whose axis i is the sink's axis
// i + off) for a concat along an axis the sink has at full length; its parts' lengths.
// `searched` marks the nodes already searched in vain: a DAG that reuses values at every level
// is walked once, not as a tree.
bool Encoder::find_concat_split(int node, int off, int depth, std::vector<char>* searched,
                                int* axis, std::vector<int64_t>* parts) const {
  if (depth > 32 || (*searched)[node]) return false;
  (*searched)[node] = 1;
  const Node& n = def_.nodes[node];
  const CShape& s = shape_of(b_, node);
  switch (n.kind) {
    case OpKind::kConcat: {
      const int a = static_cast<int>(n.attr[0]);
      if (n.inputs.size() < 2 || n.inputs.size() > kMaxConcatSplit || s.d[a] <= 1) return false;
      for (int part : n.inputs) {
        const int64_t len = shape_of(b_, part).d[a];
        if (len == 0) return false;
        parts->push_back(len);
      }
      *axis = a + off;
      return true;
    }
    case OpKind::kUnary:
    case OpKind::kCast:
    case OpKind::kBinary:
    case OpKind::kSelect:
    case OpKind::kBroadcast:
      if (n.kind != OpKind::kBroadcast && cut_[node]) return false;  // computed elsewhere
      for (int in : n.inputs) {
        const int in_off = off + s.rank - shape_of(b_, in).rank;
        if (find_concat_split(in, in_off, depth + 1, searched, axis, parts)) {
          // A broadcast along the concat's axis would make it read one part everywhere.
          if (n.kind == OpKind::kBroadcast) {
            const int a = *axis - in_off;
            if (shape_of(b_, in).d[a] != s.d[*axis - off]) return false;
          }
          return true;
        }
        parts->clear();
      }
      return false;
    default:
      return false;
  }
}

// A sink over `dst`; axis >= 0: dst is the slice [at, at + its extent) of the node's value
// along that axis.
//
// Outputs of equal shape share one stage, and so do outputs that differ only in size-1 dims
// (a residual sum stored as [S, H] and, for the norm after it, as [1, S, H] in f32): in
// separate stages each would compute the values they share, a matmul included, once per stage.
Status Encoder::add_sink_at(int node, const View& dst, bool joinable, int axis, int64_t at) {
  CShape s = shape_of(b_, node);
  if (axis >= 0) s.d[axis] = dst.shape.d[axis];
  int stage = -1;
  NodeMap m = identity_map(s);
  if (joinable) {
    for (size_t i = 0; i < stages_.size() && stage < 0; ++i)
      if (stages_[i].joinable && stages_[i].root == s) stage = static_cast<int>(i);
    for (size_t i = 0; i < stages_.size() && stage < 0 && axis < 0; ++i) {
      if (stages_[i].joinable && squeezed_map(s, stages_[i].root, &m)) {
        stage = static_cast<int>(i);
      }
    }
  }
  if (stage < 0) {
    m = identity_map(s);
    stages_.emplace_back();
    stage = static_cast<int>(stages_.size()) - 1;
    stages_[stage].root = s;
    stages_[stage].joinable = joinable;
    for (int i = 0; i < s.rank; ++i) new_axis(stage, s.d[i]);
  }
  if (axis >= 0) m.e[axis].start = at;
  int inst;
  DVM_RETURN_IF_ERROR(visit(stage, node, m, &inst));
  Sink sink;
  sink.inst = inst;
  sink.slot = dst.slot;
  sink.dtype = dst.dtype;
  sink.dom_offset = dst.offset;
  for (int i = 0; i < s.rank; ++i) {
    if (s.d[i] != 1) sink.dom_stride[m.e[i].axis] = dst.stride[i];
  }
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

// The stage builder recurses from a sink through its operands, so an expression thousands of
// ops deep would overflow the stack. Every kMaxVisitDepth-th elementwise node along the
// deepest path is cut: it is computed into a workspace by its own stage, built (in node order,
// so each cut's own cuts come first) before any sink, and read back by its consumers. Kernels
// shallower than the limit, i.e. all real ones, are not affected.
void Encoder::plan_cuts() {
  cut_.assign(def_.nodes.size(), 0);
  std::vector<int> depth(def_.nodes.size(), 0);
  for (size_t i = 0; i < def_.nodes.size(); ++i) {
    const Node& n = def_.nodes[i];
    int d = 0;
    for (int in : n.inputs) d = std::max(d, depth[in] + 1);
    bool elementwise = n.kind == OpKind::kUnary || n.kind == OpKind::kBinary ||
                       n.kind == OpKind::kSelect || n.kind == OpKind::kCast;
    if (elementwise && d >= kMaxVisitDepth) {
      cut_[i] = 1;
      d = 0;
    }
    depth[i] = d;
  }
}

Status Encoder::materialize_cuts() {
  for (size_t i = 0; i < cut_.size(); ++i) {
    if (!cut_[i]) continue;
    View ws;
    DVM_RETURN_IF_ERROR(materialize(static_cast<int>(i), &ws));
  }
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

// The extent of a reduction's last input dim (the one reduce_fits_matmul_tile accepts).
int64_t Encoder::reduced_extent(int node) const {
  const CShape& in = shape_of(b_, def_.nodes[node].inputs[0]);
  return in.rank > 0 ? in.d[in.rank - 1] : 1;
}

// Does a matmul have so few rows for its contraction that a tile of whole output rows costs
// more than it saves? Such tiles (a row reduction in the tile: linear + residual + LayerNorm)
// can only be split among threads by rows, and then every thread reads all of B, where
// column tiles read it once between them; the separate pass over the output that the tile
// saves costs rows x N x 8 bytes, against N x K x 2 more of B at two threads. Decided by the
// shapes alone, never the thread count, so results do not depend on it. (GPT-2's c_proj +
// residual + LayerNorm at 40 rows, K = 1024, N = 256, 2 threads: 88 us in tiles of whole
// rows, 73 us as the matmul's own column tiles and a second program for the norm.) A is the
// left operand with K last (the kernel builder lowers a transposed A to a view).
bool Encoder::matmul_rows_few(int node) const {
  const CShape& out = shape_of(b_, node);
  const CShape& a = shape_of(b_, def_.nodes[node].inputs[0]);
  if (out.rank < 2 || a.rank < 1) return false;
  const int64_t k = a.d[a.rank - 1];
  return out.numel() / std::max<int64_t>(1, out.d[out.rank - 1]) * 4 < k;
}

// Marks the matmuls that feed, through elementwise ops, a reduction that cannot share their
// tile, or whose rows are too few to share it (matmul_rows_few).
void Encoder::plan_matmuls() {
  mm_alone_.assign(def_.nodes.size(), 0);
  for (size_t r = 0; r < def_.nodes.size(); ++r) {
    if (def_.nodes[r].kind != OpKind::kReduce) continue;
    const bool fits = reduce_fits_matmul_tile(static_cast<int>(r));
    std::vector<int> todo = {def_.nodes[r].inputs[0]};
    while (!todo.empty()) {
      int x = todo.back();
      todo.pop_back();
      const Node& n = def_.nodes[x];
      if (n.kind == OpKind::kMatMul && (!fits || matmul_rows_few(x))) mm_alone_[x] = 1;
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
  if (ops::is_arg_reduce(n.reduce_op())) return false;
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

// A reduction over axes that are all of extent 1 at this binding (a batch of one, a single
// head or key) in the dtype of its input is the input itself: no accumulator, fill and pass.
bool Encoder::reduces_over_unit_axes(int node) const {
  const Node& n = def_.nodes[node];
  const DType t = def_.nodes[n.inputs[0]].dtype;
  if (ops::is_arg_reduce(n.reduce_op()) || ops::reduce_compute_dtype(n.reduce_op(), t) != t ||
      n.dtype != t) {
    return false;
  }
  const CShape& in = shape_of(b_, n.inputs[0]);
  for (int64_t a : n.attr) {
    if (in.d[a] != 1) return false;
  }
  return true;
}

Status Encoder::visit_reduce(int stage, int node, const NodeMap& map, int* inst) {
  if (reduces_over_unit_axes(node)) {
    const Node& n = def_.nodes[node];
    NodeMap im;
    im.rank = shape_of(b_, n.inputs[0]).rank;
    for (int i = 0, k = 0; i < im.rank; ++i) {
      const bool red = std::find(n.attr.begin(), n.attr.end(), i) != n.attr.end();
      if (!red || n.keepdims) {
        const MapEntry e = map.e[k++];
        if (!red) im.e[i] = e;  // a reduced (extent-1) dim reads index 0 wherever it maps
      }
    }
    return visit(stage, n.inputs[0], im, inst);
  }
  const Stage& ms = stages_[stage];
  // The reduced dim must be the tile's columns themselves, not a size-1 dim broadcast over
  // them: argmin(m, 1, keepdims) [3, 1] added to a [3, 3] product reduced 38 columns on a new
  // axis, which a matmul stage's grid walked block by block (each block wrote the output with
  // its own partial result; which one won depended on the threads).
  bool row_reduce = ms.has_matmul && reduce_fits_matmul_tile(node) &&
                    (!ms.has_reduce || ms.reduce_set == (1u << ms.mm_n)) &&
                    def_.nodes[node].keepdims && map.e[map.rank - 1].axis == ms.mm_n &&
                    reduced_extent(node) == ms.axes[ms.mm_n].extent;
  if (ms.has_matmul && !row_reduce) {  // a matmul stage's tiles never loop: reduce elsewhere
    View ws;
    DVM_RETURN_IF_ERROR(materialize(node, &ws));
    return load_inst(stage, node, ws, map, inst);
  }
  if (should_split(stage, node)) return visit_split_reduce(stage, node, map, inst);
  const Node& n = def_.nodes[node];
  const CShape& in = shape_of(b_, n.inputs[0]);
  Stage& st = stages_[stage];
  // The value does not depend on where a kept (size-1) reduced dim maps: one instance serves
  // every such map (softmax-like graphs use the row max both inside the sum and after it).
  NodeMap key = map;
  for (int i = 0; n.keepdims && i < in.rank; ++i)  // kept dims: output dim i is input dim i
    if (std::find(n.attr.begin(), n.attr.end(), i) != n.attr.end()) key.e[i] = MapEntry{};
  if ((*inst = find_inst(stage, node, key, InstKind::kReduce)) >= 0) return Status::ok();
  const size_t axes_before = st.axes.size();
  NodeMap im;
  im.rank = in.rank;
  uint32_t reduced = 0;
  // The axes this reduction's kept dims walk: a reduced dim never shares one of them. An
  // argmin over a row feeding a sum over the rows (both of extent 3) took the sum's axis for
  // its own columns, and walked the input's diagonal.
  uint32_t kept_axes = 0;
  for (int i = 0, j = 0; i < in.rank; ++i) {
    const bool red = std::find(n.attr.begin(), n.attr.end(), i) != n.attr.end();
    if (!red || n.keepdims) {
      if (!red && map.e[j].axis >= 0) kept_axes |= 1u << map.e[j].axis;
      ++j;
    }
  }
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
    // Else an axis the stage already reduces, of this extent: the two reductions then share
    // the stage (one pass each over the same loop) instead of one being stored and reloaded.
    for (size_t a = 0; axis < 0 && a < st.axes.size() && !st.partial; ++a) {
      if (st.axes[a].reduced && st.axes[a].extent == in.d[i] && (st.reduce_set >> a & 1) &&
          !(reduced >> a & 1) && !(kept_axes >> a & 1))
        axis = static_cast<int>(a);
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
  bool arg = ops::is_arg_reduce(n.reduce_op());
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
  r.map = key;
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
  // en.axis is -1 where the output's columns map to no axis (a broadcast extent-1 dim).
  bool reduce_ok = !st.has_reduce || (en.axis >= 0 && st.reduce_set == (1u << en.axis) &&
                                      out.d[r - 1] <= kMaxMatmulRow);
  // M and N must be the tile's axes themselves, not extent-1 dims broadcast over them: a
  // [1, 1] product broadcast over an empty reduced axis made that axis the GEMM's N (extent
  // 0), an empty grid, and the reduction's output was never written.
  const auto own_axis = [&](const MapEntry& e, int64_t extent) {
    return plain_entry(e, extent) && st.axes[e.axis].extent == extent;
  };
  bool fits = !alone && reduce_ok && own_axis(em, out.d[r - 2]) && own_axis(en, out.d[r - 1]) &&
              em.axis != en.axis && (!st.has_matmul || (st.mm_m == em.axis && st.mm_n == en.axis));
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
      if (cut_[node]) {
        if (computing_root_ == node) {
          computing_root_ = -1;  // this is the cut's own stage: compute it here
        } else {
          // Deep expression: the value comes from the stage that plan_cuts gave it.
          View ws;
          DVM_RETURN_IF_ERROR(materialize(node, &ws));
          return load_inst(stage, node, ws, map, inst);
        }
      }
      // A value used twice under one map is visited once: without this, a DAG that reuses
      // values (y = y * y, repeated) would be walked as a tree, exponentially.
      if ((*inst = find_inst(stage, node, map, InstKind::kCompute)) >= 0) return Status::ok();
      Inst c;
      c.node = node;
      c.map = map;
      for (int in : n.inputs) {
        int child;
        DVM_RETURN_IF_ERROR(visit(stage, in, broadcast_map(node, in, map), &child));
        c.inputs.push_back(child);
        c.vary |= stages_[stage].insts[child].vary;
      }
      // Searched for above, and visiting the operands cannot add this node (they precede it).
      *inst = push_inst(stage, std::move(c));
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
      // Indices the map reads along the concat axis: inside one part, that part is read in
      // place (a sink split at the concat's boundaries, or a slice of one part).
      const int axis = static_cast<int>(n.attr[0]);
      const MapEntry& e = map.e[axis];
      int64_t lo = e.start, hi = e.start;
      if (e.axis >= 0 && e.step != 0) {
        const int64_t last = e.start + e.step * (stages_[stage].axes[e.axis].extent - 1);
        lo = std::min(e.start, last);
        hi = std::max(e.start, last);
      }
      int64_t at = 0;
      for (int part : n.inputs) {
        const int64_t len = shape_of(b_, part).d[axis];
        if (lo >= at && hi < at + len) {
          NodeMap m = map;
          m.e[axis].start -= at;
          return visit(stage, part, m, inst);
        }
        at += len;
      }
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

}  // namespace dvm::enc
