// The one cost model (see cost_model.h for what it models and what not).
#include "offload/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "offload/format.h"
#include "storage/error.h"

namespace strata::offload {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

uint64_t component_bytes(const ModelCosts& k, const char* name) {
  for (auto& c : k.components)
    if (c.name == name) return c.bytes;
  return 0;
}

double sum_parts(const std::vector<TimePart>& parts, const char* resource = nullptr) {
  double s = 0;
  for (auto& p : parts)
    if (!resource || p.resource == resource) s += p.seconds;
  return s;
}

// The part that takes longest (nullptr when there are none).
const TimePart* largest(const std::vector<TimePart>& parts) {
  const TimePart* big = nullptr;
  for (auto& t : parts)
    if (!big || t.seconds > big->seconds) big = &t;
  return big;
}

// A hardware peak for a roofline in its unit (× scale), or 0 with the field listed as missing.
double roofline_peak(const Rate& r, const char* field, double scale, Roofline& out) {
  if (r.known()) return r.value() * scale;
  out.missing.push_back(field);
  return 0;
}

// A roofline's time, rate and bound (its largest part).
void finish_roofline(Roofline& r, double seconds, double tokens) {
  const TimePart* big = largest(r.parts);
  r.seconds = seconds;
  r.bound = big ? big->name : "nothing known";
  r.tokens_per_s = seconds > 0 ? tokens / seconds : 0;
}

// log of the Binomial(n, p) pmf at m.
double log_binom_pmf(int64_t n, int64_t m, double p) {
  return std::lgamma(double(n) + 1) - std::lgamma(double(m) + 1) - std::lgamma(double(n - m) + 1) +
         double(m) * std::log(p) + double(n - m) * std::log1p(-p);
}

}  // namespace

std::string Placement::validate() const {
  if (gpu < 0 || host < 0 || disk < 0) return "placement shares must not be negative";
  if (std::fabs(gpu + host + disk - 1.0) > 1e-6)
    return fmt("placement shares must sum to 1 (gpu %.3g + host %.3g + disk %.3g)", gpu, host,
               disk);
  return {};
}

const char* trunk_backend_name(TrunkBackend b) {
  switch (b) {
    case TrunkBackend::gpu:
      return "gpu";
    case TrunkBackend::cpu_reference:
      return "cpu-reference";
    case TrunkBackend::cpu_bf16:
      return "cpu-bf16";
  }
  return "?";
}

const char* overlap_name(Overlap o) {
  switch (o) {
    case Overlap::serial:
      return "serial";
    case Overlap::moe_layer:
      return "moe-layer";
    case Overlap::full:
      return "full";
  }
  return "?";
}

std::string overlap_description(Overlap o, TrunkBackend b) {
  const bool gpu = b == TrunkBackend::gpu;
  switch (o) {
    case Overlap::serial:
      return "serial: every piece of work one after the other (no overlap)";
    case Overlap::moe_layer:
      return gpu ? "moe-layer (the GPU engine as it runs): one stream of GEMMs and small kernels; "
                   "per MoE layer a host round trip for the routing, then the CPU computes the "
                   "experts not cached on the GPU while the GPU runs the cached ones (decode: the "
                   "shared experts after the join; prefill: staging rounds copied on the host "
                   "while the GPU computes the previous round); disk reads overlap the step"
                 : "moe-layer (CPU backend): the CPU runs trunk, attention and experts one after "
                   "the other; disk reads (router-lookahead prefetch) overlap the whole step";
    case Overlap::full:
      return "full: every resource busy all the time; the busiest resource sets the time";
  }
  return "?";
}

std::vector<FastLinearCall> fast_step_linears(const ModelConfig& c, bool fused) {
  std::vector<FastLinearCall> calls;
  using Mat = std::pair<int64_t, int64_t>;
  int layer = 0;
  bool mlp = false;
  // One input's projections: one call when fused, else one call per matrix.
  auto proj = [&](std::vector<Mat> m) {
    if (fused) {
      calls.push_back({std::move(m), layer, mlp});
    } else {
      for (const Mat& x : m) calls.push_back({{x}, layer, mlp});
    }
  };
  auto one = [&](int64_t rows, int64_t cols) { calls.push_back({{{rows, cols}}, layer, mlp}); };
  const int64_t D = c.hidden_size;
  const auto& kd = c.kda;
  const auto& ml = c.mla;
  const auto& mo = c.moe;
  for (int l = 0; l < c.num_layers; ++l) {
    layer = l, mlp = false;
    if (c.is_kda(l)) {  // q, k, v, f_a, b, g (or g_a) | f_b | g_b | o
      const int64_t P = kd.proj_dim(), r = kd.gate_rank > 0 ? kd.gate_rank : kd.head_dim;
      proj({{P, D},
            {P, D},
            {P, D},
            {r, D},
            {kd.num_heads, D},
            {kd.full_rank_output_gate ? P : r, D}});
      one(P, r);
      if (!kd.full_rank_output_gate) one(P, r);
      one(D, P);
    } else {  // q (or q_a), kv_a, gate | q_b | o
      const int64_t H = ml.num_heads;
      std::vector<Mat> m = {{ml.q_lora_rank > 0 ? ml.q_lora_rank : H * ml.q_head_dim(), D},
                            {ml.latent_cache_dim(), D}};
      if (ml.output_gate) m.push_back({H * ml.v_head_dim, D});
      proj(std::move(m));
      if (ml.q_lora_rank > 0) one(H * ml.q_head_dim(), ml.q_lora_rank);
      one(D, H * ml.v_head_dim);
    }
    mlp = true;
    if (!c.is_moe(l)) {  // gate, up | down
      proj({{c.dense_intermediate_size, D}, {c.dense_intermediate_size, D}});
      one(D, c.dense_intermediate_size);
    } else {  // router, latent down, shared gate, up | latent up | shared down
      const int64_t L = c.expert_in_dim(), Is = mo.shared_intermediate();
      std::vector<Mat> m = {{mo.num_experts, D}};
      if (mo.latent_size > 0) m.push_back({L, D});
      if (Is > 0) m.push_back({Is, D}), m.push_back({Is, D});
      proj(std::move(m));
      if (mo.latent_size > 0) one(D, L);
      if (Is > 0) one(D, Is);
    }
  }
  return calls;
}

std::vector<GpuGemm> gpu_step_gemms(const ModelConfig& c) {
  std::vector<GpuGemm> g;
  auto G = [&](int64_t out, int64_t in, GpuGemm::Kind k = GpuGemm::Kind::layer) {
    g.push_back({out, in, k});
  };
  const int64_t D = c.hidden_size;
  const auto& kd = c.kda;
  const auto& ml = c.mla;
  const auto& mo = c.moe;
  for (int l = 0; l < c.num_layers; ++l) {
    if (c.is_kda(l)) {  // q|k|v, f_a, f_b, b, g (full rank, or g_a and g_b), o
      const int64_t P = kd.proj_dim(), r = kd.gate_rank > 0 ? kd.gate_rank : kd.head_dim;
      G(3 * P, D), G(r, D), G(P, r), G(kd.num_heads, D);
      if (kd.full_rank_output_gate)
        G(P, D);
      else
        G(r, D), G(P, r);
      G(D, P);
    } else {  // q_a and q_b (or q), kv_a, the output gate, o
      const int64_t H = ml.num_heads;
      if (ml.q_lora_rank > 0)
        G(ml.q_lora_rank, D), G(H * ml.q_head_dim(), ml.q_lora_rank);
      else
        G(H * ml.q_head_dim(), D);
      G(ml.latent_cache_dim(), D);
      if (ml.output_gate) G(H * ml.v_head_dim, D);
      G(D, H * ml.v_head_dim);
    }
    if (!c.is_moe(l)) {  // dense MLP: gate|up, down
      G(2 * c.dense_intermediate_size, D), G(D, c.dense_intermediate_size);
      continue;
    }
    G(mo.num_experts, D);  // router
    if (mo.latent_size > 0) G(c.expert_in_dim(), D), G(D, c.expert_in_dim());
    if (const int64_t Is = mo.shared_intermediate(); Is > 0)
      G(2 * Is, D, GpuGemm::Kind::shared), G(D, Is, GpuGemm::Kind::shared);
  }
  G(c.vocab_size, D, GpuGemm::Kind::head);
  return g;
}

double flat_distinct_experts(const ModelConfig& c, double tokens) {
  const double E = c.moe.num_experts, k = c.moe.top_k;
  if (E <= 0 || tokens <= 0) return 0;
  return E * (1.0 - std::pow(1.0 - k / E, tokens));
}

std::string model_shape_signature(const ModelConfig& c) {
  std::string layers;
  for (int l = 0; l < c.num_layers; ++l)
    layers += std::string(c.is_kda(l) ? "K" : "M") + (c.is_moe(l) ? "e" : "d");
  const auto& kd = c.kda;
  const auto& ml = c.mla;
  const auto& mo = c.moe;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "D%d V%d I%d AttnRes%d | KDA %dx%d conv%d rank%d %s %s | MLA %d q%d kv%d "
                "%d+%d v%d%s | MoE %dx top%d inter%d latent%d%s shared%d %s",
                c.hidden_size, c.vocab_size, c.dense_intermediate_size, c.attn_res_block_size,
                kd.num_heads, kd.head_dim, kd.conv_kernel, kd.gate_rank,
                kd.full_rank_output_gate ? "full-gate" : "lowrank-gate",
                kd.gate == KdaGateKind::bounded_sigmoid ? "bounded" : "softplus", ml.num_heads,
                ml.q_lora_rank, ml.kv_lora_rank, ml.qk_nope_head_dim, ml.qk_rope_head_dim,
                ml.v_head_dim, ml.output_gate ? " gated" : "", mo.num_experts, mo.top_k,
                mo.intermediate_size, mo.latent_size, mo.latent_norm ? " norm" : "",
                mo.num_shared_experts, mo.mxfp4 ? "mxfp4" : "bf16");
  return std::string(buf) + " | " + layers;
}

