// Concrete shape and dtype inference at record time: the rules of src/graph/shape_infer.cc on
// integer dims, so a recorded value knows its shape before anything runs. A plan-cache miss
// re-derives every shape symbolically through the GraphBuilder and checks it against these
// (src/lazy/flush.cc), so the two rule sets cannot drift apart unnoticed.
#include <algorithm>

#include "lazy/lazy_internal.h"
#include "ops/dtype_rules.h"
#include "ops/scalar_ops.h"

namespace dvm::lazy::detail {

namespace {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ", ";
    r += std::to_string(s[i]);
  }
  r += "]";
  return r;
}

Status fail(const Node& n, const std::string& msg) {
  std::string m = "lazy ";
  m += graph_op_name(n.op);
  m += ": ";
  m += msg;
  return invalid_argument(std::move(m));
}

const Node& in(const Node& n, size_t i) {
  return *n.inputs[i];
}

Status broadcast(const Node& n, const Shape& a, const Shape& b, Shape* out) {
  size_t r = std::max(a.size(), b.size());
  out->assign(r, 1);
  for (size_t i = 0; i < r; ++i) {
    int64_t x = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t y = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (x == y || y == 1) {
      (*out)[i] = x;
    } else if (x == 1) {
      (*out)[i] = y;
    } else {
      std::string m = "cannot broadcast ";
      m += shape_str(a);
      m += " with ";
      m += shape_str(b);
      return fail(n, m);
    }
  }
  return Status::ok();
}

Status normalize_axis(const Node& n, int rank, int* axis) {
  if (*axis < 0) *axis += rank;
  if (*axis < 0 || *axis >= std::max(rank, 1)) {
    return fail(n, "axis out of range for rank " + std::to_string(rank));
  }
  return Status::ok();
}

Status normalize_axes(const Node& n, int rank, std::vector<int64_t>* axes) {
  if (axes->empty())
    for (int i = 0; i < rank; ++i) axes->push_back(i);
  for (int64_t& a : *axes) {
    int ai = static_cast<int>(a);
    DVM_RETURN_IF_ERROR(normalize_axis(n, rank, &ai));
    a = ai;
  }
  std::sort(axes->begin(), axes->end());
  axes->erase(std::unique(axes->begin(), axes->end()), axes->end());
  return Status::ok();
}

int64_t numel(const Shape& s) {
  int64_t p = 1;
  for (int64_t d : s) p *= d;
  return p;
}

// Reshape target dims described by the source dims they come from: runs of source and target
// dims with equal products are matched left to right (1s stand alone); a target dim that is a
// whole run of source dims is their product, anything else keeps its value.
void reshape_dims(const Shape& src, const Shape& dst, std::vector<AttrDim>* out) {
  out->assign(dst.size(), AttrDim{});
  for (size_t j = 0; j < dst.size(); ++j) (*out)[j].value = dst[j];
  size_t i = 0, j = 0;
  while (i < src.size() && j < dst.size()) {
    if (dst[j] == 1) {
      ++j;
      continue;
    }
    if (src[i] == 1) {
      ++i;
      continue;
    }
    size_t i0 = i, j0 = j;
    int64_t ps = src[i++], pd = dst[j++];
    while (ps != pd && ps > 0 && pd > 0) {
      if (ps < pd && i < src.size()) {
        ps *= src[i++];
      } else if (pd < ps && j < dst.size()) {
        pd *= dst[j++];
      } else {
        break;
      }
    }
    if (ps != pd) return;
    if (j - j0 == 1) (*out)[j0] = AttrDim{AttrDim::kSrcProd, dst[j0], int(i0), int(i)};
  }
}

Status infer_reshape(Node& n, const Shape& target) {
  const Shape& src = in(n, 0).shape;
  Shape t = target;
  int inferred = -1;
  int64_t known = 1;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == -1 && inferred < 0) {
      inferred = static_cast<int>(i);
    } else if (t[i] < 0) {
      return fail(n, "bad target shape " + shape_str(target));
    } else {
      known *= t[i];
    }
  }
  int64_t total = numel(src);
  if (inferred >= 0) {
    if (known == 0 || total % known != 0) {
      return fail(n, "cannot infer -1 of " + shape_str(target) + " from " + shape_str(src));
    }
    t[inferred] = total / known;
  } else if (known != total) {
    return fail(n, "element count of " + shape_str(src) + " is not that of " + shape_str(t));
  }
  n.shape = t;
  reshape_dims(src, t, &n.dims);
  return Status::ok();
}

