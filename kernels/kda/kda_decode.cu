// KDA decode step for a batch of sequences (see kda.h). One block per (head, sequence): the conv
// update of the head's 384 channels, L2 norms (fp32, as FLA's fused_recurrent), gate, β, then
// 8 warps × 16 state rows (each row = one v, 128 k held as a float4 per lane) updated in
// registers — the 64 KiB of state read and written once — and the gated RMSNorm of the head's
// output.
#include "kernels/kda/kda_common.cuh"

namespace strata::kernels::kda {
namespace {

using namespace detail;

constexpr int D = kD;
constexpr int kThreads = 256;
constexpr int kRowsPerWarp = D / (kThreads / 32);  // 16

__global__ void __launch_bounds__(kThreads)
    decode_step(Params p, Inputs in, State st, uint16_t* y, uint16_t* o_raw) {
  const int h = blockIdx.x, b = blockIdx.y;
  const int H = p.H, HK = H * D;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  __shared__ __align__(16) float qn[D], kn[D], vv[D], al[D], os[D];
  __shared__ float beta_s;

  // Conv update of the head's q, k, v channels (state = last 3 pre-conv inputs, oldest first).
  uint16_t* cst = st.conv + int64_t(b) * 3 * HK * 3;
  for (int idx = tid; idx < 3 * D; idx += kThreads) {
    const int part = idx / D, d = idx % D, ch = h * D + d;
    const uint16_t* src = part == 0 ? in.q : part == 1 ? in.k : in.v;
    const float* w = (part == 0 ? p.conv_q : part == 1 ? p.conv_k : p.conv_v) + ch * 4;
    uint16_t* s3 = cst + int64_t(part * HK + ch) * 3;
    const uint16_t x0 = s3[0], x1 = s3[1], x2 = s3[2];
    const uint16_t xn = src[int64_t(b) * in.qkv_stride + ch];
    float acc = 0.f;
    acc += w[0] * bf(x0);
    acc += w[1] * bf(x1);
    acc += w[2] * bf(x2);
    acc += w[3] * bf(xn);
    s3[0] = x1;
    s3[1] = x2;
    s3[2] = xn;
    (part == 0 ? qn : part == 1 ? kn : vv)[d] = round_bf(siluf_(acc));
  }
  if (tid < D) {
    const float a = expf(p.A_log[h]);
    const float g =
        gate_value(p.gate_form, a, bf(in.z[int64_t(b) * HK + h * D + tid]) + p.dt_bias[h * D + tid],
                   p.lower_bound);
    al[tid] = expf(g);
  }
  if (tid == 0) beta_s = sigmoidf_(bf(in.b[int64_t(b) * H + h]));
  __syncthreads();
  if (warp < 2) {
    float* r = warp == 0 ? qn : kn;
    float x[4], ss = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      x[i] = r[lane + 32 * i];
      ss += x[i] * x[i];
    }
    ss = warp_sum(ss);
    const float m = 1.0f / sqrtf(ss + p.l2_eps);
    const float scale = warp == 0 ? 1.0f / sqrtf(float(D)) : 1.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) r[lane + 32 * i] = (x[i] * m) * scale;
  }
  __syncthreads();

  // The recurrence, rows v = warp·16 .. +15; lane holds k = 4·lane .. 4·lane+3.
  const float4 k4 = reinterpret_cast<const float4*>(kn)[lane];
  const float4 q4 = reinterpret_cast<const float4*>(qn)[lane];
  const float4 a4 = reinterpret_cast<const float4*>(al)[lane];
  const float beta = beta_s;
  float* Sh = st.recurrent + (int64_t(b) * H + h) * D * D;
  float4 s[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; i++)
    s[i] = reinterpret_cast<const float4*>(Sh + (warp * kRowsPerWarp + i) * D)[lane];
  // Phases keep all 16 row loads in flight before the first store: decay and the partial
  // prediction, 16 independent warp reductions, then write, read and store.
  float pr[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; i++) {
    s[i].x *= a4.x;
    s[i].y *= a4.y;
    s[i].z *= a4.z;
    s[i].w *= a4.w;
    pr[i] = s[i].x * k4.x + s[i].y * k4.y + s[i].z * k4.z + s[i].w * k4.w;
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; i++) pr[i] = warp_sum(pr[i]);
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; i++) {
    const float u = beta * (vv[warp * kRowsPerWarp + i] - pr[i]);
    s[i].x += k4.x * u;
    s[i].y += k4.y * u;
    s[i].z += k4.z * u;
    s[i].w += k4.w * u;
    pr[i] = s[i].x * q4.x + s[i].y * q4.y + s[i].z * q4.z + s[i].w * q4.w;
    reinterpret_cast<float4*>(Sh + (warp * kRowsPerWarp + i) * D)[lane] = s[i];
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; i++) pr[i] = warp_sum(pr[i]);
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; i++) os[warp * kRowsPerWarp + i] = pr[i];
  }
  __syncthreads();

  // Gated output norm (o rounded to bf16 first, spec §4.9).
  if (warp == 0) {
    float o[4], ss = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      o[i] = round_bf(os[lane + 32 * i]);
      ss += o[i] * o[i];
    }
    ss = warp_sum(ss);
    const float rstd = 1.0f / sqrtf(ss / float(D) + p.o_norm_eps);
    const int64_t base = int64_t(b) * HK + h * D;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int v = lane + 32 * i;
      if (o_raw) o_raw[base + v] = to_bf(o[i]);
      y[base + v] = to_bf(o[i] * rstd * p.o_norm_w[v] * sigmoidf_(bf(in.gate[base + v])));
    }
  }
}

}  // namespace

Status decode(const Params& p, const Inputs& in, int B, State st, uint16_t* y, uint16_t* o_raw,
              void* stream) {
  if (Status s = check_params(p, in, st); !s.ok()) return s;
  if (B < 1 || B > 65535) return invalid("kda decode: B must be 1 .. 65535");
  if (!y) return invalid("kda decode: y is null");
  decode_step<<<dim3(p.H, B), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p, in, st, y,
                                                                                o_raw);
  return launch_status();
}

}  // namespace strata::kernels::kda
