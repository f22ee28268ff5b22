#include "base/profile.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

#include "base/env.h"

namespace dvm::base {

namespace {

struct Entry {
  int64_t calls = 0;
  double us = 0;
  int64_t bytes = 0;
};

struct Registry {
  std::mutex mu;
  std::map<std::string, Entry> entries;
  std::string report() {
    std::vector<std::pair<std::string, Entry>> rows;
    {
      std::lock_guard<std::mutex> lock(mu);
      rows.assign(entries.begin(), entries.end());
    }
    if (rows.empty()) return {};
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
    double total = 0;
    for (const auto& r : rows) total += r.second.us;
    std::string out = "DVM_PROFILE: kernel launches (wall time on the calling thread)\n";
    char line[256];
    std::snprintf(line, sizeof(line), "%-40s %8s %10s %6s %10s %8s\n", "kernel", "calls",
                  "total ms", "%", "mean us", "GB/s");
    out += line;
    for (const auto& [name, e] : rows) {
      std::snprintf(line, sizeof(line), "%-40s %8lld %10.3f %6.1f %10.2f %8.2f\n", name.c_str(),
                    static_cast<long long>(e.calls), e.us / 1e3, 100.0 * e.us / total,
                    e.us / static_cast<double>(e.calls),
                    e.us > 0 ? static_cast<double>(e.bytes) / (e.us * 1e3) : 0.0);
      out += line;
    }
    std::snprintf(line, sizeof(line), "%-40s %8s %10.3f\n", "total", "", total / 1e3);
    out += line;
    return out;
  }
};

Registry& registry() {
  // Never destroyed: kernels may still run on other threads while statics are destroyed.
  static Registry* r = new Registry();
  return *r;
}

struct PrintAtExit {
  ~PrintAtExit() {
    if (!profiling()) return;
    std::string s = registry().report();
    if (!s.empty()) std::fputs(s.c_str(), stderr);
  }
} print_at_exit;

}  // namespace

bool profiling() {
  return env().profile;
}

void profile_record(const std::string& kernel, double us, int64_t bytes_moved) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  Entry& e = r.entries[kernel];
  ++e.calls;
  e.us += us;
  e.bytes += bytes_moved;
}

std::string profile_report() {
  return registry().report();
}

}  // namespace dvm::base
