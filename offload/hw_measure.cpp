// Measuring a HardwareProfile (see hw_measure.h). The loops moved here from tools/bench_io.cpp and
// tools/bench_cpu_experts.cpp, which now call them, so `bench hw`, `bench io` and
// `bench cpu-experts` measure the same way.
#include "offload/hw_measure.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <tbb/parallel_for.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "cpu/bf16_linear.h"
#include "cpu/expert_kernels_impl.h"
#include "cpu/mixer_kernels.h"
#include "cpu/ref/ops.h"
#include "cpu/row_ops.h"
#include "cpu/topology.h"
#include "offload/format.h"
#include "storage/error.h"
#include "storage/expert_reader.h"

#ifdef STRATA_HAVE_CUDA
#include "kernels/peaks.h"
#endif

namespace strata::offload {

namespace fs = std::filesystem;

namespace {
double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}
}  // namespace

RateSample sample_of(std::vector<double> seconds) {
  STRATA_ASSERT(!seconds.empty());
  std::sort(seconds.begin(), seconds.end());
  const size_t n = seconds.size();
  RateSample s;
  s.repeats = int(n);
  s.min_s = seconds.front();
  s.max_s = seconds.back();
  s.median_s = n % 2 ? seconds[n / 2] : 0.5 * (seconds[n / 2 - 1] + seconds[n / 2]);
  return s;
}

RateSample time_repeats(const std::function<void()>& fn, int repeats, int warmup,
                        const std::function<void()>& before) {
  STRATA_ASSERT(repeats > 0);
  for (int i = 0; i < warmup; i++) fn();
  std::vector<double> t, cpu;
  for (int i = 0; i < repeats; i++) {
    if (before) before();
    const double c0 = process_cpu_s();
    auto a = std::chrono::steady_clock::now();
    fn();
    auto b = std::chrono::steady_clock::now();
    cpu.push_back(process_cpu_s() - c0);
    t.push_back(std::chrono::duration<double>(b - a).count());
  }
  RateSample s = sample_of(std::move(t));
  s.cpu_median_s = sample_of(std::move(cpu)).median_s;
  return s;
}

BoundBuffer::BoundBuffer(const cpu::Topology& topo, size_t bytes)
    : topo_(topo), bytes_(bytes), p_(static_cast<uint8_t*>(topo.alloc_bound(bytes))) {}
BoundBuffer::~BoundBuffer() {
  topo_.free_bound(p_, bytes_);
}

void fill_random(uint8_t* p, size_t n, uint64_t seed, int lo, int hi) {
  const size_t chunk = size_t(1) << 20;
  tbb::parallel_for(size_t(0), (n + chunk - 1) / chunk, [&](size_t c) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + c * 0xBF58476D1CE4E5B9ull + 1;
    for (size_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      p[i] = uint8_t(lo + int((s >> 24) % uint64_t(hi - lo + 1)));
    }
  });
}

RateSample measure_host_read(tbb::task_arena& arena, const cpu::Topology& topo, size_t bytes,
                             int repeats, std::string* note) {
  const size_t chunk = size_t(4) << 20;  // 4 MiB per task
  bytes = std::max(chunk, bytes / chunk * chunk);
  BoundBuffer buf(topo, bytes);
  arena.execute([&] { fill_random(buf.data(), bytes, 99); });
  const bool avx512 = cpu::isa_supported(cpu::ExpertIsa::avx512);
  volatile uint64_t sink = 0;
  RateSample s = time_repeats(
      [&] {
        arena.execute([&] {
          tbb::parallel_for(size_t(0), bytes / chunk, [&](size_t c) {
            const uint8_t* q = buf.data() + c * chunk;
            uint64_t v = 0;
            if (avx512) {
              v = cpu::detail::stream_read_avx512(q, chunk);
            } else {
              const uint64_t* w = reinterpret_cast<const uint64_t*>(q);
              for (size_t i = 0; i < chunk / 8; i += 4) v += w[i] ^ w[i + 1] ^ w[i + 2] ^ w[i + 3];
            }
            sink = sink + v;
          });
        });
      },
      repeats, 1);
  s.bytes = double(bytes);
  if (note) *note = avx512 ? "AVX-512 loads" : "64-bit loads";
  return s;
}

// ------------------------------------------------------------------------------------------------
// CPU expert kernel

struct CpuExpertProbe::Call {
  std::vector<float> x, y;
  std::vector<int> rows;
  std::vector<std::vector<cpu::ExpertTask>> tasks;  // per group
  cpu::CpuExpertOptions opt;
  int M = 0;
  size_t next = 0;
};

CpuExpertProbe::CpuExpertProbe(const cpu::Topology& topo, cpu::PinnedArena& arena, int experts,
                               int hidden, int inter, int groups)
    : arena_(arena),
      experts_(std::max(1, experts)),
      hidden_(hidden),
      expert_bytes_(3ull * (uint64_t(inter) * uint64_t(hidden) / 2 +
                            uint64_t(inter) * uint64_t(hidden) / 32)),
      pool_(topo, expert_bytes_ * size_t(experts_) * size_t(std::max(1, groups))) {
  STRATA_ASSERT(hidden % 32 == 0 && inter % 32 == 0);
  const size_t packed = size_t(inter) * size_t(hidden) / 2,
               scale = size_t(inter) * size_t(hidden) / 32;
  const int n = experts_ * std::max(1, groups);
  arena.arena().execute([&] {
    for (int e = 0; e < n; ++e) {
      uint8_t* base = pool_.data() + expert_bytes_ * size_t(e);
      fill_random(base, 3 * packed, uint64_t(e) * 3 + 1);
      fill_random(base + 3 * packed, 3 * scale, uint64_t(e) * 3 + 2, 117, 121);
    }
  });
  for (int e = 0; e < n; ++e) {
    const uint8_t* p = pool_.data() + expert_bytes_ * size_t(e);
    const uint8_t* s = p + 3 * packed;
    Mxfp4ExpertView v;
    v.w1_packed = p, v.w3_packed = p + packed, v.w2_packed = p + 2 * packed;
    v.w1_scale = s, v.w3_scale = s + scale, v.w2_scale = s + 2 * scale;
    v.hidden = hidden, v.inter = inter;
    views_.push_back(v);
  }
}

