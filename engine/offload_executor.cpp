// StoreExpertExecutor and OffloadRuntime: the engine side of the tiered expert store.
#include "engine/offload_executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>

#include <unistd.h>

#include "storage/error.h"
#include "storage/files.h"

namespace strata::engine {

uint64_t parse_host_mem(const std::string& s, uint64_t expert_bytes) {
  return parse_size(s, expert_bytes, "--host-mem");
}

uint64_t parse_size(const std::string& s, uint64_t percent_of, const char* flag) {
  auto bad = [&]() {
    return Error(std::string(flag) + " '" + s +
                 "': expected bytes with an optional unit (e.g. 512MiB, 64GiB, 1.5GB)" +
                 (percent_of ? " or a share of the model's routed expert bytes (e.g. 30%)" : ""));
  };
  const uint64_t expert_bytes = percent_of;
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (...) {
    throw bad();
  }
  std::string unit = s.substr(used);
  if (!(v > 0) || !std::isfinite(v)) throw bad();
  double mult = 1;
  // (Below 2^63 before converting: a larger double is undefined as an integer.)
  if (unit == "%") {
    if (!expert_bytes || v > 1e6) throw bad();
    return uint64_t(double(expert_bytes) * v / 100.0);
  }
  if (unit.empty() || unit == "B")
    mult = 1;
  else if (unit == "KiB" || unit == "K")
    mult = 1024.0;
  else if (unit == "MiB" || unit == "M")
    mult = 1048576.0;
  else if (unit == "GiB" || unit == "G")
    mult = 1073741824.0;
  else if (unit == "TiB" || unit == "T")
    mult = 1099511627776.0;
  else if (unit == "KB")
    mult = 1e3;
  else if (unit == "MB")
    mult = 1e6;
  else if (unit == "GB")
    mult = 1e9;
  else if (unit == "TB")
    mult = 1e12;
  else
    throw bad();
  if (v * mult >= 9.2e18) throw bad();
  return uint64_t(v * mult);
}

void check_offload_options(const OffloadOptions& o, const ModelConfig& c) {
  parse_io_backend(o.io);
  if (o.queue_depth < 1 || o.queue_depth > 4096)
    throw Error("--io-depth " + std::to_string(o.queue_depth) +
                ": expected 1..4096 expert reads in flight");
  if (o.prefetch_depth < 0 || o.prefetch_depth > c.num_layers)
    throw Error("--prefetch-depth " + std::to_string(o.prefetch_depth) + ": expected 0.." +
                std::to_string(c.num_layers) + " layers (the model's depth)");
  if (!(o.io_timeout_s >= 0) || !std::isfinite(o.io_timeout_s))
    throw Error("--io-timeout: expected seconds >= 0 (0 = no limit)");
  if (o.host_fill && !o.enabled())
    throw Error("--host-fill: fills the host expert cache, which only --host-mem creates");
  if (!o.enabled()) return;
  const ModelCosts k = compute_costs(c);
  const uint64_t expert_total = k.bytes_per_routed_expert * k.num_routed_experts_total;
  if (expert_total == 0) throw Error("--host-mem: the model has no routed experts to cache");
  const uint64_t budget = parse_host_mem(o.host_mem, expert_total);
  // One slot holds one expert: its bytes plus the 4 KiB rounding of each of its spans.
  if (budget < k.bytes_per_routed_expert)
    throw Error("--host-mem " + o.host_mem + " = " + std::to_string(budget) +
                " bytes holds no routed expert: one takes " +
                std::to_string(k.bytes_per_routed_expert) + " bytes (" + c.source + ")");
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  const uint64_t ram = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
  // The cache is min(budget, all experts): only that much is allocated.
  if (ram > 0 && std::min(budget, expert_total) > ram)
    throw Error("--host-mem " + o.host_mem + ": " + std::to_string(std::min(budget, expert_total)) +
                " bytes of cache, more than this machine's " + std::to_string(ram) +
                " bytes of memory");
}

StoreExpertExecutor::StoreExpertExecutor(std::unique_ptr<ExpertExecutor> inner,
                                         const Checkpoint& ck, offload::ExpertStore& store,
                                         offload::Prefetcher* prefetcher)
    : inner_(std::move(inner)), ck_(ck), store_(store), prefetcher_(prefetcher) {
  name_ = std::string(inner_->name()) + "+store";
}

namespace {
// The view `orig` with its bytes taken from the cached copy of tensor `t` (and its scales).
WeightView patch(WeightView orig, const ExpertTensors::Proj& t, const offload::ExpertHandle& h) {
  orig.data = h.at(t.weight->file, t.weight->offset);
  if (t.scale) orig.scale = h.at(t.scale->file, t.scale->offset);
  return orig;
}
ExpertWeights patched(ExpertWeights w, const ExpertTensors& et, const offload::ExpertHandle& h) {
  w.w1 = patch(w.w1, et.w1, h);
  w.w3 = patch(w.w3, et.w3, h);
  w.w2 = patch(w.w2, et.w2, h);
  return w;
}
}  // namespace

void StoreExpertExecutor::require(int layer, std::span<const int> experts, int layer_width) {
  store_.require(layer, experts, layer_width);
}

HeldExpert StoreExpertExecutor::acquire(int layer, int e, const ExpertWeights& orig) {
  HeldExpert h;
  h.handle = store_.acquire(layer, e);
  h.weights = patched(orig, ck_.expert(layer, e), h.handle);
  return h;
}

void StoreExpertExecutor::cancel(int layer, int e) {
  store_.cancel(layer, e);
}

std::vector<std::pair<std::string, double>> StoreExpertExecutor::telemetry_values() const {
  std::vector<std::pair<std::string, double>> v = {{"store_s", store_s_}};
  for (auto& kv : inner_->telemetry_values()) v.push_back(kv);
  return v;
}

void StoreExpertExecutor::run(const ExpertLayer& layer, std::span<const ExpertTask> tasks,
                              const float* x, float* y, Precision p) {
  const auto t0 = std::chrono::steady_clock::now();
  double inner_s = 0;
  const int l = layer.layer;
  std::vector<int> ids;
  ids.reserve(tasks.size());
  for (const ExpertTask& t : tasks) ids.push_back(t.expert);
  if (prefetcher_) prefetcher_->on_routing(l, ids);
  if (shadow_.size() <= size_t(l)) shadow_.resize(size_t(l) + 1);
  if (!shadow_[size_t(l)]) shadow_[size_t(l)] = std::make_unique<MoeWeights>(*layer.weights);
  MoeWeights& shadow = *shadow_[size_t(l)];
  ExpertLayer el = layer;
  el.weights = &shadow;
  // At most slots() experts are claimed at once, so a step wider than the cache still runs.
  const size_t chunk = size_t(std::max<uint64_t>(1, store_.slots()));
  for (size_t i0 = 0; i0 < tasks.size(); i0 += chunk) {
    const size_t n = std::min(chunk, tasks.size() - i0);
    std::span<const int> need(ids.data() + i0, n);
    store_.require(l, need, int(ids.size()));
    std::vector<offload::ExpertHandle> held;
    held.reserve(n);
    size_t k = 0;
    try {
      for (; k < n; k++) {
        const int e = need[k];
        held.push_back(store_.acquire(l, e));
        shadow.experts[size_t(e)] =
            patched(layer.weights->experts[size_t(e)], ck_.expert(l, e), held.back());
      }
    } catch (...) {
      for (size_t j = k + 1; j < n; j++) store_.cancel(l, need[j]);
      for (int e : need) shadow.experts[size_t(e)] = layer.weights->experts[size_t(e)];
      throw;
    }
    const auto r0 = std::chrono::steady_clock::now();
    inner_->run(el, tasks.subspan(i0, n), x, y, p);
    inner_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count();
    // Back to the checkpoint's views: no view outlives its handle.
    for (int e : need) shadow.experts[size_t(e)] = layer.weights->experts[size_t(e)];
  }
  store_s_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - inner_s;
}

OffloadRuntime::OffloadRuntime(const Model& model, const OffloadOptions& o)
    : model_(model), opt_(o) {
  check_offload_options(o, model.config());
  if (!o.enabled()) return;
  if (model.experts_quantized())  // the store's files hold the bf16 experts, not the MXFP4 ones
    throw Error(
        "--host-mem with --experts-quantize: the disk tier reads the checkpoint's bf16 experts; "
        "quantized experts all stay in host memory (drop --host-mem)");
  offload::ExpertLayout layout = offload::ExpertLayout::from_checkpoint(model.checkpoint());
  offload::StoreConfig sc;
  // "N%" is a share of the slots that would hold every expert (so 100% holds them all, with each
  // expert's spans rounded out to 4 KiB).
  sc.host_budget_bytes = parse_host_mem(o.host_mem, layout.cache_bytes_all());
  sc.io.backend = parse_io_backend(o.io);
  sc.io.queue_depth = o.queue_depth;
  sc.io.faults = o.faults;
  sc.demand_timeout_s = o.io_timeout_s;
  sc.gpu = 0;
  store_ = std::make_unique<offload::ExpertStore>(std::move(layout), sc);
  if (o.host_fill) fill_host_cache();
  // Router lookahead only where an expert can miss: with every expert in the host cache it would
  // cost a host copy of each MoE layer's input and a thread computing routers beside the CPU
  // experts, for no read.
  all_cached_ = o.host_fill && store_->all_resident();
  if (o.prefetch_depth > 0 && !all_cached_) {
    const ModelConfig& c = model.config();
    std::vector<offload::LayerRouter> routers(size_t(c.num_layers));
    for (int l = 0; l < c.num_layers; l++) {
      const auto& moe = model.weights().layers[size_t(l)].moe;
      if (moe)
        routers[size_t(l)] = {&moe->router,
                              moe->router_bias.empty() ? nullptr : moe->router_bias.data()};
    }
    offload::PrefetcherConfig pc;
    pc.depth = o.prefetch_depth;
    pc.top_k = c.moe.top_k;
    prefetcher_ = std::make_unique<offload::Prefetcher>(std::move(routers), c.moe.num_experts, pc,
                                                        store_.get());
  }
}

void OffloadRuntime::fill_host_cache() {
  const bool tty = ::isatty(STDERR_FILENO);
  const auto t0 = std::chrono::steady_clock::now();
  double last = 0;
  bool printed = false;
  auto secs = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const uint64_t n = store_->fill([&](uint64_t done, uint64_t total) {
    const double s = secs();
    if (done >= total || s < 1.0 || s - last < (tty ? 0.25 : 2.0)) return;
    last = s;
    printed = true;
    const double rate = double(done) / std::max(s, 1e-9);
    std::fprintf(stderr,
                 tty ? "\r\033[Kstrata: filling the host expert cache: %.2f of %.2f GB, %.2f GB/s, "
                       "ETA %.0f s"
                     : "strata: filling the host expert cache: %.2f of %.2f GB, %.2f GB/s, ETA "
                       "%.0f s\n",
                 double(done) / 1e9, double(total) / 1e9, rate / 1e9,
                 rate > 0 ? double(total - done) / rate : 0.0);
  });
  if (printed && tty) std::fprintf(stderr, "\r\033[K");
  const offload::TierTelemetry t = store_->telemetry();
  std::fprintf(stderr,
               "strata: host expert cache filled: %llu experts, %.2f GB in %.1f s (%.2f GB/s)\n",
               (unsigned long long)n, double(t.fill_bytes) / 1e9, t.fill_s,
               t.fill_s > 0 ? double(t.fill_bytes) / t.fill_s / 1e9 : 0.0);
}

OffloadRuntime::~OffloadRuntime() {
  prefetcher_.reset();  // stops predicting before the store goes
}

void OffloadRuntime::install(SessionOptions& so) {
  if (!active()) return;
  offload::ExpertStore* store = store_.get();
  offload::Prefetcher* pf = prefetcher_.get();
  const Checkpoint* ck = &model_.checkpoint();
  so.wrap_executor = [store, pf, ck](std::unique_ptr<ExpertExecutor> inner) {
    return std::unique_ptr<ExpertExecutor>(
        std::make_unique<StoreExpertExecutor>(std::move(inner), *ck, *store, pf));
  };
  if (pf)
    so.on_moe_input = [pf](int layer, const float* x, int64_t T) {
      pf->on_layer_input(layer, x, T);
    };
}

std::vector<std::string> OffloadRuntime::describe() const {
  if (!active()) return {};
  auto d = store_->describe();
  d.push_back(prefetcher_ ? "prefetch: router lookahead " + std::to_string(opt_.prefetch_depth) +
                                " layers, async"
              : all_cached_ ? "prefetch: off (every expert in the host cache)"
                            : "prefetch: off");
  return d;
}

offload::TierTelemetry OffloadRuntime::telemetry() const {
  if (!active()) return {};
  if (prefetcher_) prefetcher_->flush();
  offload::TierTelemetry t = store_->telemetry();
  if (prefetcher_) prefetcher_->fill(t);
  return t;
}

void OffloadRuntime::finish(const nlohmann::json& extra) const {
  nlohmann::json j = extra.is_object() ? extra : nlohmann::json::object();
  if (active()) {
    offload::TierTelemetry t = telemetry();
    std::fprintf(stderr, "strata: %s\n", t.line().c_str());
    j["experts"] = t.json();
  }
  if (!opt_.stats_json.empty())
    write_file_atomic(opt_.stats_json, j.dump(2) + "\n", "--stats-json " + opt_.stats_json);
}

}  // namespace strata::engine
