// HardwareProfile: what a machine (or a cluster of identical nodes) can do, as rates — measured by
// `strata bench hw` on this machine, or stated in a hardware description for the planner (a
// machine nobody here has). The one input of the cost model (offload/cost_model.h) besides the
// model's config; the engine, `strata plan` and `strata bench e2e` all read it.
//
// Two kinds of numbers:
//   * hardware peaks — HBM copy, bf16 GEMM, host↔device, host memory read, disk O_DIRECT: what the
//     silicon does, measured with the simplest possible loop (the roofline uses only these);
//   * kernel rates — what OUR kernels reach on this machine (the CPU MXFP4 expert kernel, the GPU
//     grouped-experts kernel, the trunk GEMMs, the fp32 reference trunk): what the engine will do.
// A rate that was not measured or stated is empty (Rate::known() false), never 0: the cost model
// then derives it from a peak with a named, printed assumption (CostAssumptions), or says it
// cannot.
//
// Not here: measuring (offload/hw_measure.h, `strata bench hw`), the time of work (cost_model.h).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace strata::offload {

// A rate (or size) that may be unknown. `source` says where it came from: "measured: <what>" for
// bench hw, a datasheet or a paper for a stated number, "assumed: <why>" for a derived default.
class Rate {
 public:
  Rate() = default;
  Rate(double value, std::string source = {})  // NOLINT: a number is a known rate
      : known_(true), value_(value), source_(std::move(source)) {}
  bool known() const { return known_; }
  double value() const;  // asserts known()
  double value_or(double fallback) const { return known_ ? value_ : fallback; }
  const std::string& source() const { return source_; }

 private:
  bool known_ = false;
  double value_ = 0;
  std::string source_;
};

// A kernel's rate as a function of M, the tokens each weight row is used for in one call (tokens
// per expert for expert kernels, tokens per step for the trunk). The value at each point is the
// WEIGHT bytes processed per second (GB/s): time = weight bytes / rate(M). For weight-streaming
// kernels this one unit covers both regimes — memory-bound at small M (rate ≈ bandwidth) and
// compute-bound at large M (rate ≈ FLOP/s ÷ (FLOPs per weight byte · M)) — and scales to another
// shape of the same weight format by bytes alone.
struct RatePoint {
  int tokens = 1;   // M
  double gbps = 0;  // weight bytes per second / 1e9 at M
};
struct RateCurve {
  std::vector<RatePoint> points;  // sorted by tokens, distinct tokens, gbps > 0
  std::string source;             // "measured: strata bench cpu-experts, avx512, 2 threads"
  bool known() const { return !points.empty(); }
  // Seconds per weight byte at M tokens: linear interpolation of seconds/byte between points;
  // below the first point the first point's value; above the last point seconds/byte grows ∝ M
  // from the last point (the compute-bound limit). Asserts known() and M ≥ 1.
  double seconds_per_byte(double M) const;
  // For a curve whose values are not weight bytes per second (a FLOP rate, a time per token): the
  // value at M, linear between points and clamped to the first and last point. Asserts known().
  double value_at(double M) const;
};

struct GpuSpec {
  int count = 0;               // GPUs per node (0 = no GPU)
  std::string name;            // "NVIDIA H200"
  int compute_capability = 0;  // major·10 + minor: 90 = sm_90; 0 = unknown
  uint64_t memory_bytes = 0;   // per GPU, as the driver reports it (0 = unknown)
  Rate hbm_copy_gbps;          // per GPU; a copy of N bytes counts 2N (kernels/peaks.h)
  Rate bf16_gemm_tflops;       // per GPU; dense bf16 GEMM peak (cuBLASLt 8192³)
  Rate h2d_gbps;               // per GPU; pinned host → device, large copies
  Rate d2h_gbps;               // per GPU; device → pinned host
  Rate peer_gbps;              // GPU ↔ GPU in one node (NVLink or PCIe), per direction
};

struct HostSpec {
  std::string cpu_name;
  int cores = 0;       // physical cores per node
  int numa_nodes = 0;  // 0 = unknown
  // ISA; a description that does not state one leaves it false (the model then assumes less).
  bool avx2 = false, avx512 = false, avx512_vnni = false, avx512_bf16 = false, amx = false;
  uint64_t dram_bytes = 0;  // per node
  Rate mem_read_gbps;       // all cores streaming reads (bench cpu-experts' "memory read (peak)")
  Rate bf16_tflops;         // oneDNN bf16 matmul peak, all cores
};

