// KDA decode step for a batch of sequences (see kda.h). The 128 state rows (one per v) of a
// (head, sequence) are independent given q, k, the decay and β, so they are split over `split`
// CTAs (1, 2, 4 or 8; a thread-block cluster when > 1). Every CTA:
//   1. issues the loads of its state rows first (a float4 of k per lane, kRows rows per warp),
//      so they are in flight during the dependent chain below;
//   2. per warp, redoes the cheap per-head prep in registers: the conv + SiLU of the head's 128 q
//      and 128 k channels (lane l owns channels 4l .. 4l+3, the same k the lane holds of each
//      state row), their L2 norms by warp reductions, the decay of those 4 channels and β; the
//      conv of the v channels of its own rows. No shared memory, no block barrier before the
//      state math;
//   3. updates its rows in registers and stores them (64 KiB per head read and written once);
//   4. exchanges the per-warp sums of o² (the gated RMSNorm runs over all 128 v) through shared
//      memory — distributed shared memory across the cluster — and writes y for its rows.
// The conv state of a v channel is read and written by the one lane that owns it; the q/k conv
// state is read by every CTA of the head, so it is written after the closing barrier by warp 0
// of rank 0. Small B wants many CTAs per head (B = 1: 96 heads would fill 96 of 132 SMs with one
// long dependent chain each); large B has CTAs enough and prefers no redundant prep.
#include "kernels/kda/kda_common.cuh"

namespace strata::kernels::kda {
namespace {

using namespace detail;

constexpr int D = kD;

// Rows per warp and warps per CTA for a split: 16 rows per warp at split 1 (8 warps, 64 KiB in
// flight per CTA for large B), fewer at larger splits so that each CTA stays short.
template <int kSplit>
struct Shape {
  static constexpr int kRows = kSplit == 1 ? 16 : kSplit == 2 ? 16 : kSplit == 4 ? 8 : 4;
  static constexpr int kWarps = D / kSplit / kRows;
  static constexpr int kThreads = kWarps * 32;
};

// 4 consecutive bf16 (8 bytes, 8-byte aligned) as floats.
__device__ __forceinline__ void load_bf4(const uint16_t* p, float (&x)[4]) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  x[0] = __uint_as_float(u.x << 16);
  x[1] = __uint_as_float(u.x & 0xffff0000u);
  x[2] = __uint_as_float(u.y << 16);
  x[3] = __uint_as_float(u.y & 0xffff0000u);
}

// Conv + SiLU of 4 consecutive channels c .. c+3 (state: 3 bf16 per channel, oldest first, so
// the 4 channels' states are 12 contiguous bf16 = 3 × 8 bytes). Returns the bf16-rounded outputs
// and keeps the new state (the last 3 inputs) in `ns` for a later store.
__device__ __forceinline__ void conv4(const uint16_t* cs, const uint16_t* x, const float* w,
                                      float (&out)[4], uint2 (&ns)[3]) {
  const uint2* c2 = reinterpret_cast<const uint2*>(cs);
  const uint2 s0 = c2[0], s1 = c2[1], s2 = c2[2];
  const uint2 xn = *reinterpret_cast<const uint2*>(x);
  const uint16_t old[12] = {uint16_t(s0.x),       uint16_t(s0.x >> 16), uint16_t(s0.y),
                            uint16_t(s0.y >> 16), uint16_t(s1.x),       uint16_t(s1.x >> 16),
                            uint16_t(s1.y),       uint16_t(s1.y >> 16), uint16_t(s2.x),
                            uint16_t(s2.x >> 16), uint16_t(s2.y),       uint16_t(s2.y >> 16)};
  const uint16_t nx[4] = {uint16_t(xn.x), uint16_t(xn.x >> 16), uint16_t(xn.y),
                          uint16_t(xn.y >> 16)};
  uint16_t upd[12];
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const float4 wj = reinterpret_cast<const float4*>(w)[j];
    float acc = 0.f;
    acc += wj.x * bf(old[3 * j]);
    acc += wj.y * bf(old[3 * j + 1]);
    acc += wj.z * bf(old[3 * j + 2]);
    acc += wj.w * bf(nx[j]);
    out[j] = round_bf(siluf_(acc));
    upd[3 * j] = old[3 * j + 1];
    upd[3 * j + 1] = old[3 * j + 2];
    upd[3 * j + 2] = nx[j];
  }
#pragma unroll
  for (int i = 0; i < 3; i++)
    ns[i] = make_uint2(uint32_t(upd[4 * i]) | uint32_t(upd[4 * i + 1]) << 16,
                       uint32_t(upd[4 * i + 2]) | uint32_t(upd[4 * i + 3]) << 16);
}

__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Store to the shared memory of CTA `rank` of the cluster at the address of `p` in this CTA.
__device__ __forceinline__ void st_cluster(float* p, uint32_t rank, float v) {
  const uint32_t local = uint32_t(__cvta_generic_to_shared(p));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(remote), "f"(v) : "memory");
}

