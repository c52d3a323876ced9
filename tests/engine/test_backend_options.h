// The backend options the engine tests run most: the bf16 model with routed experts under the
// expert contract (what `--device cpu` and the CUDA backend compute by default).
#pragma once
#include "engine/backend.h"

namespace strata::test {

inline engine::BackendOptions bf16_contract() {
  engine::BackendOptions b;
  b.precision = engine::Precision::bf16;
  b.experts = engine::ExpertNumerics::contract;
  return b;
}

}  // namespace strata::test
