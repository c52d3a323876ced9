// The fp32 reference ops of strata — the oracle every other path is checked against
// (DESIGN decision 1, spec/model.md). Plain functions on row-major float arrays; shapes are given
// as `// [T, H, K]` comments; math runs in fp32 in the order spec/model.md writes it.
//
// What this is not: fast. linear() is blocked and TBB-parallel so small models run interactively,
// but nothing here uses ISA-specific code. Results do not depend on the number of threads: every
// output element is computed by one thread in a fixed order.
//
// Precision: every op that has an internal rounding point in the bf16 model (spec §12 item 2)
// takes a Precision. Precision::bf16 reproduces those internal roundings; rounding a GEMM output
// (linear) or a residual add is the caller's (round_bf16_inplace). Precision::fp32 never rounds.
//
// Weights are views (WeightView) over data that stays where it is (the mmapped checkpoint): BF16,
// F32 or MXFP4 (compressed-tensors packed nibbles + E8M0 scales). Kernels widen rows to fp32 on
// the fly; no full fp32 copy of a big weight is ever made.
#pragma once
#include <cstdint>
#include <vector>

namespace strata::cpu::ref {

enum class Precision { fp32, bf16 };

// ------------------------------------------------------------------------------------------------
// Weight views

enum class WeightFormat : uint8_t { f32, bf16, mxfp4 };

// A [rows, cols] matrix (logical shape; y = x·Wᵀ so rows = out features, cols = in features).
// f32:   data = const float*, row-major.
// bf16:  data = const uint16_t* (raw bf16 bits), row-major.
// mxfp4: data = weight_packed bytes [rows, cols/2] (low nibble = even column), scale = E8M0
//        weight_scale bytes [rows, cols/32]; cols must be a multiple of 32.
struct WeightView {
  const void* data = nullptr;
  WeightFormat format = WeightFormat::f32;
  int64_t rows = 0, cols = 0;
  const uint8_t* scale = nullptr;  // mxfp4 only

  static WeightView f32(const float* p, int64_t rows, int64_t cols) {
    return {p, WeightFormat::f32, rows, cols, nullptr};
  }
  static WeightView bf16(const uint16_t* p, int64_t rows, int64_t cols) {
    return {p, WeightFormat::bf16, rows, cols, nullptr};
  }
  static WeightView mxfp4(const uint8_t* packed, const uint8_t* scale, int64_t rows, int64_t cols) {
    return {packed, WeightFormat::mxfp4, rows, cols, scale};
  }
  // Rows [r0, r0+n) as a view of their own (e.g. one head's slice of kv_b).
  WeightView row_slice(int64_t r0, int64_t n) const;
  // Widen row r to fp32 (exact for every format; MXFP4 E8M0 0xFF gives NaN).
  void widen_row(int64_t r, float* out) const;  // out: [cols]
  // Widen the whole matrix (for small weights only: norms, conv taps).
  std::vector<float> to_f32() const;
};

// Round n floats to the nearest bf16 value in place (RNE) — the caller's GEMM-output rounding.
void round_bf16_inplace(float* x, int64_t n);
// round_bf16_inplace only when p == Precision::bf16.
void round_if(Precision p, float* x, int64_t n);

// ------------------------------------------------------------------------------------------------
// Linear

// y = x · Wᵀ, fp32 accumulation, W [N, K] any format. Never rounds. Each y element is one dot
// product in a fixed order (8 interleaved partial sums, documented in linear.cpp), so results do
// not depend on T, tiling or threads: decoding a token gives the bits prefill gives for it.
// x: [T, K]   y: [T, N]
void linear(const float* x, const WeightView& W, float* y, int64_t T);

// ------------------------------------------------------------------------------------------------
// Norms (spec §3). Rows are independent; D is the normalised length.

// KimiRMSNorm (§3.1): r = rsqrt(mean(x²) + eps); y = x·r; bf16 mode: y = bf16(y), out =
// bf16(w·y); fp32 mode: out = w·y. w: [D] (fp32 values; bf16 weights widen exactly).
// x, out: [rows, D] (may alias).
void kimi_rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t D, float eps,
                   Precision p);

