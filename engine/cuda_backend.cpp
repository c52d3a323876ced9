// The CUDA backend (engine/cuda_backend.h). Host code only: kernels are reached through their
// CUDA-free launchers (kernels/*/*.h) and the runtime wrappers of kernels/runtime.h, so this file
// builds (and its constructor refuses with a clear line) without CUDA too.
//
// bf16 rounding points (spec §12.2) as the CPU reference places them: every GEMM output is rounded
// (cuBLASLt fp32 output + round_bf16_inplace, or bf16 output), norms/GLUs/gates round inside their
// kernels, residual adds round. The routed experts' fp32 contract outputs are rounded to bf16 on
// both executors before the merge (engine/contract_executor.cpp does the same), so the merge sees
// the same bits whichever executor computed a row.
// Without CUDA (-DSTRATA_CUDA=OFF) engine/cuda_backend_nocuda.cpp defines the class instead.
#ifdef STRATA_HAVE_CUDA
#include "engine/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <thread>

#include <tbb/parallel_for.h>

#include "engine/finite_check.h"
#include "engine/offload_executor.h"
#include "engine/promotion.h"
#include "engine/routing.h"
#include "kernels/gemm/gemm.h"
#include "kernels/kda/kda.h"
#include "kernels/mla/mla.h"
#include "kernels/moe/experts.h"
#include "kernels/moe/groups.h"
#include "kernels/ops/ops.h"
#include "kernels/runtime.h"
#include "kernels/sample/sample.h"
#include "offload/cost_model.h"
#include "offload/hardware.h"
#include "offload/hw_measure.h"
#include "storage/bf16.h"
#include "storage/error.h"

namespace strata::engine {

// The planner predicts which MoE layers group their experts on the device (one model).
static_assert(offload::kDeviceGroupMaxPairs == kernels::moe::kMaxGroupPairs);
static_assert(offload::kExpertGemmMinMeanPairs == kernels::moe::kGemmMinMeanPairsPerGroup);

namespace rt = kernels::rt;
namespace kops = kernels::ops;

namespace {

constexpr float kMlaNormEps = 1e-6f;  // q_a / kv_a layernorms (spec §3.1)
constexpr size_t kAlign = 256;

size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// MLA decode's capacity for a step whose longest sequence holds n positions: the next power of two
// ≥ max(n, 256), at most max_context. mla::decode_device plans its splits for it, so the steps of
// one bucket replay one CUDA graph, and the bits depend on the lengths and the bucket, eager or
// replayed alike. A length in (cap/2, cap] keeps at least half of the splits busy.
int64_t mla_decode_cap(int64_t n, int64_t max_context) {
  int64_t cap = 256;
  while (cap < n) cap *= 2;
  return std::min(cap, max_context);
}

// The end of the run of decode rows starting at s.seqs[i] (T == 1): the following sequences of one
// row each in the next slots and rows, which one decode call serves together.
size_t decode_run_end(const StepShape& s, size_t i) {
  size_t j = i + 1;
  while (j < s.seqs.size() && s.seqs[j].T == 1 && s.seqs[j].slot == s.seqs[j - 1].slot + 1 &&
         s.seqs[j].row0 == s.seqs[j - 1].row0 + 1)
    ++j;
  return j;
}

void check(kernels::Status s, const char* what) {
  if (!s.ok()) throw Error(std::string("CUDA backend: ") + what + ": " + s.message);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// memcpy over TBB workers in 1 MiB pieces (staging experts from host memory into pinned buffers).
void parallel_copy(void* dst, const void* src, size_t n) {
  constexpr size_t kPiece = size_t(1) << 20;
  tbb::parallel_for(size_t(0), (n + kPiece - 1) / kPiece, [&](size_t i) {
    const size_t off = i * kPiece;
    std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off,
                std::min(kPiece, n - off));
  });
}

constexpr int kNoStaging = std::numeric_limits<int>::max();

std::string gib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f GiB", bytes / double(1ull << 30));
  return b;
}

// A device allocation owned by the backend.
struct DevMem {
  void* p = nullptr;
  size_t bytes = 0;
  DevMem() = default;
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  DevMem(DevMem&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr, o.bytes = 0; }
  ~DevMem() { rt::device_free(p); }
  void alloc(size_t n, const char* what) {
    std::string why;
    p = rt::device_alloc(n, &why);
    if (!p)
      throw Error(std::string("CUDA backend: cannot allocate ") + gib(double(n)) + " for " + what +
                  ": " + why);
    bytes = n;
  }
};

// A bump allocator over one device region: plan with p = nullptr (sizes only), then carve.
struct Bump {
  char* base = nullptr;
  size_t cap = 0, used = 0;
  void* take(size_t n, const char* what) {
    const size_t a = align_up(n);
    if (used + a > cap)
      throw Error(std::string("CUDA backend: step arena exhausted taking ") + what + " (" +
                  std::to_string(used + a) + " of " + std::to_string(cap) + " bytes)");
    void* p = base + used;
    used += a;
    return p;
  }
};

}  // namespace

// --------------------------------------------------------------------------------------------
// Device weights

struct DevMatrix {  // bf16 [rows, cols] on the device
  const uint16_t* p = nullptr;
  int64_t rows = 0, cols = 0;
};
struct DevVec {
  const float* p = nullptr;
};

struct KdaDev {
  DevMatrix qkv, f_a, f_b, b, g, g_a, g_b, o;
  DevVec conv_q, conv_k, conv_v, A_log, dt_bias, o_norm;
};
struct MlaDev {
  DevMatrix q_a, q_b, q, kv_a, kv_b, g, o;
  DevVec q_a_norm, kv_a_norm;
};
struct MlpDev {
  DevMatrix gate_up, down;
  int64_t I = 0;
};
struct MoeDev {
  DevMatrix router, latent_down, latent_up;
  DevVec bias, latent_norm;
  MlpDev shared;
  bool has_shared = false;
  std::vector<int32_t> gpu_slot;  // [E]: expert cache slot, −1 = not resident
  // Every routed expert resident: routing → groups on the device (kernels/moe/groups.h), no host
  // round trip, so a decode step's MoE layer is part of its CUDA graph.
  bool all_resident = false;
  const int32_t* slot_dev = nullptr;  // device copy of gpu_slot
};
struct LayerDev {
  DevVec input_norm, post_norm, attn_norm_w, attn_proj_w, mlp_norm_w, mlp_proj_w;
  KdaDev kda;
  MlaDev mla;
  MlpDev dense;
  MoeDev moe;
  // Per-slot state (device): KDA [slots, H, V, K] fp32 and conv [slots, 3P, 3] bf16; MLA cache
  // [slots, max_context, 576] bf16.
  float* kda_S = nullptr;
  uint16_t* kda_conv = nullptr;
  uint16_t* mla_cache = nullptr;
};

struct CudaBackend::Impl {
  void* stream = nullptr;
  std::unique_ptr<kernels::gemm::Gemm> gemm;
  std::vector<DevMem> mem;  // every weight / state / arena allocation
  std::vector<LayerDev> layers;
  DevMatrix embed, lm_head;
  DevVec final_norm, out_norm_w, out_proj_w;
  // Expert cache: slot s holds one expert's MXFP4 arrays; views_host[s] points into it.
  std::vector<Mxfp4ExpertView> views_host;
  const Mxfp4ExpertView* views_dev = nullptr;  // device copy of views_host
  const int32_t* token_offsets_dev = nullptr;  // [max_step_rows + 1]: t · top_k (merge lists)
  size_t expert_bytes = 0;
  int64_t resident = 0;
  // Step arena and pinned staging.
  Bump arena;
  size_t acts_mark = 0;
  char* pinned = nullptr;
  size_t pinned_bytes = 0;
  // Logits come down through pinned memory (a download into pageable memory ran at ~6 GB/s on
  // the H200: 0.8 ms of a B=8 decode step at K3's vocabulary), logits_rows rows at a time.
  float* logits_pin = nullptr;
  int64_t logits_rows = 0;
  // The last hidden-state norm's output as bf16 (a step's rows × D, at the arena's end) and the
  // fp32 activation it copies: the following token mixer's or FFN's GEMM input.
  uint16_t* norm_bf16 = nullptr;
  int64_t norm_bf16_cap = 0;
  const float* norm_bf16_of = nullptr;
  int64_t norm_bf16_n = 0;
  // Draws on the device (CudaBackend::sample): the uniforms up, the ids down, one per slot.
  double* sample_u_pin = nullptr;
  int32_t* sample_id_pin = nullptr;
  int64_t sample_rows = 0;
  // Non-finite guard: the device record (kernels::ops::finite_scan) and its pinned copy; the
  // pinned word after it holds kFiniteClean, the value a step starts from.
  uint64_t* finite_dev = nullptr;
  uint64_t* finite_pin = nullptr;
  // Each slot's decode position for MLA (mla::write_latent_decode, decode_device read it when their
  // kernels run, so a decode step's MLA layers belong to its CUDA graph): written to pos_pin at the
  // start of a step and copied to pos_dev before its first segment; pos_copied follows the copy.
  int32_t* pos_pin = nullptr;
  int32_t* pos_dev = nullptr;
  void* pos_copied = nullptr;
  bool pos_pending = false;  // pos_copied recorded and not yet waited for
  int64_t mla_cap = 0;       // this step's MLA decode capacity (mla_decode_cap)
  std::unique_ptr<ExpertExecutor> cpu_executor;
  // Prefill staging: device slots in two halves (a round copies into one half while the other's
  // experts compute), two pinned expert buffers (host copy of one while the other is DMA'd).
  void* copy_stream = nullptr;
  uint8_t* stage_dev = nullptr;
  int stage_slots = 0;  // per half
  char* stage_pin = nullptr;
  void* pin_done[2] = {nullptr, nullptr};   // copy stream: DMA out of pinned buffer p done
  void* half_free[2] = {nullptr, nullptr};  // main stream: the experts of half h computed
  void* copies_done = nullptr;
  // Staging straight from a page-locked host expert cache (HostExpertSource): one event per
  // expert DMA in flight, a ring of 2·stage_slots + 1 (an expert's cache slot is released once its
  // event completed).
  std::vector<void*> stage_ev;
  int stage_threshold = -1;  // resolved lazily (−1: not yet)
  // Promotions (CudaBackendOptions::promote). cache_base: slot s is at cache_base + s ·
  // expert_bytes (one layout for every expert, so a slot's view never changes). heat[l]: decayed
  // routing counts of MoE layer l's experts, empty for layers with nothing to promote (every
  // expert resident, or none). A batch goes: decided at a commit_step (victims out of gpu_slot,
  // `promo_after` recorded on the main stream after the last work that may read their slots,
  // the batch handed to the worker thread) → copied by the worker (host copy of each expert into
  // promo_pin[i], its DMA on promote_stream after promo_after, then promo_done recorded; a
  // checkpoint page read from disk delays the worker, not the step) → switched into gpu_slot at
  // the first commit_step that sees the worker finished and promo_done complete (non-blocking
  // query); only then may the next batch be decided, so promo_pin and `promo` are free again.
  struct Promotion {
    int layer;
    int32_t expert, victim, slot;
  };
  uint8_t* cache_base = nullptr;
  std::vector<std::vector<float>> heat;
  std::vector<Promotion> promo;  // the current batch (capacity promote_max); empty: none
  uint64_t promo_steps = 0;
  int promote_max = 0;  // 0: promotions off
  char* promo_pin = nullptr;
  void* promote_stream = nullptr;
  void* promo_after = nullptr;
  void* promo_done = nullptr;
  // The worker: woken with promo_job, it sets promo_finished (release) when the batch's copies
  // are enqueued, with promo_error and promo_copy_s written before.
  std::thread promo_thread;
  std::mutex promo_mu;
  std::condition_variable promo_cv;
  bool promo_job = false, promo_quit = false;  // under promo_mu
  std::atomic<bool> promo_finished{false};
  std::string promo_error;
  double promo_copy_s = 0;
  void promote_worker(const Model& model, int device);
  ~Impl() {
    if (promo_thread.joinable()) {
      {
        std::lock_guard<std::mutex> lk(promo_mu);
        promo_quit = true;
      }
      promo_cv.notify_all();
      promo_thread.join();
    }
    if (promote_stream) rt::stream_sync(promote_stream);  // its DMA reads promo_pin
    if (pos_pending) rt::event_sync(pos_copied);          // its copy reads pos_pin
    for (void* e : {pin_done[0], pin_done[1], half_free[0], half_free[1], copies_done, promo_after,
                    promo_done, pos_copied})
      rt::event_destroy(e);
    for (void* e : stage_ev) rt::event_destroy(e);
    rt::pinned_free(pos_pin);
    rt::pinned_free(promo_pin);
    if (promote_stream) rt::stream_destroy(promote_stream);
    rt::pinned_free(stage_pin);
    rt::pinned_free(pinned);
    rt::pinned_free(logits_pin);
    rt::pinned_free(sample_u_pin);
    if (copy_stream) rt::stream_destroy(copy_stream);
    if (stream) rt::stream_destroy(stream);
  }
};

// CUDA graphs of decode steps, per step shape (engine/cuda_backend.h, cuda_graphs).
struct CudaBackend::Graphs {
  struct Entry {
    std::vector<void*> segments;  // executable graphs, in step order
    bool complete = false;
  };

  std::map<std::string, Entry> by_shape;
  std::deque<std::string> order;  // insertion order, for the bound
  static constexpr size_t kMaxShapes = 64;
  Entry* entry = nullptr;  // this step's (nullptr: eager step)
  bool replaying = false, in_segment = false;
  size_t next = 0;
  ~Graphs() {
    for (auto& [k, e] : by_shape)
      for (void* g : e.segments) rt::graph_destroy(g);
  }
};

