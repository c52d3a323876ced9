// Driver of the fast bf16 linear layers (cpu/bf16_linear.h): ISA dispatch by CPUID, the scalar
// GEMV (tests; CPUs without AVX2), the TBB row split of the GEMV, and the oneDNN matmul wrapper
// (primitive cache, column/row slices per TBB thread, one OpenMP thread inside each slice).
#include "cpu/bf16_linear.h"

#include <cpuid.h>
#include <dlfcn.h>
#include <tbb/blocked_range.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <vector>

#include "cpu/amx.h"
#include "storage/bf16.h"
#include "storage/error.h"

namespace strata::cpu {

// ------------------------------------------------------------------------------------------------
// ISA selection

const char* gemv_isa_name(GemvIsa isa) {
  switch (isa) {
    case GemvIsa::automatic:
      return "auto";
    case GemvIsa::scalar:
      return "scalar";
    case GemvIsa::avx2:
      return "avx2";
    case GemvIsa::avx512bf16:
      return "avx512bf16";
    case GemvIsa::amx:
      return "amx";
  }
  return "?";
}

GemvIsa parse_gemv_isa(const std::string& s, const std::string& what) {
  for (GemvIsa i :
       {GemvIsa::automatic, GemvIsa::scalar, GemvIsa::avx2, GemvIsa::avx512bf16, GemvIsa::amx})
    if (s == gemv_isa_name(i)) return i;
  throw Error(what + ": unknown GEMV ISA '" + s +
              "', expected auto, scalar, avx2, avx512bf16 or amx");
}

bool gemv_isa_supported(GemvIsa isa) {
  switch (isa) {
    case GemvIsa::automatic:
    case GemvIsa::scalar:
      return true;
    case GemvIsa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case GemvIsa::avx512bf16:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
    case GemvIsa::amx: {
      // AMX-BF16 (CPUID.7.0:EDX[22]) and tile data granted to this process (detail::amx_ready).
      // Once: a CPUID in a virtual machine exits to the hypervisor (≈ 30 µs on the dev VM).
      static const bool ok = [] {
        unsigned a = 0, b = 0, c = 0, d = 0;
        return __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 22) & 1u) &&
               gemv_isa_supported(GemvIsa::avx512bf16) && detail::amx_ready();
      }();
      return ok;
    }
  }
  return false;
}

GemvIsa best_gemv_isa() {
  static const GemvIsa best = [] {
    for (GemvIsa i : {GemvIsa::amx, GemvIsa::avx512bf16, GemvIsa::avx2})
      if (gemv_isa_supported(i)) return i;
    return GemvIsa::scalar;
  }();
  return best;
}

GemvIsa resolve_gemv_isa(GemvIsa isa) {
  if (isa == GemvIsa::automatic) return best_gemv_isa();
  if (!gemv_isa_supported(isa))
    throw Error(
        std::string("bf16 GEMV: ISA '") + gemv_isa_name(isa) +
        "' is not supported by this CPU (best available: " + gemv_isa_name(best_gemv_isa()) + ")");
  return isa;
}

// ------------------------------------------------------------------------------------------------
// Conversion and the GEMV

