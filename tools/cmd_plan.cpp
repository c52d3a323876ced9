// `strata plan`: what a machine will do with a model before anyone buys it (issue 22). The model
// comes from a checkpoint directory or a config.json alone; the hardware from a JSON description
// (docs/hardware/*.json) or `auto` (this machine's hwloc/CUDA view plus the rates `strata bench hw`
// saved); the workload from flags. Prints the plan of offload/plan.h (placement, memory budget per
// tier, predicted prefill/decode speed and bottleneck, the change that helps most), or refuses with
// the reason; --json writes it for programs, --svg a chart of predicted decode tok/s against DRAM
// size and GPU count. All numbers come from the one cost model (offload/cost_model.h).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "engine/cli_support.h"
#include "engine/model.h"
#include "offload/plan.h"
#include "storage/config.h"
#include "storage/error.h"
#include "tools/command.h"

namespace strata::tools {

namespace {

namespace fs = std::filesystem;
using namespace offload;

struct Options {
  std::string model, config, hardware = "auto", json, svg, backend = "auto", overlap = "moe-layer";
  std::string experts_quantize;  // --experts-quantize mxfp4
  std::string placement;
  int64_t context = 8192, prompt_len = 8192, gen_len = 256, chunk = 0;
  int concurrency = 1;
  // --bench-e2e: predict `strata bench e2e`'s lines (its flags, its defaults).
  bool bench_e2e = false;
  bool host_cache = false;  // --bench-e2e --host-cache: host placements from a page-locked cache
  std::string device = "auto", placements = "all";
  std::vector<int> batches = {1, 8};
  std::vector<int64_t> prefill = {1024, 16384};
  int steps = 32;
  std::vector<std::string> assume;  // NAME=VALUE overrides of CostAssumptions
};

// --assume NAME=VALUE: one of the cost model's assumptions (offload/cost_model.h CostAssumptions)
// replaced, for replaying a prediction under another assumption.
void apply_assumption(CostAssumptions& a, const std::string& kv) {
  const std::map<std::string, double*> known = {
      {"gpu_kernel_us", &a.gpu_kernel_us},
      {"gpu_gemm_fixed_us", &a.gpu_gemm_fixed_us},
      {"gpu_sync_us", &a.gpu_sync_us},
      {"gpu_moe_host_us", &a.gpu_moe_host_us},
      {"cpu_expert_call_us", &a.cpu_expert_call_us},
      {"gpu_engine_cpu_expert_efficiency", &a.gpu_engine_cpu_expert_efficiency},
      {"gpu_engine_expert_efficiency", &a.gpu_engine_expert_efficiency},
      {"stage_copy_gbps", &a.stage_copy_gbps},
      {"gpu_staging_dma_efficiency", &a.gpu_staging_dma_efficiency},
      {"gpu_extra_syncs_per_layer", &a.gpu_extra_syncs_per_layer},
      {"gpu_device_groups", &a.gpu_device_groups},
      {"gpu_expert_gemv_below_mean_pairs", &a.gpu_expert_gemv_below_mean_pairs},
      {"prefetch_recall", &a.prefetch_recall},
      {"gpu_kda_decode_hbm_efficiency", &a.gpu_kda_decode_hbm_efficiency},
      {"cpu_layer_overhead_us", &a.cpu_layer_overhead_us},
      {"cpu_ref_linear_call_us", &a.cpu_ref_linear_call_us}};
  const size_t eq = kv.find('=');
  const std::string name = kv.substr(0, eq);
  auto it = known.find(name);
  if (eq == std::string::npos || it == known.end()) {
    std::string names;
    for (auto& [n, p] : known) names += (names.empty() ? "" : ", ") + n;
    throw Error("--assume '" + kv + "': expected NAME=VALUE with NAME one of " + names);
  }
  char* end = nullptr;
  const std::string v = kv.substr(eq + 1);
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != 0 || !std::isfinite(x) || x < 0)
    throw Error("--assume " + name + ": '" + v + "' is not a number ≥ 0");
  *it->second = x;
}

// Where `strata bench hw --save` output is looked for by --hardware auto.
fs::path default_profile_path() {
  const char* home = std::getenv("HOME");
  return fs::path(home ? home : "/tmp") / ".cache" / "strata" / "hardware.json";
}

HardwareProfile load_hw(const std::string& spec, std::string* note) {
  if (spec != "auto") return load_hardware(spec);
  HardwareProfile hw = probe_static();
  const fs::path saved = default_profile_path();
  std::error_code ec;
  if (fs::exists(saved, ec)) {
    hw = merge(hw, load_hardware(saved));  // this process's view of sizes wins; rates from file
    hw.source = saved.string();
    *note = "hardware: this machine (hwloc, CUDA) with the rates saved in " + saved.string();
  } else {
    hw.source = "--hardware auto";
    *note = "hardware: this machine (hwloc, CUDA); no saved rates in " + saved.string() +
            " (run `strata bench hw --save " + saved.string() + "`)";
  }
  hw.description = "this machine";
  return hw;
}

Overlap parse_overlap(const std::string& s) {
  if (s == "serial") return Overlap::serial;
  if (s == "moe-layer") return Overlap::moe_layer;
  if (s == "full") return Overlap::full;
  throw Error("--overlap '" + s + "': expected serial, moe-layer or full");
}

// `strata bench e2e`'s lines predicted by the cost model: the same placements
// (offload::bench_e2e_placements), the same protocol (tools/bench_e2e.cpp: decode after a prompt
// of `context` tokens per sequence, 4 warm-up steps, then `steps` timed ones, so a mean cached
// length of context + 4 + steps/2; prefill of a fresh prompt in chunks of the backend's step
// rows: 512 on the GPU, the whole prompt on the CPU backends).
int predict_bench_e2e(const HardwareProfile& hw, const ModelConfig& cfg, const Options& o,
                      int64_t context, const std::string& note) {
  CostOptions co;
  co.overlap = parse_overlap(o.overlap);
  co.staging_dma = o.host_cache;
  for (const std::string& kv : o.assume) apply_assumption(co.assumptions, kv);
  bool gpu = false;
  if (o.device == "gpu" || (o.device == "auto" && hw.gpu.count > 0)) {
    co.trunk = TrunkBackend::gpu;
    gpu = true;
  } else if (o.device == "cpu" || o.device == "auto") {
    co.trunk = TrunkBackend::cpu_bf16;
  } else if (o.device == "cpu-ref") {
    co.trunk = TrunkBackend::cpu_reference;
  } else {
    throw Error("--device '" + o.device + "': expected auto, gpu, cpu or cpu-ref");
  }
  if (gpu && hw.gpu.count == 0) throw Error("--device gpu: " + hw.source + " lists no GPU");
  const CostModel cm(hw, cfg, co);
  std::vector<BenchPlacement> specs = bench_e2e_placements(gpu, cfg.moe.num_experts);
  if (o.placements != "all") {
    std::vector<BenchPlacement> keep;
    for (const auto& sp : specs)
      if (o.placements.find(sp.name) != std::string::npos) keep.push_back(sp);
    if (keep.empty()) throw Error("--placements: no placement named '" + o.placements + "'");
    specs = keep;
  }
  if (!note.empty()) std::printf("%s\n", note.c_str());
  std::printf("model: %s\nhardware: %s\n", describe_config(cfg).c_str(), hw.description.c_str());
  if (!cm.rates_basis().empty()) std::printf("%s\n", cm.rates_basis().c_str());
  const int64_t chunk_rows = gpu ? engine::InspectOptions{}.max_step_rows : 0;
  const int64_t mean_context = context + 4 + o.steps / 2;
  std::printf(
      "predicted `strata bench e2e` lines (%s backend, decode at a mean context of %lld, "
      "prefill chunks of %s)\n",
      trunk_backend_name(co.trunk), (long long)mean_context,
      chunk_rows ? std::to_string(chunk_rows).c_str() : "the whole prompt");
  std::printf("%-28s %-16s %12s  %s\n", "placement", "measure", "tok/s", "bottleneck");
  nlohmann::json lines = nlohmann::json::array();
  auto line = [&](const BenchPlacement& sp, const std::string& what, double tps,
                  const std::string& bottleneck, const std::vector<TimePart>& parts,
                  double seconds) {
    std::printf("%-28s %-16s %12.2f  %s\n", sp.name.c_str(), what.c_str(), tps, bottleneck.c_str());
    nlohmann::json jp = nlohmann::json::array();
    for (const TimePart& t : parts)
      jp.push_back({{"name", t.name}, {"resource", t.resource}, {"seconds", t.seconds}});
    lines.push_back(
        {{"placement", sp.name},
         {"measure", what},
         {"predicted_tokens_per_s", tps},
         {"seconds", seconds},
         {"share", {{"gpu", sp.share.gpu}, {"host", sp.share.host}, {"disk", sp.share.disk}}},
         {"bottleneck", bottleneck},
         {"parts", jp}});
  };
  for (const BenchPlacement& sp : specs) {
    for (int B : o.batches) {
      const DecodeEstimate d = cm.decode_step(sp.share, B, mean_context);
      line(sp, "decode B=" + std::to_string(B), d.tokens_per_s, d.bottleneck, d.parts, d.step_s);
    }
    for (int64_t P : o.prefill) {
      const PrefillEstimate pf = cm.prefill(sp.share, P, chunk_rows > 0 ? chunk_rows : P);
      line(sp, "prefill " + std::to_string(P), pf.tokens_per_s, pf.bottleneck, pf.parts,
           pf.total_s);
    }
  }
  std::printf("overlap: %s\n", overlap_description(co.overlap, co.trunk).c_str());
  std::printf("rates:\n");
  for (const std::string& r : cm.describe_rates()) std::printf("  %s\n", r.c_str());
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    if (!f) throw Error(o.json + ": cannot write");
    f << nlohmann::json{{"predicts", "bench e2e"},
                        {"hardware", hw.source.empty() ? hw.description : hw.source},
                        {"backend", trunk_backend_name(co.trunk)},
                        {"mean_context", mean_context},
                        {"rates_basis", cm.rates_basis()},
                        {"prefill_chunk", chunk_rows},
                        {"rates", cm.describe_rates()},
                        {"lines", lines}}
             .dump(2)
      << "\n";
  }
  return 0;
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '&')
      o += "&amp;";
    else if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else
      o += c;
  }
  return o;
}