CostModel::CostModel(const HardwareProfile& hw, const ModelConfig& cfg, CostOptions opt)
    : hw_(hw), cfg_(cfg), costs_(compute_costs(cfg)), opt_(std::move(opt)) {
  const std::string src = hw.source.empty() ? std::string("hardware profile") : hw.source;
  if (opt_.trunk == TrunkBackend::cpu_bf16) {
    // The model-shape probes replace the K3-shaped ones for the model they were measured for
    // only; another model's would be silently wrong, so they are set aside with a note.
    const ModelShapeRates& ms = hw.model_shapes;
    const std::string mine = model_shape_signature(cfg);
    if (!ms.known()) {
      rates_basis_ =
          "rates: K3-shaped probes (the profile has no model-shape rates; `strata bench hw -m "
          "DIR` measures them for a model)";
    } else if (ms.signature == mine) {
      shapes_ = true;
      rates_basis_ = "rates: model-shape probes measured for this model (" + ms.model + ", " +
                     std::to_string(ms.threads) + " threads)";
    } else {
      rates_basis_ = "rates: K3-shaped probes — note: " + src +
                     "'s model-shape rates were measured for another model (" + ms.model +
                     "); its signature [" + ms.signature + "] is not this model's [" + mine + "]";
    }
  }
  if (opt_.trunk == TrunkBackend::gpu && hw.model_shapes.gpu_trunk.known()) {
    const ModelShapeRates& ms = hw.model_shapes;
    if (ms.signature == model_shape_signature(cfg)) {
      gpu_shapes_ = true;
      rates_basis_ = "rates: the GPU engine's GEMMs of a step timed at this model's shapes (" +
                     ms.model + "); the rest K3-shaped probes";
    } else {
      rates_basis_ = "rates: K3-shaped probes — note: " + src +
                     "'s GPU GEMM rates were measured for another model (" + ms.model + ")";
    }
  }
  auto need = [&](bool ok, const std::string& field, const std::string& why) {
    if (!ok) throw Error(src + ": " + field + ": not measured or stated; " + why);
  };
  if (opt_.trunk == TrunkBackend::gpu) {
    need(hw.gpu.count > 0, "gpu.count", "the GPU backend needs a GPU");
    gpus_ = opt_.gpus < 0 ? hw.total_gpus() : opt_.gpus;
    if (gpus_ < 1 || gpus_ > hw.total_gpus())
      throw Error(src + ": " + std::to_string(opt_.gpus) + " GPUs requested, the hardware has " +
                  std::to_string(hw.total_gpus()));
    need(hw.kernels.gpu_trunk.known() ||
             (hw.gpu.hbm_copy_gbps.known() && hw.gpu.bf16_gemm_tflops.known()),
         "gpu.hbm_copy_gbps / gpu.bf16_gemm_tflops", "needed for the GPU trunk");
    need(hw.gpu.hbm_copy_gbps.known(), "gpu.hbm_copy_gbps", "needed for KDA/MLA decode");
    need(hw.gpu.bf16_gemm_tflops.known(), "gpu.bf16_gemm_tflops", "needed for prefill attention");
  } else if (opt_.trunk == TrunkBackend::cpu_reference) {
    need(hw.kernels.cpu_trunk_ref.known(), "kernels.cpu_trunk_ref",
         "the reference trunk's rate is measured by `strata bench hw` on the machine itself");
    need(hw.kernels.cpu_kda_ref_state_gbps.known(), "kernels.cpu_kda_ref_state_gbps",
         "measured by `strata bench hw`");
    need(hw.kernels.cpu_mla_ref_gflops.known(), "kernels.cpu_mla_ref_gflops",
         "measured by `strata bench hw`");
  } else {
    need(hw.kernels.cpu_trunk_bf16.known() || hw.host.mem_read_gbps.known(), "host.mem_read_gbps",
         "needed for the CPU bf16 trunk");
  }
  if (cfg_.num_moe_layers() > 0) {
    const bool cpu_experts_measured = cfg_.moe.mxfp4 && hw.kernels.cpu_expert.known();
    need(cpu_experts_measured || hw.host.mem_read_gbps.known(), "host.mem_read_gbps",
         "needed for the CPU experts");
    need(cpu_experts_measured || hw.host.cores > 0, "host.cores", "needed for the CPU experts");
  }
  // The staging threshold depends only on the hardware and the expert shape: computed once.
  threshold_ = kNever;
  if (gpus_ > 0 && cfg_.num_moe_layers() > 0) {
    const double stage = stage_seconds();
    for (int M = 1; M <= (1 << 20); M = M < 4096 ? M + 1 : M * 2)
      if (stage + gpu_expert_seconds(M) < cpu_expert_seconds(M)) {
        // Past 4096 the scan doubles; refine down to the exact M.
        int lo = M < 4096 ? M : M / 2 + 1;
        while (lo < M && !(stage + gpu_expert_seconds(lo) < cpu_expert_seconds(lo))) ++lo;
        threshold_ = lo;
        break;
      }
  }
}

// ------------------------------------------------------------------------------------------------
// Rates

double CostModel::expert_flops_per_byte() const {
  return costs_.bytes_per_routed_expert ? 2.0 * double(costs_.params_per_routed_expert) /
                                              double(costs_.bytes_per_routed_expert)
                                        : 0;
}

double CostModel::cpu_bf16_flops() const {
  const CostAssumptions& a = opt_.assumptions;
  return hw_.host.bf16_tflops.known() ? hw_.host.bf16_tflops.value() * 1e12
                                      : a.cpu_bf16_tflops_per_core * hw_.host.cores * 1e12;
}

double CostModel::cpu_expert_spb(double M) const {
  if (shapes_ && cfg_.moe.mxfp4 && hw_.model_shapes.expert.known())  // this model's expert shape
    return hw_.model_shapes.expert.seconds_per_byte(M);
  if (cfg_.moe.mxfp4 && hw_.kernels.cpu_expert.known()) {
    const double big = hw_.kernels.cpu_expert.seconds_per_byte(M);
    if (!hw_.kernels.cpu_expert_small.known()) return big;
    // Between the two measured shapes by the model's expert size (log scale), clamped: an
    // expert's per-token work is a larger share of a small one.
    const double small = hw_.kernels.cpu_expert_small.seconds_per_byte(M);
    const double b = double(costs_.bytes_per_routed_expert);
    const double b0 = double(kSmallExpertBytes), b1 = double(kK3ExpertBytes);
    if (b <= b0) return small;
    if (b >= b1) return big;
    const double f = std::log(b / b0) / std::log(b1 / b0);
    return small + f * (big - small);
  }
  const CostAssumptions& a = opt_.assumptions;
  const double mem = 1.0 / (hw_.host.mem_read_gbps.value() * 1e9 * a.cpu_expert_read_efficiency);
  double flops;  // the CPU's rate for this expert format
  if (cfg_.moe.mxfp4) {
    const double per_core = hw_.host.avx512 || hw_.host.amx ? a.cpu_expert_tops_per_core_avx512
                                                            : a.cpu_expert_tops_per_core_avx2;
    flops = per_core * hw_.host.cores * 1e12;
  } else {
    flops = cpu_bf16_flops();
  }
  return std::max(mem, M * expert_flops_per_byte() / flops);
}

double CostModel::gpu_expert_spb(double M) const {
  if (gpus_ == 0) return kInf;
  if (cfg_.moe.mxfp4 && hw_.kernels.gpu_expert.known())
    return hw_.kernels.gpu_expert.seconds_per_byte(M);
  const CostAssumptions& a = opt_.assumptions;
  if (!cfg_.moe.mxfp4 && hw_.kernels.gpu_trunk.known())  // bf16 experts: cuBLASLt, as the trunk
    return hw_.kernels.gpu_trunk.seconds_per_byte(M);
  const bool mx = cfg_.moe.mxfp4;
  const double mem = 1.0 / (hw_.gpu.hbm_copy_gbps.value() * 1e9 *
                            (mx ? a.gpu_expert_hbm_efficiency : a.gpu_trunk_hbm_efficiency));
  const double flops = hw_.gpu.bf16_gemm_tflops.value() * 1e12 *
                       (mx ? a.gpu_expert_gemm_efficiency : a.gpu_trunk_gemm_efficiency);
  return std::max(mem, M * expert_flops_per_byte() / flops);
}

double CostModel::trunk_spb(double M) const {
  const CostAssumptions& a = opt_.assumptions;
  M = std::max(1.0, M);
  switch (opt_.trunk) {
    case TrunkBackend::gpu: {
      if (hw_.kernels.gpu_trunk.known()) return hw_.kernels.gpu_trunk.seconds_per_byte(M);
      // bf16 weights: 2 FLOPs per weight per token over 2 bytes = M FLOPs per byte.
      const double mem = 1.0 / (hw_.gpu.hbm_copy_gbps.value() * 1e9 * a.gpu_trunk_hbm_efficiency);
      const double cmp =
          M / (hw_.gpu.bf16_gemm_tflops.value() * 1e12 * a.gpu_trunk_gemm_efficiency);
      return std::max(mem, cmp);
    }
    case TrunkBackend::cpu_reference:
      return hw_.kernels.cpu_trunk_ref.seconds_per_byte(M);
    case TrunkBackend::cpu_bf16: {
      if (shapes_ && hw_.model_shapes.trunk.known())
        return hw_.model_shapes.trunk.seconds_per_byte(M);
      if (hw_.kernels.cpu_trunk_bf16.known()) return hw_.kernels.cpu_trunk_bf16.seconds_per_byte(M);
      const double mem =
          1.0 / (hw_.host.mem_read_gbps.value() * 1e9 * a.cpu_trunk_bf16_read_efficiency);
      return std::max(mem, M / cpu_bf16_flops());
    }
  }
  return kInf;
}

// FLOP rate of the CPU reference for attention prefill: the reference linear's multiply-add rate
// at its largest measured M (both are 4-wide SSE loops of the same kind).
double CostModel::cpu_ref_flops() const {
  const RatePoint& p = hw_.kernels.cpu_trunk_ref.points.back();
  return p.gbps * 1e9 * p.tokens;  // bf16 weights: M FLOPs per weight byte
}

// ------------------------------------------------------------------------------------------------
// Experts

