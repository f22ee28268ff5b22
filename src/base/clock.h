// Wall-clock time for the statistics the runtime reports (encode_us, bind_us, ...).
#pragma once

#include <chrono>

namespace dvm::base {

// Microseconds on a steady clock (differences only).
inline double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace dvm::base
