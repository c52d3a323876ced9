// ExpertStore: the residency of every routed expert (layer, expert) — on disk, being read, in the
// host cache (a GPU tier is reserved in the enum; there is no GPU expert cache yet) — and the host
// expert cache itself: one arena of --host-mem bytes carved at start-up into equal slots (one
// expert each, its 4 KiB-aligned spans back to back), filled by the ExpertReader.
//
// Protocol for one MoE step of a layer (the engine's executor does this):
//   require(layer, experts)   claims the experts the step needs: misses are read at demand
//                             priority (ahead of every prediction; a queued prediction for one of
//                             them is promoted), and claimed experts are never evicted;
//   acquire(layer, e)         waits until e is in host memory, returns a handle (the claim becomes
//                             the handle); throws strata::Error naming file and offset if the read
//                             failed — a half-read expert is never handed out — or if it did
//                             not complete within demand_timeout_s (a stalled disk);
//   handle destroyed          the expert becomes evictable again.
// A consumer must acquire in the order it required and release before acquiring more experts
// than slots() (demand reads wait, first come first served, for a slot to free).
// prefetch(layer, predictions) queues reads for predicted misses in the given order (highest
// predicted weight first) at prefetch priority; it is admitted only into a free slot or in place of
// a colder unclaimed expert (eviction score: frequency with exponential decay, i.e. frequency and
// recency together), so a prediction never evicts what the current step needs.
// The budget is never exceeded: slots() · slot_bytes() ≤ host_budget_bytes, and the bytes of
// experts resident or being read are tracked (telemetry host_peak_bytes).
// Not here: predicting experts (offload/prefetcher.h), computing them (engine executors).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "offload/host_memory.h"
#include "offload/telemetry.h"
#include "storage/checkpoint.h"
#include "storage/expert_reader.h"

namespace strata::offload {

// The experts a store serves: the files and, per (layer, expert), the byte spans of its tensors.
struct ExpertLayout {
  std::vector<std::filesystem::path> files;
  int num_layers = 0, num_experts = 0;
  std::vector<std::vector<FileSpan>> spans;  // [layer · num_experts + e]; empty: no such expert

  static ExpertLayout from_checkpoint(const Checkpoint& ck);
  bool has(int layer, int e) const;
  const std::vector<FileSpan>& at(int layer, int e) const;
  uint64_t expert_count() const;        // experts with spans
  uint64_t total_expert_bytes() const;  // sum of their span bytes
  // Bytes of a host cache that holds every expert: expert_count() slots of the largest expert's
  // aligned bytes (what "--host-mem 100%" means).
  uint64_t cache_bytes_all() const;
  // Bytes one expert takes in a slot: its spans rounded out to 4 KiB, back to back.
  static uint64_t aligned_bytes(const std::vector<FileSpan>& spans);
};

enum class Residency : uint8_t { disk, loading, host, gpu };
const char* residency_name(Residency r);

struct StoreConfig {
  uint64_t host_budget_bytes = 0;
  ReaderConfig io;
  int gpu = 0;                      // the GPU whose NUMA node holds the cache (-1: none)
  double half_life_steps = 64;      // frequency decay half-life, in require() calls
  bool poison_freed_slots = false;  // 0xFF over evicted / failed slots (tests: STYLE §3)
  // acquire() gives up on a read that has not completed after this many seconds (0: waits
  // forever): a stalled disk becomes an error naming the expert and file instead of a hang.
  double demand_timeout_s = 0;
};

class ExpertStore;

// An expert held in host memory: never evicted while the handle lives. Move-only.
class ExpertHandle {
 public:
  ExpertHandle() = default;
  ExpertHandle(ExpertHandle&& o) noexcept { *this = std::move(o); }
  ExpertHandle& operator=(ExpertHandle&& o) noexcept;
  ~ExpertHandle() { release(); }
  explicit operator bool() const { return store_ != nullptr; }
  int layer() const { return layer_; }
  int expert() const { return expert_; }
  // The cached copy of the byte at (file, offset), which must lie in one of the expert's spans.
  const uint8_t* at(int file, uint64_t offset) const;
  const uint8_t* slot() const { return slot_; }
  void release();

 private:
  friend class ExpertStore;
  ExpertStore* store_ = nullptr;
  int layer_ = -1, expert_ = -1;
  const uint8_t* slot_ = nullptr;
};

class ExpertStore {
 public:
  // Allocates the whole cache (budget once). Throws strata::Error when the budget holds no expert.
  ExpertStore(ExpertLayout layout, const StoreConfig& config);
  ~ExpertStore();
  ExpertStore(const ExpertStore&) = delete;
  ExpertStore& operator=(const ExpertStore&) = delete;

  // Start-up lines: budget, slots, share of the model's experts, placement, I/O backend, notes.
  std::vector<std::string> describe() const;

