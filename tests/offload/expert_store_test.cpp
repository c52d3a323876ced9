// ExpertStore on a synthetic layout: exact bytes through handles, eviction by frequency and
// recency, admission that never evicts the current step's experts, demand reads waiting for a
// slot, failed reads surfacing as errors (never a half-read expert), and a concurrent stress test
// proving the host budget is never exceeded.
#include <atomic>
#include <catch2/catch.hpp>
#include <random>
#include <thread>

#include "offload/expert_store.h"
#include "storage/error.h"
#include "store_fixture.h"

using namespace strata;
using namespace strata::offload;

namespace {

StoreConfig config_for(const test::SyntheticExperts& sx, double slots) {
  StoreConfig c;
  c.host_budget_bytes = uint64_t(double(sx.slot_bytes()) * slots);
  c.io.block_bytes = 64 * 1024;
  c.io.queue_depth = 8;
  c.gpu = -1;
  c.poison_freed_slots = true;
  return c;
}

// One "step": require, acquire, verify, release.
bool use(ExpertStore& st, const test::SyntheticExperts& sx, int l, int e) {
  int ids[1] = {e};
  st.require(l, ids);
  ExpertHandle h = st.acquire(l, e);
  return sx.verify(h);
}

}  // namespace

TEST_CASE("expert store: exact bytes, hits and misses, budget printed", "[store]") {
  test::SyntheticExperts sx("basic", 3, 8, 20000, 9000);
  StoreConfig c = config_for(sx, 4.5);
  ExpertStore st(sx.layout, c);
  CHECK(st.slots() == 4);
  CHECK(st.slots() * st.slot_bytes() <= c.host_budget_bytes);
  auto d = st.describe();
  REQUIRE(d.size() >= 3);
  CHECK_THAT(d[0], Catch::Contains("4 slots"));
  CHECK_THAT(d[0], Catch::Contains("of the model's 16 routed experts"));

  CHECK(st.residency(1, 3) == Residency::disk);
  CHECK(use(st, sx, 1, 3));
  CHECK(st.residency(1, 3) == Residency::host);
  CHECK(use(st, sx, 1, 3));
  CHECK(use(st, sx, 2, 7));
  auto t = st.telemetry();
  CHECK(t.disk_misses == 2);
  CHECK(t.host_hits == 1);
  CHECK(t.bytes_read >= 2 * sx.expert_bytes);
  CHECK(t.host_used_bytes <= c.host_budget_bytes);
  CHECK_THAT(t.line(), Catch::Contains("host 33.3%"));

  CHECK_THROWS_WITH(st.require(0, std::vector<int>{1}), Catch::Contains("layer 0 has no routed"));
  StoreConfig tiny = config_for(sx, 0.5);
  CHECK_THROWS_WITH(ExpertStore(sx.layout, tiny), Catch::Contains("holds no expert"));
}

TEST_CASE("expert store: eviction by frequency and recency", "[store]") {
  test::SyntheticExperts sx("evict", 2, 8, 8192, 100);
  StoreConfig c = config_for(sx, 3);
  c.half_life_steps = 1000;  // frequency dominates over this test's few steps
  ExpertStore st(sx.layout, c);
  REQUIRE(st.slots() == 3);
  for (int i = 0; i < 5; i++) REQUIRE(use(st, sx, 1, 0));  // A: hot
  REQUIRE(use(st, sx, 1, 1));                              // B: once, older
  REQUIRE(use(st, sx, 1, 2));                              // C: once, newer
  REQUIRE(use(st, sx, 1, 3));                              // D: needs a slot
  CHECK(st.residency(1, 0) == Residency::host);            // frequency kept A
  CHECK(st.residency(1, 1) == Residency::disk);            // same frequency: the older one went
  CHECK(st.residency(1, 2) == Residency::host);
  CHECK(st.residency(1, 3) == Residency::host);
  CHECK(st.telemetry().evictions == 1);

  // With a short half-life, A's old frequency decays away and recency wins.
  StoreConfig c2 = config_for(sx, 3);
  c2.half_life_steps = 1;
  ExpertStore st2(sx.layout, c2);
  for (int i = 0; i < 5; i++) REQUIRE(use(st2, sx, 1, 0));
  for (int k = 0; k < 12; k++) REQUIRE(use(st2, sx, 1, 1 + k % 2));  // B, C alternate
  REQUIRE(use(st2, sx, 1, 3));
  CHECK(st2.residency(1, 0) == Residency::disk);
  CHECK(st2.residency(1, 1) == Residency::host);
  CHECK(st2.residency(1, 2) == Residency::host);
}

