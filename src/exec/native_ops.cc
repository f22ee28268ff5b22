// Native ops (see native_ops.h). Loops walk all dims but the innermost with an index counter
// and move the innermost dim with a stride loop (memcpy when both sides are contiguous).
#include "exec/native_ops.h"

#include <cstring>

#include "ops/scalar_ops.h"

namespace dvm::exec {

namespace {

char* elem_ptr(const TensorArg& t, int64_t elem_offset) {
  return static_cast<char*>(t.data) + (t.offset + elem_offset) * dtype_size(t.dtype);
}

int64_t dot(const std::vector<int64_t>& idx, const std::vector<int64_t>& strides) {
  int64_t o = 0;
  for (size_t i = 0; i < idx.size(); ++i) o += idx[i] * strides[i];
  return o;
}

std::vector<int64_t> strides_of(const TensorArg& t) {
  if (!t.strides.empty()) return t.strides;
  std::vector<int64_t> s(t.shape.size(), 1);
  for (int i = static_cast<int>(t.shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * t.shape[i + 1];
  return s;
}

// Calls fn(idx) for every index of `shape` with the last dim fixed at 0.
template <typename F>
void for_each_row(const std::vector<int64_t>& shape, F fn) {
  for (int64_t d : shape)
    if (d == 0) return;
  std::vector<int64_t> idx(shape.size(), 0);
  if (shape.empty()) {
    fn(idx);
    return;
  }
  while (true) {
    fn(idx);
    int k = static_cast<int>(shape.size()) - 2;
    while (k >= 0 && ++idx[k] == shape[k]) idx[k--] = 0;
    if (k < 0) return;
  }
}

int64_t read_index(const TensorArg& t, int64_t elem_offset) {
  const char* p = elem_ptr(t, elem_offset);
  if (t.dtype == DType::kI32) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  int64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Are t's dims after `axis` laid out contiguously (row-major, no gaps: one memcpy each)?
bool dense_after(const TensorArg& t, const std::vector<int64_t>& strides, int axis) {
  int64_t want = 1;
  for (int d = static_cast<int>(t.shape.size()) - 1; d > axis; --d) {
    if (t.shape[d] != 1 && strides[d] != want) return false;
    want *= t.shape[d];
  }
  return true;
}

// Are all n indices (at element stride `is`) in [0, dim)? One branch-free pass; the caller
// finds the first bad one to report.
template <typename I>
bool all_below(const I* idx, int64_t is, int64_t n, int64_t dim) {
  bool bad = false;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t v = idx[k * is];
    bad |= (v < 0) | (v >= dim);
  }
  return !bad;
}

bool indices_below(const TensorArg& index, int64_t is, int64_t n, int64_t dim) {
  const char* ip = elem_ptr(index, 0);
  if (index.dtype == DType::kI32)
    return all_below(reinterpret_cast<const int32_t*>(ip), is, n, dim);
  return all_below(reinterpret_cast<const int64_t*>(ip), is, n, dim);
}

// out row k = x row index[k], rows of `row` bytes at byte strides xs and os; the indices were
// checked. Rows of a few bytes (T5's position bias: 4 heads, 16 bytes, T * T of them) copy at
// a size known here rather than through a memcpy call each.
template <int64_t kBytes, typename I>
void copy_rows_of(int64_t n, const I* idx, int64_t is, const char* x, int64_t xs, char* out,
                  int64_t os) {
  for (int64_t k = 0; k < n; ++k)
    std::memcpy(out + k * os, x + static_cast<int64_t>(idx[k * is]) * xs, kBytes);
}

template <typename I>
void copy_rows_typed(int64_t row, int64_t n, const I* idx, int64_t is, const char* x, int64_t xs,
                     char* out, int64_t os) {
  switch (row) {
    case 4:
      return copy_rows_of<4>(n, idx, is, x, xs, out, os);
    case 8:
      return copy_rows_of<8>(n, idx, is, x, xs, out, os);
    case 16:
      return copy_rows_of<16>(n, idx, is, x, xs, out, os);
    case 32:
      return copy_rows_of<32>(n, idx, is, x, xs, out, os);
    default:
      for (int64_t k = 0; k < n; ++k) {
        std::memcpy(out + k * os, x + static_cast<int64_t>(idx[k * is]) * xs,
                    static_cast<size_t>(row));
      }
  }
}

void copy_rows(int64_t row, int64_t n, const TensorArg& index, int64_t is, const char* x,
               int64_t xs, char* out, int64_t os) {
  const char* ip = elem_ptr(index, 0);
  if (index.dtype == DType::kI32) {
    copy_rows_typed(row, n, reinterpret_cast<const int32_t*>(ip), is, x, xs, out, os);
  } else {
    copy_rows_typed(row, n, reinterpret_cast<const int64_t*>(ip), is, x, xs, out, os);
  }
}

}  // namespace

void strided_copy(const TensorArg& in, const TensorArg& out) {
  std::vector<int64_t> si = strides_of(in), so = strides_of(out);
  int64_t es = dtype_size(in.dtype);
  int64_t inner = in.shape.empty() ? 1 : in.shape.back();
  int64_t sin = in.shape.empty() ? 0 : si.back(), sout = out.shape.empty() ? 0 : so.back();
  for_each_row(in.shape, [&](const std::vector<int64_t>& idx) {
    char* src = elem_ptr(in, dot(idx, si));
    char* dst = elem_ptr(out, dot(idx, so));
    if (sin == 1 && sout == 1) {
      std::memcpy(dst, src, inner * es);
      return;
    }
    for (int64_t j = 0; j < inner; ++j) std::memcpy(dst + j * sout * es, src + j * sin * es, es);
  });
}

Status index_select(const std::string& where, const TensorArg& x, const TensorArg& index, int axis,
                    const TensorArg& out) {
  std::vector<int64_t> sx = strides_of(x), si = strides_of(index), so = strides_of(out);
  int64_t dim = x.shape[axis];
  int64_t n = index.shape[0];
  if (!indices_below(index, si[0], n, dim)) {
    for (int64_t k = 0; k < n; ++k) {
      int64_t v = read_index(index, k * si[0]);
      if (v < 0 || v >= dim) {
        return out_of_range(where + ": index " + std::to_string(v) + " out of range for dim " +
                            std::to_string(axis) + " of size " + std::to_string(dim));
      }
    }
  }
  if (axis == 0 && dense_after(x, sx, 0) && dense_after(out, so, 0)) {
    // Rows of an embedding table: one copy of a contiguous row per index (the strided path
    // below builds two sub-views per index: T5's [T * T]-index position-bias lookup took
    // 0.9 ms at T = 128, eager 26 us).
    int64_t row = dtype_size(x.dtype);
    for (size_t d = 1; d < x.shape.size(); ++d) row *= x.shape[d];
    copy_rows(row, n, index, si[0], elem_ptr(x, 0), sx[0] * dtype_size(x.dtype), elem_ptr(out, 0),
              so[0] * dtype_size(out.dtype));
    return Status::ok();
  }
  // Copy out[.., k, ..] = x[.., index[k], ..] as strided sub-views.
  for (int64_t k = 0; k < n; ++k) {
    int64_t v = read_index(index, k * si[0]);
    TensorArg src = x, dst = out;
    src.strides = sx;
    dst.strides = so;
    src.offset += v * sx[axis];
    dst.offset += k * so[axis];
    src.shape.erase(src.shape.begin() + axis);
    src.strides.erase(src.strides.begin() + axis);
    dst.shape.erase(dst.shape.begin() + axis);
    dst.strides.erase(dst.strides.begin() + axis);
    strided_copy(src, dst);
  }
  return Status::ok();
}

Status gather(const std::string& where, const TensorArg& x, const TensorArg& index, int axis,
              const TensorArg& out) {
  std::vector<int64_t> sx = strides_of(x), si = strides_of(index), so = strides_of(out);
  int64_t es = dtype_size(x.dtype);
  int64_t dim = x.shape[axis];
  Status status;
  std::vector<int64_t> full(index.shape.size());
  int64_t inner = index.shape.empty() ? 1 : index.shape.back();
  int last = static_cast<int>(index.shape.size()) - 1;
  for_each_row(index.shape, [&](const std::vector<int64_t>& idx) {
    if (!status.is_ok()) return;
    full = idx;
    for (int64_t j = 0; j < inner; ++j) {
      if (last >= 0) full[last] = j;
      int64_t v = read_index(index, dot(full, si));
      if (v < 0 || v >= dim) {
        status = out_of_range(where + ": index " + std::to_string(v) + " out of range for dim " +
                              std::to_string(axis) + " of size " + std::to_string(dim));
        return;
      }
      int64_t src_off = dot(full, sx) + (v - full[axis]) * sx[axis];
      std::memcpy(elem_ptr(out, dot(full, so)), elem_ptr(x, src_off), es);
    }
  });
  return status;
}

namespace {

// Calls fn(x_offset, out_offset) at the start of every line along `axis` (all other dims
// counted through), with the element offsets of x and out there.
template <typename F>
void for_each_line(const TensorArg& x, const TensorArg& out, int axis, F fn) {
  const std::vector<int64_t> sx = strides_of(x), so = strides_of(out);
  std::vector<int64_t> shape = x.shape;
  for (int64_t d : shape)
    if (d == 0) return;
  if (!shape.empty()) shape[axis] = 1;
  std::vector<int64_t> idx(shape.size(), 0);
  while (true) {
    fn(dot(idx, sx), dot(idx, so));
    int k = static_cast<int>(shape.size()) - 1;
    while (k >= 0 && ++idx[k] == shape[k]) idx[k--] = 0;
    if (k < 0) return;
  }
}

template <typename T, typename Acc, typename Load, typename Store>
void cumsum_typed(const TensorArg& x, int axis, const TensorArg& out, Load load, Store store) {
  const int64_t n = x.shape.empty() ? 1 : x.shape[axis];
  const int64_t step_x = x.shape.empty() ? 0 : strides_of(x)[axis];
  const int64_t step_o = out.shape.empty() ? 0 : strides_of(out)[axis];
  for_each_line(x, out, axis, [&](int64_t ox, int64_t oo) {
    Acc acc{};
    for (int64_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, elem_ptr(x, ox + i * step_x), sizeof(T));
      acc = acc + load(v);
      const T r = store(acc);
      std::memcpy(elem_ptr(out, oo + i * step_o), &r, sizeof(T));
    }
  });
}

}  // namespace

void cumsum(const TensorArg& x, int axis, const TensorArg& out) {
  switch (x.dtype) {
    case DType::kF32:
      return cumsum_typed<float, double>(
          x, axis, out, [](float v) { return static_cast<double>(v); },
          [](double a) { return static_cast<float>(a); });
    case DType::kF16:
      return cumsum_typed<uint16_t, float>(
          x, axis, out, [](uint16_t v) { return ops::f16_bits_to_f32(v); },
          [](float a) { return ops::f32_to_f16_bits(a); });
    case DType::kBF16:
      return cumsum_typed<uint16_t, float>(
          x, axis, out, [](uint16_t v) { return ops::bf16_bits_to_f32(v); },
          [](float a) { return ops::f32_to_bf16_bits(a); });
    case DType::kI32:  // wraps: unsigned arithmetic (signed overflow is undefined)
      return cumsum_typed<int32_t, uint32_t>(
          x, axis, out, [](int32_t v) { return static_cast<uint32_t>(v); },
          [](uint32_t a) { return static_cast<int32_t>(a); });
    case DType::kI64:
      return cumsum_typed<int64_t, uint64_t>(
          x, axis, out, [](int64_t v) { return static_cast<uint64_t>(v); },
          [](uint64_t a) { return static_cast<int64_t>(a); });
    case DType::kBool:  // refused by shape inference
      return;
  }
}

namespace {

// Stores v (an index) as `dtype` at p: f16/bf16 rounded from f32 (once left unwritten); bool
// as v != 0.
void store_index(DType dtype, char* p, int64_t v) {
  switch (dtype) {
    case DType::kI64:
      std::memcpy(p, &v, 8);
      return;
    case DType::kI32: {
      const int32_t w = static_cast<int32_t>(v);
      std::memcpy(p, &w, 4);
      return;
    }
    case DType::kF32: {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      return;
    }
    case DType::kF16:
    case DType::kBF16: {
      const float f = static_cast<float>(v);
      const uint16_t h = dtype == DType::kF16 ? ops::f32_to_f16_bits(f) : ops::f32_to_bf16_bits(f);
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::kBool: {
      const uint8_t b = v != 0;
      std::memcpy(p, &b, 1);
      return;
    }
  }
}

// One row of an iota along its last dim: v0, v0 + 1, ... (typed loops: a [T, T] iota is a
// few microseconds, not a call per element).
template <typename T>
void iota_row(char* p, int64_t stride_bytes, int64_t n, int64_t v0, bool along) {
  for (int64_t j = 0; j < n; ++j) {
    const T v = static_cast<T>(along ? v0 + j : v0);
    std::memcpy(p + j * stride_bytes, &v, sizeof(T));
  }
}

}  // namespace

void iota(const TensorArg& out, int axis) {
  std::vector<int64_t> so = strides_of(out);
  const int64_t inner = out.shape.empty() ? 1 : out.shape.back();
  const int last = static_cast<int>(out.shape.size()) - 1;
  const bool along = axis == last;
  const int64_t es = dtype_size(out.dtype);
  const int64_t step = last >= 0 ? so[last] * es : 0;
  for_each_row(out.shape, [&](const std::vector<int64_t>& idx) {
    char* p = elem_ptr(out, dot(idx, so));
    const int64_t v0 = idx.empty() || along ? 0 : idx[axis];
    switch (out.dtype) {
      case DType::kI64:
        return iota_row<int64_t>(p, step, inner, v0, along);
      case DType::kI32:
        return iota_row<int32_t>(p, step, inner, v0, along);
      case DType::kF32:
        return iota_row<float>(p, step, inner, v0, along);
      default:
        for (int64_t j = 0; j < inner; ++j) store_index(out.dtype, p + j * step, along ? j : v0);
    }
  });
}

void fill(const TensorArg& out, double value) {
  std::vector<int64_t> so = strides_of(out);
  char bytes[8] = {};
  switch (out.dtype) {
    case DType::kF32: {
      float f = static_cast<float>(value);
      std::memcpy(bytes, &f, 4);
      break;
    }
    case DType::kF16: {
      uint16_t h = ops::f32_to_f16_bits(static_cast<float>(value));
      std::memcpy(bytes, &h, 2);
      break;
    }
    case DType::kBF16: {
      uint16_t h = ops::f32_to_bf16_bits(static_cast<float>(value));
      std::memcpy(bytes, &h, 2);
      break;
    }
    case DType::kI32: {
      int32_t i = static_cast<int32_t>(value);
      std::memcpy(bytes, &i, 4);
      break;
    }
    case DType::kI64: {
      int64_t i = static_cast<int64_t>(value);
      std::memcpy(bytes, &i, 8);
      break;
    }
    case DType::kBool:
      bytes[0] = value != 0;
      break;
  }
  int64_t es = dtype_size(out.dtype);
  int64_t inner = out.shape.empty() ? 1 : out.shape.back();
  int64_t step = out.shape.empty() ? 0 : so.back();
  for_each_row(out.shape, [&](const std::vector<int64_t>& idx) {
    char* p = elem_ptr(out, dot(idx, so));
    for (int64_t j = 0; j < inner; ++j) std::memcpy(p + j * step * es, bytes, es);
  });
}

}  // namespace dvm::exec
