// CompiledKernel: the per-call path. A call whose arguments have the shapes, strides and
// offsets of an earlier call reuses that call's programs and only binds the new addresses
// (relocation); anything else binds symbols, infers shapes, encodes and verifies.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "base/clock.h"
#include "base/env.h"
#include "base/thread_pool.h"
#include "bytecode/verifier.h"
#include "encoder/encoder.h"
#include "ir/kernel_def.h"
#include "runtime/arg_checks.h"
#include "vm/interpreter.h"

namespace dvm {

namespace {

using Key = std::vector<int64_t>;

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

// Calls f on each value of one tensor's part of the cache key, in order (see make_key), until
// f returns false; returns whether every call returned true. One walk for writing a key and
// for comparing one in place.
template <class F>
[[gnu::always_inline]] inline bool for_each_key_value(const TensorArg& t, F f) {
  const size_t r = std::min<size_t>(t.shape.size(), kMaxRank);
  if (!f(static_cast<int64_t>(t.dtype)) || !f(static_cast<int64_t>(t.shape.size()))) return false;
  for (size_t i = 0; i < r; ++i)
    if (!f(t.shape[i])) return false;
  int64_t contiguous[kMaxRank];  // the strides when none are given
  const int64_t* strides = t.strides.data();
  if (t.strides.size() != t.shape.size()) {
    int64_t s = 1;
    for (size_t i = r; i-- > 0;) {
      contiguous[i] = s;
      s *= t.shape[i];
    }
    strides = contiguous;
  }
  for (size_t i = 0; i < r; ++i)
    if (!f(strides[i])) return false;
  return f(t.offset) && f(t.storage_elems);
}

// The cache key of a call: the argument counts, then per tensor its dtype, rank, sizes,
// strides (the contiguous ones when none are given), offset and storage size. Everything the
// programs and the proofs of a binding (bounds, self-overlap, same layouts) depend on, so a
// call that hits re-proves only what its pointers decide.
void make_key(std::span<const TensorArg> inputs, std::span<const TensorArg> outputs, Key* key) {
  key->clear();
  key->push_back(static_cast<int64_t>(inputs.size()));
  key->push_back(static_cast<int64_t>(outputs.size()));
  for (std::span<const TensorArg> args : {inputs, outputs})
    for (const TensorArg& t : args)
      for_each_key_value(t, [key](int64_t v) {
        key->push_back(v);
        return true;
      });
}

// Is `key` make_key's key of these arguments? Compared in place: the memo's hit path
// (every repeated call) writes nothing.
bool key_matches(const Key& key, std::span<const TensorArg> inputs,
                 std::span<const TensorArg> outputs) {
  const int64_t* k = key.data();
  const int64_t* const end = k + key.size();
  const auto next = [&](int64_t v) { return k != end && *k++ == v; };
  if (!next(static_cast<int64_t>(inputs.size())) || !next(static_cast<int64_t>(outputs.size())))
    return false;
  for (std::span<const TensorArg> args : {inputs, outputs})
    for (const TensorArg& t : args)
      if (!for_each_key_value(t, next)) return false;
  return k == end;
}

int64_t storage_of(const TensorArg& t) {
  if (t.storage_elems >= 0) return t.storage_elems;
  int64_t lo, hi;
  return ir::view_span(t, &lo, &hi) ? hi + 1 : 0;
}

}  // namespace

struct CompiledKernel::Impl {
  Kernel kernel;
  CompileOptions options;
  int threads = 1;
  // One output and elementwise ops only: every input of the output's shape is read at the
  // position being written, before it is written, so that output may be the input's view.
  bool in_place_ok = false;
  mutable std::mutex mu;
  // A binding's encoded kernel, its programs as the VM loaded them, and what its arguments'
  // layout proves once for every call that hits it.
  struct Encoded {
    enc::EncodedKernel kernel;
    std::vector<std::shared_ptr<const vm::LoadedProgram>> loaded;
    // Per argument (inputs, then outputs): the bytes its view touches, and whether any
    // program or the view touches memory at all (its data may then not be null).
    std::vector<runtime::ByteExtent> extents;
    std::vector<uint8_t> needs_data;
    std::vector<uint8_t> in_place;  // runtime::same_layouts, when in_place_ok
  };
  mutable std::unordered_map<Key, std::shared_ptr<const Encoded>, KeyHash> cache;
  // Names this kernel in the threads' memos (an address could be reused by a later kernel).
  uint64_t id = 0;

