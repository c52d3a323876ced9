// The one model of time (DESIGN decision 9): how long each piece of work takes on a machine, from
// a HardwareProfile (offload/hardware.h) and a ModelConfig. The engine places experts with it (GPU
// cache / host / disk, the prefill staging threshold), `strata plan` predicts a machine with it,
// and `strata bench e2e` compares against its roofline. There is no second copy of these formulas.
//
// What it models (napkin level, every assumption named in CostAssumptions and printed):
//   routed experts  — time = expert weight bytes / kernel rate at M tokens per expert (RateCurve);
//                     staging = bytes / the slower of the host copy into pinned memory and
//                     host→device; disk = bytes / O_DIRECT read bandwidth;
//   dense trunk     — every non-routed weight except the embedding table, bf16, read once per
//                     step: bytes / trunk rate at M = tokens in the step (HBM-bound at M = 1,
//                     GEMM-bound for prefill chunks);
//   KDA             — decode: the fp32 state read and written per token and layer; prefill:
//                     H·(10·64·d + 6·d²) FLOPs per token and layer (chunk 64, kernels/kda);
//   MLA             — decode: the latent cache read per position plus 2·H·(2·kv_lora + rope)
//                     FLOPs per position (absorbed form); prefill: 2·H·(q_dim + v_dim) FLOPs per
//                     (query, key) pair, causal;
//   routing         — flat (Quantile Balancing, spec/offload.md §2.3): a step of B tokens touches
//                     U(B) = E·(1 − (1 − k/E)^B) distinct experts per MoE layer, each with B·k/U
//                     tokens; in prefill the tokens per expert follow Binomial(C, k/E); an expert
//                     is in a tier with the probability of the placement's fraction;
//   the GPU engine  — engine_step: what engine/cuda_backend.cpp does in a step (one stream of
//                     GEMMs and small kernels with fixed costs, a host round trip per MoE layer,
//                     CPU experts beside the cached ones, staging rounds), not a roofline.
// What it does not model: popularity skew (a GPU cache holding x% of experts serves x% of hits),
// NUMA effects beyond the measured read bandwidth, contention between CPU experts and the CPU
// trunk when both run (they are serial on the CPU backend).
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "offload/hardware.h"
#include "storage/config.h"