CpuExpertProbe::~CpuExpertProbe() = default;

namespace {
// The probes' activations (a fixed ramp in [-1, 1]) and GLU (K3's SiTU).
std::vector<float> probe_activations(size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = float(int(i * 2654435761u % 2001) - 1000) * 1e-3f;
  return x;
}
constexpr GluParams kProbeGlu{true, 4.0, 25.0};
}  // namespace

std::function<void()> CpuExpertProbe::prepare(int M, cpu::CpuExpertOptions opt) {
  STRATA_ASSERT(M >= 1);
  auto c = std::make_unique<Call>();
  const int H = hidden_;
  const size_t n = size_t(experts_);
  c->M = M;
  c->x = probe_activations(size_t(M) * H);
  c->rows.resize(size_t(M));
  for (int i = 0; i < M; ++i) c->rows[size_t(i)] = i;
  c->y.resize(n * size_t(M) * H);  // every call writes the same outputs
  // All of a group's experts per call, the groups in turn.
  const size_t groups = views_.size() / n;
  for (size_t g = 0; g < groups; ++g) {
    c->tasks.emplace_back();
    for (size_t e = 0; e < n; ++e)
      c->tasks.back().push_back(
          {views_[g * n + e], c->rows.data(), M, c->y.data() + e * size_t(M) * H});
  }
  c->opt = opt;
  if (!c->opt.arena) c->opt.arena = &arena_.arena();
  std::shared_ptr<Call> call = std::move(c);
  return [call] {
    const auto& tasks = call->tasks[call->next++ % call->tasks.size()];
    cpu::run_experts_cpu(tasks, call->x.data(), call->M, kProbeGlu, call->opt);
  };
}

std::function<void()> CpuExpertProbe::prepare_routed(int T, int k, cpu::CpuExpertOptions opt,
                                                     double* experts) {
  STRATA_ASSERT(T >= 1 && k >= 1 && k <= experts_);
  struct Routing {
    std::vector<std::vector<int32_t>> tokens, slots;  // per touched expert
    std::vector<cpu::ExpertTask> tasks;
    std::vector<const int32_t*> slot_rows;
  };
  struct Routed {
    std::vector<float> x, out, w, acc;
    std::vector<Routing> routings;
    cpu::RoutedExperts routed;
    cpu::CpuExpertOptions opt;
    int T = 0, k = 0, H = 0;
    size_t next = 0;
  };
  auto c = std::make_shared<Routed>();
  const int H = hidden_;
  c->T = T, c->k = k, c->H = H;
  c->x = probe_activations(size_t(T) * H);
  c->out.resize(size_t(T) * size_t(k) * H);
  c->acc.resize(size_t(T) * H);
  c->w.assign(size_t(T) * size_t(k), 1.0f / float(k));
  const size_t groups = views_.size() / size_t(experts_);
  const size_t n_routings = std::max<size_t>(16, groups);
  std::mt19937 rng(uint32_t(T) * 7919u + uint32_t(k));
  std::vector<int32_t> order(static_cast<size_t>(experts_));
  double touched = 0;
  for (size_t i = 0; i < n_routings; ++i) {
    const size_t g = i % groups;
    Routing r;
    r.tokens.resize(size_t(experts_));
    r.slots.resize(size_t(experts_));
    for (int t = 0; t < T; ++t) {
      // k distinct experts (a partial shuffle), ascending as the router's top-k ids.
      for (size_t e = 0; e < order.size(); ++e) order[e] = int32_t(e);
      for (int j = 0; j < k; ++j)
        std::swap(order[size_t(j)], order[size_t(j) + std::uniform_int_distribution<size_t>(
                                                          0, order.size() - 1 - size_t(j))(rng)]);
      std::sort(order.begin(), order.begin() + k);
      for (int j = 0; j < k; ++j) {
        r.tokens[size_t(order[size_t(j)])].push_back(t);
        r.slots[size_t(order[size_t(j)])].push_back(t * k + j);
      }
    }
    for (size_t e = 0; e < size_t(experts_); ++e) {
      if (r.tokens[e].empty()) continue;
      r.tasks.push_back(
          {views_[g * size_t(experts_) + e], r.tokens[e].data(), int(r.tokens[e].size()), nullptr});
      r.slot_rows.push_back(r.slots[e].data());
    }
    touched += double(r.tasks.size());
    c->routings.push_back(std::move(r));
  }
  if (experts) *experts = touched / double(n_routings);
  c->opt = opt;
  if (!c->opt.arena) c->opt.arena = &arena_.arena();
  return [c] {
    Routing& r = c->routings[c->next++ % c->routings.size()];
    c->routed.run(r.tasks, r.slot_rows, c->x.data(), c->T, kProbeGlu, c->opt, c->out.data(), true);
    cpu::merge_routed_fast(c->out.data(), c->w.data(), c->acc.data(), c->T, c->k, c->H);
  };
}

// ------------------------------------------------------------------------------------------------
// Disk