Status infer_expand(Node& n, const Shape& target) {
  const Shape& src = in(n, 0).shape;
  if (target.size() < src.size()) {
    return fail(n, "cannot expand " + shape_str(src) + " to " + shape_str(target));
  }
  size_t off = target.size() - src.size();
  n.shape = target;
  n.dims.assign(target.size(), AttrDim{});
  for (size_t i = 0; i < target.size(); ++i) {
    if (i >= off && target[i] == -1) n.shape[i] = src[i - off];
    n.dims[i].value = n.shape[i];
    if (i < off) continue;
    int64_t s = src[i - off];
    if (s != n.shape[i] && s != 1) {
      return fail(n, "cannot expand " + shape_str(src) + " to " + shape_str(target));
    }
    if (s == n.shape[i] && s != 1) n.dims[i] = AttrDim{AttrDim::kSrcDim, s, int(i - off), 0};
  }
  return Status::ok();
}

Status infer_permute(Node& n) {
  const Shape& src = in(n, 0).shape;
  std::vector<int> seen(src.size(), 0);
  bool valid = n.ints.size() == src.size();
  for (int64_t& p : n.ints) {
    if (p < 0) p += static_cast<int64_t>(src.size());
    if (!valid || p < 0 || p >= static_cast<int64_t>(src.size()) || seen[p]++) valid = false;
  }
  if (!valid) return fail(n, "invalid permutation for shape " + shape_str(src));
  n.shape.clear();
  for (int64_t p : n.ints) n.shape.push_back(src[p]);
  return Status::ok();
}

// start/stop as given (negative from the end, kSliceEnd); the graph canonicalises them the
// same way (src/graph/shape_infer.cc).
Status infer_slice(Node& n, const Shape& bounds) {
  const Shape& src = in(n, 0).shape;
  DVM_RETURN_IF_ERROR(normalize_axis(n, static_cast<int>(src.size()), &n.axis));
  if (bounds.size() != 2 || n.ints.size() != 1 || n.ints[0] <= 0) {
    return fail(n, "needs {start, stop} and a positive step");
  }
  int64_t dim = src[n.axis];
  auto canon = [dim](int64_t v) {
    if (v >= kSymMax) return dim;
    if (v < 0) v = std::max<int64_t>(dim + v, 0);
    return std::min(v, dim);
  };
  int64_t start = canon(bounds[0]);
  int64_t stop = std::max(canon(bounds[1]), start);
  int64_t step = n.ints[0];
  n.shape = src;
  n.shape[n.axis] = (stop - start + step - 1) / step;
  n.dims.clear();
  for (int64_t b : bounds) {
    AttrDim d;
    d.value = b >= kSymMax ? kSliceEnd : b;
    if (b == dim && dim > 1) d = AttrDim{AttrDim::kSrcDim, b, n.axis, 0};
    n.dims.push_back(d);
  }
  return Status::ok();
}

Status infer_concat(Node& n) {
  if (n.inputs.empty()) return fail(n, "no inputs");
  const Shape& first = in(n, 0).shape;
  DVM_RETURN_IF_ERROR(normalize_axis(n, static_cast<int>(first.size()), &n.axis));
  n.shape = first;
  n.dtype = in(n, 0).dtype;
  int64_t total = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const Shape& s = in(n, i).shape;
    n.dtype = promote_types(n.dtype, in(n, i).dtype);
    bool ok = s.size() == first.size();
    for (size_t d = 0; ok && d < s.size(); ++d)
      if (static_cast<int>(d) != n.axis && s[d] != first[d]) ok = false;
    if (!ok) return fail(n, "shapes " + shape_str(first) + " and " + shape_str(s) + " differ");
    total += s[n.axis];
  }
  n.shape[n.axis] = total;
  return Status::ok();
}

Status infer_reduce(Node& n) {
  const Node& x = in(n, 0);
  int r = static_cast<int>(x.shape.size());
  DVM_RETURN_IF_ERROR(normalize_axes(n, r, &n.ints));
  auto op = static_cast<ReduceOp>(n.sub);
  bool arg = op == ReduceOp::kArgMax || op == ReduceOp::kArgMin;
  if (arg && n.ints.size() != 1) return fail(n, "exactly one axis required");
  DType t = x.dtype;
  if (op == ReduceOp::kMean) t = ops::float_dtype(t);
  if (t == DType::kBool && (op == ReduceOp::kSum || op == ReduceOp::kProd)) t = DType::kI64;
  n.dtype = arg ? DType::kI64 : t;
  n.shape.clear();
  for (int i = 0; i < r; ++i) {
    bool reduced = std::find(n.ints.begin(), n.ints.end(), i) != n.ints.end();
    if (!reduced) {
      n.shape.push_back(x.shape[i]);
    } else if (n.flag) {
      n.shape.push_back(1);
    }
  }
  return Status::ok();
}

