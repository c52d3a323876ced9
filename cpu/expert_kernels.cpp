// Layer-level driver of the CPU expert FFN (cpu/expert_kernels.h): ISA dispatch by CPUID,
// activation quantization into the kernels' layout, and the TBB work decomposition. The scalar
// projection kernel lives here too (the path for tests and for CPUs without AVX2).
#include "cpu/expert_kernels.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

#include "cpu/expert_kernels_impl.h"
#include "cpu/ref/ops.h"
#include "storage/error.h"

namespace strata::cpu {

namespace c = strata::contract;

// ------------------------------------------------------------------------------------------------
// ISA selection

const char* isa_name(ExpertIsa isa) {
  switch (isa) {
    case ExpertIsa::automatic:
      return "auto";
    case ExpertIsa::scalar:
      return "scalar";
    case ExpertIsa::avx2:
      return "avx2";
    case ExpertIsa::avx512:
      return "avx512";
    case ExpertIsa::amx:
      return "amx";
  }
  return "?";
}

ExpertIsa parse_isa(const std::string& s, const std::string& what) {
  for (ExpertIsa i : {ExpertIsa::automatic, ExpertIsa::scalar, ExpertIsa::avx2, ExpertIsa::avx512,
                      ExpertIsa::amx})
    if (s == isa_name(i)) return i;
  throw Error(what + ": unknown expert kernel ISA '" + s +
              "', expected auto, scalar, avx2, avx512 or amx");
}

bool isa_supported(ExpertIsa isa) {
  switch (isa) {
    case ExpertIsa::automatic:
    case ExpertIsa::scalar:
      return true;
    case ExpertIsa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case ExpertIsa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni");
    case ExpertIsa::amx:
      return isa_supported(ExpertIsa::avx512) && detail::amx_ready();
  }
  return false;
}

ExpertIsa best_isa() {
  static const ExpertIsa best = [] {
    for (ExpertIsa i : {ExpertIsa::amx, ExpertIsa::avx512, ExpertIsa::avx2})
      if (isa_supported(i)) return i;
    return ExpertIsa::scalar;
  }();
  return best;
}

ExpertIsa resolve_isa(ExpertIsa isa) {
  if (isa == ExpertIsa::automatic) return best_isa();
  if (!isa_supported(isa))
    throw Error(std::string("expert kernels: ISA '") + isa_name(isa) +
                "' is not supported by this CPU (best available: " + isa_name(best_isa()) + ")");
  return isa;
}

// ------------------------------------------------------------------------------------------------
// Activations

namespace {

// One block in the kernels' layout (scalar): q into even[0..15] / even[64..79], *e, *sum = Σq.
// Returns 0 for a zero block, 1 for a nonzero one, 2 for a poisoned one (q = 0, e = 0).
int quantize_block_scalar(const float* x, int8_t* even, int* e, int32_t* sum) {
  int8_t qb[c::kBlock];
  const bool ok = c::quantize_block(x, qb, e);
  int32_t s = 0;
  bool nonzero = false;
  for (int j = 0; j < 16; ++j) {
    even[j] = qb[2 * j];
    even[64 + j] = qb[2 * j + 1];
    s += qb[2 * j] + qb[2 * j + 1];
    nonzero |= (qb[2 * j] | qb[2 * j + 1]) != 0;
  }
  *sum = s;
  return ok ? (nonzero ? 1 : 0) : 2;
}

}  // namespace

void QuantizedActivations::quantize(const float* x, int T, int K) {
  STRATA_ASSERT(T >= 0 && K > 0 && K % c::kBlock == 0);
  T_ = T;
  K_ = K;
  nb_ = K / c::kBlock;
  nbp_ = (nb_ + 15) / 16 * 16;
  const size_t nq = size_t(T) * size_t(nbp_) * 32, ne = size_t(T) * size_t(nbp_);
  // Grown, never shrunk: a reused object allocates nothing once warm.
  if (q_.size() < nq) q_.resize(nq);
  if (e_.size() < ne) e_.resize(ne), s_.resize(ne), ns_.resize(ne), px_.resize(ne), st_.resize(ne);
  if (span_.size() < size_t(T)) span_.resize(size_t(T)), poisoned_.resize(size_t(T));
  static const auto qblock =
      isa_supported(ExpertIsa::avx512) ? detail::quantize_block_avx512 : quantize_block_scalar;
  // Quad b/4: even columns at [0, 64), odd at [64, 128); block b % 4 at 16·(b % 4).
  auto blocks = [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) {
      const size_t t = i / size_t(nb_), b = i % size_t(nb_), tb = t * size_t(nbp_) + b;
      int8_t* even = q_.data() + t * size_t(nbp_) * 32 + (b / 4) * 128 + (b % 4) * 16;
      int e = 0;
      int32_t sum = 0;
      st_[tb] = uint8_t(qblock(x + t * size_t(K) + b * c::kBlock, even, &e, &sum));
      e_[tb] = e;
      s_[tb] = 12 * sum;
      ns_[tb] = -12 * sum;
      px_[tb] = c::pow2(e);
    }
  };
  const size_t n = size_t(T) * size_t(nb_);
  if (n >= 64) {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, n, 16),
                      [&](const tbb::blocked_range<size_t>& r) { blocks(r.begin(), r.end()); });
  } else {
    blocks(0, n);
  }
  for (int t = 0; t < T; ++t) {
    const size_t t0 = size_t(t) * size_t(nbp_);
    int8_t* qt = q_.data() + t0 * 32;
    for (int b = nb_; b < nbp_; ++b) {  // padding blocks: zero
      int8_t* even = qt + (b / 4) * 128 + (b % 4) * 16;
      std::fill(even, even + 16, int8_t(0));
      std::fill(even + 64, even + 80, int8_t(0));
      e_[t0 + size_t(b)] = 0, s_[t0 + size_t(b)] = 0, ns_[t0 + size_t(b)] = 0;
      px_[t0 + size_t(b)] = 1.0;
    }
    bool poisoned = false, any = false;
    int emin = 0, emax = 0;
    for (int b = 0; b < nb_; ++b) {
      const uint8_t st = st_[t0 + size_t(b)];
      poisoned |= st == 2;
      if (st == 1) {
        const int e = e_[t0 + size_t(b)];
        emin = any ? std::min(emin, e) : e;
        emax = any ? std::max(emax, e) : e;
        any = true;
      }
    }
    poisoned_[size_t(t)] = poisoned ? 1 : 0;
    span_[size_t(t)] = emax - emin;
  }
}

