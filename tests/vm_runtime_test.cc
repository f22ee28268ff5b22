// The runtime around the VM: program cache and relocation, statistics, determinism across
// thread counts, run-time params, staged (workspace) kernels.
#include <atomic>
#include <chrono>
#include <functional>
#include <sstream>
#include <thread>
#include <vector>

#include "base/thread_pool.h"
#include "vm_test_util.h"

namespace dvm::testing {
namespace {

Kernel softmax_kernel() {
  KernelBuilder kb("softmax");
  Dim S = kb.symbol("S"), H = kb.symbol("H");
  Value x = kb.load("x", DType::kF32, {S, H});
  Value e = kb.unary(UnaryOp::kExp, kb.sub(x, kb.max(x, {-1}, true)));
  kb.store("y", kb.div(e, kb.sum(e, {-1}, true)));
  return kb.build().value();
}

TEST(Runtime, CacheHitRelocatesToNewAddresses) {
  Kernel k = softmax_kernel();
  auto ck = CompiledKernel::create(k).value();
  std::mt19937 rng(1);
  Buffer x1 = make_buffer(DType::kF32, {8, 300}, rng), x2 = make_buffer(DType::kF32, {8, 300}, rng);
  Buffer y1 = make_buffer(DType::kF32, {8, 300}, rng), y2 = make_buffer(DType::kF32, {8, 300}, rng);
  RunStats st;
  ASSERT_TRUE(ck->run({&x1.arg, 1}, {&y1.arg, 1}, {}, &st).is_ok());
  EXPECT_FALSE(st.cache_hit);
  EXPECT_GT(st.encode_us, 0);
  EXPECT_EQ(st.programs, 1);
  ASSERT_TRUE(ck->run({&x2.arg, 1}, {&y2.arg, 1}, {}, &st).is_ok());
  EXPECT_TRUE(st.cache_hit);
  EXPECT_EQ(st.encode_us, 0);
  EXPECT_EQ(ck->cached_programs(), 1u);
  // The second call wrote y2 from x2 (not y1 from x1 again).
  Buffer r2 = make_buffer(DType::kF32, {8, 300}, rng);
  ASSERT_TRUE(run_reference(k, {&x2.arg, 1}, {&r2.arg, 1}).is_ok());
  for (int64_t i = 0; i < 8 * 300; ++i) EXPECT_NEAR(element(y2, i), element(r2, i), 1e-6);
  // A new shape misses the cache.
  Buffer x3 = make_buffer(DType::kF32, {3, 300}, rng), y3 = make_buffer(DType::kF32, {3, 300}, rng);
  ASSERT_TRUE(ck->run({&x3.arg, 1}, {&y3.arg, 1}, {}, &st).is_ok());
  EXPECT_FALSE(st.cache_hit);
  EXPECT_EQ(ck->cached_programs(), 2u);
}

TEST(Runtime, BitwiseIdenticalAcrossThreadCounts) {
  Kernel k = softmax_kernel();
  std::mt19937 rng(2);
  for (auto shape : std::vector<std::vector<int64_t>>{{512, 1000}, {7, 40000}, {3000, 17}}) {
    Buffer x = make_buffer(DType::kF32, shape, rng);
    std::vector<std::vector<char>> results;
    for (int threads : {1, 2, 3}) {
      CompileOptions opt;
      opt.num_threads = threads;
      auto ck = CompiledKernel::create(k, opt).value();
      Buffer y = make_buffer(DType::kF32, shape, rng);
      ASSERT_TRUE(ck->run({&x.arg, 1}, {&y.arg, 1}).is_ok());
      results.push_back(y.bytes);
    }
    EXPECT_EQ(results[0], results[1]);
    EXPECT_EQ(results[0], results[2]);
  }
}

// An installed parallel backend (dvm::set_parallel_backend: the torch extension installs
// torch's pool) runs every part of a launch, with the same bits as DVM's own pool; nullptr
// restores DVM's pool.
std::atomic<int> g_backend_launches{0};
void reversed_serial_backend(int parts, const std::function<void(int)>& task) {
  g_backend_launches.fetch_add(1);
  for (int p = parts - 1; p >= 0; --p) task(p);  // any order, any thread
}

TEST(Runtime, ParallelBackendRunsEveryPartWithTheSameBits) {
  Kernel k = softmax_kernel();
  std::mt19937 rng(3);
  Buffer x = make_buffer(DType::kF32, {600, 900}, rng);
  CompileOptions opt;
  opt.num_threads = 3;
  auto ck = CompiledKernel::create(k, opt).value();
  Buffer own = make_buffer(DType::kF32, {600, 900}, rng);
  ASSERT_TRUE(ck->run({&x.arg, 1}, {&own.arg, 1}).is_ok());
  set_parallel_backend(&reversed_serial_backend);
  Buffer other = make_buffer(DType::kF32, {600, 900}, rng);
  const Status s = ck->run({&x.arg, 1}, {&other.arg, 1});
  set_parallel_backend(nullptr);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_GT(g_backend_launches.load(), 0);
  EXPECT_EQ(own.bytes, other.bytes);
  const int launches = g_backend_launches.load();
  ASSERT_TRUE(ck->run({&x.arg, 1}, {&other.arg, 1}).is_ok());
  EXPECT_EQ(g_backend_launches.load(), launches);  // DVM's pool again
}

// One launch of `parts` parts through `run` (parallel_for or a ThreadPool's run): whether every
// part ran exactly once.
template <class Run>
bool every_part_once(Run run, int parts) {
  std::vector<std::atomic<int>> runs(static_cast<size_t>(parts));
  run(parts, [&](int p) { runs[static_cast<size_t>(p)].fetch_add(1); });
  for (int p = 0; p < parts; ++p) {
    if (runs[static_cast<size_t>(p)].load() != 1) return false;
  }
  return true;
}

// The pool runs every part of every launch exactly once: launches back to back (a worker
// waking late must not take a part of the next one), from several threads at once (one owns
// the workers, the others run their parts themselves), nested inside a part, and after the
// workers fell asleep.
TEST(Runtime, ThreadPoolRunsEveryPartOnce) {
  const auto launch_and_count = [](int parts) {
    return every_part_once(
        [](int n, const std::function<void(int)>& fn) { base::parallel_for(n, fn); }, parts);
  };
  for (int i = 0; i < 2000; ++i) ASSERT_TRUE(launch_and_count(1 + i % 7)) << "launch " << i;
  std::atomic<int> bad{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int i = 0; i < 500; ++i) bad += !launch_and_count(2 + i % 5);
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(bad.load(), 0);
  std::atomic<int> inner{0};
  base::parallel_for(3, [&](int) { base::parallel_for(4, [&](int) { inner.fetch_add(1); }); });
  EXPECT_EQ(inner.load(), 12);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // idle workers block
  EXPECT_TRUE(launch_and_count(5));
}

// The same with more workers than this machine has cores (5 workers: parts dealt over up to 6
// threads, some postings taken back by a caller that got there first, several callers
// competing for the workers, parts beyond the threads, nested launches).
TEST(Runtime, ThreadPoolWithManyWorkers) {
  base::ThreadPool pool(5);
  const auto launch_and_count = [&pool](int parts) {
    return every_part_once([&pool](int n, const std::function<void(int)>& fn) { pool.run(n, fn); },
                           parts);
  };
  for (int i = 0; i < 2000; ++i) ASSERT_TRUE(launch_and_count(1 + i % 13)) << "launch " << i;
  std::atomic<int> bad{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t) {
    callers.emplace_back([&] {
      for (int i = 0; i < 300; ++i) bad += !launch_and_count(2 + i % 9);
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(bad.load(), 0);
  std::atomic<int> inner{0};
  pool.run(4, [&](int) { pool.run(5, [&](int) { inner.fetch_add(1); }); });
  EXPECT_EQ(inner.load(), 20);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(launch_and_count(9));
}

TEST(Runtime, ParamChangesWithoutReencoding) {
  KernelBuilder kb("scale");
  Value x = kb.load("x", DType::kF32, {kb.symbol("N")});
  Value a = kb.param("alpha", DType::kF32);
  kb.store("y", kb.mul(x, a));
  Kernel k = kb.build().value();
  auto ck = CompiledKernel::create(k).value();
  std::mt19937 rng(3);
  Buffer x1 = make_buffer(DType::kF32, {1000}, rng), y = make_buffer(DType::kF32, {1000}, rng);
  for (double alpha : {2.0, -0.5, 3.0}) {
    ScalarArg p = ScalarArg::of_float(alpha);
    RunStats st;
    ASSERT_TRUE(ck->run({&x1.arg, 1}, {&y.arg, 1}, {&p, 1}, &st).is_ok());
    for (int64_t i = 0; i < 1000; ++i)
      EXPECT_FLOAT_EQ(static_cast<float>(element(y, i)),
                      static_cast<float>(element(x1, i) * alpha));
  }
  EXPECT_EQ(ck->cached_programs(), 1u);
}

TEST(Runtime, StagedKernelsThroughWorkspaces) {
  // A reshape of a computed value, a concat consumed further, and two reductions over
  // different axes each need a stage boundary.
  KernelBuilder kb("staged");
  Dim N = kb.symbol("N");
  Value x = kb.load("x", DType::kF32, {N, 6});
  Value y = kb.unary(UnaryOp::kExp, x);
  Value r = kb.reshape(y, {Dim(-1), 3});
  Value c = kb.concat({r, kb.binary(BinaryOp::kMul, r, 2.0)}, 0);
  kb.store("c", kb.binary(BinaryOp::kAdd, c, 1.0));
  kb.store("s", kb.sum(kb.sum(y, {1}), {0}));
  Kernel k = kb.build().value();
  std::mt19937 rng(4);
  for (int64_t n : {1, 5, 64}) {
    expect_matches_reference(k, {make_buffer(DType::kF32, {n, 6}, rng)}, Tolerance{1e-5, 1e-5});
  }
  auto ck = CompiledKernel::create(k).value();
  Buffer xb = make_buffer(DType::kF32, {5, 6}, rng);
  Buffer cb = make_buffer(DType::kF32, {20, 3}, rng), sb = make_buffer(DType::kF32, {}, rng);
  TensorArg outs[] = {cb.arg, sb.arg};
  RunStats st;
  ASSERT_TRUE(ck->run({&xb.arg, 1}, outs, {}, &st).is_ok());
  EXPECT_GT(st.programs, 1);
}

TEST(Runtime, DisassemblyNamesInstructions) {
  Kernel k = softmax_kernel();
  auto ck = CompiledKernel::create(k).value();
  std::mt19937 rng(5);
  Buffer x = make_buffer(DType::kF32, {4, 50000}, rng),
         y = make_buffer(DType::kF32, {4, 50000}, rng);
  auto text = ck->disassemble({&x.arg, 1}, {&y.arg, 1});
  ASSERT_TRUE(text.is_ok());
  for (const char* m : {"loop", "endloop", "reduce", "exp", "div", "fill"})
    EXPECT_NE(text->find(m), std::string::npos) << m << "\n" << *text;
}

TEST(Runtime, ErrorsLeaveOutputsUntouched) {
  Kernel k = softmax_kernel();
  auto ck = CompiledKernel::create(k).value();
  std::mt19937 rng(6);
  Buffer x = make_buffer(DType::kF32, {4, 10}, rng);
  Buffer y = make_buffer(DType::kF32, {4, 11}, rng);  // wrong output shape
  std::vector<char> before = y.bytes;
  Status s = ck->run({&x.arg, 1}, {&y.arg, 1});
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("output 'y'"), std::string::npos) << s.message();
  EXPECT_EQ(y.bytes, before);
  Buffer y2 = make_buffer(DType::kF32, {4, 10}, rng);
  y2.arg.storage_elems = 39;  // one element short
  before = y2.bytes;
  s = ck->run({&x.arg, 1}, {&y2.arg, 1});
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.to_string();
  EXPECT_EQ(y2.bytes, before);
}

}  // namespace
}  // namespace dvm::testing

namespace dvm::testing {
namespace {

// Reductions with few outputs over many elements are split across blocks (partials, then a
// combine). Extents are chosen so that the trips do not divide evenly into the parts; sums
// and means run over data with a non-zero mean (a dropped or doubled share moves them far
// beyond the tolerance, which scales with sqrt(n)); max/min must be exact, with a spike
// planted at the first, the last and a share-boundary position in turn (max/min of random
// data rarely notice dropped elements); products run over near-1 data.
TEST(Runtime, ReductionsSplitAcrossBlocks) {
  std::mt19937 rng(7);
  struct Case {
    std::vector<int64_t> shape;
    std::vector<int> axes;
    ReduceOp op;
  };
  for (const Case& c : std::vector<Case>{{{(1 << 20) + 37}, {0}, ReduceOp::kSum},
                                         {{4, 300007}, {1}, ReduceOp::kMean},
                                         {{300011, 3}, {0}, ReduceOp::kMax},
                                         {{701, 3, 503}, {0, 2}, ReduceOp::kMin},
                                         {{(1 << 18) + 5}, {0}, ReduceOp::kProd},
                                         {{3, 177777}, {1}, ReduceOp::kSum}}) {
    KernelBuilder kb("split");
    std::vector<Dim> dims(c.shape.begin(), c.shape.end());
    Value x = kb.load("x", DType::kF32, dims);
    kb.store("y", kb.reduce(c.op, x, c.axes));
    Kernel k = kb.build().value();
    Buffer in = make_buffer(DType::kF32, c.shape, rng);
    int64_t n = in.arg.numel(), reduced = 1;
    for (int a : c.axes) reduced *= c.shape[a];
    auto* v = reinterpret_cast<float*>(in.bytes.data());
    for (int64_t i = 0; i < n; ++i) v[i] = c.op == ReduceOp::kProd ? 1 + v[i] * 1e-4f : v[i] + 1.5f;
    const double g = 8 * 1.2e-7 * std::sqrt(static_cast<double>(reduced));
    const bool order = c.op == ReduceOp::kMax || c.op == ReduceOp::kMin;
    Tolerance tol = order                    ? Tolerance{0, 0}
                    : c.op == ReduceOp::kSum ? Tolerance{g * 3.5 * reduced, 0}
                                             : Tolerance{g * 3.5, g};
    if (order) {
      for (int64_t at : {int64_t{0}, n - 1, n / 16 * 5 + 1, n / 16 * 5 - 1}) {
        float keep = v[at];
        v[at] = c.op == ReduceOp::kMax ? 100.0f : -100.0f;
        expect_matches_reference(k, {in}, tol, {}, "spike at " + std::to_string(at));
        v[at] = keep;
      }
    } else {
      expect_matches_reference(k, {in}, tol);
    }
    auto ck = CompiledKernel::create(k).value();
    auto shapes = ck->infer_output_shapes({&in.arg, 1}).value();
    Buffer out = make_buffer(DType::kF32, shapes[0], rng);
    RunStats st;
    ASSERT_TRUE(ck->run({&in.arg, 1}, {&out.arg, 1}, {}, &st).is_ok());
    EXPECT_EQ(st.programs, 2) << "partial + combine";
  }
}

// A row reduction used both inside another reduction over the same axis and after it (the
// max of log-sum-exp, then x_t - max - log(sum)) is computed once, in one program: the sum's
// axis is the max's, so nothing is stored and reloaded between programs.
TEST(Runtime, ReductionUsedInsideAndAfterAnotherIsOneProgram) {
  KernelBuilder kb("nll");
  Dim S = kb.symbol("S");
  Value x = kb.load("x", DType::kF32, {S, 700});
  Value xt = kb.load("xt", DType::kF32, {S, 1});
  Value m = kb.max(x, {-1}, true);
  Value lse = kb.unary(UnaryOp::kLog, kb.sum(kb.unary(UnaryOp::kExp, kb.sub(x, m)), {-1}, true));
  kb.store("y", kb.sub(kb.sub(xt, m), lse));
  Kernel k = kb.build().value();
  std::mt19937 rng(9);
  Buffer in = make_buffer(DType::kF32, {37, 700}, rng), t = make_buffer(DType::kF32, {37, 1}, rng);
  expect_matches_reference(k, {in, t}, Tolerance{1e-5, 1e-5});
  auto ck = CompiledKernel::create(k).value();
  Buffer out = make_buffer(DType::kF32, {37, 1}, rng);
  const TensorArg args[] = {in.arg, t.arg};
  RunStats st;
  ASSERT_TRUE(ck->run(args, {&out.arg, 1}, {}, &st).is_ok());
  EXPECT_EQ(st.programs, 1);
}

TEST(Runtime, SoftmaxOverFewLongRowsIsDeterministic) {
  Kernel k = softmax_kernel();
  std::mt19937 rng(8);
  Buffer x = make_buffer(DType::kF32, {3, 100003}, rng);
  expect_matches_reference(k, {x}, Tolerance{1e-7, 1e-4});
  std::vector<std::vector<char>> results;
  for (int threads : {1, 2}) {
    CompileOptions opt;
    opt.num_threads = threads;
    auto ck = CompiledKernel::create(k, opt).value();
    Buffer y = make_buffer(DType::kF32, {3, 100003}, rng);
    ASSERT_TRUE(ck->run({&x.arg, 1}, {&y.arg, 1}).is_ok());
    results.push_back(y.bytes);
  }
  EXPECT_EQ(results[0], results[1]);
}

}  // namespace
}  // namespace dvm::testing

namespace dvm::testing {
namespace {

// op(x + b) and op(x - b) fold the add/sub into the op's pass (a pre-op flag); every unary op,
// broadcast and strided operands, against the reference.
TEST(Runtime, UnaryWithFoldedAddOrSubtract) {
  std::mt19937 rng(11);
  for (int u = 0; u <= static_cast<int>(UnaryOp::kLogicalNot); ++u) {
    for (BinaryOp pre : {BinaryOp::kAdd, BinaryOp::kSub}) {
      KernelBuilder kb("pre_op");
      Dim S = kb.symbol("S");
      Value x = kb.load("x", DType::kF32, {S, 37});
      Value b = kb.load("b", DType::kF32, {37});
      kb.store("y", kb.unary(static_cast<UnaryOp>(u), kb.binary(pre, x, b)));
      Kernel k = kb.build().value();
      for (int64_t s : {1, 9}) {
        expect_matches_reference(k,
                                 {make_buffer(DType::kF32, {s, 37}, rng, /*transposed=*/s > 1),
                                  make_buffer(DType::kF32, {37}, rng)},
                                 Tolerance{2e-6, 4e-6}, {}, unary_op_name(static_cast<UnaryOp>(u)));
      }
    }
  }
}

// Elementwise runs become one Chain (strip by strip, intermediates in L1): a 10-op chain with
// a broadcast row and column operand, rows longer than a strip with a tail, and transposed
// inputs; the result matches the reference and the disassembly shows the chain.
TEST(Runtime, ElementwiseChainsMatchReference) {
  std::mt19937 rng(12);
  KernelBuilder kb("chain");
  Dim R = kb.symbol("R"), C = kb.symbol("C");
  Value x = kb.load("x", DType::kF32, {R, C});
  Value v = kb.load("v", DType::kF32, {R, 1});
  Value w = kb.load("w", DType::kF32, {C});
  Value t = kb.binary(BinaryOp::kAdd, kb.binary(BinaryOp::kMul, x, 0.5), v);
  t = kb.unary(UnaryOp::kTanh, t);
  t = kb.mul(t, x);
  t = kb.unary(UnaryOp::kSigmoid, kb.binary(BinaryOp::kSub, t, w));
  t = kb.add(kb.mul(t, t), x);
  t = kb.binary(BinaryOp::kMaximum, t, 0.0);
  t = kb.binary(BinaryOp::kDiv, t, kb.binary(BinaryOp::kAdd, w, 3.0));
  kb.store("y", kb.unary(UnaryOp::kExp, t));
  Kernel k = kb.build().value();
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{3, 1500}, {1, 4099}, {37, 13}, {5, 1}}) {
    std::vector<Buffer> in = {
        make_buffer(DType::kF32, {rows, cols}, rng, /*transposed=*/rows == 37),
        make_buffer(DType::kF32, {rows, 1}, rng), make_buffer(DType::kF32, {cols}, rng)};
    expect_matches_reference(k, in, Tolerance{2e-6, 4e-6}, {},
                             std::to_string(rows) + "x" + std::to_string(cols));
  }
  auto ck = CompiledKernel::create(k).value();
  Buffer x1 = make_buffer(DType::kF32, {3, 1500}, rng), v1 = make_buffer(DType::kF32, {3, 1}, rng),
         w1 = make_buffer(DType::kF32, {1500}, rng), y1 = make_buffer(DType::kF32, {3, 1500}, rng);
  TensorArg ins[] = {x1.arg, v1.arg, w1.arg};
  auto text = ck->disassemble(ins, {&y1.arg, 1});
  ASSERT_TRUE(text.is_ok());
  EXPECT_NE(text->find("chain.f32"), std::string::npos) << *text;
}

// A value computed elementwise from a register that dies there is written over it: layer
// norm's centered rows take the register of the sums' input (one tile-sized register less for
// the normalising passes to walk), and the results still match the reference.
TEST(Runtime, ElementwiseResultTakesItsDyingSourcesRegister) {
  KernelBuilder kb("layer_norm");
  Dim R = kb.symbol("R"), C = kb.symbol("C");
  Value h = kb.add(kb.load("x", DType::kF32, {R, C}), kb.load("r", DType::kF32, {R, C}));
  Value hc = kb.sub(h, kb.mean(h, {-1}, true));
  Value inv = kb.unary(UnaryOp::kRsqrt,
                       kb.binary(BinaryOp::kAdd, kb.mean(kb.mul(hc, hc), {-1}, true), 1e-5));
  kb.store("y", kb.mul(kb.mul(hc, inv), kb.load("g", DType::kF32, {C})));
  Kernel k = kb.build().value();
  std::mt19937 rng(7);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{5, 768}, {1, 1}, {33, 17}, {2, 5000}}) {
    std::vector<Buffer> in = {make_buffer(DType::kF32, {rows, cols}, rng),
                              make_buffer(DType::kF32, {rows, cols}, rng),
                              make_buffer(DType::kF32, {cols}, rng)};
    expect_matches_reference(k, in, Tolerance{2e-5, 2e-5}, {},
                             std::to_string(rows) + "x" + std::to_string(cols));
  }
  auto ck = CompiledKernel::create(k).value();
  Buffer x = make_buffer(DType::kF32, {40, 768}, rng), r = make_buffer(DType::kF32, {40, 768}, rng),
         g = make_buffer(DType::kF32, {768}, rng), y = make_buffer(DType::kF32, {40, 768}, rng);
  TensorArg ins[] = {x.arg, r.arg, g.arg};
  auto text = ck->disassemble(ins, {&y.arg, 1});
  ASSERT_TRUE(text.is_ok());
  // "sub.f32.full rX.full, rX.full, rY.row": the centered rows written over their source.
  const size_t at = text->find("sub.f32.full r");
  ASSERT_NE(at, std::string::npos) << *text;
  std::istringstream line(text->substr(at, text->find('\n', at) - at));
  std::string op, dst, src;
  line >> op >> dst >> src;
  EXPECT_EQ(dst, src) << *text;
}

