#include "runtime/arg_checks.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <utility>
#include <vector>

namespace dvm::runtime {

namespace {

std::vector<int64_t> strides_of(const TensorArg& t) {
  if (!t.strides.empty()) return t.strides;
  std::vector<int64_t> s(t.shape.size(), 1);
  for (int i = static_cast<int>(t.shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * t.shape[i + 1];
  return s;
}

// Byte range [lo, hi) a view touches; empty views touch nothing.
std::pair<uintptr_t, uintptr_t> byte_span(const TensorArg& t) {
  int64_t lo = t.offset, hi = t.offset, n = 1;
  std::vector<int64_t> strides = strides_of(t);
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
  std::vector<int64_t> strides = strides_of(t);
  std::vector<std::pair<int64_t, int64_t>> dims;  // |stride|, extent
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (t.shape[i] == 0) return false;
    if (t.shape[i] > 1) dims.push_back({std::llabs(strides[i]), t.shape[i]});
  }
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;
  for (auto [stride, extent] : dims) {
    if (stride <= reach) return true;
    reach += (extent - 1) * stride;
  }
  return false;
}

bool same_view(const TensorArg& a, const TensorArg& b) {
  return a.data == b.data && a.offset == b.offset && a.dtype == b.dtype && a.shape == b.shape &&
         strides_of(a) == strides_of(b);
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