// ------------------------------------------------------------------------------------------------
// Scalar projection kernel: the contract loops over the quad layout.

namespace detail {

bool amx_ready() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!((d >> 24) & 1u) || !((d >> 25) & 1u)) return false;  // AMX-TILE, AMX-INT8
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    if (!__get_cpuid(1, &a1, &b1, &c1, &d1) || !((c1 >> 27) & 1u)) return false;  // OSXSAVE
    uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return false;  // XTILECFG, XTILEDATA enabled
    // Linux ≥ 5.16: tile data needs a per-process permission (ARCH_REQ_XCOMP_PERM, XTILEDATA).
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  }();
  return ok;
}

void amx_pack_tokens(const int8_t* const* q, const double* const* px, int n, int nb,
                     std::vector<int8_t>& tb, std::vector<double>& tpx) {
  const size_t ntg = size_t(n + 15) / 16, items = ntg * size_t(nb);
  // Grown, never shrunk; every byte of the first `items` entries is written below.
  if (tb.size() < items * 512) tb.resize(items * 512);
  if (tpx.size() < items * 16) tpx.resize(items * 16);
  auto pack = [&](size_t i0, size_t i1) {  // item i = (token group i / nb, block i % nb)
    for (size_t i = i0; i < i1; ++i) {
      const int tg = int(i / size_t(nb)), b = int(i % size_t(nb));
      int8_t* B = tb.data() + i * 512;
      double* P = tpx.data() + i * 16;
      for (int j = 0; j < 16; ++j) {
        const int t = tg * 16 + j;
        if (t < n) {
          const int8_t* qb = q[t] + (b / 4) * 128 + (b % 4) * 16;
          for (int k = 0; k < 8; ++k)
            std::memcpy(B + k * 64 + 4 * j, qb + (k / 4) * 64 + (k % 4) * 4, 4);
          P[j] = px[t][b];
        } else {
          for (int k = 0; k < 8; ++k) std::memset(B + k * 64 + 4 * j, 0, 4);
          P[j] = 1.0;
        }
      }
    }
  };
  if (items >= 64) {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, items, 16),
                      [&](const tbb::blocked_range<size_t>& r) { pack(r.begin(), r.end()); });
  } else {
    pack(0, items);
  }
}