// A chain whose tiles are wider than one strip (few registers: 4096- to 16384-column tiles,
// strips of 1024): every strip after the first must address its own columns of the in-place
// operands (x read directly, a transposed view, a broadcast row). The disassembly proves the path:
// a chain instruction over a tile of more than 1024 columns, in several blocks.
TEST(Runtime, ChainWithSeveralStripsPerTile) {
  std::mt19937 rng(13);
  KernelBuilder kb("wide_chain");
  Dim R = kb.symbol("R"), C = kb.symbol("C");
  Value x = kb.load("x", DType::kF32, {R, C});
  Value w = kb.load("w", DType::kF32, {C});
  Value t = kb.unary(UnaryOp::kTanh, kb.binary(BinaryOp::kMul, x, 0.5));
  kb.store("y", kb.unary(UnaryOp::kExp, kb.binary(BinaryOp::kMul, kb.add(t, w), x)));
  Kernel k = kb.build().value();
  for (auto [rows, cols, transposed] :
       {std::tuple<int64_t, int64_t, bool>{4, 5003, false}, {1, 100003, false}, {3, 4099, true}}) {
    std::vector<Buffer> in = {make_buffer(DType::kF32, {rows, cols}, rng, transposed),
                              make_buffer(DType::kF32, {cols}, rng)};
    for (int threads : {1, 2}) {
      CompileOptions opt;
      opt.num_threads = threads;
      auto ck = CompiledKernel::create(k, opt).value();
      std::vector<TensorArg> args = {in[0].arg, in[1].arg};
      Buffer y = make_buffer(DType::kF32, {rows, cols}, rng);
      auto text = ck->disassemble(args, {&y.arg, 1});
      ASSERT_TRUE(text.is_ok());
      if (!transposed) {
        EXPECT_NE(text->find("chain.f32"), std::string::npos) << *text;
        const size_t at = text->find("grid col-tile");
        ASSERT_NE(at, std::string::npos) << *text;
        const int64_t chunk = std::stoll(text->substr(text->rfind("chunk", at) + 6));
        EXPECT_GE(chunk, 2048) << *text;  // tiles of several strips
      }
    }
    expect_matches_reference(k, in, Tolerance{2e-6, 4e-6}, {},
                             std::to_string(rows) + "x" + std::to_string(cols));
  }
}