  // The binding of these arguments, found or encoded; a new one is checked (dtypes, bounds,
  // overlaps, the programs' spans) before it is cached. Every call then runs check_pointers.
  // The binding stays valid until this thread's next lookup (its memo holds it), or as long
  // as `*hold` when given.
  StatusOr<const Encoded*> lookup(std::span<const TensorArg> inputs,
                                  std::span<const TensorArg> outputs,
                                  std::span<const ScalarArg> params, RunStats* stats,
                                  std::shared_ptr<const Encoded>* hold = nullptr) const;
  StatusOr<std::shared_ptr<const Encoded>> encode(std::span<const TensorArg> inputs,
                                                  std::span<const TensorArg> outputs,
                                                  std::span<const ScalarArg> params,
                                                  RunStats* stats) const;
  Status check_counts_and_params(std::span<const TensorArg> inputs,
                                 std::span<const TensorArg> outputs,
                                 std::span<const ScalarArg> params) const;
  Status check_dtypes(std::span<const TensorArg> inputs, std::span<const TensorArg> outputs) const;
  Status check_pointers(const Encoded& e, std::span<const TensorArg> inputs,
                        std::span<const TensorArg> outputs) const;
  // The checks and the binding of a call: the part of run() before the launch (lookup's
  // lifetime rules).
  StatusOr<const Encoded*> bind(std::span<const TensorArg> inputs,
                                std::span<const TensorArg> outputs,
                                std::span<const ScalarArg> params, RunStats* stats,
                                std::shared_ptr<const Encoded>* hold = nullptr) const;
};

CompiledKernel::CompiledKernel() : impl_(std::make_unique<Impl>()) {}
CompiledKernel::~CompiledKernel() = default;

StatusOr<std::shared_ptr<CompiledKernel>> CompiledKernel::create(const Kernel& kernel,
                                                                 const CompileOptions& options) {
  std::shared_ptr<CompiledKernel> ck(new CompiledKernel());
  ck->impl_->kernel = kernel;
  ck->impl_->options = options;
  ck->impl_->threads = base::kernel_threads(options.num_threads);
  static std::atomic<uint64_t> next_id{1};
  ck->impl_->id = next_id.fetch_add(1, std::memory_order_relaxed);
  const ir::KernelDef& def = kernel.def();
  ck->impl_->in_place_ok = def.outputs.size() == 1 &&
                           std::all_of(def.nodes.begin(), def.nodes.end(), [](const ir::Node& n) {
                             return n.kind == ir::OpKind::kLoad || n.kind == ir::OpKind::kParam ||
                                    n.kind == ir::OpKind::kConst || n.kind == ir::OpKind::kUnary ||
                                    n.kind == ir::OpKind::kBinary ||
                                    n.kind == ir::OpKind::kSelect || n.kind == ir::OpKind::kCast;
                           });
  return ck;
}

const Kernel& CompiledKernel::kernel() const {
  return impl_->kernel;
}

size_t CompiledKernel::cached_programs() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->cache.size();
}

// An integer param holds exactly an integer of its dtype's range: a float given for it must
// be integral and in range (NaN, inf or 2**40 for an i32 used to become 0 silently).
static Status check_param(const std::string& kernel, const std::string& name, DType dtype,
                          const ScalarArg& p) {
  if (is_float(dtype)) return Status::ok();
  const int64_t lo = dtype == DType::kI32 ? INT32_MIN : (dtype == DType::kBool ? 0 : INT64_MIN);
  const int64_t hi = dtype == DType::kI32 ? INT32_MAX : (dtype == DType::kBool ? 1 : INT64_MAX);
  bool ok = p.integral ? (p.i >= lo && p.i <= hi)
                       : (std::isfinite(p.f) && std::trunc(p.f) == p.f && p.f >= double(lo) &&
                          p.f <= double(hi) && p.f > -9.2e18 && p.f < 9.2e18);
  if (ok) return Status::ok();
  std::string value = p.integral ? std::to_string(p.i) : std::to_string(p.f);
  return invalid_argument(kernel + ": param '" + name + "' (" + std::string(dtype_name(dtype)) +
                          ") cannot hold " + value);
}

