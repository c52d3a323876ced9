// Scalar contract mode of the routed-expert FFN; see cpu/expert_contract.h and docs/numerics.md.
#include "cpu/expert_contract.h"

#include "storage/error.h"

namespace strata::cpu {

namespace c = strata::contract;

QuantizedVector quantize_activation(const float* x, int K) {
  STRATA_ASSERT(K > 0 && K % c::kBlock == 0);
  QuantizedVector r;
  r.q.resize(size_t(K));
  r.e.resize(size_t(K / c::kBlock));
  for (int b = 0; b < K / c::kBlock; ++b)
    if (!c::quantize_block(x + b * c::kBlock, r.q.data() + b * c::kBlock, &r.e[size_t(b)]))
      r.poisoned = true;
  return r;
}

void project_contract(const uint8_t* packed, const uint8_t* scale, int rows, int K,
                      const QuantizedVector& xq, float* out) {
  STRATA_ASSERT(K % c::kBlock == 0 && int(xq.q.size()) == K);
  const int nb = K / c::kBlock;
  for (int o = 0; o < rows; ++o) {
    if (xq.poisoned) {
      out[o] = c::canonical_nan();
      continue;
    }
    const uint8_t* prow = packed + size_t(o) * size_t(K / 2);
    const uint8_t* srow = scale + size_t(o) * size_t(nb);
    double L[c::kLanes];
    for (double& l : L) l = 0.0;
    for (int b = 0; b < nb; ++b) {
      int32_t d = 0;
      for (int i = 0; i < c::kBlock; ++i) {
        int col = b * c::kBlock + i;
        d += int32_t(xq.q[size_t(col)]) * c::weight_x2(prow, col);
      }
      c::lane_add(L, b, c::block_term(d, xq.e[size_t(b)], srow[b]));
    }
    out[o] = c::lane_finish(L);
  }
}

void expert_ffn_contract(const Mxfp4ExpertView& w, const float* x, float* y, const GluParams& glu) {
  const int H = w.hidden, I = w.inter;
  STRATA_ASSERT(H > 0 && I > 0 && H % c::kBlock == 0 && I % c::kBlock == 0);
  QuantizedVector xq = quantize_activation(x, H);
  std::vector<float> g(static_cast<size_t>(I)), u(static_cast<size_t>(I)),
      h(static_cast<size_t>(I));
  project_contract(w.w1_packed, w.w1_scale, I, H, xq, g.data());
  project_contract(w.w3_packed, w.w3_scale, I, H, xq, u.data());
  for (int i = 0; i < I; ++i) h[size_t(i)] = c::glu(g[size_t(i)], u[size_t(i)], glu);
  QuantizedVector hq = quantize_activation(h.data(), I);
  project_contract(w.w2_packed, w.w2_scale, H, I, hq, y);
}

}  // namespace strata::cpu
