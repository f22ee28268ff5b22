// DVM_PROFILE=1: time every kernel launch of every Executable and print, at process exit, a
// table per kernel (calls, total and mean time, bytes moved and their rate), sorted by total
// time, to stderr. Off by default: when off, a launch pays one branch. The launches are timed
// on the calling thread around the whole kernel (its tiles on every VM thread), so stacked
// small kernels that run side by side each count their own wall time.
#pragma once

#include <cstdint>
#include <string>

namespace dvm::base {

bool profiling();

// Adds one launch of `kernel` (the kernel's name; the graph's name is its prefix).
void profile_record(const std::string& kernel, double us, int64_t bytes_moved);

// The table as printed at exit (empty when nothing was recorded).
std::string profile_report();

}  // namespace dvm::base
