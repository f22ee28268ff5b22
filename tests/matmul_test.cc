// MatMul ("cube") and matmul with fused epilogues ("mix") on the VM, against the reference.
#include <algorithm>
#include <thread>

#include "bytecode/verifier.h"
#include "encoder/encoder.h"
#include "vm/cpu/gemm.h"
#include "vm/interpreter.h"
#include "vm_test_util.h"

namespace dvm::testing {
namespace {

struct MmCase {
  std::vector<int64_t> a, b;
  bool ta = false, tb = false;
};

// Tolerance for an f32 dot product of length k against the double-accumulated reference.
Tolerance mm_tol(int64_t k) {
  return Tolerance{1e-5 * std::sqrt(static_cast<double>(k) + 1), 1e-4};
}

TEST(MatMul, ShapesTransposesBatches) {
  std::mt19937 rng(1);
  const std::vector<MmCase> cases = {
      {{1, 1}, {1, 1}},
      {{3, 5}, {5, 7}},
      {{64, 64}, {64, 64}},
      {{17, 31}, {31, 13}},
      {{1, 768}, {768, 300}},
      {{5, 0}, {0, 4}},
      {{0, 8}, {8, 3}},
      {{7, 9}, {9, 1}},
      {{130, 257}, {257, 129}},
      {{9, 5}, {7, 9}, true, true},
      {{4, 6}, {5, 6}, false, true},
      {{6, 4}, {6, 5}, true, false},
      {{2, 3, 7, 5}, {5, 4}},
      {{3, 1, 7, 5}, {2, 5, 6}},
      {{2, 9, 8}, {2, 8, 3}},
  };
  for (const MmCase& c : cases) {
    KernelBuilder kb("mm");
    std::vector<Dim> da(c.a.begin(), c.a.end()), db(c.b.begin(), c.b.end());
    Value a = kb.load("a", DType::kF32, da);
    Value b = kb.load("b", DType::kF32, db);
    kb.store("y", kb.matmul(a, b, c.ta, c.tb));
    auto k = kb.build();
    ASSERT_TRUE(k.is_ok()) << k.status().to_string();
    int64_t kdim = c.ta ? c.a[c.a.size() - 2] : c.a.back();
    expect_matches_reference(
        *k, {make_buffer(DType::kF32, c.a, rng), make_buffer(DType::kF32, c.b, rng)}, mm_tol(kdim));
  }
}

TEST(MatMul, StridedAndHalfInputs) {
  std::mt19937 rng(2);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    KernelBuilder kb("mm_typed");
    Dim M = kb.symbol("M");
    Value a = kb.load("a", t, {M, 48});
    Value b = kb.load("b", t, {48, 40});
    kb.store("y", kb.matmul(a, b));
    Kernel k = kb.build().value();
    double rel = t == DType::kF32 ? 1e-4 : (t == DType::kF16 ? 2e-3 : 1e-2);
    for (int64_t m : {1, 3, 33}) {
      expect_matches_reference(k,
                               {make_buffer(t, {m, 48}, rng, /*transposed=*/true, 3),
                                make_buffer(t, {48, 40}, rng, false, 1)},
                               Tolerance{1e-3, rel});
    }
  }
}

// f16 / bf16 linear layers (x @ W^T, W [N, K]) long enough in K for the GEMM to read W's rows
// in place (widened as packed, or bf16 pairs on AVX512-BF16) where AMX does not run them: rows
// below and above a 32-row panel and across several, batch 2 x S rows, and a second K block.
TEST(MatMul, HalfLinearReadsWeightRows) {
  std::mt19937 rng(21);
  for (DType t : {DType::kF16, DType::kBF16}) {
    KernelBuilder kb("half_linear");
    Dim S = kb.symbol("S");
    Value x = kb.load("x", t, {2, S, 600});
    Value w = kb.load("w", t, {70, 600});
    kb.store("y", kb.matmul(x, w, false, true));
    Kernel k = kb.build().value();
    const double rel = t == DType::kF16 ? 2e-3 : 1e-2;
    for (int64_t s : {9, 17, 70}) {
      expect_matches_reference(k,
                               {make_buffer(t, {2, s, 600}, rng), make_buffer(t, {70, 600}, rng)},
                               Tolerance{mm_tol(600).abs * 10, rel});
    }
  }
  // A row-major weight (x @ W, W [K, N]: GPT-2's Conv1D): bf16 pairs of W's rows where the CPU
  // has AVX512-BF16; an odd K takes the widened path.
  for (int64_t kdim : {600, 301}) {
    KernelBuilder kb("half_conv1d");
    Dim S = kb.symbol("S");
    Value x = kb.load("x", DType::kBF16, {S, kdim});
    Value w = kb.load("w", DType::kBF16, {kdim, 70});
    kb.store("y", kb.matmul(x, w));
    Kernel k = kb.build().value();
    for (int64_t s : {5, 12, 140}) {
      expect_matches_reference(
          k,
          {make_buffer(DType::kBF16, {s, kdim}, rng), make_buffer(DType::kBF16, {kdim, 70}, rng)},
          Tolerance{mm_tol(kdim).abs * 10, 1e-2});
    }
  }
}

TEST(MatMul, FusedEpilogues) {
  std::mt19937 rng(3);
  KernelBuilder kb("mlp");
  Dim S = kb.symbol("S");
  Value x = kb.load("x", DType::kF32, {S, 64});
  Value w = kb.load("w", DType::kF32, {64, 96});
  Value bias = kb.load("bias", DType::kF32, {96});
  Value res = kb.load("res", DType::kF32, {S, 96});
  Value h = kb.unary(UnaryOp::kGeluErf, kb.add(kb.matmul(x, w), bias));
  kb.store("y", kb.add(kb.binary(BinaryOp::kMul, h, 0.5), res));
  Kernel k = kb.build().value();
  for (int64_t s : {1, 7, 100}) {
    expect_matches_reference(
        k,
        {make_buffer(DType::kF32, {s, 64}, rng), make_buffer(DType::kF32, {64, 96}, rng),
         make_buffer(DType::kF32, {96}, rng), make_buffer(DType::kF32, {s, 96}, rng)},
        mm_tol(64));
  }
  // One program: the epilogue runs on the matmul's output tile.
  auto ck = CompiledKernel::create(k).value();
  std::vector<Buffer> in = {
      make_buffer(DType::kF32, {10, 64}, rng), make_buffer(DType::kF32, {64, 96}, rng),
      make_buffer(DType::kF32, {96}, rng), make_buffer(DType::kF32, {10, 96}, rng)};
  std::vector<TensorArg> args;
  for (auto& b : in) args.push_back(b.arg);
  Buffer y = make_buffer(DType::kF32, {10, 96}, rng);
  RunStats st;
  ASSERT_TRUE(ck->run(args, {&y.arg, 1}, {}, &st).is_ok());
  EXPECT_EQ(st.programs, 1);
}

// Consumers that read a matmul's output or a row reduction through slices and a concat
// (offset maps onto the matmul tile and the reduced rows), as a concat split would.
TEST(MatMul, SlicedAndConcatenatedConsumers) {
  std::mt19937 rng(4);
  KernelBuilder kb("sliced");
  Dim S = kb.symbol("S");
  Value x = kb.load("x", DType::kF32, {S, 32});
  Value w = kb.load("w", DType::kF32, {32, 10});
  Value m = kb.matmul(x, w);
  Value sm = kb.div(kb.unary(UnaryOp::kExp, m), kb.sum(kb.unary(UnaryOp::kExp, m), {-1}, true));
  Value swapped = kb.concat({kb.slice(m, 1, 5, 10), kb.slice(m, 1, 0, 5)}, 1);
  kb.store("y", kb.mul(swapped, sm));
  kb.store("z", kb.add(kb.slice(sm, 1, 2, 7), kb.slice(m, 1, 0, 5)));
  Kernel k = kb.build().value();
  for (int64_t s : {1, 7, 100}) {
    expect_matches_reference(
        k, {make_buffer(DType::kF32, {s, 32}, rng), make_buffer(DType::kF32, {32, 10}, rng)},
        mm_tol(32));
  }
}

TEST(MatMul, AttentionCore) {
  std::mt19937 rng(4);
  KernelBuilder kb("attention");
  Dim S = kb.symbol("S");
  Value q = kb.load("q", DType::kF32, {2, S, 16});
  Value kk = kb.load("k", DType::kF32, {2, S, 16});
  Value v = kb.load("v", DType::kF32, {2, S, 16});
  Value s = kb.binary(BinaryOp::kMul, kb.matmul(q, kk, false, true), 0.25);
  Value e = kb.unary(UnaryOp::kExp, kb.sub(s, kb.max(s, {-1}, true)));
  Value p = kb.div(e, kb.sum(e, {-1}, true));
  kb.store("o", kb.matmul(p, v));
  Kernel k = kb.build().value();
  for (int64_t n : {1, 5, 40}) {
    expect_matches_reference(
        k,
        {make_buffer(DType::kF32, {2, n, 16}, rng), make_buffer(DType::kF32, {2, n, 16}, rng),
         make_buffer(DType::kF32, {2, n, 16}, rng)},
        Tolerance{1e-4, 1e-3});
  }
}

TEST(MatMul, BadShapesAreErrors) {
  KernelBuilder kb("bad");
  Value a = kb.load("a", DType::kF32, {3, 4});
  Value b = kb.load("b", DType::kF32, {5, 6});
  kb.store("y", kb.matmul(a, b));
  auto k = kb.build();
  ASSERT_FALSE(k.is_ok());
  EXPECT_NE(k.status().message().find("contraction"), std::string::npos) << k.status().to_string();
  KernelBuilder kb2("bad_sym");
  Dim K = kb2.symbol("K"), J = kb2.symbol("J");
  Value a2 = kb2.load("a", DType::kF32, {3, K});
  Value b2 = kb2.load("b", DType::kF32, {J, 6});
  kb2.store("y", kb2.matmul(a2, b2));
  Kernel k2 = kb2.build().value();
  auto ck = CompiledKernel::create(k2).value();
  std::mt19937 rng(5);
  Buffer x = make_buffer(DType::kF32, {3, 4}, rng), w = make_buffer(DType::kF32, {5, 6}, rng);
  TensorArg in[] = {x.arg, w.arg};
  auto shapes = ck->infer_output_shapes(in);
  ASSERT_FALSE(shapes.is_ok());
  EXPECT_NE(shapes.status().message().find("[3, 4] x [5, 6]"), std::string::npos)
      << shapes.status().to_string();
}

}  // namespace
}  // namespace dvm::testing