void to_bf16(const float* x, uint16_t* out, int64_t n) {
  static const bool vec = gemv_isa_supported(GemvIsa::avx512bf16);
  if (vec) return detail::to_bf16_avx512bf16(x, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(x[i]);
}

namespace {

void gemv_rows_scalar(const detail::GemvArgs& a, int64_t r0, int64_t r1) {
  for (int64_t t = 0; t < a.T; ++t) {
    const uint16_t* x = a.xb + t * a.ldx;
    for (int64_t r = r0; r < r1; ++r) {
      const uint16_t* w = a.W + r * a.ldw;
      float s = 0.0f;
      for (int64_t k = 0; k < a.K; ++k) s += bf16_to_f32(w[k]) * bf16_to_f32(x[k]);
      a.y[t * a.ldy + r] = a.round_out ? round_bf16(s) : s;
    }
  }
}

// Activations in bf16, rows padded with zeros to a multiple of 32 (the AVX-512 kernel reads whole
// 32-column steps of x). One grow-only buffer per calling thread: nothing is allocated once warm.
const uint16_t* bf16_activations(const float* x, int64_t T, int64_t K, int64_t* ldx) {
  thread_local std::vector<uint16_t> buf;
  const int64_t ld = (K + 31) / 32 * 32;
  if (buf.size() < size_t(T * ld)) buf.resize(size_t(T * ld));
  for (int64_t t = 0; t < T; ++t) {
    to_bf16(x + t * K, buf.data() + t * ld, K);
    std::fill(buf.begin() + t * ld + K, buf.begin() + (t + 1) * ld, uint16_t(0));
  }
  *ldx = ld;
  return buf.data();
}

}  // namespace

namespace {
using RowKernel = void (*)(const detail::GemvArgs&, int64_t, int64_t);
// The AMX kernel for calls of at least kAmxMinTokens tokens; fewer take the AVX-512 kernel, which
// reads W at memory speed there (one sequential stream per thread; AMX's 16-row tile loads were
// 10–30 % slower at one token on k3-mini's 2 KiB rows) and is compute-bound only from about 5.
constexpr int64_t kAmxMinTokens = 5;
RowKernel row_kernel(GemvIsa isa, int64_t T) {
  if (isa == GemvIsa::amx && T < kAmxMinTokens) isa = GemvIsa::avx512bf16;
  return isa == GemvIsa::amx          ? detail::gemv_rows_amx
         : isa == GemvIsa::avx512bf16 ? detail::gemv_rows_avx512bf16
         : isa == GemvIsa::avx2       ? detail::gemv_rows_avx2
                                      : gemv_rows_scalar;
}

// Tokens one pass of each row kernel serves (AVX-512: 4 rows × up to 4 tokens, 2 rows × 5 to 8;
// AVX2: 2; scalar: 1). With more tokens the kernel passes over its rows once per token group.
int64_t tokens_per_pass(RowKernel k) {
  return k == detail::gemv_rows_amx          ? 16
         : k == detail::gemv_rows_avx512bf16 ? 8
         : k == detail::gemv_rows_avx2       ? 2
                                             : 1;
}

// AMX: x as B tiles, once per call, in a grow-only buffer of the calling thread (the row tasks
// read it from the other threads).
const uint16_t* amx_activations(RowKernel k, const uint16_t* xb, int64_t ldx, int64_t T,
                                int64_t K) {
  if (k != detail::gemv_rows_amx) return nullptr;
  thread_local std::vector<uint16_t> buf;
  detail::pack_amx_activations(xb, ldx, T, K, buf);
  return buf.data();
}

// kernel(a, r0, r1), in tiles of rows small enough for L2 (≈ 256 KiB of weights, whole groups of
// 8) when a.T needs several passes: every pass after the first reads the tile from L2 instead of
// memory. (A thread's range is up to 1/4 of its share of a matrix — megabytes — so untiled, 5 to 8
// tokens on AVX-512 read every weight twice.) Each output's sum is the same either way.
void run_rows(RowKernel kernel, const detail::GemvArgs& a, int64_t r0, int64_t r1) {
  if (a.T <= tokens_per_pass(kernel)) return kernel(a, r0, r1);
  const int64_t tile = std::max<int64_t>(8, (256 << 10) / (a.K * 2) / 8 * 8);
  for (int64_t r = r0; r < r1; r += tile) kernel(a, r, std::min(r1, r + tile));
}

// The row groups of all outputs as one index space, split over the arena's threads: tasks of 256
// KiB of weights (per-task overhead small against ~25 µs of streaming; 64 KiB tasks measured 3-6%
// slower), in groups of 8 rows so the kernels' row blocks stay whole, and at least 4 tasks per
// thread so the threads finish together.
template <class Run>
void split_rows(int64_t total_rows_in_groups, int64_t K, Run&& run) {
  constexpr int64_t kGroup = 8;
  const int64_t threads = std::max(1, tbb::this_task_arena::max_concurrency());
  const int64_t grain =
      std::clamp<int64_t>((256 << 10) / (kGroup * K * 2), 1,
                          std::max<int64_t>(1, total_rows_in_groups / (4 * threads)));
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, total_rows_in_groups, grain),
                    [&](const tbb::blocked_range<int64_t>& r) { run(r.begin(), r.end()); });
}
}  // namespace