Status infer_matmul(Node& n) {
  Shape a = in(n, 0).shape, b = in(n, 1).shape;
  if (a.size() < 2 || b.size() < 2 || a.size() > 4 || b.size() > 4) {
    return fail(n, "operands must have rank 2 to 4, got " + shape_str(a) + " and " + shape_str(b));
  }
  if (n.ints[0]) std::swap(a[a.size() - 1], a[a.size() - 2]);
  if (n.ints[1]) std::swap(b[b.size() - 1], b[b.size() - 2]);
  if (a.back() != b[b.size() - 2]) {
    return fail(n, "contraction dims differ: " + shape_str(a) + " x " + shape_str(b));
  }
  n.dtype = promote_types(in(n, 0).dtype, in(n, 1).dtype);
  if (!is_float(n.dtype)) return fail(n, "integer operands are not supported");
  Shape ba(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
  DVM_RETURN_IF_ERROR(broadcast(n, ba, bb, &n.shape));
  n.shape.push_back(a[a.size() - 2]);
  n.shape.push_back(b.back());
  return Status::ok();
}

Status infer_indexing(Node& n) {
  const Node& x = in(n, 0);
  const Node& idx = in(n, 1);
  DVM_RETURN_IF_ERROR(normalize_axis(n, static_cast<int>(x.shape.size()), &n.axis));
  n.dtype = x.dtype;
  if (n.op == GraphOp::kIndexSelect) {
    if (idx.shape.size() != 1 || !is_integer(idx.dtype)) {
      return fail(n, "index must be a rank-1 integer tensor, got " + shape_str(idx.shape));
    }
    n.shape = x.shape;
    n.shape[n.axis] = idx.shape[0];
    return Status::ok();
  }
  if (idx.shape.size() != x.shape.size() || !is_integer(idx.dtype)) {
    return fail(n, "index must be an integer tensor of the rank of " + shape_str(x.shape));
  }
  n.shape = idx.shape;
  return Status::ok();
}

Status infer_norm(Node& n) {
  const Node& x = in(n, 0);
  int r = static_cast<int>(x.shape.size());
  if (n.axis < 1 || n.axis > r) return fail(n, "bad number of normalised axes");
  Shape tail(x.shape.end() - n.axis, x.shape.end());
  for (size_t i = 1; i < n.inputs.size(); ++i) {
    if (in(n, i).shape != tail) {
      return fail(n, "weight/bias shape " + shape_str(in(n, i).shape) +
                         " does not match the normalised dims " + shape_str(tail));
    }
  }
  n.dtype = ops::float_dtype(x.dtype);
  n.shape = x.shape;
  return Status::ok();
}

Status infer_linear(Node& n) {
  const Node& x = in(n, 0);
  const Node& w = in(n, 1);
  if (x.shape.empty() || w.shape.size() != 2 || x.shape.back() != w.shape[1]) {
    return fail(n, "x " + shape_str(x.shape) + " and weight " + shape_str(w.shape) +
                       " do not match (weight is [out, in])");
  }
  if (n.inputs.size() == 3 && in(n, 2).shape != Shape{w.shape[0]}) {
    return fail(
        n, "bias " + shape_str(in(n, 2).shape) + " must be [" + std::to_string(w.shape[0]) + "]");
  }
  n.dtype = promote_types(x.dtype, w.dtype);
  n.shape = x.shape;
  n.shape.back() = w.shape[0];
  return Status::ok();
}

Status infer_attention(Node& n) {
  const Shape& q = in(n, 0).shape;
  const Shape& k = in(n, 1).shape;
  const Shape& v = in(n, 2).shape;
  if (q.size() < 2 || k.size() != q.size() || v.size() != q.size() || q.back() != k.back() ||
      k[k.size() - 2] != v[v.size() - 2]) {
    return fail(
        n, "q " + shape_str(q) + ", k " + shape_str(k) + ", v " + shape_str(v) + " do not match");
  }
  n.dtype = ops::float_dtype(in(n, 0).dtype);
  n.shape = q;
  n.shape.back() = v.back();
  return Status::ok();
}

Status infer_composite(Node& n) {
  const Node& x = in(n, 0);
  switch (n.op) {
    case GraphOp::kSoftmax:
    case GraphOp::kLogSoftmax:
      DVM_RETURN_IF_ERROR(normalize_axis(n, static_cast<int>(x.shape.size()), &n.axis));
      [[fallthrough]];
    case GraphOp::kGelu:
    case GraphOp::kSilu:
      n.dtype = ops::float_dtype(x.dtype);
      n.shape = x.shape;
      return Status::ok();
    case GraphOp::kSwiglu:
      n.dtype = ops::float_dtype(promote_types(x.dtype, in(n, 1).dtype));
      return broadcast(n, x.shape, in(n, 1).shape, &n.shape);
    case GraphOp::kLayerNorm:
    case GraphOp::kRmsNorm:
      return infer_norm(n);
    case GraphOp::kLinear:
      return infer_linear(n);
    case GraphOp::kEmbedding: {
      const Node& ids = in(n, 1);
      if (x.shape.size() != 2 || !is_integer(ids.dtype)) {
        return fail(n, "needs weight [V, D] and integer ids, got " + shape_str(x.shape));
      }
      n.dtype = x.dtype;
      n.shape = ids.shape;
      n.shape.push_back(x.shape[1]);
      return Status::ok();
    }
    case GraphOp::kVariance:
    case GraphOp::kStd: {
      DVM_RETURN_IF_ERROR(normalize_axes(n, static_cast<int>(x.shape.size()), &n.ints));
      n.shape.clear();
      for (size_t i = 0; i < x.shape.size(); ++i) {
        bool reduced = std::find(n.ints.begin(), n.ints.end(), int64_t(i)) != n.ints.end();
        if (!reduced) n.shape.push_back(x.shape[i]);
        if (reduced && n.flag) n.shape.push_back(1);
      }
      n.dtype = ops::float_dtype(x.dtype);
      return Status::ok();
    }
    case GraphOp::kCrossEntropy: {
      const Node& t = in(n, 1);
      if (x.shape.size() != 2 || t.shape.size() != 1 || t.shape[0] != x.shape[0] ||
          !is_integer(t.dtype)) {
        return fail(n, "needs logits [N, C] and integer targets [N], got " + shape_str(x.shape) +
                           " and " + shape_str(t.shape));
      }
      n.dtype = ops::float_dtype(x.dtype);
      n.shape = {};
      return Status::ok();
    }
    case GraphOp::kAttention:
      return infer_attention(n);
    case GraphOp::kClamp:
      n.dtype = x.dtype;
      n.shape = x.shape;
      return Status::ok();
    default:
      return fail(n, "not supported by lazy tensors");
  }
}

}  // namespace