int exact_span_limit(int nb) {
  if (nb <= 0) return -1;
  const double lim = 9007199254740992.0;  // 2^53
  int s = -1;
  while (s < 1000 && double(nb) * double(c::kMaxBlockDot) * c::pow2(s + 1) <= lim) ++s;
  return s;
}

void project_scalar(const ProjArgs& a) {
  const int row_bytes = a.K / 2;
  for (int o = a.r0; o < a.r1; ++o) {
    const uint8_t* prow = a.packed + size_t(o) * size_t(row_bytes);
    const uint8_t* srow = a.scale + size_t(o) * size_t(a.nb);
    for (int t = 0; t < a.n; ++t) {
      const int8_t* q = a.q[t];
      double L[c::kLanes];
      for (double& l : L) l = 0.0;
      for (int b = 0; b < a.nb; ++b) {
        const int8_t* even = q + (b / 4) * 128 + (b % 4) * 16;
        int32_t d = 0;
        for (int j = 0; j < 16; ++j) {
          const uint8_t byte = prow[b * 16 + j];
          d += int32_t(even[j]) * c::e2m1_x2(byte & 0xFu);
          d += int32_t(even[64 + j]) * c::e2m1_x2(byte >> 4);
        }
        c::lane_add(L, b, c::block_term(d, a.e[t][b], srow[b]));
      }
      a.out[size_t(t) * size_t(a.out_stride) + size_t(o - a.r0)] = c::lane_finish(L);
    }
  }
}

}  // namespace detail

// ------------------------------------------------------------------------------------------------
// Layer driver

namespace {

using ProjFn = void (*)(const detail::ProjArgs&);

ProjFn kernel_for(ExpertIsa isa) {
  switch (isa) {
    case ExpertIsa::avx512:
      return detail::project_avx512;
    case ExpertIsa::amx:
      return detail::project_amx;
    case ExpertIsa::avx2:
      return detail::project_avx2;
    default:
      return detail::project_scalar;
  }
}

// Rows per work item: 64 rows of a 3584-wide MXFP4 matrix are 115 KB of weights — enough to
// amortise a task, small enough that 16 experts × 3072 rows give hundreds of items to steal.
constexpr int kRowTile = 64;

// The non-poisoned tokens of one expert, as the kernels' pointer arrays.
struct TokenSet {
  std::vector<int> idx;  // position in the expert's token list
  std::vector<const int8_t*> q;
  std::vector<const int32_t*> e, bias, nbias;
  std::vector<const double*> px;
  std::vector<int> span;
  std::vector<int8_t> tb;  // AMX only: amx_pack_tokens (valid when packed)
  std::vector<double> tpx;
  bool packed = false;
};

// Refills s (capacity kept) with the non-poisoned tokens of rows[0 .. n) (null rows: 0 .. n).
void token_set(const QuantizedActivations& xq, const int* rows, int n, TokenSet& s) {
  s.idx.clear(), s.q.clear(), s.e.clear(), s.bias.clear(), s.nbias.clear(), s.px.clear();
  s.span.clear();
  s.packed = false;
  for (int i = 0; i < n; ++i) {
    const int t = rows ? rows[i] : i;
    if (xq.poisoned(t)) continue;
    s.idx.push_back(i);
    s.q.push_back(xq.q(t));
    s.e.push_back(xq.exponents(t));
    s.bias.push_back(xq.block_bias(t));
    s.nbias.push_back(xq.neg_block_bias(t));
    s.px.push_back(xq.block_scale(t));
    s.span.push_back(xq.exponent_span(t));
  }
}

detail::ProjArgs proj_args(const QuantizedActivations& xq, const TokenSet& ts, int r0, int r1,
                           int prefetch, int pass_groups, bool few) {
  detail::ProjArgs a;
  a.K = xq.width();
  a.nb = xq.blocks();
  a.nbp = xq.padded_blocks();
  a.r0 = r0;
  a.r1 = r1;
  a.n = int(ts.idx.size());
  a.q = ts.q.data();
  a.e = ts.e.data();
  a.bias = ts.bias.data();
  a.px = ts.px.data();
  a.nbias = ts.nbias.data();
  a.span = ts.span.data();
  if (ts.packed) {
    a.tb = ts.tb.data();
    a.tpx = ts.tpx.data();
  }
  a.out_stride = kRowTile;
  a.prefetch = prefetch;
  a.amx_pass_groups = pass_groups;
  a.few = few;
  return a;
}

void fill_nan(float* p, size_t n) {
  std::fill(p, p + n, c::canonical_nan());
}

// Default software prefetch distance of the one-token kernel (bytes ahead).
constexpr int kDefaultPrefetch = 4096;

}  // namespace

