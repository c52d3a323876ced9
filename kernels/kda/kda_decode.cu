// KDA decode step for a batch of sequences (see kda.h). The 128 state rows (one per v) of a
// (head, sequence) are independent given q, k, the decay and β, so they are split over `split`
// CTAs of 256 threads (1, 2, 4 or 8; a thread-block cluster when > 1). Every CTA:
//   1. (split > 1) issues the loads of its state rows first (a float4 of k per lane, kRows rows
//      per warp), so they are in flight during the dependent chain below;
//   2. redoes the per-head prep, one job per thread: thread t < 128 the conv + SiLU of q channel
//      t (and of v channel t of its own rows), thread 128 + t that of k channel t and the decay
//      of channel t; per-warp sums of squares for the L2 norms; one block barrier;
//   3. updates its rows in registers and stores them (64 KiB per head read and written once);
//   4. exchanges the per-warp sums of o² (the gated RMSNorm runs over all 128 v) through shared
//      memory — distributed shared memory across the cluster — and writes y for its rows.
// A v channel's conv state is read and written by the one thread that owns it; the q/k conv
// state is read by every CTA of the head, so at split > 1 rank 0 writes it after the closing
// barrier.
// Small B wants many CTAs per head (B = 1: 96 heads would fill 96 of 132 SMs with one long
// dependent chain each); large B has CTAs enough and prefers no redundant prep. At split 1 the
// state loads come after the barrier: holding them across the prep costs registers, hence
// CTAs per SM, and other CTAs hide the prep there.
#include "kernels/kda/kda_common.cuh"
#include "kernels/ops/row_cluster.cuh"

namespace strata::kernels::kda {
namespace {

using namespace detail;

constexpr int D = kD;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Rows per warp for a split: 16 at split 1 (64 KiB in flight per CTA for large B), 2 at split 8.
template <int kSplit>
__host__ __device__ constexpr int rows_per_warp() {
  return D / kSplit / kWarps;
}

// CTAs per SM the registers must allow: split 8 (768 CTAs at B = 1) needs 6 for (almost) all to
// be resident at once; split 1 (large B) keeps 4 × 64 KiB of state loads in flight per SM.
template <int kSplit>
__host__ __device__ constexpr int min_ctas_per_sm() {
  return kSplit == 8 ? 6 : kSplit == 1 ? 4 : 1;
}

// Conv + SiLU of one channel with its 3-entry state (oldest first) and new input; the new state
// is returned in ns for a later store. The same order of operations as the reference.
__device__ __forceinline__ float conv1(const uint16_t* s3, uint16_t xn, const float* w,
                                       uint16_t (&ns)[3]) {
  const uint16_t x0 = s3[0], x1 = s3[1], x2 = s3[2];
  float acc = 0.f;
  acc += w[0] * bf(x0);
  acc += w[1] * bf(x1);
  acc += w[2] * bf(x2);
  acc += w[3] * bf(xn);
  ns[0] = x1;
  ns[1] = x2;
  ns[2] = xn;
  return round_bf(siluf_(acc));
}

// Store to the shared memory of CTA `rank` of the cluster at the address of `p` in this CTA.
__device__ __forceinline__ void st_cluster(float* p, uint32_t rank, float v) {
  const uint32_t local = uint32_t(__cvta_generic_to_shared(p));
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(remote), "f"(v) : "memory");
}

template <int kSplit>
__global__ void __launch_bounds__(kThreads, min_ctas_per_sm<kSplit>())
    decode_step(Params p, Inputs in, State st, uint16_t* y, uint16_t* o_raw) {
  constexpr int kRows = rows_per_warp<kSplit>(), kCtaRows = D / kSplit;
  const int H = p.H, HK = H * D;
  const int h = blockIdx.x / kSplit, b = blockIdx.y;
  const int rank = kSplit == 1 ? 0 : int(cluster_ctarank());
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int cta_row0 = rank * kCtaRows, row0 = cta_row0 + warp * kRows;  // first v of CTA, warp
  __shared__ __align__(16) float qn[D], kn[D], al[D];
  __shared__ float vv[kCtaRows], ss_qk[kWarps], ss_part[kSplit * kWarps];

  // 1. The state rows, before anything they do not depend on (split > 1).
  float* Sh = st.recurrent + (int64_t(b) * H + h) * D * D + int64_t(row0) * D;
  float4 s[kRows];
  grid_dependency_wait();
  if constexpr (kSplit > 1) {
#pragma unroll
    for (int i = 0; i < kRows; i++) s[i] = reinterpret_cast<const float4*>(Sh + i * D)[lane];
    // Every CTA of the cluster must have started before any writes to its shared memory
    // (step 4); arrive now, wait just before those writes.
    cluster_arrive_relaxed();
  }

  // 2. Per-head prep. Thread t: q channel t (t < 128) or k channel t − 128.
  uint16_t* cst = st.conv + int64_t(b) * 3 * HK * 3;
  const int64_t xrow = int64_t(b) * in.qkv_stride;
  const bool is_q = tid < D;
  const int d = tid % D, ch = h * D + d;
  const float beta = sigmoidf_(bf(in.b[int64_t(b) * H + h]));
  uint16_t nqk[3];
  const float x = conv1(cst + int64_t(is_q ? ch : HK + ch) * 3, (is_q ? in.q : in.k)[xrow + ch],
                        (is_q ? p.conv_q : p.conv_k) + int64_t(ch) * 4, nqk);
  (is_q ? qn : kn)[d] = x;
  uint16_t* s3qk = cst + int64_t(is_q ? ch : HK + ch) * 3;
  if constexpr (kSplit == 1) {  // this thread is the channel's only reader
    s3qk[0] = nqk[0];
    s3qk[1] = nqk[1];
    s3qk[2] = nqk[2];
  }
  const float ssx = warp_sum(x * x);
  if (lane == 0) ss_qk[warp] = ssx;
  if (is_q) {
    if (d < kCtaRows) {  // v channel of this CTA's row d: read and written only here
      const int cv = h * D + cta_row0 + d;
      uint16_t* s3 = cst + int64_t(2 * HK + cv) * 3;
      uint16_t nv[3];
      vv[d] = conv1(s3, in.v[xrow + cv], p.conv_v + int64_t(cv) * 4, nv);
      s3[0] = nv[0];
      s3[1] = nv[1];
      s3[2] = nv[2];
    }
  } else {
    const float a = expf(p.A_log[h]);
    const float g =
        gate_value(p.gate_form, a, bf(in.z[int64_t(b) * HK + ch]) + p.dt_bias[ch], p.lower_bound);
    al[d] = expf(g);
  }
  // Output gate and norm weight of row row0 + lane (lanes < kRows), used at the very end: loaded
  // here where latency matters (split > 1), at the end where registers do (split 1).
  float gate_in = 0.f, onw = 0.f;
  const int64_t y_at = int64_t(b) * HK + h * D + row0 + lane;
  auto load_gate = [&] {
    if (lane < kRows) {
      gate_in = bf(in.gate[y_at]);
      onw = p.o_norm_w[row0 + lane];
    }
  };
  if constexpr (kSplit > 1) load_gate();
  __syncthreads();
  float4 q4 = reinterpret_cast<const float4*>(qn)[lane];
  float4 k4 = reinterpret_cast<const float4*>(kn)[lane];
  const float4 a4 = reinterpret_cast<const float4*>(al)[lane];
  {
    float sq = 0.f, sk = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps / 2; w++) {
      sq += ss_qk[w];
      sk += ss_qk[kWarps / 2 + w];
    }
    const float mq = 1.0f / sqrtf(sq + p.l2_eps), mk = 1.0f / sqrtf(sk + p.l2_eps);
    const float scale = 1.0f / sqrtf(float(D));
    q4 = make_float4((q4.x * mq) * scale, (q4.y * mq) * scale, (q4.z * mq) * scale,
                     (q4.w * mq) * scale);
    k4 = make_float4(k4.x * mk, k4.y * mk, k4.z * mk, k4.w * mk);
  }
  if constexpr (kSplit == 1) {
#pragma unroll
    for (int i = 0; i < kRows; i++) s[i] = reinterpret_cast<const float4*>(Sh + i * D)[lane];
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
    const float u = beta * (vv[warp * kRows + i] - pr[i]);
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
    cluster_arrive();
    cluster_wait();
  } else {
    if (lane == 0) ss_part[warp] = ss;
    __syncthreads();
  }
  if constexpr (kSplit == 1) load_gate();
  float tot = 0.f;
#pragma unroll
  for (int i = 0; i < kSplit * kWarps; i++) tot += ss_part[i];
  const float rstd = 1.0f / sqrtf(tot / float(D) + p.o_norm_eps);
  if (lane < kRows) {
    if (o_raw) o_raw[y_at] = to_bf(o_mine);
    y[y_at] = to_bf(o_mine * rstd * onw * sigmoidf_(gate_in));
  }
  // The q/k conv state at split > 1: every CTA of the head has read it (the barrier above).
  if (kSplit > 1 && rank == 0) {
    s3qk[0] = nqk[0];
    s3qk[1] = nqk[1];
    s3qk[2] = nqk[2];
  }
}