TEST_CASE("expert store: admission never evicts the current step's experts", "[store]") {
  test::SyntheticExperts sx("admit", 2, 8, 8192, 100);
  StoreConfig c = config_for(sx, 2);
  c.half_life_steps = 0.5;
  ExpertStore st(sx.layout, c);
  REQUIRE(st.slots() == 2);
  std::vector<int> step = {4, 5};
  st.require(1, step);  // both slots claimed by the current step
  std::vector<std::pair<int, float>> pred = {{6, 1.0f}, {7, 0.9f}};
  st.prefetch(1, pred);
  CHECK(st.residency(1, 6) == Residency::disk);
  CHECK(st.residency(1, 7) == Residency::disk);
  CHECK(st.telemetry().prefetch_rejected == 2);
  {
    ExpertHandle a = st.acquire(1, 4);
    ExpertHandle b = st.acquire(1, 5);
    CHECK(sx.verify(a));
    CHECK(sx.verify(b));
    st.prefetch(1, pred);  // held handles: still not evictable
    CHECK(st.residency(1, 6) == Residency::disk);
  }
  // Released, and time passes while expert 4 stays in use: a confident prediction may now replace
  // the colder expert 5, but the less confident one does not displace the hot expert 4.
  for (int i = 0; i < 3; i++) REQUIRE(use(st, sx, 1, 4));
  st.prefetch(1, pred);
  st.reader().drain();  // returns after the store's completion handler ran: no polling, no timeout
  CHECK(st.residency(1, 6) == Residency::host);
  CHECK(st.residency(1, 5) == Residency::disk);
  CHECK(st.residency(1, 4) == Residency::host);
  CHECK(st.residency(1, 7) == Residency::disk);
  auto t = st.telemetry();
  CHECK(t.prefetch_issued == 1);
  REQUIRE(use(st, sx, 1, 6));
  CHECK(st.telemetry().prefetch_hits == 1);
}

// One step over MoE layers 1..4, each needing `ids` (as the executor runs a layer: require the
// layer's experts, with its width, then acquire, verify and release them). Returns the step's
// host hits.
uint64_t scan_step(ExpertStore& st, const test::SyntheticExperts& sx,
                   const std::vector<std::vector<int>>& ids) {
  const uint64_t before = st.telemetry().host_hits;
  for (int l = 1; l <= 4; l++) {
    const std::vector<int>& need = ids[size_t(l - 1)];
    st.require(l, need, int(need.size()));
    std::vector<ExpertHandle> held;
    for (int e : need) {
      held.push_back(st.acquire(l, e));
      REQUIRE(sx.verify(held.back()));
    }
  }
  return st.telemetry().host_hits - before;
}

TEST_CASE("expert store: a scan wider than the cache keeps part of it, narrow steps as before",
          "[store]") {
  test::SyntheticExperts sx("scan", 5, 8, 8192, 100);  // 4 MoE layers × 8 experts
  StoreConfig c = config_for(sx, 12);
  ExpertStore st(sx.layout, c);
  REQUIRE(st.slots() == 12);
  // Every step needs the same 6 experts of each layer: 24 > 12 slots, a scan. An LRU would evict
  // each expert before its next use (no hits ever); the streaming reads are evicted newest first,
  // so what was cached before them survives to the next step and is kept from then on: 12 slots
  // minus one layer's 6 in use.
  const std::vector<std::vector<int>> wide(4, {0, 1, 2, 3, 4, 5});
  CHECK(scan_step(st, sx, wide) == 0);
  for (int s = 0; s < 6; s++) {
    INFO("step " << s);
    CHECK(scan_step(st, sx, wide) >= 6);
  }
  CHECK(st.telemetry().stream_reads > 0);
  // Narrow steps (2 experts per layer: 8 ≤ 12) are not scans: what they read stays cached as
  // with any other read, and every later step hits.
  ExpertStore st2(sx.layout, c);
  const std::vector<std::vector<int>> narrow(4, {6, 7});
  CHECK(scan_step(st2, sx, narrow) == 0);
  CHECK(scan_step(st2, sx, narrow) == 8);
  CHECK(st2.telemetry().stream_reads == 0);
  // The routing moves to other experts while the steps scan: the experts kept from before go
  // once unused for a few half-lives (here 1 require each), so the new ones are kept instead.
  StoreConfig c3 = c;
  c3.half_life_steps = 1;
  ExpertStore st3(sx.layout, c3);
  for (int s = 0; s < 3; s++) scan_step(st3, sx, wide);
  const std::vector<std::vector<int>> moved(4, {2, 3, 4, 5, 6, 7});  // 0 and 1 no longer used
  scan_step(st3, sx, moved);
  uint64_t late = 0;
  for (int s = 0; s < 4; s++) late = scan_step(st3, sx, moved);
  CHECK(late >= 6);
  for (int l = 1; l <= 4; l++) {
    INFO("layer " << l);
    CHECK(st3.residency(l, 0) == Residency::disk);
    CHECK(st3.residency(l, 1) == Residency::disk);
  }
}