// What every call checks before its lookup: the argument counts and the params' values.
Status CompiledKernel::Impl::check_counts_and_params(std::span<const TensorArg> inputs,
                                                     std::span<const TensorArg> outputs,
                                                     std::span<const ScalarArg> params) const {
  const ir::KernelDef& def = kernel.def();
  if (inputs.size() != def.input_nodes.size() || outputs.size() != def.outputs.size() ||
      params.size() != def.param_names.size()) {
    return invalid_argument(def.name + ": expected " + std::to_string(def.input_nodes.size()) +
                            " inputs, " + std::to_string(def.outputs.size()) + " outputs, " +
                            std::to_string(def.param_names.size()) + " params; got " +
                            std::to_string(inputs.size()) + ", " + std::to_string(outputs.size()) +
                            ", " + std::to_string(params.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    DVM_RETURN_IF_ERROR(check_param(def.name, def.param_names[i], def.param_dtypes[i], params[i]));
  }
  return Status::ok();
}

// Dtypes are part of the cache key: a hit has the dtypes of a call that passed this check.
Status CompiledKernel::Impl::check_dtypes(std::span<const TensorArg> inputs,
                                          std::span<const TensorArg> outputs) const {
  const ir::KernelDef& def = kernel.def();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].dtype != def.nodes[def.input_nodes[i]].dtype)
      return invalid_argument(def.name + ": input '" + def.input_names[i] + "' has dtype " +
                              std::string(dtype_name(inputs[i].dtype)) + ", expected " +
                              std::string(dtype_name(def.nodes[def.input_nodes[i]].dtype)));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].dtype != def.nodes[def.outputs[i].node].dtype)
      return invalid_argument(def.name + ": output '" + def.outputs[i].name + "' has dtype " +
                              std::string(dtype_name(outputs[i].dtype)) + ", expected " +
                              std::string(dtype_name(def.nodes[def.outputs[i].node].dtype)));
  }
  return Status::ok();
}

// The per-call half of the proofs of a binding: what the pointers decide (nulls, overlaps).
Status CompiledKernel::Impl::check_pointers(const Encoded& e, std::span<const TensorArg> inputs,
                                            std::span<const TensorArg> outputs) const {
  const size_t io = inputs.size() + outputs.size();
  void* data[16];
  std::vector<void*> heap;
  void** d = data;
  if (io > std::size(data)) {
    heap.resize(io);
    d = heap.data();
  }
  for (size_t s = 0; s < io; ++s) {
    const TensorArg& t = s < inputs.size() ? inputs[s] : outputs[s - inputs.size()];
    d[s] = t.data;
    if (t.data == nullptr && e.needs_data[s]) {
      const ir::KernelDef& def = kernel.def();
      return invalid_argument(def.name + ": " +
                              (s < inputs.size()
                                   ? "input '" + def.input_names[s]
                                   : "output '" + def.outputs[s - inputs.size()].name) +
                              "' has null data");
    }
  }
  if (outputs.empty()) return Status::ok();
  return runtime::check_disjoint(kernel.def().name, inputs.size(), {d, io}, e.extents, e.in_place);
}

namespace {

// A thread's recent bindings, direct-mapped by kernel id: a call that repeats one of them
// (the common case: a model calls each kernel at the shapes of its previous call) takes no
// lock, no hash probe and no reference count. Entries keep their binding alive.
template <class Encoded>
struct Memo {
  uint64_t kernel = 0;  // CompiledKernel::Impl::id; 0: empty
  Key key;
  std::shared_ptr<const Encoded> encoded;
};
constexpr size_t kMemos = 16;

}  // namespace

