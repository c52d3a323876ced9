// Where CPU expert work runs and where its buffers live: the hwloc view of this machine (cores,
// NUMA nodes), NUMA-bound allocations, and TBB arenas whose threads are pinned one per core.
//
// TBB's own NUMA support needs libtbbbind; without it tbb::info::numa_nodes() returns {-1} and
// arenas are not pinned. We pin through hwloc ourselves, so placement does not depend on it, and
// report what TBB sees (tbb_numa_ok) so a start-up line can say so.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <tbb/task_arena.h>

namespace strata::cpu {

class Topology {
 public:
  Topology();  // loads the hwloc topology; throws strata::Error on failure
  ~Topology();
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  int cores() const;       // physical cores
  int pus() const;         // hardware threads
  int numa_nodes() const;  // ≥ 1
  // TBB's NUMA node ids; {-1} when tbbbind is missing (then TBB cannot pin by itself).
  static std::vector<int> tbb_numa_nodes();
  static bool tbb_numa_ok();
  std::string summary() const;  // "2 cores, 2 PUs, 1 NUMA node; TBB NUMA: ..."

  // Memory bound to NUMA node `node` (0-based logical index), or interleaved over all nodes when
  // node < 0. Throws strata::Error if hwloc cannot allocate. Free with free_bound (same bytes).
  void* alloc_bound(size_t bytes, int node = -1) const;
  void free_bound(void* p, size_t bytes) const;

  // Pins the calling thread to core `core` (mod cores()); restores with unpin_thread.
  void pin_thread_to_core(int core) const;
  void* raw() const;  // hwloc_topology_t

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Whether the engines' routed-expert kernels run on pinned workers (a PinnedArena of one thread per
// core) rather than in the caller's arena: STRATA_PIN_EXPERT_THREADS=1 or 0, default off. `bench
// hw` times its CPU expert curves the same way, so the cost model sees the engine's rate.
bool pin_expert_threads();
// Whether the engines' expert executor keeps its workers spinning between a decode layer's GPU
// part and its CPU experts (ExpertExecutor::warm): STRATA_EXPERT_KEEP_WARM=1 or 0, default off.
bool keep_expert_threads_warm();

// A TBB arena of `threads` threads (≤ cores), each pinned to its own core through hwloc as it
// enters the arena (a task_scheduler_observer). Work run through execute() stays on those cores.
class PinnedArena {
 public:
  PinnedArena(const Topology& topo, int threads);
  ~PinnedArena();
  tbb::task_arena& arena() { return arena_; }
  int threads() const { return threads_; }

 private:
  struct Observer;
  const Topology& topo_;
  int threads_;
  tbb::task_arena arena_;
  std::unique_ptr<Observer> observer_;
};

}  // namespace strata::cpu
