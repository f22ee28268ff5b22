#include "vm/weight_cache.h"

#include <algorithm>
#include <functional>
#include <list>
#include <mutex>
#include <new>
#include <unordered_map>

#include "base/env.h"
#include "dvm/runtime.h"
#include "vm/cpu/gemm.h"

namespace dvm::vm {

PackedWeight::PackedWeight(size_t floats)
    : data_(static_cast<float*>(
          ::operator new (std::max<size_t>(floats, 1) * sizeof(float), std::align_val_t{64}))),
      floats_(floats) {}

PackedWeight::~PackedWeight() {
  ::operator delete (data_, std::align_val_t{64});
}

namespace {

struct KeyHash {
  size_t operator()(const WeightKey& k) const {
    size_t h = std::hash<const void*>()(k.data);
    for (uint64_t v : {k.version, static_cast<uint64_t>(k.k), static_cast<uint64_t>(k.n),
                       static_cast<uint64_t>(k.rs), static_cast<uint64_t>(k.cs),
                       static_cast<uint64_t>(k.dtype)}) {
      h ^= std::hash<uint64_t>()(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    }
    return h;
  }
};

// One operand: created under the cache lock, packed under its own lock (so that a large pack
// does not block lookups of other operands).
struct Entry {
  std::mutex pack_mu;
  std::shared_ptr<PackedWeight> packed;
  size_t bytes = 0;
  std::list<WeightKey>::iterator lru;
};

class WeightCache {
 public:
  static WeightCache& instance() {
    static WeightCache* cache = new WeightCache();  // never destroyed: used by worker threads
    return *cache;
  }

  std::shared_ptr<const PackedWeight> get(const WeightKey& key) {
    std::shared_ptr<Entry> e;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = map_.find(key);
      if (it != map_.end()) {
        e = it->second;
        lru_.splice(lru_.begin(), lru_, e->lru);
        ++stats_.hits;
      } else {
        size_t bytes = cpu::packed_b_floats(key.k, key.n) * sizeof(float);
        if (bytes > capacity_) return nullptr;
        drop_superseded_locked(key);
        e = std::make_shared<Entry>();
        e->bytes = bytes;
        lru_.push_front(key);
        e->lru = lru_.begin();
        map_.emplace(key, e);
        bytes_ += bytes;
        ++stats_.packs;
        evict_locked();
      }
    }
    std::lock_guard<std::mutex> lock(e->pack_mu);
    if (e->packed == nullptr) {
      auto p = std::make_shared<PackedWeight>(e->bytes / sizeof(float));
      cpu::pack_b(key.dtype, key.k, key.n, key.data, key.rs, key.cs, p->mutable_panels());
      e->packed = std::move(p);
    }
    return e->packed;
  }

  void set_capacity(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    capacity_ = bytes;
    evict_locked();
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    map_.clear();
    lru_.clear();
    latest_.clear();
    bytes_ = 0;
    stats_ = WeightCacheStats{};
  }

  WeightCacheStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    WeightCacheStats s = stats_;
    s.entries = static_cast<int64_t>(map_.size());
    s.bytes = static_cast<int64_t>(bytes_);
    return s;
  }

 private:
  WeightCache() {
    int mb = base::env().weight_cache_mb;
    capacity_ = mb >= 0 ? static_cast<size_t>(mb) << 20 : size_t{1} << 30;
  }

  static WeightKey layout_of(WeightKey key) {
    key.version = 0;
    return key;
  }

  void erase_locked(std::unordered_map<WeightKey, std::shared_ptr<Entry>, KeyHash>::iterator it) {
    auto lt = latest_.find(layout_of(it->first));
    if (lt != latest_.end() && lt->second == it->first.version) latest_.erase(lt);
    bytes_ -= it->second->bytes;
    lru_.erase(it->second->lru);
    map_.erase(it);
  }

  void evict_locked() {
    while (bytes_ > capacity_ && !lru_.empty()) {
      erase_locked(map_.find(lru_.back()));
      ++stats_.evictions;
    }
  }

  // The same memory and layout under a new version means the caller wrote it (a training step,
  // a weight update): the older version's panels are stale and go at once rather than when the
  // LRU reaches them, so updating weights every step does not fill the cache with dead copies.
  void drop_superseded_locked(const WeightKey& key) {
    const WeightKey layout = layout_of(key);
    auto lt = latest_.find(layout);
    if (lt != latest_.end() && lt->second != key.version) {
      WeightKey old = layout;
      old.version = lt->second;
      auto it = map_.find(old);
      if (it != map_.end()) {
        erase_locked(it);
        ++stats_.replaced;
      }
    }
    latest_[layout] = key.version;
  }

  std::mutex mu_;
  std::unordered_map<WeightKey, std::shared_ptr<Entry>, KeyHash> map_;
  std::list<WeightKey> lru_;  // most recently used first
  // Per memory and layout (version 0 in the key), the newest version cached.
  std::unordered_map<WeightKey, uint64_t, KeyHash> latest_;
  size_t capacity_ = 0;
  size_t bytes_ = 0;
  WeightCacheStats stats_;
};

}  // namespace

std::shared_ptr<const PackedWeight> packed_weight(const WeightKey& key) {
  return WeightCache::instance().get(key);
}

}  // namespace dvm::vm

namespace dvm {

WeightCacheStats weight_cache_stats() {
  return vm::WeightCache::instance().stats();
}
void set_weight_cache_capacity(size_t bytes) {
  vm::WeightCache::instance().set_capacity(bytes);
}
void clear_weight_cache() {
  vm::WeightCache::instance().clear();
}

}  // namespace dvm