struct DiskSpec {
  int count = 0;     // drives per node holding the checkpoint (striped or mirrored reads)
  Rate read_gbps;    // per drive, O_DIRECT large reads at queue depth (bench io's raw line)
  std::string what;  // "Samsung PM1743 Gen5" / "virtio disk of /tmp"
  // All drives of a node together (count · read_gbps); unknown when either is.
  Rate total_read_gbps() const;
};

// The K3 routed-expert shape (3584 → 3072 → 3584, released MXFP4 layout: 17,547,264 bytes).
inline constexpr int kK3ExpertHidden = 3584, kK3ExpertInter = 3072;
inline constexpr uint64_t kK3ExpertBytes = 3ull * (uint64_t(kK3ExpertInter) * kK3ExpertHidden / 2 +
                                                   uint64_t(kK3ExpertInter) * kK3ExpertHidden / 32);

// The small expert shape bench hw also measures (a latent MoE's: 512 → 384 → 512, 0.31 MB in
// MXFP4, k3-mini's routed experts): per weight byte such experts cost more than K3's (the per-token
// work — quantizing x, the GLU, h — is a larger share of a small expert), and the cost model
// interpolates between the two shapes by expert size.
inline constexpr int kSmallExpertHidden = 512, kSmallExpertInter = 384;
inline constexpr uint64_t kSmallExpertBytes =
    3ull * (uint64_t(kSmallExpertInter) * kSmallExpertHidden / 2 +
            uint64_t(kSmallExpertInter) * kSmallExpertHidden / 32);

// Our kernels' measured rates on this machine (empty = not measured; see cost_model.h for the
// default the model then uses).
struct KernelRates {
  RateCurve cpu_expert;        // CPU MXFP4 expert kernel, contract numerics (cpu/expert_kernels.h)
  RateCurve cpu_expert_small;  // the same kernel on small experts (offload/hw_measure.h:
                               // kSmallExpertHidden → kSmallExpertInter; k3-mini's shape)
  RateCurve gpu_expert;        // grouped_experts (kernels/moe), MXFP4 contract
  RateCurve gpu_trunk;         // bf16 trunk GEMMs/GEMVs (kernels/gemm), bytes of bf16 weights
  RateCurve cpu_trunk_ref;     // the fp32 reference linear (cpu/ref/linear.cpp) on bf16 weights:
                               // what `strata run` on the CPU does today
  RateCurve cpu_trunk_bf16;    // the fast CPU backend's bf16 trunk (issue 23; not written yet)
  // Attention, per layer. KDA decode streams the fp32 state (read + write); MLA decode reads the
  // latent cache; prefill of both is FLOP-bound.
  Rate gpu_kda_prefill_tflops;  // kernels/kda chunked prefill, FLOPs as in cost_model.h
  Rate gpu_mla_prefill_tflops;  // kernels/mla prefill
  Rate gpu_mla_decode_tflops;   // kernels/mla decode (absorbed)
  Rate cpu_kda_ref_state_gbps;  // cpu::ref::kda_recurrent, state bytes (read + write) per second
  Rate cpu_mla_ref_gflops;      // cpu::ref::mla_attention_absorbed, FLOPs per second
  // Prefill forms of the reference: kda_chunked at the FLOPs of cost_model.h, and
  // mla_attention_expanded counting the causal pairs and the per-position kv_b expansion.
  Rate cpu_kda_ref_prefill_gflops;
  Rate cpu_mla_ref_prefill_gflops;
  // The fast CPU backend (engine/cpu_fast_backend.cpp, `--device cpu`), measured by `strata bench
  // hw` with its kernels: one bf16 linear call's fixed cost beyond its bytes (a TBB fork/join
  // over all threads and the activation conversion: cpu::gemv_bf16 on a 64×1024 weight), µs;
  Rate cpu_linear_call_us;
  // the fast mixers (cpu/mixer_kernels.h) at the reference probes' shapes: KDA decode state bytes
  // (read + write) per second, MLA absorbed decode FLOPs, chunked KDA and expanded MLA prefill
  // FLOPs (counted as for the reference);
  Rate cpu_kda_fast_state_gbps;
  Rate cpu_mla_fast_gflops;
  Rate cpu_kda_fast_prefill_gflops;
  Rate cpu_mla_fast_prefill_gflops;
  // the row ops of one layer for one token (two KimiRMSNorms, two AttnRes mixes over 4 sources, a
  // residual add, a GLU over 3 hidden widths) per 1024 of hidden width, ns.
  Rate cpu_row_ops_ns;
  // The GPU engine's fixed costs (engine/cuda_backend.cpp), measured by `strata bench hw`:
  Rate gpu_kernel_us;    // one small kernel in a CUDA graph of many (launch gap included), µs
  Rate gpu_sync_us;      // host round trip: a tiny kernel + 4-byte D2H copy + stream sync, µs
  Rate stage_copy_gbps;  // host memcpy of one expert into pinned memory over all cores (staging)
};