// Sublayer profile (CudaBackendOptions::profile): a pool of timing events, the (kind, start, end)
// marks of the current step, and the totals per kind.
struct CudaBackend::Profile {
  enum Kind { embed, mix, norm, kda, mla, mlp, moe, add, copy, finite, logits, kNumKinds };
  static constexpr const char* kKinds[kNumKinds] = {
      "embed", "mix", "norm", "kda", "mla", "mlp", "moe", "add", "copy", "finite", "logits"};
  std::vector<void*> pool;
  size_t used = 0;
  struct Mark {
    int kind;
    void *a, *b;
  };
  std::vector<Mark> marks;
  void* step_a = nullptr;
  double ms[kNumKinds] = {};
  double span_ms = 0;
  uint64_t steps = 0;
  void* take() {
    if (used == pool.size()) {
      void* e = rt::timing_event_create();
      if (!e) throw Error("CUDA backend: cannot create a timing event");
      pool.push_back(e);
    }
    return pool[used++];
  }
  ~Profile() {
    for (void* e : pool) rt::event_destroy(e);
  }
};

// Marks the GPU time of one backend call on the backend's stream (a no-op unless profiling).
struct ProfScope {
  CudaBackend::Profile* p;
  void* stream;
  void* b = nullptr;
  ProfScope(CudaBackend& cb, CudaBackend::Profile::Kind kind)
      : p(cb.prof_.get()), stream(cb.impl_->stream) {
    if (!p) return;
    void* a = p->take();
    b = p->take();
    check(rt::event_record(a, stream), "profile");
    p->marks.push_back({kind, a, b});
  }
  ~ProfScope() {
    if (p) rt::event_record(b, stream);
  }
};

namespace {

// Uploads a bf16 weight view (rows of several views concatenated) into one device matrix.
struct Uploader {
  CudaBackend::Impl& im;
  uint64_t done = 0, total = 0;
  double t0 = now_s(), last = 0;
  bool progress = true;

  void note(uint64_t n) {
    done += n;
    const double t = now_s() - t0;
    if (progress && (t - last > 0.5 || done == total)) {
      last = t;
      const double rate = t > 0 ? double(done) / t : 0;
      std::fprintf(stderr, "\rstrata: uploading weights %.2f / %.2f GB at %.2f GB/s, ETA %.0f s   ",
                   double(done) / 1e9, double(total) / 1e9, rate / 1e9,
                   rate > 0 ? double(total - done) / rate : 0.0);
      if (done == total) std::fputc('\n', stderr);
    }
  }
  void* device(size_t bytes, const char* what) {
    im.mem.emplace_back();
    im.mem.back().alloc(bytes, what);
    return im.mem.back().p;
  }
  DevMatrix matrix(std::initializer_list<const WeightView*> parts, const char* what) {
    int64_t rows = 0, cols = -1;
    for (const WeightView* w : parts) {
      if (w->format != cpu::ref::WeightFormat::bf16)
        throw Error(std::string("CUDA backend: ") + what + " is not bf16");
      if (cols >= 0 && w->cols != cols)
        throw Error(std::string("CUDA backend: ") + what + " widths");
      cols = w->cols;
      rows += w->rows;
    }
    auto* d = static_cast<uint16_t*>(device(size_t(rows * cols) * 2, what));
    int64_t r = 0;
    for (const WeightView* w : parts) {
      const size_t n = size_t(w->rows * w->cols) * 2;
      check(rt::copy(d + r * cols, w->data, n), what);
      r += w->rows;
      note(n);
    }
    return DevMatrix{d, rows, cols};
  }
  DevVec vec(const std::vector<float>& v, const char* what) {
    auto* d = static_cast<float*>(device(v.size() * 4 + 4, what));
    check(rt::copy(d, v.data(), v.size() * 4), what);
    note(v.size() * 4);
    return DevVec{d};
  }
};

uint64_t matrix_bytes(const WeightView& w) {
  return uint64_t(w.rows * w.cols) * 2;
}

// One MXFP4 expert's arrays laid out as w1 packed | w1 scales | w3 … | w2 … (a cache or staging
// slot). for_each_part calls f(source, bytes, offset) per array; view_at gives the device view of
// a slot at `base`.
template <typename F>
void for_each_part(const ExpertWeights& e, F&& f) {
  size_t off = 0;
  for (const WeightView* w : {&e.w1, &e.w3, &e.w2}) {
    if (w->format == cpu::ref::WeightFormat::bf16) {    // bf16 experts: w1, w3 (one [2I, H]
      const size_t nb = size_t(w->rows * w->cols) * 2;  // gate|up matrix), w2
      f(static_cast<const uint8_t*>(w->data), nb, off);
      off += nb;
      continue;
    }
    const size_t np = size_t(w->rows * w->cols / 2), ns = size_t(w->rows * w->cols / 32);
    f(static_cast<const uint8_t*>(w->data), np, off);
    off += np;
    f(w->scale, ns, off);
    off += ns;
  }
}
Mxfp4ExpertView view_at(const ExpertWeights& e, const uint8_t* base, int hidden, int inter) {
  Mxfp4ExpertView v;
  v.hidden = hidden;
  v.inter = inter;
  const uint8_t* parts[6] = {};
  int i = 0;
  for_each_part(e, [&](const uint8_t*, size_t, size_t off) { parts[i++] = base + off; });
  if (i == 3) {  // bf16 experts: the view's packed pointers are the bf16 matrices, no scales
    v.w1_packed = parts[0], v.w3_packed = parts[1], v.w2_packed = parts[2];
    return v;
  }
  v.w1_packed = parts[0], v.w1_scale = parts[1], v.w3_packed = parts[2], v.w3_scale = parts[3];
  v.w2_packed = parts[4], v.w2_scale = parts[5];
  return v;
}

}  // namespace

// --------------------------------------------------------------------------------------------
// Construction: checks, budget, uploads.

