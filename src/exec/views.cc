// View resolution (see views.h).
#include "exec/views.h"

namespace dvm::exec {

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
  return s;
}

// Walks the old dims from the innermost outward, grouping runs of dims that are contiguous
// with each other ("chunks"); each chunk must be covered exactly by a run of new dims.
bool reshape_strides(const std::vector<int64_t>& old_shape, const std::vector<int64_t>& old_strides,
                     const std::vector<int64_t>& new_shape, std::vector<int64_t>* new_strides) {
  int64_t numel = 1;
  for (int64_t d : old_shape) numel *= d;
  if (numel == 0 || old_shape.empty()) {
    *new_strides = contiguous_strides(new_shape);
    return true;
  }
  new_strides->assign(new_shape.size(), 0);
  int view_d = static_cast<int>(new_shape.size()) - 1;
  int64_t chunk_base = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int td = static_cast<int>(old_shape.size()) - 1; td >= 0; --td) {
    tensor_numel *= old_shape[td];
    bool chunk_end =
        td == 0 || (old_shape[td - 1] != 1 && old_strides[td - 1] != tensor_numel * chunk_base);
    if (!chunk_end) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
      (*new_strides)[view_d] = view_numel * chunk_base;
      view_numel *= new_shape[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return false;
    if (td > 0) {
      chunk_base = old_strides[td - 1];
      tensor_numel = 1;
      view_numel = 1;
    }
  }
  return view_d == -1;
}

bool apply_view(const graph::Node& n, const std::vector<int64_t>& out_shape,
                const SymBindings& bindings, TensorArg* t) {
  switch (n.op) {
    case GraphOp::kBroadcast: {
      size_t off = out_shape.size() - t->shape.size();
      std::vector<int64_t> strides(out_shape.size(), 0);
      for (size_t i = 0; i < t->shape.size(); ++i) {
        strides[off + i] = t->shape[i] == out_shape[off + i] ? t->strides[i] : 0;
      }
      t->strides = std::move(strides);
      break;
    }
    case GraphOp::kPermute: {
      std::vector<int64_t> strides;
      for (int64_t p : n.ints) strides.push_back(t->strides[p]);
      t->strides = std::move(strides);
      break;
    }
    case GraphOp::kSlice: {
      StatusOr<int64_t> s = n.sym[0].evaluate(bindings);
      int64_t start = s.is_ok() ? *s : 0;  // bindings were validated before any view
      if (out_shape[n.axis] > 0) t->offset += start * t->strides[n.axis];
      t->strides[n.axis] *= n.ints[0];
      break;
    }
    case GraphOp::kReshape: {
      std::vector<int64_t> strides;
      if (!reshape_strides(t->shape, t->strides, out_shape, &strides)) return false;
      t->strides = std::move(strides);
      break;
    }
    default:
      return false;
  }
  t->shape = out_shape;
  return true;
}

}  // namespace dvm::exec
