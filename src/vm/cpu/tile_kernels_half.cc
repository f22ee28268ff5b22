// Tile kernels (see tile_kernels.h), compiled once per Highway target: chain members that read
// or write f16/bf16 memory themselves (HalfMapF32), so that a converting load or store makes no
// pass of its own over an f32 strip.
#include "vm/cpu/kernel_targets.h"  // first: before any Highway header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "vm/cpu/tile_kernels_half.cc"
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
// clang-format on

#include "vm/cpu/tile_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace dvm::vm::cpu {
namespace HWY_NAMESPACE {

// Storage of a half map's a or d: f32, f16 or bf16 lanes of one f32 vector.
enum Storage { kStoreF32 = 0, kStoreF16 = 1, kStoreBF16 = 2 };

// f16 <-> f32 by F16C where the target has it (Highway's AVX2 and AVX-512 targets); Highway
// 1.0's software f32 -> f16 truncates, so elsewhere stores convert by the scalar spec.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
constexpr bool kVectorF16 = true;
#else
constexpr bool kVectorF16 = false;
#endif

template <int kS>
HWY_INLINE VF LoadAs(DF d, const void* p, int64_t i) {
  if constexpr (kS == kStoreF32) {
    return hn::LoadU(d, static_cast<const float*>(p) + i);
  } else if constexpr (kS == kStoreBF16) {
    const hn::Rebind<uint16_t, DF> du16;
    const hn::RebindToUnsigned<DF> du;
    const auto u = hn::PromoteTo(du, hn::LoadU(du16, static_cast<const uint16_t*>(p) + i));
    return hn::BitCast(d, hn::ShiftLeft<16>(u));
  } else {
    const hn::Rebind<hwy::float16_t, DF> df16;
    return hn::PromoteTo(d, hn::LoadU(df16, static_cast<const hwy::float16_t*>(p) + i));
  }
}

// The last m < lanes elements, the other lanes zero (through a padded buffer: 16-bit masked
// loads need AVX-512BW).
template <int kS>
HWY_INLINE VF LoadAsTail(DF d, const void* p, int64_t i, int64_t m) {
  if constexpr (kS == kStoreF32) {
    return LoadTail(d, static_cast<const float*>(p) + i, m);
  } else {
    HWY_ALIGN uint16_t buf[kMaxLanes] = {};
    std::memcpy(buf, static_cast<const uint16_t*>(p) + i, static_cast<size_t>(m) * 2);
    return LoadAs<kS>(d, buf, 0);
  }
}

template <int kS>
HWY_INLINE void StoreAs(DF d, VF v, void* p, int64_t i) {
  if constexpr (kS == kStoreF32) {
    hn::StoreU(v, d, static_cast<float*>(p) + i);
  } else if constexpr (kS == kStoreBF16) {
    const hn::Rebind<uint16_t, DF> du16;
    hn::StoreU(BF16Bits(d, v), du16, static_cast<uint16_t*>(p) + i);
  } else if constexpr (kVectorF16) {
    const hn::Rebind<hwy::float16_t, DF> df16;
    hn::StoreU(hn::DemoteTo(df16, v), df16, static_cast<hwy::float16_t*>(p) + i);
  } else {
    HWY_ALIGN float lanes[kMaxLanes];
    hn::Store(v, d, lanes);
    auto* h = static_cast<uint16_t*>(p) + i;
    for (size_t k = 0; k < hn::Lanes(d); ++k) h[k] = f32_to_f16_bits(lanes[k]);
  }
}

template <int kS>
HWY_INLINE void StoreAsTail(DF d, VF v, void* p, int64_t i, int64_t m) {
  if constexpr (kS == kStoreF32) {
    StoreTail(v, d, static_cast<float*>(p) + i, m);
  } else {
    HWY_ALIGN uint16_t buf[kMaxLanes];
    StoreAs<kS>(d, v, buf, 0);
    std::memcpy(static_cast<uint16_t*>(p) + i, buf, static_cast<size_t>(m) * 2);
  }
}

constexpr int64_t StorageBytes(int kS) {
  return kS == kStoreF32 ? 4 : 2;
}

// dst = f(a, b, c) over a block of rows: a contiguous in storage kA, dst in storage kD, b and
// c f32, contiguous (kB, kC) or broadcast per row. Row strides in elements.
template <int kA, int kD, bool kB, bool kC, class F>
HWY_INLINE void HalfGrid(DF d, const Rows& rs, void* dst, const void* a, const float* b,
                         const float* c, int64_t n, F f) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = 0; r < rs.rows; ++r) {
    void* dr = static_cast<char*>(dst) + r * rs.d * StorageBytes(kD);
    const void* ar = static_cast<const char*>(a) + r * rs.a * StorageBytes(kA);
    const float *br = b + r * rs.b, *cr = c + r * rs.c;
    const VF vb = kB ? hn::Zero(d) : hn::Set(d, br[0]);
    const VF vc = kC ? hn::Zero(d) : hn::Set(d, cr[0]);
    int64_t i = 0;
    for (; i + N <= n; i += N) {
      const VF x =
          f(LoadAs<kA>(d, ar, i), kB ? hn::LoadU(d, br + i) : vb, kC ? hn::LoadU(d, cr + i) : vc);
      StoreAs<kD>(d, x, dr, i);
    }
    if (i < n) {
      const int64_t m = n - i;
      const VF x = f(LoadAsTail<kA>(d, ar, i, m), kB ? LoadTail(d, br + i, m) : vb,
                     kC ? LoadTail(d, cr + i, m) : vc);
      StoreAsTail<kD>(d, x, dr, i, m);
    }
  }
}