// An expression thousands of ops deep (y = y * 0.5 + 0.5, 6,000 times) overflowed the
// stack of the encoder's recursive visit; the encoder now cuts it into stages. The VM must
// still match the reference, with a few dozen stages rather than one per op.
TEST(Runtime, VeryDeepExpressionIsCutIntoStages) {
  KernelBuilder kb("deep");
  Dim S = kb.symbol("S");
  Value y = kb.load("x", DType::kF32, {S, 33});
  for (int i = 0; i < 6000; ++i) y = kb.add(kb.mul(y, kb.constant(0.5)), kb.constant(0.5));
  kb.store("y", y);
  Kernel k = kb.build().value();
  std::mt19937 rng(3);
  expect_matches_reference(k, {make_buffer(DType::kF32, {5, 33}, rng)}, {1e-5, 1e-5});
  Buffer x = make_buffer(DType::kF32, {5, 33}, rng), out = make_buffer(DType::kF32, {5, 33}, rng);
  RunStats st;
  auto ck = CompiledKernel::create(k).value();
  ASSERT_TRUE(ck->run({&x.arg, 1}, {&out.arg, 1}, {}, &st).is_ok());
  EXPECT_GT(st.programs, 1);
  EXPECT_LT(st.programs, 100);
}

// A value used twice at every level (y = y * y + y, 60 levels): a tree walk of this DAG visits
// 2^60 nodes; the encoder must visit each (node, map) once.
TEST(Runtime, SharedSubexpressionsAreVisitedOnce) {
  KernelBuilder kb("square_chain");
  Dim S = kb.symbol("S");
  Value y = kb.load("x", DType::kF32, {S});
  for (int i = 0; i < 60; ++i) y = kb.mul(kb.add(kb.mul(y, y), y), kb.constant(0.25));
  kb.store("y", y);
  Kernel k = kb.build().value();
  std::mt19937 rng(4);
  expect_matches_reference(k, {make_buffer(DType::kF32, {100}, rng)}, {1e-6, 1e-5});
  // One op per level, each reading its input twice: a walk without a memo (the encoder's
  // search for a concat to split at the sink) makes 2^40 visits.
  KernelBuilder kb2("square_tower");
  Value z = kb2.load("x", DType::kF32, {kb2.symbol("S")});
  for (int i = 0; i < 40; ++i) z = kb2.mul(z, z);
  kb2.store("y", kb2.binary(BinaryOp::kMinimum, z, kb2.constant(1.0)));
  Kernel k2 = kb2.build().value();
  expect_matches_reference(k2, {make_buffer(DType::kF32, {100}, rng)}, {1e-6, 1e-5});
}