void gemv_bf16(const float* x, int64_t T, const uint16_t* W, int64_t N, int64_t K, int64_t ldw,
               float* y, int64_t ldy, bool round_out, GemvIsa isa) {
  STRATA_ASSERT(T >= 0 && N >= 0 && K > 0 && ldw >= K && ldy >= N);
  if (T == 0 || N == 0) return;
  const RowKernel kernel = row_kernel(resolve_gemv_isa(isa), T);
  detail::GemvArgs a;
  a.xb = bf16_activations(x, T, K, &a.ldx);
  a.xp = amx_activations(kernel, a.xb, a.ldx, T, K);
  a.T = T;
  a.K = K;
  a.W = W;
  a.ldw = ldw;
  a.y = y;
  a.ldy = ldy;
  a.round_out = round_out;
  split_rows((N + 7) / 8, K,
             [&](int64_t g0, int64_t g1) { run_rows(kernel, a, g0 * 8, std::min(N, g1 * 8)); });
}

void gemv_bf16_multi(const float* x, int64_t T, int64_t K, std::span<const GemvOut> outs,
                     GemvIsa isa) {
  STRATA_ASSERT(T >= 0 && K > 0);
  if (T == 0 || outs.empty()) return;
  const RowKernel kernel = row_kernel(resolve_gemv_isa(isa), T);
  int64_t ldx = 0;
  const uint16_t* xb = bf16_activations(x, T, K, &ldx);
  const uint16_t* xp = amx_activations(kernel, xb, ldx, T, K);
  // Group offsets of each output in the joint index space.
  std::vector<int64_t> first(outs.size() + 1, 0);
  for (size_t i = 0; i < outs.size(); ++i) first[i + 1] = first[i] + (outs[i].N + 7) / 8;
  split_rows(first.back(), K, [&](int64_t g0, int64_t g1) {
    size_t i = size_t(std::upper_bound(first.begin(), first.end(), g0) - first.begin()) - 1;
    for (int64_t g = g0; g < g1 && i < outs.size(); ++i) {
      const GemvOut& o = outs[i];
      const int64_t end = std::min(g1, first[i + 1]);
      detail::GemvArgs a;
      a.xb = xb;
      a.ldx = ldx;
      a.xp = xp;
      a.T = T;
      a.K = K;
      a.W = o.W;
      a.ldw = K;
      a.y = o.y;
      a.ldy = o.N;
      a.round_out = o.round_out;
      run_rows(kernel, a, (g - first[i]) * 8, std::min(o.N, (end - first[i]) * 8));
      g = end;
    }
  });
}

// ------------------------------------------------------------------------------------------------
// oneDNN

namespace {

// libgomp is loaded with libdnnl; its setters are found at run time (no -fopenmp in our build).
struct OmpThreads {
  using Set = void (*)(int);
  using Get = int (*)();
  Set set = reinterpret_cast<Set>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  Get get = reinterpret_cast<Get>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
};
const OmpThreads& omp() {
  static const OmpThreads o;
  return o;
}

// Holds the calling thread's OpenMP team at one thread while a primitive runs inside a TBB task.
struct OneOmpThread {
  int old = 1;
  OneOmpThread() {
    if (omp().get && omp().set && (old = omp().get()) != 1) omp().set(1);
  }
  ~OneOmpThread() {
    if (old != 1) omp().set(old);
  }
};

}  // namespace

