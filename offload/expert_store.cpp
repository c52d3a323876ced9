// ExpertStore: residency, host cache slots, admission and eviction, demand/prefetch reads.
#include "offload/expert_store.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "storage/error.h"

namespace strata::offload {

using Clock = std::chrono::steady_clock;

// ---- ExpertLayout -------------------------------------------------------------------------------

ExpertLayout ExpertLayout::from_checkpoint(const Checkpoint& ck) {
  ExpertLayout L;
  for (int f = 0; f < ck.num_files(); f++) L.files.push_back(ck.file_path(f));
  L.num_layers = ck.config().num_layers;
  L.num_experts = ck.config().moe.num_experts;
  L.spans.resize(size_t(L.num_layers) * size_t(L.num_experts));
  for (int l = 0; l < L.num_layers; l++) {
    if (!ck.has_experts(l)) continue;
    for (int e = 0; e < L.num_experts; e++) {
      auto s = ck.expert_spans(l, e);
      L.spans[size_t(l) * size_t(L.num_experts) + size_t(e)].assign(s.begin(), s.end());
    }
  }
  return L;
}

bool ExpertLayout::has(int layer, int e) const {
  if (layer < 0 || layer >= num_layers || e < 0 || e >= num_experts) return false;
  return !spans[size_t(layer) * size_t(num_experts) + size_t(e)].empty();
}

const std::vector<FileSpan>& ExpertLayout::at(int layer, int e) const {
  STRATA_ASSERT(has(layer, e));
  return spans[size_t(layer) * size_t(num_experts) + size_t(e)];
}

uint64_t ExpertLayout::expert_count() const {
  uint64_t n = 0;
  for (auto& s : spans) n += !s.empty();
  return n;
}

uint64_t ExpertLayout::cache_bytes_all() const {
  uint64_t slot = 0;
  for (auto& s : spans)
    if (!s.empty()) slot = std::max(slot, aligned_bytes(s));
  return slot * expert_count();
}

uint64_t ExpertLayout::total_expert_bytes() const {
  uint64_t n = 0;
  for (auto& s : spans)
    for (auto& sp : s) n += sp.nbytes;
  return n;
}

uint64_t ExpertLayout::aligned_bytes(const std::vector<FileSpan>& spans) {
  uint64_t n = 0;
  for (auto& sp : spans) n += align_up(sp.offset + sp.nbytes) - align_down(sp.offset);
  return n;
}

const char* residency_name(Residency r) {
  switch (r) {
    case Residency::disk:
      return "disk";
    case Residency::loading:
      return "loading";
    case Residency::host:
      return "host";
    case Residency::gpu:
      return "gpu";
  }
  return "?";
}

// ---- ExpertHandle -------------------------------------------------------------------------------

ExpertHandle& ExpertHandle::operator=(ExpertHandle&& o) noexcept {
  if (this != &o) {
    release();
    store_ = o.store_;
    layer_ = o.layer_;
    expert_ = o.expert_;
    slot_ = o.slot_;
    o.store_ = nullptr;
    o.slot_ = nullptr;
  }
  return *this;
}

void ExpertHandle::release() {
  if (!store_) return;
  store_->release(layer_, expert_);
  store_ = nullptr;
  slot_ = nullptr;
}

const uint8_t* ExpertHandle::at(int file, uint64_t offset) const {
  STRATA_ASSERT(store_);
  uint64_t pos = 0;
  for (const FileSpan& sp : store_->layout_.at(layer_, expert_)) {
    uint64_t lo = align_down(sp.offset);
    if (sp.file == file && offset >= sp.offset && offset < sp.offset + sp.nbytes)
      return slot_ + pos + (offset - lo);
    pos += align_up(sp.offset + sp.nbytes) - lo;
  }
  STRATA_ASSERT(!"ExpertHandle::at: offset outside the expert's spans");
  return nullptr;
}

// ---- ExpertStore --------------------------------------------------------------------------------

ExpertStore::ExpertStore(ExpertLayout layout, const StoreConfig& config)
    : layout_(std::move(layout)), config_(config) {
  const uint64_t n_experts = layout_.expert_count();
  if (n_experts == 0) throw Error("expert store: the model has no routed experts");
  for (auto& s : layout_.spans)
    if (!s.empty()) slot_bytes_ = std::max(slot_bytes_, ExpertLayout::aligned_bytes(s));
  nslots_ = std::min<uint64_t>(config_.host_budget_bytes / slot_bytes_, n_experts);
  if (nslots_ == 0)
    throw Error("--host-mem " + std::to_string(config_.host_budget_bytes) +
                " bytes holds no expert: one expert takes " + std::to_string(slot_bytes_) +
                " bytes (4 KiB-aligned spans)");
  STRATA_ASSERT(nslots_ * slot_bytes_ <= config_.host_budget_bytes);

  HostPlacement where = choose_host_placement(config_.gpu);
  arena_ = std::make_unique<HostArena>(nslots_ * slot_bytes_, where);
  entries_.resize(layout_.spans.size());
  for (size_t i = 0; i < entries_.size(); i++)
    if (!layout_.spans[i].empty())
      entries_[i].aligned_bytes = ExpertLayout::aligned_bytes(layout_.spans[i]);
  for (int64_t s = int64_t(nslots_) - 1; s >= 0; s--) free_slots_.push_back(int32_t(s));
  for (int l = 0; l < layout_.num_layers; l++)
    for (int e = 0; e < layout_.num_experts; e++)
      if (layout_.has(l, e)) {
        moe_layers_++;
        break;
      }

  tel_.host_budget_bytes = config_.host_budget_bytes;
  tel_.slots = nslots_;
  reader_ = ExpertReader::create(config_.io);
  tel_.io_backend = reader_->backend_name();
  for (auto& f : layout_.files) file_index_.push_back(reader_->add_file(f));
  reader_->register_buffer(arena_->data(), arena_->bytes());

  char buf[512];
  std::snprintf(buf, sizeof buf,
                "host expert cache: budget %.2f GiB = %llu slots of %.2f MiB, %.1f%% of the "
                "model's %llu routed experts (%.2f GiB)",
                double(config_.host_budget_bytes) / 1073741824.0, (unsigned long long)nslots_,
                double(slot_bytes_) / 1048576.0, 100.0 * double(nslots_) / double(n_experts),
                (unsigned long long)n_experts, double(layout_.total_expert_bytes()) / 1073741824.0);
  notes_.push_back(buf);
  notes_.push_back("host expert cache memory: " + arena_->describe());
  std::snprintf(buf, sizeof buf, "expert reads: %s, queue depth %d, %llu KiB blocks, %d retries",
                reader_->backend_name(), config_.io.queue_depth,
                (unsigned long long)(config_.io.block_bytes >> 10), config_.io.max_retries);
  notes_.push_back(buf);
}

ExpertStore::~ExpertStore() {
  reader_.reset();  // drains: no callback runs after this
}

std::vector<std::string> ExpertStore::describe() const {
  std::vector<std::string> d = notes_;
  for (auto& n : reader_->notes()) d.push_back(n);
  return d;
}

uint32_t ExpertStore::index(int layer, int e) const {
  if (!layout_.has(layer, e))
    throw Error("expert store: layer " + std::to_string(layer) + " has no routed expert " +
                std::to_string(e));
  return uint32_t(size_t(layer) * size_t(layout_.num_experts) + size_t(e));
}

double ExpertStore::key_of(double freq) const {
  // Decayed frequency f·2^(−(now − t)/H) compared at a common time: log2 f + t/H orders the same.
  return std::log2(std::max(freq, 1e-9)) + double(clock_) / config_.half_life_steps;
}

void ExpertStore::touch(Entry& en) {
  const bool first_of_scan = en.stream && scan_;
  en.stream = false;
  if (first_of_scan) {  // first use of an expert read for a scan: evicted newest first
    en.freq = 0;
    en.key = kStreamKeyCeiling - double(++stream_seq_);
    en.stream_clock = clock_;
    return;
  }
  // Bring the frequency to now, then count this use.
  double age = double(clock_) / config_.half_life_steps;
  double f_now = en.freq > 0 ? std::exp2(en.key - age) : 0;
  en.freq = f_now + 1;
  en.key = key_of(en.freq);
}

Residency ExpertStore::residency(int layer, int e) const {
  std::lock_guard lk(mu_);
  switch (entries_[index(layer, e)].state) {
    case State::disk:
      return Residency::disk;
    case State::loading:
      return Residency::loading;
    case State::host:
      return Residency::host;
  }
  return Residency::disk;
}

bool ExpertStore::pinned() const {
  return arena_ && arena_->pinned();
}

uint64_t ExpertStore::host_used_bytes() const {
  std::lock_guard lk(mu_);
  return used_bytes_;
}

std::set<std::pair<double, uint32_t>>::iterator ExpertStore::victim() {
  const auto kept = evictable_.lower_bound({kStreamKeyCeiling, 0});  // coldest outside the stream
  if (kept == evictable_.begin()) return kept;                       // no streaming expert
  const auto newest = evictable_.begin(), oldest = std::prev(kept);
  const double now = double(clock_) / config_.half_life_steps;
  if (!scan_) {  // one order, a streaming expert weighed as used once at its first use
    return kept == evictable_.end() || weight(oldest) <= kept->first ? oldest : kept;
  }
  // A scan: the newest streaming expert goes first, unless an expert has gone stale — one outside
  // the stream unused for kStaleHalfLives half-lives (its decayed frequency below
  // 2^-kStaleHalfLives; a prediction not used yet is weighed by its router score instead), or the
  // oldest streaming one, first used that long ago — so the kept set still follows a routing that
  // drifts while steps scan.
  if (kept != evictable_.end() && !entries_[kept->second].from_prefetch &&
      kept->first < now - kStaleHalfLives)
    return kept;
  if (weight(oldest) < now - kStaleHalfLives) return oldest;
  return newest;
}

double ExpertStore::weight(std::set<std::pair<double, uint32_t>>::iterator v) const {
  return v->first < kStreamKeyCeiling
             ? double(entries_[v->second].stream_clock) / config_.half_life_steps
             : v->first;
}

int32_t ExpertStore::take_slot() {
  if (!free_slots_.empty()) {
    int32_t s = free_slots_.back();
    free_slots_.pop_back();
    return s;
  }
  STRATA_ASSERT(!evictable_.empty());
  const auto it = victim();
  auto [key, victim] = *it;
  evictable_.erase(it);
  Entry& v = entries_[victim];
  STRATA_ASSERT(v.state == State::host && v.claims == 0 && v.handles == 0);
  v.in_evictable = false;
  if (v.from_prefetch) tel_.prefetch_wasted++;
  v.from_prefetch = false;
  v.state = State::disk;
  int32_t s = v.slot;
  v.slot = -1;
  used_bytes_ -= v.aligned_bytes;
  tel_.evictions++;
  if (config_.poison_freed_slots)
    std::memset(arena_->data() + uint64_t(s) * slot_bytes_, 0xFF, slot_bytes_);
  return s;
}

void ExpertStore::free_slot(int32_t s) {
  if (config_.poison_freed_slots)
    std::memset(arena_->data() + uint64_t(s) * slot_bytes_, 0xFF, slot_bytes_);
  free_slots_.push_back(s);
}

void ExpertStore::unstream(Entry& en) {
  if (en.key >= kStreamKeyCeiling) return;
  en.freq = 1;
  en.key = key_of(1) - double(clock_ - en.stream_clock) / config_.half_life_steps;
}

void ExpertStore::make_evictable(uint32_t i) {
  Entry& en = entries_[i];
  if (en.state == State::host && en.claims == 0 && en.handles == 0 && !en.in_evictable) {
    if (!scan_) unstream(en);  // released after the steps became narrow
    evictable_.insert({en.key, i});
    en.in_evictable = true;
  }
}

void ExpertStore::start_read(uint32_t i, ReadPriority prio) {
  Entry& en = entries_[i];
  STRATA_ASSERT(en.state == State::disk);
  en.slot = take_slot();
  en.state = State::loading;
  en.waiting = false;
  en.error.clear();
  used_bytes_ += en.aligned_bytes;
  STRATA_ASSERT(used_bytes_ <= config_.host_budget_bytes);
  tel_.host_peak_bytes = std::max(tel_.host_peak_bytes, used_bytes_);
  ReadJob job;
  job.tag = i;
  job.priority = prio;
  uint8_t* dst = arena_->data() + uint64_t(en.slot) * slot_bytes_;
  for (const FileSpan& sp : layout_.spans[i]) {
    uint64_t lo = align_down(sp.offset), hi = align_up(sp.offset + sp.nbytes);
    job.spans.push_back({file_index_[size_t(sp.file)], lo, hi - lo, dst});
    dst += hi - lo;
  }
  reader_->submit(std::move(job), [this, i](ReadResult&& r) { on_read_done(i, std::move(r)); });
}

void ExpertStore::on_read_done(uint32_t i, ReadResult&& r) {
  {
    std::lock_guard lk(mu_);
    Entry& en = entries_[i];
    STRATA_ASSERT(en.state == State::loading);
    if (en.filling) {
      tel_.fill_bytes += r.bytes_read;
      en.filling = false;
      fill_pending_--;
    } else {
      tel_.bytes_read += r.bytes_read;
    }
    if (en.from_prefetch) tel_.prefetch_bytes += r.bytes_read;
    if (r.ok) {
      en.state = State::host;
      make_evictable(i);
    } else {
      // The slot's bytes are not trusted: poison it, forget it; the next require reads again.
      tel_.read_errors++;
      en.state = State::disk;
      en.from_prefetch = false;
      en.error = r.error;
      used_bytes_ -= en.aligned_bytes;
      free_slot(en.slot);
      en.slot = -1;
    }
    serve_waiting();
  }
  ready_cv_.notify_all();
}

void ExpertStore::serve_waiting() {
  while (!waiting_.empty() && slot_available()) {
    uint32_t i = waiting_.front();
    waiting_.pop_front();
    if (entries_[i].waiting) start_read(i, ReadPriority::kDemand);
  }
}

void ExpertStore::require(int layer, std::span<const int> experts, int layer_width) {
  std::lock_guard lk(mu_);
  clock_++;
  // A step whose layers together need more experts than the cache holds scans it: what it reads
  // is kept only until the next read needs a slot, so the experts already cached survive the scan.
  const uint64_t width = uint64_t(std::max<int64_t>(layer_width, int64_t(experts.size())));
  const bool scan = width * moe_layers_ > nslots_;
  if (scan_ && !scan) {
    // Steps are narrow again: the streaming experts left by the scans become ordinary ones, keyed
    // as used once at their first use, and the cache is one frequency-and-recency order as before.
    std::vector<uint32_t> left;
    for (auto it = evictable_.begin(); it != evictable_.end() && it->first < kStreamKeyCeiling;)
      left.push_back(it->second), it = evictable_.erase(it);
    for (uint32_t j : left) {
      unstream(entries_[j]);
      evictable_.insert({entries_[j].key, j});
    }
  }
  scan_ = scan;
  for (int e : experts) {
    uint32_t i = index(layer, e);
    Entry& en = entries_[i];
    en.claims++;
    if (en.in_evictable) {
      evictable_.erase({en.key, i});
      en.in_evictable = false;
    }
    // Hits and misses are decided here, when the need becomes known: a read that started
    // earlier (a prediction) overlaps with compute even if acquire() later waits for it.
    if (en.state == State::host) {
      tel_.host_hits++;
      if (en.from_prefetch) tel_.prefetch_hits++;
      en.stream = en.from_prefetch && scan;  // a prediction of this scan, used once
    } else {
      tel_.disk_misses++;
      en.stream = scan;
      if (scan) tel_.stream_reads++;
      if (en.state == State::loading && en.from_prefetch) {
        tel_.late_prefetch++;
        reader_->promote(i);  // a queued prediction became a real miss
      } else if (en.state == State::disk && !en.waiting) {
        if (waiting_.empty() && slot_available()) {
          start_read(i, ReadPriority::kDemand);
        } else {
          en.waiting = true;
          waiting_.push_back(i);
        }
      }
    }
    en.from_prefetch = false;
  }
}

ExpertHandle ExpertStore::acquire(int layer, int e) {
  std::unique_lock lk(mu_);
  uint32_t i = index(layer, e);
  Entry& en = entries_[i];
  STRATA_ASSERT(en.claims > 0);  // acquire only what was required
  if (en.state != State::host) {
    auto t0 = Clock::now();
    auto ready = [&] { return en.state == State::host || !en.error.empty(); };
    bool done = true;
    if (config_.demand_timeout_s > 0)
      done = ready_cv_.wait_for(lk, std::chrono::duration<double>(config_.demand_timeout_s), ready);
    else
      ready_cv_.wait(lk, ready);
    tel_.blocked_s += std::chrono::duration<double>(Clock::now() - t0).count();
    if (!done) {
      // The read stays in flight (its slot is released when it completes); this claim ends.
      en.claims--;
      const FileSpan& sp = layout_.spans[i].front();
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.3g", config_.demand_timeout_s);
      throw Error("expert store: layer " + std::to_string(layer) + " expert " + std::to_string(e) +
                  ": the read from " + layout_.files[size_t(sp.file)].string() + " at offset " +
                  std::to_string(sp.offset) + " has not completed after " + buf +
                  " s (disk stalled or far too slow; --io-timeout sets the limit)");
    }
  }
  if (en.state != State::host) {
    en.claims--;  // the error stays for other claims of this read; a new read clears it
    std::string err = en.error;
    throw Error("expert store: layer " + std::to_string(layer) + " expert " + std::to_string(e) +
                ": " + err);
  }
  en.claims--;
  en.handles++;
  touch(en);
  ExpertHandle h;
  h.store_ = this;
  h.layer_ = layer;
  h.expert_ = e;
  h.slot_ = arena_->data() + uint64_t(en.slot) * slot_bytes_;
  return h;
}

void ExpertStore::cancel(int layer, int e) {
  std::lock_guard lk(mu_);
  uint32_t i = index(layer, e);
  Entry& en = entries_[i];
  STRATA_ASSERT(en.claims > 0);
  en.claims--;
  if (en.claims == 0 && en.handles == 0 && en.waiting) {
    en.waiting = false;  // serve_waiting skips it
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), i));
  }
  make_evictable(i);
  serve_waiting();
}

