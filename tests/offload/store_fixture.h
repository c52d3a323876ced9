// A synthetic expert layout over a temp file for the offload tests: L layers × E experts, each
// expert two spans at unaligned offsets (as tensors sit in safetensors shards), file bytes a known
// pattern so any handle's bytes can be checked, and any use of a freed (0xFF-poisoned) slot shows.
#pragma once
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "offload/expert_store.h"
#include "test_util.h"

namespace strata::test {

inline uint8_t file_pattern(uint64_t i) {
  return uint8_t((i * 2654435761ull) >> 11) ^ uint8_t(i >> 17) ^ 0x5a;
}

struct SyntheticExperts {
  offload::ExpertLayout layout;
  std::filesystem::path file;
  uint64_t expert_bytes = 0;

  // Layer 0 has no routed experts (a dense layer), layers 1..L-1 have E each.
  SyntheticExperts(const std::string& name, int L, int E, uint64_t span_a, uint64_t span_b) {
    auto dir = scratch_dir("offload_" + name);
    file = dir / "experts.bin";
    layout.files = {file};
    layout.num_layers = L;
    layout.num_experts = E;
    layout.spans.resize(size_t(L) * size_t(E));
    uint64_t off = 777;  // deliberately unaligned
    for (int l = 1; l < L; l++)
      for (int e = 0; e < E; e++) {
        auto& s = layout.spans[size_t(l) * size_t(E) + size_t(e)];
        s.push_back({0, off, span_a});
        off += span_a + 123;  // a gap (other tensors) between the two spans
        s.push_back({0, off, span_b});
        off += span_b + 55;
      }
    expert_bytes = span_a + span_b;
    std::vector<uint8_t> buf(off + 1000);
    for (uint64_t i = 0; i < buf.size(); i++) buf[i] = file_pattern(i);
    std::ofstream(file, std::ios::binary)
        .write(reinterpret_cast<const char*>(buf.data()), std::streamsize(buf.size()));
  }

  // Whether the handle's bytes are exactly the file's bytes of its expert.
  bool verify(const offload::ExpertHandle& h) const {
    for (const FileSpan& sp : layout.at(h.layer(), h.expert())) {
      const uint8_t* p = h.at(sp.file, sp.offset);
      for (uint64_t i = 0; i < sp.nbytes; i++)
        if (p[i] != file_pattern(sp.offset + i)) return false;
    }
    return true;
  }

  uint64_t slot_bytes() const {  // what the store computes: the largest aligned expert
    uint64_t m = 0;
    for (auto& s : layout.spans)
      if (!s.empty()) m = std::max(m, offload::ExpertLayout::aligned_bytes(s));
    return m;
  }
};

}  // namespace strata::test
