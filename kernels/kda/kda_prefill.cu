// KDA chunked prefill (spec §4.5, WY/UT form; see kda.h). Two kernels per pass over a window of
// chunks, then (fp32 path) the gated output norm, and the conv-state update:
//   chunk_prep (grid: chunk × head × sequence) — short conv + SiLU, L2 norm, gate, β; cumulative
//     log decay G; L and A_qk (exp of G differences, never of G alone, so both gate forms stay in
//     range); W = M(Γ⊙K), U = MV by forward substitution of (I + L); Γ⊙Q, exp(G_C − G)⊙K, exp(G_C).
//   chunk_scan (grid: V-slice × head × sequence) — walks the chunks in order with the fp32 state
//     slice in shared memory: Ṽ = U − W S, O = (Γ⊙Q) S + A_qk Ṽ, S ← diag(e^{G_C}) S + K̃ᵀ Ṽ.
// Two implementations of the same workspace contract:
//   tensor cores (default): chunk_prep_tc (L and A_qk as 3xTF32 GEMMs over decays factored through
//     the chunk's middle row; bounded gate only, chunk_prep otherwise) and chunk_scan_tc (one block
//     per head, the whole fp32 state in mma accumulators, tf32 products, gated norm fused);
//   fp32 CUDA cores (STRATA_KDA_PREFILL=fp32): chunk_prep, chunk_scan, gated_norm.
// docs/performance.md has the numbers.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/kda/kda_common.cuh"
#include "kernels/mla/mma.cuh"  // cp.async helpers