StatusOr<const CompiledKernel::Impl::Encoded*> CompiledKernel::Impl::lookup(
    std::span<const TensorArg> inputs, std::span<const TensorArg> outputs,
    std::span<const ScalarArg> params, RunStats* stats,
    std::shared_ptr<const Encoded>* hold) const {
  thread_local std::array<Memo<Encoded>, kMemos> memos;
  Memo<Encoded>& memo = memos[id % kMemos];
  if (memo.kernel != id || !key_matches(memo.key, inputs, outputs)) {
    thread_local Key key;
    make_key(inputs, outputs, &key);
    std::shared_ptr<const Encoded> found;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = cache.find(key);
      if (it != cache.end()) found = it->second;
    }
    if (found == nullptr) {
      DVM_ASSIGN_OR_RETURN(found, encode(inputs, outputs, params, stats));
      std::lock_guard<std::mutex> lock(mu);
      if (cache.size() >= options.cache_capacity) cache.clear();
      cache.emplace(key, found);
    } else if (stats) {
      stats->cache_hit = true;
    }
    memo.kernel = id;
    memo.key = key;
    memo.encoded = std::move(found);
  } else if (stats) {
    stats->cache_hit = true;
  }
  if (stats && stats->cache_hit && base::env().verify_always) {
    // A debugging aid: catch a program corrupted in memory.
    for (const bc::Program& p : memo.encoded->kernel.programs)
      DVM_RETURN_IF_ERROR(bc::verify(p, nullptr));
  }
  if (hold != nullptr) *hold = memo.encoded;
  return memo.encoded.get();
}

StatusOr<const CompiledKernel::Impl::Encoded*> CompiledKernel::Impl::bind(
    std::span<const TensorArg> inputs, std::span<const TensorArg> outputs,
    std::span<const ScalarArg> params, RunStats* stats,
    std::shared_ptr<const Encoded>* hold) const {
  DVM_RETURN_IF_ERROR(check_counts_and_params(inputs, outputs, params));
  if (stats) *stats = RunStats{};
  DVM_ASSIGN_OR_RETURN(const Encoded* enc, lookup(inputs, outputs, params, stats, hold));
  DVM_RETURN_IF_ERROR(check_pointers(*enc, inputs, outputs));
  return enc;
}

Status CompiledKernel::prepare(std::span<const TensorArg> inputs,
                               std::span<const TensorArg> outputs,
                               std::span<const ScalarArg> params, RunStats* stats) const {
  return impl_->bind(inputs, outputs, params, stats).status();
}

struct CompiledKernel::Launch {
  std::shared_ptr<const Impl::Encoded> encoded;
  size_t num_inputs = 0;
  std::vector<bc::Constant> consts;
};

namespace {

// The params as the programs' constant operands.
void param_constants(const ir::KernelDef& def, std::span<const ScalarArg> params,
                     std::vector<bc::Constant>* consts) {
  consts->resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    bool f = is_float(def.param_dtypes[i]);
    bc::Constant& c = (*consts)[i];
    c.f32 = static_cast<float>(f ? params[i].f : static_cast<double>(params[i].i));
    int64_t iv = f ? static_cast<int64_t>(params[i].f) : params[i].i;
    if (def.param_dtypes[i] == DType::kBool) iv = (f ? params[i].f != 0 : params[i].i != 0);
    c.i64 = iv;
    c.i32 = static_cast<int32_t>(static_cast<uint64_t>(iv));
  }
}

// Relocation's proof: every span the verifier computed lies inside its slot's storage.
Status check_spans(const std::string& kernel, const enc::EncodedKernel& ek,
                   std::span<const TensorArg> inputs, std::span<const TensorArg> outputs) {
  size_t io = inputs.size() + outputs.size();
  for (size_t s = 0; s < ek.slot_spans.size(); ++s) {
    auto [lo, hi] = ek.slot_spans[s];
    if (lo > hi) continue;
    bool present = true;  // workspaces always are
    int64_t storage;
    if (s < io) {
      const TensorArg& t = s < inputs.size() ? inputs[s] : outputs[s - inputs.size()];
      present = t.data != nullptr;
      storage = storage_of(t);
    } else {
      storage = ek.workspace_elems[s - io];
    }
    if (!present || lo < 0 || hi >= storage) {
      return out_of_range(kernel + ": a program would access elements [" + std::to_string(lo) +
                          ", " + std::to_string(hi) + "] of slot " + std::to_string(s) +
                          " whose storage has " + std::to_string(storage) + " elements");
    }
  }
  return Status::ok();
}