struct CpuExpertWorkspace::State {
  QuantizedActivations xq;  // the quantized layer input (run_experts_cpu with fp32 x)
  std::vector<TokenSet> xs, hs;
  std::vector<QuantizedActivations> hq;
  std::unique_ptr<float[]> h;  // every expert's h: [n_e (non-poisoned), I_e], expert after expert
  size_t h_floats = 0;
  std::unique_ptr<std::atomic<int>[]> pending;
  size_t pending_n = 0;
  std::vector<std::pair<int, int>> items;  // (expert, row tile)
};

CpuExpertWorkspace::CpuExpertWorkspace() : s_(std::make_unique<State>()) {}
CpuExpertWorkspace::~CpuExpertWorkspace() = default;

namespace {

// Gate|up items (expert, row tile) in one TBB loop; the item that completes an expert's h
// quantizes it and runs that expert's down tiles as a nested loop — no barrier between the
// phases: threads with nothing left of gate|up steal down tiles of finished experts.
void run_layer(std::span<const ExpertTask> tasks, const QuantizedActivations& xq,
               const GluParams& glu, ExpertIsa isa, const CpuExpertOptions& opt,
               CpuExpertWorkspace::State& ws) {
  const ProjFn proj = kernel_for(isa);
  const int H = xq.width();
  const size_t E = tasks.size();
  const int prefetch = opt.prefetch < 0 ? kDefaultPrefetch : opt.prefetch;
  const int pass_groups =
      ((opt.amx_pass_tokens < 0 ? detail::kAmxPassTokens : opt.amx_pass_tokens) + 15) / 16;
  if (ws.xs.size() < E) ws.xs.resize(E), ws.hs.resize(E), ws.hq.resize(E);
  if (ws.pending_n < E) {
    ws.pending = std::make_unique<std::atomic<int>[]>(E);
    ws.pending_n = E;
  }
  std::vector<TokenSet>& xs = ws.xs;
  std::vector<TokenSet>& hs = ws.hs;
  std::vector<QuantizedActivations>& hq = ws.hq;
  std::atomic<int>* pending = ws.pending.get();
  std::vector<std::pair<int, int>>& items = ws.items;
  items.clear();
  // h of expert e at h_off(e); allocated uninitialized: its pages are first touched by the
  // workers that write them, not by this thread.
  std::vector<size_t> h_off(E + 1, 0);
  for (size_t e = 0; e < E; ++e) {
    const ExpertTask& tk = tasks[e];
    STRATA_ASSERT(tk.w.hidden == H && tk.w.inter > 0 && tk.w.inter % c::kBlock == 0);
    STRATA_ASSERT(tk.n_tokens >= 0 && (tk.n_tokens == 0 || (tk.token_rows && tk.y)));
    for (int i = 0; i < tk.n_tokens; ++i)
      STRATA_ASSERT(tk.token_rows[i] >= 0 && tk.token_rows[i] < xq.tokens());
    token_set(xq, tk.token_rows, tk.n_tokens, xs[e]);
    hs[e].idx.clear();
    h_off[e + 1] = h_off[e] + xs[e].idx.size() * size_t(tk.w.inter);
    int n_items = 0;
    if (!xs[e].idx.empty())
      for (int r = 0; r < tk.w.inter; r += kRowTile, ++n_items) items.emplace_back(int(e), r);
    pending[e].store(n_items, std::memory_order_relaxed);
  }
  if (ws.h_floats < h_off[E]) {
    ws.h.reset();
    ws.h = std::make_unique_for_overwrite<float[]>(h_off[E]);
    ws.h_floats = h_off[E];
  }
  float* const h = ws.h.get();
  auto pack = [&](TokenSet& ts, int nb) {
    ts.packed = isa == ExpertIsa::amx && int(ts.idx.size()) >= detail::kAmxMinTokens;
    if (ts.packed)
      detail::amx_pack_tokens(ts.q.data(), ts.px.data(), int(ts.idx.size()), nb, ts.tb, ts.tpx);
  };
  if (isa == ExpertIsa::amx)
    tbb::parallel_for(size_t(0), E, [&](size_t e) { pack(xs[e], xq.blocks()); });

  // Down projection of expert e into y, once its h is complete.
  auto down = [&](size_t e) {
    const ExpertTask& tk = tasks[e];
    const int n0 = int(xs[e].idx.size()), I = tk.w.inter;
    hq[e].quantize(h + h_off[e], n0, I);
    token_set(hq[e], nullptr, n0, hs[e]);
    pack(hs[e], hq[e].blocks());
    const TokenSet& ts = hs[e];
    const int n = int(ts.idx.size());
    if (n == 0) return;
    tbb::parallel_for(0, (H + kRowTile - 1) / kRowTile, [&](int it) {
      const int r0 = it * kRowTile, r1 = std::min(H, r0 + kRowTile);
      thread_local std::vector<float> yt;
      if (yt.size() < size_t(n) * kRowTile) yt.resize(size_t(n) * kRowTile);
      detail::ProjArgs a =
          proj_args(hq[e], ts, r0, r1, prefetch, pass_groups, opt.few_token_kernel);
      a.packed = tk.w.w2_packed;
      a.scale = tk.w.w2_scale;
      if (r1 < H) {  // the next row tile (a hint for the AMX kernel's prefetch)
        a.next_packed = a.packed + size_t(r1) * size_t(I / 2);
        a.next_scale = a.scale + size_t(r1) * size_t(I / c::kBlock);
      }
      a.out = yt.data();
      proj(a);
      // Scatter to the rows of y: token ts.idx[k] of hq is h row k, i.e. xs.idx[ts.idx[k]].
      for (int k = 0; k < n; ++k) {
        const int i = xs[e].idx[size_t(ts.idx[size_t(k)])];
        std::copy(yt.data() + size_t(k) * kRowTile, yt.data() + size_t(k) * kRowTile + (r1 - r0),
                  tk.y + size_t(i) * size_t(H) + size_t(r0));
      }
    });
  };

  tbb::parallel_for(size_t(0), items.size(), [&](size_t it) {
    const auto [e, r0] = items[it];
    const ExpertTask& tk = tasks[size_t(e)];
    const TokenSet& ts = xs[size_t(e)];
    const int I = tk.w.inter, r1 = std::min(I, r0 + kRowTile), n = int(ts.idx.size());
    {
      thread_local std::vector<float> gu;
      if (gu.size() < size_t(2) * size_t(n) * kRowTile) gu.resize(size_t(2) * size_t(n) * kRowTile);
      detail::ProjArgs a = proj_args(xq, ts, r0, r1, prefetch, pass_groups, opt.few_token_kernel);
      // next_*: the rows projected next (w3 after w1; after w3, likely this thread's next item:
      // the next row tile of w1), a hint for the AMX kernel's prefetch.
      const size_t hb = size_t(H / 2), hsc = size_t(H / c::kBlock);
      a.packed = tk.w.w1_packed;
      a.scale = tk.w.w1_scale;
      a.next_packed = tk.w.w3_packed + size_t(r0) * hb;
      a.next_scale = tk.w.w3_scale + size_t(r0) * hsc;
      a.out = gu.data();
      proj(a);
      a.packed = tk.w.w3_packed;
      a.scale = tk.w.w3_scale;
      a.next_packed = r1 < I ? tk.w.w1_packed + size_t(r1) * hb : nullptr;
      a.next_scale = r1 < I ? tk.w.w1_scale + size_t(r1) * hsc : nullptr;
      a.out = gu.data() + size_t(n) * kRowTile;
      proj(a);
      for (int t = 0; t < n; ++t) {
        const float* g = gu.data() + size_t(t) * kRowTile;
        const float* u = gu.data() + (size_t(n) + size_t(t)) * kRowTile;
        float* ht = h + h_off[size_t(e)] + size_t(t) * size_t(I) + size_t(r0);
        if (isa == ExpertIsa::avx512 || isa == ExpertIsa::amx) {
          detail::glu_avx512(g, u, ht, r1 - r0, glu);  // same bits, 8 lanes at a time
        } else {
          for (int o = 0; o < r1 - r0; ++o) ht[o] = c::glu(g[o], u[o], glu);
        }
      }
    }
    // gu is not touched below: a nested loop may run other items of this thread meanwhile.
    if (pending[size_t(e)].fetch_sub(1, std::memory_order_acq_rel) == 1) down(size_t(e));
  });

  // Poisoned rows: the canonical NaN (poisoned x, or a non-finite h block).
  for (size_t e = 0; e < E; ++e) {
    const ExpertTask& tk = tasks[e];
    std::vector<uint8_t> ok(size_t(tk.n_tokens), 0);
    for (int k : hs[e].idx) ok[size_t(xs[e].idx[size_t(k)])] = 1;
    for (int i = 0; i < tk.n_tokens; ++i)
      if (!ok[size_t(i)]) fill_nan(tk.y + size_t(i) * size_t(H), size_t(H));
  }
}

}  // namespace