ExpertLayout write_expert_test_file(const fs::path& path, uint64_t bytes) {
  const uint64_t header = 123457;  // a safetensors header: experts start unaligned
  const int n = bytes > header ? int((bytes - header) / kK3ExpertBytes) : 0;
  if (n < 4)
    throw Error(path.string() + ": test file of " + format_bytes(double(bytes)) +
                " is too small for 4 K3-sized experts");
  const uint64_t total = align_up(header + uint64_t(n) * kK3ExpertBytes);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
  const bool direct = fd >= 0;
  if (fd < 0) fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(path.string() + ": cannot create: " + std::strerror(errno));
  const uint64_t chunk = 8ull << 20;
  void* buf = mmap(nullptr, chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  STRATA_ASSERT(buf != MAP_FAILED);
  std::mt19937_64 rng(1);
  for (uint64_t off = 0; off < total; off += chunk) {
    auto* w = static_cast<uint64_t*>(buf);
    for (uint64_t i = 0; i < chunk / 8; i++) w[i] = rng();
    const uint64_t len = std::min(chunk, total - off);
    if (::pwrite(fd, buf, len, off_t(off)) != ssize_t(len)) {
      const int err = errno;
      ::close(fd);
      munmap(buf, chunk);
      std::error_code ec;
      fs::remove(path, ec);
      throw Error(path.string() + ": write failed: " + std::strerror(err) + " (disk full?)");
    }
  }
  munmap(buf, chunk);
  ::fsync(fd);
  if (!direct) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  ExpertLayout L;
  L.files = {path};
  L.num_layers = 1;
  L.num_experts = n;
  L.spans.resize(size_t(n));
  for (int e = 0; e < n; e++)
    L.spans[size_t(e)] = {{0, header + uint64_t(e) * kK3ExpertBytes, kK3ExpertBytes}};
  return L;
}

struct RawDirectReader::Ring {
  io_uring ring;
};

RawDirectReader::RawDirectReader(const ExpertLayout& L, uint64_t block, int qd)
    : L_(L), block_(block), qd_(qd), ring_(std::make_unique<Ring>()) {
  for (auto& f : L.files) {
    int fd = ::open(f.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      for (int o : fds_) ::close(o);
      throw Error(f.string() + ": cannot open with O_DIRECT: " + std::strerror(err));
    }
    fds_.push_back(fd);
  }
  int rc = io_uring_queue_init(unsigned(qd), &ring_->ring, 0);
  if (rc < 0) {
    for (int o : fds_) ::close(o);
    throw Error(std::string("io_uring unavailable: ") + std::strerror(-rc));
  }
  // Huge pages as in the store's arena: fewer segments per read (virtio-blk limits them).
  buf_ = static_cast<uint8_t*>(mmap(nullptr, block * uint64_t(qd), PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  STRATA_ASSERT(buf_ != MAP_FAILED);
  madvise(buf_, block * uint64_t(qd), MADV_HUGEPAGE);
  std::memset(buf_, 0, block * uint64_t(qd));
  iovec iov{buf_, size_t(block * uint64_t(qd))};
  fixed_ = io_uring_register_buffers(&ring_->ring, &iov, 1) == 0;
}

RawDirectReader::~RawDirectReader() {
  io_uring_queue_exit(&ring_->ring);
  munmap(buf_, block_ * uint64_t(qd_));
  for (int fd : fds_) ::close(fd);
}

uint64_t RawDirectReader::read(const std::vector<std::pair<int, int>>& pick) {
  struct Req {
    int fd;
    uint64_t off, len;
  };
  std::vector<Req> reqs;
  uint64_t bytes = 0;
  for (auto [l, e] : pick)
    for (const FileSpan& sp : L_.at(l, e)) {
      uint64_t lo = align_down(sp.offset), hi = align_up(sp.offset + sp.nbytes);
      for (uint64_t o = lo; o < hi; o += block_)
        reqs.push_back({fds_[size_t(sp.file)], o, std::min(block_, hi - o)});
      bytes += sp.nbytes;
    }
  io_uring* ring = &ring_->ring;
  size_t next = 0, done = 0;
  std::vector<int> free_slots;
  for (int i = 0; i < qd_; i++) free_slots.push_back(i);
  while (done < reqs.size()) {
    while (!free_slots.empty() && next < reqs.size()) {
      int s = free_slots.back();
      free_slots.pop_back();
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      uint8_t* dst = buf_ + uint64_t(s) * block_;
      const unsigned len = unsigned(reqs[next].len);
      if (fixed_)
        io_uring_prep_read_fixed(sqe, reqs[next].fd, dst, len, off_t(reqs[next].off), 0);
      else
        io_uring_prep_read(sqe, reqs[next].fd, dst, len, off_t(reqs[next].off));
      io_uring_sqe_set_data64(sqe, uint64_t(s));
      next++;
    }
    io_uring_submit_and_wait(ring, 1);
    io_uring_cqe* cqe;
    while (io_uring_peek_cqe(ring, &cqe) == 0) {
      if (cqe->res < 0)
        throw Error(L_.files.front().string() +
                    ": O_DIRECT read failed: " + std::strerror(-cqe->res));
      free_slots.push_back(int(io_uring_cqe_get_data64(cqe)));
      io_uring_cqe_seen(ring, cqe);
      done++;
    }
  }
  return bytes;
}

RateSample measure_disk_read(const fs::path& dir, uint64_t file_bytes, int repeats, uint64_t block,
                             int qd) {
  const fs::path path = dir / ("strata-bench-hw-" + std::to_string(::getpid()) + ".bin");
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove(p, ec);
    }
  } cleanup{path};
  const ExpertLayout L = write_expert_test_file(path, file_bytes);
  RawDirectReader rr(L, block, qd);
  std::mt19937 rng(7);
  const int per_repeat = std::min(16, L.num_experts);
  // Distinct random experts per repeat; with a small file, repeats reuse experts, which O_DIRECT
  // still reads from the disk (no page cache).
  uint64_t bytes = 0;
  RateSample s = time_repeats(
      [&] {
        std::vector<int> ids(size_t(L.num_experts));
        for (int i = 0; i < L.num_experts; i++) ids[size_t(i)] = i;
        std::shuffle(ids.begin(), ids.end(), rng);
        std::vector<std::pair<int, int>> pick;
        for (int i = 0; i < per_repeat; i++) pick.emplace_back(0, ids[size_t(i)]);
        bytes = rr.read(pick);
      },
      repeats, 1);
  s.bytes = double(bytes);
  return s;
}

// ------------------------------------------------------------------------------------------------
// The whole profile

namespace {

MeasuredLine make_line(std::string name, std::string shape, const RateSample& t,
                       std::string peak_name, double peak, std::string note = {}) {
  MeasuredLine l;
  l.name = std::move(name);
  l.shape = std::move(shape);
  l.time = t;
  l.peak_name = std::move(peak_name);
  l.peak = peak;
  l.note = std::move(note);
  return l;
}

}  // namespace

namespace {
// The reference MLA probes' shapes (8 heads at K3's head widths) and their kv_b (bf16 ones).
struct MlaRefProbe {
  cpu::ref::MlaDims d;
  std::vector<uint16_t> kvb;
  cpu::ref::WeightView kv_b;
  MlaRefProbe() {
    d.H = 8, d.nope = 128, d.rope = 64, d.v = 128, d.kv_lora = 512;
    kvb.assign(size_t(d.H * (d.nope + d.v) * d.kv_lora), 0x3C00);
    kv_b = cpu::ref::WeightView::bf16(kvb.data(), d.H * (d.nope + d.v), d.kv_lora);
  }
  MlaRefProbe(const MlaRefProbe&) = delete;  // kv_b points into kvb
  MlaRefProbe& operator=(const MlaRefProbe&) = delete;
};
}  // namespace

HardwareProfile measure_hardware(const MeasureOptions& o) {
  HardwareProfile hw = probe_static();
  hw.description = "this machine, measured by strata bench hw" +
                   std::string(o.quick ? " --quick" : "") +
                   (o.cpu_time ? " --cpu-time (CPU rates from CPU time / threads)" : "");
  auto progress = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  auto emit = [&](const MeasuredLine& l) {
    if (o.line) o.line(l);
  };
  const int reps = o.quick ? 3 : 5;
  cpu::Topology topo;
  const int threads = o.threads > 0 ? std::min(o.threads, topo.cores()) : topo.cores();
  cpu::PinnedArena arena(topo, threads);
  tbb::task_arena plain(threads);  // the same thread count, not pinned: how the engine runs
  const std::string thr = std::to_string(threads) + " thr";
  // --cpu-time: CPU seconds / threads stand for the wall time (see MeasureOptions::cpu_time).
  auto eff = [&](RateSample s) {
    if (o.cpu_time && s.cpu_median_s > 0) {
      const double f = s.cpu_median_s / threads / s.median_s;
      s.median_s *= f, s.min_s *= f, s.max_s *= f;
    }
    return s;
  };
  const std::string basis = o.cpu_time ? ", CPU time / threads" : "";

  // Host memory read: the peak every CPU line is compared with.
  double mem_gbps = 0;
  {
    const size_t bytes = (o.quick ? size_t(512) : size_t(2048)) << 20;
    progress("host memory read");
    std::string note;
    // Threads pinned by hwloc and threads left to the OS (as the engine's CPU work runs): the
    // faster of the two is the peak (on a shared VM a pinned thread can sit on a busy vCPU).
    // A peak is the best repeat (a median of a few 0.1 s streams moved by 10 % between runs of the
    // same machine, and every host roofline with it); at least 5 repeats.
    const int rr = std::max(reps, 5);
    RateSample s = eff(measure_host_read(arena.arena(), topo, bytes, rr, &note));
    RateSample u = eff(measure_host_read(plain, topo, bytes, rr, nullptr));
    const bool pinned_best = s.best_gbps() >= u.best_gbps();
    note += std::string(", ") + (pinned_best ? "pinned" : "unpinned") +
            fmt(" threads (pinned %.1f GB/s, unpinned %.1f GB/s, best of %.0f)", s.best_gbps(),
                u.best_gbps(), rr);
    if (!pinned_best) s = u;
    mem_gbps = s.best_gbps();
    const std::string shape = std::to_string(bytes >> 20) + " MiB stream, " + thr;
    hw.host.mem_read_gbps = Rate(mem_gbps, "measured: " + shape + ", " + note + basis);
    emit(make_line("hw/host memory read (peak)", shape, s, "itself", mem_gbps, note));
  }

  // Disk O_DIRECT.
  if (o.disk) {
    const fs::path dir = o.disk_dir.empty() ? fs::temp_directory_path() : o.disk_dir;
    const double gib = o.disk_file_gib > 0 ? o.disk_file_gib : o.quick ? 0.5 : 1.0;
    progress(fmt("disk O_DIRECT read (%.2g GiB test file)", gib));
    try {
      RateSample s = measure_disk_read(dir, uint64_t(gib * double(1ull << 30)), reps);
      hw.disk.count = 1;
      hw.disk.what = "the filesystem of " + dir.string();
      const std::string shape = "16 x 17.55 MB experts, 1 MiB, QD 32";
      hw.disk.read_gbps =
          Rate(s.gbps(), "measured: io_uring O_DIRECT, " + shape + ", " + dir.string());
      emit(make_line("hw/disk O_DIRECT read (peak)", shape, s, "itself", s.gbps(),
                     "io_uring, " + dir.string()));
    } catch (const Error& e) {
      hw.not_measured.push_back(std::string("disk read: ") + e.what());
    }
  } else {
    hw.not_measured.push_back("disk read: skipped (--no-disk)");
  }

  // Our CPU kernels.
  if (o.cpu_kernels) {
    // M = 2: batched decode (8 sequences over 64 experts) gives about 2 tokens per expert, and
    // 2-4 take the few-token kernel — a point the curve should not interpolate.
    const std::vector<int> Ms = !o.expert_tokens.empty() ? o.expert_tokens
                                : o.quick                ? std::vector<int>{1, 16}
                                                         : std::vector<int>{1, 2, 4, 16, 64};
    const int experts = o.quick ? 8 : 16;
    progress("CPU MXFP4 expert kernel");
    const cpu::ExpertIsa isa = cpu::best_isa();
    CpuExpertProbe probe(topo, arena, experts);
    cpu::CpuExpertWorkspace ws;
    cpu::CpuExpertOptions opt;
    opt.isa = isa;
    opt.workspace = &ws;
    // The curve the cost model uses runs as the engine's executor does (cpu::pin_expert_threads:
    // hwloc-pinned workers, the probe's arena, or the caller's unpinned arena); one M=1 line of
    // the other way beside it.
    const bool pin = cpu::pin_expert_threads();
    const char* how = pin ? " (pinned)" : " (not pinned)";
    opt.arena = pin ? nullptr : &plain;
    RateCurve c;
    const std::string shape_e = "3584->3072->3584 x" + std::to_string(experts) + ", " + thr;
    const std::string isa_note = std::string(cpu::isa_name(isa)) + ", contract";
    for (int M : Ms) {
      RateSample s =
          eff(time_repeats(probe.prepare(M, opt), M >= 64 ? std::max(1, reps / 2) : reps, 1));
      s.bytes = double(kK3ExpertBytes) * experts;
      c.points.push_back({M, s.gbps()});
      MeasuredLine l = make_line("hw/cpu expert M=" + std::to_string(M), shape_e, s,
                                 "host memory read", mem_gbps, isa_note);
      l.flops = 2.0 * M * 3.0 * kK3ExpertInter * kK3ExpertHidden * experts;
      emit(l);
    }
    {
      cpu::CpuExpertOptions other = opt;
      other.arena = pin ? &plain : nullptr;  // nullptr: the probe's hwloc-pinned arena
      RateSample s = eff(time_repeats(probe.prepare(1, other), reps, 1));
      s.bytes = double(kK3ExpertBytes) * experts;
      emit(make_line(
          pin ? "hw/cpu expert M=1 (threads not pinned)" : "hw/cpu expert M=1 (pinned threads)",
          shape_e, s, "host memory read", mem_gbps,
          isa_note + "; not how the engine runs, not used by the cost model"));
    }
    c.source = std::string("measured: cpu::run_experts_cpu, ") + cpu::isa_name(isa) + ", " +
               std::to_string(experts) + " K3-shaped experts, " + thr + how + basis;
    hw.kernels.cpu_expert = c;
    {
      // Small experts (a latent MoE's shape): 64 per call as a MoE layer's, 16 groups in turn
      // (320 MB, ≫ the last-level cache, as a model's layers).
      const int small_experts = 64, groups = o.quick ? 4 : 16;
      CpuExpertProbe sp(topo, arena, small_experts, kSmallExpertHidden, kSmallExpertInter, groups);
      RateCurve cs;
      const std::string shape_s =
          std::to_string(kSmallExpertHidden) + "->" + std::to_string(kSmallExpertInter) + "->" +
          std::to_string(kSmallExpertHidden) + " x" + std::to_string(small_experts) + " (" +
          std::to_string(groups) + " groups in turn), " + thr;
      for (int M : Ms) {
        RateSample s =
            eff(time_repeats(sp.prepare(M, opt), M >= 64 ? std::max(1, reps / 2) : reps, 1));
        s.bytes = double(sp.expert_bytes()) * small_experts;
        cs.points.push_back({M, s.gbps()});
        MeasuredLine l = make_line("hw/cpu expert small M=" + std::to_string(M), shape_s, s,
                                   "host memory read", mem_gbps, isa_note);
        l.flops = 2.0 * M * 3.0 * kSmallExpertInter * kSmallExpertHidden * small_experts;
        emit(l);
      }
      cs.source = std::string("measured: cpu::run_experts_cpu, ") + cpu::isa_name(isa) + ", " +
                  shape_s + how + basis;
      hw.kernels.cpu_expert_small = cs;
    }

    // The fp32 reference linear on bf16 weights [N, K]: 64 MiB ≫ LLC, like a model's weights.
    progress("fp32 reference trunk (cpu::ref::linear)");
    {
      const int64_t N = 32768, K = 1024;
      std::vector<uint16_t> w(size_t(N * K));
      for (size_t i = 0; i < w.size(); ++i)
        w[i] = uint16_t(0x3C00 | ((i * 2654435761u >> 24) & 0xFF));
      const cpu::ref::WeightView W = cpu::ref::WeightView::bf16(w.data(), N, K);
      RateCurve t;
      for (int M : o.quick ? std::vector<int>{1, 32} : std::vector<int>{1, 4, 32, 128}) {
        std::vector<float> x(size_t(M * K), 0.01f), y(size_t(M * N));
        RateSample s = eff(time_repeats(
            [&] { arena.arena().execute([&] { cpu::ref::linear(x.data(), W, y.data(), M); }); },
            M >= 32 ? std::max(1, reps / 2) : reps, 1));
        s.bytes = double(N * K * 2);
        t.points.push_back({M, s.gbps()});
        MeasuredLine l = make_line("hw/cpu reference trunk M=" + std::to_string(M),
                                   "bf16 [32768, 1024], " + thr, s, "host memory read", mem_gbps,
                                   "the fp32 oracle's linear (what strata run does today)");
        l.flops = 2.0 * double(N * K) * M;
        emit(l);
      }
      t.source = "measured: cpu::ref::linear, bf16 [32768, 1024], " + thr + basis +
                 " (the fp32 reference: what `strata run` on the CPU runs today)";
      hw.kernels.cpu_trunk_ref = t;
    }

    // The token mixers' probes, the same for the fp32 reference ops and the fast CPU backend's
    // kernels: `who` names the lines, `fn` the function in the rate's source, `ar` the arena that
    // runs it (the reference pinned, the fast kernels unpinned as the engine runs them).
    // Decode KDA: the state [H, V, K] fp32 read and written per token, 64 distinct states (32
    // MiB), as a model's layers touch different states.
    auto kda_decode_rate = [&](tbb::task_arena& ar, const std::string& who, const std::string& fn,
                               auto&& kernel) {
      const int64_t H = 8, K = 128, V = 128, T = 1;
      std::vector<float> q(size_t(T * H * K), 0.01f), k(q), g(q.size(), -0.01f),
          v(size_t(T * H * V), 0.02f), beta(size_t(T * H), 0.5f), out(v.size());
      const int states = 64;
      std::vector<std::vector<float>> S(states, std::vector<float>(size_t(H * V * K), 0.0f));
      int next = 0;
      RateSample s = eff(time_repeats(
          [&] {
            ar.execute([&] {
              for (int i = 0; i < states; ++i)
                kernel(q.data(), k.data(), v.data(), g.data(), beta.data(),
                       S[size_t((next + i) % states)].data(), out.data(), T, H, K, V, 0.088f);
            });
            next++;
          },
          reps, 1));
      s.bytes = 2.0 * double(H * V * K * 4) * states;
      const std::string shape = "T=1, 8 x 128 x 128, 64 states, " + thr;
      emit(make_line("hw/cpu " + who + " KDA decode", shape, s, "host memory read", mem_gbps,
                     "state bytes read + written"));
      return Rate(s.gbps(), "measured: " + fn + ", " + shape + basis);
    };
    // Absorbed MLA decode of one token over a 4096-position fp32 latent cache, FLOPs per second.
    auto mla_decode_rate = [&](tbb::task_arena& ar, const std::string& who, const std::string& fn,
                               auto&& kernel) {
      const MlaRefProbe mp;
      const cpu::ref::MlaDims& d = mp.d;
      const int64_t S = o.quick ? 2048 : 4096;
      std::vector<float> q(size_t(d.H * d.q_dim()), 0.01f), cache(size_t(S * d.cache_dim()), 0.02f),
          out(size_t(d.H * d.v));
      RateSample s = eff(time_repeats(
          [&] { ar.execute([&] { kernel(q.data(), cache.data(), S, mp.kv_b, d, out.data()); }); },
          reps, 1));
      s.bytes = double(S * d.cache_dim() * 4);
      const double flops =
          2.0 * double(d.H) *
          (double(S) * double(2 * d.kv_lora + d.rope) + double(d.kv_lora) * double(d.nope + d.v));
      const std::string shape = "T=1, 8 heads, 512+64, context " + std::to_string(S) + ", " + thr;
      MeasuredLine l = make_line("hw/cpu " + who + " MLA decode", shape, s, "host memory read",
                                 mem_gbps, "fp32 latent cache");
      l.flops = flops;
      emit(l);
      return Rate(flops / s.median_s / 1e9, "measured: " + fn + ", " + shape + basis);
    };
    // The prefill forms: chunked KDA and expanded MLA over a fresh prompt of T tokens (no peak
    // beside them: `peak` says why).
    auto kda_prefill_rate = [&](tbb::task_arena& ar, const std::string& who, const std::string& fn,
                                const std::string& peak, auto&& kernel) {
      const int64_t T = o.quick ? 128 : 256, H = 8, K = 128, V = 128;
      std::vector<float> q(size_t(T * H * K), 0.01f), k(q), g(q.size(), -0.01f),
          v(size_t(T * H * V), 0.02f), beta(size_t(T * H), 0.5f), out(v.size()),
          S(size_t(H * V * K));
      RateSample s = eff(time_repeats(
          [&] {
            ar.execute([&] {
              std::fill(S.begin(), S.end(), 0.0f);
              kernel(q.data(), k.data(), v.data(), g.data(), beta.data(), S.data(), out.data(), T,
                     H, K, V, 0.088f);
            });
          },
          reps, 1));
      const double flops = double(T) * double(H) * (10.0 * 64 * K + 6.0 * K * K);
      const std::string shape = "T=" + std::to_string(T) + ", 8 x 128 x 128, chunk 64, " + thr;
      MeasuredLine l = make_line("hw/cpu " + who + " KDA prefill", shape, s, peak, 0, "");
      l.flops = flops;
      l.peak_is_bandwidth = false;
      emit(l);
      return Rate(flops / s.median_s / 1e9, "measured: " + fn + ", " + shape + basis);
    };
    auto mla_prefill_rate = [&](tbb::task_arena& ar, const std::string& who, const std::string& fn,
                                const std::string& peak, auto&& kernel) {
      const MlaRefProbe mp;
      const cpu::ref::MlaDims& d = mp.d;
      const int64_t T = o.quick ? 128 : 256;
      std::vector<float> q(size_t(T * d.H * d.q_dim()), 0.01f),
          cache(size_t(T * d.cache_dim()), 0.02f), out(size_t(T * d.H * d.v));
      RateSample s = eff(time_repeats(
          [&] { ar.execute([&] { kernel(q.data(), cache.data(), T, mp.kv_b, d, out.data()); }); },
          reps, 1));
      const double pairs = double(T) * double(T + 1) / 2;
      const double flops = 2.0 * double(d.H) * double(d.q_dim() + d.v) * pairs +
                           2.0 * double(T) * double(d.kv_lora) * double(d.H * (d.nope + d.v));
      const std::string shape = "T=S=" + std::to_string(T) + ", 8 heads, 512+64, " + thr;
      MeasuredLine l = make_line("hw/cpu " + who + " MLA prefill", shape, s, peak, 0,
                                 "causal pairs + kv_b expansion counted");
      l.flops = flops;
      l.peak_is_bandwidth = false;
      emit(l);
      return Rate(flops / s.median_s / 1e9, "measured: " + fn + ", " + shape + basis);
    };
    using cpu::ref::MlaDims;
    using cpu::ref::WeightView;
    constexpr auto kFp32 = cpu::ref::Precision::fp32, kBf16 = cpu::ref::Precision::bf16;

    progress("fp32 reference KDA and MLA decode");
    hw.kernels.cpu_kda_ref_state_gbps =
        kda_decode_rate(arena.arena(), "reference", "cpu::ref::kda_recurrent",
                        [](auto... a) { cpu::ref::kda_recurrent(a...); });
    hw.kernels.cpu_mla_ref_gflops = mla_decode_rate(
        arena.arena(), "reference", "cpu::ref::mla_attention_absorbed",
        [](const float* q, const float* c, int64_t S, const WeightView& kv_b, const MlaDims& d,
           float* out) { cpu::ref::mla_attention_absorbed(q, c, S, kv_b, d, out, 1, kFp32); });
    hw.kernels.cpu_kda_ref_prefill_gflops = kda_prefill_rate(
        arena.arena(), "reference", "cpu::ref::kda_chunked", "no peak (reference op)",
        [](auto... a) { cpu::ref::kda_chunked(a..., 64); });
    hw.kernels.cpu_mla_ref_prefill_gflops = mla_prefill_rate(
        arena.arena(), "reference", "cpu::ref::mla_attention_expanded", "no peak (reference op)",
        [](const float* q, const float* c, int64_t T, const WeightView& kv_b, const MlaDims& d,
           float* out) { cpu::ref::mla_attention_expanded(q, c, T, kv_b, d, out, T, kFp32); });

    // The fast CPU backend's kernels (`--device cpu`), in an unpinned arena as the engine runs.
    progress("fast CPU backend (bf16 linear, mixers, row ops)");
    {
      // Its linear (cpu::Bf16Linear: GEMV up to 8 tokens, oneDNN above) on 64 MiB bf16 weights,
      // a different one each call (8 of them: 512 MiB, ≫ the last-level cache, as a model's
      // weights; one matrix alone stayed in a large L3 and read at 1.5–1.9× the memory peak).
      cpu::Bf16Linear lin;
      const int64_t N = 16384, K = 2048, nmat = o.quick ? 4 : 8;
      std::vector<uint16_t> w(size_t(N * K * nmat));
      for (size_t i = 0; i < w.size(); ++i)
        w[i] = uint16_t(0x3C00 | ((i * 2654435761u >> 24) & 0xFF));
      int64_t turn = 0;
      auto next_w = [&] {
        return cpu::ref::WeightView::bf16(w.data() + size_t(N * K * (turn++ % nmat)), N, K);
      };
      RateCurve t;
      for (int M :
           o.quick ? std::vector<int>{1, 8, 64} : std::vector<int>{1, 2, 4, 8, 16, 64, 256}) {
        std::vector<float> x(size_t(M * K), 0.01f), y(size_t(M * N));
        RateSample sm = eff(time_repeats(
            [&] {
              const cpu::ref::WeightView W = next_w();
              plain.execute([&] { lin(x.data(), M, W, y.data(), true); });
            },
            M >= 64 ? std::max(1, reps / 2) : reps, 1));
        sm.bytes = double(N * K * 2);
        t.points.push_back({M, sm.gbps()});
        MeasuredLine l = make_line(
            "hw/cpu fast trunk M=" + std::to_string(M), "bf16 [16384, 2048] x8, " + thr, sm,
            "host memory read", mem_gbps, M <= cpu::kGemvMaxTokens ? "gemv_bf16" : "oneDNN matmul");
        l.flops = 2.0 * double(N * K) * M;
        emit(l);
      }
      t.source = "measured: cpu::Bf16Linear, bf16 [16384, 2048] (8 in turn), " + thr + basis +
                 " (the fast CPU backend's linear)";
      hw.kernels.cpu_trunk_bf16 = t;
      // One call's fixed cost: the same linear on a 64×1024 weight (128 KiB, cache resident).
      const cpu::ref::WeightView Ws = cpu::ref::WeightView::bf16(w.data(), 64, 1024);
      std::vector<float> x(1024, 0.01f), y(64);
      RateSample sc = eff(time_repeats(
          [&] {
            plain.execute([&] {
              for (int i = 0; i < 100; ++i) lin(x.data(), 1, Ws, y.data(), true);
            });
          },
          reps, 1));
      const double us = sc.median_s / 100 * 1e6;
      hw.kernels.cpu_linear_call_us =
          Rate(us, "measured: cpu::Bf16Linear on bf16 [64, 1024], M = 1, " + thr + basis);
      MeasuredLine l = make_line("hw/cpu fast linear call", "bf16 [64, 1024] x100, " + thr, sc,
                                 "no peak (fixed cost)", 0, fmt("%.2f us per call", us));
      l.peak_is_bandwidth = false;
      emit(l);
    }
    hw.kernels.cpu_kda_fast_state_gbps = kda_decode_rate(
        plain, "fast", "cpu::kda_recurrent_fast", [](auto... a) { cpu::kda_recurrent_fast(a...); });
    hw.kernels.cpu_mla_fast_gflops = mla_decode_rate(
        plain, "fast", "cpu::mla_attention_absorbed_fast",
        [](const float* q, const float* c, int64_t S, const WeightView& kv_b, const MlaDims& d,
           float* out) { cpu::mla_attention_absorbed_fast(q, c, S, kv_b, d, out, 1, kBf16); });
    hw.kernels.cpu_kda_fast_prefill_gflops =
        kda_prefill_rate(plain, "fast", "cpu::kda_chunked_fast", "no peak (mixer core)",
                         [](auto... a) { cpu::kda_chunked_fast(a...); });
    {
      cpu::Bf16Linear lin;
      hw.kernels.cpu_mla_fast_prefill_gflops = mla_prefill_rate(
          plain, "fast", "cpu::mla_attention_expanded_fast", "no peak (mixer core)",
          [&](const float* q, const float* c, int64_t T, const WeightView& kv_b, const MlaDims& d,
              float* out) {
            cpu::mla_attention_expanded_fast(q, c, T, kv_b, d, out, T, kBf16, lin);
          });
    }
    {
      // One layer's row ops for T tokens at width D (hw/cpu fast row ops): two KimiRMSNorms, two
      // AttnRes mixes over 4 sources, a residual add and a GLU over 3·D — per token and 1024 wide.
      const int64_t T = 64, D = 2048;
      std::vector<float> a(size_t(T * D), 0.5f), b(a), c(a), e(a), out(a), nw(size_t(D), 1.0f),
          pw(size_t(D), 0.01f), gg(size_t(3 * T * D), 0.25f), gu(gg);
      const float* src[4] = {a.data(), b.data(), c.data(), e.data()};
      const cpu::ref::Glu glu{};
      RateSample sm = eff(time_repeats(
          [&] {
            plain.execute([&] {
              for (int i = 0; i < 2; ++i) {
                cpu::attn_res_mix_fast(src, 4, nw.data(), pw.data(), out.data(), T, D, 1e-6f);
                cpu::kimi_rms_norm_fast(out.data(), nw.data(), out.data(), T, D, 1e-6f);
              }
              cpu::add_round_fast(out.data(), a.data(), T * D);
              cpu::glu_fast(glu, gg.data(), gu.data(), gg.data(), 3 * T * D);
            });
          },
          reps, 1));
      const double ns = sm.median_s * 1e9 / double(T) / (double(D) / 1024.0);
      const std::string shape = "T=64, D=2048, " + thr;
      hw.kernels.cpu_row_ops_ns = Rate(ns,
                                       "measured: cpu row ops of one layer (2 KimiRMSNorm, 2 "
                                       "AttnRes mixes of 4 sources, add, GLU of 3·D), " +
                                           shape + basis);
      MeasuredLine l = make_line("hw/cpu fast row ops", shape, sm, "no peak (row ops)", 0,
                                 fmt("%.0f ns per token, layer and 1024 wide", ns));
      l.peak_is_bandwidth = false;
      emit(l);
    }
    if (o.model) hw.model_shapes = measure_model_shapes(*o.model, o, plain, topo, threads);
  } else {
    hw.not_measured.push_back("CPU kernel rates: skipped (--no-cpu-kernels)");
  }

  // GPU peaks.
  if (!o.gpu) {
    hw.not_measured.push_back("GPU: skipped (--no-gpu)");
  } else if (hw.gpu.count == 0) {
#ifdef STRATA_HAVE_CUDA
    hw.not_measured.push_back("GPU peaks: no CUDA device visible");
#else
    hw.not_measured.push_back("GPU peaks: this build has no CUDA (-DSTRATA_CUDA=OFF)");
#endif
  } else {
#ifdef STRATA_HAVE_CUDA
    const int r = o.quick ? 5 : 10;
    auto gpu_sample = [](const kernels::PeakMeasurement& m, double bytes) {
      RateSample s;
      s.median_s = s.min_s = s.max_s = m.median_s;
      s.repeats = 1;
      s.bytes = bytes;
      return s;
    };
    progress("GPU 0: HBM copy");
    const int64_t copy_bytes = int64_t(1) << 30;
    auto copy = kernels::measure_copy_bandwidth(copy_bytes, r);
    if (copy.status.ok()) {
      hw.gpu.hbm_copy_gbps = Rate(copy.value, "measured: " + copy.what);
      emit(make_line("hw/gpu HBM copy (peak)", copy.what, gpu_sample(copy, 2.0 * copy_bytes),
                     "itself", copy.value));
    } else {
      hw.not_measured.push_back(std::string("HBM copy: ") + copy.status.message);
    }
    progress("GPU 0: bf16 GEMM peak");
    auto gemm = kernels::measure_bf16_gemm(8192, 8192, 8192, r);
    if (gemm.status.ok()) {
      hw.gpu.bf16_gemm_tflops = Rate(gemm.value, "measured: " + gemm.what);
      MeasuredLine l = make_line("hw/gpu bf16 GEMM (peak)", gemm.what, gpu_sample(gemm, 0),
                                 "itself", gemm.value);
      l.flops = 2.0 * 8192.0 * 8192.0 * 8192.0;
      l.peak_is_bandwidth = false;
      emit(l);
    } else {
      hw.not_measured.push_back(std::string("bf16 GEMM: ") + gemm.status.message);
    }
    for (bool to_device : {true, false}) {
      progress(std::string("GPU 0: pinned ") + (to_device ? "host->device" : "device->host"));
      const int64_t bytes = int64_t(256) << 20;
      auto m = kernels::measure_host_copy(to_device, bytes, r);
      Rate& dst = to_device ? hw.gpu.h2d_gbps : hw.gpu.d2h_gbps;
      if (m.status.ok()) {
        dst = Rate(m.value, "measured: " + m.what);
        emit(make_line(to_device ? "hw/gpu host->device (peak)" : "hw/gpu device->host (peak)",
                       m.what, gpu_sample(m, double(bytes)), "itself", m.value));
      } else {
        hw.not_measured.push_back(m.what + ": " + m.status.message);
      }
    }
    if (hw.gpu.count > 1)
      hw.not_measured.push_back("GPUs 1.." + std::to_string(hw.gpu.count - 1) +
                                ": assumed equal to GPU 0 (only GPU 0 measured)");
#endif
  }
  return hw;
}

}  // namespace strata::offload
