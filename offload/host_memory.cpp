// HostArena and its NUMA placement (hwloc 2.9; spec/building-blocks.md §5.1).
#include "offload/host_memory.h"

#include <hwloc.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "kernels/runtime.h"
#include "storage/error.h"

namespace strata::offload {

namespace {

struct Topology {
  hwloc_topology_t t = nullptr;
  Topology() {
    if (hwloc_topology_init(&t) != 0) {
      t = nullptr;
      return;
    }
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(t) != 0) {
      hwloc_topology_destroy(t);
      t = nullptr;
    }
  }
  ~Topology() {
    if (t) hwloc_topology_destroy(t);
  }
};

// The gpu-th NVIDIA display/3D controller in PCI order, or nullptr.
hwloc_obj_t nvidia_pci_device(hwloc_topology_t t, int gpu) {
  int seen = 0;
  for (hwloc_obj_t o = hwloc_get_next_pcidev(t, nullptr); o; o = hwloc_get_next_pcidev(t, o)) {
    unsigned cls = o->attr->pcidev.class_id >> 8;
    if (o->attr->pcidev.vendor_id == 0x10de && cls == 0x03 && seen++ == gpu) return o;
  }
  return nullptr;
}

}  // namespace

HostPlacement choose_host_placement(int gpu) {
  HostPlacement p;
  Topology topo;
  if (!topo.t) {
    p.reason = "hwloc topology unavailable: ordinary memory, first touch";
    return p;
  }
  p.numa_nodes = std::max(1, hwloc_get_nbobjs_by_type(topo.t, HWLOC_OBJ_NUMANODE));
  int ngpu = kernels::cuda_device_count();
  if (gpu < 0 || ngpu == 0) {
    p.reason = "no GPU: ordinary memory, first touch (" + std::to_string(p.numa_nodes) +
               " NUMA node" + (p.numa_nodes > 1 ? "s)" : ")");
    return p;
  }
  hwloc_obj_t dev = nvidia_pci_device(topo.t, gpu);
  hwloc_obj_t anc = dev ? hwloc_get_non_io_ancestor_obj(topo.t, dev) : nullptr;
  if (!anc || !anc->nodeset || hwloc_bitmap_iszero(anc->nodeset)) {
    p.reason = "GPU " + std::to_string(gpu) + ": PCI locality unknown: ordinary memory";
    return p;
  }
  p.gpu = gpu;
  p.numa_node = hwloc_bitmap_first(anc->nodeset);
  p.reason = "NUMA node " + std::to_string(p.numa_node) + " (nearest GPU " + std::to_string(gpu) +
             ", " + std::to_string(p.numa_nodes) + " node" + (p.numa_nodes > 1 ? "s)" : ")");
  return p;
}

HostArena::HostArena(uint64_t bytes, const HostPlacement& where) : bytes_(bytes), where_(where) {
  STRATA_ASSERT(bytes > 0);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw Error("host expert cache: cannot allocate " + std::to_string(bytes) +
                " bytes: " + std::strerror(errno) + " (lower --host-mem)");
  data_ = static_cast<uint8_t*>(p);
  madvise(data_, bytes_, MADV_HUGEPAGE);  // fewer TLB misses for large experts; advisory only
  if (where_.numa_node >= 0) {
    Topology topo;
    if (topo.t) {
      hwloc_nodeset_t ns = hwloc_bitmap_alloc();
      hwloc_bitmap_only(ns, unsigned(where_.numa_node));
      bound_ = hwloc_set_area_membind(topo.t, data_, bytes_, ns, HWLOC_MEMBIND_BIND,
                                      HWLOC_MEMBIND_BYNODESET) == 0;
      hwloc_bitmap_free(ns);
    }
  }
  // Touch every page now (budget once, STYLE §9) and poison it: free slots hold 0xFF.
  std::memset(data_, 0xFF, bytes_);
  // Pin for DMA once, at start-up, where a GPU will copy experts out of it (H2D at full PCIe
  // speed, no bounce through a staging buffer).
  if (kernels::cuda_device_count() > 0)
    pinned_ = kernels::host_register(data_, bytes_, &pin_note_);
  else
    pin_note_ = "no GPU";
}

HostArena::~HostArena() {
  if (pinned_) kernels::host_unregister(data_);
  if (data_) munmap(data_, bytes_);
}

std::string HostArena::describe() const {
  std::string s = where_.reason;
  if (where_.numa_node >= 0) s += bound_ ? ", bound" : ", binding FAILED (first touch)";
  s += pinned_ ? ", pinned for DMA (cudaHostRegister)" : ", not pinned for DMA (" + pin_note_ + ")";
  return s;
}

}  // namespace strata::offload