namespace {

// Runs f(workspace state) with the caller's workspace (or one for this call only), inside
// opt.arena when one is set.
template <class F>
void with_workspace(const CpuExpertOptions& opt, F&& f) {
  std::unique_ptr<CpuExpertWorkspace> local;
  if (!opt.workspace) local = std::make_unique<CpuExpertWorkspace>();
  CpuExpertWorkspace::State& ws = (opt.workspace ? opt.workspace : local.get())->state();
  auto body = [&] { f(ws); };
  if (opt.arena) {
    opt.arena->execute(body);
  } else {
    body();
  }
}

}  // namespace

void run_experts_cpu(std::span<const ExpertTask> tasks, const QuantizedActivations& xq,
                     const GluParams& glu, const CpuExpertOptions& opt) {
  const ExpertIsa isa = resolve_isa(opt.isa);
  with_workspace(opt,
                 [&](CpuExpertWorkspace::State& ws) { run_layer(tasks, xq, glu, isa, opt, ws); });
}

void run_experts_cpu(std::span<const ExpertTask> tasks, const float* x, int T, const GluParams& glu,
                     const CpuExpertOptions& opt) {
  if (tasks.empty()) return;
  const ExpertIsa isa = resolve_isa(opt.isa);
  with_workspace(opt, [&](CpuExpertWorkspace::State& ws) {
    ws.xq.quantize(x, T, tasks[0].w.hidden);
    run_layer(tasks, ws.xq, glu, isa, opt, ws);
  });
}