// The fast CPU backend's pieces timed at ONE model's shapes (`strata bench hw -m DIR`): the bench
// hw probes above are K3-shaped (64 MiB matrices, 17.5 MB experts, 8 heads at context 4096), and a
// small model's shapes run well below them, with fixed costs per call and per step that bytes do
// not show. Each field is the same quantity the cost model takes from KernelRates, measured at
// that model's shapes and token counts, so the model's formulas stay the same
// (offload/cost_model.h uses these instead of the K3-shaped rates when `signature` matches the
// model it predicts, and says which it used). Curves are indexed by the tokens of the step: M
// rows per linear call (trunk), tokens per expert (expert), sequences of a decode step
// (expert_decode), sequences of a decode step or prompt length (attention, row ops). Empty
// signature = not measured.
struct ModelShapeRates {
  std::string signature;  // offload::model_shape_signature() of the model measured
  std::string model;      // what was measured, in words ("/tmp/k3-mini: kimi_k3, 9 layers, ...")
  int threads = 0;        // CPU threads the probes ran on
  int64_t context = 0;    // cached positions of the MLA decode probe
  // The step's linear calls as the backend makes them (projections of one input fused into one
  // GEMV pass up to kGemvMaxTokens rows, one oneDNN call per matrix above) over the model's own
  // matrices, GB/s of bf16 weights at M, with `linear_call_us` per call taken out (the cost model
  // adds it back per call). Up to kGemvMaxTokens: a decode step (lm_head at M rows); above: a
  // prefill chunk's layers (the engine computes only the last row's logits).
  RateCurve trunk;
  Rate linear_call_us;  // one linear call's fixed cost (as kernels.cpu_linear_call_us), same run
  // A MoE layer's routed experts at the model's expert shape as the engine runs them
  // (cpu::RoutedExperts and the backend's per-token merge) for the step whose flat random routing
  // gives M tokens per touched expert; GB/s of the touched experts' weights, the CPU expert job's
  // start (CostAssumptions::cpu_expert_call_us) taken out.
  RateCurve expert;
  // The same routed step at B decode sequences (B tokens routed flat at random, at most
  // kGemvMaxTokens), by B. Its mean tokens per expert (B·k / U(B)) falls between the `expert`
  // curve's M = 1 and 2 for every decode batch, and those two points are steps of other widths
  // (1 token on k experts; the fewest tokens giving 2 per touched expert, 53 experts on k3-mini).
  RateCurve expert_decode;
  // The whole KDA core of one layer as the backend runs it (short convs, gate, beta, L2 norms,
  // recurrence or chunked form, rounding, gated output norm): decode at B sequences in GB/s of
  // state read + written; prefill of a T-token prompt in GFLOP/s counted as the cost model does.
  RateCurve kda_decode_gbps, kda_prefill_gflops;
  // MLA core of one layer: absorbed decode of B sequences at `context` positions, GFLOP/s counted
  // as the cost model does (cache positions and the per-query kv_b absorption); expanded prefill
  // of a T-token prompt, GFLOP/s (causal pairs + kv_b expansion).
  RateCurve mla_decode_gflops, mla_prefill_gflops;
  // The row ops of one average layer of this model at M tokens (AttnRes mixes, norms, adds,
  // GLUs, routing, gates), ns per token, layer and 1024 of hidden width (as
  // kernels.cpu_row_ops_ns).
  RateCurve row_ops_ns;
  // The probes above run together as a step at M tokens (layer by layer, in the backend's order,
  // one entry of the thread pool) against each part timed alone over the same step: the step's
  // time over the parts' sum, by M. The cost model's CPU step is the sum of its parts times this.
  RateCurve step_factor;
  // The GPU engine's bf16 GEMMs of a decode step (offload::gpu_step_gemms: every layer's, the
  // shared experts', lm_head at M rows) at M rows, timed back to back on the GPU (`strata bench
  // hw -m DIR` on a machine with one): GB/s of their weights, the GEMMs' fixed costs inside. The
  // trunk probe of KernelRates times one shape (12288 × 7168); a model's fused and larger matrices
  // stream at other rates.
  RateCurve gpu_trunk;
  bool known() const { return !signature.empty(); }
};

