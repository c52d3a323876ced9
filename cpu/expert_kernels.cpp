// Layer-level driver of the CPU expert FFN (cpu/expert_kernels.h): ISA dispatch by CPUID,
// activation quantization into the kernels' layout, and the TBB work decomposition. The scalar
// projection kernel lives here too (the path for tests and for CPUs without AVX2).
#include "cpu/expert_kernels.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>

#include "cpu/expert_kernels_impl.h"
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
      return false;  // no AMX-INT8 kernel yet: AVX-512 VNNI is the path
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

void QuantizedActivations::quantize(const float* x, int T, int K) {
  STRATA_ASSERT(T >= 0 && K > 0 && K % c::kBlock == 0);
  T_ = T;
  K_ = K;
  nb_ = K / c::kBlock;
  nbp_ = (nb_ + 15) / 16 * 16;
  q_.assign(size_t(T) * size_t(nbp_) * 32, 0);
  e_.assign(size_t(T) * size_t(nbp_), 0);
  s_.assign(size_t(T) * size_t(nbp_), 0);
  poisoned_.assign(size_t(T), 0);
  auto one = [&](int t) {
    int8_t qb[c::kBlock];
    int8_t* qt = q_.data() + size_t(t) * size_t(nbp_) * 32;
    for (int b = 0; b < nb_; ++b) {
      int e = 0;
      if (!c::quantize_block(x + size_t(t) * size_t(K) + size_t(b) * c::kBlock, qb, &e))
        poisoned_[size_t(t)] = 1;
      int32_t sum = 0;
      // Quad b/4: even columns at [0, 64), odd at [64, 128); block b % 4 at 16·(b % 4).
      int8_t* even = qt + (b / 4) * 128 + (b % 4) * 16;
      for (int j = 0; j < 16; ++j) {
        even[j] = qb[2 * j];
        even[64 + j] = qb[2 * j + 1];
        sum += qb[2 * j] + qb[2 * j + 1];
      }
      e_[size_t(t) * size_t(nbp_) + size_t(b)] = e;
      s_[size_t(t) * size_t(nbp_) + size_t(b)] = 12 * sum;
    }
  };
  if (T * K >= (1 << 16)) {
    tbb::parallel_for(0, T, one);
  } else {
    for (int t = 0; t < T; ++t) one(t);
  }
}

// ------------------------------------------------------------------------------------------------
// Scalar projection kernel: the contract loops over the quad layout.

namespace detail {

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
  std::vector<const int32_t*> e, bias;
};

TokenSet token_set(const QuantizedActivations& xq, const int* rows, int n) {
  TokenSet s;
  for (int i = 0; i < n; ++i) {
    const int t = rows ? rows[i] : i;
    if (xq.poisoned(t)) continue;
    s.idx.push_back(i);
    s.q.push_back(xq.q(t));
    s.e.push_back(xq.exponents(t));
    s.bias.push_back(xq.block_bias(t));
  }
  return s;
}

void fill_nan(float* p, size_t n) {
  std::fill(p, p + n, c::canonical_nan());
}