// Predicted decode tok/s against DRAM size per node (log x) for several GPU counts per node.
void write_svg(const std::string& path, const HardwareProfile& hw, const ModelConfig& cfg,
               const Workload& w, const PlanOptions& po, const Plan& current) {
  // GiB per node: powers of two (labelled) and the sizes between.
  const std::vector<double> dram_gb = {64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096};
  std::vector<int> gpu_counts;
  if (current.backend == TrunkBackend::gpu)
    gpu_counts = {1, 2, 4, 8};
  else
    gpu_counts = {0};
  struct Series {
    std::string label;
    std::vector<std::pair<double, double>> pts;  // (DRAM GiB, tok/s); tok/s < 0 = cannot run
  };
  std::vector<Series> series;
  double ymax = 0;
  for (int g : gpu_counts) {
    Series s;
    s.label = g == 0 ? std::string("CPU only (") + trunk_backend_name(current.backend) + ")"
                     : std::to_string(g) + (g == 1 ? " GPU" : " GPUs") + " per node";
    for (double d : dram_gb) {
      HardwareProfile v = hw;
      v.host.dram_bytes = uint64_t(d * 1073741824.0);
      if (g > 0) v.gpu.count = g;
      double t = -1;
      try {
        Plan q = make_plan_core(v, cfg, w, po);
        if (q.refusal.empty()) t = q.decode.tokens_per_s;
      } catch (const Error&) {
      }
      s.pts.push_back({d, t});
      ymax = std::max(ymax, t);
    }
    series.push_back(s);
  }
  if (ymax <= 0) ymax = 1;
  // A round top for the y axis.
  const double mag = std::pow(10.0, std::floor(std::log10(ymax)));
  double top = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= ymax * 1.05) {
      top = m * mag;
      break;
    }
  const double W = 820, H = 480, L = 70, R = 250, T = 60, B = 60;
  const double pw = W - L - R, ph = H - T - B;
  const double x0 = std::log2(dram_gb.front()), x1 = std::log2(dram_gb.back());
  auto X = [&](double d) { return L + (std::log2(d) - x0) / (x1 - x0) * pw; };
  auto Y = [&](double t) { return T + ph - t / top * ph; };
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd"};
  std::ofstream f(path);
  if (!f) throw Error(path + ": cannot write");
  char b[512];
  f << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << " " << H << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  f << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::snprintf(b, sizeof b,
                "<text x=\"%g\" y=\"24\" font-size=\"15\" font-weight=\"bold\">Predicted decode "
                "tok/s (total, batch %d, context %lld)</text>\n",
                L, w.concurrency, (long long)w.context);
  f << b;
  f << "<text x=\"" << L << "\" y=\"42\" fill=\"#555\">" << esc(current.model.substr(0, 110))
    << "</text>\n";
  for (int i = 0; i <= 5; ++i) {
    const double t = top * i / 5, y = Y(t);
    std::snprintf(b, sizeof b,
                  "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#ddd\"/>"
                  "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%g</text>\n",
                  L, y, L + pw, y, L - 6, y + 4, t);
    f << b;
  }
  for (double d : dram_gb) {
    const double x = X(d);
    std::snprintf(b, sizeof b, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#eee\"/>\n",
                  x, T, x, T + ph);
    f << b;
    const double l2 = std::log2(d);
    if (l2 != std::floor(l2)) continue;  // label the powers of two only (no overlaps)
    char label[32];
    if (d >= 1000)
      std::snprintf(label, sizeof label, "%g TiB", d / 1024);
    else
      std::snprintf(label, sizeof label, "%g GiB", d);
    std::snprintf(b, sizeof b, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%s</text>\n", x,
                  T + ph + 18, label);
    f << b;
  }
  std::snprintf(
      b, sizeof b,
      "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"none\" stroke=\"#333\"/>\n"
      "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">host DRAM per node (log scale)</text>\n"
      "<text transform=\"translate(18 %g) rotate(-90)\" text-anchor=\"middle\">tok/s</text>\n",
      L, T, pw, ph, L + pw / 2, H - 14, T + ph / 2);
  f << b;
  for (size_t i = 0; i < series.size(); ++i) {
    const char* c = colors[i % 4];
    std::string d;
    bool pen = false;
    for (auto& [x, t] : series[i].pts) {
      if (t < 0) {
        pen = false;
        continue;
      }
      std::snprintf(b, sizeof b, "%s%.1f %.1f ", pen ? "L" : "M", X(x), Y(t));
      d += b;
      pen = true;
    }
    if (!d.empty())
      f << "<path d=\"" << d << "\" fill=\"none\" stroke=\"" << c << "\" stroke-width=\"2\"/>\n";
    for (auto& [x, t] : series[i].pts)
      if (t >= 0) {
        std::snprintf(b, sizeof b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", X(x),
                      Y(t), c);
        f << b;
      }
    const double ly = T + 10 + 22 * double(i);
    std::snprintf(b, sizeof b,
                  "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"%s\" stroke-width=\"2\"/>"
                  "<text x=\"%g\" y=\"%g\">",
                  L + pw + 14, ly, L + pw + 38, ly, c, L + pw + 44, ly + 4);
    f << b << esc(series[i].label) << "</text>\n";
  }
  // Notes under the legend, in lines short enough for its column.
  std::vector<std::string> notes;
  if (current.backend == TrunkBackend::gpu) notes.push_back("GPU: " + hw.gpu.name);
  notes.push_back("no point: cannot run");
  notes.push_back("other specs as in:");
  for (size_t i = 0; i < hw.description.size() && notes.size() < 8; i += 34)
    notes.push_back(hw.description.substr(i, 34));
  double ny = T + 10 + 22 * double(series.size()) + 10;
  for (const std::string& n : notes) {
    f << "<text x=\"" << L + pw + 14 << "\" y=\"" << ny << "\" fill=\"#555\" font-size=\"11\">"
      << esc(n) << "</text>\n";
    ny += 16;
  }
  f << "</svg>\n";
  if (!f) throw Error(path + ": write failed");
}