TEST_CASE("expert store: demand reads wait for a slot, and acquire order works", "[store]") {
  test::SyntheticExperts sx("wait", 2, 8, 30000, 5000);
  ExpertStore st(sx.layout, config_for(sx, 2));
  std::vector<int> step = {0, 1, 2, 3, 4};  // more than the 2 slots
  st.require(1, step);
  for (int e : step) {
    ExpertHandle h = st.acquire(1, e);
    CHECK(sx.verify(h));
  }
  auto t = st.telemetry();
  CHECK(t.disk_misses == 5);
  CHECK(t.host_peak_bytes <= 2 * st.slot_bytes());
}

TEST_CASE("expert store: a failed read is an error, never a half-read expert", "[store][faults]") {
  test::SyntheticExperts sx("fail", 2, 6, 40000, 3000);
  StoreConfig c = config_for(sx, 3);
  c.io.max_retries = 2;
  c.io.faults.bad_file = 0;
  const FileSpan bad = sx.layout.at(1, 2)[0];
  c.io.faults.bad_offset = bad.offset + 20000;  // inside expert 2's first span
  ExpertStore st(sx.layout, c);
  CHECK(use(st, sx, 1, 1));
  std::vector<int> e2 = {2};
  st.require(1, e2);
  CHECK_THROWS_WITH(st.acquire(1, 2), Catch::Contains(sx.file.string()) &&
                                          Catch::Contains("layer 1 expert 2") &&
                                          Catch::Contains("at offset"));
  CHECK(st.residency(1, 2) == Residency::disk);
  auto t = st.telemetry();
  CHECK(t.read_errors == 1);
  CHECK(t.host_used_bytes == ExpertLayout::aligned_bytes(sx.layout.at(1, 1)));
  // The store keeps working; the bad expert fails again on the next try.
  CHECK(use(st, sx, 1, 3));
  st.require(1, e2);
  CHECK_THROWS(st.acquire(1, 2));
}