namespace strata::offload {

// Experts per prefill staging round of the GPU engine (engine/cuda_backend.cpp copies a round into
// one half of 2 × this many device slots while the other half computes).
constexpr int kStageSlotsPerRound = 32;
// The most (token, expert) pairs of a step whose expert groups the GPU engine builds on the device
// (kernels/moe/groups.h kMaxGroupPairs).
constexpr int kDeviceGroupMaxPairs = 4096;
// The mean (token, expert) pairs per group from which the grouped-experts launch leaves the GEMV
// path (kernels/moe/experts.h kGemmMinMeanPairsPerGroup).
constexpr double kExpertGemmMinMeanPairs = 1.5;

// Where the routed experts are served from: shares of all routed experts (sum 1).
struct Placement {
  double gpu = 0;   // resident in the GPU expert cache (computed on the GPU)
  double host = 1;  // resident in host memory only (computed on the CPU in decode; staged to the
                    // GPU in prefill when an expert has ≥ prefill_stage_threshold() tokens)
  double disk = 0;  // read from disk when needed (then as host)
  std::string validate() const;  // "" or why not (negative share, sum ≠ 1)
};

// The fast CPU backend's linear calls of one step (engine/cpu_fast_backend.cpp), layer by layer:
// each call lists the [rows, cols] bf16 matrices it multiplies the same input by. Up to
// cpu::kGemvMaxTokens rows (`fused`) the projections of one input are one GEMV pass; above, one
// oneDNN call each. The logits (lm_head) are not in the list (the caller knows their rows).
struct FastLinearCall {
  std::vector<std::pair<int64_t, int64_t>> matrices;  // [rows, cols] each, same cols
  int layer = 0;                                      // the model layer that makes the call
  bool mlp = false;  // the layer's MLP half (else its attention half)
};
std::vector<FastLinearCall> fast_step_linears(const ModelConfig& c, bool fused);

// The GPU engine's bf16 GEMMs of one step (engine/cuda_backend.cpp), in its order and with its
// fusions (KDA q|k|v, MLA q_a|kv_a, gate|up): y[M, out] = x[M, in]·Wᵀ. `layer` GEMMs and the
// shared experts' run at the step's rows; lm_head (`head`) at the rows whose logits are computed
// (every row in decode, the last of each sequence in prefill). MLA's kv_b (absorbed in decode,
// the cache expansion in prefill) belongs to attention and is not listed. The cost model's engine
// step and `strata bench hw -m`'s GPU probe both take the list from here.
struct GpuGemm {
  enum class Kind { layer, shared, head };
  int64_t out = 0, in = 0;
  Kind kind = Kind::layer;
};
std::vector<GpuGemm> gpu_step_gemms(const ModelConfig& c);

// Distinct experts one MoE layer touches for `tokens` tokens under flat routing (Quantile
// Balancing, spec/offload.md §2.3): E·(1 − (1 − k/E)^tokens); 0 without experts or tokens.
double flat_distinct_experts(const ModelConfig& c, double tokens);

// What identifies a model's shapes for the model-shape probes (HardwareProfile::model_shapes):
// every dimension the fast CPU backend's pieces depend on, and the layer pattern. Two configs
// with the same signature run the same kernels at the same shapes.
std::string model_shape_signature(const ModelConfig& c);

// Which processor runs the dense trunk and attention.
enum class TrunkBackend {
  gpu,            // the CUDA backend (dense parts on the GPUs)
  cpu_reference,  // the fp32 reference ops of cpu/ref (what `strata run` does without a GPU today)
  cpu_bf16,       // the fast CPU backend (issue 23)
};
const char* trunk_backend_name(TrunkBackend b);

// How the pieces of one step overlap. Printed with every estimate.
enum class Overlap {
  serial,     // everything one after the other (a lower bound on speed)
  moe_layer,  // default: per MoE layer, CPU experts run while the GPU does the shared and cached
              // experts; attention, norms and routers are serial; disk reads (prefetched by
              // router lookahead) and staging copies overlap the whole step
  full,       // every resource busy all the time: the step takes the busiest resource's time
};
const char* overlap_name(Overlap o);
std::string overlap_description(Overlap o, TrunkBackend b);

// The defaults used when a kernel rate was not measured: kernel rate = peak × efficiency. Each
// with its source; `describe()` lists the ones a model actually used.
struct CostAssumptions {
  // CPU expert kernel at M = 1 as a share of host memory read (AVX-512: 75–99 % measured on the
  // H200 host, docs/performance.md "CPU expert kernels"; spec/offload.md rule 1 target 60 %).
  double cpu_expert_read_efficiency = 0.75;
  // CPU expert kernel compute rate per core in int8 TOPS when it is compute-bound (large M):
  // 2.55–2.77 TFLOP/s on the H200 host's 16 Xeon cores with AVX-512 VNNI or AMX (the MACs are
  // not the limit there), 0.62 on the dev VM's 2 Zen 5 cores (docs/performance.md "CPU expert
  // kernels"); AVX2 is not measured: half of AVX-512 assumed.
  double cpu_expert_tops_per_core_avx512 = 0.16;
  double cpu_expert_tops_per_core_avx2 = 0.08;
  // oneDNN bf16 matmul per core when host.bf16_tflops is not stated (H200 host AMX: 3.4–4.8
  // TFLOP/s on 16 cores) — for bf16 experts (Kimi-Linear) and the fast CPU trunk.
  double cpu_bf16_tflops_per_core = 0.25;
  // The fast CPU trunk (issue 23, not written yet) streams weights at 80 % of memory read (its
  // target).
  double cpu_trunk_bf16_read_efficiency = 0.80;
  // GPU grouped experts when the hardware file has no measured curve (kernels.gpu_expert): the
  // weight stream at 80 % of HBM copy (H200: the GEMV 97.7 % at one token per expert, the GEMM
  // path's strip form 70–76 % at 1–4), the compute-bound regime at 19 % of the bf16 peak (the GEMM
  // path's wgmma form at a mean of 73 tokens per expert: 152.6 of 803.9 TFLOP/s; it was 4.7 %, the
  // IMMA path's rate, until 2026-12-02; docs/performance.md "MoE experts on the GPU").
  double gpu_expert_hbm_efficiency = 0.80;
  double gpu_expert_gemm_efficiency = 0.19;
  // GPU trunk: GEMV at 85 % of HBM copy, GEMM at 90 % of the bf16 peak (kernels/gemm measured).
  double gpu_trunk_hbm_efficiency = 0.85;
  double gpu_trunk_gemm_efficiency = 0.90;
  // Kernel rates as shares of the bf16 GEMM peak measured in the same run (docs/performance.md
  // "KDA", "MLA"): KDA prefill 3.29 M token-layers/s = 57.0 TFLOP/s on an H100 (7.2 % of 794;
  // chunk_prep_tc2, 2026-12-06), MLA prefill 533 TFLOP/s (66 % of 803 on an H100, tma_fa3_pp,
  // 2026-12-07), MLA decode 335 TFLOP/s at B = 16 (42 % of 803 on an H100, attn_tma, 2026-12-07;
  // bound by the cache's bytes); KDA decode streams its state at 40–50 % of HBM copy at batch 1
  // (90 % at 64).
  double gpu_kda_prefill_gemm_share = 0.072;
  double gpu_mla_prefill_gemm_share = 0.66;
  double gpu_mla_decode_gemm_share = 0.42;
  double gpu_kda_decode_hbm_efficiency = 0.5;
  // Host↔GPU copies when not measured: PCIe Gen5 x16 ≈ 55 GB/s effective (spec §2.1).
  double pcie_default_gbps = 55;
  // The GPU engine as it runs (engine/cuda_backend.cpp), its fixed costs when the hardware file
  // does not state them (kernels.gpu_kernel_us, gpu_sync_us, stage_copy_gbps; bench hw does not
  // measure them yet). docs/planner.md "The GPU engine" says where each comes from:
  //   one small kernel or async copy in the stream (norm, add, rounding, conversion, routing,
  //   merge, non-finite scan), graph-launched or eager, µs (assumed);
  double gpu_kernel_us = 3.0;
  //   a cuBLASLt GEMM's fixed cost beyond its weight bytes, µs (the small decode GEMMs measure
  //   8–12 µs alone with their launch, docs/performance.md "Trunk GEMMs"; assumed 4 in a stream);
  double gpu_gemm_fixed_us = 4.0;
  //   one host synchronisation: the graph segment before it launched, the stream drained, the
  //   host woken and its next launch reaching the GPU, µs; one per MoE layer (routing to the
  //   host) and one for the logits. Fitted: the 4-layer k3-slice all-cached decode B=1 on the
  //   H200 (304.8 tok/s, docs/performance.md "End to end", engine with a host sync per non-finite
  //   check) with docs/hardware/h200-measured.json;
  double gpu_sync_us = 50;
  //   host work per MoE layer between the routing sync and the expert launches (grouping, lists),
  //   and starting/joining the CPU expert job when there is one (µs);
  double gpu_moe_host_us = 15;
  double cpu_expert_call_us = 20;
  //   the CPU experts of the GPU engine read their weights from the mmapped checkpoint (page
  //   cache, 4 KiB pages; or the host expert cache), not from the bound, huge-page buffers bench
  //   hw times the CPU expert kernel on: this share of the measured curve's rate. Calibrated on
  //   the H200 (run 10 of 2026-12-02, docs/performance.md "Planner validation"): the engine's
  //   CPU-expert seconds per step (telemetry) against this model's at 1.0, 8-layer slice, 10 %
  //   GPU + host and all host, B = 1 and 8: 15.88 / 14.08, 17.61 / 15.53, 68.79 / 58.24,
  //   74.96 / 64.25 ms = 0.89, 0.88, 0.85, 0.86 of the curve;
  double gpu_engine_cpu_expert_efficiency = 0.87;
  //   the GPU engine's grouped experts launch 16–64 experts per MoE layer, bench hw's curve 128 per
  //   call: this share of the curve's rate (the 16-expert decode line 3470 GB/s against bench hw's
  //   4177 at M = 1: 0.83; the 4-layer slice's prefill 4096 all cached: 0.86);
  double gpu_engine_expert_efficiency = 0.85;
  //   host memcpy of an expert into pinned staging (TBB over all cores): the engine's telemetry
  //   line ("host copy") of the 4-layer slice runs in docs/performance.md "End to end": 1743–1920
  //   experts in 1.36–1.40 s = 21.9–24.8 GB/s;
  double stage_copy_gbps = 23;
  //   the staging DMAs of the GPU engine's prefill rounds against the measured host→device peak
  //   (one DMA per expert array, an event per expert, the in-flight FIFO's waits): its staging
  //   loop moved 62.90 GB in 1.364 s (all host, prefill 4096) and 57.00 GB in 1.163 s (10 % GPU +
  //   host) on the H100 machine at a 53.05 GB/s peak (2026-12-05, run 12, bench e2e --host-cache
  //   telemetry "staged ... host s"): 0.87 and 0.92;
  double gpu_staging_dma_efficiency = 0.9;
  //   host synchronisations per layer besides the MoE routing: the engine before main 4880830
  //   downloaded and checked the mixer's and the FFN's output on the host (2); now 0 (scans on
  //   the stream, read at the existing syncs);
  double gpu_extra_syncs_per_layer = 0;
  //   1: MoE layers whose experts are all cached group them on the device, without a host round
  //   trip (main b7cb672); 0: the engine before it (every MoE layer's routing to the host);
  double gpu_device_groups = 1;
  //   the grouped-experts launch runs the GEMV path below this mean of pairs per group (main
  //   8f03932: kExpertGemmMinMeanPairs, the GEMM path above — 4 until the crossing was measured,
  //   1.5 since; before 8f03932 12, the IMMA path above);
  double gpu_expert_gemv_below_mean_pairs = kExpertGemmMinMeanPairs;
  // Router-lookahead prefetch (engine/offload_executor.cpp, depth 2): share of a layer's experts
  // it predicts right (recall at distance 1 on k3-mini: 49.5–75 %, docs/performance.md "Expert
  // I/O"; on the 8-layer slice 70.6 % at B=1, 90.6 % at B=8). The experts it missed are read on
  // demand, on a prefill step's path; decode counts each missed expert's read once either way.
  double prefetch_recall = 0.5;
  // Fixed cost per layer and step on the CPU reference backend (norms, AttnRes, small ops), µs.
  double cpu_layer_overhead_us = 0;
  // The CPU reference's linear (cpu/ref/linear.cpp) is one TBB parallel_for over all cores per
  // call: its fork, join and last tile, µs per call beyond the bytes at the measured rate (which
  // bench hw takes on one 64 MiB weight; a decode step makes ~115 calls on k3-mini, most on
  // 1–8 MB weights). Assumed.
  double cpu_ref_linear_call_us = 10;
  // Network hop between pipeline stages on different nodes (when the profile states none), µs.
  double network_latency_us = 10;
};

// One named piece of a step's time, on one resource, before overlap.
struct TimePart {
  std::string name;      // "trunk", "routed experts (CPU)", "disk reads", ...
  std::string resource;  // "gpu", "cpu", "host memory", "disk", "pcie", "network"
  double seconds = 0;
};

struct DecodeEstimate {
  int batch = 1;
  int64_t context = 0;
  double step_s = 0;             // one step: every sequence of the batch advances one token
  double tokens_per_s = 0;       // batch / step_s (aggregate)
  double experts_per_layer = 0;  // U(batch): distinct routed experts touched per MoE layer
  double tokens_per_expert = 0;  // batch · top_k / U
  std::vector<TimePart> parts;   // per step, before overlap
  std::string bottleneck;        // the part (resource) that sets step_s, in words
  std::string overlap;           // the overlap assumption in words
};

struct PrefillEstimate {
  int64_t tokens = 0, chunk = 0, chunks = 0;
  double total_s = 0;
  double tokens_per_s = 0;
  int stage_threshold = 0;  // experts with ≥ this many tokens in a chunk go to the GPU
  double staged_experts_per_chunk = 0;  // over all MoE layers
  double cpu_experts_per_chunk = 0;
  std::vector<TimePart> parts;  // whole prefill, before overlap
  std::string bottleneck;
  std::string overlap;
};

// Hardware-peak-only bound for `strata bench e2e`: every resource busy all the time at its
// measured peak (HBM copy, bf16 GEMM peak, host memory read, host→device, disk O_DIRECT) — never
// our kernels' rates. Unknown peaks are reported in `missing` and leave their resource out.
struct Roofline {
  double seconds = 0;       // decode: one step; prefill: the whole prompt
  double tokens_per_s = 0;  // aggregate
  std::vector<TimePart> parts;
  std::string bound;  // the resource that sets it
  std::string assumption;
  std::vector<std::string> missing;
};

struct CostOptions {
  TrunkBackend trunk = TrunkBackend::gpu;
  int gpus = -1;  // GPUs used in total (pipeline stages over layers); -1 = all in the profile
  Overlap overlap = Overlap::moe_layer;
  // The host share lives in the tiered store's page-locked cache (--host-mem; bench e2e
  // --host-cache), so the GPU engine stages prefill experts by DMA straight from it, with no host
  // copy (engine/cuda_backend.cpp). Implied for placements with a disk share (the store exists),
  // whose staged experts outside the cache are read from disk first.
  bool staging_dma = false;
  CostAssumptions assumptions;
};

class CostModel {
 public:
  // Throws strata::Error when the options need what the profile lacks (trunk on the GPU without a
  // GPU; a rate with neither a measurement nor a peak to derive it from), naming the field.
  CostModel(const HardwareProfile& hw, const ModelConfig& cfg, CostOptions opt = {});

