// See output_allocator.h.
#include "output_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

namespace dvm::python {
namespace {

constexpr size_t kPage = size_t{4} << 10;
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kMinHugeBytes = size_t{4} << 20;  // smaller blocks would waste their rounding

struct Block {
  void* data;
  size_t capacity;
};

// The capacity of the size class holding n bytes: rounded up to an eighth of the power of
// two below n (so a class spans 12.5%), then to whole pages, or whole huge pages from
// kMinHugeBytes on.
size_t class_capacity(size_t n) {
  size_t pow2 = kPage;
  while (pow2 * 2 <= n) pow2 *= 2;
  const size_t step = std::max(kPage, pow2 / 8);
  size_t cap = (n + step - 1) / step * step;
  if (cap >= kMinHugeBytes) cap = (cap + kHugePage - 1) / kHugePage * kHugePage;
  return cap;
}

int64_t budget_from_env() {
  const char* v = std::getenv("DVM_OUTPUT_CACHE_MB");
  if (v == nullptr || *v == '\0') return int64_t{1024} << 20;
  char* end = nullptr;
  const long long mb = std::strtoll(v, &end, 10);
  if (end == v || mb < 0) return int64_t{1024} << 20;
  return static_cast<int64_t>(mb) << 20;
}

class OutputAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n >= kMinCachedBytes) {
      if (Block* b = take(class_capacity(n)))
        return c10::DataPtr(b->data, b, &OutputAllocator::give_back, c10::Device(c10::kCPU));
    }
    return c10::GetCPUAllocator()->allocate(n);
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  OutputCacheStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    OutputCacheStats s = stats_;
    s.budget_bytes = budget_;
    return s;
  }

  void release(int64_t new_budget) {
    std::vector<Block*> drop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (new_budget >= 0) budget_ = new_budget;
      drop.swap(idle_);
      stats_.idle_bytes = 0;
    }
    for (Block* b : drop) unmap(b);
  }

 private:
  // An idle block of this capacity (the most recently freed), or a new one; nullptr when
  // the cache is off (a zero budget) or memory is short (torch's allocator then reports it).
  Block* take(size_t capacity) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (budget_ <= 0) return nullptr;
      for (size_t i = idle_.size(); i-- > 0;) {
        if (idle_[i]->capacity != capacity) continue;
        Block* b = idle_[i];
        idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(i));
        stats_.idle_bytes -= static_cast<int64_t>(capacity);
        stats_.live_bytes += static_cast<int64_t>(capacity);
        ++stats_.hits;
        return b;
      }
    }
    const size_t align = capacity >= kMinHugeBytes ? kHugePage : kPage;
    void* p = std::aligned_alloc(align, capacity);
    if (p == nullptr) return nullptr;
#ifdef MADV_HUGEPAGE
    if (align == kHugePage) (void)madvise(p, capacity, MADV_HUGEPAGE);  // a hint; may fail
#endif
    auto* b = new (std::nothrow) Block{p, capacity};
    if (b == nullptr) {
      std::free(p);
      return nullptr;
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.live_bytes += static_cast<int64_t>(capacity);
    ++stats_.misses;
    return b;
  }

  // The deleter of a tensor's block: kept idle, the least recently freed blocks released
  // while the idle bytes exceed the budget.
  static void give_back(void* ctx) {
    auto* b = static_cast<Block*>(ctx);
    OutputAllocator& self = instance();
    std::vector<Block*> drop;
    {
      std::lock_guard<std::mutex> lock(self.mu_);
      const auto cap = static_cast<int64_t>(b->capacity);
      self.stats_.live_bytes -= cap;
      if (cap > self.budget_) {
        drop.push_back(b);
      } else {
        self.idle_.push_back(b);
        self.stats_.idle_bytes += cap;
        size_t k = 0;
        while (self.stats_.idle_bytes > self.budget_) {
          self.stats_.idle_bytes -= static_cast<int64_t>(self.idle_[k]->capacity);
          drop.push_back(self.idle_[k++]);
        }
        self.idle_.erase(self.idle_.begin(), self.idle_.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
    for (Block* d : drop) unmap(d);
  }

  static void unmap(Block* b) {
    std::free(b->data);
    delete b;
  }

 public:
  static OutputAllocator& instance() {
    static auto* a = new OutputAllocator();  // never destroyed (see output_allocator.h)
    return *a;
  }

 private:
  std::mutex mu_;
  std::vector<Block*> idle_;  // oldest first
  OutputCacheStats stats_;
  int64_t budget_ = budget_from_env();
};

}  // namespace

c10::Allocator* output_allocator() {
  return &OutputAllocator::instance();
}

OutputCacheStats output_cache_stats() {
  return OutputAllocator::instance().stats();
}

void release_output_cache(int64_t new_budget_bytes) {
  OutputAllocator::instance().release(new_budget_bytes);
}

}  // namespace dvm::python