double CostModel::cpu_expert_seconds(int tokens) const {
  return double(costs_.bytes_per_routed_expert) * cpu_expert_spb(std::max(1, tokens));
}

double CostModel::gpu_expert_seconds(int tokens) const {
  if (gpus_ == 0) return kInf;
  return double(costs_.bytes_per_routed_expert) * gpu_expert_spb(std::max(1, tokens));
}

double CostModel::h2d_gbps() const {
  return hw_.gpu.h2d_gbps.known() ? hw_.gpu.h2d_gbps.value() : opt_.assumptions.pcie_default_gbps;
}

double CostModel::stage_dma_gbps() const {
  return h2d_gbps() * opt_.assumptions.gpu_staging_dma_efficiency;
}

// The engine stages an expert by a host copy into pinned memory and a DMA, overlapped expert by
// expert (engine/cuda_backend.cpp): the slower of the two sets the rate; from a page-locked host
// cache, the DMA alone.
double CostModel::stage_seconds() const {
  if (gpus_ == 0) return kInf;
  const double gbps =
      opt_.staging_dma ? stage_dma_gbps() : std::min(stage_copy_gbps(), stage_dma_gbps());
  return double(costs_.bytes_per_routed_expert) / (gbps * 1e9);
}

double CostModel::disk_read_seconds() const {
  const Rate r = hw_.disk.total_read_gbps();
  if (!r.known()) return kInf;
  return double(costs_.bytes_per_routed_expert) / (r.value() * 1e9);
}

double CostModel::host_miss_share(const Placement& p, double touched_per_layer) const {
  if (p.disk <= 0) return 0.0;
  const double nc = 1.0 - (gpus_ > 0 ? p.gpu : 0.0);  // share outside the GPU cache
  const double c = nc > 0 ? p.host / nc : 1.0;        // the host cache's share of those
  if (c >= 1.0) return 0.0;
  const double E = cfg_.moe.num_experts;
  const double f = E > 0 ? std::clamp(touched_per_layer / E, 0.0, 1.0) : 1.0;
  if (c <= 0.0) return 1.0;
  if (f > c) {  // a scan: the cache keeps all but one layer's reads of what it held
    const double L = std::max(1, cfg_.num_moe_layers());
    return 1.0 - std::max(0.0, c - f / L);
  }
  if (f <= 0.0) return 1.0 - c;
  const double k = std::floor(std::log1p(-c) / std::log1p(-f));  // steps it survives
  return std::pow(1.0 - f, k);
}

int CostModel::prefill_stage_threshold() const {
  return threshold_;
}

// ------------------------------------------------------------------------------------------------
// Dense parts

uint64_t CostModel::trunk_bytes() const {
  const uint64_t embedding = uint64_t(cfg_.vocab_size) * uint64_t(cfg_.hidden_size) * 2;
  return costs_.total_bytes - component_bytes(costs_, "routed_experts") - embedding;
}

uint64_t CostModel::head_bytes() const {
  return uint64_t(cfg_.vocab_size) * uint64_t(cfg_.hidden_size) * 2;
}

double CostModel::trunk_seconds(int64_t tokens) const {
  return double(trunk_bytes()) * trunk_spb(double(std::max<int64_t>(1, tokens)));
}

double CostModel::trunk_prefill_seconds(int64_t tokens) const {
  return double(trunk_bytes() - head_bytes()) * trunk_spb(double(std::max<int64_t>(1, tokens))) +
         double(head_bytes()) * trunk_spb(1);
}

double CostModel::shared_expert_seconds(int64_t tokens) const {
  return double(component_bytes(costs_, "shared_experts")) *
         trunk_spb(double(std::max<int64_t>(1, tokens)));
}

double CostModel::kda_decode_seconds(int batch) const {
  const double bytes = 2.0 * double(costs_.kda_state_bytes) * batch;  // read + write
  switch (opt_.trunk) {
    case TrunkBackend::gpu:
      return bytes /
             (hw_.gpu.hbm_copy_gbps.value() * 1e9 * opt_.assumptions.gpu_kda_decode_hbm_efficiency);
    case TrunkBackend::cpu_reference:
      return bytes / (hw_.kernels.cpu_kda_ref_state_gbps.value() * 1e9);
    case TrunkBackend::cpu_bf16:
      if (shapes_ && hw_.model_shapes.kda_decode_gbps.known())
        return bytes / (hw_.model_shapes.kda_decode_gbps.value_at(batch) * 1e9);
      return bytes /
             (hw_.kernels.cpu_kda_fast_state_gbps.value_or(hw_.host.mem_read_gbps.value()) * 1e9);
  }
  return kInf;
}

double CostModel::step_factor(int64_t tokens) const {
  const RateCurve& f = hw_.model_shapes.step_factor;
  if (opt_.trunk != TrunkBackend::cpu_bf16 || !shapes_ || !f.known()) return 1;
  return f.value_at(double(tokens));
}

std::string CostModel::together_part(double factor) {
  return fmt("the parts together in one step (x%.2f, bench hw -m's step probe)", factor);
}

int CostModel::fast_linear_calls(bool decode) const {
  // engine/cpu_fast_backend.cpp: linear_multi fuses a layer's projections of one input into one
  // GEMV pass in decode and makes one oneDNN call per matrix in prefill; plus the logits.
  return int(fast_step_linears(cfg_, decode).size()) + 1;
}

double CostModel::fast_fixed_seconds(int64_t tokens, bool decode) const {
  if (opt_.trunk != TrunkBackend::cpu_bf16) return 0;
  const CostAssumptions& a = opt_.assumptions;
  const ModelShapeRates& ms = hw_.model_shapes;
  const double call_us = shapes_ && ms.linear_call_us.known()
                             ? ms.linear_call_us.value()
                             : hw_.kernels.cpu_linear_call_us.value_or(0);
  const double row_ns = shapes_ && ms.row_ops_ns.known() ? ms.row_ops_ns.value_at(double(tokens))
                                                         : hw_.kernels.cpu_row_ops_ns.value_or(0);
  double t = fast_linear_calls(decode) * call_us * 1e-6;
  t += double(cfg_.num_layers) * double(tokens) * (double(cfg_.hidden_size) / 1024.0) * row_ns *
       1e-9;
  t += cfg_.num_moe_layers() * a.cpu_expert_call_us * 1e-6;
  return t;
}

int CostModel::ref_linear_calls() const {
  // engine/cpu_backend.cpp: one call per projection (q, k, v separately), per MLP matrix, the
  // router, the latent projections, and the logits.
  const ModelConfig& c = cfg_;
  int n = 1;
  for (int l = 0; l < c.num_layers; ++l) {
    if (c.is_kda(l))
      n += 7 + (c.kda.full_rank_output_gate ? 1 : 2);
    else
      n += (c.mla.q_lora_rank > 0 ? 2 : 1) + 1 + (c.mla.output_gate ? 1 : 0) + 1;
    if (!c.is_moe(l))
      n += 3;
    else
      n += 1 + (c.moe.latent_size > 0 ? 2 : 0) + (c.moe.num_shared_experts > 0 ? 3 : 0);
  }
  return n;
}

double CostModel::kda_flops_per_token() const {
  const double H = cfg_.kda.num_heads, d = cfg_.kda.head_dim;
  return H * (10.0 * 64.0 * d + 6.0 * d * d) * cfg_.num_kda_layers();
}

double CostModel::kda_prefill_seconds(int64_t tokens) const {
  const double flops = kda_flops_per_token() * double(tokens);
  if (opt_.trunk == TrunkBackend::cpu_reference && hw_.kernels.cpu_kda_ref_prefill_gflops.known())
    return flops / (hw_.kernels.cpu_kda_ref_prefill_gflops.value() * 1e9);
  switch (opt_.trunk) {
    case TrunkBackend::gpu: {
      const double rate = hw_.kernels.gpu_kda_prefill_tflops.known()
                              ? hw_.kernels.gpu_kda_prefill_tflops.value() * 1e12
                              : hw_.gpu.bf16_gemm_tflops.value() * 1e12 *
                                    opt_.assumptions.gpu_kda_prefill_gemm_share;
      return flops / rate;
    }
    case TrunkBackend::cpu_reference:
      return flops / cpu_ref_flops();
    case TrunkBackend::cpu_bf16:
      if (shapes_ && hw_.model_shapes.kda_prefill_gflops.known())
        return flops / (hw_.model_shapes.kda_prefill_gflops.value_at(double(tokens)) * 1e9);
      return flops / (hw_.kernels.cpu_kda_fast_prefill_gflops.known()
                          ? hw_.kernels.cpu_kda_fast_prefill_gflops.value() * 1e9
                          : cpu_bf16_flops());
  }
  return kInf;
}

double CostModel::mla_decode_seconds(int batch, int64_t context) const {
  const MlaConfig& m = cfg_.mla;
  const double layers = cfg_.num_mla_layers();
  const double positions = double(batch) * double(std::max<int64_t>(1, context));
  const double bytes = positions * double(m.latent_cache_dim()) * 2.0 * layers;
  const double flops =
      2.0 * m.num_heads * (2.0 * m.kv_lora_rank + m.qk_rope_head_dim) * positions * layers;
  // The CPU's absorbed form also multiplies each query by kv_b's W_UK and its output by W_UV
  // (counted in bench hw's MLA decode rates, CPU backends).
  const double absorb = 2.0 * m.num_heads * double(m.kv_lora_rank) *
                        double(m.qk_nope_head_dim + m.v_head_dim) * batch * layers;
  switch (opt_.trunk) {
    case TrunkBackend::gpu: {
      const double rate = hw_.kernels.gpu_mla_decode_tflops.known()
                              ? hw_.kernels.gpu_mla_decode_tflops.value() * 1e12
                              : hw_.gpu.bf16_gemm_tflops.value() * 1e12 *
                                    opt_.assumptions.gpu_mla_decode_gemm_share;
      return std::max(bytes / (hw_.gpu.hbm_copy_gbps.value() * 1e9), flops / rate);
    }
    case TrunkBackend::cpu_reference:
      return (flops + absorb) / (hw_.kernels.cpu_mla_ref_gflops.value() * 1e9);
    case TrunkBackend::cpu_bf16:
      if (shapes_ && hw_.model_shapes.mla_decode_gflops.known())
        return (flops + absorb) / (hw_.model_shapes.mla_decode_gflops.value_at(batch) * 1e9);
      if (hw_.kernels.cpu_mla_fast_gflops.known())
        return (flops + absorb) / (hw_.kernels.cpu_mla_fast_gflops.value() * 1e9);
      return std::max(bytes / (hw_.host.mem_read_gbps.value() * 1e9), flops / cpu_bf16_flops());
  }
  return kInf;
}

