#include "base/env.h"

#include <cstdlib>
#include <cstring>

namespace dvm::base {

namespace {

bool flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "") != 0 && std::strcmp(v, "0") != 0;
}

int integer(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? 0 : std::atoi(v);
}

}  // namespace

const EnvKnobs& env() {
  static const EnvKnobs knobs = [] {
    EnvKnobs k;
    k.dump_bytecode = flag("DVM_DUMP_BYTECODE");
    k.dump_ir = flag("DVM_DUMP_IR");
    k.num_threads = integer("DVM_NUM_THREADS");
    k.lazy_dump = flag("DVM_LAZY_DUMP");
    k.verify_always = flag("DVM_VERIFY_ALWAYS");
    k.profile = flag("DVM_PROFILE");
    const char* amx = std::getenv("DVM_AMX");
    k.amx = amx == nullptr || std::strcmp(amx, "0") != 0;
    const char* dot = std::getenv("DVM_BF16_DOT");
    k.bf16_dot = dot == nullptr || std::strcmp(dot, "0") != 0;
    if (std::getenv("DVM_WEIGHT_CACHE_MB") != nullptr) {
      k.weight_cache_mb = integer("DVM_WEIGHT_CACHE_MB");
    }
    return k;
  }();
  return knobs;
}

}  // namespace dvm::base
