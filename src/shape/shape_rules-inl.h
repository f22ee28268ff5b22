// infer_op: the graph ops' shape and dtype rules (included by shape_rules.h).
#pragma once

namespace dvm::shape {

namespace rules_detail {

template <class D>
using Shape = std::vector<D>;

inline Status error(std::string msg) {
  return invalid_argument(std::move(msg));
}

template <class D>
Status broadcast(const Shape<D>& a, const Shape<D>& b, Shape<D>* out) {
  int bad = broadcast_dims(std::span<const D>(a), std::span<const D>(b), out, Unproven::kFail);
  if (bad < 0) return Status::ok();
  const size_t r = std::max(a.size(), b.size());
  const D x = static_cast<size_t>(bad) < r - a.size() ? D(1) : a[bad - (r - a.size())];
  const D y = static_cast<size_t>(bad) < r - b.size() ? D(1) : b[bad - (r - b.size())];
  return error("cannot broadcast " + shape_text(a) + " with " + shape_text(b) + ": dims " +
               dim_text(x) + " and " + dim_text(y) + " are not provably equal or 1");
}

// An axis of a graph op: a scalar has one axis, 0 (or -1), as in torch.
inline Status axis(int rank, int* a) {
  if (normalize_axis(a, std::max(rank, 1))) return Status::ok();
  return error("axis " + std::to_string(*a) + " out of range for rank " + std::to_string(rank));
}

inline Status axes(int rank, std::vector<int64_t>* a) {
  if (rank == 0) {  // a scalar's one axis, 0 or -1, as in torch: nothing to reduce over
    for (int64_t x : *a)
      if (x != 0 && x != -1) return error("axis " + std::to_string(x) + " out of range for rank 0");
    a->clear();
    return Status::ok();
  }
  if (normalize_axes(a, rank)) return Status::ok();
  return error("axes out of range for rank " + std::to_string(rank));
}

template <class D>
Status reshape(const Shape<D>& src, Shape<D>* target) {
  switch (resolve_reshape(numel(std::span<const D>(src)), std::span<D>(*target))) {
    case ReshapeError::kNone:
      return Status::ok();
    case ReshapeError::kSeveralInferred:
      return error("at most one -1 dim: " + shape_text(*target));
    case ReshapeError::kNegativeDim:
      return error("bad target shape " + shape_text(*target));
    case ReshapeError::kCannotInfer:
      return error("cannot infer -1 of " + shape_text(*target) + " from " + shape_text(src));
    case ReshapeError::kSizeDiffers:
      break;
  }
  return error("element count of " + shape_text(src) + " is not provably that of " +
               shape_text(*target));
}

// torch's expand: a -1 keeps the source's dim (not in the leading, new dims).
template <class D>
Status expand(const Shape<D>& src, Shape<D>* target) {
  const size_t off = target->size() >= src.size() ? target->size() - src.size() : 0;
  for (size_t i = off; i < target->size(); ++i) {
    if (is_const((*target)[i], -1)) (*target)[i] = src[i - off];
  }
  bool negative = false;
  for (const D& d : *target) negative |= is_known(d) && known_value(d) < 0;
  if (negative ||
      expand_dims(std::span<const D>(src), std::span<const D>(*target), Unproven::kFail) >= 0) {
    return error("cannot expand " + shape_text(src) + " to " + shape_text(*target));
  }
  return Status::ok();
}

template <class D>
Status permute(const Shape<D>& src, std::vector<int64_t>* perm, Shape<D>* out) {
  if (!normalize_permutation(std::span<int64_t>(*perm), static_cast<int>(src.size()))) {
    return error("invalid permutation for shape " + shape_text(src));
  }
  Shape<D> res;
  for (int64_t p : *perm) res.push_back(src[p]);
  *out = std::move(res);
  return Status::ok();
}

template <class D>
Status slice(const Shape<D>& src, const OpSite<D>& site, Shape<D>* out) {
  DVM_RETURN_IF_ERROR(axis(static_cast<int>(src.size()), site.axis));
  Shape<D>& bounds = *site.dims;
  if (src.empty() || bounds.size() != 2 || site.ints->size() != 1 || (*site.ints)[0] <= 0) {
    return error("needs a source of rank >= 1, {start, stop} and a positive step");
  }
  SliceDims<D> s = slice_dims(src[*site.axis], bounds[0], bounds[1], (*site.ints)[0]);
  bounds = {s.start, s.stop};
  *out = src;
  (*out)[*site.axis] = s.extent;
  return Status::ok();
}

template <class D, class Operands>
Status concat(const Operands& in, const OpSite<D>& site, Shape<D>* shape, DType* dtype) {
  if (in.size() == 0) return error("no inputs");
  const Shape<D>& first = in.shape(0);
  DVM_RETURN_IF_ERROR(axis(static_cast<int>(first.size()), site.axis));
  if (first.empty()) return error("cannot concatenate 0-d tensors");
  DType t = in.dtype(0);
  D total(0);
  for (size_t i = 0; i < in.size(); ++i) {
    const Shape<D>& s = in.shape(i);
    t = promote_types(t, in.dtype(i));
    if (!concat_fits(std::span<const D>(first), std::span<const D>(s), *site.axis,
                     Unproven::kFail)) {
      return error("shapes " + shape_text(first) + " and " + shape_text(s) + " differ");
    }
    total = total + s[*site.axis];
  }
  *shape = first;
  (*shape)[*site.axis] = total;
  *dtype = t;
  return Status::ok();
}

template <class D>
Status reduce(const Shape<D>& src, DType t, const OpSite<D>& site, Shape<D>* shape, DType* dtype) {
  DVM_RETURN_IF_ERROR(axes(static_cast<int>(src.size()), site.ints));
  auto op = static_cast<ReduceOp>(site.sub);
  if (ops::is_arg_reduce(op) && site.ints->size() != 1) return error("exactly one axis required");
  reduce_dims(std::span<const D>(src), std::span<const int64_t>(*site.ints), site.flag, shape);
  *dtype = ops::reduce_result_dtype(op, t);
  return Status::ok();
}

template <class D, class Operands>
Status matmul(const Operands& in, const OpSite<D>& site, Shape<D>* shape, DType* dtype) {
  std::vector<int64_t>& t = *site.ints;
  if (t.size() != 2) t = {0, 0};
  const Shape<D>& a = in.shape(0);
  const Shape<D>& b = in.shape(1);
  switch (matmul_dims(std::span<const D>(a), std::span<const D>(b), t[0] != 0, t[1] != 0, shape,
                      Unproven::kFail)) {
    case MatMulError::kNone:
      break;
    case MatMulError::kRank:
      return error("operands must have rank 2 to 4, got " + shape_text(a) + " and " +
                   shape_text(b));
    case MatMulError::kContraction:
      return error("contraction dims differ: " + shape_text(a) + " x " + shape_text(b));
    case MatMulError::kBatch:
      return error("batch dims of " + shape_text(a) + " and " + shape_text(b) +
                   " do not broadcast");
  }
  *dtype = promote_types(in.dtype(0), in.dtype(1));
  if (!is_float(*dtype)) return error("integer operands are not supported");
  return Status::ok();
}

template <class D, class Operands>
Status indexing(const Operands& in, const OpSite<D>& site, Shape<D>* shape, DType* dtype) {
  const Shape<D>& x = in.shape(0);
  const Shape<D>& idx = in.shape(1);
  // A 0-d source has no axis to index (a graph op's axis 0 is valid for rank 0).
  if (x.empty()) return error("the source must have rank >= 1, got a 0-d tensor");
  DVM_RETURN_IF_ERROR(axis(static_cast<int>(x.size()), site.axis));
  if (site.op == GraphOp::kIndexSelect) {
    if (idx.size() != 1 || !is_integer(in.dtype(1))) {
      return error("index must be a rank-1 integer tensor, got " +
                   std::string(dtype_name(in.dtype(1))) + shape_text(idx));
    }
    *shape = x;
    (*shape)[*site.axis] = idx[0];
  } else {
    if (idx.size() != x.size() || !is_integer(in.dtype(1))) {
      return error("index must be an integer tensor of the rank of " + shape_text(x));
    }
    *shape = idx;
  }
  *dtype = in.dtype(0);
  return Status::ok();
}

// cumsum: x's shape and dtype, the axis inside x's rank (rank 0: axis 0 or -1, as torch).
template <class D, class Operands>
Status cumsum(const Operands& in, const OpSite<D>& site, Shape<D>* shape, DType* dtype) {
  const Shape<D>& x = in.shape(0);
  DVM_RETURN_IF_ERROR(axis(static_cast<int>(x.size()), site.axis));
  if (in.dtype(0) == DType::kBool) return error("cumsum of bool: cast to an integer type first");
  *shape = x;
  *dtype = in.dtype(0);
  return Status::ok();
}

template <class D>
Status iota(const OpSite<D>& site, Shape<D>* shape, DType* dtype) {
  const Shape<D>& dims = *site.dims;
  DVM_RETURN_IF_ERROR(axis(static_cast<int>(dims.size()), site.axis));
  for (const D& d : dims) {
    if (is_known(d) && known_value(d) < 0) return error("bad shape " + shape_text(dims));
  }
  *shape = dims;
  *dtype = site.attr_dtype;
  return Status::ok();
}

template <class D, class Operands>
Status norm(const Operands& in, int normalized, Shape<D>* shape, DType* dtype) {
  const Shape<D>& x = in.shape(0);
  if (normalized < 1 || normalized > static_cast<int>(x.size())) {
    return error("bad number of normalised axes");
  }
  Shape<D> tail(x.end() - normalized, x.end());
  for (size_t i = 1; i < in.size(); ++i) {
    if (!(in.shape(i) == tail)) {
      return error("weight/bias shape " + shape_text(in.shape(i)) +
                   " does not match the normalised dims " + shape_text(tail));
    }
  }
  *shape = x;
  *dtype = ops::float_dtype(in.dtype(0));
  return Status::ok();
}

template <class D, class Operands>
Status linear(const Operands& in, Shape<D>* shape, DType* dtype) {
  const Shape<D>& x = in.shape(0);
  const Shape<D>& w = in.shape(1);
  if (x.empty() || w.size() != 2 || !(x.back() == w[1])) {
    return error("x " + shape_text(x) + " and weight " + shape_text(w) +
                 " do not match (weight is [out, in])");
  }
  if (in.size() == 3 && !(in.shape(2) == Shape<D>{w[0]})) {
    return error("bias " + shape_text(in.shape(2)) + " must be [" + dim_text(w[0]) + "]");
  }
  *shape = x;
  shape->back() = w[0];
  *dtype = promote_types(in.dtype(0), in.dtype(1));
  return Status::ok();
}

template <class D, class Operands>
Status attention(const Operands& in, Shape<D>* shape, DType* dtype) {
  const Shape<D>& q = in.shape(0);
  const Shape<D>& k = in.shape(1);
  const Shape<D>& v = in.shape(2);
  if (q.size() < 2 || k.size() != q.size() || v.size() != q.size() || !(q.back() == k.back()) ||
      !(k[k.size() - 2] == v[v.size() - 2])) {
    return error("q " + shape_text(q) + ", k " + shape_text(k) + ", v " + shape_text(v) +
                 " do not match");
  }
  Shape<D> qb(q.begin(), q.end() - 2), kb(k.begin(), k.end() - 2), vb(v.begin(), v.end() - 2);
  if (!(kb == vb)) {
    return error("k " + shape_text(k) + " and v " + shape_text(v) + " differ in batch dims");
  }
  // Grouped-query attention: q's heads (the axis before the sequence) a multiple of k's.
  if (attention_groups(std::span<const D>(q), std::span<const D>(k)) > 1) kb.back() = qb.back();
  DVM_RETURN_IF_ERROR(broadcast(qb, kb, shape));
  shape->push_back(q[q.size() - 2]);
  shape->push_back(v.back());
  *dtype = ops::float_dtype(in.dtype(0));
  return Status::ok();
}

template <class D, class Operands>
Status composite(const Operands& in, const OpSite<D>& site, Shape<D>* shape, DType* dtype) {
  const Shape<D>& x = in.shape(0);
  switch (site.op) {
    case GraphOp::kSoftmax:
    case GraphOp::kLogSoftmax:
      DVM_RETURN_IF_ERROR(axis(static_cast<int>(x.size()), site.axis));
      [[fallthrough]];
    case GraphOp::kGelu:
    case GraphOp::kSilu:
      *shape = x;
      *dtype = ops::float_dtype(in.dtype(0));
      return Status::ok();
    case GraphOp::kSwiglu:
      *dtype = ops::float_dtype(promote_types(in.dtype(0), in.dtype(1)));
      return broadcast(x, in.shape(1), shape);
    case GraphOp::kLayerNorm:
    case GraphOp::kRmsNorm:
      return norm(in, *site.axis, shape, dtype);
    case GraphOp::kLinear:
      return linear(in, shape, dtype);
    case GraphOp::kEmbedding:
      if (x.size() != 2 || !is_integer(in.dtype(1))) {
        return error("needs weight [V, D] and integer ids, got " + shape_text(x));
      }
      *shape = in.shape(1);
      shape->push_back(x[1]);
      *dtype = in.dtype(0);
      return Status::ok();
    case GraphOp::kVariance:
    case GraphOp::kStd: {
      OpSite<D> sum = site;
      sum.sub = static_cast<int>(ReduceOp::kSum);
      DVM_RETURN_IF_ERROR(reduce(x, in.dtype(0), sum, shape, dtype));
      *dtype = ops::float_dtype(in.dtype(0));
      return Status::ok();
    }
    case GraphOp::kCrossEntropy: {
      const Shape<D>& t = in.shape(1);
      if (x.size() != 2 || t.size() != 1 || !(t[0] == x[0]) || !is_integer(in.dtype(1))) {
        return error("needs logits [N, C] and integer targets [N], got " + shape_text(x) + " and " +
                     shape_text(t));
      }
      shape->clear();
      *dtype = ops::float_dtype(in.dtype(0));
      return Status::ok();
    }
    case GraphOp::kAttention:
      return attention(in, shape, dtype);
    case GraphOp::kClamp:
      *shape = x;
      *dtype = in.dtype(0);
      return Status::ok();
    default:
      return error(std::string("no shape rule for ") + graph_op_name(site.op));
  }
}

}  // namespace rules_detail

template <class D, class Operands>
Status infer_op(const Operands& in, const OpSite<D>& site, std::vector<D>* shape, DType* dtype) {
  namespace r = rules_detail;
  switch (site.op) {
    case GraphOp::kConstant:
      shape->clear();
      *dtype = site.attr_dtype;
      return Status::ok();
    case GraphOp::kCast:
      *shape = in.shape(0);
      *dtype = site.attr_dtype;
      return Status::ok();
    case GraphOp::kUnary:
      *shape = in.shape(0);
      *dtype = ops::unary_result_dtype(static_cast<UnaryOp>(site.sub), in.dtype(0));
      return Status::ok();
    case GraphOp::kBinary:
      *dtype = ops::binary_result_dtype(static_cast<BinaryOp>(site.sub), in.dtype(0), in.dtype(1));
      return r::broadcast(in.shape(0), in.shape(1), shape);
    case GraphOp::kSelect: {
      std::vector<D> s;
      *dtype = promote_types(in.dtype(1), in.dtype(2));
      DVM_RETURN_IF_ERROR(r::broadcast(in.shape(0), in.shape(1), &s));
      return r::broadcast(s, in.shape(2), shape);
    }
    case GraphOp::kBroadcast:
      *dtype = in.dtype(0);
      DVM_RETURN_IF_ERROR(r::expand(in.shape(0), site.dims));
      *shape = *site.dims;
      return Status::ok();
    case GraphOp::kReshape:
      *dtype = in.dtype(0);
      DVM_RETURN_IF_ERROR(r::reshape(in.shape(0), site.dims));
      *shape = *site.dims;
      return Status::ok();
    case GraphOp::kPermute:
      *dtype = in.dtype(0);
      return r::permute(in.shape(0), site.ints, shape);
    case GraphOp::kSlice:
      *dtype = in.dtype(0);
      return r::slice(in.shape(0), site, shape);
    case GraphOp::kConcat:
      return r::concat(in, site, shape, dtype);
    case GraphOp::kReduce:
      return r::reduce(in.shape(0), in.dtype(0), site, shape, dtype);
    case GraphOp::kMatMul:
      return r::matmul(in, site, shape, dtype);
    case GraphOp::kIndexSelect:
    case GraphOp::kGather:
      return r::indexing(in, site, shape, dtype);
    case GraphOp::kIota:
      return r::iota(site, shape, dtype);
    case GraphOp::kCumsum:
      return r::cumsum(in, site, shape, dtype);
    default:
      return r::composite(in, site, shape, dtype);
  }
}

}  // namespace dvm::shape
