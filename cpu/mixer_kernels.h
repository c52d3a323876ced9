// Fast CPU cores of the token mixers for the fast CPU backend: the KDA recurrence (decode) and its
// chunked form (prefill), the gated MLA attention over the latent cache (absorbed for decode,
// expanded for prefill). Same contracts, shapes and bf16 rounding points as their references in
// cpu/ref/ops.h (kda_recurrent, kda_chunked, mla_attention_absorbed, mla_attention_expanded);
// AVX-512 where the CPU has it (the state rows, latent rows and bf16 kv_b rows in zmm registers,
// TBB over heads), the reference ops otherwise.
//
// Numerics: the same operations as the references in other summation orders (vector lanes, then
// a tree) — fp32 rounding differences only; the softmax is the references' (std::exp, double
// denominator); the chunked KDA's exponentials are a vector exp within 2 ulp of std::exp, and
// e^(G_r − G_j) of rows in different 16-row blocks is formed as a product of two factors.
// tests/cpu/mixer_kernels_test.cpp bounds the differences.
//
// Not here: projections, convolutions, gates, norms (the backend's linear layers and row ops).
#pragma once
#include <cstdint>

#include "cpu/bf16_linear.h"
#include "cpu/ref/ops.h"

namespace strata::cpu {

// Whether the AVX-512 cores run here (else every call below is the reference op).
bool mixer_kernels_avx512();

// ref::kda_recurrent's contract. state: [H, V, K] in/out (nullptr: zero, discarded).
void kda_recurrent_fast(const float* q, const float* k, const float* v, const float* g,
                        const float* beta, float* state, float* o, int64_t T, int64_t H, int64_t K,
                        int64_t V, float scale);

// One sequence's part of a batched recurrence: its rows of q, k, g [T, H, K], v [T, H, V],
// beta [T, H], o [T, H, V] and its state [H, V, K] (nullptr: zero, discarded).
struct KdaSeq {
  const float *q, *k, *v, *g, *beta;
  float* state;
  float* o;
  int64_t T;
};
// kda_recurrent_fast of n sequences in one call (one parallel loop over their heads instead of
// n): each sequence's outputs and state are the bits of its call alone.
void kda_recurrent_seqs_fast(const KdaSeq* seqs, int64_t n, int64_t H, int64_t K, int64_t V,
                             float scale);

// ref::kda_chunked's contract with chunk 64 (the form the reference backend runs for T > 1).
void kda_chunked_fast(const float* q, const float* k, const float* v, const float* g,
                      const float* beta, float* state, float* o, int64_t T, int64_t H, int64_t K,
                      int64_t V, float scale);

// ref::mla_attention_absorbed's contract (kv_b bf16 rows are read in place).
void mla_attention_absorbed_fast(const float* q, const float* cache, int64_t S,
                                 const ref::WeightView& kv_b, const ref::MlaDims& d, float* out,
                                 int64_t T, ref::Precision p);

// Decode queries of several sequences in one call: query j (q: [H, nope + rope]) attends to all
// len ≥ 1 rows of its own latent cache; out: [H, v]. Each output is ref::mla_attention_absorbed's
// contract for that query alone (T = 1, S = len), with the same bits as
// mla_attention_absorbed_fast on it alone; kv_b is read once per group of queries, not per query.
struct MlaDecodeQuery {
  const float* q = nullptr;
  const float* cache = nullptr;
  int64_t len = 0;
  float* out = nullptr;
};
void mla_attention_absorbed_batch_fast(const MlaDecodeQuery* qs, int64_t n,
                                       const ref::WeightView& kv_b, const ref::MlaDims& d,
                                       ref::Precision p);

// ref::mla_attention_expanded's contract; in bf16 mode the per-position expansion ĉ·kv_bᵀ (a
// GEMM of the bf16 latents, rounded) goes through `lin`; fp32 mode is the reference op.
void mla_attention_expanded_fast(const float* q, const float* cache, int64_t S,
                                 const ref::WeightView& kv_b, const ref::MlaDims& d, float* out,
                                 int64_t T, ref::Precision p, Bf16Linear& lin);

namespace detail {
void kda_recurrent_avx512(const KdaSeq* seqs, int64_t n, int64_t H, int64_t K, int64_t V,
                          float scale);
void kda_chunked_avx512(const float* q, const float* k, const float* v, const float* g,
                        const float* beta, float* state, float* o, int64_t T, int64_t H, int64_t K,
                        int64_t V, float scale);
// Query j: qs[j].q [H, nope + rope] over its cache rows 0 … len − 1, out [H, v].
void mla_absorbed_avx512(const MlaDecodeQuery* qs, int64_t nq, const uint16_t* kv_b,
                         const ref::MlaDims& d, bool round_bf16);
// Attention of T queries over S expanded positions: kv [S, H, nope + v] (k_nope | v per head),
// the shared rope keys in the cache rows.
void mla_expanded_attention_avx512(const float* q, const float* cache, int64_t S, const float* kv,
                                   const ref::MlaDims& d, float* out, int64_t T, bool round_bf16);
}  // namespace detail

}  // namespace strata::cpu
