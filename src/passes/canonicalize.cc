// Pass: canonicalise. Local rewrites that remove identities and merge chains of layout ops.
// Each rule is one entry of kRules with its algebra; a rule returns the new id of the value
// or -1 when it does not apply. Rules only fire when the result keeps the node's dtype and
// shape (the Rewriter checks it).
#include "passes/passes.h"

namespace dvm::passes {

namespace {

using graph::Node;

struct Ctx {
  Rewriter& rw;
  const Node& n;          // source node
  bool is_output;         // the source node is a graph output
  std::vector<int> args;  // its operands in the new graph
  const Node& arg(size_t i) const { return rw.out().nodes[args[i]]; }
  bool same_type_as(size_t i) const { return arg(i).dtype == n.dtype && arg(i).shape == n.shape; }
};

bool is_scalar_const(const Node& n, double v) {
  return n.op == GraphOp::kConstant && n.sym.empty() && n.value == v;
}

struct Rule {
  const char* name;
  int (*apply)(Ctx& c);
};

// Is operand `o` of an elementwise op with output shape `out` the same for every position
// along `axis` (size 1 there, or a missing leading dim)?
bool constant_along(const Node& o, const SymShape& out, int axis) {
  const int at = axis - static_cast<int>(out.size() - o.shape.size());
  return at < 0 || (o.shape[at].is_constant() && o.shape[at].constant_value() == 1);
}

// Can gather(n, idx) along `axis` move below n, an elementwise op? Its output and idx agree
// off the axis, and each operand either matches n's shape (it is gathered; at least one is)
// or, for a binary op, is constant along the axis (kept). Sets gathered[k] per operand.
bool gather_moves_below(const GraphDef& g, const Node& n, int idx, int axis, bool gathered[2]) {
  const SymShape& ishape = g.nodes[idx].shape;
  if ((n.op != GraphOp::kUnary && n.op != GraphOp::kBinary) || ishape.size() != n.shape.size())
    return false;
  for (size_t d = 0; d < n.shape.size(); ++d)
    if (static_cast<int>(d) != axis && !(ishape[d] == n.shape[d])) return false;
  bool any = false;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const Node& o = g.nodes[n.inputs[k]];
    const bool keep = n.op == GraphOp::kBinary && constant_along(o, n.shape, axis);
    if (!keep && !(o.shape == n.shape)) return false;
    gathered[k] = !keep;
    any = any || gathered[k];
  }
  return any;
}

// gather(v, idx) along `axis`, moved below the unary and binary ops that compute v as far as
// it goes (see the gather_through_elementwise rule); `depth` bounds the recursion.
int gather_of(Rewriter& rw, int v, int idx, int axis, int depth) {
  const Node n = rw.out().nodes[v];  // a copy: emitting appends to the node array
  bool gathered[2] = {false, false};
  if (depth <= 0 || !gather_moves_below(rw.out(), n, idx, axis, gathered)) {
    Node g;
    g.op = GraphOp::kGather;
    g.inputs = {v, idx};
    g.axis = axis;
    return rw.em().emit(std::move(g));
  }
  int ops[2] = {-1, -1};
  for (size_t k = 0; k < n.inputs.size(); ++k)
    ops[k] = gathered[k] ? gather_of(rw, n.inputs[k], idx, axis, depth - 1) : n.inputs[k];
  if (n.op == GraphOp::kUnary) return rw.em().unary(static_cast<UnaryOp>(n.sub), ops[0]);
  return rw.em().binary(static_cast<BinaryOp>(n.sub), ops[0], ops[1]);
}

// Do the last `k` dims of `a` and `b` agree (both have at least k)?
bool same_trailing_dims(const SymShape& a, const SymShape& b, size_t k) {
  if (a.size() < k || b.size() < k) return false;
  for (size_t i = 1; i <= k; ++i)
    if (!(a[a.size() - i] == b[b.size() - i])) return false;
  return true;
}

// f(reshape(x)) = reshape(f(x)) for elementwise f: a reshape keeps the elements' order, so the
// op commutes with it. Moving the reshape below lets f join the kernel that computes x (nn.Linear
// on a [B, S, K] input is a 2-D matmul whose [B*S, N] result is reshaped before the activation:
// gelu(reshape(x @ W^T + b)) ran as its own pass over memory). A binary op moves past when
// both operands are reshapes of equally shaped values, or when the other operand only
// broadcasts over trailing dims the reshape leaves alone (a bias, a scalar). Not for graph
// outputs: the reshape of a computed output would then need a copy.
int elementwise_above_reshape(Ctx& c) {
  if (c.is_output || (c.n.op != GraphOp::kUnary && c.n.op != GraphOp::kBinary)) return -1;
  const GraphDef& g = c.rw.out();
  auto reshaped = [&](size_t i) -> int {
    const Node& r = c.arg(i);
    if (r.op != GraphOp::kReshape || !(r.shape == c.n.shape)) return -1;
    return r.inputs[0];
  };
  if (c.n.op == GraphOp::kUnary) {
    const int x = reshaped(0);
    if (x < 0) return -1;
    const int f = c.rw.em().unary(static_cast<UnaryOp>(c.n.sub), x);
    return c.rw.em().reshape(f, c.n.shape);
  }
  int ops[2] = {reshaped(0), reshaped(1)};
  if (ops[0] >= 0 && ops[1] >= 0) {
    if (!(g.nodes[ops[0]].shape == g.nodes[ops[1]].shape)) return -1;
  } else {
    const int k = ops[0] >= 0 ? 0 : 1;
    if (ops[k] < 0) return -1;
    const Node& other = c.arg(1 - k);
    if (!same_trailing_dims(g.nodes[ops[k]].shape, c.n.shape, other.shape.size())) return -1;
    ops[1 - k] = c.args[1 - k];
  }
  // The reshape's shape is the node's, so the other operand does not broadcast the reshaped
  // value itself, and over the shared trailing dims it broadcasts over x as it did before.
  const int f = c.rw.em().binary(static_cast<BinaryOp>(c.n.sub), ops[0], ops[1]);
  return c.rw.em().reshape(f, c.n.shape);
}

// The operand of unary `op` that node `n` applies, or -1 when n is not that op.
int unary_operand(const Node& n, UnaryOp op) {
  return n.op == GraphOp::kUnary && n.sub == static_cast<int>(op) ? n.inputs[0] : -1;
}

// For a binary `op` node with a scalar constant `v` on either side: the other operand; else -1.
int other_than_scalar(const GraphDef& g, const Node& n, BinaryOp op, double v) {
  if (n.op != GraphOp::kBinary || n.sub != static_cast<int>(op)) return -1;
  for (int k = 0; k < 2; ++k)
    if (is_scalar_const(g.nodes[n.inputs[k]], v)) return n.inputs[1 - k];
  return -1;
}

// Node `id`, or the input of the reshape that node `id` is: a factor matched below through a
// reshape is reshaped back to the product's shape.
int through_reshape(const GraphDef& g, int id) {
  return g.nodes[id].op == GraphOp::kReshape ? g.nodes[id].inputs[0] : id;
}

// Node `id` at the shape of `like`: itself when it has that shape, else a reshape of it (the
// callers pass a node with `like`'s element count).
int as_shape(graph::GraphEmitter& em, const GraphDef& g, int id, const Node& like) {
  return g.nodes[id].shape == like.shape ? id : em.reshape(id, like.shape);
}

// (x * 0.5) * (tanh(u) + 1) = x * sigmoid(2u), for any u: 1 + tanh(u) = 2 sigmoid(2u).
// GPT-2's gelu_new writes its tanh form out (its sqrt(2/pi) reaches the graph as a runtime
// scalar under dynamic shapes, so it cannot be matched as gelu_tanh); sigmoid costs what
// tanh does and the rewrite drops two of the eight ops a matmul epilogue ran per element.
// It also loses nothing where 1 + tanh(u) cancels (u -> -inf). Either factor may reach the
// product through a reshape (elementwise ops sink below reshapes as this pass runs, one
// factor before the other); no factor may broadcast (every node matched keeps its operand's
// shape and the product's dtype).
int half_one_plus_tanh(Ctx& c) {
  if (c.n.op != GraphOp::kBinary || c.n.sub != static_cast<int>(BinaryOp::kMul) ||
      !is_float(c.n.dtype) || !c.same_type_as(0) || !c.same_type_as(1)) {
    return -1;
  }
  const GraphDef& g = c.rw.out();
  for (int k = 0; k < 2; ++k) {
    const Node& half = g.nodes[through_reshape(g, c.args[k])];
    const Node& one_plus = g.nodes[through_reshape(g, c.args[1 - k])];
    const int x = other_than_scalar(g, half, BinaryOp::kMul, 0.5);
    const int t = other_than_scalar(g, one_plus, BinaryOp::kAdd, 1.0);
    if (x < 0 || t < 0) continue;
    const int u = unary_operand(g.nodes[t], UnaryOp::kTanh);
    if (u < 0 || !(g.nodes[x].shape == half.shape) || !(g.nodes[t].shape == one_plus.shape) ||
        !(g.nodes[u].shape == one_plus.shape) || g.nodes[x].dtype != c.n.dtype ||
        g.nodes[u].dtype != c.n.dtype) {
      continue;
    }
    graph::GraphEmitter& em = c.rw.em();
    // Emitting appends nodes: `half` and `one_plus` are not read after the first emit.
    const int ux = as_shape(em, g, u, c.n);
    const int s = em.unary(UnaryOp::kSigmoid, em.binary_scalar(BinaryOp::kMul, ux, 2.0));
    return em.binary(BinaryOp::kMul, as_shape(em, c.rw.out(), x, c.n), s);
  }
  return -1;
}

// matmul(reshape(a), reshape(b)) = reshape(matmul(a, b)) where each reshape only merges the
// batch dims of a rank >= 4 operand (its last two dims kept) and both operands have the same
// batch dims: torch's matmul of [B, H, S, D] operands reaches the graph as a bmm over [B*H,
// S, D] views. Merging the batch dims of a permuted view (attention's heads) is no strided
// view, so each operand was copied out first, and the reshape of the product kept the
// softmax after it out of the matmul's kernel; the rank-4 product reads the views in place.
int unmerge_batch_dims(Ctx& c) {
  if (c.n.op != GraphOp::kMatMul || c.n.shape.size() != 3) return -1;
  const Node& ra = c.arg(0);
  const Node& rb = c.arg(1);
  if (ra.op != GraphOp::kReshape || rb.op != GraphOp::kReshape) return -1;
  const GraphDef& g = c.rw.out();
  const int a = ra.inputs[0], b = rb.inputs[0];
  const SymShape& sa = g.nodes[a].shape;
  const SymShape& sb = g.nodes[b].shape;
  if (sa.size() < 4 || sa.size() != sb.size() || ra.shape.size() != 3 || rb.shape.size() != 3 ||
      g.nodes[a].dtype != ra.dtype || g.nodes[b].dtype != rb.dtype) {
    return -1;
  }
  if (!same_trailing_dims(sa, ra.shape, 2) || !same_trailing_dims(sb, rb.shape, 2)) return -1;
  // The merged dim is the batch dims' product (not implied by the element count alone when K
  // is 0).
  SymExpr batch = sa[0];
  for (size_t d = 0; d + 2 < sa.size(); ++d) {
    if (!(sa[d] == sb[d])) return -1;
    if (d > 0) batch = batch * sa[d];
  }
  if (!(batch == ra.shape[0]) || !(batch == rb.shape[0])) return -1;
  const bool ta = c.n.ints[0] != 0, tb = c.n.ints[1] != 0;
  const int mm = c.rw.em().matmul(a, b, ta, tb);
  return c.rw.em().reshape(mm, c.n.shape);
}

const Rule kRules[] = {
    // reshape(x, shape(x)) = x;  broadcast(x, shape(x)) = x;  cast<t>(x: t) = x
    {"identity_layout",
     [](Ctx& c) {
       bool layout =
           c.n.op == GraphOp::kReshape || c.n.op == GraphOp::kBroadcast || c.n.op == GraphOp::kCast;
       return layout && c.same_type_as(0) ? c.args[0] : -1;
     }},
    // permute(x, [0, 1, .., r-1]) = x
    {"identity_permute",
     [](Ctx& c) {
       if (c.n.op != GraphOp::kPermute) return -1;
       for (size_t i = 0; i < c.n.ints.size(); ++i)
         if (c.n.ints[i] != static_cast<int64_t>(i)) return -1;
       return c.args[0];
     }},
    // x[0:dim:1] along an axis = x
    {"identity_slice",
     [](Ctx& c) {
       return c.n.op == GraphOp::kSlice && c.n.ints[0] == 1 && c.same_type_as(0) ? c.args[0] : -1;
     }},
    // reshape(reshape(x, s1), s2) = reshape(x, s2)
    {"reshape_of_reshape",
     [](Ctx& c) {
       if (c.n.op != GraphOp::kReshape || c.arg(0).op != GraphOp::kReshape) return -1;
       return c.rw.em().reshape(c.arg(0).inputs[0], c.n.shape);
     }},
    // permute(permute(x, p), q) = permute(x, p[q[i]])
    {"permute_of_permute",
     [](Ctx& c) {
       if (c.n.op != GraphOp::kPermute || c.arg(0).op != GraphOp::kPermute) return -1;
       std::vector<int64_t> perm;
       for (int64_t q : c.n.ints) perm.push_back(c.arg(0).ints[q]);
       return c.rw.em().permute(c.arg(0).inputs[0], perm);
     }},
    // neg(neg(x)) = x
    {"double_negation",
     [](Ctx& c) {
       bool neg = c.n.op == GraphOp::kUnary && c.n.sub == static_cast<int>(UnaryOp::kNeg);
       if (!neg || c.arg(0).op != GraphOp::kUnary ||
           c.arg(0).sub != static_cast<int>(UnaryOp::kNeg))
         return -1;
       int x = c.arg(0).inputs[0];
       const Node& xn = c.rw.out().nodes[x];
       return xn.dtype == c.n.dtype && xn.shape == c.n.shape ? x : -1;
     }},
    // x * 0 = 0 for integer and bool x (no NaN or infinity to keep): a zero broadcast to the
    // product's shape. A fill written as iota * 0 + value (as the torch backend once wrote
    // torch.full) then leaves its [.., ..] iota (a native op, a pass over memory) dead.
    {"integer_times_zero",
     [](Ctx& c) {
       if (c.n.op != GraphOp::kBinary || c.n.sub != static_cast<int>(BinaryOp::kMul) ||
           is_float(c.n.dtype)) {
         return -1;
       }
       for (int k = 0; k < 2; ++k) {
         const Node& x = c.arg(1 - k);
         if (!is_scalar_const(c.arg(k), 0.0) || x.dtype != c.n.dtype) continue;
         graph::GraphEmitter& em = c.rw.em();
         return em.expand(em.scalar(0.0, c.n.dtype), c.n.shape);
       }
       return -1;
     }},
    // x + 0 = x;  x - 0 = x;  x * 1 = x;  x / 1 = x;  0 + x = x;  1 * x = x
    // (only when the result has x's dtype and shape, so no promotion or broadcast is lost)
    {"neutral_element",
     [](Ctx& c) {
       if (c.n.op != GraphOp::kBinary) return -1;
       auto op = static_cast<BinaryOp>(c.n.sub);
       double unit = op == BinaryOp::kAdd || op == BinaryOp::kSub   ? 0.0
                     : op == BinaryOp::kMul || op == BinaryOp::kDiv ? 1.0
                                                                    : -1.0;
       if (unit < 0) return -1;
       if (is_scalar_const(c.arg(1), unit) && c.same_type_as(0)) return c.args[0];
       bool commutes = op == BinaryOp::kAdd || op == BinaryOp::kMul;
       if (commutes && is_scalar_const(c.arg(0), unit) && c.same_type_as(1)) return c.args[1];
       return -1;
     }},
    // pow(x, c) for the constants torch's own kernel special-cases, as it computes them:
    // 2: x * x (then joins a reduction as one pass: rmsnorm's mean(x.pow(2)) becomes a dot
    // product); 3: (x * x) * x (GPT-2's gelu_new: the general pow took 15 ns an element);
    // 0.5: sqrt(x); -0.5: 1 / sqrt(x); -1: 1 / x; -2: 1 / (x * x). Float types only.
    {"pow_by_constant",
     [](Ctx& c) {
       if (c.n.op != GraphOp::kBinary || c.n.sub != static_cast<int>(BinaryOp::kPow) ||
           !is_float(c.n.dtype) || !c.same_type_as(0) || c.arg(1).op != GraphOp::kConstant ||
           !c.arg(1).sym.empty()) {
         return -1;
       }
       const double e = c.arg(1).value;
       const int x = c.args[0];
       graph::GraphEmitter& em = c.rw.em();
       if (e == 2.0) return em.binary(BinaryOp::kMul, x, x);
       if (e == 3.0) return em.binary(BinaryOp::kMul, em.binary(BinaryOp::kMul, x, x), x);
       if (e == 0.5) return em.unary(UnaryOp::kSqrt, x);
       if (e == -0.5) return em.unary(UnaryOp::kReciprocal, em.unary(UnaryOp::kSqrt, x));
       if (e == -1.0) return em.unary(UnaryOp::kReciprocal, x);
       if (e == -2.0) return em.unary(UnaryOp::kReciprocal, em.binary(BinaryOp::kMul, x, x));
       return -1;
     }},
    // gather(f(a, b), idx) = f(gather(a, idx), b) along an axis where b is constant (size 1),
    // for elementwise f, recursively; gather(f(a), idx) = f(gather(a, idx)). The few gathered
    // elements go through the math instead of the whole tensor, so f's output need not be
    // stored: cross-entropy as log_softmax + nll_loss gathers the targets' logits from the
    // input and never writes the [N, C] log-probabilities.
    {"gather_through_elementwise",
     [](Ctx& c) {
       bool gathered[2];
       if (c.n.op != GraphOp::kGather ||
           !gather_moves_below(c.rw.out(), c.arg(0), c.args[1], c.n.axis, gathered))
         return -1;
       return gather_of(c.rw, c.args[0], c.args[1], c.n.axis, 8);
     }},
    // matmul(x * c, b) = matmul(x, b) * c;  matmul(a, x * c) = matmul(a, x) * c  (c a scalar
    // constant, the product of x's type). Prologue fusion by algebra: the scale moves to the
    // output, where it runs in the matmul's epilogue, instead of a pass over the operand that
    // the matmul then reads back from memory.
    {"scale_through_matmul",
     [](Ctx& c) {
       if (c.n.op != GraphOp::kMatMul) return -1;
       for (int side = 0; side < 2; ++side) {
         const Node& prod = c.arg(side);
         if (prod.op != GraphOp::kBinary || prod.sub != static_cast<int>(BinaryOp::kMul)) continue;
         for (int k = 0; k < 2; ++k) {
           const Node& scale = c.rw.out().nodes[prod.inputs[k]];
           const int x = prod.inputs[1 - k];
           const Node& xn = c.rw.out().nodes[x];
           if (scale.op != GraphOp::kConstant || !scale.sym.empty() || !scale.shape.empty() ||
               xn.dtype != prod.dtype || xn.shape != prod.shape) {
             continue;
           }
           // Emitting appends nodes: read what is needed from `prod` first.
           const int scale_id = prod.inputs[k];
           const int a = side == 0 ? x : c.args[0], b = side == 1 ? x : c.args[1];
           const int mm = c.rw.em().matmul(a, b, c.n.ints[0] != 0, c.n.ints[1] != 0);
           return c.rw.em().binary(BinaryOp::kMul, mm, scale_id);
         }
       }
       return -1;
     }},
    {"half_one_plus_tanh", half_one_plus_tanh},
    {"unmerge_batch_dims", unmerge_batch_dims},
    {"elementwise_above_reshape", elementwise_above_reshape},
};

}  // namespace

StatusOr<GraphDef> canonicalize(const GraphDef& g) {
  Rewriter rw(g);
  std::vector<char> is_output(g.nodes.size(), 0);
  for (int o : g.outputs) is_output[o] = 1;
  return rw.run([&rw, &g, &is_output](int id) {
    const Node& n = g.nodes[id];
    if (n.op == GraphOp::kInput) return rw.copy(id);
    Ctx c{rw, n, is_output[id] != 0, {}};
    for (int i : n.inputs) c.args.push_back(rw.map(i));
    for (const Rule& r : kRules) {
      int v = r.apply(c);
      if (v >= 0) return v;
    }
    return rw.copy(id);
  });
}

}  // namespace dvm::passes