double CostModel::mla_prefill_flops(int64_t tokens, int64_t context) const {
  const MlaConfig& m = cfg_.mla;
  const double T = double(tokens), C = double(context);
  const double pairs = T * C + T * (T + 1) / 2;  // causal
  return 2.0 * m.num_heads * double(m.q_head_dim() + m.v_head_dim) * pairs * cfg_.num_mla_layers();
}

double CostModel::mla_prefill_seconds(int64_t tokens, int64_t context) const {
  const double flops = mla_prefill_flops(tokens, context);
  const Rate& cpu_rate = opt_.trunk == TrunkBackend::cpu_reference
                             ? hw_.kernels.cpu_mla_ref_prefill_gflops
                             : hw_.kernels.cpu_mla_fast_prefill_gflops;
  const bool shaped = shapes_ && hw_.model_shapes.mla_prefill_gflops.known();
  if (opt_.trunk != TrunkBackend::gpu && (cpu_rate.known() || shaped)) {
    // The CPU's expanded form also expands every cached position through kv_b.
    const MlaConfig& m = cfg_.mla;
    const double expand = 2.0 * double(context + tokens) * m.kv_lora_rank * m.num_heads *
                          double(m.qk_nope_head_dim + m.v_head_dim) * cfg_.num_mla_layers();
    const double gflops =
        shaped ? hw_.model_shapes.mla_prefill_gflops.value_at(double(tokens)) : cpu_rate.value();
    return (flops + expand) / (gflops * 1e9);
  }
  switch (opt_.trunk) {
    case TrunkBackend::gpu: {
      const double rate = hw_.kernels.gpu_mla_prefill_tflops.known()
                              ? hw_.kernels.gpu_mla_prefill_tflops.value() * 1e12
                              : hw_.gpu.bf16_gemm_tflops.value() * 1e12 *
                                    opt_.assumptions.gpu_mla_prefill_gemm_share;
      return flops / rate;
    }
    case TrunkBackend::cpu_reference:
      return flops / cpu_ref_flops();
    case TrunkBackend::cpu_bf16:
      return flops / cpu_bf16_flops();
  }
  return kInf;
}

// ------------------------------------------------------------------------------------------------
// The GPU engine as it runs (engine/cuda_backend.cpp): every launch of a step on one stream, the
// host round trips of the MoE layers, the CPU experts beside the GPU's cached ones, and the
// prefill staging rounds. Fixed costs from bench hw when measured, else CostAssumptions.

double CostModel::gpu_kernel_s() const {
  return hw_.kernels.gpu_kernel_us.value_or(opt_.assumptions.gpu_kernel_us) * 1e-6;
}

double CostModel::gpu_sync_s() const {
  return hw_.kernels.gpu_sync_us.value_or(opt_.assumptions.gpu_sync_us) * 1e-6;
}

double CostModel::stage_copy_gbps() const {
  return hw_.kernels.stage_copy_gbps.value_or(opt_.assumptions.stage_copy_gbps);
}

// A bf16 GEMM y[M, out] = x[M, in]·Wᵀ: a fixed cost plus the weight bytes at the trunk curve's
// rate. The curve is measured at 12288×7168 (tools/bench_kernels_moe.cpp), where the fixed cost is
// already inside the measured time: it is taken out of the per-byte rate there.
double CostModel::gpu_gemm_seconds(double out_features, double in_features, double M) const {
  const RateCurve& own = hw_.model_shapes.gpu_trunk;
  if (gpu_shapes_ && M <= double(own.points.back().tokens))  // fixed costs inside the rate
    return 2.0 * out_features * in_features * own.seconds_per_byte(std::max(1.0, M));
  constexpr double kCurveBytes = 2.0 * 12288 * 7168;
  const double fixed = opt_.assumptions.gpu_gemm_fixed_us * 1e-6;
  const double spb = trunk_spb(std::max(1.0, M));
  return fixed + 2.0 * out_features * in_features * std::max(0.2 * spb, spb - fixed / kCurveBytes);
}

std::vector<std::pair<int64_t, double>> CostModel::tokens_per_expert(int64_t tokens) const {
  std::vector<std::pair<int64_t, double>> h;
  const double E = cfg_.moe.num_experts, k = cfg_.moe.top_k;
  if (E <= 0 || k <= 0 || tokens <= 0) return h;
  const double q = std::min(1.0, k / E);
  if (q >= 1.0) return {{tokens, E}};
  const double mean = double(tokens) * q, sd = std::sqrt(double(tokens) * q * (1 - q));
  const int64_t lo = std::max<int64_t>(1, int64_t(mean - 12 * sd));
  const int64_t hi = std::min<int64_t>(tokens, int64_t(mean + 12 * sd) + 2);
  for (int64_t m = lo; m <= hi; ++m) {
    const double pm = std::exp(log_binom_pmf(tokens, m, q));
    if (pm >= 1e-15) h.push_back({m, E * pm});
  }
  return h;
}

