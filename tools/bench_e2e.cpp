// `strata bench e2e -m DIR`: the engine end to end — decode tok/s at 1 and 8 sequences and prefill
// tok/s (1K and 16K-token prompts by default) for each placement of the routed experts (issue 18
// item 8c: all in the GPU cache; 10% GPU + rest host; 10% GPU + 30% host cache + rest disk; all
// in host memory), each next to a roofline computed by the one cost model (offload/cost_model.h)
// from hardware peaks measured in this same run (HBM copy, bf16 GEMM, host memory read,
// host→device, disk O_DIRECT — never our kernels' rates), with its overlap assumption printed.
// Protocol: per placement one backend; decode: a prompt of --context tokens per sequence, 4
// warm-up steps, then --steps timed steps (aggregate tok/s = sequences · steps / seconds);
// prefill: a fresh sequence, one warm-up prefill of one chunk (min(prompt, the backend's step
// rows) tokens), then the timed prompt --prefill-repeats times, each on a fresh sequence (the line
// is the median run; the telemetry covers them all). Placements are static: promotions into the
// GPU cache (--gpu-promote) are off here, since a line is read against its placement's roofline.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/cli_support.h"
#include "engine/model.h"
#include "engine/offload_executor.h"
#include "engine/schedule.h"
#include "engine/session.h"
#include "offload/cost_model.h"
#include "offload/hw_measure.h"
#include "offload/plan.h"
#include "storage/error.h"
#include "tools/bench.h"

namespace strata::tools {
namespace {

struct Options {
  std::string model_dir, json, device = "auto", placements = "all", hardware;
  std::string experts_quantize;  // --experts-quantize mxfp4 (engine/cli_support.h)
  std::vector<int> batches = {1, 8};
  std::vector<int64_t> prefill = {1024, 16384};
  int64_t context = 256;
  int steps = 32;
  int prefill_repeats = 1;
  bool quick = false;
  bool profile = false;  // GPU time per sublayer kind (eager launches) in each line's telemetry
  // Decode inputs: "random" draws each step's token per sequence (seeded, so runs repeat), like
  // generated text whose routing moves from step to step; "repeat" feeds every step the same
  // token per sequence (the protocol before 2026-12-01 21:30, whose repeated routing lets a host
  // expert cache serve what the roofline sends to disk).
  std::string decode_tokens = "random";
  // Each decode step returns every sequence's logits to the host (a caller that keeps them)
  // instead of drawing its token on the backend.
  bool decode_logits = false;
  // The placements without a disk share read their host experts from a host expert cache of all
  // experts filled at start (--host-mem 100% --host-fill) instead of the checkpoint's pages.
  bool host_cache = false;
};

using PlacementSpec = offload::BenchPlacement;  // one list with `strata plan --bench-e2e`

// The token sequence b reads at decode step n (Options::decode_tokens).
int32_t decode_token(const std::string& mode, uint64_t n, int b, int64_t vocab) {
  if (mode == "repeat") return int32_t((b * 977 + 5) % vocab);
  uint64_t h = n * 0x9E3779B97F4A7C15ull + uint64_t(b);  // splitmix64 of (step, sequence)
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  return int32_t((h ^ (h >> 31)) % uint64_t(vocab));
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int run(const Options& o) {
  engine::InspectOptions lo;
  lo.experts_quantize = o.experts_quantize;
  auto model = engine::Model::load(o.model_dir, engine::load_options(lo));
  const ModelConfig& c = model->config();
  const bool tty = ::isatty(STDERR_FILENO);
  const double t0 = now_s();
  auto progress = [&](const std::string& s) {
    std::fprintf(stderr, tty ? "\r\033[K[%6.1f s] %s..." : "[%6.1f s] %s...\n", now_s() - t0,
                 s.c_str());
    std::fflush(stderr);
  };
  // Hardware peaks, in this run (no kernel rates: the roofline never uses them).
  offload::MeasureOptions mo;
  mo.quick = true;
  mo.cpu_kernels = false;
  mo.progress = progress;
  offload::HardwareProfile hw = offload::measure_hardware(mo);
  if (tty) std::fprintf(stderr, "\r\033[K");
  for (const auto& n : hw.not_measured)
    std::fprintf(stderr, "bench e2e: not measured: %s\n", n.c_str());
  // The peaks every roofline below divides by, printed and saved with the lines (a roofline moves
  // with them from machine to machine of one kind).
  nlohmann::json peaks;
  std::string peaks_text;
  auto peak = [&](const char* key, const char* what, const offload::Rate& r, const char* unit) {
    if (!r.known()) return;
    peaks[key] = r.value();
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s%s %.1f %s", peaks_text.empty() ? "" : ", ", what, r.value(),
                  unit);
    peaks_text += buf;
  };
  if (hw.gpu.count > 0) {
    peak("hbm_copy_gbps", "HBM copy", hw.gpu.hbm_copy_gbps, "GB/s");
    peak("bf16_gemm_tflops", "bf16 GEMM", hw.gpu.bf16_gemm_tflops, "TFLOP/s");
    peak("h2d_gbps", "host->device", hw.gpu.h2d_gbps, "GB/s");
  }
  peak("host_read_gbps", "host memory read", hw.host.mem_read_gbps, "GB/s");
  peak("disk_gbps", "disk O_DIRECT", hw.disk.read_gbps, "GB/s");
  std::printf("peaks (this run): %s\n", peaks_text.c_str());

  // The GPU placements for --device gpu, or auto with a GPU; the CPU ones for cpu and cpu-ref.
  const bool gpu = (o.device == "gpu" || o.device == "auto") && hw.gpu.count > 0;
  std::vector<PlacementSpec> specs = offload::bench_e2e_placements(gpu, c.moe.num_experts);
  if (model->experts_quantized()) {  // the disk tier serves the checkpoint's bf16 experts
    std::vector<PlacementSpec> keep;
    for (const auto& s : specs)
      if (s.host_mem.empty())
        keep.push_back(s);
      else
        std::fprintf(stderr,
                     "bench e2e: %s: skipped (--experts-quantize keeps all in host memory)\n",
                     s.name.c_str());
    specs = keep;
  }
  if (o.placements != "all") {
    std::vector<PlacementSpec> keep;
    for (const auto& s : specs)
      if (o.placements.find(s.name) != std::string::npos) keep.push_back(s);
    if (keep.empty()) throw Error("--placements: no placement named '" + o.placements + "'");
    specs = keep;
  }
  offload::CostOptions co;
  co.trunk = gpu ? offload::TrunkBackend::gpu : offload::TrunkBackend::cpu_bf16;  // peaks only
  std::unique_ptr<offload::CostModel> cost;
  try {
    cost = std::make_unique<offload::CostModel>(hw, c, co);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench e2e: no roofline (%s)\n", e.what());
  }
  int64_t max_prefill = 0;
  for (int64_t p : o.prefill) max_prefill = std::max(max_prefill, p);
  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());