TEST_CASE("expert store: concurrent stress never exceeds the budget", "[store][stress]") {
  test::SyntheticExperts sx("stress", 5, 16, 24000, 7000);  // 64 experts
  StoreConfig c = config_for(sx, 12.7);                     // 12 slots < 64 experts
  c.io.backend = GENERATE(IoBackend::kPread, IoBackend::kAuto);
  INFO("backend " << io_backend_name(c.io.backend));
  c.io.max_retries = 50;
  c.io.faults.eio_rate = 0.05;
  c.io.faults.short_rate = 0.05;
  c.io.faults.reorder = true;
  ExpertStore st(sx.layout, c);
  REQUIRE(st.slots() == 12);
  std::atomic<bool> stop{false}, bad{false};
  std::atomic<uint64_t> max_seen{0}, verified{0};
  std::thread monitor([&] {
    while (!stop) {
      uint64_t u = st.host_used_bytes();
      if (u > c.host_budget_bytes) bad = true;
      uint64_t m = max_seen.load();
      while (u > m && !max_seen.compare_exchange_weak(m, u)) {
      }
      std::this_thread::yield();
    }
  });
  std::thread predictor([&] {
    std::mt19937 rng(99);
    while (!stop) {
      std::vector<std::pair<int, float>> p;
      for (int k = 0; k < 3; k++) p.emplace_back(int(rng() % 16), float(rng() % 1000) / 1000.0f);
      st.prefetch(1 + int(rng() % 4), p);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  // 4 consumers × at most 3 claims each ≤ 12 slots: no consumer can starve another.
  std::vector<std::thread> workers;
  std::atomic<int> failures{0};
  for (int w = 0; w < 4; w++)
    workers.emplace_back([&, w] {
      std::mt19937 rng(uint32_t(w + 1));
      for (int it = 0; it < 60; it++) {
        int l = 1 + int(rng() % 4);
        std::vector<int> es;
        int n = 1 + int(rng() % 3);
        while (int(es.size()) < n) {
          int e = int(rng() % 16);
          if (std::find(es.begin(), es.end(), e) == es.end()) es.push_back(e);
        }
        st.require(l, es);
        for (int e : es) {
          ExpertHandle h = st.acquire(l, e);
          if (!sx.verify(h)) failures++;
          verified++;
        }
      }
    });
  for (auto& t : workers) t.join();
  stop = true;
  monitor.join();
  predictor.join();
  CHECK_FALSE(bad);
  CHECK(failures == 0);
  auto t = st.telemetry();
  CHECK(t.host_peak_bytes <= c.host_budget_bytes);
  CHECK(max_seen <= c.host_budget_bytes);
  CHECK(t.demand() == verified);
  CHECK(t.evictions > 0);
  CHECK(t.read_retries > 0);  // the injected faults were absorbed
  CHECK(t.read_errors == 0);
}

TEST_CASE("expert store: fill at start reads experts in layer order until the cache is full",
          "[store]") {
  test::SyntheticExperts sx("fill", 4, 6, 20000, 9000);  // layers 1..3 hold 18 experts
  SECTION("a cache of 8 slots takes layer 1's experts, then layer 2's first two") {
    StoreConfig c = config_for(sx, 8.2);
    ExpertStore st(sx.layout, c);
    std::vector<std::pair<uint64_t, uint64_t>> calls;
    CHECK(st.fill([&](uint64_t done, uint64_t total) { calls.emplace_back(done, total); }) == 8);
    REQUIRE(!calls.empty());
    CHECK(calls.back().first == calls.back().second);  // the last call reports completion
    for (int e = 0; e < 6; e++) CHECK(st.residency(1, e) == Residency::host);
    CHECK(st.residency(2, 0) == Residency::host);
    CHECK(st.residency(2, 1) == Residency::host);
    CHECK(st.residency(2, 2) == Residency::disk);
    CHECK(st.residency(3, 0) == Residency::disk);
    auto t = st.telemetry();
    CHECK(t.fill_bytes >= 8 * sx.expert_bytes);
    CHECK(t.bytes_read == 0);  // start-up reads are not demand or prefetch traffic
    CHECK_THAT(t.line(), Catch::Contains("filled at start"));
    // Filled experts are ordinary residents: hits, exact bytes, evictable when others need room.
    CHECK(use(st, sx, 1, 4));
    CHECK(use(st, sx, 3, 5));
    t = st.telemetry();
    CHECK(t.host_hits == 1);
    CHECK(t.disk_misses == 1);
    CHECK(t.evictions == 1);
    CHECK(st.fill() == 0);  // the miss took the evicted expert's slot: none is free
    CHECK(st.residency(1, 4) == Residency::host);  // the one used stays; a cold one went
  }
  SECTION("a cache of every expert holds them all, and a second fill reads nothing") {
    StoreConfig c = config_for(sx, 1);
    c.host_budget_bytes = sx.layout.cache_bytes_all();
    ExpertStore st(sx.layout, c);
    CHECK(st.slots() == 18);
    CHECK(st.fill() == 18);
    for (int l = 1; l < 4; l++)
      for (int e = 0; e < 6; e++) CHECK(use(st, sx, l, e));
    CHECK(st.telemetry().disk_misses == 0);
    CHECK(st.fill() == 0);
  }
  SECTION("a failed read names the expert and the file") {
    StoreConfig c = config_for(sx, 3);
    c.io.faults.bad_file = 0;
    c.io.faults.bad_offset = sx.layout.at(1, 2)[0].offset;
    ExpertStore st(sx.layout, c);
    CHECK_THROWS_WITH(st.fill(), Catch::Contains("host expert cache fill: layer 1 expert ") &&
                                     Catch::Contains("experts.bin"));
  }
}