// Binds the addresses (arguments, then this thread's workspaces) and launches every program.
// An integer division by zero (torch raises there) stops it with an error naming the op.
Status launch_programs(const std::string& kernel,
                       const std::vector<std::shared_ptr<const vm::LoadedProgram>>& loaded,
                       const enc::EncodedKernel& ek, size_t io, size_t num_inputs,
                       std::span<void* const> data, const uint64_t* in_versions,
                       const bc::Constant* consts, int threads) {
  size_t nslots = ek.slot_spans.size();
  thread_local std::vector<void*> slots;
  thread_local std::vector<uint64_t> versions;
  thread_local std::vector<std::vector<char>> workspaces;
  slots.assign(nslots, nullptr);
  bool any_version = false;
  if (in_versions != nullptr) {
    versions.assign(nslots, 0);
    for (size_t s = 0; s < num_inputs; ++s) {
      versions[s] = in_versions[s];
      any_version = any_version || in_versions[s] != 0;
    }
  }
  for (size_t s = 0; s < io; ++s) slots[s] = data[s];
  if (workspaces.size() < ek.workspace_bytes.size()) workspaces.resize(ek.workspace_bytes.size());
  for (size_t s = io; s < nslots; ++s) {
    auto& ws = workspaces[s - io];
    size_t bytes = static_cast<size_t>(ek.workspace_bytes[s - io]);
    if (ws.size() < bytes) ws.resize(bytes);
    slots[s] = ws.data();
  }
  std::atomic<int> fault{0};
  vm::LaunchArgs args{slots.data(), consts, any_version ? versions.data() : nullptr};
  args.fault = &fault;
  for (const auto& p : loaded) {
    vm::launch(*p, args, threads);
    if (const int f = fault.load(std::memory_order_relaxed); f != 0) {
      return invalid_argument(kernel + ": integer " + binary_op_name(static_cast<BinaryOp>(f - 1)) +
                              " by zero (a divisor element is 0)");
    }
  }
  return Status::ok();
}

}  // namespace

// A binding's first call: every check that shapes, strides, offsets and dtypes decide, then
// the encoding; what later calls of the layout need of the proofs is kept with the programs.
StatusOr<std::shared_ptr<const CompiledKernel::Impl::Encoded>> CompiledKernel::Impl::encode(
    std::span<const TensorArg> inputs, std::span<const TensorArg> outputs,
    std::span<const ScalarArg> params, RunStats* stats) const {
  const ir::KernelDef& def = kernel.def();
  DVM_RETURN_IF_ERROR(check_dtypes(inputs, outputs));
  DVM_RETURN_IF_ERROR(runtime::check_no_overlap(def.name, inputs, outputs, in_place_ok));
  const double t0 = base::now_us();
  ir::Binding binding;
  DVM_RETURN_IF_ERROR(ir::bind_shapes(def, inputs, &binding));
  DVM_RETURN_IF_ERROR(ir::check_args(def, binding, inputs, outputs, params));
  auto e = std::make_shared<Encoded>();
  enc::EncodeOptions eo;
  eo.num_threads = threads;
  eo.target = &vm::cpu_target();
  DVM_RETURN_IF_ERROR(enc::encode(def, binding, inputs, outputs, eo, &e->kernel));
  DVM_RETURN_IF_ERROR(check_spans(def.name, e->kernel, inputs, outputs));
  for (const bc::Program& p : e->kernel.programs) e->loaded.push_back(vm::load(p));
  if (stats) stats->encode_us = base::now_us() - t0;
  if (base::env().dump_bytecode) {
    for (const auto& p : e->kernel.programs)
      std::fprintf(stderr, "%s\n", bc::disassemble(p).c_str());
  }
  for (std::span<const TensorArg> args : {inputs, outputs}) {
    for (const TensorArg& t : args) {
      const size_t s = e->extents.size();
      e->extents.push_back(runtime::byte_extent(t));
      const auto [lo, hi] = e->kernel.slot_spans[s];
      e->needs_data.push_back(e->extents.back().lo != e->extents.back().hi || lo <= hi);
    }
  }
  if (in_place_ok) runtime::same_layouts(inputs, outputs, &e->in_place);
  return std::shared_ptr<const Encoded>(std::move(e));
}