  nlohmann::json out = nlohmann::json::array();
  std::printf("%-28s %-22s %12s %12s %8s  %s\n", "placement", "measure", "tok/s", "roofline",
              "% roof", "roofline bound");
  auto report = [&](const PlacementSpec& sp, const std::string& what, double toks,
                    const offload::Roofline* r) {
    const double roof = r ? r->tokens_per_s : 0;
    std::printf("%-28s %-22s %12.2f %12.2f %7.1f%%  %s\n", sp.name.c_str(), what.c_str(), toks,
                roof, roof > 0 ? 100.0 * toks / roof : 0.0, r ? r->bound.c_str() : "-");
    std::fflush(stdout);
    nlohmann::json j = {{"placement", sp.name}, {"measure", what}, {"tokens_per_s", toks}};
    if (r) {
      j["roofline_tokens_per_s"] = roof;
      j["percent_of_roofline"] = roof > 0 ? 100.0 * toks / roof : 0.0;
      j["roofline_bound"] = r->bound;
      j["overlap_assumption"] = r->assumption;
    }
    out.push_back(j);
  };
  std::string assumption;
  for (const PlacementSpec& sp : specs) {
    engine::InspectOptions io;
    io.device = o.device;
    io.profile = o.profile;
    io.hardware = o.hardware;  // the cost model's inputs for the engine's decisions (staging)
    io.gpu_experts = sp.gpu_experts;
    // Static placements: each line is read against its placement's roofline, which promotions
    // would move under it.
    io.gpu_promote = "off";
    io.max_context = max_prefill + o.context + o.steps + 16;
    engine::SessionSetup setup(io, c);
    engine::SessionOptions so = setup.options();
    engine::OffloadOptions oo;
    oo.host_mem = sp.host_mem;
    if (o.host_cache && oo.host_mem.empty() && sp.share.host > 0) {
      oo.host_mem = "100%";
      oo.host_fill = true;
    }
    engine::OffloadRuntime offload(*model, oo);
    offload.install(so);
    progress(std::string(sp.name) + ": loading");
    auto backend = setup.make_backend(*model, so, max_batch);
    if (tty) std::fprintf(stderr, "\r\033[K");
    std::fprintf(stderr, "bench e2e: %s: %s\n", sp.name.c_str(), backend->name());
    engine::Schedule sched(*backend, c);
    // The backend's telemetry of the line just measured (its timed part only), and the expert
    // tiers' (host cache hits, prefetches, disk reads) when the placement has them.
    offload::TierTelemetry tiers0;
    auto start_telemetry = [&] {
      backend->reset_telemetry();
      if (offload.active()) tiers0 = offload.telemetry();
    };
    auto print_telemetry = [&] {
      const std::string tl = backend->telemetry_line();
      if (!tl.empty()) {
        std::printf("  %s\n", tl.c_str());
        if (!out.empty()) out.back()["telemetry"] = tl;
      }
      if (offload.active()) {
        const offload::TierTelemetry d = offload.telemetry().since(tiers0);
        std::printf("  %s\n", d.line().c_str());
        if (!out.empty()) out.back()["tiers"] = d.json();
      }
    };
    // Decode at each batch size.
    for (int B : o.batches) {
      progress(std::string(sp.name) + ": decode B=" + std::to_string(B));
      for (int b = 0; b < B; ++b) {
        backend->reset_slot(b);
        std::vector<int32_t> ids(static_cast<size_t>(o.context));
        for (int64_t t = 0; t < o.context; ++t)
          ids[size_t(t)] = int32_t((t * 7919 + b * 131 + 7) % c.vocab_size);
        engine::Session s(*model, *backend, b, so);
        s.forward(ids);
      }
      std::vector<int32_t> tok(static_cast<size_t>(B));
      std::vector<engine::SeqChunk> chunks(static_cast<size_t>(B));
      // Every step draws each sequence's next token as `strata run` does (greedy, on the backend:
      // Backend::sample); the tokens fed are --decode-tokens'.
      const engine::TokenDraw greedy;
      uint64_t step_no = 0;
      auto step = [&]() {
        ++step_no;
        for (int b = 0; b < B; ++b) {
          tok[size_t(b)] = decode_token(o.decode_tokens, step_no, b, c.vocab_size);
          chunks[size_t(b)] = engine::SeqChunk{b, std::span(&tok[size_t(b)], 1), true, false,
                                               o.decode_logits ? nullptr : &greedy};
        }
        sched.step(chunks);
      };
      for (int i = 0; i < 4; ++i) step();
      start_telemetry();
      const double ts = now_s();
      for (int i = 0; i < o.steps; ++i) step();
      const double dt = now_s() - ts;
      offload::Roofline r;
      if (cost) r = cost->decode_roofline(sp.share, B, o.context + 4 + o.steps / 2);
      if (cost) assumption = r.assumption;
      if (tty) std::fprintf(stderr, "\r\033[K");
      report(sp, "decode B=" + std::to_string(B), double(B) * o.steps / dt, cost ? &r : nullptr);
      print_telemetry();
    }
    // Prefill.
    for (int64_t P : o.prefill) {
      progress(std::string(sp.name) + ": prefill " + std::to_string(P));
      backend->reset_slot(0);
      engine::Session s(*model, *backend, 0, so);
      // Warm-up: one chunk of the timed prompt's shape (cuBLASLt plans and workspaces are made
      // at a shape's first use: tens of ms that are not the steady state).
      std::vector<int32_t> warm(size_t(std::min<int64_t>(P, backend->max_step_rows())), 1);
      s.forward(warm);
      backend->reset_slot(0);
      std::vector<int32_t> ids(static_cast<size_t>(P));
      for (int64_t t = 0; t < P; ++t) ids[size_t(t)] = int32_t((t * 7919 + 3) % c.vocab_size);
      start_telemetry();
      // Each timed prompt on a fresh sequence (the reset untimed); the line is the median run.
      const offload::RateSample ts = offload::time_repeats(
          [&] { s.forward(ids); }, o.prefill_repeats, 0, [&] { backend->reset_slot(0); });
      offload::Roofline r;
      if (cost)
        r = cost->prefill_roofline(sp.share, P,
                                   backend->max_step_rows() < P ? backend->max_step_rows() : P);
      if (tty) std::fprintf(stderr, "\r\033[K");
      report(sp, "prefill " + std::to_string(P), double(P) / ts.median_s, cost ? &r : nullptr);
      if (ts.repeats > 1) {
        out.back()["repeats"] = ts.repeats;
        out.back()["min_tokens_per_s"] = double(P) / ts.max_s;
        out.back()["max_tokens_per_s"] = double(P) / ts.min_s;
        std::printf("  %d runs: %.2f to %.2f tok/s (the line: their median)\n", ts.repeats,
                    double(P) / ts.max_s, double(P) / ts.min_s);
      }
      print_telemetry();
    }
  }
  if (!assumption.empty()) std::printf("roofline: %s\n", assumption.c_str());
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    if (!f) throw Error("--json " + o.json + ": cannot write");
    f << nlohmann::json{{"bench", "e2e"}, {"model", o.model_dir}, {"peaks", peaks}, {"lines", out}}
             .dump(2)
      << "\n";
  }
  return 0;
}