// The storages as template arguments, then the increments of b and c.
template <int kA, int kD, class F>
HWY_INLINE void HalfRows(DF d, const HalfMapArgs& m, int sources, F f) {
  const bool fb = sources >= 2 && m.binc != 0, fc = sources >= 3 && m.cinc != 0;
  const float* b = sources >= 2 ? m.b : nullptr;
  const float* c = sources >= 3 ? m.c : nullptr;
  // Unused sources are never read: point them at a harmless broadcast.
  static const float kZero = 0.0f;
  if (b == nullptr) b = &kZero;
  if (c == nullptr) c = &kZero;
  Rows rs = m.rows;
  if (sources < 2) rs.b = 0;
  if (sources < 3) rs.c = 0;
  if (fb && fc) return HalfGrid<kA, kD, true, true>(d, rs, m.dst, m.a, b, c, m.n, f);
  if (fb) return HalfGrid<kA, kD, true, false>(d, rs, m.dst, m.a, b, c, m.n, f);
  if (fc) return HalfGrid<kA, kD, false, true>(d, rs, m.dst, m.a, b, c, m.n, f);
  HalfGrid<kA, kD, false, false>(d, rs, m.dst, m.a, b, c, m.n, f);
}

template <int kA, int kD>
HWY_INLINE bool HalfOp(DF d, const HalfMapArgs& m) {
  if (m.kind == 0) {
    return WithActivation(d, static_cast<UnaryOp>(m.op), [&](auto g) {
      HalfRows<kA, kD>(d, m, 1, [g](VF x, VF, VF) DVM_INL { return g(x); });
    });
  }
  if (m.kind == 1) {
    return WithAddSubMul(static_cast<BinaryOp>(m.op), [&](auto g) {
      HalfRows<kA, kD>(d, m, 2, [g](VF x, VF y, VF) DVM_INL { return g(x, y); });
    });
  }
  if (m.kind == 2) {
    HalfRows<kA, kD>(d, m, 3, [](VF x, VF y, VF z) { return hn::MulAdd(x, y, z); });
    return true;
  }
  return false;
}

int StorageOf(DType t) {
  return t == DType::kF16 ? kStoreF16 : t == DType::kBF16 ? kStoreBF16 : kStoreF32;
}

bool HalfMapF32(const HalfMapArgs& m) {
  const int sa = StorageOf(m.a_type), sd = StorageOf(m.d_type);
  if ((sa == kStoreF32 && m.a_type != DType::kF32) ||
      (sd == kStoreF32 && m.d_type != DType::kF32) || (m.binc != 0 && m.binc != 1) ||
      (m.cinc != 0 && m.cinc != 1))
    return false;
  if (m.rows.outer > 1) {
    HalfMapArgs one = m;
    one.rows.outer = 1;
    for (int64_t k = 0; k < m.rows.outer; ++k) {
      one.dst = static_cast<char*>(m.dst) + k * m.rows.od * StorageBytes(sd);
      one.a = static_cast<const char*>(m.a) + k * m.rows.oa * StorageBytes(sa);
      one.b = m.b + k * m.rows.ob;
      one.c = m.c + k * m.rows.oc;
      if (!HalfMapF32(one)) return false;
    }
    return true;
  }
  if (m.n <= 0 || m.rows.rows <= 0) return true;
  const DF d;
  // Half on one side or both (the same half type): the forms chains produce.
  switch (sa * 3 + sd) {
    case kStoreF16 * 3 + kStoreF32:
      return HalfOp<kStoreF16, kStoreF32>(d, m);
    case kStoreBF16 * 3 + kStoreF32:
      return HalfOp<kStoreBF16, kStoreF32>(d, m);
    case kStoreF32 * 3 + kStoreF16:
      return HalfOp<kStoreF32, kStoreF16>(d, m);
    case kStoreF32 * 3 + kStoreBF16:
      return HalfOp<kStoreF32, kStoreBF16>(d, m);
    case kStoreF16 * 3 + kStoreF16:
      return HalfOp<kStoreF16, kStoreF16>(d, m);
    case kStoreBF16 * 3 + kStoreBF16:
      return HalfOp<kStoreBF16, kStoreBF16>(d, m);
    default:
      return false;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace dvm::vm::cpu
HWY_AFTER_NAMESPACE();
