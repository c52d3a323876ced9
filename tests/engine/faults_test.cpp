// Faults in the engine (issue 17, items 4 and 5), injected into a real run of a synthetic
// k3-tiny:
//   * read errors and short reads while experts stream from disk (the reader's fault hook):
//     retried, and the logits are bit-identical to the in-memory run — never a wrong token;
//   * a persistent read error: after the bounded retries the run stops with an error naming the
//     layer, the expert, the file and the offset;
//   * a slow disk (every read delayed) finishes with the same logits; a stalled one (a read
//     slower than --io-timeout) stops with an error instead of hanging;
//   * a shard truncated, rewritten or replaced while the model is loaded: the next step stops
//     naming the shard; a truncation that hits a mapped page (SIGBUS) ends the process with one
//     line naming the file and exit status 1;
//   * a non-finite weight in a tensor the default load scan skips: the run stops at the first
//     step naming the layer and the site; --check-weights names the tensor at load.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <fstream>

#include <limits>
#include <thread>

#include "engine/finite_check.h"
#include "engine/offload_executor.h"
#include "engine/session.h"
#include "storage/error.h"
#include "storage/synth.h"
#include "test_util.h"

using namespace strata;
using namespace strata::engine;
namespace fs = std::filesystem;

namespace {

// A synthetic k3-tiny of its own per test case: ctest runs cases as parallel processes.
fs::path copy_model(const std::string& name) {
  const fs::path d = test::scratch_dir("faults_" + name) / "model";
  SynthOptions o;
  o.preset = "k3-tiny";
  o.seed = 5;
  o.threads = 2;
  synth_checkpoint(o, d);
  return d;
}

const std::vector<int32_t> kIds = {11, 48, 85, 122, 159, 196, 233};

// Prefill 4 tokens, then decode the rest one by one; all logits concatenated.
std::vector<float> logits(const Model& m, SessionOptions so) {
  Session s(m, so);
  auto out = s.forward(std::span<const int32_t>(kIds.data(), 4), true);
  for (size_t i = 4; i < kIds.size(); i++) {
    auto row = s.forward(std::span<const int32_t>(&kIds[i], 1), false);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

std::vector<float> offload_logits(const Model& m, OffloadOptions oo) {
  OffloadRuntime rt(m, oo);
  REQUIRE(rt.active());
  SessionOptions so;
  rt.install(so);
  return logits(m, so);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

using strata::test::poke;

}  // namespace

TEST_CASE("faults: transient read errors and short reads never change a token",
          "[faults][offload]") {
  auto model = Model::load(copy_model("transient"));
  const std::vector<float> want = logits(*model, {});
  OffloadOptions oo;
  oo.host_mem = "30%";  // evictions: experts are read again and again
  oo.faults.seed = 17;
  // Rates a disk can absorb within the 3 retries per block (a block fails only after four faults
  // in a row: ~1e-4 here); what exceeds them is the next test's case.
  oo.faults.eio_rate = 0.05;    // EIO, with whatever arrived poisoned
  oo.faults.short_rate = 0.05;  // short reads, the unread tail poisoned with 0xFF
  oo.faults.reorder = true;
  OffloadRuntime rt(*model, oo);
  SessionOptions so;
  rt.install(so);
  CHECK(same_bits(logits(*model, so), want));
  const auto t = rt.telemetry();
  CHECK(t.read_retries > 0);  // the faults happened and were absorbed
  CHECK(t.read_errors == 0);
}

TEST_CASE("faults: a persistent read error stops the run naming layer, expert, file, offset",
          "[faults][offload]") {
  auto model = Model::load(copy_model("persistent"));
  // The expert the first token routes to in the first MoE layer: it must be read.
  RoutingLog rec;
  SessionOptions base;
  base.record_routing = &rec;
  logits(*model, base);
  REQUIRE_FALSE(rec.layers.empty());
  const int layer = rec.layers.begin()->first;
  const int expert = rec.layers.begin()->second.at(0).at(0);
  const FileSpan& span = model->checkpoint().expert(layer, expert).spans.at(0);
  OffloadOptions oo;
  oo.host_mem = "100%";
  oo.prefetch_depth = 0;
  oo.faults.bad_file = span.file;
  oo.faults.bad_offset = span.offset + 100;
  try {
    offload_logits(*model, oo);
    FAIL("the run finished despite an unreadable expert");
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK_THAT(msg, Catch::Contains("layer " + std::to_string(layer) + " expert " +
                                    std::to_string(expert)));
    CHECK_THAT(msg, Catch::Contains(model->checkpoint().file_path(span.file).string()));
    CHECK_THAT(msg, Catch::Contains("failed after 3 retries"));
    CHECK_THAT(msg, Catch::Contains("Input/output error"));
  }
}

TEST_CASE("faults: a slow disk gives the same logits, a stalled one is an error, not a hang",
          "[faults][offload]") {
  auto model = Model::load(copy_model("slow"));
  const std::vector<float> want = logits(*model, {});
  {
    OffloadOptions oo;
    oo.host_mem = "30%";
    oo.faults.delay_rate = 1.0;  // every read waits up to 3 ms
    oo.faults.max_delay_us = 3000;
    CHECK(same_bits(offload_logits(*model, oo), want));
  }
  {
    OffloadOptions oo;
    oo.host_mem = "30%";
    oo.prefetch_depth = 0;
    oo.faults.delay_rate = 1.0;  // every read takes up to 0.5 s; the limit is 0.1 s
    oo.faults.max_delay_us = 500000;
    oo.faults.seed = 3;
    oo.io_timeout_s = 0.1;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      offload_logits(*model, oo);
      FAIL("the run finished although every read was slower than --io-timeout");
    } catch (const Error& e) {
      INFO(e.what());
      CHECK_THAT(e.what(), Catch::Contains("has not completed after 0.1 s"));
      CHECK_THAT(e.what(), Catch::Contains(".safetensors at offset"));
    }
    // The error came at the limit, not after the reads (the runtime drained them on the way out).
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 60);
  }
}

TEST_CASE("faults: a shard truncated, rewritten or replaced while loaded stops the next step",
          "[faults]") {
  const std::string shard = "model-00002-of-00004.safetensors";
  auto expect_stop = [&](const fs::path& d, const std::string& what) {
    auto model = Model::load(d);
    Session s(*model);
    s.forward(std::span<const int32_t>(kIds.data(), 2));  // the first step runs
    return [&, d, what, m = std::move(model)]() mutable {
      Session s2(*m);
      try {
        s2.forward(std::span<const int32_t>(kIds.data(), 2));
        FAIL("the step ran on a changed shard");
      } catch (const Error& e) {
        INFO(e.what());
        CHECK_THAT(e.what(), Catch::Contains((d / shard).string()));
        CHECK_THAT(e.what(), Catch::Contains(what));
      }
    };
  };
  {
    const fs::path d = copy_model("truncated");
    auto check = expect_stop(d, "changed size on disk");
    fs::resize_file(d / shard, 4096);  // touching the mapped pages now would raise SIGBUS
    check();
  }
  {
    const fs::path d = copy_model("rewritten");
    auto check = expect_stop(d, "was modified on disk");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a visible mtime step
    poke(d / shard, 4096, {1, 2, 3, 4});
    check();
  }
  {
    const fs::path d = copy_model("replaced");
    auto check = expect_stop(d, "was replaced by another file");
    fs::copy_file(d / shard, d / "new.tmp");
    fs::rename(d / "new.tmp", d / shard);  // a new download renamed over the old file
    check();
  }
}

TEST_CASE("faults: SIGBUS from a truncated mapped shard is one line and exit status 1",
          "[faults]") {
  const fs::path d = copy_model("sigbus");
  const fs::path shard = d / "model-00002-of-00004.safetensors";
  int pipefd[2];
  REQUIRE(::pipe(pipefd) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {  // child: map, truncate, touch a page past the new end
    ::dup2(pipefd[1], 2);
    ::close(pipefd[0]);
    install_sigbus_handler();
    SafetensorsFile f(shard);
    const volatile uint8_t* last = f.base() + f.file_size() - 1;
    if (::truncate(shard.c_str(), 4096) != 0) ::_exit(3);
    const uint8_t v = *last;    // SIGBUS here
    ::_exit(v == 255 ? 4 : 5);  // not reached
  }
  ::close(pipefd[1]);
  std::string err;
  char buf[512];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0) err.append(buf, size_t(n));
  ::close(pipefd[0]);
  int st = 0;
  REQUIRE(::waitpid(pid, &st, 0) == pid);
  INFO(err);
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 1);
  CHECK_THAT(err,
             Catch::StartsWith("strata: error: " + shard.string() + ": the file became shorter"));
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
}

