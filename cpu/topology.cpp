// hwloc topology, NUMA-bound allocation and pinned TBB arenas (cpu/topology.h).
#include "cpu/topology.h"

#include <hwloc.h>
#include <tbb/info.h>
#include <tbb/task_scheduler_observer.h>

#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "storage/error.h"

namespace strata::cpu {

struct Topology::Impl {
  hwloc_topology_t topo = nullptr;
};

Topology::Topology() : impl_(std::make_unique<Impl>()) {
  if (hwloc_topology_init(&impl_->topo) != 0 || hwloc_topology_load(impl_->topo) != 0)
    throw Error(std::string("hwloc: cannot load the machine topology: ") + std::strerror(errno));
}

Topology::~Topology() {
  hwloc_topology_destroy(impl_->topo);
}

int Topology::cores() const {
  int n = hwloc_get_nbobjs_by_type(impl_->topo, HWLOC_OBJ_CORE);
  return n > 0 ? n : pus();
}
int Topology::pus() const {
  int n = hwloc_get_nbobjs_by_type(impl_->topo, HWLOC_OBJ_PU);
  return n > 0 ? n : 1;
}
int Topology::numa_nodes() const {
  int n = hwloc_get_nbobjs_by_type(impl_->topo, HWLOC_OBJ_NUMANODE);
  return n > 0 ? n : 1;
}

std::vector<int> Topology::tbb_numa_nodes() {
  auto v = tbb::info::numa_nodes();
  return std::vector<int>(v.begin(), v.end());
}
bool Topology::tbb_numa_ok() {
  auto v = tbb_numa_nodes();
  return !(v.size() == 1 && v[0] == -1);
}

std::string Topology::summary() const {
  // Built with append: GCC 12 reports a false -Wrestrict on chained literal + string operators.
  std::string s;
  s.append(std::to_string(cores())).append(" cores, ").append(std::to_string(pus()));
  s.append(" PUs, ").append(std::to_string(numa_nodes())).append(" NUMA node(s); TBB NUMA ");
  if (tbb_numa_ok()) {
    s.append("nodes:");
    for (int n : tbb_numa_nodes()) s.append(" ").append(std::to_string(n));
  } else {
    s.append("unavailable (tbb::info::numa_nodes() == {-1}: libtbbbind missing), ");
    s.append("threads pinned by hwloc");
  }
  return s;
}

void* Topology::alloc_bound(size_t bytes, int node) const {
  hwloc_nodeset_t set = hwloc_bitmap_alloc();
  hwloc_membind_policy_t policy = HWLOC_MEMBIND_INTERLEAVE;
  if (node >= 0) {
    hwloc_obj_t obj = hwloc_get_obj_by_type(impl_->topo, HWLOC_OBJ_NUMANODE, unsigned(node));
    if (!obj) {
      hwloc_bitmap_free(set);
      throw Error("hwloc: NUMA node " + std::to_string(node) + " does not exist (machine has " +
                  std::to_string(numa_nodes()) + ")");
    }
    hwloc_bitmap_copy(set, obj->nodeset);
    policy = HWLOC_MEMBIND_BIND;
  } else {
    hwloc_bitmap_copy(set, hwloc_topology_get_topology_nodeset(impl_->topo));
    if (numa_nodes() == 1) policy = HWLOC_MEMBIND_BIND;
  }
  void* p = hwloc_alloc_membind(impl_->topo, bytes, set, policy, HWLOC_MEMBIND_BYNODESET);
  hwloc_bitmap_free(set);
  if (!p) {
    std::string m("hwloc: cannot allocate ");
    m.append(std::to_string(bytes)).append(" bytes bound to NUMA node ");
    m.append(node >= 0 ? std::to_string(node) : std::string("set (interleaved)"));
    m.append(": ").append(std::strerror(errno));
    throw Error(m);
  }
  return p;
}

void Topology::free_bound(void* p, size_t bytes) const {
  if (p) hwloc_free(impl_->topo, p, bytes);
}

void Topology::pin_thread_to_core(int core) const {
  const int n = cores();
  hwloc_obj_t obj = hwloc_get_obj_by_type(impl_->topo, HWLOC_OBJ_CORE, unsigned(core % n));
  if (!obj) obj = hwloc_get_obj_by_type(impl_->topo, HWLOC_OBJ_PU, unsigned(core % pus()));
  if (!obj) return;
  hwloc_cpuset_t set = hwloc_bitmap_dup(obj->cpuset);
  hwloc_bitmap_singlify(set);  // one PU of the core: no migration between hyperthreads
  hwloc_set_cpubind(impl_->topo, set, HWLOC_CPUBIND_THREAD);
  hwloc_bitmap_free(set);
}

void* Topology::raw() const {
  return impl_->topo;
}

// Pins each thread entering the arena to the core of its arena slot, and gives every thread —
// TBB's workers as well as the one that called execute() — its previous binding back when it
// leaves. Workers are shared by all arenas of the process: a worker left pinned would take its core
// into the next arena it serves, and several workers pinned to one core there (they take different
// slots each time) can serialise work the default arena meant to spread (tested: after a pinned
// arena's work, default-arena tasks ran on still-pinned workers before this restored them).
struct PinnedArena::Observer : tbb::task_scheduler_observer {
  const Topology& topo;
  Observer(tbb::task_arena& a, const Topology& t) : tbb::task_scheduler_observer(a), topo(t) {
    observe(true);
  }
  ~Observer() override { observe(false); }
  void on_scheduler_entry(bool) override {
    auto* t = static_cast<hwloc_topology_t>(topo.raw());
    hwloc_bitmap_t prev = hwloc_bitmap_alloc();
    hwloc_get_cpubind(t, prev, HWLOC_CPUBIND_THREAD);
    saved().push_back(prev);  // a stack: a thread may enter a pinned arena from inside another
    topo.pin_thread_to_core(tbb::this_task_arena::current_thread_index());
  }
  void on_scheduler_exit(bool) override {
    if (saved().empty()) return;
    hwloc_set_cpubind(static_cast<hwloc_topology_t>(topo.raw()), saved().back(),
                      HWLOC_CPUBIND_THREAD);
    hwloc_bitmap_free(saved().back());
    saved().pop_back();
  }
  static std::vector<hwloc_bitmap_t>& saved() {
    thread_local std::vector<hwloc_bitmap_t> s;
    return s;
  }
};

namespace {

bool env_is_one(const char* name) {
  const char* v = std::getenv(name);
  return v && std::string_view(v) == "1";
}

}  // namespace

bool pin_expert_threads() {
  return env_is_one("STRATA_PIN_EXPERT_THREADS");
}

bool keep_expert_threads_warm() {
  return env_is_one("STRATA_EXPERT_KEEP_WARM");
}

PinnedArena::PinnedArena(const Topology& topo, int threads)
    : topo_(topo), threads_(threads), arena_(threads) {
  if (threads < 1 || threads > topo.pus())
    throw Error("--threads " + std::to_string(threads) + ": expected 1.." +
                std::to_string(topo.pus()) + " (hardware threads of this machine)");
  arena_.initialize();
  observer_ = std::make_unique<Observer>(arena_, topo_);
}

PinnedArena::~PinnedArena() {
  observer_.reset();
}

}  // namespace strata::cpu
