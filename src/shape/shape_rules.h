// Shape and dtype rules, written once for the three kinds of dims DVM reasons about:
//   int64_t  exact dims: the kernel IR at bind time, the lazy runtime at record time;
//   SymExpr  symbolic dims: the graph IR (dims must be provably consistent);
//   Dim      the kernel builder's dims: a constant, or a symbol bound only at run time.
// The dim rules (broadcasting, reshape, slicing, concatenation, reduction, matmul) serve all
// three; infer_op applies them to a graph op and serves the graph IR and the lazy runtime, so
// a shape recorded lazily is the shape the graph derives for the same op.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dvm/graph.h"
#include "dvm/kernel.h"
#include "dvm/status.h"
#include "dvm/sym.h"
#include "ops/dtype_rules.h"

namespace dvm::shape {

// ---------------------------------------------------------------------------------------------
// Dim algebra

// What can be proved about two dims.
enum class Proof { kEqual, kDiffer, kUnknown };

// What a rule does with dims it can neither prove equal nor different: the graph IR refuses
// them (its shapes must be consistent for every binding), the kernel builder leaves them to
// bind time, where every dim is exact.
enum class Unproven { kFail, kDefer };

inline bool is_known(int64_t) {
  return true;
}
inline bool is_known(const SymExpr& d) {
  return d.is_constant();
}
inline bool is_known(const Dim& d) {
  return !d.is_symbol();
}
inline int64_t known_value(int64_t d) {
  return d;
}
inline int64_t known_value(const SymExpr& d) {
  return d.constant_value();
}
inline int64_t known_value(const Dim& d) {
  return d.value();
}
template <class D>
bool is_const(const D& d, int64_t v) {
  return is_known(d) && known_value(d) == v;
}
template <class D>
Proof compare(const D& a, const D& b) {
  if (a == b) return Proof::kEqual;
  return is_known(a) && is_known(b) ? Proof::kDiffer : Proof::kUnknown;
}

inline int64_t min_dim(int64_t a, int64_t b) {
  return std::min(a, b);
}
inline SymExpr min_dim(const SymExpr& a, const SymExpr& b) {
  return min(a, b);
}
inline int64_t max_dim(int64_t a, int64_t b) {
  return std::max(a, b);
}
inline SymExpr max_dim(const SymExpr& a, const SymExpr& b) {
  return max(a, b);
}
// a * b; false when it overflows int64 (symbolic products are checked when evaluated).
inline bool mul_dim(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
inline bool mul_dim(const SymExpr& a, const SymExpr& b, SymExpr* out) {
  *out = a * b;
  return true;
}
// floor(a / b) for a >= 0 and b >= 1 (element counts).
inline int64_t div_dim(int64_t a, int64_t b) {
  return a / b;
}
inline SymExpr div_dim(const SymExpr& a, const SymExpr& b) {
  return floordiv(a, b);
}
// ceil(n / step) for n >= 0 and step >= 1 (no overflow for any int64 step).
inline int64_t ceil_div_dim(int64_t n, int64_t step) {
  return n > 0 ? (n - 1) / step + 1 : 0;
}
inline SymExpr ceil_div_dim(const SymExpr& n, int64_t step) {
  return floordiv(n + SymExpr(step - 1), SymExpr(step));
}

inline std::string dim_text(int64_t d) {
  return std::to_string(d);
}
inline std::string dim_text(const SymExpr& d) {
  return d.to_string();
}
template <class D>
std::string shape_text(std::span<const D> s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + dim_text(s[i]);
  return r + "]";
}
template <class D>
std::string shape_text(const std::vector<D>& s) {
  return shape_text(std::span<const D>(s));
}

template <class D>
D numel(std::span<const D> s) {
  D p(1);
  for (const D& d : s) p = p * d;
  return p;
}

// ---------------------------------------------------------------------------------------------
// Dim rules. `Out` is any shape container with clear() and push_back() (std::vector, CShape);
// it may alias an input.

// Broadcasting (numpy): a and b right-aligned, a dim of 1 stretches to the other. Returns -1,
// or the result dim where a and b cannot broadcast.
template <class D, class Out>
int broadcast_dims(std::span<const D> a, std::span<const D> b, Out* out, Unproven unproven) {
  const size_t r = std::max(a.size(), b.size());
  Out res;
  for (size_t i = 0; i < r; ++i) {
    const D x = i < r - a.size() ? D(1) : a[i - (r - a.size())];
    const D y = i < r - b.size() ? D(1) : b[i - (r - b.size())];
    Proof p = compare(x, y);
    if (p == Proof::kEqual || is_const(y, 1)) {
      res.push_back(x);
    } else if (is_const(x, 1)) {
      res.push_back(y);
    } else if (p == Proof::kDiffer || unproven == Unproven::kFail) {
      return static_cast<int>(i);
    } else {
      res.push_back(is_known(x) ? x : y);  // a constant wins; the symbol is checked when bound
    }
  }
  *out = std::move(res);
  return -1;
}

// Broadcasting `src` to `target` (a torch expand): target has at least src's rank and each of
// src's dims equals its (right-aligned) target dim or is 1. Returns -1, or the failing target
// dim (0 when the ranks cannot match).
template <class D>
int expand_dims(std::span<const D> src, std::span<const D> target, Unproven unproven) {
  if (target.size() < src.size()) return 0;
  const size_t off = target.size() - src.size();
  for (size_t i = 0; i < src.size(); ++i) {
    Proof p = compare(src[i], target[off + i]);
    if (p == Proof::kEqual || is_const(src[i], 1)) continue;
    if (p == Proof::kDiffer || unproven == Unproven::kFail) return static_cast<int>(off + i);
  }
  return -1;
}

enum class ReshapeError { kNone, kSeveralInferred, kNegativeDim, kCannotInfer, kSizeDiffers };

// A reshape target may hold one -1 (inferred from the element count), no other negative dim.
template <class D>
ReshapeError check_reshape_target(std::span<const D> target) {
  int inferred = 0;
  for (const D& d : target) {
    if (is_const(d, -1)) {
      if (++inferred > 1) return ReshapeError::kSeveralInferred;
    } else if (is_known(d) && known_value(d) < 0) {
      return ReshapeError::kNegativeDim;
    }
  }
  return ReshapeError::kNone;
}

// Resolves the -1 of a reshape target in place from the source's element count `total`, and
// checks that the element count is kept (provably, for symbolic dims).
template <class D>
ReshapeError resolve_reshape(const D& total, std::span<D> target) {
  ReshapeError e = check_reshape_target(std::span<const D>(target));
  if (e != ReshapeError::kNone) return e;
  D known(1);
  D* inferred = nullptr;
  for (D& d : target) {
    if (is_const(d, -1)) {
      inferred = &d;
    } else if (!mul_dim(known, d, &known)) {
      return ReshapeError::kSizeDiffers;
    }
  }
  if (inferred == nullptr) return known == total ? ReshapeError::kNone : ReshapeError::kSizeDiffers;
  if (is_const(known, 0)) return ReshapeError::kCannotInfer;
  D d = div_dim(total, known);
  if (!(d * known == total)) return ReshapeError::kCannotInfer;
  *inferred = d;
  return ReshapeError::kNone;
}

// Normalises an axis in place (negative counts from the end); false when out of [0, rank).
inline bool normalize_axis(int* axis, int rank) {
  if (*axis < 0) *axis += rank;
  return *axis >= 0 && *axis < rank;
}

// Normalises reduction axes in place: none means all, negatives count from the end, sorted,
// each once. False when an axis is out of range.
template <class I>
bool normalize_axes(std::vector<I>* axes, int rank) {
  if (axes->empty())
    for (int i = 0; i < rank; ++i) axes->push_back(static_cast<I>(i));
  for (I& a : *axes) {
    int ai = static_cast<int>(a);
    if (static_cast<I>(ai) != a || !normalize_axis(&ai, rank)) return false;
    a = static_cast<I>(ai);
  }
  std::sort(axes->begin(), axes->end());
  axes->erase(std::unique(axes->begin(), axes->end()), axes->end());
  return true;
}

// Normalises a permutation in place (negatives count from the end); false unless it names
// each of the `rank` axes once.
template <class I>
bool normalize_permutation(std::span<I> perm, int rank) {
  if (perm.size() != static_cast<size_t>(rank)) return false;
  std::vector<bool> seen(rank, false);
  for (I& p : perm) {
    int pi = static_cast<int>(p);
    if (static_cast<I>(pi) != p || !normalize_axis(&pi, rank) || seen[pi]) return false;
    seen[pi] = true;
    p = static_cast<I>(pi);
  }
  return true;
}

// The dims left by reducing the (normalised) `axes` of `in`; 1s where keepdims.
template <class D, class I, class Out>
void reduce_dims(std::span<const D> in, std::span<const I> axes, bool keepdims, Out* out) {
  Out res;
  for (size_t i = 0; i < in.size(); ++i) {
    bool reduced = std::find(axes.begin(), axes.end(), static_cast<I>(i)) != axes.end();
    if (!reduced) {
      res.push_back(in[i]);
    } else if (keepdims) {
      res.push_back(D(1));
    }
  }
  *out = std::move(res);
}

// A canonical slice of a dim: start and stop clamped into [0, dim] (negative counts from the
// end; kSymMax and above, kSliceEnd among them, mean the end), stop >= start, and the extent
// ceil((stop - start) / step).
template <class D>
struct SliceDims {
  D start, stop, extent;
};
template <class D>
SliceDims<D> slice_dims(const D& dim, D start, D stop, int64_t step) {
  auto canon = [&dim](D v) {
    if (is_known(v) && known_value(v) >= kSymMax) return dim;
    if (is_known(v) && known_value(v) < 0) v = max_dim(dim + v, D(0));
    return min_dim(v, dim);
  };
  SliceDims<D> s{canon(start), D(0), D(0)};
  s.stop = max_dim(canon(stop), s.start);
  s.extent = ceil_div_dim(s.stop - s.start, step);
  return s;
}

// Whether `part` can be concatenated to `first` along `axis`: the same rank, equal dims off
// the axis.
template <class D>
bool concat_fits(std::span<const D> first, std::span<const D> part, int axis, Unproven unproven) {
  if (part.size() != first.size()) return false;
  for (size_t d = 0; d < part.size(); ++d) {
    if (static_cast<int>(d) == axis) continue;
    Proof p = compare(part[d], first[d]);
    if (p == Proof::kDiffer || (p == Proof::kUnknown && unproven == Unproven::kFail)) return false;
  }
  return true;
}

enum class MatMulError { kNone, kRank, kContraction, kBatch };

// [.., M, K] x [.., K, N] -> [broadcast batch.., M, N], after swapping the last two dims of a
// (transpose_a) or b (transpose_b). At most two batch dims.
template <class D, class Out>
MatMulError matmul_dims(std::span<const D> a, std::span<const D> b, bool transpose_a,
                        bool transpose_b, Out* out, Unproven unproven) {
  if (a.size() < 2 || b.size() < 2 || a.size() > 4 || b.size() > 4) return MatMulError::kRank;
  const size_t ra = a.size(), rb = b.size();
  const D& m = a[transpose_a ? ra - 1 : ra - 2];
  const D& ka = a[transpose_a ? ra - 2 : ra - 1];
  const D& kb = b[transpose_b ? rb - 1 : rb - 2];
  const D& n = b[transpose_b ? rb - 2 : rb - 1];
  Proof p = compare(ka, kb);
  if (p == Proof::kDiffer || (p == Proof::kUnknown && unproven == Unproven::kFail)) {
    return MatMulError::kContraction;
  }
  Out res;
  if (broadcast_dims(a.first(ra - 2), b.first(rb - 2), &res, unproven) >= 0) {
    return MatMulError::kBatch;
  }
  res.push_back(m);
  res.push_back(n);
  *out = std::move(res);
  return MatMulError::kNone;
}

// Grouped-query attention: q's heads per k/v head when q [.., Hq, S, D] has a constant multiple
// of k's Hk > 1 heads (query head h reads k/v head h / (Hq / Hk)); else 1.
template <class D>
int attention_groups(std::span<const D> q, std::span<const D> k) {
  if (q.size() < 3 || k.size() != q.size()) return 1;
  const D& hq = q[q.size() - 3];
  const D& hk = k[k.size() - 3];
  if (!is_known(hq) || !is_known(hk) || known_value(hk) <= 1) return 1;
  int64_t a = known_value(hq), b = known_value(hk);
  return a > b && a % b == 0 ? static_cast<int>(a / b) : 1;
}

// ---------------------------------------------------------------------------------------------
// Graph ops (the graph IR on SymExpr dims, the lazy runtime on int64_t dims)

// An op as the graph IR and the lazy runtime hold it. The rules normalise the attributes in
// place: axes non-negative and sorted, reshape's -1 resolved, slice bounds canonical.
template <class D>
struct OpSite {
  GraphOp op = GraphOp::kInput;
  int sub = 0;  // UnaryOp / BinaryOp / ReduceOp
  int* axis = nullptr;
  bool flag = false;                     // keepdims
  std::vector<int64_t>* ints = nullptr;  // axes, permutation, slice step, matmul transposes
  std::vector<D>* dims = nullptr;        // target shape (broadcast, reshape, iota), slice bounds
  DType attr_dtype = DType::kF32;        // cast target, constant and iota dtype
};

// Shape and dtype of `site` applied to `in` (size(), shape(i), dtype(i)). Errors carry the
// reason and the dims, not the op's name: callers prefix the op as their users know it.
template <class D, class Operands>
Status infer_op(const Operands& in, const OpSite<D>& site, std::vector<D>* shape, DType* dtype);

}  // namespace dvm::shape

#include "shape/shape_rules-inl.h"
