// ExpertReader on temp files: both backends read exact bytes (including the zero-filled tail past
// the end of the file), injected faults (EIO, short reads with poisoned tails, delays, reordered
// completions) are absorbed by bounded retries or surface as errors naming file and offset, and a
// failed job is never reported ok. Demand jobs go before prefetch jobs.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>

#include "storage/error.h"
#include "storage/expert_reader.h"
#include "test_util.h"

using namespace strata;

namespace {

uint8_t pattern(uint64_t i) {
  return uint8_t((i * 2654435761ull) >> 13) ^ uint8_t(i >> 20);
}

std::filesystem::path make_file(const std::string& name, uint64_t n) {
  auto dir = test::scratch_dir("expert_reader_" + name);
  auto p = dir / "data.bin";
  std::vector<uint8_t> buf(n);
  for (uint64_t i = 0; i < n; i++) buf[i] = pattern(i);
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<char*>(buf.data()), std::streamsize(n));
  return p;
}

struct Aligned {
  uint8_t* p = nullptr;
  size_t n = 0;
  explicit Aligned(size_t bytes) : n(bytes) {
    p = static_cast<uint8_t*>(
        mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    REQUIRE(p != MAP_FAILED);
    std::memset(p, 0xA5, n);
  }
  ~Aligned() { munmap(p, n); }
};

std::vector<IoBackend> backends() {
  std::vector<IoBackend> b = {IoBackend::kPread};
  ReaderConfig c;
  c.backend = IoBackend::kAuto;
  if (ExpertReader::create(c)->backend() == IoBackend::kUring)
    b.push_back(IoBackend::kUring);
  else
    WARN("io_uring unavailable here: only the pread backend is tested");
  return b;
}

struct Collected {
  std::mutex mu;
  std::vector<ReadResult> results;
  void add(ReadResult&& r) {
    std::lock_guard lk(mu);
    results.push_back(std::move(r));
  }
};

// Checks a completed read of [off, off+n) against the file's pattern (zeros past its end).
bool matches(const uint8_t* got, uint64_t off, uint64_t n, uint64_t file_size) {
  for (uint64_t i = 0; i < n; i++) {
    uint8_t want = off + i < file_size ? pattern(off + i) : 0;
    if (got[i] != want) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("expert reader: both backends read exact bytes, tail past EOF zero-filled", "[reader]") {
  const uint64_t size = 6 * 1024 * 1024 + 1234;  // not a multiple of 4 KiB: the tail is short
  auto path = make_file("exact", size);
  for (IoBackend be : backends()) {
    INFO("backend " << io_backend_name(be));
    ReaderConfig c;
    c.backend = be;
    c.block_bytes = 256 * 1024;
    c.queue_depth = 8;
    auto r = ExpertReader::create(c);
    REQUIRE(r->backend() == be);
    int f = r->add_file(path);
    REQUIRE(r->file_size(f) == size);
    const uint64_t job_bytes = 1024 * 1024 + 8192;
    const int njobs = 12;
    Aligned buf(job_bytes * njobs);
    r->register_buffer(buf.p, buf.n);
    std::mt19937_64 rng(7);
    std::vector<uint64_t> offs;
    Collected col;
    for (int j = 0; j < njobs; j++) {
      // Last job straddles the end of the file; the rest are random aligned offsets, split in
      // two spans so multi-span jobs are covered.
      uint64_t off =
          j == njobs - 1 ? align_down(size - 5000) : align_down(rng() % (size - job_bytes));
      offs.push_back(off);
      ReadJob job;
      job.tag = uint64_t(j);
      job.priority = j % 2 ? ReadPriority::kPrefetch : ReadPriority::kDemand;
      uint8_t* dst = buf.p + j * job_bytes;
      job.spans.push_back({f, off, 8192, dst});
      job.spans.push_back({f, off + 8192, job_bytes - 8192, dst + 8192});
      r->submit(std::move(job), [&](ReadResult&& res) { col.add(std::move(res)); });
    }
    r->drain();
    REQUIRE(col.results.size() == njobs);
    for (auto& res : col.results) {
      INFO("job " << res.tag << ": " << res.error);
      REQUIRE(res.ok);
      uint64_t off = offs[res.tag];
      CHECK(matches(buf.p + res.tag * job_bytes, off, job_bytes, size));
      uint64_t expect = std::min(job_bytes, size > off ? size - off : 0);
      CHECK(res.bytes_read == expect);
    }
    auto st = r->stats();
    CHECK(st.jobs_done == njobs);
    CHECK(st.jobs_failed == 0);
    CHECK(st.retries == 0);
    if (be == IoBackend::kUring) CHECK(st.fixed_reads == st.block_reads);
  }
}

TEST_CASE("expert reader: injected faults are retried and never corrupt data", "[reader][faults]") {
  const uint64_t size = 8 * 1024 * 1024;
  auto path = make_file("faults", size);
  for (IoBackend be : backends()) {
    INFO("backend " << io_backend_name(be));
    ReaderConfig c;
    c.backend = be;
    c.block_bytes = 64 * 1024;
    c.queue_depth = 16;
    c.max_retries = 40;  // enough that these rates always recover: P(fail) ~ 0.4^41 per block
    c.faults.seed = 11;
    c.faults.eio_rate = 0.2;
    c.faults.short_rate = 0.2;
    c.faults.delay_rate = 0.1;
    c.faults.max_delay_us = 300;
    c.faults.reorder = true;
    auto r = ExpertReader::create(c);
    int f = r->add_file(path);
    const uint64_t job_bytes = 512 * 1024;
    const int njobs = 16;
    Aligned buf(job_bytes * njobs);
    if (be == IoBackend::kUring) r->register_buffer(buf.p, buf.n);
    Collected col;
    for (int j = 0; j < njobs; j++) {
      ReadJob job;
      job.tag = uint64_t(j);
      job.spans.push_back({f, uint64_t(j) * job_bytes, job_bytes, buf.p + j * job_bytes});
      r->submit(std::move(job), [&](ReadResult&& res) { col.add(std::move(res)); });
    }
    r->drain();
    REQUIRE(col.results.size() == njobs);
    int retries = 0;
    for (auto& res : col.results) {
      INFO(res.error);
      REQUIRE(res.ok);
      CHECK(matches(buf.p + res.tag * job_bytes, res.tag * job_bytes, job_bytes, size));
      retries += res.retries;
    }
    auto st = r->stats();
    CHECK(retries > 0);
    CHECK(st.io_errors > 0);
    CHECK(st.short_reads > 0);
    CHECK(st.retries == uint64_t(retries));
  }
}

TEST_CASE("expert reader: exhausted retries fail the job with file and offset",
          "[reader][faults]") {
  const uint64_t size = 4 * 1024 * 1024;
  auto path = make_file("fail", size);
  for (IoBackend be : backends()) {
    INFO("backend " << io_backend_name(be));
    ReaderConfig c;
    c.backend = be;
    c.block_bytes = 128 * 1024;
    c.max_retries = 2;
    c.faults.bad_file = 0;
    c.faults.bad_offset = 1024 * 1024 + 4096 * 3;  // inside job 1
    auto r = ExpertReader::create(c);
    int f = r->add_file(path);
    const uint64_t job_bytes = 1024 * 1024;
    Aligned buf(job_bytes * 4);
    Collected col;
    for (int j = 0; j < 4; j++) {
      ReadJob job;
      job.tag = uint64_t(j);
      job.spans.push_back({f, uint64_t(j) * job_bytes, job_bytes, buf.p + j * job_bytes});
      r->submit(std::move(job), [&](ReadResult&& res) { col.add(std::move(res)); });
    }
    r->drain();
    REQUIRE(col.results.size() == 4);
    for (auto& res : col.results) {
      if (res.tag == 1) {
        CHECK_FALSE(res.ok);
        CHECK_THAT(res.error, Catch::Contains(path.string()));
        CHECK_THAT(res.error, Catch::Contains("at offset " + std::to_string(1024 * 1024)));
        CHECK_THAT(res.error, Catch::Contains("after 2 retries"));
      } else {
        INFO(res.error);
        CHECK(res.ok);
        CHECK(matches(buf.p + res.tag * job_bytes, res.tag * job_bytes, job_bytes, size));
      }
    }
    CHECK(r->stats().jobs_failed == 1);
  }

  // Every read short and no retries allowed: every job fails, none is reported ok.
  for (IoBackend be : backends()) {
    ReaderConfig c;
    c.backend = be;
    c.max_retries = 0;
    c.faults.short_rate = 1.0;
    auto r = ExpertReader::create(c);
    int f = r->add_file(path);
    Aligned buf(1024 * 1024);
    Collected col;
    for (int j = 0; j < 4; j++) {
      ReadJob job;
      job.tag = uint64_t(j);
      job.spans.push_back({f, uint64_t(j) * 256 * 1024, 256 * 1024, buf.p + j * 256 * 1024});
      r->submit(std::move(job), [&](ReadResult&& res) { col.add(std::move(res)); });
    }
    r->drain();
    REQUIRE(col.results.size() == 4);
    for (auto& res : col.results) {
      CHECK_FALSE(res.ok);
      CHECK_THAT(res.error, Catch::Contains("short read"));
    }
  }
}

TEST_CASE("expert reader: demand jobs go before queued prefetch jobs", "[reader]") {
  const uint64_t size = 4 * 1024 * 1024;
  auto path = make_file("priority", size);
  for (IoBackend be : backends()) {
    INFO("backend " << io_backend_name(be));
    ReaderConfig c;
    c.backend = be;
    c.queue_depth = 1;  // one read at a time: completions come in the order reads are handed out
    c.pread_threads = 1;
    c.block_bytes = 64 * 1024;  // one block per job
    auto r = ExpertReader::create(c);
    int f = r->add_file(path);
    Aligned buf(64 * 1024 * 12);
    // Results are collected on the I/O thread and checked here (Catch's macros are not
    // thread-safe).
    Collected col;
    auto done = [&](ReadResult&& res) { col.add(std::move(res)); };
    // Paused, nothing starts: the queue holds exactly what this test put there, whatever the
    // timing of the I/O thread.
    r->pause(true);
    for (int j = 0; j < 10; j++) {
      ReadJob job;
      job.tag = uint64_t(j);
      job.priority = ReadPriority::kPrefetch;
      job.spans.push_back({f, uint64_t(j) * 65536, 65536, buf.p + j * 65536});
      r->submit(std::move(job), done);
    }
    r->promote(7);  // a prediction that became a real miss
    ReadJob demand;
    demand.tag = 100;
    demand.spans.push_back({f, 10 * 65536, 65536, buf.p + 10 * 65536});
    r->submit(std::move(demand), done);
    r->pause(false);
    r->drain();
    std::vector<uint64_t> order;
    for (auto& res : col.results) {
      INFO("job " << res.tag << ": " << res.error);
      CHECK(res.ok);
      order.push_back(res.tag);
    }
    // Demand first, in arrival order (the promoted prediction, then the new miss), then the
    // remaining predictions in their order.
    CHECK(order == std::vector<uint64_t>{7, 100, 0, 1, 2, 3, 4, 5, 6, 8, 9});
  }
}

TEST_CASE("expert reader: backend names and bad flags", "[reader]") {
  CHECK(parse_io_backend("pread") == IoBackend::kPread);
  CHECK(parse_io_backend("io_uring") == IoBackend::kUring);
  CHECK(parse_io_backend("auto") == IoBackend::kAuto);
  CHECK_THROWS_WITH(parse_io_backend("aio"), Catch::Contains("--io: unknown I/O backend 'aio'"));
  ReaderConfig c;
  c.backend = IoBackend::kPread;
  auto r = ExpertReader::create(c);
  CHECK_THROWS_WITH(r->add_file("/nonexistent/shard.safetensors"),
                    Catch::Contains("/nonexistent/shard.safetensors: cannot open"));
  REQUIRE_FALSE(r->notes().empty());
  CHECK_THAT(r->notes()[0], Catch::Contains("pread"));
}