CudaBackend::CudaBackend(const Model& model, BackendOptions options, CudaBackendOptions cuda)
    : model_(model), c_(model.config()), opt_(std::move(options)), cuda_(cuda) {
  if (const char* e = std::getenv("STRATA_CUDA_PROFILE_STEP")) profile_step_ = std::atoi(e);
  if (kernels::cuda_device_count() == 0)
    throw Error("--device gpu: no CUDA device (" + kernels::cuda_device_description(0) + ")");
  if (opt_.experts == ExpertNumerics::bf16 && c_.moe.mxfp4)
    throw Error("--experts-numerics bf16 is for bf16 routed experts; " + c_.source +
                " has MXFP4 experts (use contract)");
  if (opt_.precision != Precision::bf16 || opt_.experts == ExpertNumerics::exact)
    throw Error(
        "--device gpu runs bf16 with contract experts; --precision fp32 and --experts-numerics "
        "exact are the CPU reference's (use --device cpu or auto)");
  const auto& k = c_.kda;
  const auto& m = c_.mla;
  const auto& mo = c_.moe;
  if (c_.num_kda_layers() > 0 && (k.head_dim != 128 || k.conv_kernel != 4))
    throw Error("--device gpu: KDA kernels support head_dim 128 and conv 4 (model: " +
                std::to_string(k.head_dim) + ", " + std::to_string(k.conv_kernel) + ")");
  if (c_.num_mla_layers() > 0 &&
      (m.qk_nope_head_dim != kernels::mla::kNope || m.qk_rope_head_dim != kernels::mla::kRope ||
       m.v_head_dim != kernels::mla::kV || m.kv_lora_rank != kernels::mla::kLatent))
    throw Error("--device gpu: MLA kernels support nope 128, rope 64, v 128, kv_lora 512 (model: " +
                std::to_string(m.qk_nope_head_dim) + ", " + std::to_string(m.qk_rope_head_dim) +
                ", " + std::to_string(m.v_head_dim) + ", " + std::to_string(m.kv_lora_rank) +
                "); use --device cpu");
  if (c_.num_moe_layers() > 0 && !mo.mxfp4 && opt_.experts != ExpertNumerics::bf16)
    throw Error(
        "--device gpu: routed experts must be MXFP4 (this model's are bf16); use "
        "--experts-quantize mxfp4 or --device cpu");
  if (cuda_.slots < 1 || cuda_.slots > kernels::mla::kMaxSeqs)
    throw Error("--slots must be in 1.." + std::to_string(kernels::mla::kMaxSeqs));
  check(rt::set_device(cuda_.device), "cudaSetDevice");
  impl_ = std::make_unique<Impl>();
  Impl& im = *impl_;
  im.stream = rt::stream_create();
  if (!im.stream) throw Error("CUDA backend: cannot create a stream");
  im.gemm = std::make_unique<kernels::gemm::Gemm>();
  pos_.assign(size_t(cuda_.slots), 0);

  const auto& W = model.weights();
  const int64_t D = c_.hidden_size, V = c_.vocab_size, R = cuda_.max_step_rows;
  const int64_t P = k.proj_dim(), H = k.num_heads, L = c_.expert_in_dim(), E = mo.num_experts,
                Kt = mo.top_k, I = mo.intermediate_size;
  const int64_t Hm = m.num_heads;
  const int nl = c_.num_layers;

  // ---- The budget (STYLE §9: sized once, printed, then allocated) ----
  uint64_t dense = matrix_bytes(W.embed) + matrix_bytes(W.lm_head);
  uint64_t experts_total = 0;
  im.expert_bytes = 0;
  for (const LayerWeights& lw : W.layers) {
    auto add = [&](const WeightView& w) {
      if (w.data) dense += matrix_bytes(w);
    };
    if (lw.kda) {
      const KdaWeights& kw = *lw.kda;
      for (const WeightView* w : {&kw.q_proj, &kw.k_proj, &kw.v_proj, &kw.f_a_proj, &kw.f_b_proj,
                                  &kw.b_proj, &kw.g_proj, &kw.g_a_proj, &kw.g_b_proj, &kw.o_proj})
        add(*w);
    }
    if (lw.mla) {
      const MlaWeights& mw = *lw.mla;
      for (const WeightView* w : {&mw.q_a_proj, &mw.q_b_proj, &mw.q_proj, &mw.kv_a_proj,
                                  &mw.kv_b_proj, &mw.g_proj, &mw.o_proj})
        add(*w);
    }
    if (lw.dense) {
      add(lw.dense->mlp.gate), add(lw.dense->mlp.up), add(lw.dense->mlp.down);
    }
    if (lw.moe) {
      const MoeWeights& mw = *lw.moe;
      add(mw.router), add(mw.latent_down), add(mw.latent_up);
      if (mw.shared) add(mw.shared->gate), add(mw.shared->up), add(mw.shared->down);
      for (const ExpertWeights& e : mw.experts) {
        size_t b = 0;
        for_each_part(e, [&](const uint8_t*, size_t n, size_t) { b += n; });
        im.expert_bytes = b;
        experts_total += b;
      }
    }
  }
  const int64_t max_blocks =
      c_.has_attn_res() ? (nl + c_.attn_res_block_size - 1) / c_.attn_res_block_size + 1 : 0;
  uint64_t state_per_slot = 0;
  for (int l = 0; l < nl; ++l) {
    if (c_.is_kda(l)) state_per_slot += uint64_t(H * 128 * 128) * 4 + uint64_t(3 * P * 3) * 2;
    if (c_.is_mla(l)) state_per_slot += uint64_t(cuda_.max_context) * kernels::mla::kCacheDim * 2;
  }
  // Step arena: activations the schedule takes, plus the largest sublayer scratch (summed
  // generously: every sublayer's pieces, 256-aligned).
  const int64_t widest =
      std::max({D, 3 * P, int64_t(2) * c_.dense_intermediate_size,
                int64_t(2) * std::max(1, mo.shared_intermediate()), Hm * 256, E, V});
  uint64_t arena = uint64_t(6 + max_blocks) * align_up(size_t(R * D) * 4);
  arena += 8 * align_up(size_t(R * widest) * 4);  // GEMM outputs and copies
  arena += 4 * align_up(size_t(R * Kt * L) * 4);  // expert outputs, merge
  arena += align_up(kernels::moe::experts_workspace_bytes(int(R), int(R * Kt), int(L), int(I)));
  arena += align_up(kernels::kda::prefill_workspace_bytes(int(std::max<int64_t>(H, 1)), 1, R));
  if (c_.num_mla_layers() > 0)
    arena += align_up(
        std::max(kernels::mla::prefill_workspace_bytes_bounded(int(Hm), R),
                 kernels::mla::decode_workspace_bytes(int(Hm), cuda_.slots, cuda_.max_context)));
  arena += align_up(size_t(E) * sizeof(Mxfp4ExpertView)) + 8 * align_up(size_t(R * Kt + E + 1) * 4);
  const uint64_t norm_bf16_bytes = align_up(size_t(R * D) * 2);  // the norms' bf16 copy
  arena += norm_bf16_bytes;
  // Draws on the device (sample): a decode step's logits, one row per slot, and the sort's space.
  arena += align_up(size_t(cuda_.slots) * size_t(V) * 4) + 2 * align_up(size_t(cuda_.slots) * 8) +
           align_up(kernels::sample::sample_workspace_bytes(cuda_.slots, int(V)));
  const uint64_t pinned = uint64_t(R * Kt * L) * 4 + uint64_t(R * std::max(L, D)) * 4 +
                          uint64_t(R * Kt) * 24 + uint64_t(E) * sizeof(Mxfp4ExpertView) +
                          uint64_t(2 * E + R + 2) * 8 + uint64_t(R) * 4 +
                          uint64_t(2 * E + 8) * kAlign +  // a 256-B aligned part per launch list
                          kAlign;                         // the non-finite record's two words
  size_t free_b = 0, total_b = 0;
  check(rt::mem_info(&free_b, &total_b), "cudaMemGetInfo");
  const uint64_t margin = 1ull << 30;
  const uint64_t budget =
      cuda_.gpu_mem_bytes ? cuda_.gpu_mem_bytes : (free_b > margin ? free_b - margin : 0);
  const uint64_t fixed = dense + state_per_slot * uint64_t(cuda_.slots) + arena + (64ull << 20);
  if (fixed > budget || (cuda_.gpu_mem_bytes && cuda_.gpu_mem_bytes > free_b))
    throw Error("--gpu-mem: the GPU budget " + gib(double(budget)) + " (device free " +
                gib(double(free_b)) + ") cannot hold the dense weights " + gib(double(dense)) +
                " + state " + gib(double(state_per_slot)) + " x " + std::to_string(cuda_.slots) +
                " slots + step arena " + gib(double(arena)) + "; lower --slots, --max-context or " +
                "--max-step-rows, or raise --gpu-mem");
  const int64_t n_routed = int64_t(c_.num_moe_layers()) * E;
  // Expert cache, and the staging slots a partial cache needs for prefill (two halves of
  // stage_slots experts each).
  int64_t cache_slots = 0;
  int stage_slots = 0;
  if (n_routed > 0 && im.expert_bytes > 0) {
    const int per_half = int(std::min<int64_t>(std::max(1, cuda_.stage_slots), E));
    const uint64_t stage_bytes = 2ull * uint64_t(per_half) * im.expert_bytes;
    const int64_t fit = int64_t((budget - fixed) / im.expert_bytes);
    if (cuda_.gpu_expert_share < 0) {
      cache_slots = std::min(fit, n_routed);
      if (cache_slots < n_routed) {
        const uint64_t room = budget - fixed > stage_bytes ? budget - fixed - stage_bytes : 0;
        cache_slots = std::min<int64_t>(n_routed, int64_t(room / im.expert_bytes));
        stage_slots = per_half;
      }
    } else {
      cache_slots = int64_t(std::llround(cuda_.gpu_expert_share * double(E))) * c_.num_moe_layers();
      if (cache_slots < n_routed) stage_slots = per_half;
      const uint64_t need =
          uint64_t(cache_slots) * im.expert_bytes + (stage_slots ? stage_bytes : 0);
      if (need > budget - fixed)
        throw Error("--gpu-experts: " + std::to_string(cache_slots) + " experts (" +
                    gib(double(cache_slots) * double(im.expert_bytes)) + ") + staging slots " +
                    gib(double(stage_slots ? stage_bytes : 0)) +
                    " do not fit the GPU budget after the dense part (" +
                    gib(double(budget - fixed)) + " left)");
    }
  }
  const int64_t per_layer = c_.num_moe_layers() > 0 ? cache_slots / c_.num_moe_layers() : 0;
  // Promotions need a partial cache (slots to take, experts outside them) and a pinned buffer of
  // promote_max experts.
  const bool promote =
      cuda_.promote && per_layer > 0 && per_layer < E && cuda_.promote_interval > 0;
  const int promote_max = promote ? std::max(1, cuda_.promote_max) : 0;
  const uint64_t promo_pinned = uint64_t(promote_max) * im.expert_bytes;
  budget_.push_back("GPU " + kernels::cuda_device_description(cuda_.device) + ": budget " +
                    gib(double(budget)) +
                    (cuda_.gpu_mem_bytes ? " (--gpu-mem)" : " (free - 1 GiB)"));
  budget_.push_back("  dense weights (bf16)      " + gib(double(dense)));
  budget_.push_back("  expert cache              " +
                    gib(double(per_layer * c_.num_moe_layers()) * double(im.expert_bytes)) + " = " +
                    std::to_string(per_layer) + " of " + std::to_string(E) + " experts x " +
                    std::to_string(c_.num_moe_layers()) + " MoE layers (" +
                    std::to_string(experts_total
                                       ? 100.0 * double(per_layer * c_.num_moe_layers()) *
                                             double(im.expert_bytes) / double(experts_total)
                                       : 0.0)
                        .substr(0, 5) +
                    "% of " + gib(double(experts_total)) + ")");
  budget_.push_back("  prefill staging slots     " +
                    gib(2.0 * stage_slots * double(im.expert_bytes)) + " = 2 x " +
                    std::to_string(stage_slots) + " experts (+ " +
                    gib(2.0 * double(im.expert_bytes)) + " pinned)");
  budget_.push_back("  state per sequence        " + gib(double(state_per_slot)) + " x " +
                    std::to_string(cuda_.slots) + " slots (max context " +
                    std::to_string(cuda_.max_context) + ")");
  budget_.push_back("  step arena + workspaces   " + gib(double(arena)) + " (" + std::to_string(R) +
                    " rows per step)");
  // Logits staging: a decode step's rows (one per slot) in one piece, up to 64 rows.
  const int64_t logits_rows = std::clamp<int64_t>(cuda_.slots, 1, 64);
  const uint64_t logits_pinned = uint64_t(logits_rows) * uint64_t(c_.vocab_size) * 4;
  budget_.push_back("host: pinned staging " + gib(double(pinned + logits_pinned)) + " (logits " +
                    gib(double(logits_pinned)) + "), promotions " + gib(double(promo_pinned)) +
                    (promote ? " (" + std::to_string(promote_max) + " experts every " +
                                   std::to_string(cuda_.promote_interval) + " steps)"
                             : std::string(" (off)")) +
                    "; experts not in the GPU cache are computed by the CPU from host memory");

  // ---- Uploads ----
  Uploader up{im};
  up.progress = cuda_.progress;
  up.total = dense;
  im.embed = up.matrix({&W.embed}, "embed_tokens");
  im.lm_head = up.matrix({&W.lm_head}, "lm_head");
  im.final_norm = up.vec(W.final_norm, "norm");
  if (W.output_res) {
    im.out_norm_w = up.vec(W.output_res->norm, "output_attn_res.norm");
    im.out_proj_w = up.vec(W.output_res->proj, "output_attn_res.proj");
  }
  im.layers.resize(size_t(nl));
  for (int l = 0; l < nl; ++l) {
    const LayerWeights& lw = W.layers[size_t(l)];
    LayerDev& d = im.layers[size_t(l)];
    d.input_norm = up.vec(lw.input_norm, "input_layernorm");
    d.post_norm = up.vec(lw.post_norm, "post_attention_layernorm");
    if (lw.attn_res) {
      d.attn_norm_w = up.vec(lw.attn_res->norm, "attn_res.norm");
      d.attn_proj_w = up.vec(lw.attn_res->proj, "attn_res.proj");
      d.mlp_norm_w = up.vec(lw.mlp_res->norm, "mlp_res.norm");
      d.mlp_proj_w = up.vec(lw.mlp_res->proj, "mlp_res.proj");
    }
    if (lw.kda) {
      const KdaWeights& kw = *lw.kda;
      KdaDev& kd = d.kda;
      kd.qkv = up.matrix({&kw.q_proj, &kw.k_proj, &kw.v_proj}, "q|k|v_proj");
      kd.f_a = up.matrix({&kw.f_a_proj}, "f_a_proj");
      kd.f_b = up.matrix({&kw.f_b_proj}, "f_b_proj");
      kd.b = up.matrix({&kw.b_proj}, "b_proj");
      if (k.full_rank_output_gate) {
        kd.g = up.matrix({&kw.g_proj}, "g_proj");
      } else {
        kd.g_a = up.matrix({&kw.g_a_proj}, "g_a_proj");
        kd.g_b = up.matrix({&kw.g_b_proj}, "g_b_proj");
      }
      kd.o = up.matrix({&kw.o_proj}, "o_proj");
      kd.conv_q = up.vec(kw.q_conv, "q_conv1d");
      kd.conv_k = up.vec(kw.k_conv, "k_conv1d");
      kd.conv_v = up.vec(kw.v_conv, "v_conv1d");
      kd.A_log = up.vec(kw.A_log, "A_log");
      kd.dt_bias = up.vec(kw.dt_bias, "dt_bias");
      kd.o_norm = up.vec(kw.o_norm, "o_norm");
      d.kda_S =
          static_cast<float*>(up.device(size_t(cuda_.slots * H * 128 * 128) * 4, "KDA state"));
      d.kda_conv =
          static_cast<uint16_t*>(up.device(size_t(cuda_.slots * 3 * P * 3) * 2, "KDA conv state"));
    }
    if (lw.mla) {
      const MlaWeights& mw = *lw.mla;
      MlaDev& md = d.mla;
      if (m.q_lora_rank > 0) {
        md.q_a = up.matrix({&mw.q_a_proj}, "q_a_proj");
        md.q_a_norm = up.vec(mw.q_a_norm, "q_a_layernorm");
        md.q_b = up.matrix({&mw.q_b_proj}, "q_b_proj");
      } else {
        md.q = up.matrix({&mw.q_proj}, "q_proj");
      }
      md.kv_a = up.matrix({&mw.kv_a_proj}, "kv_a_proj_with_mqa");
      md.kv_a_norm = up.vec(mw.kv_a_norm, "kv_a_layernorm");
      md.kv_b = up.matrix({&mw.kv_b_proj}, "kv_b_proj");
      if (m.output_gate) md.g = up.matrix({&mw.g_proj}, "g_proj");
      md.o = up.matrix({&mw.o_proj}, "o_proj");
      d.mla_cache = static_cast<uint16_t*>(
          up.device(size_t(cuda_.slots * cuda_.max_context) * kernels::mla::kCacheDim * 2,
                    "MLA latent cache"));
    }
    if (lw.dense) {
      d.dense.gate_up = up.matrix({&lw.dense->mlp.gate, &lw.dense->mlp.up}, "mlp.gate|up");
      d.dense.down = up.matrix({&lw.dense->mlp.down}, "mlp.down");
      d.dense.I = lw.dense->mlp.gate.rows;
    }
    if (lw.moe) {
      const MoeWeights& mw = *lw.moe;
      MoeDev& md = d.moe;
      md.router = up.matrix({&mw.router}, "gate.weight");
      md.bias = up.vec(mw.router_bias, "e_score_correction_bias");
      if (mo.latent_size > 0) {
        md.latent_down = up.matrix({&mw.latent_down}, "routed_expert_down_proj");
        md.latent_up = up.matrix({&mw.latent_up}, "routed_expert_up_proj");
        if (mo.latent_norm) md.latent_norm = up.vec(mw.latent_norm, "routed_expert_norm");
      }
      if (mw.shared) {
        md.has_shared = true;
        md.shared.gate_up = up.matrix({&mw.shared->gate, &mw.shared->up}, "shared_experts.gate|up");
        md.shared.down = up.matrix({&mw.shared->down}, "shared_experts.down");
        md.shared.I = mw.shared->gate.rows;
      }
      md.gpu_slot.assign(size_t(E), -1);
    }
  }
  // Expert cache: per MoE layer the first per_layer experts of a fixed per-layer permutation
  // (random-weight routers are uniform); promote_poll moves hot experts in from routing statistics.
  if (per_layer > 0) {
    const size_t total_cache = size_t(per_layer * c_.num_moe_layers()) * im.expert_bytes;
    auto* base = static_cast<uint8_t*>(up.device(total_cache, "GPU expert cache"));
    im.cache_base = base;
    uint64_t done = 0;
    const double t0 = now_s();
    for (int l = 0; l < nl; ++l) {
      if (!W.layers[size_t(l)].moe) continue;
      const MoeWeights& mw = *W.layers[size_t(l)].moe;
      std::vector<int32_t> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        auto h = [&](int32_t e) { return (uint32_t(e) * 2654435761u) ^ (uint32_t(l) * 40503u); };
        return h(a) != h(b) ? h(a) < h(b) : a < b;
      });
      for (int64_t i = 0; i < per_layer; ++i) {
        const int32_t e = order[size_t(i)];
        const ExpertWeights& ew = mw.experts[size_t(e)];
        uint8_t* p = base + size_t(im.resident) * im.expert_bytes;
        for_each_part(ew, [&](const uint8_t* src, size_t n, size_t off) {
          check(rt::copy(p + off, src, n), "expert upload");
        });
        const Mxfp4ExpertView v = view_at(ew, p, int(L), int(I));
        im.layers[size_t(l)].moe.gpu_slot[size_t(e)] = int32_t(im.views_host.size());
        im.views_host.push_back(v);
        ++im.resident;
        done += im.expert_bytes;
      }
    }
    if (cuda_.progress)
      std::fprintf(stderr, "strata: expert cache: %lld experts, %.2f GB in %.1f s\n",
                   (long long)im.resident, double(done) / 1e9, now_s() - t0);
    // Device tables of the routing → groups path (layers whose experts are all resident).
    auto* vd = static_cast<Mxfp4ExpertView*>(
        up.device(im.views_host.size() * sizeof(Mxfp4ExpertView), "expert cache views"));
    check(rt::copy(vd, im.views_host.data(), im.views_host.size() * sizeof(Mxfp4ExpertView)),
          "expert cache views");
    im.views_dev = vd;
    std::vector<int32_t> toff(size_t(cuda_.max_step_rows + 1));
    for (size_t t = 0; t < toff.size(); ++t) toff[t] = int32_t(int64_t(t) * c_.moe.top_k);
    auto* td = static_cast<int32_t*>(up.device(toff.size() * 4, "merge token offsets"));
    check(rt::copy(td, toff.data(), toff.size() * 4), "merge token offsets");
    im.token_offsets_dev = td;
    for (LayerDev& ld : im.layers) {
      MoeDev& md = ld.moe;
      if (md.gpu_slot.empty() ||
          std::any_of(md.gpu_slot.begin(), md.gpu_slot.end(), [](int32_t x) { return x < 0; }))
        continue;
      auto* sd = static_cast<int32_t*>(up.device(md.gpu_slot.size() * 4, "expert slot table"));
      check(rt::copy(sd, md.gpu_slot.data(), md.gpu_slot.size() * 4), "expert slot table");
      md.slot_dev = sd;
      md.all_resident = true;
    }
  }
  // Prefill staging.
  if (stage_slots > 0) {
    im.stage_slots = stage_slots;
    im.stage_dev = static_cast<uint8_t*>(
        up.device(2 * size_t(stage_slots) * im.expert_bytes, "prefill staging slots"));
    std::string why_pin;
    im.stage_pin = static_cast<char*>(rt::pinned_alloc(2 * im.expert_bytes, &why_pin));
    if (!im.stage_pin) throw Error("CUDA backend: cannot allocate pinned staging: " + why_pin);
    im.copy_stream = rt::stream_create();
    for (void** e :
         {&im.pin_done[0], &im.pin_done[1], &im.half_free[0], &im.half_free[1], &im.copies_done})
      if (!(*e = rt::event_create())) throw Error("CUDA backend: cannot create an event");
    for (int i = 0; i < 2 * stage_slots + 1; ++i) {
      im.stage_ev.push_back(rt::event_create());
      if (!im.stage_ev.back()) throw Error("CUDA backend: cannot create an event");
    }
  }
  if (cuda_.stage_threshold > 0) im.stage_threshold = cuda_.stage_threshold;
  // Promotions: counts for the layers with experts on both sides, the pinned buffer, the stream.
  if (promote) {
    im.heat.resize(size_t(nl));
    for (int l = 0; l < nl; ++l)
      if (!im.layers[size_t(l)].moe.gpu_slot.empty() && !im.layers[size_t(l)].moe.all_resident)
        im.heat[size_t(l)].assign(size_t(E), 0.0f);
    im.promote_max = promote_max;
    im.promo.reserve(size_t(promote_max));
    std::string why_pin;
    im.promo_pin = static_cast<char*>(rt::pinned_alloc(promo_pinned, &why_pin));
    if (!im.promo_pin) throw Error("CUDA backend: cannot allocate pinned promotions: " + why_pin);
    im.promote_stream = rt::stream_create();
    if (!im.promote_stream) throw Error("CUDA backend: cannot create a stream");
    for (void** e : {&im.promo_after, &im.promo_done})
      if (!(*e = rt::event_create())) throw Error("CUDA backend: cannot create an event");
    Impl* ip = &im;
    const Model* mp = &model;
    const int dev = cuda_.device;
    im.promo_thread = std::thread([ip, mp, dev] { ip->promote_worker(*mp, dev); });
  }
  // Step arena and pinned staging.
  im.arena.base = static_cast<char*>(up.device(arena, "step arena"));
  im.arena.cap = arena - norm_bf16_bytes;
  im.norm_bf16 = reinterpret_cast<uint16_t*>(im.arena.base + im.arena.cap);
  im.norm_bf16_cap = R * D;
  std::string why;
  im.pinned = static_cast<char*>(rt::pinned_alloc(pinned, &why));
  if (!im.pinned) throw Error("CUDA backend: cannot allocate pinned staging: " + why);
  im.pinned_bytes = pinned;
  im.logits_pin = static_cast<float*>(rt::pinned_alloc(logits_pinned, &why));
  if (!im.logits_pin) throw Error("CUDA backend: cannot allocate pinned logits staging: " + why);
  im.logits_rows = logits_rows;
  // One draw per slot: uniforms then ids.
  im.sample_u_pin = static_cast<double*>(rt::pinned_alloc(size_t(cuda_.slots) * 12, &why));
  if (!im.sample_u_pin) throw Error("CUDA backend: cannot allocate pinned draw staging: " + why);
  im.sample_id_pin = reinterpret_cast<int32_t*>(im.sample_u_pin + cuda_.slots);
  im.sample_rows = cuda_.slots;
  im.finite_pin = reinterpret_cast<uint64_t*>(im.pinned + ((pinned - kAlign) & ~uint64_t(7)));
  im.finite_pin[0] = im.finite_pin[1] = kops::kFiniteClean;
  im.finite_dev = static_cast<uint64_t*>(up.device(kAlign, "non-finite record"));
  if (c_.num_mla_layers() > 0) {
    im.pos_pin = static_cast<int32_t*>(rt::pinned_alloc(size_t(cuda_.slots) * 4, &why));
    if (!im.pos_pin) throw Error("CUDA backend: cannot allocate pinned positions: " + why);
    im.pos_dev = static_cast<int32_t*>(up.device(size_t(cuda_.slots) * 4, "MLA positions"));
    if (!(im.pos_copied = rt::event_create())) throw Error("CUDA backend: cannot create an event");
  }
  // CPU executor for the experts that miss the GPU cache.
  im.cpu_executor =
      make_expert_executor(mo.mxfp4 ? ExpertNumerics::contract : ExpertNumerics::bf16, c_);
  if (opt_.wrap_executor) im.cpu_executor = opt_.wrap_executor(std::move(im.cpu_executor));
  for (int s = 0; s < cuda_.slots; ++s) reset_slot(s);
  check(rt::stream_sync(im.stream), "start-up");
  graphs_ = std::make_unique<Graphs>();
  if (cuda_.profile) {
    cuda_.cuda_graphs = false;  // timing events around every call: eager launches
    prof_ = std::make_unique<Profile>();
  }
  name_ = "cuda bf16, experts contract (" + std::to_string(im.resident) + " of " +
          std::to_string(n_routed) + " routed experts in the GPU cache)";
}