namespace dvm::testing {
namespace {

// Encodes a [6, 5] x [5, 4] matmul and returns its program.
bc::Program encoded_matmul(std::vector<Buffer>* keep) {
  KernelBuilder kb("mm_verify");
  Value a = kb.load("a", DType::kF32, {6, 5});
  Value b = kb.load("b", DType::kF32, {5, 4});
  kb.store("y", kb.matmul(a, b));
  Kernel k = kb.build().value();
  std::mt19937 rng(9);
  keep->push_back(make_buffer(DType::kF32, {6, 5}, rng));
  keep->push_back(make_buffer(DType::kF32, {5, 4}, rng));
  keep->push_back(make_buffer(DType::kF32, {6, 4}, rng));
  std::vector<TensorArg> in = {(*keep)[0].arg, (*keep)[1].arg}, out = {(*keep)[2].arg};
  return encode_for(k, in, out).programs.at(0);
}

int contraction_axis(const bc::Program& p) {
  for (size_t a = 0; a < p.axes.size(); ++a)
    if (p.axes[a].iter == bc::AxisIter::kContract) return static_cast<int>(a);
  return -1;
}

TEST(MatMulVerifier, AcceptsEncodedAndBoundsTheContraction) {
  std::vector<Buffer> keep;
  bc::Program p = encoded_matmul(&keep);
  std::vector<std::pair<int64_t, int64_t>> spans;
  ASSERT_TRUE(bc::verify(p, &spans).is_ok()) << bc::disassemble(p);
  EXPECT_EQ(spans[0], (std::pair<int64_t, int64_t>{0, 29}));  // all of a [6, 5]
  EXPECT_EQ(spans[1], (std::pair<int64_t, int64_t>{0, 19}));  // all of b [5, 4]
  int k = contraction_axis(p);
  ASSERT_GE(k, 0);
  p.axes[k].extent = 9;  // a longer contraction reaches past both operands
  ASSERT_TRUE(bc::verify(p, &spans).is_ok());
  EXPECT_GT(spans[0].second, 29);
  EXPECT_GT(spans[1].second, 19);
}

TEST(MatMulVerifier, RejectsCorruptedMatMuls) {
  std::vector<Buffer> keep;
  const bc::Program good = encoded_matmul(&keep);
  int k = contraction_axis(good);
  ASSERT_GE(k, 0);
  {
    bc::Program p = good;  // the contraction axis walked by the grid instead
    p.axes[k].iter = bc::AxisIter::kGrid;
    EXPECT_FALSE(bc::verify(p, nullptr).is_ok());
  }
  {
    bc::Program p = good;  // operands of different dtypes
    p.descs[0].dtype = DType::kF16;
    Status s = bc::verify(p, nullptr);
    EXPECT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("matmul"), std::string::npos) << s.to_string();
  }
  {
    bc::Program p = good;  // the contraction axis as a tile axis
    p.axes[k].tile = bc::AxisTile::kRow;
    EXPECT_FALSE(bc::verify(p, nullptr).is_ok());
  }
}

}  // namespace
}  // namespace dvm::testing

