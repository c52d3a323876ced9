// `strata bench batch -m DIR`: the batch path end to end (engine/batch_scheduler.h on the layer
// schedule): for each document length (--doc-tokens, default 4K and 64K) a job of synthetic
// documents (random token ids, seeded) prefilled in --prefill-chunk chunks and each generating
// --gen tokens, with continuous batching over --slots: documents/s, prompt tok/s, generated tok/s;
// then the same documents one at a time: decode tok/s of one sequence at each length's context,
// read against the shortest (the MLA layers' latent cache is what makes long contexts slower),
// and how many documents' tokens differ between alone and in the job (backends whose kernels
// depend on the step's row count can change bits). Every line carries FLOPs (the cost model's
// counts: 2·active parameters per token, MLA 2·H·(q_dim + v) per causal pair in prefill and
// 2·H·(2·kv_lora + rope) per position in decode, KDA H·(10·64·d + 6·d²) per token and layer), the
// achieved TFLOP/s and the share of a bf16 GEMM peak measured in this run (oneDNN on the CPU;
// cuBLASLt for --device gpu). Protocol: a whole job is one timed repeat (it runs minutes); decode
// lines are the median of the job's decode steps with min and max. Not here: correctness
// (tests/tools/cmd_batch_test.cpp).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "engine/batch_scheduler.h"
#include "engine/cli_support.h"
#include "engine/model.h"
#include "offload/hw_measure.h"
#include "storage/error.h"
#include "tools/bench.h"
#include "tools/bench_peaks.h"

namespace strata::tools {

void add_engine_options(CLI::App& app, engine::InspectOptions& o);  // cmd_logits.cpp

namespace {

struct Options {
  std::string model_dir, json;
  std::vector<int64_t> doc_tokens = {4096, 65536};
  int docs = 0;  // 0: 4 for lengths up to 8K, 1 above
  int gen = 16;
  int slots = 4;
  int prefill_chunk = 2048;
  engine::InspectOptions engine_opts;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// FLOPs of one token at position `pos` (0-based) and whether its logits are computed; decode
// uses the absorbed MLA form, prefill the expanded one (the forms the engine picks).
struct FlopModel {
  const ModelConfig& c;
  double per_token = 0;  // 2·(active parameters without lm_head) + KDA
  double head = 0;       // lm_head, rows whose logits are computed
  explicit FlopModel(const ModelConfig& cfg) : c(cfg) {
    const ModelCosts k = compute_costs(cfg);
    const double lm = double(cfg.vocab_size) * double(cfg.hidden_size);
    head = 2.0 * lm;
    const double H = cfg.kda.num_heads, d = cfg.kda.head_dim;
    per_token = 2.0 * (double(k.active_params_per_token) - lm) +
                H * (10.0 * 64.0 * d + 6.0 * d * d) * cfg.num_kda_layers();
  }
  double prefill(int64_t pos) const {  // keys 0..pos
    const auto& m = c.mla;
    return per_token + 2.0 * m.num_heads * double(m.q_head_dim() + m.v_head_dim) * double(pos + 1) *
                           c.num_mla_layers();
  }
  double decode(int64_t pos) const {
    const auto& m = c.mla;
    return per_token + head +
           2.0 * m.num_heads * double(2 * m.kv_lora_rank + m.qk_rope_head_dim) * double(pos + 1) *
               c.num_mla_layers();
  }
};

// Times every step and keeps the decode-only ones (all chunks one sampled token).
class TimedRunner final : public engine::StepRunner {
 public:
  explicit TimedRunner(engine::StepRunner& inner) : inner_(inner) {}
  int slots() const override { return inner_.slots(); }
  void reset(int slot) override { inner_.reset(slot); }
  int64_t max_step_rows() const override { return inner_.max_step_rows(); }
  std::string describe() const override { return inner_.describe(); }
  std::vector<int32_t> step(std::span<const engine::StepChunk> chunks) override {
    const double t0 = now_s();
    auto out = inner_.step(chunks);
    const double dt = now_s() - t0;
    bool decode = true;
    for (const auto& c : chunks) decode = decode && c.ids.size() == 1 && c.want_token;
    if (decode) decode_steps.push_back({dt, int(chunks.size())});
    return out;
  }
  struct Step {
    double seconds;
    int rows;
  };
  std::vector<Step> decode_steps;