CudaBackend::~CudaBackend() {
  if (impl_ && impl_->stream) rt::stream_sync(impl_->stream);
}

int64_t CudaBackend::gpu_resident_experts() const {
  return impl_->resident;
}
int64_t CudaBackend::routed_experts() const {
  return int64_t(c_.num_moe_layers()) * c_.moe.num_experts;
}

int CudaBackend::stage_threshold() {
  Impl& im = *impl_;
  if (im.stage_threshold >= 0) return im.stage_threshold;
  offload::HardwareProfile hw;
  const double t0 = now_s();
  if (!cuda_.hardware_file.empty()) {
    hw = offload::load_hardware(cuda_.hardware_file);
  } else {
    offload::MeasureOptions mo;
    mo.quick = true;
    mo.disk = false;
    mo.cpu_kernels = false;
    hw = offload::measure_hardware(mo);
  }
  offload::CostOptions co;  // staged by DMA straight from a page-locked host cache
  HostExpertSource* src = im.cpu_executor ? im.cpu_executor->host_source() : nullptr;
  co.staging_dma = src && src->pinned();
  offload::CostModel cm(hw, c_, co);
  const int thr = cm.prefill_stage_threshold();
  im.stage_threshold = thr;
  std::fprintf(
      stderr,
      "strata: prefill staging threshold %s tokens per expert (cost model from %s, %.1f s: "
      "staging %.2f ms + GPU vs CPU %.2f ms at 64 tokens)\n",
      thr == offload::CostModel::kNever ? "never" : std::to_string(thr).c_str(),
      cuda_.hardware_file.empty() ? "rates measured now; `strata bench hw --save F` and "
                                    "--hardware F skip this"
                                  : cuda_.hardware_file.c_str(),
      now_s() - t0, 1e3 * cm.stage_seconds(), 1e3 * cm.cpu_expert_seconds(64));
  return thr;
}

std::string CudaBackend::telemetry_line() const {
  const double pairs = double(tel_.gpu_expert_pairs + tel_.cpu_expert_pairs);
  const double per = tel_.steps ? 1e3 / double(tel_.steps) : 0.0;  // ms per step
  char b[768];
  std::snprintf(b, sizeof b,
                "gpu engine: %llu steps | expert pairs on GPU %.1f%%, CPU %.1f%% | staged %llu "
                "experts (%llu pairs, %llu by DMA from the host cache, host %.3f s) | CPU "
                "experts %.3f s, waiting for the GPU "
                "%.3f s (per step %.3f / %.3f ms) | H2D %.3f GB, D2H %.3f GB | CUDA graphs %llu "
                "captured, %llu launched | MoE layer-steps grouped on the GPU %llu | promotions "
                "%llu (%.3f GB, worker copy %.3f s)",
                (unsigned long long)tel_.steps,
                pairs > 0 ? 100.0 * double(tel_.gpu_expert_pairs) / pairs : 0.0,
                pairs > 0 ? 100.0 * double(tel_.cpu_expert_pairs) / pairs : 0.0,
                (unsigned long long)tel_.staged_experts, (unsigned long long)tel_.staged_pairs,
                (unsigned long long)tel_.staged_direct, tel_.stage_copy_s, tel_.cpu_expert_s,
                tel_.sync_wait_s, tel_.cpu_expert_s * per, tel_.sync_wait_s * per,
                tel_.h2d_bytes / 1e9, tel_.d2h_bytes / 1e9, (unsigned long long)tel_.graph_captures,
                (unsigned long long)tel_.graph_launches,
                (unsigned long long)tel_.device_group_layers, (unsigned long long)tel_.promotions,
                tel_.promote_bytes / 1e9, tel_.promote_copy_s);
  std::string line = b;
  if (prof_ && prof_->steps) {
    const Profile& p = *prof_;
    const double n = double(p.steps);
    double sum = 0;
    std::string parts;
    for (int k = 0; k < Profile::kNumKinds; ++k) {
      sum += p.ms[k];
      if (p.ms[k] <= 0) continue;
      char t[64];
      std::snprintf(t, sizeof t, "%s%s %.3f", parts.empty() ? "" : ", ", Profile::kKinds[k],
                    p.ms[k] / n);
      parts += t;
    }
    char t[160];
    std::snprintf(t, sizeof t, " | GPU ms per step: %s; sum %.3f of a %.3f ms span (eager)",
                  parts.c_str(), sum / n, p.span_ms / n);
    line += t;
  }
  return line;
}

std::vector<std::pair<std::string, double>> CudaBackend::telemetry_values() const {
  return {{"steps", double(tel_.steps)},
          {"gpu_expert_pairs", double(tel_.gpu_expert_pairs)},
          {"cpu_expert_pairs", double(tel_.cpu_expert_pairs)},
          {"gpu_experts", double(tel_.gpu_experts)},
          {"cpu_experts", double(tel_.cpu_experts)},
          {"cpu_expert_s", tel_.cpu_expert_s},
          {"wait_for_gpu_s", tel_.sync_wait_s},
          {"staged_experts", double(tel_.staged_experts)},
          {"staged_pairs", double(tel_.staged_pairs)},
          {"staged_direct", double(tel_.staged_direct)},
          {"stage_host_copy_s", tel_.stage_copy_s},
          {"h2d_gb", tel_.h2d_bytes / 1e9},
          {"d2h_gb", tel_.d2h_bytes / 1e9},
          {"graph_captures", double(tel_.graph_captures)},
          {"graph_launches", double(tel_.graph_launches)},
          {"device_group_layers", double(tel_.device_group_layers)},
          {"promotions", double(tel_.promotions)},
          {"promote_gb", tel_.promote_bytes / 1e9},
          {"promote_copy_s", tel_.promote_copy_s}};
}

void CudaBackend::reset_slot(int slot) {
  Impl& im = *impl_;
  pos_[size_t(slot)] = 0;
  const int64_t H = c_.kda.num_heads, P = c_.kda.proj_dim();
  std::vector<uint8_t> zeros;
  for (int l = 0; l < c_.num_layers; ++l) {
    LayerDev& d = im.layers[size_t(l)];
    if (d.kda_S) {
      const size_t nS = size_t(H * 128 * 128) * 4, nc = size_t(3 * P * 3) * 2;
      zeros.assign(std::max(nS, nc), 0);
      check(rt::copy_async(d.kda_S + size_t(slot) * (nS / 4), zeros.data(), nS, im.stream),
            "reset KDA state");
      check(rt::copy_async(d.kda_conv + size_t(slot) * (nc / 2), zeros.data(), nc, im.stream),
            "reset conv state");
      check(rt::stream_sync(im.stream), "reset");
    }
  }
}

uint64_t CudaBackend::state_bytes(int slot) const {
  const int64_t H = c_.kda.num_heads, P = c_.kda.proj_dim();
  return uint64_t(c_.num_kda_layers()) * (uint64_t(H * 128 * 128) * 4 + uint64_t(3 * P * 3) * 2) +
         uint64_t(c_.num_mla_layers()) * uint64_t(pos_[size_t(slot)]) * kernels::mla::kCacheDim * 2;
}

void CudaBackend::begin_step(const StepShape& s) {
  if (s.rows > cuda_.max_step_rows)
    throw Error("a step of " + std::to_string(s.rows) + " rows exceeds the backend's " +
                std::to_string(cuda_.max_step_rows) + " (--max-step-rows)");
  for (const SeqSpan& q : s.seqs)
    if (q.pos0 + q.T > cuda_.max_context)
      throw Error("sequence in slot " + std::to_string(q.slot) + " reaches position " +
                  std::to_string(q.pos0 + q.T) + ", beyond --max-context " +
                  std::to_string(cuda_.max_context));
  impl_->arena.used = 0;
  impl_->norm_bf16_of = nullptr;
  scan_pending_ = {};  // a step that failed part-way may have left one
  ++tel_.steps;
  if (prof_) {
    prof_->used = 0;
    prof_->marks.clear();
    prof_->step_a = prof_->take();
    check(rt::event_record(prof_->step_a, impl_->stream), "profile");
  }
  // A fresh non-finite record (eager, before the step's first graph segment).
  finite_sites_.clear();
  finite_read_ = 0;
  finite_shape_ = s;
  finite_downloaded_ = 0;
  check(rt::copy_async(impl_->finite_dev, impl_->finite_pin + 1, 8, impl_->stream),
        "non-finite record");
  Impl& im = *impl_;
  if (im.pos_pin) {  // MLA: each slot's position and the step's decode capacity
    if (im.pos_pending) check(rt::event_sync(im.pos_copied), "MLA positions");  // pos_pin is free
    int64_t longest = 1;
    for (const SeqSpan& q : s.seqs) {
      im.pos_pin[q.slot] = int32_t(q.pos0);
      longest = std::max(longest, q.pos0 + q.T);
    }
    im.mla_cap = mla_decode_cap(longest, cuda_.max_context);
    check(rt::copy_async(im.pos_dev, im.pos_pin, size_t(cuda_.slots) * 4, im.stream),
          "MLA positions");
    check(rt::event_record(im.pos_copied, im.stream), "MLA positions");
    im.pos_pending = true;
  }
  // Decode steps run from CUDA graphs, one set per step shape (and MLA decode capacity).
  Graphs& g = *graphs_;
  g.entry = nullptr;
  g.replaying = g.in_segment = false;
  g.next = 0;
  if (!cuda_.cuda_graphs || !s.decode()) return;
  std::string key = std::to_string(s.rows);
  for (const SeqSpan& q : s.seqs) key += "," + std::to_string(q.slot);
  if (im.pos_pin) key += ",L" + std::to_string(im.mla_cap);
  auto it = g.by_shape.find(key);
  if (it != g.by_shape.end() && !it->second.complete) {  // an earlier capture did not finish
    for (void* x : it->second.segments) rt::graph_destroy(x);
    g.by_shape.erase(it);
    it = g.by_shape.end();
  }
  if (it == g.by_shape.end()) {
    if (g.by_shape.size() >= Graphs::kMaxShapes) {  // bounded: drop the oldest shape
      auto old = g.by_shape.find(g.order.front());
      for (void* x : old->second.segments) rt::graph_destroy(x);
      g.by_shape.erase(old);
      g.order.pop_front();
    }
    g.entry = &g.by_shape[key];
    g.order.push_back(key);
  } else {
    g.entry = &it->second;
    g.replaying = true;
    if (profile_step_ > 0 && ++replayed_steps_ == profile_step_) {
      profiling_ = true;
      rt::profiler_start();
    }
  }
}