  const HardwareProfile& hardware() const { return hw_; }
  const ModelConfig& config() const { return cfg_; }
  const ModelCosts& costs() const { return costs_; }
  const CostOptions& options() const { return opt_; }
  int gpus() const { return gpus_; }  // resolved: pipeline stages on the GPU backend, else 0

  // --- one routed expert of this model (the engine's placement decisions) ---
  double cpu_expert_seconds(int tokens) const;  // on the CPU, weights in host memory
  double gpu_expert_seconds(int tokens) const;  // on one GPU, weights in its cache; +inf w/o GPU
  // Staging one expert to the GPU: the slower of the host copy into pinned memory and the DMA, or
  // the DMA alone with staging_dma; +inf without a GPU.
  double stage_seconds() const;
  double disk_read_seconds() const;  // O_DIRECT read of one expert; +inf w/o disk rate
  // Share of the expert accesses outside the GPU cache that the host cache misses (read from
  // disk) in steady state when each step touches `touched_per_layer` of a MoE layer's experts, the
  // layers in turn; c is the cache's share of the experts outside the GPU cache, f the share of a
  // layer a step touches. A narrow step (f ≤ c) finds an expert still cached at its next use only
  // if fewer distinct experts came between (the store evicts by recency and frequency,
  // offload/expert_store.h): with f of every layer touched per step, its next use k steps later
  // finds it when k ≤ ln(1 − c) / ln(1 − f). A wider step is a scan to the store (its layers need
  // more than the cache holds): its reads are evicted first, newest first, so the cache keeps what
  // it held but for the slots one layer's reads take — a hit share of c − f/L over L MoE layers
  // (a prefill chunk touching every expert: c − 1/L). 0 without a disk share.
  double host_miss_share(const Placement& p, double touched_per_layer) const;
  // Smallest tokens-per-expert M for which staging + GPU compute beats the CPU:
  // stage_seconds() + gpu_expert_seconds(M) < cpu_expert_seconds(M). kNever when no M up to
  // 1 << 20 does (or there is no GPU).
  static constexpr int kNever = std::numeric_limits<int>::max();
  int prefill_stage_threshold() const;