struct OnednnBf16Gemm::Impl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  struct Prim {
    dnnl::matmul mm;
    dnnl::memory::desc src, wei, dst, scratch;
    std::string impl;
  };
  mutable std::mutex mu;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, std::unique_ptr<Prim>> cache;
  struct Scratch {
    std::vector<float> dst;
    std::vector<uint8_t> pad;
    std::unique_ptr<dnnl::stream> stream;
  };
  tbb::enumerable_thread_specific<Scratch> scratch;
  tbb::enumerable_thread_specific<std::vector<uint16_t>> xb;

  // A single-threaded primitive for x [M, K] (dense bf16) · W_sliceᵀ (n rows of stride ldw) →
  // dense fp32 [M, n]. Created on first use, then reused.
  const Prim& get(int64_t M, int64_t K, int64_t n, int64_t ldw) {
    std::lock_guard<std::mutex> lock(mu);
    auto& p = cache[{M, K, n, ldw}];
    if (!p) {
      using dt = dnnl::memory::data_type;
      p = std::make_unique<Prim>();
      p->src = dnnl::memory::desc({M, K}, dt::bf16, dnnl::memory::dims{K, 1});
      p->wei = dnnl::memory::desc({K, n}, dt::bf16, dnnl::memory::dims{1, ldw});
      p->dst = dnnl::memory::desc({M, n}, dt::f32, dnnl::memory::dims{n, 1});
      dnnl::primitive_attr attr;
      // Our scratchpads, one per thread: the library's shared one is not safe for concurrent
      // execution unless oneDNN was built with DNNL_ENABLE_CONCURRENT_EXEC.
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      OneOmpThread one;  // the implementation is chosen for the thread count it will run with
      auto pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(p->src, p->wei, p->dst), attr, eng);
      p->scratch = pd.scratchpad_desc();
      p->impl = pd.impl_info_str();
      p->mm = dnnl::matmul(pd);
    }
    return *p;
  }
};

OnednnBf16Gemm::OnednnBf16Gemm() : impl_(std::make_unique<Impl>()) {}
OnednnBf16Gemm::~OnednnBf16Gemm() = default;

size_t OnednnBf16Gemm::cached_primitives() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->cache.size();
}

namespace {
// The slicing of y [M, N] over the arena's threads: about 4 slices per thread, so that a thread
// descheduled for a while (a shared machine) delays the call by one slice, not by a thread's whole
// share (2 slices on the 2-core VM: 256x1024x1024 took 0.7 ms or, often, 10-13 ms). Column
// slices are multiples of 64 (the brgemm AMX blocking); when N gives fewer slices than that, the
// rows are split too (≥ 32 rows each).
struct Slicing {
  int64_t n_per = 0, n_slices = 0, m_per = 0, m_slices = 0;
};
Slicing slice(int64_t M, int64_t N, int64_t K) {
  const int64_t threads = std::max(1, tbb::this_task_arena::max_concurrency());
  const int64_t target = threads == 1 ? 1 : 4 * threads;
  Slicing s;
  s.n_slices = std::max<int64_t>(1, std::min(target, (N + 63) / 64));
  s.n_per = ((N + s.n_slices - 1) / s.n_slices + 63) / 64 * 64;
  // Short K: at most 256 columns, so a slice's weights (≤ 1 MiB) stay in L2 while its rows of x
  // stream past (one thread, M=1024, K=1024: 0.89 TFLOP/s at 256 columns, 0.75 at 512). Long K:
  // wider slices, so x (M·K·2 bytes) is re-read fewer times.
  if (K <= 2048 && threads > 1) s.n_per = std::min<int64_t>(s.n_per, 256);
  s.n_slices = (N + s.n_per - 1) / s.n_per;
  s.m_slices = std::max<int64_t>(1, std::min(target / s.n_slices, M / 32));
  s.m_per = (M + s.m_slices - 1) / s.m_slices;
  s.m_slices = (M + s.m_per - 1) / s.m_per;
  return s;
}
}  // namespace

std::string OnednnBf16Gemm::impl_info(int64_t M, int64_t N, int64_t K) {
  const Slicing s = slice(M, N, K);
  return impl_->get(std::min(M, s.m_per), K, std::min(N, s.n_per), K).impl;
}