CostModel::EngineStep CostModel::engine_step(const Placement& p, int64_t rows, int seqs,
                                             bool decode, int64_t context, bool logits) const {
  const CostAssumptions& a = opt_.assumptions;
  const ModelConfig& c = cfg_;
  const double T = double(rows), D = c.hidden_size, kern = gpu_kernel_s(), sync = gpu_sync_s();
  EngineStep s;
  double gemm = 0;  // GEMM seconds
  int kernels = 0;
  // Embedding: ids upload and gather; the non-finite record's reset and the embedding's scan.
  kernels += 2;
  const auto& ml = c.mla;
  const auto& mo = c.moe;
  const double L = c.expert_in_dim(), Is = mo.shared_intermediate();
  const double eb = double(costs_.bytes_per_routed_expert);
  const double hbm = hw_.gpu.hbm_copy_gbps.value() * 1e9;
  // MoE layers whose experts are all in the GPU cache group their experts on the device
  // (kernels/moe/groups.h, main b7cb672): no host round trip, unless the prefetcher wants the
  // layer's input or the step has more than 4096 (token, expert) pairs.
  const bool device_groups = a.gpu_device_groups > 0 && gpus_ > 0 && p.gpu >= 1.0 && p.disk <= 0 &&
                             T * mo.top_k <= kDeviceGroupMaxPairs;
  double attention = 0, shared_one = 0, scan = 0, xfer = 0;
  const double d2h = hw_.gpu.d2h_gbps.value_or(a.pcie_default_gbps) * 1e9;
  if (a.gpu_extra_syncs_per_layer <= 0) scan += kern + std::max(kern, T * D * 4 / hbm);
  int moe_layers = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    // The schedule (engine/schedule.cpp): AttnRes mixes, two norms, the residual adds.
    kernels += 2 + (c.opens_block(l) ? 0 : 1) + 1;
    if (c.has_attn_res()) kernels += (l > 0 ? 1 : 0) + 1;
    // The non-finite guard (engine/cuda_backend.cpp check_finite): a scan kernel per site (the
    // mixer's and the FFN's output), read back at the step's existing synchronisations; before
    // main 4880830 a download and host sync per site instead (gpu_extra_syncs_per_layer = 2).
    if (a.gpu_extra_syncs_per_layer > 0) {
      s.syncs += int(a.gpu_extra_syncs_per_layer);
      kernels += int(a.gpu_extra_syncs_per_layer);
    } else {
      scan += 2 * std::max(kern, T * D * 4 / hbm);
    }
    if (c.is_kda(l)) {  // its GEMMs: gpu_step_gemms, after the layers
      kernels += 2;     // bf16 input, output rounding
      if (decode) {
        attention += std::max(kern, 2.0 * double(costs_.kda_state_bytes_per_layer) * T /
                                        (hbm * a.gpu_kda_decode_hbm_efficiency));
      } else {
        const double rate =
            hw_.kernels.gpu_kda_prefill_tflops.known()
                ? hw_.kernels.gpu_kda_prefill_tflops.value() * 1e12
                : hw_.gpu.bf16_gemm_tflops.value() * 1e12 * a.gpu_kda_prefill_gemm_share;
        attention +=
            kda_flops_per_token() / std::max(1, c.num_kda_layers()) * T / rate + 3 * kern * seqs;
      }
    } else {
      const double H = ml.num_heads;
      if (ml.q_lora_rank > 0) kernels += 3;  // rounding, q_a norm, bf16
      if (ml.output_gate) ++kernels;
      kernels += 2 + seqs;  // bf16 input, output rounding, one latent write per sequence
      const double kvb_out = H * double(ml.qk_nope_head_dim + ml.v_head_dim);
      if (decode) {
        const double S = double(std::max<int64_t>(1, context)) + 1;
        const double bytes = T * S * ml.latent_cache_dim() * 2.0;
        const double flops = 2.0 * H * (2.0 * ml.kv_lora_rank + ml.qk_rope_head_dim) * T * S;
        const double rate =
            hw_.kernels.gpu_mla_decode_tflops.known()
                ? hw_.kernels.gpu_mla_decode_tflops.value() * 1e12
                : hw_.gpu.bf16_gemm_tflops.value() * 1e12 * a.gpu_mla_decode_gemm_share;
        // Absorbed form: kv_b is read once per step beside the cache; split + combine kernels.
        attention += std::max(bytes / hbm, flops / rate) +
                     gpu_gemm_seconds(kvb_out, ml.kv_lora_rank, T) + 2 * kern;
      } else {
        const double rate =
            hw_.kernels.gpu_mla_prefill_tflops.known()
                ? hw_.kernels.gpu_mla_prefill_tflops.value() * 1e12
                : hw_.gpu.bf16_gemm_tflops.value() * 1e12 * a.gpu_mla_prefill_gemm_share;
        const double S = double(context) + T;
        const double pairs = T * double(context) + T * (T + 1) / 2;
        attention += 2.0 * H * double(ml.q_head_dim() + ml.v_head_dim) * pairs / rate +
                     gpu_gemm_seconds(kvb_out, ml.kv_lora_rank, S) + 3 * kern * seqs;
      }
    }
    if (!c.is_moe(l)) {  // dense MLP
      kernels += 5;
      continue;
    }
    ++moe_layers;
    kernels += 2;  // bf16 input, route
    if (mo.latent_size > 0)
      kernels += 3 + (mo.latent_norm ? 1 : 0);  // roundings, bf16 of the merge, latent norm
    if (device_groups) {
      kernels += 1 + 2;  // the groups, the merge + its rounding
    } else {
      kernels += 3 + 3 + 2;  // routing to the host, merge lists up, merge + its rounding
      xfer += T * (L + 2.0 * mo.top_k) * 4 / d2h;  // the expert input and the routing, fp32
    }
  }
  // The GEMMs of the layers, the shared experts (their own place on the critical path, below)
  // and lm_head at the rows whose logits are computed.
  const double rows_out = decode ? T : double(seqs);
  double shared_all = 0;
  for (const GpuGemm& m : gpu_step_gemms(c)) {
    if (m.kind == GpuGemm::Kind::head && !logits) continue;
    const double t =
        gpu_gemm_seconds(double(m.out), double(m.in), m.kind == GpuGemm::Kind::head ? rows_out : T);
    (m.kind == GpuGemm::Kind::shared ? shared_all : gemm) += t;
    ++s.gemms;
  }
  if (Is > 0 && moe_layers > 0) shared_one = shared_all / moe_layers + 5 * kern;
  // Head: final mix and norm; logits of the last row of each sequence (decode: every row).
  if (logits) {
    kernels += (c.has_attn_res() ? 1 : 0) + 1 + 4;  // norm, gather, bf16, rounding, download
    xfer += rows_out * c.vocab_size * 4 / d2h;      // fp32 logits to the host
    ++s.syncs;
  } else if (a.gpu_extra_syncs_per_layer <= 0) {
    ++s.syncs;  // commit_step reads the non-finite record of the sites after the last sync
  }
  // The routed experts of each MoE layer, and the host round trip that splits them.
  const auto hist = tokens_per_expert(rows);
  const double g = gpus_ > 0 ? p.gpu : 0.0, nc = 1.0 - g;
  const int thr = threshold_;
  double res_s = 0, res_n = 0, res_pairs = 0, st_n = 0, cpu_s = 0, cpu_n = 0, cpu_pairs = 0,
         touched = 0;
  std::vector<std::pair<int64_t, double>> staged;  // (m, experts)
  for (auto [m, n] : hist) {
    touched += n;
    res_s += g * n * eb * gpu_expert_spb(double(m)) / a.gpu_engine_expert_efficiency;
    res_n += g * n;
    res_pairs += g * n * double(m);
    if (m >= thr) {
      staged.push_back({m, nc * n});
      st_n += nc * n;
    } else {
      cpu_s += nc * n * eb * cpu_expert_spb(double(m)) / a.gpu_engine_cpu_expert_efficiency;
      cpu_n += nc * n;
      cpu_pairs += nc * n * double(m);
    }
  }
  // The grouped launch takes the GEMV path when it has fewer than kExpertGemmMinMeanPairs pairs
  // per group (gpu_expert_gemv_below_mean_pairs) (kernels/moe/experts.cu, automatic; device groups
  // are padded to min(pairs, E)), and the GEMV's cost grows with every pair: each pair at the
  // curve's M = 1 rate. Above it, the curve at each expert's tokens (bench hw measures the
  // automatic path at M tokens per expert).
  const double groups = device_groups ? std::min(res_pairs, double(mo.num_experts)) : res_n;
  if (res_n > 0 && res_pairs < a.gpu_expert_gemv_below_mean_pairs * groups)
    res_s = res_pairs * eb * gpu_expert_spb(1) / a.gpu_engine_expert_efficiency;
  // The grouped launch: its lists up (host groups only), quantize, two GEMVs, GLU, rounding.
  const double launch = (device_groups ? 5 : 8) * kern;
  if (res_n > 0) res_s += launch * std::min(1.0, res_n);
  const double host_us = device_groups ? 0 : a.gpu_moe_host_us * 1e-6;
  if (cpu_n > 0) cpu_s += a.cpu_expert_call_us * 1e-6 * std::min(1.0, cpu_n);
  // Staging rounds of stage_slots experts, the GPU computing a round while the next is copied
  // into the other half of the device slots. Without a store the host copies each expert into
  // pinned memory and the DMA follows it; from the store's page-locked cache (staging_dma, or a
  // disk share) the host only enqueues DMAs, after reading from disk the staged experts the cache
  // does not hold (a round's reads in flight together at the disk's bandwidth), and waits for the
  // last DMAs before the CPU experts run.
  const bool direct = opt_.staging_dma || p.disk > 0;
  const double dma_one = eb / (stage_dma_gbps() * 1e9);
  const double host_one = direct ? 0.0 : eb / (stage_copy_gbps() * 1e9);
  // The staged experts the host cache misses (its LRU under this step's touches) come from disk.
  const double disk_one =
      p.disk > 0 && nc > 0 ? host_miss_share(p, touched) * disk_read_seconds() : 0.0;
  double chain = host_us + res_s, host_t = host_us, stage_gpu = 0, stage_disk = 0;
  if (st_n > 0) {
    double left = st_n, prev_end = chain, prev2_end = 0, dma_end = 0;
    double stage_sum = 0, spb_sum = 0;
    for (auto [m, n] : staged) {
      stage_sum += n;
      spb_sum += n * eb * gpu_expert_spb(double(m)) / a.gpu_engine_expert_efficiency;
    }
    const double per_expert_gpu = spb_sum / stage_sum;
    for (int round = 0; left > 1e-9; ++round) {
      const double n = std::min(left, double(kStageSlotsPerRound));
      const double half_free = round >= 2 ? prev2_end : 0.0;
      const double start = direct ? host_t : std::max(host_t, half_free);
      host_t = start + n * (host_one + disk_one);
      // The DMAs: behind the host's per-expert work (copy or read), at most one DMA apart, and
      // back to back on the copy stream once the half is free.
      const double copies = std::max(host_t + (host_one + disk_one > 0 ? dma_one : 0.0),
                                     std::max({start, half_free, dma_end}) + n * dma_one);
      dma_end = copies;
      const double end = std::max(prev_end, copies) + n * per_expert_gpu + launch;
      prev2_end = prev_end;
      prev_end = end;
      left -= n;
      s.stage_copy_s += n * host_one * moe_layers;
      s.stage_dma_s += n * dma_one * moe_layers;
      stage_disk += n * disk_one * moe_layers;
      stage_gpu += n * per_expert_gpu + launch;
    }
    chain = prev_end;
    if (direct) host_t = std::max(host_t, dma_end);
  }
  // Shared experts: in decode (CUDA graphs) after the join, in prefill beside the CPU experts.
  double join;
  if (decode) {
    join = std::max(chain, host_t + cpu_s) + shared_one;
  } else {
    join = std::max(chain + shared_one, host_t + cpu_s);
  }
  // The CPU rows' upload (fp32, one row per pair).
  if (cpu_n > 0) join += kern + cpu_pairs * L * 4 / (h2d_gbps() * 1e9);
  // Disk (the host cache holds p.host of all experts; engine/offload_executor.cpp): a CPU expert
  // it misses (host_miss_share: its LRU under this step's touches) is read on demand unless the
  // router-lookahead prefetcher predicted it (asynchronously, for every MoE layer but the first).
  // Demand reads hold up their layer's CPU experts in prefill. In decode the disk reads each
  // missed expert once, predicted or not (the store's telemetry on the 8-layer slice, H100
  // machine, 2026-12-06: 71 experts read per B=1 step for 71 missed, 354 per B=8 step for ≈ 363),
  // and the step is at least those reads.
  double demand_n = 0;
  if (p.disk > 0 && moe_layers > 0) {
    const double miss = host_miss_share(p, touched), rho = a.prefetch_recall;
    demand_n = cpu_n * miss * (1 + (moe_layers - 1) * (1 - rho));
    s.syncs += moe_layers;  // the prefetcher's host copy of each MoE input
    xfer += moe_layers * T * D * 4 / d2h;
    s.disk_s = (decode ? moe_layers * cpu_n * miss : demand_n) * disk_read_seconds();
  }
  s.disk_s += stage_disk;
  if (!device_groups) s.syncs += moe_layers;
  if (a.gpu_extra_syncs_per_layer <= 0) kernels += s.syncs;  // the record's download per sync
  s.kernels = kernels;
  s.gpu_dense_s = gemm + kernels * kern + scan + xfer + shared_one * moe_layers;
  s.gpu_attention_s = attention;
  s.gpu_experts_s = (res_s + stage_gpu) * moe_layers;
  s.cpu_experts_s = cpu_s * moe_layers;
  s.staged_experts = st_n * moe_layers;
  s.cpu_experts = cpu_n * moe_layers;
  s.host_s = s.syncs * sync + host_us * moe_layers;
  // Critical path: the stream's own work, the host round trips, and per MoE layer the time from
  // its routing sync to the join (host work, cached + staged + CPU experts, shared experts).
  s.seconds = gemm + kernels * kern + scan + xfer + attention + s.syncs * sync + moe_layers * join;
  s.seconds = std::max(s.seconds + demand_n * disk_read_seconds() * (decode ? 0 : 1), s.disk_s);
  return s;
}

// ------------------------------------------------------------------------------------------------
// Steps

namespace {

std::string pct(double part, double whole) {
  return fmt("%.0f%%", whole > 0 ? 100 * part / whole : 0);
}

}  // namespace