template <int kSplit>
__global__ void __launch_bounds__(Shape<kSplit>::kThreads)
    decode_step(Params p, Inputs in, State st, uint16_t* y, uint16_t* o_raw) {
  constexpr int kRows = Shape<kSplit>::kRows, kWarps = Shape<kSplit>::kWarps;
  const int H = p.H, HK = H * D;
  const int h = blockIdx.x / kSplit, b = blockIdx.y;
  const int rank = kSplit == 1 ? 0 : int(cluster_rank());
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = rank * (D / kSplit) + warp * kRows;  // this warp's first v
  __shared__ float ss_part[kSplit * kWarps];

  // 1. The state rows, before anything they do not depend on.
  float* Sh = st.recurrent + (int64_t(b) * H + h) * D * D + int64_t(row0) * D;
  float4 s[kRows];
#pragma unroll
  for (int i = 0; i < kRows; i++) s[i] = reinterpret_cast<const float4*>(Sh + i * D)[lane];
  // Every CTA of the cluster must have started before any writes to its shared memory (step 4);
  // arrive now, wait just before those writes.
  if constexpr (kSplit > 1) cluster_arrive_relaxed();

  // 2. Per-head prep, lane l: channels c = h·128 + 4l .. +3 of q and k.
  uint16_t* cst = st.conv + int64_t(b) * 3 * HK * 3;
  const int c = h * D + 4 * lane;
  const int64_t xrow = int64_t(b) * in.qkv_stride;
  float qv[4], kv[4];
  uint2 nq[3], nk[3];
  conv4(cst + int64_t(c) * 3, in.q + xrow + c, p.conv_q + int64_t(c) * 4, qv, nq);
  conv4(cst + int64_t(HK + c) * 3, in.k + xrow + c, p.conv_k + int64_t(c) * 4, kv, nk);
  float zv[4];
  load_bf4(in.z + int64_t(b) * HK + c, zv);
  const float4 dt = *reinterpret_cast<const float4*>(p.dt_bias + c);
  const float a = expf(p.A_log[h]);
  const float beta = sigmoidf_(bf(in.b[int64_t(b) * H + h]));
  // v channel of row row0 + lane (lanes < kRows), conv state read and written here.
  // Also the output gate and norm weight of that row, needed only at the very end.
  float vconv = 0.f, gate_in = 0.f, onw = 0.f;
  if (lane < kRows) {
    const int cv = h * D + row0 + lane;
    uint16_t* s3 = cst + int64_t(2 * HK + cv) * 3;
    const float* w = p.conv_v + int64_t(cv) * 4;
    const uint16_t x0 = s3[0], x1 = s3[1], x2 = s3[2];
    const uint16_t xn = in.v[xrow + cv];
    float acc = 0.f;
    acc += w[0] * bf(x0);
    acc += w[1] * bf(x1);
    acc += w[2] * bf(x2);
    acc += w[3] * bf(xn);
    s3[0] = x1;
    s3[1] = x2;
    s3[2] = xn;
    vconv = round_bf(siluf_(acc));
    gate_in = bf(in.gate[int64_t(b) * HK + cv]);
    onw = p.o_norm_w[row0 + lane];
  }
  float4 q4, k4, a4;
  {
    float sq = 0.f, sk = 0.f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      sq += qv[j] * qv[j];
      sk += kv[j] * kv[j];
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
    const float mq = 1.0f / sqrtf(sq + p.l2_eps), mk = 1.0f / sqrtf(sk + p.l2_eps);
    const float scale = 1.0f / sqrtf(float(D));
    q4 = make_float4((qv[0] * mq) * scale, (qv[1] * mq) * scale, (qv[2] * mq) * scale,
                     (qv[3] * mq) * scale);
    k4 = make_float4(kv[0] * mk, kv[1] * mk, kv[2] * mk, kv[3] * mk);
    a4 = make_float4(expf(gate_value(p.gate_form, a, zv[0] + dt.x, p.lower_bound)),
                     expf(gate_value(p.gate_form, a, zv[1] + dt.y, p.lower_bound)),
                     expf(gate_value(p.gate_form, a, zv[2] + dt.z, p.lower_bound)),
                     expf(gate_value(p.gate_form, a, zv[3] + dt.w, p.lower_bound)));
  }

  // 3. The recurrence on this warp's rows: decay, prediction, delta update, output.
  float pr[kRows];
#pragma unroll
  for (int i = 0; i < kRows; i++) {
    s[i].x *= a4.x;
    s[i].y *= a4.y;
    s[i].z *= a4.z;
    s[i].w *= a4.w;
    pr[i] = s[i].x * k4.x + s[i].y * k4.y + s[i].z * k4.z + s[i].w * k4.w;
  }
#pragma unroll
  for (int i = 0; i < kRows; i++) pr[i] = warp_sum(pr[i]);
#pragma unroll
  for (int i = 0; i < kRows; i++) {
    const float u = beta * (__shfl_sync(0xffffffffu, vconv, i) - pr[i]);
    s[i].x += k4.x * u;
    s[i].y += k4.y * u;
    s[i].z += k4.z * u;
    s[i].w += k4.w * u;
    pr[i] = s[i].x * q4.x + s[i].y * q4.y + s[i].z * q4.z + s[i].w * q4.w;
    reinterpret_cast<float4*>(Sh + i * D)[lane] = s[i];
  }
#pragma unroll
  for (int i = 0; i < kRows; i++) pr[i] = warp_sum(pr[i]);

  // 4. Gated output norm over all 128 v (o rounded to bf16 first, spec §4.9). Every lane holds
  // all of the warp's outputs; lane i < kRows keeps row i's.
  float ss = 0.f, o_mine = 0.f;
#pragma unroll
  for (int i = 0; i < kRows; i++) {
    const float o = round_bf(pr[i]);
    ss += o * o;
    if (lane == i) o_mine = o;
  }
  if constexpr (kSplit > 1) {
    cluster_wait();
    if (lane < kSplit) st_cluster(&ss_part[rank * kWarps + warp], uint32_t(lane), ss);
    cluster_arrive_release();
    cluster_wait();
  } else {
    if (lane == 0) ss_part[warp] = ss;
    __syncthreads();
  }
  float tot = 0.f;
#pragma unroll
  for (int i = 0; i < kSplit * kWarps; i++) tot += ss_part[i];
  const float rstd = 1.0f / sqrtf(tot / float(D) + p.o_norm_eps);
  if (lane < kRows) {
    const int64_t at = int64_t(b) * HK + h * D + row0 + lane;
    if (o_raw) o_raw[at] = to_bf(o_mine);
    y[at] = to_bf(o_mine * rstd * onw * sigmoidf_(gate_in));
  }
  // The q/k conv state: every CTA of the head has read it (the barrier above).
  if (rank == 0 && warp == 0) {
    uint2* dq = reinterpret_cast<uint2*>(cst + int64_t(c) * 3);
    uint2* dk = reinterpret_cast<uint2*>(cst + int64_t(HK + c) * 3);
#pragma unroll
    for (int i = 0; i < 3; i++) {
      dq[i] = nq[i];
      dk[i] = nk[i];
    }
  }
}