namespace strata::kernels::kda {
namespace {

using namespace detail;

constexpr int C = kChunk;  // 32
constexpr int D = kD;      // 128
constexpr int kThreads = 256;
constexpr int SP = D + 1;                                // padded row stride (prep)
constexpr int64_t kChunkFloats = 4 * C * D + C * C + D;  // W, U, Qg, Kt, A, gC
constexpr int VS = 32;                                   // state columns (v) per scan block
constexpr int kSlices = D / VS;
// Scan blocks must all be resident at once (they walk the chunks for the whole pass), so shared
// memory is kept under a third of an SM's 228 KiB: 96 heads × 4 slices = 384 blocks ≤ 3 × 132.
constexpr int SKP = D + 1;  // padded row stride of the scan tiles (4 rows per warp, distinct banks)
constexpr int SS = VS;      // state slice row stride (float4 reads of 8 distinct columns)

struct SeqTable {
  int32_t cu[kMaxSeqs + 1];
};

constexpr size_t kPrepSmem = sizeof(float) * (4 * C * SP + C * (C + 1) + C);
constexpr size_t kScanSmem = sizeof(float) * (D * SS + 3 * C * SKP + C * VS + C * C + D);
static_assert(3 * (kScanSmem + 1024) <= 228 * 1024, "three scan blocks per SM");

// Steps 1–2 of the prep for chunk rows p0 .. p0+C−1 of one (sequence, head), into row-major
// tiles of row stride `rs`: conv + SiLU of q, k, v (bf16-rounded), the gate g, β; then the L2
// norms of q (scaled) and k and the in-chunk cumulative sum of g (Gs becomes G). Ends with a
// barrier.
__device__ __forceinline__ void prep_rows(const Params& p, const Inputs& in, int start, int L,
                                          int p0, int h, const uint16_t* cst, float* qs, float* ks,
                                          float* vs, float* Gs, float* beta, int rs) {
  const int tid = threadIdx.x, H = p.H, HK = H * D;
  const int rows = min(C, L - p0);
  const float a = expf(p.A_log[h]);
  // 1. Conv + SiLU (bf16 out), gate, beta. Rows past the sequence end are inert: zero q, k, v,
  //    zero decay (so G keeps the last real value) and β = 0.
  for (int idx = tid; idx < C * D; idx += kThreads) {
    const int r = idx / D, d = idx % D, ch = h * D + d;
    float qv = 0.f, kv = 0.f, vv = 0.f, g = 0.f;
    if (r < rows) {
      const int pos = p0 + r;
      float aq = 0.f, ak = 0.f, av = 0.f;
#pragma unroll
      for (int t = 0; t < 4; t++) {
        const int sp = pos - 3 + t;
        float xq, xk, xv;
        if (sp >= 0) {
          const int64_t row = int64_t(start + sp) * in.qkv_stride + ch;
          xq = bf(in.q[row]);
          xk = bf(in.k[row]);
          xv = bf(in.v[row]);
        } else {
          xq = bf(cst[int64_t(ch) * 3 + sp + 3]);
          xk = bf(cst[int64_t(HK + ch) * 3 + sp + 3]);
          xv = bf(cst[int64_t(2 * HK + ch) * 3 + sp + 3]);
        }
        aq += p.conv_q[ch * 4 + t] * xq;
        ak += p.conv_k[ch * 4 + t] * xk;
        av += p.conv_v[ch * 4 + t] * xv;
      }
      qv = round_bf(siluf_(aq));
      kv = round_bf(siluf_(ak));
      vv = round_bf(siluf_(av));
      const int64_t trow = start + pos;
      g = gate_value(p.gate_form, a, bf(in.z[trow * HK + ch]) + p.dt_bias[ch], p.lower_bound);
      if (d == 0) beta[r] = sigmoidf_(bf(in.b[trow * H + h]));
    } else if (d == 0) {
      beta[r] = 0.f;
    }
    qs[r * rs + d] = qv;
    ks[r * rs + d] = kv;
    vs[r * rs + d] = vv;
    Gs[r * rs + d] = g;
  }
  __syncthreads();

  // 2. L2 norm of q and k rows (rounded to bf16 as FLA's chunk path stores them; q then scaled),
  //    and the in-chunk cumulative sum of g.
  const int warp = tid / 32, lane = tid % 32;
  const float scale = 1.0f / sqrtf(float(D));
  for (int rr = warp; rr < 2 * C; rr += kThreads / 32) {
    float* row = rr < C ? qs + rr * rs : ks + (rr - C) * rs;
    float x[4], ss = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      x[i] = row[lane + 32 * i];
      ss += x[i] * x[i];
    }
    ss = warp_sum(ss);
    const float rstd = 1.0f / sqrtf(ss + p.l2_eps);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      float y = round_bf(x[i] * rstd);
      if (rr < C) y *= scale;
      row[lane + 32 * i] = y;
    }
  }
  if (tid < D) {
    float acc = 0.f;
    for (int r = 0; r < C; r++) {
      acc += Gs[r * rs + tid];
      Gs[r * rs + tid] = acc;
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads)
    chunk_prep(Params p, Inputs in, const SeqTable seqs, const uint16_t* conv_state, int c0, int nc,
               float* ws) {
  const int j = blockIdx.x, h = blockIdx.y, n = blockIdx.z;
  const int start = seqs.cu[n], L = seqs.cu[n + 1] - start;
  const int p0 = (c0 + j) * C;
  if (p0 >= L) return;
  extern __shared__ __align__(16) float sm[];
  float* qs = sm;
  float* ks = qs + C * SP;
  float* vs = ks + C * SP;
  float* Gs = vs + C * SP;
  float* Lm = Gs + C * SP;         // [C][C+1], strictly lower part used
  float* beta = Lm + C * (C + 1);  // [C]
  const int tid = threadIdx.x, H = p.H;
  const uint16_t* cst = conv_state + int64_t(n) * 3 * int64_t(H) * D * 3;
  prep_rows(p, in, start, L, p0, h, cst, qs, ks, vs, Gs, beta, SP);

  float* blk = ws + ((int64_t(n) * nc + j) * H + h) * kChunkFloats;
  float* Wg = blk;
  float* Ug = blk + C * D;
  float* Qg = blk + 2 * C * D;
  float* Kt = blk + 3 * C * D;
  float* Ag = blk + 4 * C * D;
  float* gC = Ag + C * C;

  // 3. For every pair i <= r: e = exp(G_r − G_i) per channel; L[r][i] = β_r Σ k_r k_i e (i < r),
  //    A_qk[r][i] = Σ q_r k_i e.
  for (int pi = tid; pi < C * (C + 1) / 2; pi += kThreads) {
    int r = int((sqrtf(8.f * pi + 1.f) - 1.f) * 0.5f);
    while ((r + 1) * (r + 2) / 2 <= pi) r++;
    while (r * (r + 1) / 2 > pi) r--;
    const int i = pi - r * (r + 1) / 2;
    const float *kr = ks + r * SP, *ki = ks + i * SP, *qr = qs + r * SP;
    const float *Gr = Gs + r * SP, *Gi = Gs + i * SP;
    float lk = 0.f, aq = 0.f;
#pragma unroll 8
    for (int d = 0; d < D; d++) {
      const float kie = ki[d] * __expf(Gr[d] - Gi[d]);
      lk += kr[d] * kie;
      aq += qr[d] * kie;
    }
    Lm[r * (C + 1) + i] = i < r ? beta[r] * lk : 0.f;
    Ag[r * C + i] = aq;
  }
  for (int idx = tid; idx < C * C; idx += kThreads)
    if (idx % C > idx / C) Ag[idx] = 0.f;
  __syncthreads();

  // 4. Forward substitution of (I + L) X = diag(β) R, one column per thread: threads 0..127 give
  //    W (R = Γ⊙K), threads 128..255 give U (R = V).
  {
    const int col = tid & (D - 1);
    const bool isU = tid >= D;
    float x[C];
#pragma unroll
    for (int r = 0; r < C; r++) {
      float acc = isU ? beta[r] * vs[r * SP + col]
                      : beta[r] * (ks[r * SP + col] * __expf(Gs[r * SP + col]));
#pragma unroll
      for (int i = 0; i < r; i++) acc -= Lm[r * (C + 1) + i] * x[i];
      x[r] = acc;
      (isU ? Ug : Wg)[r * D + col] = acc;
    }
  }
  // 5. Γ⊙Q, exp(G_last − G_r)⊙k_r and exp(G_last).
  for (int idx = tid; idx < C * D; idx += kThreads) {
    const int r = idx / D, d = idx % D;
    const float Gr = Gs[r * SP + d], Gl = Gs[(C - 1) * SP + d];
    Qg[idx] = qs[r * SP + d] * __expf(Gr);
    Kt[idx] = ks[r * SP + d] * __expf(Gl - Gr);
  }
  if (tid < D) gC[tid] = __expf(Gs[(C - 1) * SP + tid]);
}

__global__ void __launch_bounds__(kThreads, 3)
    chunk_scan(int H, const SeqTable seqs, int c0, int nc, const float* ws, float* state,
               uint16_t* o) {
  const int vb = blockIdx.x, h = blockIdx.y, n = blockIdx.z;
  const int start = seqs.cu[n], L = seqs.cu[n + 1] - start;
  const int cend = min(c0 + nc, (L + C - 1) / C);
  if (c0 >= cend) return;
  extern __shared__ __align__(16) float sm[];
  float* S = sm;             // [D k][SS], columns v = vb·VS ..
  float* Ws = S + D * SS;    // [C][SKP]
  float* Qs = Ws + C * SKP;  // [C][SKP]
  float* Ks = Qs + C * SKP;  // [C][SKP]
  float* Vn = Ks + C * SKP;  // [C][VS]
  float* As = Vn + C * VS;   // [C][C]
  float* gC = As + C * C;    // [D]
  const int tid = threadIdx.x;
  float* Sg = state + (int64_t(n) * H + h) * D * D;  // [V][K]
  for (int idx = tid; idx < D * VS; idx += kThreads) {
    const int vl = idx / D, k = idx % D;
    S[k * SS + vl] = Sg[int64_t(vb * VS + vl) * D + k];
  }
  const int r = tid / 8, v4 = (tid % 8) * 4, kk = tid / 8;
  const int HV = H * D;
  for (int c = c0; c < cend; c++) {
    const float* blk = ws + ((int64_t(n) * nc + (c - c0)) * H + h) * kChunkFloats;
    __syncthreads();  // the previous chunk is done with the tiles and the state
    for (int idx = tid; idx < C * D / 4; idx += kThreads) {
      const int rr = idx / (D / 4), k4 = (idx % (D / 4)) * 4;
      const float4 w = reinterpret_cast<const float4*>(blk)[idx];
      const float4 qg = reinterpret_cast<const float4*>(blk + 2 * C * D)[idx];
      const float4 kt = reinterpret_cast<const float4*>(blk + 3 * C * D)[idx];
      float* wd = Ws + rr * SKP + k4;
      float* qd = Qs + rr * SKP + k4;
      float* kd = Ks + rr * SKP + k4;
      wd[0] = w.x, wd[1] = w.y, wd[2] = w.z, wd[3] = w.w;
      qd[0] = qg.x, qd[1] = qg.y, qd[2] = qg.z, qd[3] = qg.w;
      kd[0] = kt.x, kd[1] = kt.y, kd[2] = kt.z, kd[3] = kt.w;
    }
    for (int idx = tid; idx < C * C; idx += kThreads) As[idx] = blk[4 * C * D + idx];
    if (tid < D) gC[tid] = blk[4 * C * D + C * C + tid];
    __syncthreads();

    // Ṽ = U − W S and the inter-chunk part of the output, (Γ⊙Q) S.
    float av[4] = {0.f, 0.f, 0.f, 0.f}, ao[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
    for (int k = 0; k < D; k++) {
      const float w = Ws[r * SKP + k], qg = Qs[r * SKP + k];
      const float4 s = *reinterpret_cast<const float4*>(S + k * SS + v4);
      av[0] += w * s.x;
      av[1] += w * s.y;
      av[2] += w * s.z;
      av[3] += w * s.w;
      ao[0] += qg * s.x;
      ao[1] += qg * s.y;
      ao[2] += qg * s.z;
      ao[3] += qg * s.w;
    }
    const float4 u = *reinterpret_cast<const float4*>(blk + C * D + r * D + vb * VS + v4);
    Vn[r * VS + v4 + 0] = u.x - av[0];
    Vn[r * VS + v4 + 1] = u.y - av[1];
    Vn[r * VS + v4 + 2] = u.z - av[2];
    Vn[r * VS + v4 + 3] = u.w - av[3];
    __syncthreads();

    // Intra-chunk part: O += A_qk Ṽ; write o (bf16).
    for (int jj = 0; jj <= r; jj++) {
      const float a = As[r * C + jj];
      const float4 vn = *reinterpret_cast<const float4*>(Vn + jj * VS + v4);
      ao[0] += a * vn.x;
      ao[1] += a * vn.y;
      ao[2] += a * vn.z;
      ao[3] += a * vn.w;
    }
    const int pos = c * C + r;
    if (pos < L) {
      uint16_t* dst = o + int64_t(start + pos) * HV + h * D + vb * VS + v4;
      uint2 pk;
      pk.x = uint32_t(to_bf(ao[0])) | (uint32_t(to_bf(ao[1])) << 16);
      pk.y = uint32_t(to_bf(ao[2])) | (uint32_t(to_bf(ao[3])) << 16);
      *reinterpret_cast<uint2*>(dst) = pk;
    }

    // State: S ← diag(exp G_C) S + K̃ᵀ Ṽ (each thread owns 4 k × 4 v).
#pragma unroll
    for (int m = 0; m < 4; m++) {
      const int k = kk + 32 * m;
      float4 s = *reinterpret_cast<const float4*>(S + k * SS + v4);
      const float gk = gC[k];
      s.x *= gk;
      s.y *= gk;
      s.z *= gk;
      s.w *= gk;
#pragma unroll 8
      for (int rr = 0; rr < C; rr++) {
        const float kt = Ks[rr * SKP + k];
        const float4 vn = *reinterpret_cast<const float4*>(Vn + rr * VS + v4);
        s.x += kt * vn.x;
        s.y += kt * vn.y;
        s.z += kt * vn.z;
        s.w += kt * vn.w;
      }
      *reinterpret_cast<float4*>(S + k * SS + v4) = s;
    }
  }
  __syncthreads();
  for (int idx = tid; idx < D * VS; idx += kThreads) {
    const int vl = idx / D, k = idx % D;
    Sg[int64_t(vb * VS + vl) * D + k] = S[k * SS + vl];
  }
}

// ---- Tensor-core path (the default; STRATA_KDA_PREFILL=fp32 selects the kernels above) ----
//
// mma.sync m16n8k8 tf32 with fp32 accumulation. Fragments (g = lane/4, t = lane%4): A[16×8] row:
// a0 = A[g][t], a1 = A[g+8][t], a2 = A[g][t+4], a3 = A[g+8][t+4]; B[8×8] col: b0 = B[t][g],
// b1 = B[t+4][g]; C[16×8]: c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1].
// An accumulator tile is reused as the A operand of the next product over its n index by
// permuting that product's k order within each group of 8 (slot t ↔ index 2t, slot t+4 ↔ 2t+1):
// then (a0, a1, a2, a3) = (c0, c2, c1, c3) and the B fragment is b0 = B[2t][g], b1 = B[2t+1][g].
__device__ __forceinline__ uint32_t tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float tf32r(float x) {
  return __uint_as_float(tf32(x));
}

__device__ __forceinline__ void mma_tf32(float* c, uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 3xTF32 product (≈ fp32 accuracy): a·b ≈ a_lo·b_hi + a_hi·b_lo + a_hi·b_hi.
__device__ __forceinline__ void mma_3xtf32(float* c, const float* a, float b0, float b1) {
  uint32_t ah[4], al[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    ah[i] = tf32(a[i]);
    al[i] = tf32(a[i] - __uint_as_float(ah[i]));
  }
  const uint32_t bh0 = tf32(b0), bh1 = tf32(b1);
  const uint32_t bl0 = tf32(b0 - __uint_as_float(bh0)), bl1 = tf32(b1 - __uint_as_float(bh1));
  mma_tf32(c, al[0], al[1], al[2], al[3], bh0, bh1);
  mma_tf32(c, ah[0], ah[1], ah[2], ah[3], bl0, bl1);
  mma_tf32(c, ah[0], ah[1], ah[2], ah[3], bh0, bh1);
}

// chunk_prep_tc: the prep for the bounded gate with lower_bound ≥ −5 (K3), where every in-chunk
// decay factors through the middle row: exp(G_r − G_i) = exp(G_r − G_m)·exp(G_m − G_i), m = 16,
// each factor within e^±85 (16 or 17 steps of at most 5), so both stay finite and normal. The
// pair products L and A_qk are then [C×D]·[D×C] GEMMs on tensor cores (3xTF32), the forward
// substitution is as in chunk_prep (one column per thread, L rows read as float4). The scan's B
// operands (W, Γ⊙Q, K̃, A_qk) are written rounded to tf32; U and exp(G_C) stay fp32.
constexpr int PS = D + 4;  // row stride of the prep_tc tiles (A/B fragment loads hit 32 banks)
constexpr int LS = C + 4;  // row stride of L
constexpr int kRef = 16;   // reference row of the factored decays
constexpr size_t kPrepTcSmem = sizeof(float) * (4 * C * PS + C * LS + C + 3 * D);

__global__ void __launch_bounds__(kThreads)
    chunk_prep_tc(Params p, Inputs in, const SeqTable seqs, const uint16_t* conv_state, int c0,
                  int nc, float* ws) {
  const int j = blockIdx.x, h = blockIdx.y, n = blockIdx.z;
  const int start = seqs.cu[n], L = seqs.cu[n + 1] - start;
  const int p0 = (c0 + j) * C;
  if (p0 >= L) return;
  extern __shared__ __align__(16) float sm[];
  float* qs = sm;
  float* ks = qs + C * PS;
  float* vs = ks + C * PS;
  float* Gs = vs + C * PS;
  float* Lm = Gs + C * PS;    // [C][LS]
  float* beta = Lm + C * LS;  // [C]
  float* gref = beta + C;     // [D] G_m
  float* glast = gref + D;    // [D] G_{C−1}
  float* eref = glast + D;    // [D] exp(G_m)
  const int tid = threadIdx.x, H = p.H;
  const uint16_t* cst = conv_state + int64_t(n) * 3 * int64_t(H) * D * 3;
  prep_rows(p, in, start, L, p0, h, cst, qs, ks, vs, Gs, beta, PS);

  float* blk = ws + ((int64_t(n) * nc + j) * H + h) * kChunkFloats;
  float* Wg = blk;
  float* Ug = blk + C * D;
  float* Qg = blk + 2 * C * D;
  float* Kt = blk + 3 * C * D;
  float* Ag = blk + 4 * C * D;
  float* gC = Ag + C * C;

  // 3. Factored operands in place: qs ← q·e^{G−G_m}, ks ← k·e^{G−G_m}, Gs ← k·e^{G_m−G}; and to
  //    the workspace Γ⊙Q and K̃ = e^{G_C−G}⊙K.
  if (tid < D) {
    gref[tid] = Gs[kRef * PS + tid];
    glast[tid] = Gs[(C - 1) * PS + tid];
  }
  __syncthreads();
  for (int idx = tid; idx < C * D; idx += kThreads) {
    const int r = idx / D, d = idx % D;
    const float G = Gs[r * PS + d], q = qs[r * PS + d], k = ks[r * PS + d];
    const float up = __expf(G - gref[d]), down = __expf(gref[d] - G);
    Qg[idx] = tf32r(q * __expf(G));
    Kt[idx] = tf32r(k * __expf(glast[d] - G));
    qs[r * PS + d] = q * up;
    ks[r * PS + d] = k * up;
    Gs[r * PS + d] = k * down;
  }
  if (tid < D) {
    gC[tid] = __expf(glast[tid]);
    eref[tid] = __expf(gref[tid]);
  }
  __syncthreads();

  // 4. A_qk = Qf·Kiᵀ, L = diag(β)·Kf·Kiᵀ: warp w owns rows 16(w/4) .., columns 8(w%4) ..; the
  //    two tiles above the diagonal block are zero.
  {
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int m0 = 16 * (warp / 4), n0 = 8 * (warp % 4);
    float aq[4] = {0.f, 0.f, 0.f, 0.f}, lk[4] = {0.f, 0.f, 0.f, 0.f};
    if (n0 <= m0 + 15) {
#pragma unroll 4
      for (int k0 = 0; k0 < D; k0 += 8) {
        const float* qa = qs + (m0 + g) * PS + k0 + t;
        const float* ka = ks + (m0 + g) * PS + k0 + t;
        const float* kb = Gs + (n0 + g) * PS + k0 + t;
        const float fq[4] = {qa[0], qa[8 * PS], qa[4], qa[8 * PS + 4]};
        const float fk[4] = {ka[0], ka[8 * PS], ka[4], ka[8 * PS + 4]};
        mma_3xtf32(aq, fq, kb[0], kb[4]);
        mma_3xtf32(lk, fk, kb[0], kb[4]);
      }
    }
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int r = m0 + g + (e >= 2 ? 8 : 0), i = n0 + 2 * t + (e & 1);
      Ag[r * C + i] = i <= r ? tf32r(aq[e]) : 0.f;
      Lm[r * LS + i] = i < r ? beta[r] * lk[e] : 0.f;
    }
  }
  __syncthreads();

  // 5. Forward substitution of (I + L) X = diag(β) R, one column per thread: threads 0..127 give
  //    W (R = Γ⊙K = Kf·e^{G_m}), threads 128..255 give U (R = V). x[i ≥ r] are still zero and
  //    L[r][i ≥ r] is zero, so whole float4 groups of L can be used.
  {
    const int col = tid & (D - 1);
    const bool isU = tid >= D;
    const float em = eref[col];
    float x[C];
#pragma unroll
    for (int r = 0; r < C; r++) x[r] = 0.f;
#pragma unroll
    for (int r = 0; r < C; r++) {
      float acc = isU ? beta[r] * vs[r * PS + col] : beta[r] * (ks[r * PS + col] * em);
#pragma unroll
      for (int i = 0; i < r; i += 4) {
        const float4 l = *reinterpret_cast<const float4*>(Lm + r * LS + i);
        acc -= l.x * x[i];
        acc -= l.y * x[i + 1];
        acc -= l.z * x[i + 2];
        acc -= l.w * x[i + 3];
      }
      x[r] = acc;
      if (isU)
        Ug[r * D + col] = acc;
      else
        Wg[r * D + col] = tf32r(acc);
    }
  }
}

// chunk_scan_tc (grid: head × sequence, 8 warps): one block walks a head's chunks with the whole
// transposed state S'[v][k] in registers as mma accumulators — warp w owns rows v = 16w .. 16w+15
// (16 n-tiles over k, 64 floats a thread); columns v evolve independently, so the warps never
// exchange state. Per chunk, from a cp.async double-buffered stage in shared memory:
//   Ṽᵀ = Uᵀ − S'·Wᵀ and Oᵀ = S'·(Γ⊙Q)ᵀ   (A = S' fragments, k-permuted; B = W, Γ⊙Q rows)
//   Oᵀ += Ṽᵀ·A_qkᵀ                      (A = Ṽᵀ fragments, c-permuted; lower-triangular A_qk)
//   S' ← S'·diag(e^{G_C}) + Ṽᵀ·K̃          (A = Ṽᵀ fragments; B = K̃ columns)
// then O goes through shared memory to the fused gated norm (y written directly; no gated_norm
// launch on this path).
constexpr int WSt = D + 8;  // stride of the W and Γ⊙Q tiles (float2 B loads: 8g + 2t banks)
constexpr int KSt = D + 4;  // stride of the K̃, U and O tiles (scalar loads: 8t + g banks)
constexpr int ASt = C + 8;  // stride of the A_qk tile
constexpr int kStage = 2 * C * WSt + 2 * C * KSt + C * ASt + D;
constexpr size_t kScanTcSmem = sizeof(float) * (2 * kStage + C * KSt);
static_assert(kScanTcSmem <= 227 * 1024, "scan_tc shared memory");

__device__ __forceinline__ void load_stage(float* st, const float* blk, int tid) {
  float* Ws = st;
  float* Qs = Ws + C * WSt;
  float* Ks = Qs + C * WSt;
  float* Us = Ks + C * KSt;
  float* As = Us + C * KSt;
  float* gs = As + C * ASt;
  for (int i = tid; i < C * D / 4; i += kThreads) {
    const int r = i / (D / 4), c4 = (i % (D / 4)) * 4;
    cp_async16(Ws + r * WSt + c4, blk + r * D + c4, 16);
    cp_async16(Us + r * KSt + c4, blk + C * D + r * D + c4, 16);
    cp_async16(Qs + r * WSt + c4, blk + 2 * C * D + r * D + c4, 16);
    cp_async16(Ks + r * KSt + c4, blk + 3 * C * D + r * D + c4, 16);
  }
  for (int i = tid; i < C * C / 4; i += kThreads) {
    const int r = i / (C / 4), c4 = (i % (C / 4)) * 4;
    cp_async16(As + r * ASt + c4, blk + 4 * C * D + r * C + c4, 16);
  }
  if (tid < D / 4) cp_async16(gs + tid * 4, blk + 4 * C * D + C * C + tid * 4, 16);
}

__global__ void __launch_bounds__(kThreads, 1)
    chunk_scan_tc(int H, const SeqTable seqs, int c0, int nc, const float* ws, float* state,
                  const uint16_t* gate, const float* onw, float eps, uint16_t* y) {
  const int h = blockIdx.x, n = blockIdx.y;
  const int start = seqs.cu[n], L = seqs.cu[n + 1] - start;
  const int cend = min(c0 + nc, (L + C - 1) / C);
  if (c0 >= cend) return;
  extern __shared__ __align__(16) float sm[];
  float* Os = sm + 2 * kStage;  // [C][KSt]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int v0 = 16 * warp;
  const int HV = H * D;
  auto block_of = [&](int c) { return ws + ((int64_t(n) * nc + (c - c0)) * H + h) * kChunkFloats; };
  load_stage(sm, block_of(c0), tid);
  cp_async_commit();

  float* Sg = state + (int64_t(n) * H + h) * D * D;  // [V][K]
  float s[16][4];
#pragma unroll
  for (int j = 0; j < 16; j++) {
    const float2 lo = *reinterpret_cast<const float2*>(Sg + (v0 + g) * D + 8 * j + 2 * t);
    const float2 hi = *reinterpret_cast<const float2*>(Sg + (v0 + g + 8) * D + 8 * j + 2 * t);
    s[j][0] = lo.x, s[j][1] = lo.y, s[j][2] = hi.x, s[j][3] = hi.y;
  }
  const float wn[4] = {onw[4 * lane], onw[4 * lane + 1], onw[4 * lane + 2], onw[4 * lane + 3]};

  for (int c = c0; c < cend; c++) {
    const int b = (c - c0) & 1;
    if (c + 1 < cend) load_stage(sm + (b ^ 1) * kStage, block_of(c + 1), tid);
    cp_async_commit();
    // The output gate of this warp's four rows, loaded now, used after the products.
    uint2 gv[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int pos = c * C + 4 * warp + i;
      gv[i] =
          pos < L
              ? *reinterpret_cast<const uint2*>(gate + int64_t(start + pos) * HV + h * D + 4 * lane)
              : make_uint2(0u, 0u);
    }
    cp_async_wait<1>();
    __syncthreads();  // chunk c's stage is complete and visible
    const float* Ws = sm + b * kStage;
    const float* Qs = Ws + C * WSt;
    const float* Ks = Qs + C * WSt;
    const float* Us = Ks + C * KSt;
    const float* As = Us + C * KSt;
    const float* gs = As + C * ASt;

    // Ṽᵀ (before U) and Oᵀ from the state: k-step j = the state's n-tile j.
    float vt[4][4], ot[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int e = 0; e < 4; e++) vt[i][e] = ot[i][e] = 0.f;
#pragma unroll
    for (int j = 0; j < 16; j++) {
      const uint32_t a0 = tf32(s[j][0]), a1 = tf32(s[j][2]), a2 = tf32(s[j][1]), a3 = tf32(s[j][3]);
#pragma unroll
      for (int nt = 0; nt < 4; nt++) {
        const float2 w = *reinterpret_cast<const float2*>(Ws + (8 * nt + g) * WSt + 8 * j + 2 * t);
        const float2 q = *reinterpret_cast<const float2*>(Qs + (8 * nt + g) * WSt + 8 * j + 2 * t);
        mma_tf32(vt[nt], a0, a1, a2, a3, __float_as_uint(w.x), __float_as_uint(w.y));
        mma_tf32(ot[nt], a0, a1, a2, a3, __float_as_uint(q.x), __float_as_uint(q.y));
      }
    }
    // Ṽᵀ = Uᵀ − (W S)ᵀ, as A fragments (k-step nt = chunk rows 8nt ..).
    uint32_t va[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; nt++) {
      const float* u = Us + (8 * nt + 2 * t) * KSt + v0 + g;
      va[nt][0] = tf32(u[0] - vt[nt][0]);
      va[nt][2] = tf32(u[KSt] - vt[nt][1]);
      va[nt][1] = tf32(u[8] - vt[nt][2]);
      va[nt][3] = tf32(u[KSt + 8] - vt[nt][3]);
    }
    // Oᵀ += Ṽᵀ A_qkᵀ (A_qk[r][c] = 0 for c > r: k-steps kt ≤ nt only).
#pragma unroll
    for (int nt = 0; nt < 4; nt++)
#pragma unroll
      for (int kt = 0; kt <= nt; kt++) {
        const float2 a = *reinterpret_cast<const float2*>(As + (8 * nt + g) * ASt + 8 * kt + 2 * t);
        mma_tf32(ot[nt], va[kt][0], va[kt][1], va[kt][2], va[kt][3], __float_as_uint(a.x),
                 __float_as_uint(a.y));
      }
#pragma unroll
    for (int nt = 0; nt < 4; nt++) {
      float* o = Os + (8 * nt + 2 * t) * KSt + v0 + g;
      o[0] = ot[nt][0];
      o[KSt] = ot[nt][1];
      o[8] = ot[nt][2];
      o[KSt + 8] = ot[nt][3];
    }
    // S' ← S' diag(e^{G_C}) + Ṽᵀ K̃.
#pragma unroll
    for (int j = 0; j < 16; j++) {
      const float2 gc = *reinterpret_cast<const float2*>(gs + 8 * j + 2 * t);
      s[j][0] *= gc.x;
      s[j][1] *= gc.y;
      s[j][2] *= gc.x;
      s[j][3] *= gc.y;
#pragma unroll
      for (int kt = 0; kt < 4; kt++) {
        const float* kp = Ks + (8 * kt + 2 * t) * KSt + 8 * j + g;
        mma_tf32(s[j], va[kt][0], va[kt][1], va[kt][2], va[kt][3], __float_as_uint(kp[0]),
                 __float_as_uint(kp[KSt]));
      }
    }
    __syncthreads();  // O is complete; every warp is done with stage b

    // Gated norm of rows 4w .. 4w+3: o rounded to bf16, y = bf16(RMSNorm(o)·w·σ(gate)).
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int r = 4 * warp + i, pos = c * C + r;
      const float4 o4 = *reinterpret_cast<const float4*>(Os + r * KSt + 4 * lane);
      const float o[4] = {round_bf(o4.x), round_bf(o4.y), round_bf(o4.z), round_bf(o4.w)};
      float ss = o[0] * o[0] + o[1] * o[1] + o[2] * o[2] + o[3] * o[3];
      ss = warp_sum(ss);
      if (pos < L) {
        const float rstd = 1.0f / sqrtf(ss / float(D) + eps);
        const float ga[4] = {bf(uint16_t(gv[i].x)), bf(uint16_t(gv[i].x >> 16)),
                             bf(uint16_t(gv[i].y)), bf(uint16_t(gv[i].y >> 16))};
        uint16_t r16[4];
#pragma unroll
        for (int e = 0; e < 4; e++) r16[e] = to_bf(o[e] * rstd * wn[e] * sigmoidf_(ga[e]));
        uint2 pk;
        pk.x = uint32_t(r16[0]) | (uint32_t(r16[1]) << 16);
        pk.y = uint32_t(r16[2]) | (uint32_t(r16[3]) << 16);
        *reinterpret_cast<uint2*>(y + int64_t(start + pos) * HV + h * D + 4 * lane) = pk;
      }
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int j = 0; j < 16; j++) {
    *reinterpret_cast<float2*>(Sg + (v0 + g) * D + 8 * j + 2 * t) = make_float2(s[j][0], s[j][1]);
    *reinterpret_cast<float2*>(Sg + (v0 + g + 8) * D + 8 * j + 2 * t) =
        make_float2(s[j][2], s[j][3]);
  }
}

// y ← bf16(RMSNorm(o)·w·σ(gate)) in place, one warp per (token, head) row of 128.
__global__ void gated_norm(const float* w, float eps, const uint16_t* gate, int64_t rows,
                           uint16_t* y) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  uint16_t* yr = y + row * D;
  float o[4], ss = 0.f;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    o[i] = bf(yr[lane + 32 * i]);
    ss += o[i] * o[i];
  }
  ss = warp_sum(ss);
  const float rstd = 1.0f / sqrtf(ss / float(D) + eps);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int v = lane + 32 * i;
    yr[v] = to_bf(o[i] * rstd * w[v] * sigmoidf_(bf(gate[row * D + v])));
  }
}