bool CudaBackend::graphable() {
  Graphs& g = *graphs_;
  if (g.entry && !g.in_segment) {
    g.in_segment = true;
    if (!g.replaying) check(rt::begin_capture(impl_->stream), "CUDA graph capture");
  }
  const bool issue = !g.entry || !g.replaying;
  flush_scan();
  return issue;
}

void CudaBackend::flush_scan() {
  if (!scan_pending_.x) return;
  const PendingScan p = scan_pending_;
  scan_pending_ = {};
  check(kops::finite_scan(p.x, p.n, p.site, impl_->finite_dev, impl_->stream), "non-finite scan");
}

void CudaBackend::eager_point() {
  flush_scan();  // into the open segment (or eagerly), before the record is read
  Graphs& g = *graphs_;
  if (!g.entry || !g.in_segment) return;
  g.in_segment = false;
  void* exec = nullptr;
  if (g.replaying) {
    STRATA_ASSERT(g.next < g.entry->segments.size());  // the same shape takes the same path
    exec = g.entry->segments[g.next++];
  } else {
    check(rt::end_capture(impl_->stream, &exec), "CUDA graph capture");
    g.entry->segments.push_back(exec);
    ++tel_.graph_captures;
  }
  check(rt::graph_launch(exec, impl_->stream), "CUDA graph launch");
  ++tel_.graph_launches;
}

Act CudaBackend::alloc(int64_t rows, int64_t cols) {
  Act a{static_cast<float*>(impl_->arena.take(size_t(rows * cols) * 4, "activation")), rows, cols};
  impl_->acts_mark = impl_->arena.used;
  return a;
}

void CudaBackend::check_finite(Act a, const StepShape&, int layer, const char* site) {
  ProfScope prof_scope(*this, Profile::finite);
  finite_sites_.push_back({layer, site, a.cols, nullptr});
  if (!graphable()) return;
  // Launched by the next launch point, or folded into the residual add that reads `a` next.
  scan_pending_ = {a.data, a.size(), uint32_t(finite_sites_.size() - 1)};
}

void CudaBackend::finite_download(bool enqueue) {
  STRATA_ASSERT(!scan_pending_.x);  // every launch point before this one flushed it
  finite_downloaded_ = finite_sites_.size();
  if (enqueue)
    check(rt::copy_async(impl_->finite_pin, impl_->finite_dev, 8, impl_->stream),
          "non-finite record");
}

void CudaBackend::finite_verdict() {
  finite_read_ = finite_downloaded_;
  const uint64_t v = impl_->finite_pin[0];
  if (v == kops::kFiniteClean) return;
  const uint64_t site = v >> (kops::kFiniteIndexBits + 2), cls = v & 3;
  const int64_t i = int64_t((v >> 2) & ((uint64_t(1) << kops::kFiniteIndexBits) - 1));
  STRATA_ASSERT(site < finite_sites_.size());
  const FiniteSite& f = finite_sites_[site];
  const float inf = std::numeric_limits<float>::infinity();
  const float x = cls == 0 ? std::numeric_limits<float>::quiet_NaN() : cls == 1 ? inf : -inf;
  if (f.unit) fail_row(x, i, f.cols, f.layer, f.site, f.unit);
  fail_at(x, i, f.cols, finite_shape_, f.layer, f.site);
}

void CudaBackend::commit_step(const StepShape& s) {
  eager_point();
  if (finite_read_ < finite_sites_.size()) {  // sites after the step's last synchronisation
    finite_download();
    check(rt::stream_sync(impl_->stream), "non-finite record");
    finite_verdict();
  }
  Graphs& g = *graphs_;
  if (g.entry) {
    if (g.replaying) STRATA_ASSERT(g.next == g.entry->segments.size());
    g.entry->complete = true;
    g.entry = nullptr;
  }
  for (const SeqSpan& q : s.seqs) pos_[size_t(q.slot)] += q.T;
  if (profiling_) {
    check(rt::stream_sync(impl_->stream), "profile");
    rt::profiler_stop();
    profiling_ = false;
  }
  promote_poll();
  if (prof_) {
    Profile& p = *prof_;
    void* end = p.take();
    check(rt::event_record(end, impl_->stream), "profile");
    check(rt::event_sync(end), "profile");
    for (const Profile::Mark& m : p.marks) p.ms[m.kind] += rt::event_elapsed_ms(m.a, m.b);
    p.span_ms += rt::event_elapsed_ms(p.step_a, end);
    ++p.steps;
  }
}

// Promotions (CudaBackendOptions::promote; the states in Impl). Called at every commit_step, when
// the step's work is enqueued and no graph capture is open.
void CudaBackend::promote_poll() {
  Impl& im = *impl_;
  if (im.promote_max == 0) return;
  // Switch in a batch whose copies are done; never wait for one.
  if (!im.promo.empty() && im.promo_finished.load(std::memory_order_acquire)) {
    if (!im.promo_error.empty()) throw Error("CUDA backend: promotion: " + im.promo_error);
    bool done = false;
    check(rt::event_query(im.promo_done, &done), "promotion");
    if (done) {
      for (const Impl::Promotion& p : im.promo) {
        im.layers[size_t(p.layer)].moe.gpu_slot[size_t(p.expert)] = p.slot;
        ++tel_.promotions;
        tel_.promote_bytes += double(im.expert_bytes);
        tel_.h2d_bytes += double(im.expert_bytes);
      }
      tel_.promote_copy_s += im.promo_copy_s;
      im.promo.clear();
    }
  }
  if (++im.promo_steps % uint64_t(cuda_.promote_interval) != 0) return;
  if (im.promo.empty()) {
    std::vector<const std::vector<int32_t>*> slots(im.layers.size());
    for (size_t l = 0; l < slots.size(); ++l) slots[l] = &im.layers[l].moe.gpu_slot;
    for (const PromotionPick& p :
         pick_promotions(im.heat, slots, im.promote_max, cuda_.promote_margin)) {
      std::vector<int32_t>& slot = im.layers[size_t(p.layer)].moe.gpu_slot;
      im.promo.push_back({p.layer, p.expert, p.victim, slot[size_t(p.victim)]});
      // The victim leaves the cache now: later steps compute it on the CPU, so only work already
      // enqueued (before promo_after) may read its slot.
      slot[size_t(p.victim)] = -1;
    }
    if (!im.promo.empty()) {
      check(rt::event_record(im.promo_after, im.stream), "promotion");
      im.promo_finished.store(false, std::memory_order_relaxed);
      {
        std::lock_guard<std::mutex> lk(im.promo_mu);
        im.promo_job = true;
      }
      im.promo_cv.notify_one();
    }
  }
  for (std::vector<float>& h : im.heat)  // a half-life of one interval
    for (float& x : h) x *= 0.5f;
}

// The worker thread of promotions: per batch, each expert's arrays from host memory (the mmapped
// checkpoint, possibly read from disk now, or experts quantized at load) into its pinned buffer
// with one plain memcpy (the TBB workers belong to the CPU experts of the steps meanwhile), then
// its DMA into the victim's slot on promote_stream, ordered after promo_after.
void CudaBackend::Impl::promote_worker(const Model& model, int device) {
  const kernels::Status dev = rt::set_device(device);
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(promo_mu);
      promo_cv.wait(lk, [&] { return promo_job || promo_quit; });
      if (promo_quit) return;
      promo_job = false;
    }
    std::string err = dev.ok() ? "" : std::string("cudaSetDevice: ") + dev.message;
    const double t0 = now_s();
    try {
      if (err.empty()) {
        check(rt::stream_wait(promote_stream, promo_after), "promotion");
        for (size_t i = 0; i < promo.size(); ++i) {
          const Promotion& p = promo[i];
          const ExpertWeights& ew =
              model.weights().layers[size_t(p.layer)].moe->experts[size_t(p.expert)];
          char* pin = promo_pin + i * expert_bytes;
          for_each_part(ew, [&](const uint8_t* src, size_t n, size_t off) {
            std::memcpy(pin + off, src, n);
          });
          check(rt::copy_async(cache_base + size_t(p.slot) * expert_bytes, pin, expert_bytes,
                               promote_stream),
                "promotion DMA");
        }
        check(rt::event_record(promo_done, promote_stream), "promotion");
      }
    } catch (const Error& e) {
      err = e.what();
    }
    promo_error = err;
    promo_copy_s = now_s() - t0;
    promo_finished.store(true, std::memory_order_release);
  }
}

void CudaBackend::reset_telemetry() {
  tel_ = {};
  if (prof_) {
    std::fill(std::begin(prof_->ms), std::end(prof_->ms), 0.0);
    prof_->span_ms = 0;
    prof_->steps = 0;
  }
}

void CudaBackend::to_host(Act a, float* dst) {
  eager_point();
  check(rt::copy_async(dst, a.data, size_t(a.size()) * 4, impl_->stream), "download");
  check(rt::stream_sync(impl_->stream), "download");
}
void CudaBackend::from_host(const float* src, Act a) {
  impl_->norm_bf16_of = nullptr;
  eager_point();
  check(rt::copy_async(a.data, src, size_t(a.size()) * 4, impl_->stream), "upload");
  check(rt::stream_sync(impl_->stream), "upload");
}
void CudaBackend::copy(Act src, Act dst) {
  ProfScope prof_scope(*this, Profile::copy);
  impl_->norm_bf16_of = nullptr;
  if (!graphable()) return;
  check(rt::copy_async(dst.data, src.data, size_t(src.size()) * 4, impl_->stream), "copy");
}

namespace {
// Scratch of one sublayer: taken after the step's activations, released when it goes out of scope.
struct Scratch {
  Bump& b;
  size_t mark;
  explicit Scratch(Bump& bump) : b(bump), mark(bump.used) {}
  ~Scratch() { b.used = mark; }
  template <typename T>
  T* take(int64_t n, const char* what) {
    return static_cast<T*>(b.take(size_t(n) * sizeof(T), what));
  }
};
}  // namespace

void CudaBackend::embed(std::span<const int32_t> ids, Act out) {
  ProfScope prof_scope(*this, Profile::embed);
  Impl& im = *impl_;
  im.norm_bf16_of = nullptr;  // activations written by other sublayers: no bf16 copy
  // The ids go through pinned memory (a fixed address, so a replayed graph's copy reads this
  // step's ids); nothing writes that staging again before the next routing synchronisation.
  std::memcpy(im.pinned, ids.data(), ids.size() * 4);
  if (!graphable()) return;
  Scratch sc(im.arena);
  auto* d_ids = sc.take<int32_t>(int64_t(ids.size()), "ids");
  check(rt::copy_async(d_ids, im.pinned, ids.size() * 4, im.stream), "ids upload");
  check(kops::embedding_gather(im.embed.p, c_.vocab_size, c_.hidden_size, d_ids,
                               int64_t(ids.size()), out.data, im.stream),
        "embedding_gather");
}

void CudaBackend::mix(int layer, MixSite site, std::span<const Act> sources, Act out) {
  ProfScope prof_scope(*this, Profile::mix);
  impl_->norm_bf16_of = nullptr;
  if (!graphable()) return;
  Impl& im = *impl_;
  kops::AttnResSources src;
  STRATA_ASSERT(int(sources.size()) <= kops::kMaxAttnResSources);
  for (const Act& a : sources) src.src[src.n++] = a.data;
  const float *nw, *pw;
  if (site == MixSite::output) {
    nw = im.out_norm_w.p, pw = im.out_proj_w.p;
  } else {
    const LayerDev& d = im.layers[size_t(layer)];
    nw = site == MixSite::attn ? d.attn_norm_w.p : d.mlp_norm_w.p;
    pw = site == MixSite::attn ? d.attn_proj_w.p : d.mlp_proj_w.p;
  }
  check(kops::attn_res_mix(src, nw, pw, out.data, out.rows, out.cols, c_.rms_norm_eps, true,
                           im.stream),
        "attn_res_mix");
}

void CudaBackend::norm(int layer, NormSite site, Act x, Act out) {
  ProfScope prof_scope(*this, Profile::norm);
  Impl& im = *impl_;
  // The bf16 copy of the output beside it: the next sublayer's GEMM input (input_bf16). Noted
  // before the replay check: a replayed segment's norm writes it as the captured one did.
  uint16_t* ob = out.size() <= im.norm_bf16_cap ? im.norm_bf16 : nullptr;
  im.norm_bf16_of = ob ? out.data : nullptr;
  im.norm_bf16_n = out.size();
  if (!graphable()) return;
  const float* w = site == NormSite::final   ? im.final_norm.p
                   : site == NormSite::input ? im.layers[size_t(layer)].input_norm.p
                                             : im.layers[size_t(layer)].post_norm.p;
  check(kops::kimi_rms_norm(x.data, w, out.data, x.rows, x.cols, c_.rms_norm_eps, true, im.stream,
                            ob),
        "kimi_rms_norm");
}

