// Compiling and running kernels: the runtime operator compiler's public face.
//
// CompiledKernel::create() checks a kernel once. Each run() binds the kernel's symbols from
// the input shapes, looks up the bytecode program encoded for that exact binding (shapes,
// strides and offsets) or encodes and verifies a new one, then executes it on the VM over
// the thread pool. A cache hit only binds the new tensor addresses (relocation).
//
// Threading: a CompiledKernel may be run concurrently from several threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dvm/dtype.h"
#include "dvm/kernel.h"
#include "dvm/status.h"

namespace dvm {

// A strided view of caller-owned memory. Units are elements, not bytes.
struct TensorArg {
  void* data = nullptr;  // base of the storage; the view starts at data + offset elements
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // empty: contiguous row-major
  int64_t offset = 0;
  // Number of elements of storage at `data`; -1: exactly what the view spans. Every access
  // the VM makes is proven to stay inside [data, data + storage_elems).
  int64_t storage_elems = -1;
  // Nonzero: the caller promises that whenever it passes this memory with this version, the
  // memory holds the same contents (weights: give a new version after writing them). The VM
  // then packs the tensor once as a matmul operand and reuses the packed form across calls
  // (see WeightCacheStats). 0: contents may change between calls; nothing is cached.
  uint64_t version = 0;

  static TensorArg contiguous(void* data, DType dtype, std::vector<int64_t> shape);
  int64_t numel() const;
};

// A run-time scalar argument (for KernelBuilder::param).
// An integer param must be given of_int (or of_float with an integral value in the dtype's
// range); run() reports anything else (NaN, inf, 2**40 for an i32) as an error naming the param.
struct ScalarArg {
  double f = 0.0;
  int64_t i = 0;
  bool integral = false;  // made by of_int: `i` is the value
  static ScalarArg of_float(double v) {
    // The cast is defined only inside int64's range; outside it `i` is unused (see above).
    bool fits = v > -9.2e18 && v < 9.2e18;
    return ScalarArg{v, fits ? static_cast<int64_t>(v) : 0, false};
  }
  static ScalarArg of_int(int64_t v) { return ScalarArg{static_cast<double>(v), v, true}; }
};

struct CompileOptions {
  int num_threads = 0;          // 0: all hardware threads
  size_t cache_capacity = 256;  // programs kept per kernel (LRU-less: cleared when full)
};

// Per-call statistics (optional out-parameter of run()).
struct RunStats {
  bool cache_hit = false;
  double encode_us = 0;     // time spent encoding + verifying (0 on a hit)
  int programs = 0;         // programs launched (>1 when the kernel was split into stages)
  int64_t blocks = 0;       // VM blocks executed
  int64_t bytes_moved = 0;  // bytes loaded + stored by the programs (nominal)
};

// The process-wide cache of packed matmul operands (tensors passed with a nonzero
// TensorArg::version). When a new operand does not fit, it evicts least recently used entries
// only if they look dead (unused for longer than twice the longest recent reuse interval);
// otherwise it is declined and runs as with the cache disabled (its tiles pack their own
// panels). So a working set larger than the capacity keeps a stable cached subset instead of
// evicting every weight just before it is needed again, and is never slower than no cache.
struct WeightCacheStats {
  int64_t entries = 0;
  int64_t bytes = 0;
  int64_t capacity = 0;
  int64_t hits = 0;            // lookups that found a packed operand
  int64_t packs = 0;           // operands packed (misses)
  int64_t evictions = 0;       // entries dropped for capacity
  int64_t replaced = 0;        // entries dropped because their memory came back with a new version
  int64_t declined = 0;        // lookups not cached: live entries filled the capacity
  int64_t declined_bytes = 0;  // bytes of the distinct operands declined since the last clear
};
WeightCacheStats weight_cache_stats();
// Bytes of packed operands kept (default 1 GiB, or the DVM_WEIGHT_CACHE_MB environment
// variable); 0 disables the cache. Shrinking evicts at once.
void set_weight_cache_capacity(size_t bytes);
// Drops every entry and zeroes the counters.
void clear_weight_cache();

// Runs DVM's parallel work (the tiles of a kernel, stacked small kernels) on another thread
// pool instead of DVM's own: an application with its own pool (OpenMP, TBB; the torch
// extension installs torch's intra-op pool) keeps one set of threads on its cores instead of
// two pools that compete for them. backend(parts, task) must call task(part) once for every
// part in [0, parts), on any threads, and return when all calls are done; results do not
// depend on which thread runs a part. nullptr restores DVM's pool.
using ParallelBackend = void (*)(int parts, const std::function<void(int)>& task);
void set_parallel_backend(ParallelBackend backend);

class CompiledKernel {
 public:
  static StatusOr<std::shared_ptr<CompiledKernel>> create(const Kernel& kernel,
                                                          const CompileOptions& options = {});
  ~CompiledKernel();

  // Runs the kernel. `outputs` must have the shapes infer_output_shapes() returns for these
  // inputs; they may be strided views but must not overlap an input, another output, or
  // themselves (an InvalidArgument error says which). Exception: the one output of a kernel of
  // elementwise ops only may be exactly an input's view (in place). On error no output
  // element is written.
  Status run(std::span<const TensorArg> inputs, std::span<const TensorArg> outputs,
             std::span<const ScalarArg> params = {}, RunStats* stats = nullptr) const;

  // Output shapes for these inputs (binds symbols and infers shapes; no encoding).
  StatusOr<std::vector<std::vector<int64_t>>> infer_output_shapes(
      std::span<const TensorArg> inputs) const;

  // Encodes (or finds cached) the programs for these arguments without running them, so a
  // caller can encode several kernels concurrently before launching them in order.
  Status prepare(std::span<const TensorArg> inputs, std::span<const TensorArg> outputs,
                 std::span<const ScalarArg> params = {}, RunStats* stats = nullptr) const;
  // A launch resolved once for one layout of the arguments (dtypes, shapes, strides, offsets,
  // storage sizes) and one set of params: the checks, the program lookup and the bounds proof
  // are done, so only addresses and versions change between the calls that reuse it.
  struct Launch;
  StatusOr<std::shared_ptr<const Launch>> prepare_launch(std::span<const TensorArg> inputs,
                                                         std::span<const TensorArg> outputs,
                                                         std::span<const ScalarArg> params = {},
                                                         RunStats* stats = nullptr) const;
  // Runs `launch` at this call's addresses: data[k] is argument k's `data` (inputs, then
  // outputs), each laid out exactly as when the launch was prepared; versions[k] the version
  // of input k (null: all 0). The caller guarantees the layout; nothing is re-checked.
  // Fails only as run() fails on the values themselves (an integer division by zero).
  Status run_launch(const Launch& launch, std::span<void* const> data,
                    const uint64_t* versions = nullptr) const;
  // The disassembled bytecode of the programs for these inputs (encodes if needed).
  StatusOr<std::string> disassemble(std::span<const TensorArg> inputs,
                                    std::span<const TensorArg> outputs) const;

  const Kernel& kernel() const;
  size_t cached_programs() const;

 private:
  CompiledKernel();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Runs the scalar reference executor (the executable spec) on the same arguments.
Status run_reference(const Kernel& kernel, std::span<const TensorArg> inputs,
                     std::span<const TensorArg> outputs, std::span<const ScalarArg> params = {});

}  // namespace dvm