// New conv state: the last 3 pre-conv inputs of each channel (from this call's rows, or from the
// old state when the call holds fewer than 3 tokens). One thread per channel.
__global__ void conv_state_update(Inputs in, const SeqTable seqs, int HK, uint16_t* conv) {
  const int n = blockIdx.y;
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= 3 * HK) return;
  const int start = seqs.cu[n], L = seqs.cu[n + 1] - start;
  if (L == 0) return;
  const uint16_t* src = ch < HK ? in.q : ch < 2 * HK ? in.k : in.v;
  const int col = ch % HK;
  uint16_t* cs = conv + (int64_t(n) * 3 * HK + ch) * 3;
  const uint16_t old[3] = {cs[0], cs[1], cs[2]};
  uint16_t nw[3];
#pragma unroll
  for (int i = 0; i < 3; i++) {
    const int sp = L - 3 + i;
    nw[i] = sp >= 0 ? src[int64_t(start + sp) * in.qkv_stride + col] : old[sp + 3];
  }
#pragma unroll
  for (int i = 0; i < 3; i++) cs[i] = nw[i];
}

// STRATA_KDA_PREFILL=fp32 (read once) selects the fp32 CUDA-core kernels, for A/B runs and tests.
bool fp32_path() {
  static const bool v = [] {
    const char* e = std::getenv("STRATA_KDA_PREFILL");
    return e && std::strcmp(e, "fp32") == 0;
  }();
  return v;
}

}  // namespace