void CudaBackend::add(Act acc, Act b) {
  ProfScope prof_scope(*this, Profile::add);
  impl_->norm_bf16_of = nullptr;
  // The schedule checks a sublayer's output, then adds it: one pass does both.
  const PendingScan scan = scan_pending_;
  const bool fused = scan.x == b.data && scan.n == b.size();
  if (fused) scan_pending_ = {};
  if (!graphable()) return;
  if (fused)
    check(kops::add_inplace_scan(acc.data, b.data, acc.size(), true, scan.site, impl_->finite_dev,
                                 impl_->stream),
          "add");
  else
    check(kops::add_inplace(acc.data, b.data, acc.size(), true, impl_->stream), "add");
}

namespace {
// y = x·Wᵀ with the bf16 GEMM-output rounding: y fp32 (rounded) or bf16.
void gemm_f32(CudaBackend::Impl& im, const uint16_t* xb, const DevMatrix& W, float* y, int64_t T) {
  check(im.gemm->linear(xb, W.p, y, kernels::gemm::OutType::f32, T, W.rows, W.cols, im.stream),
        "GEMM");
  check(kops::round_bf16_inplace(y, T * W.rows, im.stream), "round");
}
void gemm_bf16(CudaBackend::Impl& im, const uint16_t* xb, const DevMatrix& W, uint16_t* y,
               int64_t T) {
  check(im.gemm->linear(xb, W.p, y, kernels::gemm::OutType::bf16, T, W.rows, W.cols, im.stream),
        "GEMM");
}
uint16_t* to_bf16(CudaBackend::Impl& im, Scratch& sc, const float* x, int64_t n) {
  auto* b = sc.take<uint16_t>(n, "bf16 input");
  check(kops::f32_to_bf16(x, b, n, im.stream), "f32_to_bf16");
  return b;
}

// The bf16 form of a sublayer's input x: the copy the norm that produced x wrote beside it
// (CudaBackend::norm), else converted into xb (or into scratch).
bool has_norm_bf16(const CudaBackend::Impl& im, Act x) {
  return x.data == im.norm_bf16_of && x.size() == im.norm_bf16_n;
}
uint16_t* input_bf16(CudaBackend::Impl& im, Act x, uint16_t* xb) {
  if (has_norm_bf16(im, x)) return im.norm_bf16;
  check(kops::f32_to_bf16(x.data, xb, x.size(), im.stream), "f32_to_bf16");
  return xb;
}
uint16_t* input_bf16(CudaBackend::Impl& im, Scratch& sc, Act x) {
  return has_norm_bf16(im, x) ? im.norm_bf16 : to_bf16(im, sc, x.data, x.size());
}
kops::GluParams glu_params(const cpu::ref::Glu& g) {
  kops::GluParams p;
  p.kind = g.kind == cpu::ref::GluKind::situ ? kops::GluKind::situ : kops::GluKind::silu;
  p.beta1 = g.beta1;
  p.beta2 = g.beta2;
  return p;
}
// A GLU MLP (dense layer, shared experts): out = round(down(round(glu(round(gate|up x))))).
void mlp(CudaBackend::Impl& im, const MlpDev& w, const kops::GluParams& act, const uint16_t* xb,
         float* out, int64_t T) {
  Scratch sc(im.arena);
  auto* gu = sc.take<float>(T * 2 * w.I, "gate|up");
  // gate|up's rounding happens as the GLU reads it, and h comes out as bf16 (glu_fused_bf16).
  check(im.gemm->linear(xb, w.gate_up.p, gu, kernels::gemm::OutType::f32, T, w.gate_up.rows,
                        w.gate_up.cols, im.stream),
        "GEMM");
  auto* hb = sc.take<uint16_t>(T * w.I, "glu");
  check(kops::glu_fused_bf16(act, gu, hb, T, w.I, im.stream), "glu");
  gemm_f32(im, hb, w.down, out, T);
}

// One grouped launch of contract experts (b's GLU set from the model's). Its output rows are
// rounded to bf16 like every GEMM output of the bf16 model (and like the CPU executor's rows) as
// the merge reads them (merge_weighted with round_bf16): the merge sees the same bits from either
// executor.
void grouped_launch(CudaBackend::Impl& im, kernels::moe::ExpertBatch b, const cpu::ref::Glu& glu,
                    void* wsp, size_t wsb) {
  b.glu.situ = glu.kind == cpu::ref::GluKind::situ;
  b.glu.beta1 = glu.beta1;
  b.glu.beta2 = glu.beta2;
  check(kernels::moe::grouped_experts(b, wsp, wsb, kernels::moe::ExpertPath::automatic, im.stream),
        "grouped_experts");
}
}  // namespace

namespace {
// lm_head · h[rows] into scratch [rows.size(), V] fp32: the rows gathered (one copy per run of
// consecutive rows), rounded to bf16, one GEMM.
float* head_logits(CudaBackend::Impl& im, Scratch& sc, const ModelConfig& c, Act h,
                   std::span<const int64_t> rows) {
  const int64_t D = c.hidden_size, V = c.vocab_size, n = int64_t(rows.size());
  auto* g = sc.take<float>(n * D, "head rows");
  for (int64_t i = 0; i < n;) {  // runs of consecutive rows, one copy each
    int64_t j = i + 1;
    while (j < n && rows[size_t(j)] == rows[size_t(j - 1)] + 1) ++j;
    check(
        rt::copy_async(g + i * D, h.data + rows[size_t(i)] * D, size_t((j - i) * D) * 4, im.stream),
        "head gather");
    i = j;
  }
  uint16_t* gb = to_bf16(im, sc, g, n * D);
  auto* y = sc.take<float>(n * V, "logits");
  gemm_f32(im, gb, im.lm_head, y, n);
  return y;
}
}  // namespace

void CudaBackend::logits(Act h, std::span<const int64_t> rows, float* out) {
  ProfScope prof_scope(*this, Profile::logits);
  eager_point();
  Impl& im = *impl_;
  Scratch sc(im.arena);
  const int64_t V = c_.vocab_size, n = int64_t(rows.size());
  float* y = head_logits(im, sc, c_, h, rows);
  // Through the pinned staging, logits_rows rows at a time; the verdict comes before the host
  // reads a value.
  for (int64_t r0 = 0; r0 < n; r0 += im.logits_rows) {
    const int64_t m = std::min(im.logits_rows, n - r0);
    check(rt::copy_async(im.logits_pin, y + r0 * V, size_t(m * V) * 4, im.stream),
          "logits download");
    if (r0 == 0) finite_download();
    check(rt::stream_sync(im.stream), "logits");
    if (r0 == 0) finite_verdict();
    parallel_copy(out + r0 * V, im.logits_pin, size_t(m * V) * 4);
  }
  tel_.d2h_bytes += double(n * V) * 4;
}

void CudaBackend::sample(Act h, std::span<const int64_t> rows, std::span<const TokenDraw> draws,
                         int64_t V, int32_t* ids) {
  STRATA_ASSERT(rows.size() == draws.size() && V == c_.vocab_size);
  const int64_t n = int64_t(rows.size());
  if (n == 0) return;
  Impl& im = *impl_;
  if (n > im.sample_rows) {  // more rows than the staging holds: through the host logits
    Backend::sample(h, rows, draws, V, ids);
    return;
  }
  ProfScope prof_scope(*this, Profile::logits);
  eager_point();
  Scratch sc(im.arena);
  float* y = head_logits(im, sc, c_, h, rows);
  // NaN/Inf in the logits: the device scan, its verdict after the sync below (named as the host
  // check names them: the index among the rows drawn).
  finite_sites_.push_back({-1, "logits", V, "logits row "});
  check(kops::finite_scan(y, n * V, uint32_t(finite_sites_.size() - 1), im.finite_dev, im.stream),
        "non-finite scan");
  auto* u_dev = sc.take<double>(n, "draw uniforms");
  auto* id_dev = sc.take<int32_t>(n, "drawn ids");
  bool random = false;
  for (int64_t i = 0; i < n; ++i) {
    const TokenDraw& d = draws[size_t(i)];
    random = random || !d.greedy();
    im.sample_u_pin[i] = d.u;
  }
  void* ws = nullptr;
  size_t wsb = 0;
  if (random) {
    check(rt::copy_async(u_dev, im.sample_u_pin, size_t(n) * 8, im.stream), "draw uniforms");
    wsb = kernels::sample::sample_workspace_bytes(int(n), int(V));
    ws = sc.take<uint8_t>(int64_t(wsb), "sampling workspace");
  }
  // One launch per run of rows with the same rule.
  auto params = [](const TokenDraw& d) {
    kernels::sample::SamplingParams p;
    p.temperature = d.greedy() ? 0.0f : d.temperature;
    p.top_k = d.top_k;
    p.top_p = d.top_p;
    return p;
  };
  for (int64_t i = 0; i < n;) {
    const kernels::sample::SamplingParams p = params(draws[size_t(i)]);
    int64_t j = i + 1;
    for (; j < n; ++j) {
      const kernels::sample::SamplingParams q = params(draws[size_t(j)]);
      if (q.temperature != p.temperature || q.top_k != p.top_k || q.top_p != p.top_p) break;
    }
    check(kernels::sample::sample(y + i * V, int(j - i), int(V), p, u_dev + i, id_dev + i, ws, wsb,
                                  im.stream),
          "sample");
    i = j;
  }
  check(rt::copy_async(im.sample_id_pin, id_dev, size_t(n) * 4, im.stream), "drawn ids");
  finite_download();
  check(rt::stream_sync(im.stream), "sample");
  finite_verdict();
  std::copy(im.sample_id_pin, im.sample_id_pin + n, ids);
  tel_.d2h_bytes += double(n) * 4;
}

// --------------------------------------------------------------------------------------------
// Token mixers

void CudaBackend::token_mixer(int l, const StepShape& s, Act x, Act out) {
  ProfScope prof_scope(*this, c_.is_kda(l) ? Profile::kda : Profile::mla);
  // KDA has no position-dependent host arguments, nor has MLA when every row decodes (the
  // positions come from the device): a graph segment. MLA prefill takes its positions and lengths
  // as host arguments: eager.
  if (c_.is_kda(l) || (s.decode() && opt_.mla_form != MlaForm::expanded)) {
    if (!graphable()) return;
  } else {
    eager_point();
  }
  Impl& im = *impl_;
  LayerDev& d = im.layers[size_t(l)];
  Scratch sc(im.arena);
  const int64_t T = x.rows;
  uint16_t* xb = input_bf16(im, sc, x);
  if (c_.is_kda(l)) {
    const auto& k = c_.kda;
    const int64_t H = k.num_heads, P = k.proj_dim();
    const KdaDev& w = d.kda;
    auto* qkv = sc.take<uint16_t>(T * 3 * P, "qkv");
    gemm_bf16(im, xb, w.qkv, qkv, T);
    auto* fa = sc.take<uint16_t>(T * w.f_a.rows, "f_a");
    gemm_bf16(im, xb, w.f_a, fa, T);
    auto* z = sc.take<uint16_t>(T * P, "z");
    gemm_bf16(im, fa, w.f_b, z, T);
    auto* bb = sc.take<uint16_t>(T * H, "b");
    gemm_bf16(im, xb, w.b, bb, T);
    auto* g = sc.take<uint16_t>(T * P, "g");
    if (k.full_rank_output_gate) {
      gemm_bf16(im, xb, w.g, g, T);
    } else {
      auto* ga = sc.take<uint16_t>(T * w.g_a.rows, "g_a");
      gemm_bf16(im, xb, w.g_a, ga, T);
      gemm_bf16(im, ga, w.g_b, g, T);
    }
    kernels::kda::Params p;
    p.H = int(H);
    p.conv_q = w.conv_q.p;
    p.conv_k = w.conv_k.p;
    p.conv_v = w.conv_v.p;
    p.gate_form = k.gate == KdaGateKind::bounded_sigmoid ? kernels::kda::GateForm::bounded
                                                         : kernels::kda::GateForm::softplus;
    p.A_log = w.A_log.p;
    p.dt_bias = w.dt_bias.p;
    p.lower_bound = k.gate_lower_bound;
    p.o_norm_w = w.o_norm.p;
    p.o_norm_eps = c_.rms_norm_eps;
    auto* y = sc.take<uint16_t>(T * P, "kda y");
    const size_t nS = size_t(H * 128 * 128), nc = size_t(3 * P * 3);
    // Decode rows (T == 1) of consecutive slots go in one call; prefill one sequence per call.
    for (size_t i = 0; i < s.seqs.size();) {
      const SeqSpan& q = s.seqs[i];
      kernels::kda::Inputs in;
      in.q = qkv + q.row0 * 3 * P;
      in.k = in.q + P;
      in.v = in.q + 2 * P;
      in.qkv_stride = 3 * P;
      in.z = z + q.row0 * P;
      in.b = bb + q.row0 * H;
      in.gate = g + q.row0 * P;
      kernels::kda::State st{d.kda_S + size_t(q.slot) * nS, d.kda_conv + size_t(q.slot) * nc};
      const bool chunked =
          opt_.kda_form == KdaForm::chunked || (opt_.kda_form == KdaForm::automatic && q.T > 1);
      if (!chunked && q.T == 1) {
        const size_t j = decode_run_end(s, i);
        check(kernels::kda::decode(p, in, int(j - i), st, y + q.row0 * P, nullptr, im.stream),
              "kda decode");
        i = j;
      } else {
        const int32_t cu[2] = {0, int32_t(q.T)};
        const size_t wsb = kernels::kda::prefill_workspace_bytes(int(H), 1, q.T);
        Scratch ws(im.arena);
        void* wsp = ws.take<uint8_t>(int64_t(wsb), "kda workspace");
        check(kernels::kda::prefill(p, in, cu, 1, st, y + q.row0 * P, wsp, wsb, im.stream),
              "kda prefill");
        ++i;
      }
    }
    gemm_f32(im, y, w.o, out.data, T);
  } else {
    const auto& m = c_.mla;
    const int64_t H = m.num_heads;
    const MlaDev& w = d.mla;
    auto* q = sc.take<uint16_t>(T * H * kernels::mla::kQDim, "q");
    if (m.q_lora_rank > 0) {
      auto* cq = sc.take<float>(T * m.q_lora_rank, "cq");
      auto* cqb = sc.take<uint16_t>(T * m.q_lora_rank, "bf16 cq");
      gemm_f32(im, xb, w.q_a, cq, T);
      check(kops::kimi_rms_norm(cq, w.q_a_norm.p, cq, T, m.q_lora_rank, kMlaNormEps, true,
                                im.stream, cqb),
            "q_a norm");
      gemm_bf16(im, cqb, w.q_b, q, T);
    } else {
      gemm_bf16(im, xb, w.q, q, T);
    }
    auto* ckv = sc.take<uint16_t>(T * kernels::mla::kCacheDim, "ckv");
    gemm_bf16(im, xb, w.kv_a, ckv, T);
    auto* o = sc.take<uint16_t>(T * H * kernels::mla::kV, "mla o");
    const int64_t stride = cuda_.max_context * kernels::mla::kCacheDim;
    // Runs of decode rows (decode_run_end) share one write_latent_decode and one decode_device,
    // both reading the positions from the device.
    for (size_t i = 0; i < s.seqs.size();) {
      const SeqSpan& sq = s.seqs[i];
      const size_t j = sq.T == 1 ? decode_run_end(s, i) : i + 1;
      if (sq.T == 1)
        check(kernels::mla::write_latent_decode(
                  ckv + sq.row0 * kernels::mla::kCacheDim, w.kv_a_norm.p, kMlaNormEps,
                  d.mla_cache + sq.slot * stride, stride, cuda_.max_context, im.pos_dev + sq.slot,
                  int(j - i), im.stream),
              "mla write_latent");
      else
        check(kernels::mla::write_latent(ckv + sq.row0 * kernels::mla::kCacheDim, w.kv_a_norm.p,
                                         kMlaNormEps, d.mla_cache + sq.slot * stride, sq.pos0, sq.T,
                                         im.stream),
              "mla write_latent");
      i = j;
    }
    for (size_t i = 0; i < s.seqs.size();) {
      const SeqSpan& sq = s.seqs[i];
      const bool expanded =
          opt_.mla_form == MlaForm::expanded || (opt_.mla_form == MlaForm::automatic && sq.T > 1);
      if (!expanded && sq.T == 1) {
        const size_t j = decode_run_end(s, i);
        const size_t wsb = kernels::mla::decode_workspace_bytes(int(H), int(j - i), im.mla_cap);
        Scratch ws(im.arena);
        void* wsp = ws.take<uint8_t>(int64_t(wsb), "mla decode workspace");
        check(kernels::mla::decode_device(int(H), q + sq.row0 * H * kernels::mla::kQDim,
                                          d.mla_cache + sq.slot * stride, stride,
                                          im.pos_dev + sq.slot, int(j - i), im.mla_cap, w.kv_b.p,
                                          o + sq.row0 * H * kernels::mla::kV, wsp, wsb, im.stream),
              "mla decode");
        i = j;
      } else {
        const int64_t S = sq.pos0 + sq.T;
        // Bounded: a chunk against a long cache expands it tile by tile (kernels/mla/mla.h).
        const size_t wsb =
            std::min(kernels::mla::prefill_workspace_bytes(int(H), S),
                     kernels::mla::prefill_workspace_bytes_bounded(int(H), cuda_.max_step_rows));
        Scratch ws(im.arena);
        void* wsp = ws.take<uint8_t>(int64_t(wsb), "mla prefill workspace");
        check(kernels::mla::prefill(int(H), q + sq.row0 * H * kernels::mla::kQDim,
                                    d.mla_cache + sq.slot * stride, S, w.kv_b.p,
                                    o + sq.row0 * H * kernels::mla::kV, sq.T, wsp, wsb, im.stream),
              "mla prefill");
        ++i;
      }
    }
    if (m.output_gate) {
      auto* g = sc.take<uint16_t>(T * H * kernels::mla::kV, "mla gate");
      gemm_bf16(im, xb, w.g, g, T);
      check(kops::sigmoid_gate_bf16(o, g, T * H * kernels::mla::kV, im.stream), "mla gate");
    }
    gemm_f32(im, o, w.o, out.data, T);
  }
}