template <int kSplit>
Status launch(const Params& p, const Inputs& in, int B, State st, uint16_t* y, uint16_t* o_raw,
              cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(p.H * kSplit, B);
  cfg.blockDim = dim3(Shape<kSplit>::kThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kSplit;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = kSplit > 1 ? 1 : 0;
  return status_of(cudaLaunchKernelEx(&cfg, decode_step<kSplit>, p, in, st, y, o_raw));
}

}  // namespace

int decode_split_for(int B) {
  return B <= 2 ? 8 : B <= 8 ? 4 : B <= 24 ? 2 : 1;
}

Status decode(const Params& p, const Inputs& in, int B, State st, uint16_t* y, uint16_t* o_raw,
              void* stream, int split) {
  if (Status s = check_params(p, in, st); !s.ok()) return s;
  if (B < 1 || B > 65535) return invalid("kda decode: B must be 1 .. 65535");
  if (!y) return invalid("kda decode: y is null");
  // A lane loads 4 channels at once: 8 bytes of q, k, z and conv state, 16 of the fp32 params.
  const auto misaligned = [](const void* ptr, uintptr_t n) {
    return reinterpret_cast<uintptr_t>(ptr) % n != 0;
  };
  if (in.qkv_stride % 4 != 0 || misaligned(in.q, 8) || misaligned(in.k, 8) || misaligned(in.z, 8) ||
      misaligned(st.conv, 8) || misaligned(st.recurrent, 16) || misaligned(p.conv_q, 16) ||
      misaligned(p.conv_k, 16) || misaligned(p.dt_bias, 16))
    return invalid(
        "kda decode: q, k, z and the conv state must be 8-byte aligned (qkv_stride a multiple "
        "of 4), the recurrent state, conv_q, conv_k and dt_bias 16-byte aligned");
  if (split == 0) split = decode_split_for(B);
  auto s = static_cast<cudaStream_t>(stream);
  switch (split) {
    case 1:
      return launch<1>(p, in, B, st, y, o_raw, s);
    case 2:
      return launch<2>(p, in, B, st, y, o_raw, s);
    case 4:
      return launch<4>(p, in, B, st, y, o_raw, s);
    case 8:
      return launch<8>(p, in, B, st, y, o_raw, s);
    default:
      return invalid("kda decode: split must be 0 (by B), 1, 2, 4 or 8");
  }
}

}  // namespace strata::kernels::kda