// Plain RMSNorm without weight (AttnRes keys): out = x·rsqrt(mean(x²) + eps), fp32, never rounds.
void rms_norm(const float* x, float* out, int64_t rows, int64_t D, float eps);

// L2 norm (§3.3): out = x·rsqrt(Σx² + eps) (eps added to the sum, not a mean). bf16 mode rounds the
// output (the chunk path stores it in bf16); the decode path keeps fp32 (pass Precision::fp32).
void l2_norm(const float* x, float* out, int64_t rows, int64_t D, float eps, Precision p);

// FusedRMSNormGated (§3.2), per head vector: out = o·rsqrt(mean(o²)+eps)·w·sigmoid(gate), fp32
// throughout, w fp32 [D]; bf16 mode rounds once at the end. o, gate, out: [rows, D] (rows = T·H).
void gated_rms_norm(const float* o, const float* gate, const float* w, float* out, int64_t rows,
                    int64_t D, float eps, Precision p);

// ------------------------------------------------------------------------------------------------
// Activations and GLUs (spec §8)

float sigmoid(float x);   // 1 / (1 + exp(-x)), fp32
float silu(float x);      // x · sigmoid(x)
float softplus(float x);  // log1p(exp(x)), x for x > 20 (torch threshold 20)

// SiTU-GLU: out = (β1·tanh(g/β1)·sigmoid(g)) · (β2·tanh(u/β2)); beta2 <= 0 → the up factor is u.
// bf16 mode: one rounding of out. g, u, out: [n] (out may alias g or u).
void situ_glu(const float* g, const float* u, float* out, int64_t n, float beta1, float beta2,
              Precision p);
// SwiGLU: out = silu(g)·u, one rounding in bf16 mode.
void silu_glu(const float* g, const float* u, float* out, int64_t n, Precision p);

enum class GluKind { situ, silu };
struct Glu {
  GluKind kind = GluKind::silu;
  float beta1 = 4.0f, beta2 = 25.0f;  // SiTU only; beta2 <= 0: no cap on the up branch
};
void glu(const Glu& act, const float* g, const float* u, float* out, int64_t n, Precision p);

// MLA output gate (§5.2 step 6): o ← o·sigmoid(g). bf16 mode: s = bf16(sigmoid(g)), o = bf16(o·s).
// o, g: [n].
void sigmoid_gate_inplace(float* o, const float* g, int64_t n, Precision p);

// ------------------------------------------------------------------------------------------------
// KDA (spec §4)

// Short causal depthwise conv + SiLU (§4.2 step 2), per channel c:
//   y_t[c] = SiLU( Σ_{j<W} w[c, j] · x_{t-W+1+j}[c] )   (tap W-1 multiplies the current token)
// with the W-1 previous pre-conv inputs taken from `state` (zero for a fresh sequence).
// x: [T, C] pre-conv projection output; w: [C, W] fp32 (checkpoint [C, 1, W]);
// state: [C, W-1] in/out, per channel oldest first (the last W-1 pre-conv inputs), or nullptr for
// zero history and no state out. y: [T, C] (must not alias x). bf16 mode rounds y once.
void short_conv_silu(const float* x, const float* w, float* state, float* y, int64_t T, int64_t C,
                     int64_t W, Precision p);

enum class KdaGateForm {
  bounded,   // K3: g = lower_bound · sigmoid(exp(A_log[h]) · (z + dt_bias))
  softplus,  // Kimi-Linear: g = −exp(A_log[h]) · softplus(z + dt_bias)
};
struct KdaGate {
  KdaGateForm form = KdaGateForm::bounded;
  const float* A_log = nullptr;    // [H] per head (K3: the first H of the stored 128)
  const float* dt_bias = nullptr;  // [H·K], index h·K + d
  float lower_bound = -5.0f;       // bounded form only
};
// Log-space decay g (fp32). z: [T, H, K] raw decay logits; g: [T, H, K] (may alias z).
void kda_gate(const KdaGate& gate, const float* z, float* g, int64_t T, int64_t H, int64_t K);