  // --- dense parts, per token or step ---
  uint64_t trunk_bytes() const;  // bf16 bytes of every non-routed weight except the embedding
  uint64_t head_bytes() const;   // lm_head (part of trunk_bytes)
  // The trunk for a decode step of M tokens (M = batch; every token goes through lm_head) on the
  // trunk backend, over all layers and GPUs.
  double trunk_seconds(int64_t tokens) const;
  // The trunk for a prefill chunk of M tokens: the layers at M, lm_head for the last token only
  // (the engine computes the prompt's last logits, not all of them).
  double trunk_prefill_seconds(int64_t tokens) const;
  double shared_expert_seconds(int64_t tokens) const;  // the shared experts' part of the trunk
  // KDA over all KDA layers: a decode step of `batch` sequences, or a prefill chunk of `tokens`.
  // Linear calls of one step of the fast CPU backend: decode (the projections of one input fused
  // into one GEMV pass) or prefill (one oneDNN call per matrix).
  int fast_linear_calls(bool decode) const;
  // The fast CPU backend's per-step costs beyond bytes and FLOPs (bench hw's linear call and row
  // ops; the routed experts' jobs): 0 for the other backends.
  double fast_fixed_seconds(int64_t tokens, bool decode) const;
  // How much longer the fast CPU backend's parts take together in a step of `tokens` than alone
  // (bench hw -m's step probe, ModelShapeRates::step_factor): 1 for the other backends or without
  // it. The CPU step is the sum of its parts times this; the difference is a part of its own.
  double step_factor(int64_t tokens) const;
  static std::string together_part(double factor);
  double kda_decode_seconds(int batch) const;
  double kda_prefill_seconds(int64_t tokens) const;
  // MLA over all MLA layers: a decode step of `batch` sequences with `context` cached positions
  // each; a prefill chunk of `tokens` queries after `context` positions already cached.
  double mla_decode_seconds(int batch, int64_t context) const;
  double mla_prefill_seconds(int64_t tokens, int64_t context) const;

