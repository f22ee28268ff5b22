// Concrete shape and dtype inference at record time: the graph IR's rules
// (src/shape/shape_rules.h) on integer dims, so a recorded value knows its shape before
// anything runs. A plan-cache miss re-derives every shape symbolically through the
// GraphBuilder and checks it against these (src/lazy/flush.cc).
#include <algorithm>

#include "lazy/lazy_internal.h"
#include "shape/shape_rules.h"

namespace dvm::lazy::detail {

namespace {

using Shape = std::vector<int64_t>;

Status fail(const Node& n, const std::string& msg) {
  std::string m = "lazy ";
  m += graph_op_name(n.op);
  m += ": ";
  m += msg;
  return invalid_argument(std::move(m));
}

// A node's operands as the shared rules read them.
struct Operands {
  const Node& n;
  size_t size() const { return n.inputs.size(); }
  const Shape& shape(size_t i) const { return n.inputs[i]->shape; }
  DType dtype(size_t i) const { return n.inputs[i]->dtype; }
};

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

// An expand's target dims: a dim kept from the source (not 1) refers to it.
void expand_dims(const Shape& src, Node& n) {
  size_t off = n.shape.size() - src.size();
  n.dims.assign(n.shape.size(), AttrDim{});
  for (size_t i = 0; i < n.shape.size(); ++i) {
    n.dims[i].value = n.shape[i];
    if (i >= off && src[i - off] == n.shape[i] && n.shape[i] != 1) {
      n.dims[i] = AttrDim{AttrDim::kSrcDim, n.shape[i], int(i - off), 0};
    }
  }
}

// A slice's bounds as given (the graph canonicalises them again); a stop at the whole dim
// refers to it.
void slice_dims(const Shape& src, const Shape& bounds, Node& n) {
  int64_t dim = src[n.axis];
  n.dims.clear();
  for (int64_t b : bounds) {
    AttrDim d;
    d.value = b >= kSymMax ? kSliceEnd : b;
    if (b == dim && dim > 1) d = AttrDim{AttrDim::kSrcDim, b, n.axis, 0};
    n.dims.push_back(d);
  }
}

}  // namespace

Status infer(Node& n, const std::vector<int64_t>& shape_attr) {
  Shape dims = shape_attr;
  shape::OpSite<int64_t> site{n.op, n.sub, &n.axis, n.flag, &n.ints, &dims, n.attr_dtype};
  Status st = shape::infer_op(Operands{n}, site, &n.shape, &n.dtype);
  if (!st.is_ok()) return fail(n, st.message());
  switch (n.op) {
    case GraphOp::kReshape:
      reshape_dims(n.inputs[0]->shape, n.shape, &n.dims);
      break;
    case GraphOp::kBroadcast:
      expand_dims(n.inputs[0]->shape, n);
      break;
    case GraphOp::kSlice:
      slice_dims(n.inputs[0]->shape, shape_attr, n);
      break;
    case GraphOp::kIota:
      n.dims.clear();
      for (int64_t d : n.shape) n.dims.push_back(AttrDim{AttrDim::kValue, d, 0, 0});
      break;
    default:
      break;
  }
  return Status::ok();
}

}  // namespace dvm::lazy::detail