namespace dvm::testing {
namespace {

TEST(MatMul, ReductionsOfMatmulOutputs) {
  std::mt19937 rng(10);
  // Row-wise softmax of x @ W shares the matmul's tile (one program) unless the rows are
  // fewer than a quarter of the contraction: then the product has tiles of its own (column
  // tiles, B read once between the threads) and a second program reduces its rows.
  for (int64_t kdim : {32, 256}) {
    KernelBuilder kb("mm_softmax");
    Dim S = kb.symbol("S");
    Value x = kb.load("x", DType::kF32, {S, kdim});
    Value w = kb.load("w", DType::kF32, {kdim, 48});
    Value s = kb.matmul(x, w);
    Value e = kb.unary(UnaryOp::kExp, kb.sub(s, kb.max(s, {-1}, true)));
    kb.store("y", kb.div(e, kb.sum(e, {-1}, true)));
    Kernel k = kb.build().value();
    for (int64_t n : {1, 9, 63, 64, 130}) {
      std::vector<Buffer> in = {make_buffer(DType::kF32, {n, kdim}, rng),
                                make_buffer(DType::kF32, {kdim, 48}, rng)};
      expect_matches_reference(k, in, Tolerance{1e-5, 1e-4});
      for (int threads : {1, 2}) {
        CompileOptions opts;
        opts.num_threads = threads;
        auto ck = CompiledKernel::create(k, opts).value();
        std::vector<TensorArg> args = {in[0].arg, in[1].arg};
        Buffer y = make_buffer(DType::kF32, {n, 48}, rng);
        RunStats st;
        ASSERT_TRUE(ck->run(args, {&y.arg, 1}, {}, &st).is_ok());
        EXPECT_EQ(st.programs, n * 4 < kdim ? 2 : 1) << "K " << kdim << " rows " << n;
      }
    }
  }
  // Layernorm of a residual + x @ W^T: two row reductions in the tile. Rows of 64 to 768 must
  // stay whole even when few rows would leave threads idle (a halved row was a bug).
  for (int64_t width : {64, 96, 768}) {
    KernelBuilder kb("mm_layernorm");
    Dim S = kb.symbol("S");
    Value x = kb.load("x", DType::kF32, {S, width});
    Value w = kb.load("w", DType::kF32, {width, width});
    Value y = kb.add(x, kb.matmul(x, w, false, true));
    Value d = kb.sub(y, kb.mean(y, {1}, true));
    Value var = kb.mean(kb.mul(d, d), {1}, true);
    kb.store("o", kb.mul(d, kb.unary(UnaryOp::kRsqrt, kb.binary(BinaryOp::kAdd, var, 1e-5))));
    Kernel k = kb.build().value();
    for (int64_t n : {1, 5, 33}) {
      std::vector<Buffer> in = {make_buffer(DType::kF32, {n, width}, rng),
                                make_buffer(DType::kF32, {width, width}, rng)};
      expect_matches_reference(k, in, Tolerance{1e-4, 1e-4}, {},
                               "width " + std::to_string(width) + " rows " + std::to_string(n));
    }
  }
  // A column sum of x @ W cannot share the tile: the product is computed once, then reduced.
  {
    KernelBuilder kb("mm_colsum");
    Value x = kb.load("x", DType::kF32, {kb.symbol("S"), 24});
    Value w = kb.load("w", DType::kF32, {24, 40});
    Value s = kb.matmul(x, w);
    kb.store("c", kb.sum(kb.unary(UnaryOp::kTanh, s), {0}));
    kb.store("y", kb.unary(UnaryOp::kRelu, s));
    Kernel k = kb.build().value();
    for (int64_t n : {1, 37}) {
      std::vector<Buffer> in = {make_buffer(DType::kF32, {n, 24}, rng),
                                make_buffer(DType::kF32, {24, 40}, rng)};
      expect_matches_reference(k, in, Tolerance{1e-4, 1e-4});
    }
  }
}

// A row reduction whose kept dim is broadcast over a product's columns reduces an axis of its
// own, which a matmul stage cannot walk: it runs apart from the product. It shared the tile
// once (found by fuzz_kernel): the grid walked its columns block by block, each block storing
// the output with its partial argmin, so the result was whichever block wrote last.
TEST(MatMul, RowReductionBroadcastOverProductIsNotItsTile) {
  std::mt19937 rng(12);
  for (bool arg : {true, false}) {
    KernelBuilder kb("mm_bcast_reduce");
    Dim S = kb.symbol("S");
    Value x = kb.load("x", DType::kF32, {S, 38});
    Value m = kb.load("m", DType::kF32, {S, 38});
    Value r = arg ? kb.cast(kb.reduce(ReduceOp::kArgMin, m, {1}, true), DType::kF32)
                  : kb.max(m, {1}, true);
    kb.store("y", kb.add(kb.matmul(m, kb.permute(x, {1, 0})), r));
    Kernel k = kb.build().value();
    for (int64_t n : {1, 3, 40}) {
      std::vector<Buffer> in = {make_buffer(DType::kF32, {n, 38}, rng),
                                make_buffer(DType::kF32, {n, 38}, rng)};
      expect_matches_reference(k, in, Tolerance{1e-4, 1e-4}, {},
                               std::string(arg ? "argmin" : "max") + " rows " + std::to_string(n));
      std::vector<TensorArg> args = {in[0].arg, in[1].arg};
      std::vector<Buffer> outs;
      for (int threads : {1, 2}) {
        CompileOptions opts;
        opts.num_threads = threads;
        auto ck = CompiledKernel::create(k, opts).value();
        outs.push_back(make_buffer(DType::kF32, {n, n}, rng));
        ASSERT_TRUE(ck->run(args, {&outs.back().arg, 1}).is_ok());
      }
      EXPECT_EQ(outs[0].bytes, outs[1].bytes) << "rows " << n;
    }
  }
}

// A product whose columns are an extent-1 dim broadcast over the tile (x @ w with w [K, 1],
// added to [S, H] and summed over H) is computed apart: taken as the tile's N, an empty H
// made an empty grid and the sum's output was never written (found by fuzz_kernel's
// exact-output check).
TEST(MatMul, ProductBroadcastOverTheTileIsComputedApart) {
  std::mt19937 rng(13);
  KernelBuilder kb("mm_bcast_cols");
  Dim S = kb.symbol("S"), H = kb.symbol("H");
  Value a = kb.load("a", DType::kF32, {S, 8});
  Value w = kb.load("w", DType::kF32, {8, 1});
  Value x = kb.load("x", DType::kF32, {S, H});
  Value p = kb.broadcast(kb.matmul(a, w), {S, H});
  kb.store("y", kb.sum(kb.add(p, x), {1}));
  kb.store("z", kb.sum(kb.mul(p, x), {1}, true));
  Kernel k = kb.build().value();
  for (int64_t h : {0, 1, 5, 40}) {
    for (int64_t n : {1, 6}) {
      std::vector<Buffer> in = {make_buffer(DType::kF32, {n, 8}, rng),
                                make_buffer(DType::kF32, {8, 1}, rng),
                                make_buffer(DType::kF32, {n, h}, rng)};
      expect_matches_reference(k, in, Tolerance{1e-4, 1e-4}, {},
                               "H " + std::to_string(h) + " S " + std::to_string(n));
    }
  }
}

// Weights marked constant (TensorArg::version) are packed once into the weight cache and
// shared by every tile and call; results must not change, whatever the shape, layout or dtype.
TEST(MatMulWeightCache, ConstantWeightsMatchReference) {
  clear_weight_cache();
  std::mt19937 rng(11);
  struct Case {
    DType t;
    std::vector<int64_t> a, b;
    bool tb;
    bool strided_b;
  };
  const std::vector<Case> cases = {
      {DType::kF32, {130, 257}, {257, 129}, false, false},
      {DType::kF32, {64, 768}, {300, 768}, true, false},  // a linear layer's x @ W^T
      {DType::kF32, {3, 64}, {96, 64}, true, false},      // skinny: W read in place
      {DType::kF32, {7, 40}, {40, 33}, false, true},
      {DType::kF32, {2, 9, 48}, {2, 48, 70}, false, false},  // a constant per batch
      {DType::kF32, {3, 1, 7, 5}, {2, 5, 6}, false, false},
      {DType::kF16, {33, 48}, {48, 40}, false, false},
      {DType::kBF16, {5, 64}, {80, 64}, true, false},
  };
  uint64_t version = 1;
  for (const Case& c : cases) {
    KernelBuilder kb("mm_const");
    std::vector<Dim> da(c.a.begin(), c.a.end()), db(c.b.begin(), c.b.end());
    Value a = kb.load("a", c.t, da);
    Value b = kb.load("w", c.t, db);
    kb.store("y", kb.matmul(a, b, false, c.tb));
    Kernel k = kb.build().value();
    Buffer w = make_buffer(c.t, c.b, rng, c.strided_b, c.strided_b ? 5 : 0);
    // Outside the Buffer: the copies expect_matches_reference makes keep this address.
    std::vector<char> weight = w.bytes;
    w.arg.data = weight.data();
    w.arg.version = version++;
    const int64_t kdim = c.a.back();
    const double rel = c.t == DType::kF32 ? 1e-4 : (c.t == DType::kF16 ? 2e-3 : 1e-2);
    for (int call = 0; call < 2; ++call) {  // the second call finds the packed weight
      expect_matches_reference(k, {make_buffer(c.t, c.a, rng), w},
                               Tolerance{mm_tol(kdim).abs * 10, rel}, {},
                               "case " + std::to_string(version - 1));
    }
  }
  // One pack per weight matrix: per batch index for the two batched weights, none for the
  // skinny cases (f32 B^T with at most 16 rows of A: W read in place, the 3 x 64 linear and
  // the 7-row product with a transposed B), nor for the 64-row linear where the GEMM reads an
  // f32 W^T in place (AVX-512), nor for the 5-row bf16 linear (W^T read in place, on AMX tiles
  // or by the skinny path); the second calls hit.
  WeightCacheStats st = weight_cache_stats();
  EXPECT_EQ(st.packs, 7 - (vm::cpu::gemm_f32_reads_b_in_place(64, 768, 1, 768) ? 1 : 0));
  EXPECT_GE(st.hits, st.packs);
  EXPECT_GT(st.bytes, 0);
}

// One packed copy per weight and version, whatever the row count (tilings split N differently
// for few rows); a new version packs again; capacity 0 disables the cache.
TEST(MatMulWeightCache, OnePackPerVersionAndCapacity) {
  clear_weight_cache();
  set_weight_cache_capacity(size_t{1} << 30);
  std::mt19937 rng(12);
  KernelBuilder kb("linear");
  Dim S = kb.symbol("S");
  Value x = kb.load("x", DType::kF32, {S, 256});
  // A row-major weight [K, N]: f32 W^T is read in place where the GEMM can (no packing).
  Value w = kb.load("w", DType::kF32, {256, 512});
  kb.store("y", kb.matmul(x, w));
  Kernel k = kb.build().value();
  // The weight lives outside the Buffer, so that the copies expect_matches_reference makes keep
  // pointing at it (one address, as a model's weight).
  Buffer wb = make_buffer(DType::kF32, {256, 512}, rng);
  std::vector<char> weight = wb.bytes;
  wb.arg.data = weight.data();
  wb.arg.version = 42;
  for (int64_t rows : {8, 16, 64, 200, 33}) {
    expect_matches_reference(k, {make_buffer(DType::kF32, {rows, 256}, rng), wb}, mm_tol(256));
  }
  WeightCacheStats st = weight_cache_stats();
  EXPECT_EQ(st.packs, 1);
  EXPECT_EQ(st.entries, 1);
  EXPECT_GE(st.hits, 4);
  // New contents under a new version: packed again, results follow the new contents.
  const Buffer fresh = make_buffer(DType::kF32, {256, 512}, rng);
  std::copy(fresh.bytes.begin(), fresh.bytes.end(), weight.begin());  // same memory
  wb.arg.version = 43;
  expect_matches_reference(k, {make_buffer(DType::kF32, {40, 256}, rng), wb}, mm_tol(256));
  EXPECT_EQ(weight_cache_stats().packs, 2);
  EXPECT_EQ(weight_cache_stats().replaced, 1);  // version 42's panels went at once
  EXPECT_EQ(weight_cache_stats().entries, 1);
  // A capacity below one packed weight evicts everything and caches nothing more.
  set_weight_cache_capacity(1024);
  EXPECT_EQ(weight_cache_stats().entries, 0);
  EXPECT_EQ(weight_cache_stats().evictions, 1);
  wb.arg.version = 44;
  expect_matches_reference(k, {make_buffer(DType::kF32, {40, 256}, rng), wb}, mm_tol(256));
  EXPECT_EQ(weight_cache_stats().entries, 0);
  set_weight_cache_capacity(size_t{1} << 30);
  clear_weight_cache();
}

// A model whose weights exceed the capacity, called over and over (each call uses every
// weight once, in the same order): plain LRU would evict every weight just before its next use
// and repack all of them on every call. The cache keeps a stable subset instead: after the
// first two calls nothing is packed any more, the subset hits, the rest is declined and still
// computes the right result.
TEST(MatMulWeightCache, WorkingSetLargerThanCapacityDoesNotThrash) {
  clear_weight_cache();
  KernelBuilder kb("linear");
  Dim S = kb.symbol("S");
  Value x = kb.load("x", DType::kF32, {S, 64});
  Value w = kb.load("w", DType::kF32, {64, 96});  // [K, N]: packed (W^T may be read in place)
  kb.store("y", kb.matmul(x, w));
  auto ck = CompiledKernel::create(kb.build().value()).value();
  constexpr int kWeights = 7, kCalls = 8, kRows = 32;  // > 16 rows: packed, not read in place
  std::vector<std::vector<float>> weights;
  for (int i = 0; i < kWeights; ++i) weights.emplace_back(96 * 64, static_cast<float>(i + 1));
  // Room for three of the seven packed weights (a packed weight is at least 96 x 64 floats).
  set_weight_cache_capacity(96 * 64 * sizeof(float) * 7 / 2);
  std::vector<float> xv(kRows * 64, 1.0f), yv(kRows * 96);
  int64_t packs_after_two = 0;
  for (int call = 0; call < kCalls; ++call) {
    if (call == 2) packs_after_two = weight_cache_stats().packs;
    for (int i = 0; i < kWeights; ++i) {
      TensorArg wa = TensorArg::contiguous(weights[i].data(), DType::kF32, {64, 96});
      wa.version = 1;
      const TensorArg in[] = {TensorArg::contiguous(xv.data(), DType::kF32, {kRows, 64}), wa};
      const TensorArg out[] = {TensorArg::contiguous(yv.data(), DType::kF32, {kRows, 96})};
      ASSERT_TRUE(ck->run(in, out).is_ok());
      for (float y : yv) ASSERT_EQ(y, 64.0f * static_cast<float>(i + 1)) << "weight " << i;
    }
  }
  WeightCacheStats st = weight_cache_stats();
  EXPECT_EQ(st.packs, packs_after_two) << "packs kept going after the second call: thrashing";
  EXPECT_GT(st.entries, 0);
  EXPECT_LE(st.bytes, st.capacity);
  EXPECT_GE(st.hits, (kCalls - 2) * st.entries);  // the cached subset is used on every call
  EXPECT_GT(st.declined, 0);
  set_weight_cache_capacity(size_t{1} << 30);
  clear_weight_cache();
}

// Several threads multiply by constant weights at once while a tiny capacity evicts entries
// that other threads are using (a packed weight lives while a runner holds it) and weights
// get new versions: every result must still match the weight's contents at that call.
TEST(MatMulWeightCache, ConcurrentCallsWithEvictionsAndNewVersions) {
  clear_weight_cache();
  KernelBuilder kb("linear");
  Dim S = kb.symbol("S");
  Value x = kb.load("x", DType::kF32, {S, 64});
  Value w = kb.load("w", DType::kF32, {64, 96});  // [K, N]: packed (W^T may be read in place)
  kb.store("y", kb.matmul(x, w));
  auto ck = CompiledKernel::create(kb.build().value()).value();
  // Room for about one packed weight: the threads' weights keep evicting each other.
  set_weight_cache_capacity(96 * 64 * sizeof(float) * 3 / 2);
  constexpr int kThreads = 4, kCalls = 12, kRows = 24;
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> wv(96 * 64), xv(kRows * 64, 1.0f), yv(kRows * 96);
      for (int call = 0; call < kCalls; ++call) {
        // Thread t's weight at this call: all elements t + call % 3 (a new version when it
        // changes, the same memory).
        const float value = static_cast<float>(t + call % 3);
        std::fill(wv.begin(), wv.end(), value);
        TensorArg wa = TensorArg::contiguous(wv.data(), DType::kF32, {64, 96});
        wa.version = static_cast<uint64_t>(t) * 16 + call % 3 + 1;
        const TensorArg in[] = {TensorArg::contiguous(xv.data(), DType::kF32, {kRows, 64}), wa};
        const TensorArg out[] = {TensorArg::contiguous(yv.data(), DType::kF32, {kRows, 96})};
        if (!ck->run(in, out).is_ok()) ++failures[t];
        for (float y : yv) failures[t] += y != 64.0f * value;
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  EXPECT_GT(weight_cache_stats().evictions + weight_cache_stats().replaced, 0);
  set_weight_cache_capacity(size_t{1} << 30);
  clear_weight_cache();
}

// A linear layer at decode-sized and slightly larger row counts gives the same bits at any
// thread count: whether W is read in place (up to 16 rows) is decided by the product's rows,
// not by the tiles a thread count splits them into.
// y = x @ w^T with x [S, k_dim] (S symbolic) and w [n, k_dim]: nn.Linear without bias.
Kernel linear_kernel(const char* name, int64_t n, int64_t k_dim) {
  KernelBuilder kb(name);
  Value x = kb.load("x", DType::kF32, {kb.symbol("S"), k_dim});
  Value w = kb.load("w", DType::kF32, {n, k_dim});
  kb.store("y", kb.matmul(x, w, false, true));
  return kb.build().value();
}

// The output bytes of `k` on `in` compiled for 1, 2 and 3 threads; `disassembly` (if given)
// receives each compilation's program text.
std::vector<std::vector<char>> run_on_1_2_3_threads(
    const Kernel& k, std::vector<TensorArg> in, const std::vector<int64_t>& out_shape,
    std::mt19937& rng, std::vector<std::string>* disassembly = nullptr) {
  std::vector<std::vector<char>> results;
  for (int threads : {1, 2, 3}) {
    CompileOptions o;
    o.num_threads = threads;
    auto ck = CompiledKernel::create(k, o).value();
    Buffer y = make_buffer(DType::kF32, out_shape, rng);
    const TensorArg out[] = {y.arg};
    EXPECT_TRUE(ck->run(in, out).is_ok());
    results.push_back(y.bytes);
    if (disassembly != nullptr) disassembly->push_back(ck->disassemble(in, out).value());
  }
  return results;
}

// y = x @ w^T (w [n, k_dim]) for each row count of x: against the reference, and bitwise equal
// on 1, 2 and 3 threads.
void expect_linear_bitwise_across_threads(int64_t n, int64_t k_dim,
                                          std::initializer_list<int64_t> row_counts, int seed) {
  Kernel k = linear_kernel("linear", n, k_dim);
  std::mt19937 rng(seed);
  Buffer wb = make_buffer(DType::kF32, {n, k_dim}, rng);
  for (int64_t s : row_counts) {
    Buffer xb = make_buffer(DType::kF32, {s, k_dim}, rng);
    expect_matches_reference(k, {xb, wb}, Tolerance{mm_tol(k_dim).abs, 1e-4}, {},
                             "S=" + std::to_string(s));
    const auto results = run_on_1_2_3_threads(k, {xb.arg, wb.arg}, {s, n}, rng);
    EXPECT_EQ(results[0], results[1]) << "S=" << s;
    EXPECT_EQ(results[0], results[2]) << "S=" << s;
  }
}

TEST(MatMul, SkinnyLinearIsBitwiseIdenticalAcrossThreadCounts) {
  expect_linear_bitwise_across_threads(96, 64, {1, 5, 16, 17, 32, 40}, 13);
}

// A linear layer over a K long enough for the role-swapped in-place GEMM (AVX-512): row counts
// around its 16-row granularity and its limit on the product's rows (288; past it, W^T is
// packed), each against the reference and bitwise equal on 1, 2 and 3 threads (the path is
// chosen by the product's rows, never a tile's; over K = 600 the two paths' K blocks, and so
// their bits, differ).
TEST(MatMul, LinearReadingWInPlaceIsBitwiseIdenticalAcrossThreadCounts) {
  expect_linear_bitwise_across_threads(200, 600, {17, 33, 100, 288, 289, 300}, 14);
}

// Column blocks are dealt evenly: a product whose preferred tiles give a block count the
// threads do not divide (N = 2304: 5 blocks of 480) is split into a multiple of the threads
// (6 of 384), with every bit as on one thread.
TEST(MatMul, ColumnBlocksDivideAmongThreads) {
  Kernel k = linear_kernel("qkv", 2304, 32);
  std::mt19937 rng(14);
  Buffer wb = make_buffer(DType::kF32, {2304, 32}, rng);
  Buffer xb = make_buffer(DType::kF32, {200, 32}, rng);
  std::vector<std::string> programs;
  const auto results = run_on_1_2_3_threads(k, {xb.arg, wb.arg}, {200, 2304}, rng, &programs);
  for (int threads : {2, 3}) {
    const std::string& dis = programs[static_cast<size_t>(threads - 1)];
    const size_t at = dis.find(" grid ");
    ASSERT_NE(at, std::string::npos) << dis;
    EXPECT_EQ(std::stoll(dis.substr(at + 6)) % threads, 0) << threads << " threads:\n" << dis;
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

}  // namespace
}  // namespace dvm::testing
