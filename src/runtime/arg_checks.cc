#include "runtime/arg_checks.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <utility>
#include <vector>

namespace dvm::runtime {

namespace {

// A view's strides, its own or the contiguous ones, without allocating for the common ranks
// (these checks run on every call).
class Strides {
 public:
  explicit Strides(const TensorArg& t) {
    if (!t.strides.empty()) {
      data_ = t.strides.data();
      return;
    }
    const size_t r = t.shape.size();
    int64_t* s = buf_;
    if (r > kMaxRank) {
      heap_.resize(r);
      s = heap_.data();
    }
    int64_t acc = 1;
    for (size_t i = r; i-- > 0;) {
      s[i] = acc;
      acc *= t.shape[i];
    }
    data_ = s;
  }
  int64_t operator[](size_t i) const { return data_[i]; }

 private:
  int64_t buf_[kMaxRank];
  std::vector<int64_t> heap_;
  const int64_t* data_;
};

bool same_layout(const TensorArg& a, const TensorArg& b) {
  if (a.offset != b.offset || a.dtype != b.dtype || a.shape != b.shape) return false;
  const Strides sa(a), sb(b);
  for (size_t i = 0; i < a.shape.size(); ++i)
    if (sa[i] != sb[i]) return false;
  return true;
}

}  // namespace

ByteExtent byte_extent(const TensorArg& t) {
  int64_t lo = t.offset, hi = t.offset;
  const Strides strides(t);
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (t.shape[i] == 0) return {};
    int64_t ext = (t.shape[i] - 1) * strides[i];
    (ext < 0 ? lo : hi) += ext;
  }
  const int64_t es = dtype_size(t.dtype);
  return {lo * es, (hi + 1) * es};
}

// Sufficient test that no two indices of a view address one element: with the dims of extent
// > 1 ordered by |stride|, each stride must step past everything the smaller ones reach.
bool self_overlaps(const TensorArg& t) {
  const Strides strides(t);
  std::pair<int64_t, int64_t> buf[kMaxRank];  // |stride|, extent
  std::vector<std::pair<int64_t, int64_t>> heap;
  std::pair<int64_t, int64_t>* dims = buf;
  if (t.shape.size() > kMaxRank) {
    heap.resize(t.shape.size());
    dims = heap.data();
  }
  size_t n = 0;
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (t.shape[i] == 0) return false;
    if (t.shape[i] > 1) dims[n++] = {std::llabs(strides[i]), t.shape[i]};
  }
  std::sort(dims, dims + n);
  int64_t reach = 0;
  for (size_t i = 0; i < n; ++i) {
    if (dims[i].first <= reach) return true;
    reach += (dims[i].second - 1) * dims[i].first;
  }
  return false;
}

void same_layouts(std::span<const TensorArg> inputs, std::span<const TensorArg> outputs,
                  std::vector<uint8_t>* flags) {
  flags->assign(inputs.size() * outputs.size(), 0);
  for (size_t i = 0; i < inputs.size(); ++i)
    for (size_t k = 0; k < outputs.size(); ++k)
      (*flags)[i * outputs.size() + k] = same_layout(inputs[i], outputs[k]);
}

Status check_disjoint(const std::string& name, size_t num_inputs, std::span<void* const> data,
                      std::span<const ByteExtent> extents, std::span<const uint8_t> in_place) {
  const size_t num_outputs = data.size() - num_inputs;
  // Addresses as integers: comparing pointers into different objects is undefined.
  const auto lo = [&](size_t s) { return reinterpret_cast<uintptr_t>(data[s]) + extents[s].lo; };
  const auto hi = [&](size_t s) { return reinterpret_cast<uintptr_t>(data[s]) + extents[s].hi; };
  for (size_t k = 0; k < num_outputs; ++k) {
    const size_t o = num_inputs + k;
    if (extents[o].lo == extents[o].hi) continue;
    const uintptr_t olo = lo(o), ohi = hi(o);
    const auto overlaps = [&](size_t s) {
      return extents[s].lo != extents[s].hi && lo(s) < ohi && olo < hi(s);
    };
    for (size_t i = 0; i < num_inputs; ++i) {
      if (!in_place.empty() && in_place[i * num_outputs + k] && data[i] == data[o]) continue;
      if (overlaps(i)) {
        return invalid_argument(name + ": output " + std::to_string(k) +
                                " overlaps the memory of input " + std::to_string(i) +
                                " (no aliases are declared)");
      }
    }
    for (size_t j = 0; j < k; ++j) {
      if (overlaps(num_inputs + j)) {
        return invalid_argument(name + ": outputs " + std::to_string(j) + " and " +
                                std::to_string(k) + " overlap");
      }
    }
  }
  return Status::ok();
}

Status check_no_overlap(const std::string& name, std::span<const TensorArg> inputs,
                        std::span<const TensorArg> outputs, bool allow_in_place) {
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (self_overlaps(outputs[k])) {
      return invalid_argument(name + ": output " + std::to_string(k) +
                              " addresses some elements more than once (zero or overlapping "
                              "strides); outputs must be views without self-overlap");
    }
  }
  // Reused buffers: graphs check their arguments on every call.
  thread_local std::vector<void*> data;
  thread_local std::vector<ByteExtent> extents;
  thread_local std::vector<uint8_t> in_place;
  data.clear();
  extents.clear();
  for (std::span<const TensorArg> args : {inputs, outputs}) {
    for (const TensorArg& t : args) {
      data.push_back(t.data);
      extents.push_back(byte_extent(t));
    }
  }
  in_place.clear();
  if (allow_in_place) same_layouts(inputs, outputs, &in_place);
  return check_disjoint(name, inputs.size(), data, extents, in_place);
}

}  // namespace dvm::runtime
