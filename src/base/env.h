// Run-time debug knobs, all read here: DVM_DUMP_IR=1 prints the graph IR after each pass;
// DVM_DUMP_BYTECODE=1 prints every encoded program to
// stderr; DVM_NUM_THREADS=n caps the VM's threads; DVM_VERIFY_ALWAYS=1 re-verifies programs on
// cache hits too (debugging aid); DVM_LAZY_DUMP=1 prints each graph a lazy-tensor flush compiles
// (plan-cache misses) with its fusion report; DVM_WEIGHT_CACHE_MB=n sizes the packed-weight cache;
// DVM_PROFILE=1 times every kernel launch and prints a table at exit (base/profile.h); DVM_AMX=0
// keeps bf16 matmuls off the AMX tiles (vm/cpu/gemm_amx.h); DVM_BF16_DOT=0 keeps them off
// AVX512-BF16's dot products (vm/cpu/gemm.h), widened to f32 instead.
#pragma once

namespace dvm::base {

struct EnvKnobs {
  bool dump_bytecode = false;
  bool dump_ir = false;        // DVM_DUMP_IR=1: the graph IR after each pass
  int num_threads = 0;         // 0: unset
  bool lazy_dump = false;      // DVM_LAZY_DUMP=1: graphs compiled by lazy flushes
  int weight_cache_mb = -1;    // DVM_WEIGHT_CACHE_MB: -1 unset
  bool verify_always = false;  // DVM_VERIFY_ALWAYS=1: re-verify cached programs on every use
  bool profile = false;        // DVM_PROFILE=1: per-kernel launch times, printed at exit
  bool amx = true;             // DVM_AMX=0: bf16 matmuls without AMX tiles
  bool bf16_dot = true;        // DVM_BF16_DOT=0: bf16 matmuls without VDPBF16PS
};

// Read once, on first use.
const EnvKnobs& env();

}  // namespace dvm::base