// --------------------------------------------------------------------------------------------
// FFN: dense MLP or MoE across the GPU cache and the CPU.

// After the merge: one rounding, the latent norm and up-projection, the shared experts' add.
void CudaBackend::moe_tail(int l, int64_t T, float* acc, uint16_t* accb, const float* shared,
                           Act out) {
  Impl& im = *impl_;
  const MoeDev& w = im.layers[size_t(l)].moe;
  const auto& mo = c_.moe;
  const int64_t L = c_.expert_in_dim(), D = c_.hidden_size;
  if (mo.latent_size > 0) {
    if (mo.latent_norm)  // its bf16 output is the up-projection's input
      check(kops::kimi_rms_norm(acc, w.latent_norm.p, acc, T, L, c_.rms_norm_eps, true, im.stream,
                                accb),
            "latent norm");
    else
      check(kops::f32_to_bf16(acc, accb, T * L, im.stream), "f32_to_bf16");
    gemm_f32(im, accb, w.latent_up, out.data, T);
  } else {
    check(rt::copy_async(out.data, acc, size_t(T * D) * 4, im.stream), "copy");
  }
  if (shared) check(kops::add_inplace(out.data, shared, T * D, true, im.stream), "add shared");
}

void CudaBackend::ffn(int l, const StepShape& s, Act x, Act out) {
  ProfScope prof_scope(*this, c_.is_moe(l) ? Profile::moe : Profile::mlp);
  Impl& im = *impl_;
  LayerDev& d = im.layers[size_t(l)];
  const int64_t T = x.rows, D = c_.hidden_size;
  const kops::GluParams act = glu_params(model_.glu());
  if (!c_.is_moe(l)) {  // dense MLP: one graph segment in decode
    if (!graphable()) return;
    Scratch sc(im.arena);
    uint16_t* xb = input_bf16(im, sc, x);
    mlp(im, d.dense, act, xb, out.data, T);
    return;
  }
  const auto& mo = c_.moe;
  const MoeDev& w = d.moe;
  const MoeWeights& hw = *model_.weights().layers[size_t(l)].moe;
  const int64_t E = mo.num_experts, K = mo.top_k, L = c_.expert_in_dim(), I = mo.intermediate_size;
  if (opt_.on_moe_input) {  // router lookahead sees the host copy of the router input
    std::vector<float> xh(size_t(T * D));
    to_host(x, xh.data());
    opt_.on_moe_input(l, xh.data(), T);
  }
  // Every buffer of fixed size first, in a fixed order, so a decode step's graph segments (A:
  // router to the host copies; C: merge to the residual input) see the same addresses every
  // step; the lists whose sizes the routing decides come after (B, eager).
  Scratch sc(im.arena);
  const int64_t P = T * K;
  auto* xb = sc.take<uint16_t>(T * D, "bf16 input");
  auto* logits = sc.take<float>(T * E, "router logits");
  auto* ids = sc.take<int32_t>(T * K, "ids");
  auto* wts = sc.take<float>(T * K, "weights");
  float* z = mo.latent_size > 0 ? sc.take<float>(T * L, "latent") : x.data;
  auto* ybuf = sc.take<float>(P * L, "expert outputs");
  auto* d_toff = sc.take<int32_t>(T + 1, "token offsets");
  auto* d_pair = sc.take<int32_t>(P, "pairs");
  auto* d_mw = sc.take<float>(P, "merge weights");
  auto* acc = sc.take<float>(T * L, "merge");
  auto* accb = mo.latent_size > 0 ? sc.take<uint16_t>(T * L, "bf16 merge") : nullptr;
  float* shared = w.has_shared ? sc.take<float>(T * D, "shared") : nullptr;
  const size_t wsb = kernels::moe::experts_workspace_bytes(int(T), int(P), int(L), int(I));
  void* wsp = sc.take<uint8_t>(int64_t(wsb), "expert workspace");
  // In decode with graphs the shared experts run in segment C; otherwise beside the CPU experts.
  const bool shared_late = graphs_->entry != nullptr;
  // Every expert resident and nothing on the host wants the routing: groups built on the device.
  const bool routing_traced = trace_ && (trace_->record_routing || trace_->replay_routing);
  const bool device_groups = mo.mxfp4 && w.all_resident && !routing_traced && !opt_.on_moe_input &&
                             P <= kernels::moe::kMaxGroupPairs && cuda_.device_groups;
  // 1. Router (fp32 logits of the bf16 input, never rounded), top-k on the device; latent input.
  kops::RouterParams rp;
  rp.E = int(E);
  rp.topk = int(K);
  rp.form = mo.router_form == RouterWeightForm::bias_in_place ? kops::RouterForm::biased_in_place
                                                              : kops::RouterForm::unbiased;
  rp.renormalize = mo.renormalize;
  rp.scaling = mo.routed_scaling_factor;
  rp.bias = w.bias.p;
  if (device_groups) {
    tel_.gpu_expert_pairs += uint64_t(P);
    ++tel_.device_group_layers;
    if (!graphable()) return;
    xb = input_bf16(im, x, xb);
    check(im.gemm->linear(xb, w.router.p, logits, kernels::gemm::OutType::f32, T, E, D, im.stream),
          "router GEMM");
    check(kops::route(logits, rp, ids, wts, T, im.stream), "route");
    if (mo.latent_size > 0) gemm_f32(im, xb, w.latent_down, z, T);
    const int g_cap = int(std::min<int64_t>(P, E));
    auto* d_views = sc.take<Mxfp4ExpertView>(g_cap, "views");
    auto* d_goff = sc.take<int32_t>(g_cap + 1, "group offsets");
    auto* d_ptok = sc.take<int32_t>(P, "pair tokens");
    check(kernels::moe::build_groups(ids, int(P), int(K), w.slot_dev, im.views_dev, g_cap, d_views,
                                     d_goff, d_ptok, d_pair, im.stream),
          "build_groups");
    grouped_launch(im,
                   {d_views, d_goff, d_ptok, z, ybuf, g_cap, int(P), int(T), int(L), int(I), {}},
                   model_.glu(), wsp, wsb);
    if (shared) mlp(im, w.shared, act, xb, shared, T);
    // Pairs of token t are rows t·K … of the merge lists: its experts in increasing id (route's
    // order), weights aligned with the ids.
    check(kernels::moe::merge_weighted(ybuf, im.token_offsets_dev, d_pair, wts, acc, int(T), int(L),
                                       im.stream, true),
          "merge");
    moe_tail(l, T, acc, accb, shared, out);
    return;
  }
  char* pin = im.pinned;
  auto* h_ids = reinterpret_cast<int32_t*>(pin);
  pin += align_up(size_t(T * K) * 4);
  auto* h_w = reinterpret_cast<float*>(pin);
  pin += align_up(size_t(T * K) * 4);
  auto* h_z = reinterpret_cast<float*>(pin);
  pin += align_up(size_t(T * L) * 4);
  if (graphable()) {
    xb = input_bf16(im, x, xb);
    check(im.gemm->linear(xb, w.router.p, logits, kernels::gemm::OutType::f32, T, E, D, im.stream),
          "router GEMM");
    check(kops::route(logits, rp, ids, wts, T, im.stream), "route");
    if (mo.latent_size > 0) gemm_f32(im, xb, w.latent_down, z, T);
    // 2. Ids, weights and the expert input to the host (pinned staging).
    check(rt::copy_async(h_ids, ids, size_t(T * K) * 4, im.stream), "ids download");
    check(rt::copy_async(h_w, wts, size_t(T * K) * 4, im.stream), "weights download");
    check(rt::copy_async(h_z, z, size_t(T * L) * 4, im.stream), "latent download");
  }
  finite_download(graphable());  // a replayed segment holds the copy already
  eager_point();
  // Experts outside the GPU cache will run on the CPU right after this wait (decode): its
  // workers may spin through it instead of sleeping.
  if (s.decode() && !w.all_resident && im.cpu_executor) im.cpu_executor->warm();
  double t0 = now_s();
  check(rt::stream_sync(im.stream), "routing");
  tel_.sync_wait_s += now_s() - t0;
  finite_verdict();  // before the host uses ids computed from a non-finite input
  for (int64_t i = 0; i < T * K; ++i)
    if (h_ids[i] < 0 || h_ids[i] >= E)
      throw Error("MoE layer " + std::to_string(l) + ": the router returned expert id " +
                  std::to_string(h_ids[i]) + ", outside [0, " + std::to_string(E) + ")");
  tel_.d2h_bytes += double(T * K * 8 + T * L * 4);
  MoeRouting r;
  r.T = T;
  r.top_k = K;
  r.ids.assign(h_ids, h_ids + T * K);
  r.weights.assign(h_w, h_w + T * K);
  if (trace_ && s.single()) {
    const int64_t pos0 = s.seqs[0].pos0;
    if (trace_->replay_routing) {
      std::vector<float> lh(size_t(T * E));
      check(rt::copy_async(lh.data(), logits, lh.size() * 4, im.stream), "logits download");
      check(rt::stream_sync(im.stream), "logits download");
      apply_replay(*trace_->replay_routing, l, pos0, lh.data(), c_, hw.router_bias.data(), r);
    }
    if (trace_->record_routing) record_routing(*trace_->record_routing, l, pos0, r);
  }
  // 3. Groups. Resident experts run from the GPU cache; an expert outside it with at least the
  // staging threshold's tokens is copied host → GPU and run there (prefill); the rest run on the
  // CPU. Pair rows: resident [0, Pr), staged [Pr, Pr + Ps), CPU after.
  std::vector<ExpertTask> tasks = group_by_expert(r);
  if (!im.heat.empty() && !im.heat[size_t(l)].empty())
    for (const ExpertTask& t : tasks)
      im.heat[size_t(l)][size_t(t.expert)] += float(t.tokens.size());
  std::vector<const ExpertTask*> resident, staged;
  std::vector<ExpertTask> cpu_tasks;
  int max_tokens = 0;
  for (const ExpertTask& t : tasks)
    if (w.gpu_slot[size_t(t.expert)] < 0) max_tokens = std::max(max_tokens, int(t.tokens.size()));
  const int thr = im.stage_slots > 0 && max_tokens > 1 ? stage_threshold() : kNoStaging;
  for (const ExpertTask& t : tasks) {
    if (w.gpu_slot[size_t(t.expert)] >= 0)
      resident.push_back(&t);
    else if (int(t.tokens.size()) >= thr)
      staged.push_back(&t);
    else
      cpu_tasks.push_back(t);
  }
  std::vector<int32_t> pair_of_slot(size_t(T * K), -1);  // (token·K + j) → pair row
  int Pg = 0;                                            // pairs on the GPU (resident + staged)
  for (const std::vector<const ExpertTask*>* list : {&resident, &staged})
    for (const ExpertTask* t : *list)
      for (size_t i = 0; i < t->tokens.size(); ++i) pair_of_slot[size_t(t->slots[i])] = Pg++;
  int Pc = 0;
  for (ExpertTask& t : cpu_tasks)
    for (size_t i = 0; i < t.slots.size(); ++i) {
      pair_of_slot[size_t(t.slots[i])] = Pg + Pc;
      t.slots[i] = Pc++;  // the CPU executor writes its rows compactly
    }
  tel_.gpu_expert_pairs += uint64_t(Pg);
  tel_.cpu_expert_pairs += uint64_t(Pc);
  tel_.gpu_experts += uint64_t(resident.size() + staged.size());
  tel_.cpu_experts += uint64_t(cpu_tasks.size());
  // Merge lists: per token its K experts in increasing id (r.ids is ascending per token).
  auto* h_toff = reinterpret_cast<int32_t*>(pin);
  pin += align_up(size_t(T + 1) * 4);
  auto* h_pair = reinterpret_cast<int32_t*>(pin);
  pin += align_up(size_t(T * K) * 4);
  auto* h_mw = reinterpret_cast<float*>(pin);
  pin += align_up(size_t(T * K) * 4);
  for (int64_t t = 0; t <= T; ++t) h_toff[t] = int32_t(t * K);
  for (int64_t q = 0; q < T * K; ++q) {
    h_pair[q] = pair_of_slot[size_t(q)];
    h_mw[q] = r.weights[size_t(q)];
  }
  auto* h_ycpu = reinterpret_cast<float*>(pin);
  pin += align_up(size_t(Pc) * size_t(L) * 4);
  // 4. Device: the lists, the resident experts, the staged rounds, the shared experts.
  check(rt::copy_async(d_toff, h_toff, size_t(T + 1) * 4, im.stream), "upload");
  check(rt::copy_async(d_pair, h_pair, size_t(P) * 4, im.stream), "upload");
  check(rt::copy_async(d_mw, h_mw, size_t(P) * 4, im.stream), "upload");
  const auto glu = model_.glu();
  // One grouped launch over `groups` (views in device memory at `views`), writing pair rows
  // pair0 … of ybuf. Lists go through pinned memory that stays untouched until the launch ran
  // (each launch takes its own part of the staging area).
  // bf16 experts (Kimi-Linear, ExpertNumerics::bf16): per group, its tokens' rows of z gathered
  // into bf16 (in the expert workspace), then the expert as the dense MLP runs (mlp: w1 and w3
  // adjacent in the slot are one [2I, L] gate|up matrix, w2 the down one) into the group's pair
  // rows, with the bf16 model's roundings.
  auto bf16_groups = [&](int G, const Mxfp4ExpertView* views, const int32_t* goff,
                         const int32_t* d_rows, const float* x, float* y, void* ws, size_t wsb_) {
    for (int g = 0; g < G; ++g) {
      const int64_t n = goff[g + 1] - goff[g];
      if (n == 0) continue;
      if (size_t(n * L) * 2 > wsb_)
        throw Error("CUDA backend: bf16 experts: a group of " + std::to_string(n) +
                    " tokens exceeds the expert workspace (" + std::to_string(wsb_) + " bytes)");
      auto* xg = static_cast<uint16_t*>(ws);
      check(kops::gather_rows_bf16(x, d_rows + goff[g], n, L, xg, im.stream), "bf16 experts");
      const MlpDev e{{reinterpret_cast<const uint16_t*>(views[g].w1_packed), 2 * I, L},
                     {reinterpret_cast<const uint16_t*>(views[g].w2_packed), L, I},
                     I};
      mlp(im, e, act, xg, y + int64_t(goff[g]) * L, n);
    }
  };
  int pair0 = 0;
  auto launch = [&](const std::vector<const ExpertTask*>& groups,
                    const std::function<Mxfp4ExpertView(size_t)>& view_of) {
    if (groups.empty()) return;
    const int G = int(groups.size());
    auto* h_views = reinterpret_cast<Mxfp4ExpertView*>(pin);
    pin += align_up(size_t(G) * sizeof(Mxfp4ExpertView));
    auto* h_goff = reinterpret_cast<int32_t*>(pin);
    pin += align_up(size_t(G + 1) * 4);
    auto* h_ptok = reinterpret_cast<int32_t*>(pin);
    int np = 0;
    h_goff[0] = 0;
    for (int g = 0; g < G; ++g) {
      h_views[g] = view_of(size_t(g));
      for (int32_t tok : groups[size_t(g)]->tokens) h_ptok[np++] = tok;
      h_goff[g + 1] = np;
    }
    pin += align_up(size_t(np) * 4);
    STRATA_ASSERT(size_t(pin - im.pinned) <= im.pinned_bytes);
    auto* d_views = sc.take<Mxfp4ExpertView>(G, "views");
    auto* d_goff = sc.take<int32_t>(G + 1, "group offsets");
    auto* d_ptok = sc.take<int32_t>(np, "pair tokens");
    check(rt::copy_async(d_views, h_views, size_t(G) * sizeof(Mxfp4ExpertView), im.stream),
          "upload");
    check(rt::copy_async(d_goff, h_goff, size_t(G + 1) * 4, im.stream), "upload");
    check(rt::copy_async(d_ptok, h_ptok, size_t(np) * 4, im.stream), "upload");
    tel_.h2d_bytes += double(G * int64_t(sizeof(Mxfp4ExpertView)) + (G + 1 + np) * 4);
    if (mo.mxfp4) {
      grouped_launch(im,
                     {d_views,
                      d_goff,
                      d_ptok,
                      z,
                      ybuf + int64_t(pair0) * L,
                      G,
                      np,
                      int(T),
                      int(L),
                      int(I),
                      {}},
                     glu, wsp, wsb);
    } else {
      bf16_groups(G, h_views, h_goff, d_ptok, z, ybuf + int64_t(pair0) * L, wsp, wsb);
    }
    pair0 += np;
  };
  launch(resident,
         [&](size_t g) { return im.views_host[size_t(w.gpu_slot[size_t(resident[g]->expert)])]; });
  // Staged rounds: a round copies up to stage_slots experts into one half of the device slots
  // and computes them; the next round fills the other half meanwhile. The bytes come from the
  // executor's host source when it has one (the tiered store: host cache hits, disk reads for the
  // rest), else from the checkpoint's pages. From a page-locked cache each expert is DMA'd
  // straight out of its slot on the copy stream (the slot held until its event completes);
  // otherwise copied on the host into one of two pinned buffers, then DMA'd.
  HostExpertSource* src = im.cpu_executor ? im.cpu_executor->host_source() : nullptr;
  const bool direct = src && src->pinned();
  struct InFlight {
    HeldExpert held;
    void* done;
  };
  // Held experts whose DMA may still read their slot; drained (waited for, then released)
  // before the store's next consumer runs and on every exit, an exception's included.
  struct Drain {
    std::deque<InFlight> q;
    void pop() {
      check(rt::event_sync(q.front().done), "staging");
      q.pop_front();
    }
    // Releases the experts whose DMA has completed (in order), so the store's slots serve reads
    // (a disk share's stream) instead of waiting for the hold cap.
    void pop_done() {
      bool done = true;
      while (!q.empty() && done) {
        check(rt::event_query(q.front().done, &done), "staging");
        if (done) q.pop_front();
      }
    }
    ~Drain() {
      for (const InFlight& f : q) rt::event_sync(f.done);
    }
  } inflight;
  // At most slots() experts held at once (the store's rule): room for the next acquire.
  const size_t hold_cap = src && !im.stage_ev.empty()
                              ? size_t(std::min<uint64_t>(im.stage_ev.size() - 1, src->slots() - 1))
                              : 0;
  // The staged experts are required a window of stage_slots ahead of the next acquire, in staging
  // order: the store's reads (disk placements) run on across the rounds instead of draining at
  // each round's end, with no more experts claimed and not yet acquired than a round has.
  std::vector<int> stage_ids(staged.size());
  for (size_t i = 0; i < staged.size(); ++i) stage_ids[i] = staged[i]->expert;
  // On any exit before the last acquire (an exception), what was required and not acquired is
  // cancelled (an acquire that throws has ended its own claim).
  struct Required {
    HostExpertSource* src;
    int layer;
    const std::vector<int>& ids;
    size_t next = 0, end = 0;  // next to acquire; required up to end
    void upto(size_t k) {
      k = std::min(k, ids.size());
      if (k > end)
        src->require(layer, std::span<const int>(ids.data() + end, k - end), int(ids.size()));
      end = std::max(end, k);
    }
    ~Required() {
      for (size_t j = next; j < end; ++j) src->cancel(layer, ids[j]);
    }
  };
  std::optional<Required> req;
  if (src) req.emplace(Required{src, int(l), stage_ids});
  for (size_t first = 0, round = 0; first < staged.size();
       first += size_t(im.stage_slots), ++round) {
    const size_t n = std::min(staged.size() - first, size_t(im.stage_slots));
    const int h = int(round % 2);
    uint8_t* half = im.stage_dev + size_t(h) * size_t(im.stage_slots) * im.expert_bytes;
    check(rt::stream_wait(im.copy_stream, im.half_free[h]), "staging");
    const double tc = now_s();
    for (size_t i = 0; i < n; ++i) {
      const int e = stage_ids[first + i];
      HeldExpert held;
      const ExpertWeights* ew = &hw.experts[size_t(e)];
      if (src) {
        inflight.pop_done();
        while (!inflight.q.empty() && inflight.q.size() >= hold_cap) inflight.pop();
        req->upto(first + i + size_t(im.stage_slots));
        req->next = first + i + 1;
        held = src->acquire(int(l), e, *ew);
        ew = &held.weights;
      }
      uint8_t* dev = half + i * im.expert_bytes;
      if (direct) {
        for_each_part(*ew, [&](const uint8_t* from, size_t bytes, size_t off) {
          check(rt::copy_async(dev + off, from, bytes, im.copy_stream), "staging DMA");
        });
        void* done = im.stage_ev[size_t(tel_.staged_experts % im.stage_ev.size())];
        check(rt::event_record(done, im.copy_stream), "staging");
        inflight.q.push_back({std::move(held), done});
        ++tel_.staged_direct;
      } else {
        const int pb = int(tel_.staged_experts % 2);
        check(rt::event_sync(im.pin_done[pb]), "staging");
        char* dst = im.stage_pin + size_t(pb) * im.expert_bytes;
        for_each_part(*ew, [&](const uint8_t* from, size_t bytes, size_t off) {
          parallel_copy(dst + off, from, bytes);
        });
        check(rt::copy_async(dev, dst, im.expert_bytes, im.copy_stream), "staging DMA");
        check(rt::event_record(im.pin_done[pb], im.copy_stream), "staging");
      }
      ++tel_.staged_experts;
      tel_.staged_pairs += staged[first + i]->tokens.size();
      tel_.h2d_bytes += double(im.expert_bytes);
    }
    tel_.stage_copy_s += now_s() - tc;
    check(rt::event_record(im.copies_done, im.copy_stream), "staging");
    check(rt::stream_wait(im.stream, im.copies_done), "staging");
    std::vector<const ExpertTask*> groups(staged.begin() + int64_t(first),
                                          staged.begin() + int64_t(first + n));
    launch(groups, [&](size_t g) {
      return view_at(hw.experts[size_t(groups[g]->expert)], half + g * im.expert_bytes, int(L),
                     int(I));
    });
    check(rt::event_record(im.half_free[h], im.stream), "staging");
  }
  {  // the store's next consumer (the CPU executor below) may need every slot
    const double tc = now_s();
    while (!inflight.q.empty()) inflight.pop();
    tel_.stage_copy_s += now_s() - tc;
  }
  if (shared && !shared_late) mlp(im, w.shared, act, xb, shared, T);
  tel_.h2d_bytes += double(P * 12);
  // 5. Host: the experts that missed the GPU cache, computed while the GPU runs the above.
  if (Pc > 0) {
    const double tc = now_s();
    ExpertLayer el;
    el.layer = l;
    el.weights = &hw;
    el.config = &c_;
    el.glu = model_.glu();
    el.in_dim = L;
    el.intermediate = I;
    im.cpu_executor->run(el, cpu_tasks, h_z, h_ycpu, Precision::bf16);
    tel_.cpu_expert_s += now_s() - tc;
    check(rt::copy_async(ybuf + int64_t(Pg) * L, h_ycpu, size_t(Pc) * size_t(L) * 4, im.stream),
          "expert rows upload");
    tel_.h2d_bytes += double(Pc) * double(L) * 4;
  }
  // 6. Merge in expert-id order, one rounding; latent norm and up-projection; shared experts.
  if (!graphable()) return;
  if (shared && shared_late) mlp(im, w.shared, act, xb, shared, T);
  check(kernels::moe::merge_weighted(ybuf, d_toff, d_pair, d_mw, acc, int(T), int(L), im.stream,
                                     true),
        "merge");
  moe_tail(l, T, acc, accb, shared, out);
  // The pinned staging is reused by the next MoE layer: its uploads must have run by then (the
  // next layer's routing sync waits for the whole stream).
}

}  // namespace strata::engine
#endif  // STRATA_HAVE_CUDA