void RoutedExperts::run(std::span<ExpertTask> tasks, std::span<const int32_t* const> slots,
                        const float* x, int T, const GluParams& glu, const CpuExpertOptions& opt,
                        float* out, bool round_bf16, Times* times) {
  STRATA_ASSERT(slots.size() == tasks.size());
  if (tasks.empty()) return;
  const int H = tasks[0].w.hidden;
  row_start_.resize(tasks.size() + 1);
  row_start_[0] = 0;
  for (size_t e = 0; e < tasks.size(); ++e)
    row_start_[e + 1] = row_start_[e] + size_t(std::max(0, tasks[e].n_tokens));
  ybuf_.resize(row_start_.back() * size_t(H));
  for (size_t e = 0; e < tasks.size(); ++e) tasks[e].y = ybuf_.data() + row_start_[e] * size_t(H);
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  xq_.quantize(x, T, H);
  const auto t1 = clock::now();
  run_experts_cpu(tasks, xq_, glu, opt);
  const auto t2 = clock::now();
  // Each task's rows to their slots, tasks in parallel: a prefill chunk moves T·k rows of H here,
  // which one thread made a serial share of the step (docs/planner.md, "Earlier rounds", (2)). A
  // row's bits do not depend on who copies it.
  tbb::parallel_for(size_t(0), tasks.size(), [&](size_t e) {
    for (int r = 0; r < tasks[e].n_tokens; ++r) {
      float* o = out + int64_t(slots[e][r]) * H;
      std::copy_n(ybuf_.data() + (row_start_[e] + size_t(r)) * size_t(H), H, o);
      if (round_bf16) ref::round_bf16_inplace(o, H);
    }
  });
  if (times) {
    times->quantize_s += std::chrono::duration<double>(t1 - t0).count();
    times->kernels_s += std::chrono::duration<double>(t2 - t1).count();
    times->copy_s += std::chrono::duration<double>(clock::now() - t2).count();
  }
}

}  // namespace strata::cpu
