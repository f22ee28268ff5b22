// A fixed pool of worker threads for the VM's blocks.
//
// parallel_for(n, fn) calls fn(i) for i in [0, n) on up to `max_threads` threads (the caller
// included) and returns when all calls are done. Safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace dvm::base {

int hardware_threads();
// The threads a kernel compiled for `requested` threads runs on: `requested`, or all hardware
// threads for 0, capped by DVM_NUM_THREADS; at least 1.
int kernel_threads(int requested);

// A fork-join pool of `workers` threads; run(parts, fn) calls fn(part) for every part in
// [0, parts) on the caller and free workers and returns when all are done (bitwise the same
// work whoever runs a part). parallel_for uses one pool of hardware_threads() - 1 workers;
// tests build others, with more workers than the machine has cores.
class ThreadPool {
 public:
  explicit ThreadPool(int workers);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  void run(int parts, const std::function<void(int)>& fn);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Runs fn(part) for part in [0, parts) concurrently; parts <= number of threads is typical.
void parallel_for(int parts, const std::function<void(int)>& fn);
// parallel_for runs on the pool dvm::set_parallel_backend (dvm/runtime.h) installed, if any.

}  // namespace dvm::base