 private:
  engine::StepRunner& inner_;
};

std::string tokens_name(int64_t n) {
  if (n % 1024 == 0 && n >= 1024) return std::to_string(n / 1024) + "K";
  return std::to_string(n);
}

int run(const Options& o) {
  auto model = engine::Model::load(o.model_dir, engine::load_options(o.engine_opts));
  const ModelConfig& c = model->config();
  BenchReport rep("bench batch");
  int64_t longest = 0;
  for (int64_t L : o.doc_tokens) longest = std::max(longest, L);

  engine::InspectOptions eo = o.engine_opts;
  eo.max_context = std::max<int64_t>(eo.max_context, longest + o.gen + 8);
  engine::SessionSetup setup(eo, c);
  auto backend = setup.make_backend(*model, setup.options(), o.slots);
  const bool gpu = std::string(backend->name()).rfind("cuda", 0) == 0;
  rep.note(std::string("model: ") + describe_config(c));
  rep.note(std::string("backend: ") + backend->name() + ", " + std::to_string(o.slots) +
           " slots; " + setup.describe() + "; prefill chunk " + std::to_string(o.prefill_chunk));

  // The peak, measured now: bf16 GEMM of the processor that runs the model.
  double peak = 0;
  std::string peak_name;
  if (gpu) {
    offload::MeasureOptions mo;
    mo.quick = true;
    mo.disk = false;
    mo.cpu_kernels = false;
    const offload::HardwareProfile hw = offload::measure_hardware(mo);
    peak = hw.gpu.bf16_gemm_tflops.value_or(0.0);
    peak_name = "cuBLASLt bf16 (measured)";
  } else {
    const int threads = eo.threads > 0 ? eo.threads : int(std::thread::hardware_concurrency());
    peak = measure_bf16_tflops(2048, 2048, 2048, threads, 5, rep, "2048^3");
    peak_name = "oneDNN bf16 (best rep.)";
  }
  auto runner = engine::make_schedule_runner(*backend, c);
  TimedRunner timed(*runner);
  const FlopModel fm(c);
  std::map<int64_t, double> decode_tps;  // one sequence, by context
  for (int64_t L : o.doc_tokens) {
    const int docs = o.docs > 0 ? o.docs : (L <= 8192 ? 4 : 1);
    // Document k of length L is the same in every pass (seeded by L and k).
    auto document = [&](int k) {
      std::mt19937 rng(uint32_t(L * 31 + k));
      std::uniform_int_distribution<int32_t> id(3, c.vocab_size - 1);
      engine::GenRequest g;
      g.key = k;
      g.prompt.resize(size_t(L));
      for (auto& t : g.prompt) t = id(rng);
      g.max_tokens = o.gen;  // no EOS: every document generates exactly --gen tokens
      return g;
    };
    // Pass 0: the job of `docs` documents in flight together. Pass 1 (docs > 1): each document
    // alone, for the decode line and to count documents whose tokens differ alone and in the job.
    std::map<int64_t, std::vector<int32_t>> in_job, alone;
    for (int pass = 0; pass < (docs > 1 ? 2 : 1); ++pass) {
      const int n = pass == 0 ? docs : 1;
      const int runs = pass == 0 ? 1 : docs;
      double wall = 0;
      engine::SchedulerStats st;
      timed.decode_steps.clear();
      std::fprintf(stderr, "bench batch: %d document%s of %s tokens%s...\n", docs,
                   docs == 1 ? "" : "s", tokens_name(L).c_str(),
                   pass == 1 ? ", one at a time" : "");
      for (int r = 0; r < runs; ++r) {
        int next = pass == 0 ? 0 : r;
        const int end = pass == 0 ? n : r + 1;
        auto source = [&]() -> std::optional<engine::GenRequest> {
          if (next == end) return std::nullopt;
          return document(next++);
        };
        engine::SchedulerOptions so;
        so.prefill_chunk = o.prefill_chunk;
        engine::BatchScheduler sched(timed, nullptr, so);
        std::atomic<bool> stop{false};
        auto& keep = pass == 0 ? in_job : alone;
        const double t0 = now_s();
        sched.run(
            source, [&](engine::GenResult&& g) { keep[g.key] = std::move(g.tokens); }, stop);
        wall += now_s() - t0;
        st = sched.stats();
      }
      double flops = 0;
      for (int64_t p = 0; p < L; ++p) flops += fm.prefill(p);
      flops += fm.head;  // the last prompt row's logits
      for (int g = 1; g < o.gen; ++g) flops += fm.decode(L + g - 1);
      flops *= n;
      if (pass == 0) {
        BenchLine l;
        l.name = "batch/" + tokens_name(L) + " x" + std::to_string(n);
        l.shape = std::to_string(n) + " docs of " + std::to_string(L) + " tok, +" +
                  std::to_string(o.gen) + " gen, " + std::to_string(o.slots) + " slots";
        l.time.median_s = l.time.min_s = l.time.max_s = wall;
        l.time.repeats = 1;
        l.flops = flops;
        l.peak_is_bandwidth = false;
        l.peak_name = peak_name;
        l.peak = peak;
        char note[256];
        std::snprintf(note, sizeof note,
                      "%.4f docs/s, prompt %.1f tok/s, generated %.2f tok/s, %d in flight at most, "
                      "%lld steps, peak RSS %.0f MiB",
                      double(n) / wall, double(st.prompt_tokens) / wall,
                      double(st.generated_tokens) / wall, st.max_in_flight,
                      static_cast<long long>(st.steps),
                      double(engine::peak_rss_bytes()) / (1024.0 * 1024.0));
        l.note = note;
        rep.add(l);
      }
      if (pass == 1 || n == 1) {
        std::vector<double> ts;
        for (const auto& s : timed.decode_steps)
          if (s.rows == 1) ts.push_back(s.seconds);
        if (ts.empty()) continue;
        std::sort(ts.begin(), ts.end());
        BenchLine l;
        l.name = "decode/ctx " + tokens_name(L);
        l.shape = "1 seq at " + std::to_string(L) + "..+" + std::to_string(o.gen) + " positions";
        l.time.median_s = ts[ts.size() / 2];
        l.time.min_s = ts.front();
        l.time.max_s = ts.back();
        l.time.repeats = int(ts.size());
        l.flops = fm.decode(L + o.gen / 2);
        l.peak_is_bandwidth = false;
        l.peak_name = peak_name;
        l.peak = peak;
        decode_tps[L] = 1.0 / l.time.median_s;
        char note[128];
        std::snprintf(note, sizeof note, "%.2f tok/s", decode_tps[L]);
        l.note = note;
        if (pass == 1) {
          int differ = 0;
          for (const auto& [k, toks] : alone) differ += in_job.at(k) != toks;
          l.note += "; alone vs in the job: " + std::to_string(differ) + " of " +
                    std::to_string(docs) + " documents' tokens differ";
        }
        if (decode_tps.size() > 1) {
          const double base = decode_tps.begin()->second;
          char r[96];
          std::snprintf(r, sizeof r, "; %.3fx of ctx %s", decode_tps[L] / base,
                        tokens_name(decode_tps.begin()->first).c_str());
          l.note += r;
        }
        rep.add(l);
      }
    }
  }
  if (!o.json.empty()) rep.write_json(o.json);
  return 0;
}

std::function<int()> setup(CLI::App& app) {
  auto o = std::make_shared<Options>();
  app.add_option("-m,--model", o->model_dir, "model directory")->required();
  app.add_option("--doc-tokens", o->doc_tokens, "document lengths (tokens)")->capture_default_str();
  app.add_option("--docs", o->docs, "documents per length (0: 4 up to 8K tokens, 1 above)")
      ->capture_default_str();
  app.add_option("--gen", o->gen, "tokens generated per document")->capture_default_str();
  app.add_option("--slots", o->slots, "sequences in flight")->capture_default_str();
  app.add_option("--prefill-chunk", o->prefill_chunk, "prompt tokens per sequence per step")
      ->capture_default_str();
  add_engine_options(app, o->engine_opts);
  app.add_option("--json", o->json, "write the lines as JSON");
  return [o] {
    if (o->gen < 2) throw Error("--gen: expected at least 2 (decode steps need a sampled token)");
    if (o->slots < 1 || o->prefill_chunk < 1 || o->docs < 0)
      throw Error("--slots and --prefill-chunk must be >= 1, --docs >= 0");
    for (int64_t L : o->doc_tokens)
      if (L < 1) throw Error("--doc-tokens: expected positive lengths");
    check_json_output(o->json);
    return run(*o);
  };
}

STRATA_BENCH("batch",
             "strata batch's path: documents/s and tokens/s with continuous batching, decode at "
             "long context against 4K, FLOPs against a bf16 peak measured in the same run",
             setup);

}  // namespace
}  // namespace strata::tools