  // --- whole steps for a placement ---
  DecodeEstimate decode_step(const Placement& p, int batch, int64_t context) const;
  PrefillEstimate prefill(const Placement& p, int64_t tokens, int64_t chunk) const;

  // --- hardware-peak rooflines (bench e2e) ---
  Roofline decode_roofline(const Placement& p, int batch, int64_t context) const;
  Roofline prefill_roofline(const Placement& p, int64_t tokens, int64_t chunk) const;

  // flat_distinct_experts for this model.
  double distinct_experts(double tokens) const { return flat_distinct_experts(cfg_, tokens); }

  // The rates the model uses, one line each, "measured" or "assumed: <why>" — printed by plan and
  // bench e2e so a prediction can be traced to its inputs. The first line is rates_basis() when
  // there is one.
  std::vector<std::string> describe_rates() const;
  // The fast CPU backend only: which probes its rates come from — the profile's model-shape
  // rates (measured for this model's signature) or the K3-shaped ones, and why. "" otherwise.
  const std::string& rates_basis() const { return rates_basis_; }
  bool uses_model_shapes() const { return shapes_; }

  // --- the GPU engine as it runs (engine/cuda_backend.cpp; docs/planner.md "The GPU engine") ---
  // One step of `rows` rows over `seqs` sequences on one GPU stream: decode (one row per
  // sequence, `context` cached positions each, CUDA graphs: shared experts after the CPU join) or
  // a prefill chunk (`context` = positions before it; logits for the last row only when
  // `logits`). The step's critical path and its parts.
  struct EngineStep {
    double seconds = 0;          // critical path: GPU stream + host round trips + waits
    double gpu_dense_s = 0;      // trunk GEMMs (shared experts included) and small kernels
    double gpu_attention_s = 0;  // KDA and MLA kernels
    double gpu_experts_s = 0;    // grouped experts from the cache and staged
    double cpu_experts_s = 0;    // CPU experts (the host, beside the GPU)
    double stage_copy_s = 0;     // host copies into pinned staging (serial on the host)
    double stage_dma_s = 0;      // staging DMAs host → GPU (the copy stream)
    double host_s = 0;           // synchronisations and host work per MoE layer
    double disk_s = 0;           // disk reads (demand and prefetch), overlapping the step
    int kernels = 0, gemms = 0, syncs = 0;
    double staged_experts = 0, cpu_experts = 0;  // over all MoE layers
  };
  EngineStep engine_step(const Placement& p, int64_t rows, int seqs, bool decode, int64_t context,
                         bool logits) const;
  double gpu_gemm_seconds(double out_features, double in_features, double M) const;
  double gpu_kernel_s() const;
  double gpu_sync_s() const;
  double stage_copy_gbps() const;
  // Expected number of experts of one MoE layer with exactly m tokens, for a step of `tokens`
  // routed tokens under flat routing (Binomial(tokens, k/E) per expert): (m, experts) pairs.
  std::vector<std::pair<int64_t, double>> tokens_per_expert(int64_t tokens) const;

