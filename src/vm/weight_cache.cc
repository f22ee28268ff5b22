#include "vm/weight_cache.h"

#include <algorithm>
#include <cstdio>
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
  uint64_t last_use = 0;  // the request clock at its latest lookup
  std::list<WeightKey>::iterator lru;
};

// An operand seen but not cached (declined or evicted): its last lookup, so that its reuse
// interval is known when it comes back.
struct Ghost {
  uint64_t last_use = 0;
  bool declined = false;
};

// Admission. Plain LRU thrashes on the cyclic access of a model whose weights exceed the
// capacity: every weight is evicted just before its next use, and each call repacks all of
// them (6x slower than no cache, measured). Here time is a clock of bytes looked up, and
// `window_` tracks the longest recent reuse interval (a model's weights come back once per
// step, so it approaches the bytes of one step). A miss may evict an entry only when that
// entry has been idle for more than kDeadFactor windows, i.e. it has missed its expected reuse
// and is probably dead; otherwise the miss is declined. Under a cyclic working set the cached
// subset stays put and the rest runs uncached; after a model is dropped, its entries die
// within a couple of steps of the next one.
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
      size_t bytes = cpu::packed_b_floats(key.k, key.n) * sizeof(float);
      tick_locked(key, bytes);
      auto it = map_.find(key);
      if (it != map_.end()) {
        e = it->second;
        observe_reuse_locked(e->last_use);
        e->last_use = clock_;
        lru_.splice(lru_.begin(), lru_, e->lru);
        ++stats_.hits;
      } else {
        if (bytes > capacity_) return nullptr;
        drop_superseded_locked(key);
        if (!make_room_locked(bytes)) {
          decline_locked(key, bytes);
          return nullptr;
        }
        auto ghost = ghosts_.find(key);
        if (ghost != ghosts_.end()) {
          observe_reuse_locked(ghost->second.last_use);
          ghosts_.erase(ghost);
        }
        e = std::make_shared<Entry>();
        e->bytes = bytes;
        e->last_use = clock_;
        lru_.push_front(key);
        e->lru = lru_.begin();
        map_.emplace(key, e);
        bytes_ += bytes;
        ++stats_.packs;
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
    window_ = std::max<uint64_t>(window_, capacity_);
    while (bytes_ > capacity_ && !lru_.empty()) {
      erase_locked(map_.find(lru_.back()));
      ++stats_.evictions;
    }
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    map_.clear();
    lru_.clear();
    latest_.clear();
    ghosts_.clear();
    bytes_ = 0;
    window_ = capacity_;
    stats_ = WeightCacheStats{};
  }

  WeightCacheStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    WeightCacheStats s = stats_;
    s.entries = static_cast<int64_t>(map_.size());
    s.bytes = static_cast<int64_t>(bytes_);
    s.capacity = static_cast<int64_t>(capacity_);
    return s;
  }

 private:
  static constexpr uint64_t kDeadFactor = 2;
  static constexpr size_t kMaxGhosts = 1 << 14;

  WeightCache() {
    int mb = base::env().weight_cache_mb;
    capacity_ = mb >= 0 ? static_cast<size_t>(mb) << 20 : size_t{1} << 30;
    window_ = capacity_;
  }

  static WeightKey layout_of(WeightKey key) {
    key.version = 0;
    return key;
  }

  // Every thread of a launch looks the operand up once: repeats of the previous key are one
  // use, so the clock measures bytes of other operands between two uses.
  void tick_locked(const WeightKey& key, size_t bytes) {
    if (key == last_key_) return;
    last_key_ = key;
    clock_ += bytes;
  }

  // The window follows the longest recent reuse interval and decays by 1/16 per observation,
  // so one odd interval does not protect dead entries for long. It never drops below the
  // capacity: before any reuse is seen, nothing younger than that is evicted.
  void observe_reuse_locked(uint64_t last_use) {
    uint64_t gap = clock_ - last_use;
    window_ = std::max({gap, window_ - window_ / 16, static_cast<uint64_t>(capacity_)});
  }

  // Evicts dead entries from the LRU end until `bytes` fit; false (and nothing evicted) when
  // that would take a live entry.
  bool make_room_locked(size_t bytes) {
    size_t free = capacity_ - std::min(bytes_, capacity_);
    if (free >= bytes) return true;
    size_t n = 0;
    for (auto it = lru_.rbegin(); it != lru_.rend() && free < bytes; ++it, ++n) {
      const Entry& victim = *map_.at(*it);
      if (clock_ - victim.last_use <= kDeadFactor * window_) return false;
      free += victim.bytes;
    }
    if (free < bytes) return false;
    for (; n > 0; --n) {
      auto victim = map_.find(lru_.back());
      remember_locked(victim->first, victim->second->last_use, /*declined=*/false);
      erase_locked(victim);
      ++stats_.evictions;
    }
    return true;
  }

  void decline_locked(const WeightKey& key, size_t bytes) {
    ++stats_.declined;
    auto ghost = ghosts_.find(key);
    if (ghost != ghosts_.end()) observe_reuse_locked(ghost->second.last_use);
    if (ghost == ghosts_.end() || !ghost->second.declined) stats_.declined_bytes += bytes;
    remember_locked(key, clock_, /*declined=*/true);
    if (!warned_) {
      warned_ = true;
      std::fprintf(stderr,
                   "dvm: the packed-weight cache (%zu MiB) is smaller than the weights in use; "
                   "those that do not fit are packed per call (raise DVM_WEIGHT_CACHE_MB, see "
                   "dvm.weight_cache_stats())\n",
                   capacity_ >> 20);
    }
  }

  void remember_locked(const WeightKey& key, uint64_t last_use, bool declined) {
    if (ghosts_.size() >= kMaxGhosts && !ghosts_.count(key)) ghosts_.clear();
    Ghost& g = ghosts_[key];
    g.last_use = last_use;
    g.declined = g.declined || declined;
  }

  void erase_locked(std::unordered_map<WeightKey, std::shared_ptr<Entry>, KeyHash>::iterator it) {
    auto lt = latest_.find(layout_of(it->first));
    if (lt != latest_.end() && lt->second == it->first.version) latest_.erase(lt);
    bytes_ -= it->second->bytes;
    lru_.erase(it->second->lru);
    map_.erase(it);
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
  std::unordered_map<WeightKey, Ghost, KeyHash> ghosts_;
  size_t capacity_ = 0;
  size_t bytes_ = 0;
  uint64_t clock_ = 0;
  uint64_t window_ = 0;
  WeightKey last_key_;
  bool warned_ = false;
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