// y = 2x + 1 and z = -x over one symbolic dim: two outputs that both read x.
std::shared_ptr<CompiledKernel> affine_two_outputs(const std::string& name) {
  KernelBuilder kb(name);
  Value x = kb.load("x", DType::kF32, {kb.symbol("S")});
  kb.store("y", kb.add(kb.mul(x, kb.constant(2.0)), kb.constant(1.0)));
  kb.store("z", kb.unary(UnaryOp::kNeg, x));
  return CompiledKernel::create(kb.build().value()).value();
}

// Outputs that overlap an input, each other or themselves are rejected with an error naming
// the output, before anything is written. Exact in-place runs are allowed only for one-output
// elementwise kernels: here the second output would read x after the first one stored over
// it (z came out -3, not -1).
TEST(Runtime, OverlappingOutputsAreRejected) {
  auto ck = affine_two_outputs("affine");
  std::vector<float> mem(64, 1.0f), other(64, 0.0f);
  auto view = [](float* p, int64_t n, int64_t stride) {
    TensorArg t = TensorArg::contiguous(p, DType::kF32, {n});
    t.strides = {stride};
    return t;
  };
  const TensorArg in[] = {view(mem.data(), 16, 1)};
  auto expect_rejected = [&](TensorArg y, TensorArg z, const std::string& what) {
    const TensorArg out[] = {y, z};
    std::vector<float> before = mem, before_other = other;
    Status st = ck->run(in, out);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << what << ": " << st.to_string();
    EXPECT_NE(st.message().find("output"), std::string::npos) << st.message();
    EXPECT_EQ(mem, before) << what;
    EXPECT_EQ(other, before_other) << what;
  };
  expect_rejected(view(mem.data() + 1, 16, 1), view(other.data(), 16, 1), "shifted by one");
  expect_rejected(view(other.data(), 16, 1), view(other.data() + 8, 16, 1), "outputs overlap");
  expect_rejected(view(other.data(), 16, 0), view(other.data() + 32, 16, 1), "stride 0");
  expect_rejected(view(mem.data() + 15, 16, -1), view(other.data(), 16, 1), "reversed");
  expect_rejected(view(mem.data(), 16, 1), view(other.data(), 16, 1), "exactly in place");
  // One output, elementwise: exactly in place is allowed and correct.
  KernelBuilder one("scale");
  Value x1 = one.load("x", DType::kF32, {one.symbol("S")});
  one.store("y", one.mul(x1, one.constant(3.0)));
  auto ck1 = CompiledKernel::create(one.build().value()).value();
  const TensorArg in_place[] = {view(other.data() + 40, 16, 1)};
  std::fill(other.begin() + 40, other.begin() + 56, 2.0f);
  ASSERT_TRUE(ck1->run(in_place, in_place).is_ok());
  for (int i = 40; i < 56; ++i) EXPECT_EQ(other[i], 6.0f);
  // Disjoint outputs run.
  const TensorArg out[] = {view(other.data(), 16, 1), view(other.data() + 16, 16, 1)};
  ASSERT_TRUE(ck->run(in, out).is_ok());
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(other[i], 3.0f);
    EXPECT_EQ(other[16 + i], -1.0f);
  }
}

