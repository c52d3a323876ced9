// `strata logits`: the logits of every prompt position as an F32 tensor `logits` [T, vocab] in a
// safetensors file, for parity checks against other engines (DESIGN "User-facing interfaces").
// With --stop-after-layer N it writes the residual stream after layer N instead (`hidden` [T, D]).
#include <cstdio>

#include "engine/cli_support.h"
#include "engine/model.h"
#include "engine/offload_executor.h"
#include "engine/session.h"
#include "storage/error.h"
#include "storage/safetensors.h"
#include "tools/command.h"

namespace strata::tools {

void add_offload_options(CLI::App& app, engine::OffloadOptions& o);  // offload_options.cpp

// The options of every forward-running command (also used by cmd_run.cpp).
// The engine's options (device, numerics, GPU budget, threads), shared with `strata batch`.
void add_engine_options(CLI::App& app, engine::InspectOptions& o) {
  app.add_option("--device", o.device,
                 "auto (the GPU when present, for bf16 + contract), cpu or gpu")
      ->capture_default_str();
  app.add_option("--precision", o.precision, "fp32 (the oracle, CPU) or bf16 (spec §12.2 rounding)")
      ->capture_default_str();
  app.add_option("--experts-numerics", o.experts_numerics,
                 "routed experts: auto (contract for MXFP4 experts; bf16 for bf16 experts in "
                 "bf16, exact in fp32), exact (fp32 dequant, CPU), contract (docs/numerics.md) or "
                 "bf16 (bf16 experts on the fast bf16 GEMMs, CPU)")
      ->capture_default_str();
  app.add_option("--experts-quantize", o.experts_quantize,
                 "mxfp4: quantize bf16 routed experts to MXFP4 at load (OCP rule, into host "
                 "memory); the model then runs as an MXFP4 model (contract numerics, GPU)");
  app.add_option("--gpu-mem", o.gpu_mem, "GPU memory budget (e.g. 60GiB; default: free - 1 GiB)");
  app.add_option("--gpu-experts", o.gpu_experts,
                 "share of each MoE layer's routed experts held in the GPU cache (e.g. 10%; "
                 "default: as many as the budget holds)");
  app.add_option("--gpu-promote", o.gpu_promote,
                 "promote hot experts into the GPU cache from routing statistics (copies on a "
                 "copy stream, never waited for): on (every 16 steps), off, or an interval N")
      ->capture_default_str();
  app.add_option("--max-context", o.max_context, "positions per sequence the GPU state holds")
      ->capture_default_str();
  app.add_flag("--no-cuda-graphs", o.no_cuda_graphs,
               "GPU decode steps launch kernel by kernel instead of replaying CUDA graphs");
  app.add_option("--hardware", o.hardware,
                 "hardware profile (strata bench hw --save) for the cost model's decisions (the "
                 "prefill staging threshold); default: measured when first needed");
  app.add_option("--max-step-rows", o.max_step_rows,
                 "tokens per GPU step (prefill chunk); longer prompts run in chunks")
      ->capture_default_str();
  app.add_option("--threads", o.threads, "worker threads (0 = all cores)")->capture_default_str();
}

void add_inspect_options(CLI::App& app, engine::InspectOptions& o) {
  add_engine_options(app, o);
  app.add_option("--dump", o.dump_dir, "write matching intermediates to DIR/dump.safetensors");
  app.add_option("--dump-sites", o.dump_sites,
                 "regex of site names to dump, e.g. 'blk\\.3\\..*' or 'blk\\.[0-9]+\\.out'")
      ->capture_default_str();
  app.add_option("--stop-after-layer", o.stop_after_layer, "stop the forward after layer N");
  app.add_option("--record-routing", o.record_routing, "write every MoE layer's routing (JSON)");
  app.add_option("--replay-routing", o.replay_routing, "force the routing of a recorded file");
  app.add_flag("--check-weights", o.check_weights,
               "scan every weight for NaN/Inf at load (small tensors are always scanned)");
}

namespace {

struct LogitsOptions {
  std::string model_dir, ids_file, out;
  engine::InspectOptions inspect;
  engine::OffloadOptions offload;
};

int run_logits(const LogitsOptions& o) {
  // -o is replaced if it is a regular file (that is what -o asks for); never a directory, device,
  // FIFO, or a file this command reads (the model's, --ids, --replay-routing).
  engine::check_before_load(o.inspect, &o.offload, o.model_dir, {o.ids_file},
                            {{"-o", o.out}, {"--stats-json", o.offload.stats_json}});
  const engine::LoadOptions lo = engine::load_options(o.inspect);
  auto model = engine::Model::load(o.model_dir, lo);
  const ModelConfig& c = model->config();
  std::vector<int32_t> ids = engine::read_ids_file(o.ids_file, c.vocab_size);
  const int64_t T = int64_t(ids.size());
  engine::SessionSetup setup(o.inspect, c, {T, T});
  engine::OffloadRuntime offload(*model, o.offload);  // --host-mem: experts from the store
  for (const auto& line : offload.describe()) std::fprintf(stderr, "strata: %s\n", line.c_str());
  engine::SessionOptions sopt = setup.options();
  offload.install(sopt);
  auto backend = setup.make_backend(*model, sopt);
  if (!setup.device_line().empty())
    std::fprintf(stderr, "strata: %s\n", setup.device_line().c_str());
  engine::Session session(*model, *backend, 0, sopt);
  std::vector<float> out;
  std::string name;
  std::vector<int64_t> shape;
  if (o.inspect.stop_after_layer >= 0) {
    engine::Stream s = session.embed(ids);
    for (int l = 0; l <= o.inspect.stop_after_layer; ++l) session.run_layer(l, s);
    session.advance(T);
    out = std::move(s.P);
    name = "hidden";
    shape = {T, c.hidden_size};
  } else {
    out = session.forward(ids, /*all_logits=*/true);
    name = "logits";
    shape = {T, c.vocab_size};
  }
  SafetensorsWriter w(o.out, {TensorDecl{name, DType::F32, shape}},
                      {{"format", "pt"}, {"model", o.model_dir}, {"settings", setup.describe()}});
  w.write_tensor(name, out.data(), out.size() * sizeof(float));
  w.finish();
  setup.finish();
  offload.finish();
  std::fprintf(stderr,
               "strata logits: %lld positions, %s %s -> %s (%s; backend %s; %.1f MiB of weights "
               "checked for NaN/Inf%s)\n",
               (long long)T, name.c_str(), shape_str(shape).c_str(), o.out.c_str(),
               setup.describe().c_str(), backend->name(),
               double(model->scanned_weight_bytes()) / 1048576.0,
               lo.check_weights ? ", --check-weights" : "");
  return 0;
}

}  // namespace

STRATA_COMMAND("logits", "Logits of every prompt position (F32 [T, vocab]) to a safetensors file",
               [](CLI::App& app) -> CommandRun {
                 auto o = std::make_shared<LogitsOptions>();
                 app.add_option("-m,--model", o->model_dir, "model directory")->required();
                 app.add_option("--ids", o->ids_file, "prompt token ids: a JSON array")->required();
                 app.add_option("-o,--output", o->out,
                                "output .safetensors file (an existing regular file is replaced; "
                                "a directory, device, FIFO or a file of the model is refused)")
                     ->required();
                 add_inspect_options(app, o->inspect);
                 add_offload_options(app, o->offload);
                 return [o] { return run_logits(*o); };
               });

}  // namespace strata::tools
