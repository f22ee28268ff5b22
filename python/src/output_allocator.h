// Memory for the outputs that `dvm._dvm_torch` makes: large blocks are kept for reuse when
// their tensor dies, instead of going back to the system.
//
// Why: torch's CPU allocator hands a large tensor (above glibc's mmap threshold, at most
// 32 MiB) fresh pages from mmap and unmaps them when it dies, so every call of a compiled
// partition with a large output first-touches every page of it: for a 64 MiB output that is
// 16K page faults and zeroing, 15-20 ms on the machines we measured, against 3-4 ms for the
// kernel that writes it. A block kept here is already mapped; a new one is asked for huge
// pages where the kernel offers them on request.
//
// Blocks are bucketed by size class (an eighth of a power of two apart), so that a shape that
// grows a little from call to call (a sequence length) reuses its block. Idle blocks are
// bounded by a byte budget (DVM_OUTPUT_CACHE_MB, default 1024; 0 turns the cache off), the
// least recently freed released first. Outputs below kMinCachedBytes use torch's allocator.
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <cstdint>

namespace dvm::python {

struct OutputCacheStats {
  int64_t hits = 0;          // allocations served by an idle block
  int64_t misses = 0;        // cacheable allocations that mapped a new block
  int64_t idle_bytes = 0;    // bytes held by idle blocks now
  int64_t live_bytes = 0;    // bytes of blocks in tensors now
  int64_t budget_bytes = 0;  // the most idle_bytes may reach
};

inline constexpr size_t kMinCachedBytes = size_t{1} << 20;

// The allocator for outputs (a process-wide object that is never destroyed: tensors may die
// during interpreter shutdown, after static destructors ran).
c10::Allocator* output_allocator();
OutputCacheStats output_cache_stats();
// Releases every idle block; sets the idle budget (bytes; < 0 leaves it).
void release_output_cache(int64_t new_budget_bytes = -1);

}  // namespace dvm::python