struct HardwareProfile {
  std::string description;  // "this machine (measured 2026-12-02)" / "8×H200 + 2 TB DRAM"
  std::string source;       // the file it was read from ("" when measured in this process)
  int nodes = 1;            // identical nodes
  Rate network_gbps;        // between nodes, per node, per direction
  Rate network_latency_us;  // one hop
  GpuSpec gpu;
  HostSpec host;
  DiskSpec disk;
  KernelRates kernels;
  ModelShapeRates model_shapes;           // `bench hw -m DIR`: one model's own shapes
  std::vector<std::string> not_measured;  // what `bench hw` tried and could not measure, and why

  int total_gpus() const { return nodes * gpu.count; }
};

// JSON form. Format tag: "format": "strata-hardware-1". Every rate is either a number or
// {"value": number, "source": "..."}; a missing field is "not measured". Sizes accept numbers
// (bytes) or strings with a unit ("141GB", "2TiB", "512 GiB").
// Example (docs/hardware/*.json hold full ones):
//   {"format": "strata-hardware-1", "description": "1×H200 + 1.5 TB",
//    "nodes": 1,
//    "gpu": {"count": 1, "name": "NVIDIA H200", "compute_capability": "9.0",
//            "memory": "141GB", "hbm_copy_gbps": 4300, "bf16_gemm_tflops": 750,
//            "h2d_gbps": 55, "d2h_gbps": 55},
//    "host": {"cores": 64, "dram": "1.5TB", "mem_read_gbps": 480, "isa": ["avx512", "amx"]},
//    "disk": {"count": 4, "read_gbps": 12.5},
//    "kernels": {"cpu_expert": [{"tokens": 1, "gbps": 300}, {"tokens": 16, "gbps": 90}]}}
nlohmann::json to_json(const HardwareProfile& hw);
// Throws strata::Error with one line naming `source_name`, the field ("gpu.memory") and what was
// expected, for: bad JSON, a wrong format tag, wrong types, negative or zero rates, unknown fields
// (a typo must not silently mean "not measured").
HardwareProfile hardware_from_json(const nlohmann::json& j, const std::string& source_name);
HardwareProfile load_hardware(const std::filesystem::path& file);
// Writes the profile; refuses (strata::Error) to replace an existing file unless `overwrite`.
void save_hardware(const HardwareProfile& hw, const std::filesystem::path& file, bool overwrite);

// What this process can see without measuring anything (fast): hwloc cores and NUMA nodes, CPUID
// ISA, DRAM size, CPU name, CUDA device count/name/memory/compute capability. Rates stay unknown.
HardwareProfile probe_static();

// Fields of `extra` fill the fields `base` lacks (rates, curves, sizes); `base` wins where both
// have one. For "load a saved profile, measure what it lacks".
HardwareProfile merge(const HardwareProfile& base, const HardwareProfile& extra);

// Multi-line human summary: one line per component with its known rates and their sources.
std::string describe(const HardwareProfile& hw);

// "141GB", "1.5TB", "512GiB", "512 GiB", "80e9" (bytes) → bytes. Throws strata::Error (the message
// names the text; the caller adds the field).
uint64_t parse_size_bytes(const std::string& text);
std::string format_bytes(double bytes);  // "17.5 MB", "1.45 TB" (decimal units)

// Compute capability (major·10 + minor) from a GPU model name ("H100-80GB" → 90, "A100" → 80);
// 0 when the name is not known.
int compute_capability_of(const std::string& gpu_name);

// The GPUs this build runs on: sm_90 (H100, H200, GH200). Empty string when supported, else the
// reason ("NVIDIA A100 is sm_80; this build targets sm_90 (H100/H200) only").
std::string gpu_unsupported_reason(const GpuSpec& g);

}  // namespace strata::offload
