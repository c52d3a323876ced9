// Tests of cpu/topology.h: the hwloc view, NUMA-bound allocation and the pinned TBB arena that the
// CPU expert kernels run in.
#include <catch2/catch.hpp>

#include <hwloc.h>
#include <tbb/parallel_for.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "cpu/topology.h"
#include "storage/error.h"

using strata::cpu::PinnedArena;
using strata::cpu::Topology;

TEST_CASE("topology: hwloc sees this machine", "[topology]") {
  Topology topo;
  CHECK(topo.cores() >= 1);
  CHECK(topo.pus() >= topo.cores());
  CHECK(topo.numa_nodes() >= 1);
  const auto nodes = Topology::tbb_numa_nodes();
  REQUIRE_FALSE(nodes.empty());
  if (!Topology::tbb_numa_ok()) WARN("TBB NUMA support unavailable (libtbbbind missing)");
  INFO(topo.summary());
  CHECK(topo.summary().find("cores") != std::string::npos);
}

TEST_CASE("topology: NUMA-bound allocations are usable and bad nodes are refused", "[topology]") {
  Topology topo;
  const size_t n = size_t(8) << 20;
  for (int node : {-1, 0}) {
    auto* p = static_cast<uint8_t*>(topo.alloc_bound(n, node));
    REQUIRE(p != nullptr);
    std::memset(p, 0xA5, n);
    CHECK(p[n - 1] == 0xA5);
    topo.free_bound(p, n);
  }
  CHECK_THROWS_AS(topo.alloc_bound(n, topo.numa_nodes() + 3), strata::Error);
}

TEST_CASE("topology: a pinned arena binds each of its threads to one core", "[topology]") {
  Topology topo;
  const int threads = std::min(2, topo.pus());
  PinnedArena arena(topo, threads);
  CHECK(arena.threads() == threads);
  auto* t = static_cast<hwloc_topology_t>(topo.raw());
  std::mutex mu;
  std::set<std::thread::id> seen;
  std::atomic<int> not_single{0};
  arena.arena().execute([&] {
    tbb::parallel_for(0, 64, [&](int) {
      hwloc_bitmap_t set = hwloc_bitmap_alloc();
      hwloc_get_cpubind(t, set, HWLOC_CPUBIND_THREAD);
      if (hwloc_bitmap_weight(set) != 1) ++not_single;
      hwloc_bitmap_free(set);
      std::lock_guard<std::mutex> g(mu);
      seen.insert(std::this_thread::get_id());
    });
  });
  CHECK(not_single == 0);
  CHECK(int(seen.size()) <= threads);

  // The workers are shared with every other arena: once they have left the pinned one, each has
  // the process's binding again (a worker left on one core would take it into the default arena).
  hwloc_bitmap_t process = hwloc_bitmap_alloc();
  hwloc_get_cpubind(t, process, HWLOC_CPUBIND_PROCESS);
  std::atomic<int> still_pinned{0}, ran{0};
  for (int round = 0; round < 20 && ran < 2000; ++round)
    tbb::parallel_for(0, 200, [&](int) {
      hwloc_bitmap_t set = hwloc_bitmap_alloc();
      hwloc_get_cpubind(t, set, HWLOC_CPUBIND_THREAD);
      if (!hwloc_bitmap_isequal(set, process)) ++still_pinned;
      hwloc_bitmap_free(set);
      ++ran;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    });
  hwloc_bitmap_free(process);
  CHECK(ran > 0);
  CHECK(still_pinned == 0);
  CHECK_THROWS_AS(PinnedArena(topo, topo.pus() + 1), strata::Error);
  CHECK_THROWS_AS(PinnedArena(topo, 0), strata::Error);
}
