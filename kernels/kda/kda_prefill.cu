// KDA chunked prefill (spec §4.5, WY/UT form; see kda.h). Two kernels per pass over a window of
// chunks, then the gated output norm and the conv-state update:
//   chunk_prep (grid: chunk × head × sequence) — short conv + SiLU, L2 norm, gate, β; cumulative
//     log decay G; L and A_qk (exp of G differences, never of G alone, so both gate forms stay in
//     range); W = M(Γ⊙K), U = MV by forward substitution of (I + L); Γ⊙Q, exp(G_C − G)⊙K, exp(G_C).
//   chunk_scan (grid: V-slice × head × sequence) — walks the chunks in order with the fp32 state
//     slice in shared memory: Ṽ = U − W S, O = (Γ⊙Q) S + A_qk Ṽ, S ← diag(e^{G_C}) S + K̃ᵀ Ṽ.
// fp32 CUDA-core arithmetic throughout (no tensor cores yet; docs/performance.md has the numbers).
#include <algorithm>

#include "kernels/kda/kda_common.cuh"

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
  const int tid = threadIdx.x, H = p.H, HK = H * D;
  const int rows = min(C, L - p0);
  const float a = expf(p.A_log[h]);
  const int64_t conv_ch = 3 * int64_t(HK);
  const uint16_t* cst = conv_state + int64_t(n) * conv_ch * 3;

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
    qs[r * SP + d] = qv;
    ks[r * SP + d] = kv;
    vs[r * SP + d] = vv;
    Gs[r * SP + d] = g;
  }
  __syncthreads();

  // 2. L2 norm of q and k rows (rounded to bf16 as FLA's chunk path stores them; q then scaled),
  //    and the in-chunk cumulative sum of g.
  const int warp = tid / 32, lane = tid % 32;
  const float scale = 1.0f / sqrtf(float(D));
  for (int rr = warp; rr < 2 * C; rr += kThreads / 32) {
    float* row = rr < C ? qs + rr * SP : ks + (rr - C) * SP;
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
      acc += Gs[r * SP + tid];
      Gs[r * SP + tid] = acc;
    }
  }
  __syncthreads();

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
  if (Status a = rt::allow_dynamic_smem(chunk_prep, int(kPrepSmem)); !a.ok()) return a;
  if (Status a = rt::allow_dynamic_smem(chunk_scan, int(kScanSmem)); !a.ok()) return a;
  float* ws = static_cast<float*>(workspace);
  for (int64_t c0 = 0; c0 < nch; c0 += nc) {
    const int n_this = int(std::min<int64_t>(nc, nch - c0));
    chunk_prep<<<dim3(n_this, H, N), kThreads, kPrepSmem, s>>>(p, in, tbl, st.conv, int(c0),
                                                               int(nc), ws);
    chunk_scan<<<dim3(kSlices, H, N), kThreads, kScanSmem, s>>>(H, tbl, int(c0), int(nc), ws,
                                                                st.recurrent, y);
  }
  const int64_t rows = int64_t(tbl.cu[N]) * H;
  gated_norm<<<unsigned((rows + 7) / 8), 256, 0, s>>>(p.o_norm_w, p.o_norm_eps, in.gate, rows, y);
  conv_state_update<<<dim3((3 * H * D + 255) / 256, N), 256, 0, s>>>(in, tbl, H * D, st.conv);
  return launch_status();
}

}  // namespace strata::kernels::kda
