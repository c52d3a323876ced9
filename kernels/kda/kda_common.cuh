// KDA device helpers shared by the prefill and decode kernels (not a public header).
#pragma once
#include "kernels/kda/cuda_util.cuh"
#include "kernels/kda/kda.h"

namespace strata::kernels::kda::detail {

using namespace strata::kernels::detail;

constexpr int kD = 128;  // K = V = 128: the only head size K3 and Kimi-Linear use

// Log-space decay g for one channel (spec §4.3); a = exp(A_log[h]), x = z + dt_bias.
__device__ __forceinline__ float gate_value(GateForm form, float a, float x, float lower_bound) {
  return form == GateForm::bounded ? lower_bound * sigmoidf_(a * x) : -a * softplusf_(x);
}

inline Status check_params(const Params& p, const Inputs& in, const State& st) {
  if (p.K != kD || p.V != kD) return invalid("kda: only K = V = 128 is supported");
  if (p.H <= 0) return invalid("kda: H must be positive");
  if (!p.conv_q || !p.conv_k || !p.conv_v || !p.A_log || !p.dt_bias || !p.o_norm_w)
    return invalid("kda: a parameter pointer is null");
  if (!in.q || !in.k || !in.v || !in.z || !in.b || !in.gate)
    return invalid("kda: an input pointer is null");
  if (in.qkv_stride < int64_t(p.H) * kD) return invalid("kda: qkv_stride < H·128");
  if (!st.recurrent || !st.conv) return invalid("kda: a state pointer is null");
  return Status{};
}

}  // namespace strata::kernels::kda::detail