TEST_CASE(
    "faults: a NaN weight the load scan skips stops the run at its layer and site, and "
    "--check-weights names it at load",
    "[faults][nan]") {
  const fs::path d = copy_model("nan_big");
  const std::string t = "language_model.model.layers.3.self_attn.o_proj.weight";
  {
    Checkpoint ck(d);
    const TensorInfo& ti = ck.get(t);
    // bf16 NaN at element 1000 of the MLA layer's o_proj [D, H·v] = [256, 128].
    poke(ck.file_path(ti.file), ti.offset + 2 * 1000, {0xC0, 0x7F});
  }
  LoadOptions quick;
  quick.small_tensor_bytes = 0;  // as if every matrix were big (K3: the default skips them)
  auto model = Model::load(d, quick);
  CHECK(model->scanned_weight_bytes() > 0);  // the fp32 vectors are still scanned
  Session s(*model);
  try {
    s.forward(std::span<const int32_t>(kIds.data(), 3));
    FAIL("a NaN weight went through the forward unnoticed");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK_THAT(e.what(), Catch::StartsWith("non-finite activation (NaN) at blk.3."));
    CHECK_THAT(e.what(), Catch::Contains("_out (position 0"));
  }
  LoadOptions full = quick;
  full.check_weights = true;
  try {
    Model::load(d, full);
    FAIL("--check-weights missed a NaN");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK_THAT(e.what(), Catch::Contains("tensor " + t + ": NaN at row 7, column 104"));
  }
}

