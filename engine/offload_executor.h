// Routed experts served from the tiered expert store (issue 4, item 4): an ExpertExecutor that
// wraps the numerics executor (exact or contract) and hands it the expert bytes from the host
// expert cache instead of the mmapped checkpoint — the same bytes, so the same logits — plus the
// OffloadRuntime that builds the store and the router-lookahead prefetcher for a Model from the
// command line options (--host-mem, --io, --prefetch-depth, --stats-json) and installs them into
// SessionOptions through its two hooks (wrap_executor, on_moe_input).
// Not here: residency, reads and eviction (offload/expert_store.h), prediction
// (offload/prefetcher.h), expert math (engine/expert_executor.h).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/expert_executor.h"
#include "engine/session.h"
#include "nlohmann/json.hpp"
#include "offload/expert_store.h"
#include "offload/prefetcher.h"
#include "storage/expert_reader.h"

namespace strata::engine {

struct OffloadOptions {
  std::string host_mem;  // empty: experts stay in the mmapped checkpoint (no store)
  std::string io = "auto";
  int queue_depth = 32;
  int prefetch_depth = 2;    // 0: no prefetch
  double io_timeout_s = 60;  // a demand read not done after this long is an error (0: no limit)
  std::string stats_json;
  bool host_fill = false;  // read every expert the host cache holds at start (progress on stderr)
  FaultConfig faults;      // tests only: injected read faults (no command-line flag)
  bool enabled() const { return !host_mem.empty(); }
};

// Checks the options against the model's config before any weight is loaded: --io, --io-depth
// (1..4096), --prefetch-depth (0..layers), --io-timeout, and a --host-mem that parses, holds at
// least one routed expert and is no larger than this machine's memory. Throws strata::Error
// naming the flag.
void check_offload_options(const OffloadOptions& o, const ModelConfig& c);

// "64GiB", "512MiB", "1.5GB", "123456" (bytes), or "30%" of `expert_bytes` (the model's routed
// expert bytes). Throws strata::Error naming --host-mem.
uint64_t parse_host_mem(const std::string& s, uint64_t expert_bytes);
// The same syntax for any size flag; percent_of = 0 refuses "N%". Throws naming `flag`.
uint64_t parse_size(const std::string& s, uint64_t percent_of, const char* flag);

// An expert held in host memory for a consumer outside the executor's run(): its weights with
// the views pointing at the held bytes, valid (and the expert never evicted) while `handle` lives.
struct HeldExpert {
  ExpertWeights weights;
  offload::ExpertHandle handle;
};

// The store's host cache as a source of expert bytes (ExpertExecutor::host_source): the GPU
// backend stages prefill experts from it — by DMA straight from the cache when it is page-locked —
// so staged experts come through the tiers (host cache, disk reads) like the CPU's, instead of
// from the checkpoint's pages. The store's protocol holds: require, then acquire in that order;
// at most slots() experts held at once; cancel what was required but will not be acquired.
class HostExpertSource {
 public:
  virtual ~HostExpertSource() = default;
  virtual uint64_t slots() const = 0;
  virtual bool pinned() const = 0;  // held bytes are page-locked (cudaHostRegister)
  // `layer_width`: the experts this layer's step needs in all (offload::ExpertStore::require).
  virtual void require(int layer, std::span<const int> experts, int layer_width) = 0;
  // `orig`: the expert's weights as the checkpoint maps them (shapes, formats).
  virtual HeldExpert acquire(int layer, int e, const ExpertWeights& orig) = 0;
  virtual void cancel(int layer, int e) = 0;
};

class StoreExpertExecutor final : public ExpertExecutor, public HostExpertSource {
 public:
  StoreExpertExecutor(std::unique_ptr<ExpertExecutor> inner, const Checkpoint& ck,
                      offload::ExpertStore& store, offload::Prefetcher* prefetcher);
  const char* name() const override { return name_.c_str(); }
  void run(const ExpertLayer& layer, std::span<const ExpertTask> tasks, const float* x, float* y,
           Precision p) override;
  HostExpertSource* host_source() override { return this; }
  void warm() override { inner_->warm(); }
  // "store_s" (claiming and releasing the layer's experts), then the inner executor's values.
  std::vector<std::pair<std::string, double>> telemetry_values() const override;
  void reset_telemetry() override {
    store_s_ = 0;
    inner_->reset_telemetry();
  }
  uint64_t slots() const override { return store_.slots(); }
  bool pinned() const override { return store_.pinned(); }
  void require(int layer, std::span<const int> experts, int layer_width) override;
  HeldExpert acquire(int layer, int e, const ExpertWeights& orig) override;
  void cancel(int layer, int e) override;

 private:
  std::unique_ptr<ExpertExecutor> inner_;
  double store_s_ = 0;  // run()'s time outside the inner executor since reset_telemetry()
  const Checkpoint& ck_;
  offload::ExpertStore& store_;
  offload::Prefetcher* prefetcher_;
  std::string name_;
  std::vector<std::unique_ptr<MoeWeights>> shadow_;  // [layer]: views patched to cache slots
};

class OffloadRuntime {
 public:
  // Inactive (install() does nothing) unless o.enabled().
  OffloadRuntime(const Model& model, const OffloadOptions& o);
  ~OffloadRuntime();
  bool active() const { return store_ != nullptr; }
  void install(SessionOptions& so);
  std::vector<std::string> describe() const;  // start-up lines (budget, placement, backend)
  offload::TierTelemetry telemetry() const;
  // Prints the tier telemetry line to stderr (when active) and writes --stats-json when given,
  // active or not: {"experts": tier telemetry (when active)} plus the keys of `extra` (the run's
  // rates and the backend's telemetry, from the command).
  void finish(const nlohmann::json& extra = nlohmann::json::object()) const;

 private:
  void fill_host_cache();  // --host-fill, with a progress line on stderr

  const Model& model_;
  OffloadOptions opt_;
  std::unique_ptr<offload::ExpertStore> store_;
  std::unique_ptr<offload::Prefetcher> prefetcher_;
  bool all_cached_ = false;  // filled with every expert: no prefetcher
};

}  // namespace strata::engine