// beta = sigmoid(b), fp32. b, beta: [n] (n = T·H; may alias).
void kda_beta(const float* b, float* beta, int64_t n);

// The recurrence core. Inputs already prepared: q, k L2-normalised (NOT scaled; `scale` multiplies
// q inside, spec: K^-1/2), g log-space decay, beta in (0, 1).
// q, k: [T, H, K]; v: [T, H, V]; g: [T, H, K]; beta: [T, H]; o: [T, H, V].
// state: [H, V, K] fp32 in/out (the engine's layout, FLA state_v_first: S'[v][k] = S[k][v]);
// nullptr = zero initial state, final state discarded.
//
// Naive recurrent form (§4.4), per head and token: S ← S·diag(exp g) (decay key columns);
// pred = S k; u = β(v − pred); S ← S + u kᵀ; o = S (scale·q).
void kda_recurrent(const float* q, const float* k, const float* v, const float* g,
                   const float* beta, float* state, float* o, int64_t T, int64_t H, int64_t K,
                   int64_t V, float scale);

// Chunked WY/UT form (§4.5), chunk length `chunk` (64 as FLA); same contract and result as
// kda_recurrent up to fp32 rounding (tests/cpu/ref_kda_test.cpp bounds the difference).
void kda_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                 float* state, float* o, int64_t T, int64_t H, int64_t K, int64_t V, float scale,
                 int64_t chunk = 64);

// ------------------------------------------------------------------------------------------------
// MLA (spec §5), NoPE

struct MlaDims {
  int64_t H = 0;        // heads
  int64_t nope = 0;     // qk_nope_head_dim
  int64_t rope = 0;     // qk_rope_head_dim (never rotated)
  int64_t v = 0;        // v_head_dim
  int64_t kv_lora = 0;  // kv_lora_rank
  int64_t q_dim() const { return nope + rope; }
  int64_t cache_dim() const { return kv_lora + rope; }
  float scale() const;  // (nope + rope)^-1/2
};

// From kv_a_proj_with_mqa outputs to latent-cache rows (§5.2 steps 2–3): latent part normalised
// with kv_a_layernorm (KimiRMSNorm, eps — 1e-6 in the release), rope part copied unchanged.
// ckv: [T, kv_lora + rope]; w_norm: [kv_lora]; cache_rows: [T, kv_lora + rope] (may alias ckv).
void mla_latent_rows(const float* ckv, const float* w_norm, float* cache_rows, int64_t T,
                     const MlaDims& d, float eps, Precision p);

// Causal attention of T queries at positions S−T .. S−1 over the latent cache of S positions.
// q: [T, H, nope + rope] (the q_b_proj / q_proj output, split nope | rope per head);
// cache: [S, kv_lora + rope] (normalised latent | shared rope key), e.g. built by mla_latent_rows;
// kv_b: [H·(nope + v), kv_lora], head h rows h·(nope+v) … = [k_nope rows | v rows];
// out: [T, H, v] (the attention output before the output gate and o_proj).
//
// Expanded (§5.2, the HF/prefill order): k_nope, v = ĉ·kv_bᵀ per cached position (rounded to
// bf16 in bf16 mode, a GEMM output), k = [k_nope | k_pe], fp32 softmax; bf16 mode rounds out.
void mla_attention_expanded(const float* q, const float* cache, int64_t S, const WeightView& kv_b,
                            const MlaDims& d, float* out, int64_t T, Precision p);
// Absorbed (§5.3, decode): q_lat = W_UKᵀ q_nope per head, scores over the latent cache,
// o = W_UV · Σ_s p_s ĉ_s. Equal to expanded up to fp32 rounding; bf16 mode rounds q_lat and out.
void mla_attention_absorbed(const float* q, const float* cache, int64_t S, const WeightView& kv_b,
                            const MlaDims& d, float* out, int64_t T, Precision p);