TEST_CASE("faults: check_finite names the first non-finite element", "[faults][nan]") {
  std::vector<float> x(3 * 5, 1.0f);
  CHECK_NOTHROW(check_finite(x.data(), 3, 5, 2, "moe_out", 7));
  x[2 * 5 + 1] = std::numeric_limits<float>::infinity();
  x[2 * 5 + 3] = std::numeric_limits<float>::quiet_NaN();
  try {
    check_finite(x.data(), 3, 5, 2, "moe_out", 7);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::StartsWith("non-finite activation (+Inf) at blk.2.moe_out "
                                           "(position 9, element 1)"));
  }
  // Long vectors: the blocked scan finds an element in a late block, and -Inf.
  std::vector<float> y(5000, 0.5f);
  CHECK(first_non_finite(y.data(), int64_t(y.size())) == -1);
  y[4321] = -std::numeric_limits<float>::infinity();
  CHECK(first_non_finite(y.data(), int64_t(y.size())) == 4321);
  // A batch's logits (above 1 Mi elements: scanned in pieces on the worker threads): the first
  // failing element wins even when a later piece also fails; none → -1.
  std::vector<float> z(size_t(8) * 163840 + 77, 0.25f);
  CHECK(first_non_finite(z.data(), int64_t(z.size())) == -1);
  z[z.size() - 1] = std::numeric_limits<float>::quiet_NaN();
  CHECK(first_non_finite(z.data(), int64_t(z.size())) == int64_t(z.size()) - 1);
  z[900001] = std::numeric_limits<float>::infinity();
  z[300000] = -std::numeric_limits<float>::infinity();
  CHECK(first_non_finite(z.data(), int64_t(z.size())) == 300000);
  std::vector<uint16_t> h(9000, 0x3F80);  // bf16 1.0
  CHECK(first_non_finite_bf16(h.data(), int64_t(h.size())) == -1);
  h[8999] = 0xFF80;  // -Inf
  CHECK(first_non_finite_bf16(h.data(), int64_t(h.size())) == 8999);
}