void ExpertStore::release(int layer, int e) {
  {
    std::lock_guard lk(mu_);
    uint32_t i = index(layer, e);
    Entry& en = entries_[i];
    STRATA_ASSERT(en.handles > 0);
    en.handles--;
    make_evictable(i);
    serve_waiting();
  }
}

void ExpertStore::prefetch(int layer, std::span<const std::pair<int, float>> predictions) {
  std::lock_guard lk(mu_);
  for (auto [e, w] : predictions) {
    if (!layout_.has(layer, e)) continue;
    uint32_t i = index(layer, e);
    Entry& en = entries_[i];
    if (en.state != State::disk || en.waiting) continue;
    // Admission: a free slot, or the place of the expert a read would evict next (victim()) when
    // that one is colder and not streaming — while a scan's streaming experts are what reads
    // evict, predictions wait (each one the router gets wrong is a wasted read). Claimed and held
    // experts are never in evictable_, so the current step's experts cannot be evicted here.
    const double cand_key = key_of(double(w));
    bool admit = !free_slots_.empty();
    if (!admit && waiting_.empty() && !evictable_.empty()) {
      const auto v = victim();
      admit = v->first >= kStreamKeyCeiling && v->first < cand_key - kAdmitMarginHalfLives;
    }
    if (!admit) {
      tel_.prefetch_rejected++;
      continue;
    }
    en.from_prefetch = true;
    if (cand_key > en.key) {  // keep the history of an expert used before, if hotter
      en.freq = double(w);
      en.key = cand_key;
    }
    tel_.prefetch_issued++;
    start_read(i, ReadPriority::kPrefetch);
  }
}