DecodeEstimate CostModel::decode_latency(const Placement& p, int batch, int64_t context) const {
  DecodeEstimate e;
  e.batch = batch;
  e.context = context;
  const int moe_layers = cfg_.num_moe_layers();
  const double U = distinct_experts(batch);
  e.experts_per_layer = U;
  e.tokens_per_expert = U > 0 ? double(batch) * cfg_.moe.top_k / U : 0;
  const double M = std::max(1.0, e.tokens_per_expert);
  const double eb = double(costs_.bytes_per_routed_expert);
  const double n = U * moe_layers;  // expert computations per step
  e.overlap = overlap_description(opt_.overlap, opt_.trunk);
  double step = 0;
  if (opt_.trunk == TrunkBackend::gpu) {
    // The engine as it runs: one stream, CUDA graphs between the host round trips.
    const EngineStep s = engine_step(p, batch, batch, true, context, true);
    double hops = 0;
    if (hw_.nodes > 1) {
      const double lat =
          hw_.network_latency_us.value_or(opt_.assumptions.network_latency_us) * 1e-6;
      const double act =
          double(batch) * cfg_.hidden_size * 4.0 *
          (1 + (cfg_.has_attn_res() ? cfg_.num_layers / cfg_.attn_res_block_size : 0));
      const double bw = hw_.network_gbps.known() ? hw_.network_gbps.value() * 1e9 : kInf;
      hops = (hw_.nodes - 1) * (lat + act / bw);
    }
    e.parts.push_back({fmt("dense trunk: %.0f GEMMs (shared experts included) + %.0f small kernels",
                           s.gemms, s.kernels),
                       "gpu", s.gpu_dense_s});
    e.parts.push_back({"KDA + MLA kernels", "gpu", s.gpu_attention_s});
    e.parts.push_back({"routed experts in the GPU cache", "gpu", s.gpu_experts_s});
    e.parts.push_back({"routed experts on the CPU (host memory)", "cpu", s.cpu_experts_s});
    e.parts.push_back({fmt("host round trips (%.0f syncs) and host work per MoE layer", s.syncs),
                       "host", s.host_s});
    if (s.disk_s > 0) e.parts.push_back({"routed experts read from disk", "disk", s.disk_s});
    if (hops > 0) e.parts.push_back({"pipeline hops between nodes", "network", hops});
    switch (opt_.overlap) {
      case Overlap::serial:
        step = sum_parts(e.parts);
        break;
      case Overlap::moe_layer:
        step = s.seconds + hops;
        break;
      case Overlap::full:
        step = std::max({sum_parts(e.parts, "gpu") + hops, s.cpu_experts_s, s.disk_s});
        break;
    }
  } else {
    // The CPU backends: trunk, attention and experts one after the other on the CPU; disk reads
    // (router-lookahead prefetch) overlap the whole step.
    const double trunk = trunk_seconds(batch);
    const double kda = kda_decode_seconds(batch);
    const double mla = mla_decode_seconds(batch, context);
    // The model's routed step at this batch when the profile timed it (bench hw -m's
    // expert_decode), else the expert curve at the step's mean tokens per expert.
    const RateCurve& dec = hw_.model_shapes.expert_decode;
    const double cpu_exp =
        shapes_ && cfg_.moe.mxfp4 && dec.known() && batch <= dec.points.back().tokens
            ? n * eb / (dec.value_at(double(batch)) * 1e9)
            : n * eb * cpu_expert_spb(M);
    const double disk = p.disk > 0 ? host_miss_share(p, U) * n * disk_read_seconds() : 0;
    double over = cfg_.num_layers * opt_.assumptions.cpu_layer_overhead_us * 1e-6;
    if (opt_.trunk == TrunkBackend::cpu_reference)
      over += ref_linear_calls() * opt_.assumptions.cpu_ref_linear_call_us * 1e-6 +
              moe_layers * opt_.assumptions.cpu_expert_call_us * 1e-6;
    over += fast_fixed_seconds(batch, true);
    e.parts.push_back({"dense trunk (bf16 weights, incl. shared experts)", "cpu", trunk});
    e.parts.push_back({"KDA state", "cpu", kda});
    e.parts.push_back({"MLA attention", "cpu", mla});
    e.parts.push_back({"routed experts on the CPU (host memory)", "cpu", cpu_exp});
    if (disk > 0) e.parts.push_back({"routed experts read from disk", "disk", disk});
    if (over > 0)
      e.parts.push_back({opt_.trunk == TrunkBackend::cpu_bf16
                             ? fmt("fixed costs: %.0f linear calls, %.0f CPU expert jobs, row ops",
                                   fast_linear_calls(true), moe_layers)
                             : fmt("fixed costs: %.0f linear calls, %.0f CPU expert jobs",
                                   ref_linear_calls(), moe_layers),
                         "cpu", over});
    if (const double f = step_factor(batch); f != 1)
      e.parts.push_back({together_part(f), "cpu", (f - 1) * (sum_parts(e.parts) - disk)});
    const double compute = sum_parts(e.parts) - disk;
    step = opt_.overlap == Overlap::serial ? compute + disk : std::max(compute, disk);
  }
  // The bottleneck: the largest part (disk wins when it alone exceeds the compute).
  const TimePart* big = largest(e.parts);
  e.bottleneck = big->name + " (" + pct(big->seconds, step) + " of the step)";
  e.step_s = step;
  e.tokens_per_s = step > 0 ? batch / step : 0;
  return e;
}

DecodeEstimate CostModel::decode_step(const Placement& p, int batch, int64_t context) const {
  const std::string why = p.validate();
  if (!why.empty()) throw Error(why);
  if (gpus_ == 0 && p.gpu > 0)
    throw Error("placement puts " + pct(p.gpu, 1) + " of the experts in a GPU cache, but the " +
                "trunk backend is " + trunk_backend_name(opt_.trunk));
  STRATA_ASSERT(batch >= 1);
  // One GPU, one node's pipeline of G GPUs with fewer sequences than stages, or the CPU: the
  // batch goes through every layer together.
  DecodeEstimate together = decode_latency(p, batch, context);
  if (gpus_ <= 1 || batch < gpus_) return together;
  // G pipeline stages (GPUs, layers split evenly) and B ≥ G sequences: G micro-batches of B/G in
  // flight. Each GPU does its layers for every micro-batch; the host CPU, memory and disks of a
  // node serve the experts of all micro-batches of its layers (smaller micro-batches share fewer
  // experts). The engine may run either way: the faster one is the estimate.
  const int G = gpus_;
  const int mb = (batch + G - 1) / G;
  const DecodeEstimate one = decode_latency(p, mb, context);
  const double gpu_total = sum_parts(one.parts, "gpu");
  const double cpu_total = sum_parts(one.parts, "cpu") * G / hw_.nodes;
  const double disk_total = sum_parts(one.parts, "disk") * G / hw_.nodes;
  const double step = std::max({one.step_s, gpu_total, cpu_total, disk_total});
  const double tps = double(mb) * G / step;
  if (tps <= together.tokens_per_s) {
    together.overlap +=
        fmt("; one batch through the %.0f-GPU pipeline (micro-batches of %.0f "
            "would be slower: %.3g tok/s)",
            G, mb, tps);
    return together;
  }
  DecodeEstimate e = one;
  e.batch = batch;
  e.step_s = step;
  e.tokens_per_s = tps;
  for (auto& t : e.parts)
    if (t.resource != "gpu" && t.resource != "network") t.seconds *= double(G) / hw_.nodes;
  e.overlap +=
      fmt("; pipeline of %.0f GPU stages with %.0f micro-batches of %.0f sequences", G, G, mb);
  if (step == cpu_total && cpu_total > one.step_s)
    e.bottleneck = "routed experts on the CPU (host memory), all micro-batches";
  else if (step == disk_total && disk_total > one.step_s)
    e.bottleneck = "disk reads, all micro-batches";
  return e;
}