// ------------------------------------------------------------------------------------------------
// AttnRes (spec §6.2)

// n sources, each [T, D] raw (banked blocks then the partial sum P). Per token:
// key_i = RMSNorm(src_i; eps) (no weight); logit_i = Σ_d key_i[d]·(norm_w[d]·proj_w[d]) (the
// folded pseudo-query, in the order of the TorchTitan reference behind golden/k3-tiny);
// p = softmax_i(logit) (fp32); out = Σ_i p_i·src_i (raw values); bf16 mode rounds out once.
// norm_w, proj_w: [D] fp32. out: [T, D] (may be one of the sources, e.g. P, updated in place).
void attn_res_mix(const float* const* sources, int64_t n, const float* norm_w, const float* proj_w,
                  float* out, int64_t T, int64_t D, float eps, Precision p);

// ------------------------------------------------------------------------------------------------
// Router (spec §7.1, §7.2)

enum class RouterForm {
  unbiased,         // K3: weights = sigmoid scores of the selected experts
  biased_in_place,  // Kimi-Linear quirk: weights = (sigmoid + bias) of the selected experts
};
struct RouterParams {
  int64_t E = 0;     // experts
  int64_t topk = 0;  // experts per token
  RouterForm form = RouterForm::unbiased;
  bool renormalize = true;      // moe_renormalize: w / (Σw + 1e-20)
  float scaling = 1.0f;         // routed_scaling_factor
  const float* bias = nullptr;  // e_score_correction_bias [E], nullptr = none
};
// logits: [T, E] fp32 router logits (linear of the fp32 input, never rounded).
// ids: [T, topk] selected expert ids sorted by increasing id, weights: [T, topk] aligned with ids.
// ranked (optional, may be nullptr): [T, topk] the selection in order of decreasing biased score
// (ties → lower id), the record of how the choice was made.
// Selection: top-k of sigmoid(logit) + bias, ties broken toward the lower expert id.
void route(const float* logits, const RouterParams& rp, int32_t* ids, float* weights,
           int32_t* ranked, int64_t T);
// The weights route() gives a given selection (routing replay, forced experts): ids [T, topk]
// (kept in the given order; sums run in that order, so sorted ids reproduce route() exactly),
// weights [T, topk] aligned with ids. Throws strata::Error for an id outside [0, E).
void route_weights(const float* logits, const RouterParams& rp, const int32_t* ids, float* weights,
                   int64_t T);

// ------------------------------------------------------------------------------------------------
// Expert FFNs

// One GLU MLP: y = down( glu(gate·x, up·x) ). gate, up: [I, D]; down: [D, I]; any WeightFormat
// (bf16 dense experts, shared experts, dense layer 0, and MXFP4 routed experts in exact mode:
// rows dequantised to fp32 on the fly, never a whole expert). bf16 mode rounds the gate/up GEMM
// outputs, the GLU output and y (HF: bf16 GEMMs over the dequantised weights). x must already be in
// the precision the caller wants (bf16 values in bf16 mode).
// x: [T, D]; y: [T, D].
struct GluMlp {
  WeightView gate, up, down;
};
void glu_mlp(const float* x, const GluMlp& m, const Glu& act, float* y, int64_t T, Precision p);

// Exact-mode routed expert, K3 layout: w1 = gate, w3 = up, w2 = down (MXFP4 views).
struct Mxfp4Expert {
  WeightView w1, w3, w2;
};
void expert_ffn_mxfp4(const float* x, const Mxfp4Expert& e, const Glu& act, float* y, int64_t T,
                      Precision p);
// bf16 dense expert (Kimi-Linear experts, w1/w3/w2 bf16).
void expert_ffn_dense(const float* x, const GluMlp& e, const Glu& act, float* y, int64_t T,
                      Precision p);

// MoE merge step (numerics.md §5 order): acc[i] = acc[i] + (w·y[i]), fp32, no FMA. n elements.
void accumulate_weighted(float* acc, const float* y, float w, int64_t n);

}  // namespace strata::cpu::ref