// A call whose layout (shapes, strides, offsets, dtypes, storage sizes) was bound before
// reuses that binding's proofs and re-checks only what its pointers decide: overlaps, null
// data. Each rejection below follows a successful call of the same layout.
TEST(Runtime, CachedBindingsStillCheckPointersAndStorage) {
  auto ck = affine_two_outputs("affine2");
  std::vector<float> mem(64, 1.0f), other(64, 0.0f);
  const auto view = [](float* p, int64_t n) { return TensorArg::contiguous(p, DType::kF32, {n}); };
  const TensorArg in[] = {view(mem.data(), 16)};
  const TensorArg good[] = {view(other.data(), 16), view(other.data() + 16, 16)};
  ASSERT_TRUE(ck->run(in, good).is_ok());
  const auto expect_error = [&](std::span<const TensorArg> ins, std::span<const TensorArg> outs,
                                const std::string& needle) {
    std::vector<float> before = mem, before_other = other;
    RunStats stats;
    Status st = ck->run(ins, outs, {}, &stats);
    EXPECT_FALSE(st.is_ok()) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
    EXPECT_EQ(mem, before) << needle;
    EXPECT_EQ(other, before_other) << needle;
  };
  const TensorArg over_input[] = {view(mem.data() + 4, 16), view(other.data(), 16)};
  expect_error(in, over_input, "overlaps the memory of input 0");
  const TensorArg outs_meet[] = {view(other.data(), 16), view(other.data() + 15, 16)};
  expect_error(in, outs_meet, "outputs 0 and 1 overlap");
  const TensorArg null_in[] = {view(nullptr, 16)};
  expect_error(null_in, good, "input 'x' has null data");
  const TensorArg null_out[] = {view(other.data(), 16), view(nullptr, 16)};
  expect_error(in, null_out, "output 'z' has null data");
  // The storage size is part of the layout: the same view over too little storage is refused.
  TensorArg short_storage = view(mem.data(), 16);
  short_storage.storage_elems = 8;
  const TensorArg short_in[] = {short_storage};
  expect_error(short_in, good, "outside its storage");
  // The bound layout still runs, with new pointers.
  const TensorArg moved_in[] = {view(mem.data() + 32, 16)};
  const TensorArg moved[] = {view(other.data() + 32, 16), view(other.data() + 48, 16)};
  RunStats stats;
  ASSERT_TRUE(ck->run(moved_in, moved, {}, &stats).is_ok());
  EXPECT_TRUE(stats.cache_hit);
  EXPECT_EQ(other[32], 3.0f);
  EXPECT_EQ(other[48], -1.0f);
  // In place: a one-output elementwise kernel bound out of place runs in place at the same
  // layout, and still refuses a partial overlap of that layout.
  KernelBuilder one("scale2");
  Value x1 = one.load("x", DType::kF32, {one.symbol("S")});
  one.store("y", one.mul(x1, one.constant(3.0)));
  auto ck1 = CompiledKernel::create(one.build().value()).value();
  const TensorArg a[] = {view(mem.data(), 8)}, b[] = {view(other.data(), 8)};
  ASSERT_TRUE(ck1->run(a, b).is_ok());
  std::fill(other.begin(), other.begin() + 8, 2.0f);
  ASSERT_TRUE(ck1->run(b, b).is_ok());
  EXPECT_EQ(other[0], 6.0f);
  EXPECT_EQ(other[7], 6.0f);
  const TensorArg shifted[] = {view(other.data() + 1, 8)};
  Status st = ck1->run(b, shifted);
  EXPECT_NE(st.message().find("overlaps the memory of input 0"), std::string::npos)
      << st.to_string();
}