PrefillEstimate CostModel::prefill(const Placement& p, int64_t tokens, int64_t chunk) const {
  const std::string why = p.validate();
  if (!why.empty()) throw Error(why);
  if (gpus_ == 0 && p.gpu > 0)
    throw Error("placement puts experts in a GPU cache, but the trunk backend is " +
                std::string(trunk_backend_name(opt_.trunk)));
  STRATA_ASSERT(tokens >= 1 && chunk >= 1);
  PrefillEstimate e;
  e.tokens = tokens;
  e.chunk = chunk;
  e.chunks = (tokens + chunk - 1) / chunk;
  e.stage_threshold = threshold_;
  const bool gpu = opt_.trunk == TrunkBackend::gpu;
  const int moe_layers = cfg_.num_moe_layers();
  const double eb = double(costs_.bytes_per_routed_expert);
  std::string extra;
  double total = 0;
  const int64_t last = tokens - (e.chunks - 1) * chunk;
  if (gpu) {
    // The engine as it runs, chunk by chunk (logits for the last chunk only).
    double dense = 0, attn = 0, gexp = 0, cexp = 0, copy = 0, dma = 0, host = 0, disk = 0;
    for (int64_t i = 0; i < e.chunks; ++i) {
      const bool is_last = i + 1 == e.chunks;
      const EngineStep s = engine_step(p, is_last ? last : chunk, 1, false, i * chunk, is_last);
      dense += s.gpu_dense_s, attn += s.gpu_attention_s, gexp += s.gpu_experts_s;
      cexp += s.cpu_experts_s, copy += s.stage_copy_s, host += s.host_s, disk += s.disk_s;
      dma += s.stage_dma_s;
      e.staged_experts_per_chunk += s.staged_experts / double(e.chunks);
      e.cpu_experts_per_chunk += s.cpu_experts / double(e.chunks);
      switch (opt_.overlap) {
        case Overlap::serial:
          total += s.gpu_dense_s + s.gpu_attention_s + s.gpu_experts_s + s.cpu_experts_s +
                   s.stage_copy_s + s.host_s + s.disk_s;
          break;
        case Overlap::moe_layer:
          total += s.seconds;
          break;
        case Overlap::full:
          total += std::max({s.gpu_dense_s + s.gpu_attention_s + s.gpu_experts_s, s.cpu_experts_s,
                             s.stage_copy_s, s.stage_dma_s, s.disk_s});
          break;
      }
    }
    e.parts.push_back({"dense trunk (bf16 GEMMs) and small kernels", "gpu", dense});
    e.parts.push_back({"KDA (chunked) + MLA attention", "gpu", attn});
    e.parts.push_back({"routed experts on the GPU (cached + staged)", "gpu", gexp});
    e.parts.push_back({"routed experts on the CPU", "cpu", cexp});
    if (copy > 0) e.parts.push_back({"host copies into pinned staging", "pcie", copy});
    if (dma > 0) e.parts.push_back({"staging DMA host->device", "pcie", dma});
    e.parts.push_back({"host round trips", "host", host});
    if (disk > 0) e.parts.push_back({"routed experts read from disk", "disk", disk});
  } else {
    // The CPU backends: everything on the CPU, one chunk after the other; disk reads overlap.
    double t_trunk = 0, t_kda = 0, t_mla = 0, t_cexp = 0, t_disk = 0, t_fixed = 0;
    double t_together = 0, together = 1;  // step_factor's share, its largest factor
    auto expert_s = [&](int64_t C, double* on_cpu, double* touched) {
      double t = 0;
      for (auto [m, n] : tokens_per_expert(C)) {
        t += n * eb * cpu_expert_spb(double(m));
        *on_cpu += n, *touched += n;
      }
      return t;
    };
    for (int64_t i = 0; i < e.chunks; ++i) {
      const int64_t C = i + 1 == e.chunks ? last : chunk;
      double on_cpu = 0, touched = 0;
      const double trunk = trunk_prefill_seconds(C);
      const double kda = kda_prefill_seconds(C), mla = mla_prefill_seconds(C, i * chunk);
      const double cexp = expert_s(C, &on_cpu, &touched) * moe_layers;
      const double disk =
          p.disk > 0 ? touched * host_miss_share(p, touched) * disk_read_seconds() * moe_layers : 0;
      const double fixed = fast_fixed_seconds(C, false);
      t_trunk += trunk, t_kda += kda, t_mla += mla, t_cexp += cexp, t_disk += disk;
      t_fixed += fixed;
      e.cpu_experts_per_chunk += on_cpu * moe_layers / double(e.chunks);
      const double parts = trunk + kda + mla + cexp + fixed;
      const double f = step_factor(C);
      const double t = parts * f;
      t_together += t - parts;
      together = std::max(together, f);
      total += opt_.overlap == Overlap::serial ? t + disk : std::max(t, disk);
    }
    e.parts.push_back({"dense trunk (bf16 GEMMs)", "cpu", t_trunk});
    e.parts.push_back({"KDA (chunked)", "cpu", t_kda});
    e.parts.push_back({"MLA attention (causal)", "cpu", t_mla});
    e.parts.push_back({"routed experts on the CPU", "cpu", t_cexp});
    if (t_fixed > 0)
      e.parts.push_back({fmt("fixed costs: %.0f linear calls per chunk, CPU expert jobs, row ops",
                             fast_linear_calls(false)),
                         "cpu", t_fixed});
    if (t_together != 0) e.parts.push_back({together_part(together), "cpu", t_together});
    if (t_disk > 0) e.parts.push_back({"routed experts read from disk", "disk", t_disk});
  }
  // Pipeline over G GPUs: chunks flow through the stages; with many chunks each GPU's share of
  // the GPU work bounds the time, the host's shared resources do not shrink.
  if (gpus_ > 1 && e.chunks > 1) {
    const double G = gpus_;
    const double gpu_total = sum_parts(e.parts, "gpu") / G;
    const double other =
        std::max({sum_parts(e.parts, "cpu") / hw_.nodes, sum_parts(e.parts, "pcie") / G,
                  sum_parts(e.parts, "disk") / hw_.nodes});
    const double pipelined = std::max(gpu_total, other) + total / double(e.chunks);
    total = std::min(total, pipelined);
    extra = fmt("; chunks pipelined over %.0f GPU stages", G);
  }
  const TimePart* big = largest(e.parts);
  e.bottleneck = big->name + " (" + pct(big->seconds, total) + " of the time)";
  e.total_s = total;
  e.tokens_per_s = total > 0 ? double(tokens) / total : 0;
  e.overlap = overlap_description(opt_.overlap, opt_.trunk) + extra;
  return e;
}

// ------------------------------------------------------------------------------------------------
// Rooflines: hardware peaks only.

// The decode step at hardware peaks, under its data dependencies. A sequence's layers are serial
// (layer l + 1 reads layer l's output), so per MoE layer the CPU's experts overlap only the GPU
// work of that layer's experts (shared and cached routed ones); the rest of the GPU's work (trunk,
// attention, router, head) is serial with them; disk reads, prefetched ahead by the router
// lookahead, overlap the whole step. With B ≥ 2 sequences an engine may instead split the batch
// into m micro-batches and overlap one's CPU experts with another's GPU work — every resource
// busy, but each micro-batch reads the trunk and its own experts again. The roofline is the faster
// of the two schedules (the best m). With several GPUs as pipeline stages and at least as many
// sequences, the micro-batches are in flight on different GPUs: full overlap.
Roofline CostModel::decode_roofline(const Placement& p, int batch, int64_t context) const {
  Roofline r;
  const bool gpu = opt_.trunk == TrunkBackend::gpu;
  const int L = cfg_.num_moe_layers();
  const double eb = double(costs_.bytes_per_routed_expert);
  const double attn_bytes = 2.0 * double(costs_.kda_state_bytes) * batch +
                            double(batch) * double(std::max<int64_t>(1, context)) *
                                double(costs_.mla_cache_bytes_per_token);
  const double trunk_b = double(trunk_bytes());
  const double hbm = gpu ? roofline_peak(hw_.gpu.hbm_copy_gbps, "gpu.hbm_copy_gbps", 1e9, r) : 0;
  const double gemm =
      gpu ? roofline_peak(hw_.gpu.bf16_gemm_tflops, "gpu.bf16_gemm_tflops", 1e12, r) : 0;
  const double mem = roofline_peak(hw_.host.mem_read_gbps, "host.mem_read_gbps", 1e9, r);
  const double disk_peak =
      p.disk > 0 ? roofline_peak(hw_.disk.total_read_gbps(), "disk.read_gbps", 1e9, r) : 0;
  const auto secs = [](double work, double rate) { return rate > 0 ? work / rate : 0.0; };
  const double n = distinct_experts(batch) * L;
  const double disk_s = secs(p.disk * n * eb, disk_peak) / hw_.nodes;
  if (!gpu) {
    // The CPU backends: one resource for trunk, attention and experts; disk overlapped.
    r.assumption =
        "the CPU does trunk, attention and experts (host memory read peak); disk reads overlap "
        "the step (O_DIRECT peak); no kernel rates";
    r.parts.push_back(
        {"host memory read peak", "cpu", secs(n * eb + trunk_b + attn_bytes, mem) / hw_.nodes});
    if (p.disk > 0) r.parts.push_back({"disk O_DIRECT peak", "disk", disk_s});
    finish_roofline(r, std::max(r.parts[0].seconds, disk_s), batch);
    return r;
  }
  const int stages = batch >= gpus_ ? gpus_ : 1;  // GPUs working at once
  const double trunk_flops = 2.0 * double(trunk_b / 2) * batch;
  const double host_share = p.host + p.disk;
  // Full overlap of m micro-batches of ⌈B/m⌉ sequences (m = 1: the plain full-overlap bound).
  const auto overlapped = [&](int m, std::vector<TimePart>& parts) {
    const double nb = distinct_experts(std::ceil(double(batch) / m)) * L * m;
    const double g = secs(m * trunk_b + p.gpu * nb * eb + attn_bytes, hbm) / stages;
    const double f = secs(trunk_flops, gemm) / stages;
    const double h = secs(host_share * nb * eb, mem) / hw_.nodes;
    const double d = secs(p.disk * nb * eb, disk_peak) / hw_.nodes;
    parts = {{"GPU memory (HBM copy peak)", "gpu", g}, {"GPU compute (bf16 GEMM peak)", "gpu", f}};
    if (host_share > 0) parts.push_back({"host memory read peak", "cpu", h});
    if (p.disk > 0) parts.push_back({"disk O_DIRECT peak", "disk", d});
    return std::max({g, f, h, d});
  };
  if (stages > 1) {
    r.assumption =
        "full overlap (pipeline stages with micro-batches in flight): every resource busy at its "
        "measured peak (HBM copy, bf16 GEMM, host memory read, disk O_DIRECT); no kernel rates";
    finish_roofline(r, overlapped(1, r.parts), batch);
    return r;
  }
  // Layer-serial: per MoE layer max(GPU experts, CPU experts); the rest of the GPU serial.
  const double shared_b = double(component_bytes(costs_, "shared_experts"));
  const double gpu_moe_b = shared_b + p.gpu * n * eb;
  const double serial_s =
      std::max(secs(trunk_b - shared_b + attn_bytes, hbm), secs(trunk_flops, gemm));
  const double gpu_moe_s = secs(gpu_moe_b, hbm), cpu_moe_s = secs(host_share * n * eb, mem);
  const double layers_s = serial_s + std::max(gpu_moe_s, cpu_moe_s);
  double best = std::max(layers_s, disk_s);
  int best_m = 0;
  std::vector<TimePart> parts = {
      {"GPU memory (HBM copy peak)", "gpu", serial_s + gpu_moe_s},
  };
  if (host_share > 0)
    parts.push_back(
        {"GPU trunk (HBM copy peak) + CPU experts (host memory read peak), layer "
         "after layer",
         "cpu", serial_s + cpu_moe_s});
  if (p.disk > 0) parts.push_back({"disk O_DIRECT peak", "disk", disk_s});
  for (int m = 2; m <= batch && host_share > 0; ++m) {
    std::vector<TimePart> mp;
    const double t = overlapped(m, mp);
    if (t < best) best = t, best_m = m, parts = mp;
  }
  r.parts = parts;
  r.assumption =
      best_m > 0
          ? fmt("%.0f micro-batches of the %.0f sequences, one's CPU experts under another's GPU "
                "work, every resource busy at its measured peak (faster than layer after layer "
                "here); no kernel rates",
                double(best_m), double(batch))
          : "the decode step's dependencies at measured peaks (HBM copy, bf16 GEMM, host memory "
            "read, disk O_DIRECT): layer after layer, each MoE layer's CPU experts under the GPU's "
            "experts of the same layer, disk reads under the whole step; no kernel rates";
  finish_roofline(r, best, batch);
  return r;
}