void run_layer(std::span<const ExpertTask> tasks, const QuantizedActivations& xq,
               const GluParams& glu, ExpertIsa isa) {
  const ProjFn proj = kernel_for(isa);
  const int H = xq.width();
  const size_t E = tasks.size();
  std::vector<TokenSet> xs(E);
  std::vector<std::vector<float>> h(E);  // [n_tokens (non-poisoned), I]
  for (size_t e = 0; e < E; ++e) {
    const ExpertTask& tk = tasks[e];
    STRATA_ASSERT(tk.w.hidden == H && tk.w.inter > 0 && tk.w.inter % c::kBlock == 0);
    STRATA_ASSERT(tk.n_tokens >= 0 && (tk.n_tokens == 0 || (tk.token_rows && tk.y)));
    for (int i = 0; i < tk.n_tokens; ++i)
      STRATA_ASSERT(tk.token_rows[i] >= 0 && tk.token_rows[i] < xq.tokens());
    xs[e] = token_set(xq, tk.token_rows, tk.n_tokens);
    h[e].resize(xs[e].idx.size() * size_t(tk.w.inter));
  }

  // Phase A: gate and up for (expert, row tile) items, GLU fused at the tile.
  std::vector<std::pair<int, int>> items;  // (expert, row tile)
  for (size_t e = 0; e < E; ++e)
    if (!xs[e].idx.empty())
      for (int r = 0; r < tasks[e].w.inter; r += kRowTile) items.emplace_back(int(e), r);
  tbb::parallel_for(size_t(0), items.size(), [&](size_t it) {
    const auto [e, r0] = items[it];
    const ExpertTask& tk = tasks[size_t(e)];
    const TokenSet& ts = xs[size_t(e)];
    const int I = tk.w.inter, r1 = std::min(I, r0 + kRowTile), n = int(ts.idx.size());
    thread_local std::vector<float> gu;
    gu.resize(size_t(2) * size_t(n) * kRowTile);
    detail::ProjArgs a;
    a.K = H;
    a.nb = xq.blocks();
    a.nbp = xq.padded_blocks();
    a.r0 = r0;
    a.r1 = r1;
    a.n = n;
    a.q = ts.q.data();
    a.e = ts.e.data();
    a.bias = ts.bias.data();
    a.out_stride = kRowTile;
    a.packed = tk.w.w1_packed;
    a.scale = tk.w.w1_scale;
    a.out = gu.data();
    proj(a);
    a.packed = tk.w.w3_packed;
    a.scale = tk.w.w3_scale;
    a.out = gu.data() + size_t(n) * kRowTile;
    proj(a);
    for (int t = 0; t < n; ++t) {
      const float* g = gu.data() + size_t(t) * kRowTile;
      const float* u = gu.data() + (size_t(n) + size_t(t)) * kRowTile;
      float* ht = h[size_t(e)].data() + size_t(t) * size_t(I) + size_t(r0);
      if (isa == ExpertIsa::avx512) {
        detail::glu_avx512(g, u, ht, r1 - r0, glu);  // same bits, 8 lanes at a time
      } else {
        for (int o = 0; o < r1 - r0; ++o) ht[o] = c::glu(g[o], u[o], glu);
      }
    }
  });

  // h quantized once per (token, expert).
  std::vector<QuantizedActivations> hq(E);
  std::vector<TokenSet> hs(E);
  tbb::parallel_for(size_t(0), E, [&](size_t e) {
    const int n = int(xs[e].idx.size());
    if (n == 0) return;
    hq[e].quantize(h[e].data(), n, tasks[e].w.inter);
    hs[e] = token_set(hq[e], nullptr, n);
  });

  // Phase B: down projection into y, (expert, row tile) items.
  items.clear();
  for (size_t e = 0; e < E; ++e)
    if (!hs[e].idx.empty())
      for (int r = 0; r < H; r += kRowTile) items.emplace_back(int(e), r);
  tbb::parallel_for(size_t(0), items.size(), [&](size_t it) {
    const auto [e, r0] = items[it];
    const ExpertTask& tk = tasks[size_t(e)];
    const TokenSet& ts = hs[size_t(e)];
    const int I = tk.w.inter, r1 = std::min(H, r0 + kRowTile), n = int(ts.idx.size());
    thread_local std::vector<float> yt;
    yt.resize(size_t(n) * kRowTile);
    detail::ProjArgs a;
    a.packed = tk.w.w2_packed;
    a.scale = tk.w.w2_scale;
    a.K = I;
    a.nb = hq[size_t(e)].blocks();
    a.nbp = hq[size_t(e)].padded_blocks();
    a.r0 = r0;
    a.r1 = r1;
    a.n = n;
    a.q = ts.q.data();
    a.e = ts.e.data();
    a.bias = ts.bias.data();
    a.out = yt.data();
    a.out_stride = kRowTile;
    proj(a);
    // Scatter to the rows of y: token ts.idx[k] of hq is h row k, i.e. xs.idx[ts.idx[k]].
    for (int k = 0; k < n; ++k) {
      const int i = xs[size_t(e)].idx[size_t(ts.idx[size_t(k)])];
      std::copy(yt.data() + size_t(k) * kRowTile, yt.data() + size_t(k) * kRowTile + (r1 - r0),
                tk.y + size_t(i) * size_t(H) + size_t(r0));
    }
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

void run_experts_cpu(std::span<const ExpertTask> tasks, const QuantizedActivations& xq,
                     const GluParams& glu, const CpuExpertOptions& opt) {
  const ExpertIsa isa = resolve_isa(opt.isa);
  if (opt.arena) {
    opt.arena->execute([&] { run_layer(tasks, xq, glu, isa); });
  } else {
    run_layer(tasks, xq, glu, isa);
  }
}

void run_experts_cpu(std::span<const ExpertTask> tasks, const float* x, int T, const GluParams& glu,
                     const CpuExpertOptions& opt) {
  if (tasks.empty()) return;
  QuantizedActivations xq;
  auto body = [&] {
    xq.quantize(x, T, tasks[0].w.hidden);
    run_layer(tasks, xq, glu, resolve_isa(opt.isa));
  };
  if (opt.arena) {
    opt.arena->execute(body);
  } else {
    body();
  }
}

}  // namespace strata::cpu