 private:
  double cpu_expert_spb(double M) const;  // seconds per expert weight byte
  double gpu_expert_spb(double M) const;
  double trunk_spb(double M) const;  // seconds per trunk weight byte at M tokens
  double expert_flops_per_byte() const;
  double cpu_bf16_flops() const;
  double cpu_ref_flops() const;
  double h2d_gbps() const;
  double stage_dma_gbps() const;       // h2d_gbps at the engine's staging efficiency
  double kda_flops_per_token() const;  // over all KDA layers
  int ref_linear_calls() const;        // linear calls of one step of the CPU reference backend
  double mla_prefill_flops(int64_t tokens, int64_t context) const;
  DecodeEstimate decode_latency(const Placement& p, int batch, int64_t context) const;

  HardwareProfile hw_;
  ModelConfig cfg_;
  ModelCosts costs_;
  CostOptions opt_;
  int gpus_ = 0;
  int threshold_ = kNever;
  bool shapes_ = false;  // hw_.model_shapes were measured for this model and are used
  // hw_.model_shapes.gpu_trunk was measured for this model: the GPU engine's GEMMs at up to its
  // last point's rows take its rate (the step's own list timed back to back) instead of the
  // K3-shaped trunk curve.
  bool gpu_shapes_ = false;
  std::string rates_basis_;
};

}  // namespace strata::offload