// Each thread remembers its recent bindings by kernel (a direct-mapped memo, 16 entries):
// more kernels than entries, called in turns at alternating shapes, kernels destroyed and
// new ones created (whose memory may reuse the old ones' addresses), and a cache capacity
// of one binding must all still run the right programs.
TEST(Runtime, ThreadMemoOfBindingsStaysCorrect) {
  std::vector<std::shared_ptr<CompiledKernel>> kernels;
  const auto make = [](int i) {
    KernelBuilder kb("affine_" + std::to_string(i));
    Value x = kb.load("x", DType::kF32, {kb.symbol("S")});
    kb.store("y", kb.add(kb.mul(x, kb.constant(2.0)), kb.constant(static_cast<double>(i))));
    CompileOptions o;
    o.cache_capacity = i % 3 == 0 ? 1 : 8;
    return CompiledKernel::create(kb.build().value(), o).value();
  };
  for (int i = 0; i < 40; ++i) kernels.push_back(make(i));
  std::vector<int> age(kernels.size(), 0);  // rounds run since the kernel was created
  std::vector<float> x(64), y(64);
  for (int i = 0; i < 64; ++i) x[i] = static_cast<float>(i);
  for (int round = 0; round < 6; ++round) {
    for (size_t i = 0; i < kernels.size(); ++i) {
      const int64_t n = (round + static_cast<int64_t>(i)) % 2 == 0 ? 64 : 17;
      std::fill(y.begin(), y.end(), -1.0f);
      const TensorArg in[] = {TensorArg::contiguous(x.data(), DType::kF32, {n})};
      const TensorArg out[] = {TensorArg::contiguous(y.data(), DType::kF32, {n})};
      RunStats stats;
      ASSERT_TRUE(kernels[i]->run(in, out, {}, &stats).is_ok());
      if (age[i] >= 2 && i % 3 != 0) {  // both shapes bound, and room for both
        EXPECT_TRUE(stats.cache_hit) << i;
      }
      for (int64_t j = 0; j < 64; ++j) {
        const float want = j < n ? 2.0f * static_cast<float>(j) + static_cast<float>(i) : -1.0f;
        ASSERT_EQ(y[j], want) << "kernel " << i << " round " << round << " n " << n << " j " << j;
      }
    }
    for (int& a : age) ++a;
    // Replace a few kernels: the new ones must not see the old ones' bindings.
    for (size_t i = static_cast<size_t>(round); i < kernels.size(); i += 7) {
      kernels[i].reset();
      kernels[i] = make(static_cast<int>(i));
      age[i] = 0;
    }
  }
}

}  // namespace
}  // namespace dvm::testing
