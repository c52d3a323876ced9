// AMX-BF16 row kernel of gemv_bf16 (cpu/bf16_linear.h): TDPBF16PS multiplies a 16-row × 32-column
// tile of W (A, loaded in place from W's rows: W is row-major [N, K], which is the A layout) by the
// tile of 16 tokens × the same 32 columns of x packed in pairs (B, GemvArgs::xp: packed once per
// call by pack_amx_activations), into a 16 × 16 fp32 tile: rows × tokens. Each output accumulates
// its 32-column steps in increasing order, and each element of the product tile depends only on its
// row of A and its column of B — so a token's outputs are the same bits whatever the other tokens
// of the call, for 1 to 16 tokens alike (beyond 16, one pass per group of 16 tokens).
//
// The tile unit does 16 × 16 × 32 multiply-adds per instruction, so 8 tokens cost what 1 does and
// the kernel streams W at memory speed where the AVX-512 kernel (vdpbf16ps) is compute-bound from
// about 5 tokens. Edges: a row group of fewer than 16 rows or a last step of fewer than 32 columns
// is copied into a zero-padded tile first (never read past a row or the matrix).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/amx.h"
#include "cpu/bf16_linear.h"
#include "storage/bf16.h"

namespace strata::cpu::detail {

namespace {

struct Scratch {
  alignas(64) uint16_t a[16 * 32];  // a zero-padded A tile (edges)
  alignas(64) float c[16 * 16];     // the product tile
};
thread_local Scratch tl_scratch;

}  // namespace

void pack_amx_activations(const uint16_t* xb, int64_t ldx, int64_t T, int64_t K,
                          std::vector<uint16_t>& out) {
  const int64_t ks = (K + 31) / 32, groups = (T + 15) / 16;
  out.assign(size_t(groups * ks * 512), 0);
  // B tile of token group g, step s: row p (column pair 2p, 2p + 1 of the step), entries
  // (token j, pair element e) at 2j + e.
  for (int64_t t = 0; t < T; ++t) {
    const int64_t g = t / 16, j = t % 16;
    const uint16_t* x = xb + t * ldx;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t s = k / 32, p = (k % 32) / 2, e = k % 2;
      out[size_t(((g * ks + s) * 16 + p) * 32 + 2 * j + e)] = x[k];
    }
  }
}

void gemv_rows_amx(const GemvArgs& a, int64_t r0, int64_t r1) {
  TileConfig cfg;
  cfg.palette = 1;
  cfg.rows[0] = 16, cfg.colsb[0] = 64;  // A: 16 rows × 32 bf16
  cfg.rows[1] = 16, cfg.colsb[1] = 64;  // B: 16 column pairs × 16 tokens × 2 bf16
  cfg.rows[2] = 16, cfg.colsb[2] = 64;  // C: 16 rows × 16 tokens fp32
  _tile_loadconfig(&cfg);
  Scratch& sc = tl_scratch;
  const int64_t ks = (a.K + 31) / 32, full_steps = a.K / 32, groups = (a.T + 15) / 16;
  for (int64_t g = 0; g < groups; ++g) {
    const uint16_t* B = a.xp + size_t(g * ks * 512);
    const int64_t t0 = g * 16, nt = std::min<int64_t>(16, a.T - t0);
    for (int64_t r = r0; r < r1; r += 16) {
      const int64_t rows = std::min<int64_t>(16, r1 - r);
      const uint16_t* W = a.W + r * a.ldw;
      // The next row group's weights, [next, pf_end), prefetched during this one (below).
      const uint16_t* next = r + 16 < r1 ? W + 16 * a.ldw : nullptr;
      const uint16_t* pf_end =
          next ? next + std::min<int64_t>(16, r1 - r - 16) * a.ldw - (a.ldw - a.K) : nullptr;
      // GCC's tile intrinsics declare no memory operands: the compiler barriers keep the stores
      // to the scratch tile before its load and the product tile's store before the reads below.
      _tile_zero(2);
      for (int64_t s = 0; s < ks; ++s) {
        if (rows == 16 && s < full_steps) {
          _tile_loadd(0, W + s * 32, a.ldw * 2);
        } else {
          const int64_t cols = std::min<int64_t>(32, a.K - s * 32);
          std::memset(sc.a, 0, sizeof sc.a);
          for (int64_t i = 0; i < rows; ++i)
            std::memcpy(sc.a + i * 32, W + i * a.ldw + s * 32, size_t(cols) * 2);
          __asm__ volatile("" ::: "memory");
          _tile_loadd(0, sc.a, 64);
        }
        _tile_loadd(1, B + s * 512, 64);
        _tile_dpbf16ps(2, 0, 1);
        // The next 16 rows (contiguous when ldw = K) into L2, 16 lines per step: the tile loads
        // touch 16 rows a line at a time, which the hardware streams do not follow far enough
        // ahead (k3-mini, K = 1024: 2 KiB rows; every tile load waited for memory).
        if (next < pf_end)
          for (int i = 0; i < 16 && next < pf_end; ++i, next += 32)
            _mm_prefetch(reinterpret_cast<const char*>(next), _MM_HINT_T1);
      }
      _tile_stored(2, sc.c, 64);
      __asm__ volatile("" ::: "memory");
      for (int64_t j = 0; j < nt; ++j) {
        float* y = a.y + (t0 + j) * a.ldy + r;
        for (int64_t i = 0; i < rows; ++i) {
          const float v = sc.c[i * 16 + j];
          y[i] = a.round_out ? round_bf16(v) : v;
        }
      }
    }
  }
  _tile_release();
}

}  // namespace strata::cpu::detail