Status CompiledKernel::run(std::span<const TensorArg> inputs, std::span<const TensorArg> outputs,
                           std::span<const ScalarArg> params, RunStats* stats) const {
  DVM_ASSIGN_OR_RETURN(const Impl::Encoded* enc, impl_->bind(inputs, outputs, params, stats));
  const enc::EncodedKernel& ek = enc->kernel;
  const size_t io = inputs.size() + outputs.size();
  thread_local std::vector<void*> data;
  thread_local std::vector<uint64_t> versions;
  data.resize(io);
  versions.resize(inputs.size());
  bool any_version = false;
  for (size_t k = 0; k < inputs.size(); ++k) {
    data[k] = inputs[k].data;
    versions[k] = inputs[k].version;
    any_version = any_version || versions[k] != 0;
  }
  for (size_t k = 0; k < outputs.size(); ++k) data[inputs.size() + k] = outputs[k].data;
  thread_local std::vector<bc::Constant> consts;
  param_constants(impl_->kernel.def(), params, &consts);
  DVM_RETURN_IF_ERROR(launch_programs(impl_->kernel.def().name, enc->loaded, ek, io, inputs.size(),
                                      data, any_version ? versions.data() : nullptr, consts.data(),
                                      impl_->threads));
  if (stats) {
    for (const auto& p : enc->loaded) stats->blocks += p->program.grid;
    stats->programs = static_cast<int>(ek.programs.size());
    stats->bytes_moved = ek.bytes_moved;
  }
  return Status::ok();
}

StatusOr<std::shared_ptr<const CompiledKernel::Launch>> CompiledKernel::prepare_launch(
    std::span<const TensorArg> inputs, std::span<const TensorArg> outputs,
    std::span<const ScalarArg> params, RunStats* stats) const {
  auto l = std::make_shared<Launch>();
  DVM_RETURN_IF_ERROR(impl_->bind(inputs, outputs, params, stats, &l->encoded).status());
  l->num_inputs = inputs.size();
  param_constants(impl_->kernel.def(), params, &l->consts);
  return std::shared_ptr<const Launch>(std::move(l));
}

Status CompiledKernel::run_launch(const Launch& l, std::span<void* const> data,
                                  const uint64_t* versions) const {
  return launch_programs(impl_->kernel.def().name, l.encoded->loaded, l.encoded->kernel,
                         data.size(), l.num_inputs, data, versions, l.consts.data(),
                         impl_->threads);
}

StatusOr<std::vector<std::vector<int64_t>>> CompiledKernel::infer_output_shapes(
    std::span<const TensorArg> inputs) const {
  const ir::KernelDef& def = impl_->kernel.def();
  ir::Binding b;
  DVM_RETURN_IF_ERROR(ir::bind_shapes(def, inputs, &b));
  std::vector<std::vector<int64_t>> out;
  for (const auto& o : def.outputs) {
    const ir::CShape& s = b.shapes[o.node];
    out.emplace_back(s.d.begin(), s.d.begin() + s.rank);
  }
  return out;
}

StatusOr<std::string> CompiledKernel::disassemble(std::span<const TensorArg> inputs,
                                                  std::span<const TensorArg> outputs) const {
  std::vector<ScalarArg> no_params(impl_->kernel.num_params());
  DVM_ASSIGN_OR_RETURN(const Impl::Encoded* enc, impl_->bind(inputs, outputs, no_params, nullptr));
  std::string s;
  for (const bc::Program& p : enc->kernel.programs) s += bc::disassemble(p) + "\n";
  return s;
}

TensorArg TensorArg::contiguous(void* data, DType dtype, std::vector<int64_t> shape) {
  TensorArg t;
  t.data = data;
  t.dtype = dtype;
  t.shape = std::move(shape);
  return t;
}

int64_t TensorArg::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace dvm
