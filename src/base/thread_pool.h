// A fixed pool of worker threads for the VM's blocks.
//
// parallel_for(n, fn) calls fn(i) for i in [0, n) on up to `max_threads` threads (the caller
// included) and returns when all calls are done. Safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <functional>

namespace dvm::base {

int hardware_threads();
// The threads a kernel compiled for `requested` threads runs on: `requested`, or all hardware
// threads for 0, capped by DVM_NUM_THREADS; at least 1.
int kernel_threads(int requested);

// Runs fn(part) for part in [0, parts) concurrently; parts <= number of threads is typical.
void parallel_for(int parts, const std::function<void(int)>& fn);
// parallel_for runs on the pool dvm::set_parallel_backend (dvm/runtime.h) installed, if any.

}  // namespace dvm::base