Roofline CostModel::prefill_roofline(const Placement& p, int64_t tokens, int64_t chunk) const {
  Roofline r;
  r.assumption =
      "full overlap at hardware peaks; every routed expert a chunk touches is computed where it "
      "is cheaper at peak rates: staged to the GPU (host→device peak, bf16 GEMM peak) or read on "
      "the CPU (host memory read peak); no kernel rates";
  const bool gpu = opt_.trunk == TrunkBackend::gpu;
  const double eb = double(costs_.bytes_per_routed_expert);
  const double fpb = expert_flops_per_byte();
  const int moe_layers = cfg_.num_moe_layers();
  const int64_t chunks = (tokens + chunk - 1) / chunk;
  double gpu_s = 0, pcie_s = 0, host_s = 0, disk_s = 0;
  const double gemm =
      gpu ? roofline_peak(hw_.gpu.bf16_gemm_tflops, "gpu.bf16_gemm_tflops", 1e12, r) : 0;
  const double h2d = gpu ? roofline_peak(hw_.gpu.h2d_gbps, "gpu.h2d_gbps", 1e9, r) : 0;
  const double mem = roofline_peak(hw_.host.mem_read_gbps, "host.mem_read_gbps", 1e9, r);
  const double disk =
      p.disk > 0 ? roofline_peak(hw_.disk.total_read_gbps(), "disk.read_gbps", 1e9, r) : 0;
  double total = 0;
  for (int64_t i = 0; i < chunks; ++i) {
    const int64_t C = std::min(chunk, tokens - i * chunk);
    const double dense_flops = double(trunk_bytes() - head_bytes()) * double(C) +
                               double(head_bytes()) + kda_flops_per_token() * double(C) +
                               mla_prefill_flops(C, i * chunk);
    const double U = distinct_experts(double(C)) * moe_layers;
    const double expert_flops = double(C) * cfg_.moe.top_k * moe_layers * eb * fpb;
    const double nc = gpu ? p.host + p.disk : 1.0;  // share not cached on a GPU
    double g = 0, pc = 0, h = 0;
    if (gpu && gemm > 0) {
      g = (dense_flops + p.gpu * expert_flops) / gemm;
      // Not-cached experts: the cheaper of staging them (PCIe, GEMM) or reading them on the CPU.
      const double staged = std::max(h2d > 0 ? nc * U * eb / h2d : kInf, nc * expert_flops / gemm);
      const double on_cpu = mem > 0 ? nc * U * eb / mem : kInf;
      if (staged <= on_cpu) {
        g += nc * expert_flops / gemm;
        pc = h2d > 0 ? nc * U * eb / h2d : 0;
      } else {
        h = on_cpu;
      }
      g /= gpus_;
    } else if (mem > 0) {
      h = (U * eb + double(trunk_bytes())) / mem;
    }
    const double d = disk > 0 ? p.disk * U * eb / disk : 0;
    gpu_s += g, pcie_s += pc, host_s += h, disk_s += d;
    total += std::max({g, pc, h, d});
  }
  if (gpu) r.parts.push_back({"GPU compute (bf16 GEMM peak)", "gpu", gpu_s});
  if (gpu) r.parts.push_back({"host→GPU staging (h2d peak)", "pcie", pcie_s});
  r.parts.push_back({"host memory read peak", "cpu", host_s});
  if (p.disk > 0) r.parts.push_back({"disk O_DIRECT peak", "disk", disk_s});
  finish_roofline(r, total, double(tokens));
  return r;
}

std::vector<std::string> CostModel::describe_rates() const {
  std::vector<std::string> v;
  if (!rates_basis_.empty()) v.push_back(rates_basis_);
  const CostAssumptions& a = opt_.assumptions;
  const double eb = double(costs_.bytes_per_routed_expert);
  v.push_back(fmt("routed expert: %.2f MB (", eb / 1e6) + (cfg_.moe.mxfp4 ? "MXFP4" : "bf16") +
              fmt("), %.0f per MoE layer, top-%.0f", cfg_.moe.num_experts, cfg_.moe.top_k));
  v.push_back(fmt("dense trunk: %.2f GB of bf16 weights read per step (embedding excluded)",
                  double(trunk_bytes()) / 1e9));
  if (cfg_.num_moe_layers() > 0) {
    std::string s = fmt("CPU expert: %.3f ms at M=1, %.3f ms at M=16 — ",
                        cpu_expert_seconds(1) * 1e3, cpu_expert_seconds(16) * 1e3);
    if (shapes_ && cfg_.moe.mxfp4 && hw_.model_shapes.expert.known())
      s += hw_.model_shapes.expert.source;
    else if (cfg_.moe.mxfp4 && hw_.kernels.cpu_expert.known())
      s += hw_.kernels.cpu_expert.source;
    else
      s += fmt("assumed: %.0f%% of host memory read, ", a.cpu_expert_read_efficiency * 100) +
           (cfg_.moe.mxfp4 ? fmt("%.2f int8 TOPS per core when compute-bound",
                                 hw_.host.avx512 || hw_.host.amx ? a.cpu_expert_tops_per_core_avx512
                                                                 : a.cpu_expert_tops_per_core_avx2)
                           : std::string("oneDNN bf16 when compute-bound"));
    v.push_back(s);
    if (gpus_ > 0) {
      s = fmt("GPU expert: %.1f us at M=1, %.1f us at M=64 — ", gpu_expert_seconds(1) * 1e6,
              gpu_expert_seconds(64) * 1e6);
      if (cfg_.moe.mxfp4 && hw_.kernels.gpu_expert.known())
        s += hw_.kernels.gpu_expert.source;
      else
        s += fmt(
            "assumed: %.0f%% of HBM copy, %.1f%% of the bf16 GEMM peak when compute-bound",
            (cfg_.moe.mxfp4 ? a.gpu_expert_hbm_efficiency : a.gpu_trunk_hbm_efficiency) * 100,
            (cfg_.moe.mxfp4 ? a.gpu_expert_gemm_efficiency : a.gpu_trunk_gemm_efficiency) * 100);
      v.push_back(s);
      v.push_back(fmt("staging one expert host→GPU: %.3f ms (host copy into pinned memory at %.1f "
                      "GB/s, DMA at %.1f GB/s: the slower)",
                      stage_seconds() * 1e3, stage_copy_gbps(), stage_dma_gbps()) +
                  (hw_.gpu.h2d_gbps.known() ? " (" + hw_.gpu.h2d_gbps.source() + ")"
                                            : std::string(" (assumed: PCIe Gen5 x16 effective)")));
      v.push_back(threshold_ == kNever
                      ? std::string("prefill staging threshold: never (the CPU is always faster)")
                      : fmt("prefill staging threshold: %.0f tokens per expert", threshold_));
    }
    if (std::isfinite(disk_read_seconds()))
      v.push_back(fmt("disk read of one expert: %.2f ms at %.2f GB/s (", disk_read_seconds() * 1e3,
                      hw_.disk.total_read_gbps().value()) +
                  fmt("%.0f drive(s))", hw_.disk.count));
  }
  std::string t = fmt("trunk: %.2f ms per decode token, ", trunk_seconds(1) * 1e3) +
                  trunk_backend_name(opt_.trunk) + " — ";
  switch (opt_.trunk) {
    case TrunkBackend::gpu:
      t += hw_.kernels.gpu_trunk.known()
               ? hw_.kernels.gpu_trunk.source
               : fmt("assumed: %.0f%% of HBM copy, %.0f%% of the bf16 GEMM peak",
                     a.gpu_trunk_hbm_efficiency * 100, a.gpu_trunk_gemm_efficiency * 100);
      if (gpu_shapes_)
        t += fmt("; up to M=%.0f: ", hw_.model_shapes.gpu_trunk.points.back().tokens) +
             hw_.model_shapes.gpu_trunk.source;
      break;
    case TrunkBackend::cpu_reference:
      t += hw_.kernels.cpu_trunk_ref.source + " (the fp32 reference, not a fast kernel)";
      break;
    case TrunkBackend::cpu_bf16:
      t += shapes_ && hw_.model_shapes.trunk.known() ? hw_.model_shapes.trunk.source
           : hw_.kernels.cpu_trunk_bf16.known()
               ? hw_.kernels.cpu_trunk_bf16.source
               : fmt("assumed: %.0f%% of host memory read (issue 23's target)",
                     a.cpu_trunk_bf16_read_efficiency * 100);
      break;
  }
  v.push_back(t);
  if (const RateCurve& f = hw_.model_shapes.step_factor;
      opt_.trunk == TrunkBackend::cpu_bf16 && shapes_ && f.known()) {
    std::string pts;
    for (const RatePoint& q : f.points) pts += fmt(" %.0f:", q.tokens) + fmt("%.2f", q.gbps);
    v.push_back("the parts together in a step: x(M)" + pts + " (" + f.source + ")");
  }
  if (gpus_ > 0) {
    auto src = [](const Rate& r) {
      return r.known() ? std::string(" (") + r.source() + ")" : std::string(" (assumed)");
    };
    v.push_back(fmt("GPU engine: small kernel %.1f us", gpu_kernel_s() * 1e6) +
                src(hw_.kernels.gpu_kernel_us) + fmt(", host sync %.0f us", gpu_sync_s() * 1e6) +
                src(hw_.kernels.gpu_sync_us) +
                fmt(", GEMM fixed cost %.1f us, host work per MoE layer %.0f us (assumed)",
                    a.gpu_gemm_fixed_us, a.gpu_moe_host_us));
    if (cfg_.num_moe_layers() > 0)
      v.push_back(fmt("staging host copy %.1f GB/s", stage_copy_gbps()) +
                  src(hw_.kernels.stage_copy_gbps) +
                  fmt(", %.0f experts per round; CPU expert job start %.0f us (assumed)",
                      kStageSlotsPerRound, a.cpu_expert_call_us));
  }
  return v;
}

}  // namespace strata::offload
