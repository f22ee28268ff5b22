// A persistent fork-join pool shared by the hand-written baselines of the VM benchmarks.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

namespace dvm_bench {

// Threads of the multi-threaded variants: DVM_NUM_THREADS if set, else every core.
inline int bench_threads() {
  if (const char* env = std::getenv("DVM_NUM_THREADS")) {
    int t = std::atoi(env);
    if (t > 0) return t;
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// Launches under kGrain elements run on the caller (the VM's own rule).
inline constexpr int64_t kGrain = int64_t{1} << 15;

// A persistent fork-join pool: run(elems, fn) calls fn(part, parts) for every part on its own
// thread (part 0 on the caller). Workers spin briefly, then sleep on an atomic wait, so an idle
// pool does not steal cycles from the other variants.

class Pool {
 public:
  explicit Pool(int threads) : parts_(std::max(1, threads)) {
    for (int i = 1; i < parts_; ++i) workers_.emplace_back([this, i] { work(i); });
  }
  ~Pool() {
    stop_.store(true);
    gen_.fetch_add(1);
    gen_.notify_all();
    for (auto& t : workers_) t.join();
  }
  // Like the VM (and PyTorch's grain size), launches under kGrain elements run on the caller.
  void run(int64_t elems, const std::function<void(int, int)>& fn) {
    if (parts_ == 1 || elems < kGrain) return fn(0, 1);
    job_ = &fn;
    pending_.store(parts_ - 1, std::memory_order_relaxed);
    gen_.fetch_add(1, std::memory_order_release);
    gen_.notify_all();
    fn(0, parts_);
    // Spin briefly, then yield: on a loaded machine the worker may be waiting for a core.
    for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
      if (spin > 2000) std::this_thread::yield();
    }
  }

 private:
  void work(int part) {
    uint32_t seen = 0;
    for (;;) {
      for (int spin = 0; gen_.load(std::memory_order_acquire) == seen; ++spin) {
        if (spin > 4000) gen_.wait(seen, std::memory_order_acquire);
      }
      seen = gen_.load(std::memory_order_acquire);
      if (stop_.load()) return;
      (*job_)(part, parts_);
      pending_.fetch_sub(1, std::memory_order_release);
    }
  }

  int parts_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint32_t> gen_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

// [begin, end) of part p of n items split into `parts`.
inline int64_t split(int64_t n, int p, int parts) {
  return n * p / parts;
}

}  // namespace dvm_bench