bool ExpertStore::all_resident() const {
  std::lock_guard lk(mu_);
  for (uint32_t i = 0; i < entries_.size(); i++)
    if (!layout_.spans[i].empty() && entries_[i].state != State::host) return false;
  return true;
}

uint64_t ExpertStore::fill(const std::function<void(uint64_t, uint64_t)>& progress) {
  const auto t0 = Clock::now();
  const double busy0 = reader_->stats().busy_seconds;
  std::vector<uint32_t> started;
  uint64_t total = 0;
  {
    std::lock_guard lk(mu_);
    STRATA_ASSERT(waiting_.empty());
    for (uint32_t i = 0; i < entries_.size() && !free_slots_.empty(); i++) {
      Entry& en = entries_[i];
      if (layout_.spans[i].empty() || en.state != State::disk) continue;
      en.filling = true;
      fill_pending_++;
      total += en.aligned_bytes;
      started.push_back(i);
      start_read(i, ReadPriority::kPrefetch);
    }
  }
  auto report = [&](bool last) {
    if (!progress) return;
    uint64_t done = 0;
    {
      std::lock_guard lk(mu_);
      for (uint32_t i : started)
        if (!entries_[i].filling) done += entries_[i].aligned_bytes;
    }
    if (last || done < total) progress(done, total);
  };
  {
    std::unique_lock lk(mu_);
    while (fill_pending_ > 0) {
      ready_cv_.wait_for(lk, std::chrono::milliseconds(250), [&] { return fill_pending_ == 0; });
      if (fill_pending_ > 0) {
        lk.unlock();
        report(false);
        lk.lock();
      }
    }
  }
  report(true);
  std::lock_guard lk(mu_);
  fill_busy_s_ += reader_->stats().busy_seconds - busy0;
  tel_.fill_s += std::chrono::duration<double>(Clock::now() - t0).count();
  for (uint32_t i : started) {
    const Entry& en = entries_[i];
    if (en.state == State::host) continue;
    const FileSpan& sp = layout_.spans[i].front();
    throw Error("host expert cache fill: layer " + std::to_string(int(i) / layout_.num_experts) +
                " expert " + std::to_string(int(i) % layout_.num_experts) + " (" +
                layout_.files[size_t(sp.file)].string() + " at offset " +
                std::to_string(sp.offset) + "): " + en.error);
  }
  return started.size();
}

TierTelemetry ExpertStore::telemetry() const {
  ReaderStats rs = reader_->stats();
  std::lock_guard lk(mu_);
  TierTelemetry t = tel_;
  t.read_busy_s = std::max(0.0, rs.busy_seconds - fill_busy_s_);
  t.read_retries = rs.retries;
  t.host_used_bytes = used_bytes_;
  return t;
}

}  // namespace strata::offload