template <int kSplit>
Status launch(const Params& p, const Inputs& in, int B, State st, uint16_t* y, uint16_t* o_raw,
              cudaStream_t stream) {
  // A programmatic dependent launch on a created stream (the legacy stream serializes anyway):
  // the launch and ramp-up of the grid overlap the previous kernel's tail; every CTA waits in
  // grid_dependency_wait before its first read. The grid itself does not trigger its dependents
  // early (they launch at its end): H100 machine, bench kernels --filter kda, B=1 graph x20
  // (2026-12-06, two rounds interleaved): plain 5.39 / 5.37 us, PDL 5.08 / 5.10, PDL with the
  // next launch allowed at each CTA's start 5.20 / 5.17.
  return launch_ex(decode_step<kSplit>, dim3(p.H * kSplit, B), dim3(kThreads), 0, unsigned(kSplit),
                   stream != nullptr, stream, p, in, st, y, o_raw);
}

}  // namespace

// Measured on the H200 (strata bench kernels --filter kda, 2026-11-29 21:24 UTC): splitting a
// head over a cluster never paid — B = 1: split 1 8.19 µs, 2 9.02, 4 9.41, 8 12.21; B = 16:
// 60.7 / 70.5 / 84.1 / 108.0 µs; B = 64: 218.8 / 266.9 / 313.2 / 408.6 µs. The redundant per-CTA
// q/k prep and the cluster barriers cost more than the extra CTAs win, so every B takes split 1;
// the other splits stay selectable (and tested) for other GPUs.
int decode_split_for(int B) {
  (void)B;
  return 1;
}

Status decode(const Params& p, const Inputs& in, int B, State st, uint16_t* y, uint16_t* o_raw,
              void* stream, int split) {
  if (Status s = check_params(p, in, st); !s.ok()) return s;
  if (B < 1 || B > 65535) return invalid("kda decode: B must be 1 .. 65535");
  if (!y) return invalid("kda decode: y is null");
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