Status infer(Node& n, const std::vector<int64_t>& shape_attr) {
  switch (n.op) {
    case GraphOp::kConstant:
      n.dtype = n.attr_dtype;
      n.shape = {};
      return Status::ok();
    case GraphOp::kUnary: {
      n.dtype = ops::unary_result_dtype(static_cast<UnaryOp>(n.sub), in(n, 0).dtype);
      n.shape = in(n, 0).shape;
      return Status::ok();
    }
    case GraphOp::kBinary:
      n.dtype =
          ops::binary_result_dtype(static_cast<BinaryOp>(n.sub), in(n, 0).dtype, in(n, 1).dtype);
      return broadcast(n, in(n, 0).shape, in(n, 1).shape, &n.shape);
    case GraphOp::kSelect: {
      Shape s;
      n.dtype = promote_types(in(n, 1).dtype, in(n, 2).dtype);
      DVM_RETURN_IF_ERROR(broadcast(n, in(n, 0).shape, in(n, 1).shape, &s));
      return broadcast(n, s, in(n, 2).shape, &n.shape);
    }
    case GraphOp::kCast:
      n.dtype = n.attr_dtype;
      n.shape = in(n, 0).shape;
      return Status::ok();
    case GraphOp::kBroadcast:
      n.dtype = in(n, 0).dtype;
      return infer_expand(n, shape_attr);
    case GraphOp::kReshape:
      n.dtype = in(n, 0).dtype;
      return infer_reshape(n, shape_attr);
    case GraphOp::kPermute:
      n.dtype = in(n, 0).dtype;
      return infer_permute(n);
    case GraphOp::kSlice:
      n.dtype = in(n, 0).dtype;
      return infer_slice(n, shape_attr);
    case GraphOp::kConcat:
      return infer_concat(n);
    case GraphOp::kReduce:
      return infer_reduce(n);
    case GraphOp::kMatMul:
      return infer_matmul(n);
    case GraphOp::kIndexSelect:
    case GraphOp::kGather:
      return infer_indexing(n);
    case GraphOp::kIota: {
      DVM_RETURN_IF_ERROR(normalize_axis(n, static_cast<int>(shape_attr.size()), &n.axis));
      for (int64_t d : shape_attr)
        if (d < 0) return fail(n, "bad shape " + shape_str(shape_attr));
      n.dtype = n.attr_dtype;
      n.shape = shape_attr;
      n.dims.clear();
      for (int64_t d : shape_attr) n.dims.push_back(AttrDim{AttrDim::kValue, d, 0, 0});
      return Status::ok();
    }
    default:
      return infer_composite(n);
  }
}

}  // namespace dvm::lazy::detail
