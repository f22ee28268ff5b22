// bf16 GEMM on Intel AMX tiles (Sapphire Rapids and later): C (+)= A B with bf16 A and B, f32
// products summed in f32, f32 C, the same contract as gemm_half (gemm.h), which calls it when
// amx_bf16_enabled(). One TDPBF16PS multiplies a 16 x 32 bf16 tile by a 32 x 16 one (pairs of
// K interleaved, "VNNI" layout) into a 16 x 16 f32 accumulator tile: 16K flops an instruction,
// eight times an AVX-512 FMA's, which is what eager PyTorch reaches through oneDNN on such CPUs.
//
// Layouts: the operand whose rows are K-contiguous is read as "row tiles" (16 rows x 32 K),
// the other as VNNI tiles (16 K pairs x 16 columns x 2). nn.Linear's W [N, K] (B with b_rs = 1)
// is read in place as row tiles and x is packed as VNNI tiles (C is computed transposed, 16 x 16
// blocks transposed back on store); any other B is packed as VNNI tiles per 32 columns and A as
// row tiles. Either way every C element sums its K products in the same order (32-element
// blocks in order, pairs in order), so the choice, the tiling and the thread count never change
// a bit.
#pragma once

#include <cstdint>

namespace dvm::vm::cpu {

// The CPU has AMX-BF16, the kernel grants this process the tile state, and DVM_AMX is not 0.
// Decided once per process.
bool amx_bf16_enabled();

// C[i, j] (+)= sum_p A[i, p] * B[p, j], bf16 bits, strides as gemm_f32. Only when enabled.
void gemm_bf16_amx(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs,
                   const uint16_t* b, int64_t b_rs, int64_t b_cs, float* c, int64_t ldc,
                   bool accumulate);

}  // namespace dvm::vm::cpu
