// HostArena: the one allocation that backs the host expert cache — anonymous mmap, bound with
// hwloc to the NUMA node nearest the GPU that will read it (or left to first touch where there is
// no GPU), populated once at start-up and poisoned (0xFF: MXFP4 scale bytes that decode to NaN,
// STYLE §3). Where a GPU is present it is page-locked for DMA (cudaHostRegister,
// through kernels/runtime.h, so offload stays free of CUDA headers); describe() says whether. Not
// here: what goes in the arena (offload/expert_store.h).
#pragma once
#include <cstdint>
#include <string>

namespace strata::offload {

struct HostPlacement {
  int gpu = -1;        // the GPU whose NUMA node was chosen, -1 if none
  int numa_node = -1;  // bound node (os index), -1: not bound (first touch)
  int numa_nodes = 1;  // nodes on this machine
  std::string reason;  // one line for the start-up log
};

// Where the host expert cache should live: the NUMA node of GPU `gpu` (the gpu-th NVIDIA PCI
// device hwloc sees) when a CUDA device is present; otherwise no binding.
HostPlacement choose_host_placement(int gpu);

class HostArena {
 public:
  // Throws strata::Error ("host expert cache: cannot allocate N bytes: …") on failure.
  HostArena(uint64_t bytes, const HostPlacement& where);
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;
  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  bool bound() const { return bound_; }
  bool pinned() const { return pinned_; }
  std::string describe() const;

 private:
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
  bool bound_ = false;
  bool pinned_ = false;
  std::string pin_note_;  // why it is not pinned
  HostPlacement where_;
};

}  // namespace strata::offload