size_t prefill_workspace_bytes(int H, int N, int64_t max_len, int64_t max_chunks) {
  int64_t nch = (max_len + C - 1) / C;
  if (nch < 1) nch = 1;
  if (max_chunks <= 0 || max_chunks > nch) max_chunks = nch;
  return size_t(N) * size_t(max_chunks) * size_t(H) * size_t(kChunkFloats) * sizeof(float);
}

Status prefill(const Params& p, const Inputs& in, const int32_t* cu_seqlens_host, int N, State st,
               uint16_t* y, void* workspace, size_t workspace_bytes, void* stream) {
  if (Status s = check_params(p, in, st); !s.ok()) return s;
  if (N < 1 || N > kMaxSeqs) return invalid("kda prefill: N must be 1 .. 256 sequences");
  if (!cu_seqlens_host || cu_seqlens_host[0] != 0)
    return invalid("kda prefill: cu_seqlens must start at 0");
  if (!y || !workspace) return invalid("kda prefill: y or workspace is null");
  SeqTable tbl{};
  int64_t max_len = 0;
  for (int n = 0; n <= N; n++) {
    tbl.cu[n] = cu_seqlens_host[n];
    if (n > 0) {
      if (tbl.cu[n] < tbl.cu[n - 1]) return invalid("kda prefill: cu_seqlens must not decrease");
      max_len = std::max<int64_t>(max_len, tbl.cu[n] - tbl.cu[n - 1]);
    }
  }
  if (max_len == 0) return Status{};
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int H = p.H;
  const int64_t nch = (max_len + C - 1) / C;
  const size_t per_chunk = prefill_workspace_bytes(H, N, C, 1);
  const int64_t nc = std::min<int64_t>(nch, int64_t(workspace_bytes / per_chunk));
  if (nc < 1) return invalid("kda prefill: workspace smaller than prefill_workspace_bytes(.., 1)");
  if (nc > 65535) return invalid("kda prefill: more than 65535 chunks per pass");
  float* ws = static_cast<float*>(workspace);
  if (fp32_path()) {
    if (Status a = rt::allow_dynamic_smem(chunk_prep, int(kPrepSmem)); !a.ok()) return a;
    if (Status a = rt::allow_dynamic_smem(chunk_scan, int(kScanSmem)); !a.ok()) return a;
    for (int64_t c0 = 0; c0 < nch; c0 += nc) {
      const int n_this = int(std::min<int64_t>(nc, nch - c0));
      chunk_prep<<<dim3(n_this, H, N), kThreads, kPrepSmem, s>>>(p, in, tbl, st.conv, int(c0),
                                                                 int(nc), ws);
      chunk_scan<<<dim3(kSlices, H, N), kThreads, kScanSmem, s>>>(H, tbl, int(c0), int(nc), ws,
                                                                  st.recurrent, y);
    }
    const int64_t rows = int64_t(tbl.cu[N]) * H;
    gated_norm<<<unsigned((rows + 7) / 8), 256, 0, s>>>(p.o_norm_w, p.o_norm_eps, in.gate, rows, y);
  } else {
    // The factored prep needs every 17-step decay sum within e^-85 (bounded gate, bound ≥ −5);
    // other gates use chunk_prep, whose operands the scan's tf32 conversion truncates.
    const bool factored = p.gate_form == GateForm::bounded && p.lower_bound >= -5.0f;
    if (Status a = rt::allow_dynamic_smem(chunk_prep, int(kPrepSmem)); !a.ok()) return a;
    if (Status a = rt::allow_dynamic_smem(chunk_prep_tc, int(kPrepTcSmem)); !a.ok()) return a;
    if (Status a = rt::allow_dynamic_smem(chunk_scan_tc, int(kScanTcSmem)); !a.ok()) return a;
    for (int64_t c0 = 0; c0 < nch; c0 += nc) {
      const dim3 pg(unsigned(std::min<int64_t>(nc, nch - c0)), unsigned(H), unsigned(N));
      if (factored)
        chunk_prep_tc<<<pg, kThreads, kPrepTcSmem, s>>>(p, in, tbl, st.conv, int(c0), int(nc), ws);
      else
        chunk_prep<<<pg, kThreads, kPrepSmem, s>>>(p, in, tbl, st.conv, int(c0), int(nc), ws);
      chunk_scan_tc<<<dim3(H, N), kThreads, kScanTcSmem, s>>>(
          H, tbl, int(c0), int(nc), ws, st.recurrent, in.gate, p.o_norm_w, p.o_norm_eps, y);
    }
  }
  conv_state_update<<<dim3((3 * H * D + 255) / 256, N), 256, 0, s>>>(in, tbl, H * D, st.conv);
  return launch_status();
}

}  // namespace strata::kernels::kda