CommandRun setup(CLI::App& app) {
  auto o = std::make_shared<Options>();
  auto* m =
      app.add_option("-m,--model", o->model, "checkpoint directory (its config.json is read)");
  auto* c = app.add_option("--config", o->config, "a config.json alone (no weights needed)");
  m->excludes(c);
  app.add_option("--hardware", o->hardware,
                 "auto (this machine + rates saved by `strata bench hw --save "
                 "~/.cache/strata/hardware.json`) or a hardware JSON (docs/hardware/)");
  auto* ctx_opt = app.add_option("--context", o->context,
                                 "tokens cached per sequence while decoding (8192; with "
                                 "--bench-e2e: prompt tokens before decode, 256)");
  app.add_option("--concurrency", o->concurrency, "sequences decoded together (1)");
  app.add_option("--prompt-len", o->prompt_len, "prefill length (8192)");
  app.add_option("--gen-len", o->gen_len, "tokens generated per request (256)");
  app.add_option("--chunk", o->chunk, "prefill chunk (default: GPU ≤ 8192, CPU the whole prompt)");
  app.add_option("--backend", o->backend,
                 "auto | gpu | cpu-reference (the fp32 engine of today) | cpu-bf16 (issue 23)");
  app.add_option("--overlap", o->overlap, "serial | moe-layer (default) | full");
  app.add_option("--placement", o->placement,
                 "GPU,HOST,DISK shares of the routed experts instead of the planner's (e.g. "
                 "0.1,0.3,0.6; for validation against a measured placement)");
  app.add_flag("--bench-e2e", o->bench_e2e,
               "predict the lines of `strata bench e2e` (its placements and protocol; with "
               "--device, --placements, --batch, --prefill, --context (default 256), --steps)");
  app.add_option("--device", o->device, "with --bench-e2e: auto, gpu, cpu or cpu-ref");
  app.add_option("--placements", o->placements, "with --bench-e2e: all, or one placement name");
  app.add_option("--batch", o->batches, "with --bench-e2e: decode batch sizes (1 8)");
  app.add_option("--prefill", o->prefill, "with --bench-e2e: prefill lengths (1024 16384)");
  app.add_option("--steps", o->steps, "with --bench-e2e: timed decode steps (32)");
  app.add_flag("--host-cache", o->host_cache,
               "with --bench-e2e: the host placements' experts in a filled page-locked host "
               "cache, staged by DMA (bench e2e --host-cache)");
  app.add_option("--assume", o->assume,
                 "NAME=VALUE: replace one of the cost model's assumptions (CostAssumptions in "
                 "offload/cost_model.h), e.g. gpu_extra_syncs_per_layer=2");
  app.add_option("--experts-quantize", o->experts_quantize,
                 "mxfp4: plan bf16 routed experts (Kimi-Linear) as quantized at load, as `strata "
                 "run --experts-quantize mxfp4` runs them (contract numerics, the GPU engine)");
  app.add_option("--json", o->json, "write the plan as JSON to FILE");
  app.add_option("--svg", o->svg, "write a chart of decode tok/s against DRAM and GPUs to FILE");
  return [o, ctx_opt]() {
    if (o->model.empty() && o->config.empty())
      throw Error("plan: give the model with -m DIR or --config config.json");
    for (const std::string& kv : o->assume) {  // bad input fails before any output
      CostAssumptions check;
      apply_assumption(check, kv);
    }
    // The output files too: a directory that is missing or not writable, or a path that is a
    // directory, is one line before the report (it used to come after the whole plan printed).
    engine::check_outputs({{"--json", o->json}, {"--svg", o->svg}}, {});
    const fs::path cfg_path =
        o->model.empty() ? fs::path(o->config) : fs::path(o->model) / "config.json";
    std::error_code ec;
    if (!fs::exists(cfg_path, ec))
      throw Error(cfg_path.string() + ": not found" +
                  (o->model.empty() ? "" : " (is " + o->model + " a checkpoint directory?)"));
    ModelConfig cfg = load_config(cfg_path);
    if (engine::parse_experts_quantize(o->experts_quantize)) {  // as Model::load quantizes
      engine::check_experts_quantizable(cfg, cfg.source);
      cfg.moe.mxfp4 = true;
    }
    std::string note;
    const HardwareProfile hw = load_hw(o->hardware, &note);
    if (o->bench_e2e) {
      if (o->steps < 1) throw Error("--steps: expected ≥ 1");
      for (int b : o->batches)
        if (b < 1 || b > 256) throw Error("--batch: expected 1..256, got " + std::to_string(b));
      for (int64_t n : o->prefill)
        if (n < 1) throw Error("--prefill: expected positive lengths");
      const int64_t context = ctx_opt->count() ? o->context : 256;
      if (context < 1) throw Error("--context: expected ≥ 1");
      return predict_bench_e2e(hw, cfg, *o, context, note);
    }
    Workload w;
    w.context = o->context;
    w.concurrency = o->concurrency;
    w.prompt_len = o->prompt_len;
    w.gen_len = o->gen_len;
    w.chunk = o->chunk;
    if (w.context < 1) throw Error("--context: expected ≥ 1");
    if (w.concurrency < 1) throw Error("--concurrency: expected ≥ 1");
    if (w.prompt_len < 1) throw Error("--prompt-len: expected ≥ 1");
    if (w.gen_len < 0) throw Error("--gen-len: expected ≥ 0");
    if (w.chunk < 0) throw Error("--chunk: expected ≥ 1");
    PlanOptions po;
    for (const std::string& kv : o->assume) apply_assumption(po.assumptions, kv);
    po.backend = parse_backend(o->backend, "--backend");
    po.overlap = parse_overlap(o->overlap);
    if (!o->placement.empty()) {
      double g = 0, h = 0, d = 0;
      char extra = 0;
      if (std::sscanf(o->placement.c_str(), "%lf,%lf,%lf%c", &g, &h, &d, &extra) != 3)
        throw Error("--placement '" + o->placement +
                    "': expected three shares GPU,HOST,DISK such as 0.1,0.3,0.6");
      po.force_placement = true;
      po.placement = Placement{g, h, d};
    }
    Plan p;
    try {
      p = make_plan(hw, cfg, w, po);
    } catch (const Error& e) {
      // The likely cause with auto: no saved rates yet; say how to get them.
      if (o->hardware == "auto" && hw.source == "--hardware auto")
        throw Error(std::string(e.what()) + " — no saved rates in " +
                    default_profile_path().string() + ": run `strata bench hw --save " +
                    default_profile_path().string() + "` first");
      throw;
    }
    if (!note.empty()) std::printf("%s\n", note.c_str());
    std::printf("%s", plan_text(p).c_str());
    if (!o->json.empty()) {
      std::ofstream f(o->json);
      if (!f) throw Error(o->json + ": cannot write");
      f << plan_json(p).dump(2) << "\n";
    }
    if (!o->svg.empty()) write_svg(o->svg, hw, cfg, w, po, p);
    if (!p.refusal.empty()) {
      std::fprintf(stderr, "strata plan: cannot run: %s\n", p.refusal.c_str());
      return 1;
    }
    return 0;
  };
}

STRATA_COMMAND("plan",
               "capacity planner: placement, memory budget and predicted tok/s on a machine",
               setup);

}  // namespace

}  // namespace strata::tools
