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

// Byte range [lo, hi) a view touches; empty views touch nothing.
std::pair<uintptr_t, uintptr_t> byte_span(const TensorArg& t) {
  int64_t lo = t.offset, hi = t.offset, n = 1;
  const Strides strides(t);
  for (size_t i = 0; i < t.shape.size(); ++i) {
    n *= t.shape[i];
    if (t.shape[i] == 0) continue;
    int64_t ext = (t.shape[i] - 1) * strides[i];
    (ext < 0 ? lo : hi) += ext;
  }
  if (n == 0) return {0, 0};
  auto base = reinterpret_cast<uintptr_t>(t.data);
  int64_t es = dtype_size(t.dtype);
  return {base + static_cast<uintptr_t>(lo * es), base + static_cast<uintptr_t>((hi + 1) * es)};
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

bool same_view(const TensorArg& a, const TensorArg& b) {
  if (a.data != b.data || a.offset != b.offset || a.dtype != b.dtype || a.shape != b.shape)
    return false;
  const Strides sa(a), sb(b);
  for (size_t i = 0; i < a.shape.size(); ++i)
    if (sa[i] != sb[i]) return false;
  return true;
}

}  // namespace

Status check_no_overlap(const std::string& name, std::span<const TensorArg> inputs,
                        std::span<const TensorArg> outputs, bool allow_in_place) {
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (self_overlaps(outputs[k])) {
      return invalid_argument(name + ": output " + std::to_string(k) +
                              " addresses some elements more than once (zero or overlapping "
                              "strides); outputs must be views without self-overlap");
    }
    auto [olo, ohi] = byte_span(outputs[k]);
    if (olo == ohi) continue;
    auto overlaps = [&](const TensorArg& t) {
      auto [lo, hi] = byte_span(t);
      return lo < ohi && olo < hi;
    };
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (allow_in_place && same_view(inputs[i], outputs[k])) continue;
      if (overlaps(inputs[i])) {
        return invalid_argument(name + ": output " + std::to_string(k) +
                                " overlaps the memory of input " + std::to_string(i) +
                                " (no aliases are declared)");
      }
    }
    for (size_t j = 0; j < k; ++j) {
      if (overlaps(outputs[j])) {
        return invalid_argument(name + ": outputs " + std::to_string(j) + " and " +
                                std::to_string(k) + " overlap");
      }
    }
  }
  return Status::ok();
}

}  // namespace dvm::runtime