  // `layer_width`: how many experts this layer's step needs in all when `experts` is a part of
  // them (0: experts.size()). A step whose layers need more experts than the cache holds
  // (layer_width × MoE layers > slots(): a wide decode batch, a prefill chunk) is a scan: the
  // experts it reads enter the cache as streaming — on their first use they become the first to
  // be evicted, newest first — so the experts cached before the scan stay, and the next scan
  // finds them (an LRU would evict each before its next use). Used again while cached, a
  // streaming expert is kept like any other.
  void require(int layer, std::span<const int> experts, int layer_width = 0);
  ExpertHandle acquire(int layer, int e);
  // Drops a claim of require() without acquiring (e.g. the step failed part-way).
  void cancel(int layer, int e);
  // Predictions for `layer`, highest weight first; weight in (0, 1] (the router's score).
  void prefetch(int layer, std::span<const std::pair<int, float>> predictions);
  // Start-up only (before any require): reads experts into the free slots in (layer, expert)
  // order until the cache is full or every expert is resident, and waits for the reads.
  // progress(bytes done, bytes to read) is called from this thread about every 0.25 s and once at
  // the end. These reads are not demand or prefetch traffic: the telemetry counts them apart
  // (fill_bytes, fill_s). Throws strata::Error naming the expert and file of a failed read.
  // Returns the number of experts read.
  uint64_t fill(const std::function<void(uint64_t, uint64_t)>& progress = nullptr);

  Residency residency(int layer, int e) const;
  // Every expert of the layout is resident in the host cache (after a fill() that held them all):
  // nothing can miss, so nothing is read, evicted or worth predicting from then on.
  bool all_resident() const;
  uint64_t slots() const { return nslots_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  bool pinned() const;               // the cache is page-locked for DMA (HostArena::pinned)
  uint64_t host_used_bytes() const;  // experts resident or being read, now
  const ExpertLayout& layout() const { return layout_; }
  TierTelemetry telemetry() const;
  ExpertReader& reader() { return *reader_; }

 private:
  friend class ExpertHandle;
  enum class State : uint8_t { disk, loading, host };
  struct Entry {
    State state = State::disk;
    bool waiting = false;        // a demand read waiting for a slot
    bool from_prefetch = false;  // loaded by a prediction, not yet used
    bool filling = false;        // read by fill()
    bool in_evictable = false;
    bool stream = false;       // read (or predicted) for a scanning step, not used since
    int64_t stream_clock = 0;  // clock_ at its first use as a streaming expert
    int32_t slot = -1;
    int32_t claims = 0, handles = 0;
    double freq = 0, key = 0;
    uint64_t aligned_bytes = 0;
    std::string error;  // the last read failed (reported by the next acquire)
  };
  uint32_t index(int layer, int e) const;
  void release(int layer, int e);
  bool slot_available() const { return !free_slots_.empty() || !evictable_.empty(); }
  int32_t take_slot();  // a free slot, else evicts victim()
  // The unclaimed expert a slot is taken from. During a scan the newest streaming one, unless
  // another has gone stale; otherwise the coldest by weight(). Requires !evictable_.empty().
  std::set<std::pair<double, uint32_t>>::iterator victim();
  // An evictable expert's key, a streaming one's as if used once at its first use.
  double weight(std::set<std::pair<double, uint32_t>>::iterator v) const;
  void free_slot(int32_t slot);
  void start_read(uint32_t i, ReadPriority prio);
  void on_read_done(uint32_t i, ReadResult&& r);
  void make_evictable(uint32_t i);
  // A streaming expert's key becomes an ordinary one: used once, at its first use.
  void unstream(Entry& en);
  void serve_waiting();
  double key_of(double freq) const;
  void touch(Entry& en);

  ExpertLayout layout_;
  StoreConfig config_;
  uint64_t slot_bytes_ = 0, nslots_ = 0;
  std::vector<int> file_index_;  // layout file → reader file
  std::unique_ptr<HostArena> arena_;

  mutable std::mutex mu_;
  std::condition_variable ready_cv_;
  std::vector<Entry> entries_;
  std::set<std::pair<double, uint32_t>> evictable_;  // (key, entry): coldest first
  std::vector<int32_t> free_slots_;
  std::deque<uint32_t> waiting_;
  int64_t clock_ = 0;
  // Streaming experts' keys: below every other key (kStreamKeyCeiling − n for the n-th), so they
  // go first, the newest first.
  static constexpr double kStreamKeyCeiling = -1e15;
  static constexpr double kStaleHalfLives = 4;
  static constexpr double kAdmitMarginHalfLives = 1;
  uint64_t stream_seq_ = 0;
  bool scan_ = false;        // the last require() was a scanning step's
  uint64_t moe_layers_ = 0;  // layers of the layout with routed experts
  uint64_t used_bytes_ = 0;
  TierTelemetry tel_;
  uint64_t fill_pending_ = 0;  // fill() reads not completed
  double fill_busy_s_ = 0;     // the reader's busy time during fill(), not counted as reads
  std::vector<std::string> notes_;

  std::unique_ptr<ExpertReader> reader_;  // last: destroyed (drained) first
};

}  // namespace strata::offload