BenchSetup setup = [](CLI::App& app) -> std::function<int()> {
  auto o = std::make_shared<Options>();
  app.add_option("-m,--model", o->model_dir, "model directory")->required();
  app.add_option("--device", o->device, "auto, gpu, cpu (the fast CPU backend) or cpu-ref")
      ->capture_default_str();
  app.add_option("--placements", o->placements,
                 "all, or one placement name (e.g. 'all GPU', 'all host')")
      ->capture_default_str();
  app.add_option("--batch", o->batches, "decode batch sizes")->capture_default_str();
  app.add_option("--prefill", o->prefill, "prefill prompt lengths")->capture_default_str();
  app.add_option("--context", o->context, "prompt tokens per sequence before decode")
      ->capture_default_str();
  app.add_option("--steps", o->steps, "timed decode steps")->capture_default_str();
  app.add_option("--prefill-repeats", o->prefill_repeats,
                 "timed prompts per prefill line, each on a fresh sequence; the line is their "
                 "median (with a disk share, later repeats may find experts in the host cache)")
      ->capture_default_str();
  app.add_option("--hardware", o->hardware,
                 "a `strata bench hw --save` profile for the engine's cost-model decisions (the "
                 "prefill staging threshold); default: rates measured at first need");
  app.add_option("--json", o->json, "write the lines as JSON");
  app.add_option("--decode-tokens", o->decode_tokens,
                 "random (each step's token drawn per sequence, seeded) or repeat (the same token "
                 "every step)")
      ->check(CLI::IsMember({"random", "repeat"}))
      ->capture_default_str();
  app.add_flag("--decode-logits", o->decode_logits,
               "decode steps return every sequence's logits to the host instead of drawing the "
               "next token on the backend (what `strata run` does)");
  app.add_flag("--host-cache", o->host_cache,
               "placements without a disk share read host experts from a host expert cache of all "
               "experts filled at start (as --host-mem 100% --host-fill) instead of the mmapped "
               "checkpoint");
  app.add_flag("--profile", o->profile,
               "GPU engine: GPU time per sublayer kind from timing events (turns CUDA graphs off)");
  app.add_option("--experts-quantize", o->experts_quantize,
                 "mxfp4: quantize bf16 routed experts to MXFP4 at load (placements with disk "
                 "are skipped)");
  return [o] {
    if (o->steps < 1 || o->context < 1) throw Error("--steps and --context must be >= 1");
    check_option("--prefill-repeats", o->prefill_repeats, 1, 100);
    std::error_code ec;
    if (!o->hardware.empty() && !std::filesystem::is_regular_file(o->hardware, ec))
      throw Error("--hardware " + o->hardware + ": not found");
    for (int b : o->batches)
      if (b < 1 || b > 256) throw Error("--batch: expected 1..256, got " + std::to_string(b));
    for (int64_t p : o->prefill)
      if (p < 1) throw Error("--prefill: expected positive lengths");
    check_json_output(o->json);
    return run(*o);
  };
};

STRATA_BENCH("e2e",
             "the engine end to end: decode and prefill tok/s per expert placement against a "
             "roofline from peaks measured in the same run",
             setup);

}  // namespace
}  // namespace strata::tools