void OnednnBf16Gemm::run(const uint16_t* xb, int64_t M, const uint16_t* W, int64_t N, int64_t K,
                         int64_t ldw, float* y, int64_t ldy, bool round_out) {
  STRATA_ASSERT(M >= 0 && N >= 0 && K > 0 && ldw >= K && ldy >= N);
  if (M == 0 || N == 0) return;
  const Slicing s = slice(M, N, K);
  tbb::parallel_for(int64_t(0), s.n_slices * s.m_slices, [&](int64_t i) {
    const int64_t n0 = (i % s.n_slices) * s.n_per, n = std::min(s.n_per, N - n0);
    const int64_t m0 = (i / s.n_slices) * s.m_per, m = std::min(s.m_per, M - m0);
    const Impl::Prim& p = impl_->get(m, K, n, ldw);
    Impl::Scratch& sc = impl_->scratch.local();
    if (!sc.stream) sc.stream = std::make_unique<dnnl::stream>(impl_->eng);
    if (sc.dst.size() < size_t(m * n)) sc.dst.resize(size_t(m * n));
    if (sc.pad.size() < p.scratch.get_size()) sc.pad.resize(p.scratch.get_size());
    {
      OneOmpThread one;
      dnnl::memory src(p.src, impl_->eng, const_cast<uint16_t*>(xb + m0 * K));
      dnnl::memory wei(p.wei, impl_->eng, const_cast<uint16_t*>(W + n0 * ldw));
      dnnl::memory dst(p.dst, impl_->eng, sc.dst.data());
      dnnl::memory pad(p.scratch, impl_->eng, sc.pad.data());
      p.mm.execute(*sc.stream, {{DNNL_ARG_SRC, src},
                                {DNNL_ARG_WEIGHTS, wei},
                                {DNNL_ARG_DST, dst},
                                {DNNL_ARG_SCRATCHPAD, pad}});
      sc.stream->wait();
    }
    // Into y, with the bf16 output rounding fused in (the slice is still in L2).
    for (int64_t r = 0; r < m; ++r) {
      const float* src = sc.dst.data() + r * n;
      float* dst = y + (m0 + r) * ldy + n0;
      if (round_out)
        for (int64_t j = 0; j < n; ++j) dst[j] = round_bf16(src[j]);
      else
        std::copy(src, src + n, dst);
    }
  });
}

void OnednnBf16Gemm::run(const float* x, int64_t M, const uint16_t* W, int64_t N, int64_t K,
                         int64_t ldw, float* y, int64_t ldy, bool round_out) {
  std::vector<uint16_t>& xb = impl_->xb.local();
  if (xb.size() < size_t(M * K)) xb.resize(size_t(M * K));
  // Rows converted in parallel (at prefill sizes this is megabytes).
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, M, 16), [&](const tbb::blocked_range<int64_t>& r) {
        to_bf16(x + r.begin() * K, xb.data() + r.begin() * K, (r.end() - r.begin()) * K);
      });
  run(xb.data(), M, W, N, K, ldw, y, ldy, round_out);
}

// ------------------------------------------------------------------------------------------------
// The dispatcher

Bf16Linear::Bf16Linear(GemvIsa isa, int64_t gemv_max_tokens)
    : isa_(resolve_gemv_isa(isa)), gemv_max_tokens_(gemv_max_tokens) {}
Bf16Linear::~Bf16Linear() = default;

void Bf16Linear::multi(const float* x, int64_t T, int64_t K, std::span<const Out> outs) {
  if (T > gemv_max_tokens_) {
    for (const Out& o : outs) (*this)(x, T, *o.W, o.y, o.round_out);
    return;
  }
  std::vector<GemvOut> g;
  g.reserve(outs.size());
  for (const Out& o : outs) {
    STRATA_ASSERT(o.W->format == ref::WeightFormat::bf16 && o.W->cols == K);
    g.push_back({static_cast<const uint16_t*>(o.W->data), o.W->rows, o.y, o.round_out});
  }
  gemv_bf16_multi(x, T, K, g, isa_);
}

void Bf16Linear::operator()(const float* x, int64_t T, const ref::WeightView& W, float* y,
                            bool round_out) {
  STRATA_ASSERT(W.format == ref::WeightFormat::bf16);
  const auto* w = static_cast<const uint16_t*>(W.data);
  if (T <= gemv_max_tokens_)
    gemv_bf16(x, T, w, W.rows, W.cols, W.cols, y, W.rows, round_out, isa_);
  else
    gemm_.run(x, T, w, W.rows, W.cols, W.cols, y, W.rows, round_out);
}

}  // namespace strata::cpu
