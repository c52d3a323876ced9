// `strata bench io`: expert streaming from disk against the disk's raw O_DIRECT bandwidth,
// measured in the same run at the same block size and queue depth (STYLE §14). Lines:
//   raw        a bare io_uring loop reading the 4 KiB-aligned spans of random experts, measured
//              before and after the store lines (the faster one is the peak);
//   store      the same number of random experts through ExpertStore (require → acquire →
//              release, every access a miss), io_uring backend — target ≥ 90% of raw;
//   store-pread the same through the pread thread-pool backend.
// Default data: a temp file of K3-sized experts (17.55 MB each, the released MXFP4 layout's bytes:
// 3 projections × (3072·3584/2 packed + 3072·3584/32 scales)), laid out like a shard (unaligned
// start, experts back to back); with -m DIR the checkpoint's real expert spans instead.
// Napkin: 16 experts = 280.8 MB per repeat ≈ 0.2 s at the ~1.2–1.5 GB/s of these VMs' virtio
// disks; the disk, not the CPU, is the bound, so the store should reach the raw line.
#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "offload/expert_store.h"
#include "storage/checkpoint.h"
#include "storage/error.h"
#include "tools/bench.h"

namespace strata::tools {

namespace {

namespace fs = std::filesystem;

// One K3 routed expert in the released layout (spec/model.md §7.1, building-blocks §1.3).
constexpr uint64_t kK3ExpertBytes = 3ull * (3072ull * 3584 / 2 + 3072ull * 3584 / 32);

struct Options {
  std::string model;
  std::string dir;
  double file_gib = 2.0;
  int experts = 16;
  int repeats = 5;
  uint64_t block_kib = 1024;
  int qd = 32;
  int pread_threads = 8;
  bool keep = false;
  std::string json;
};

// A shard-like file of K3-sized experts with pseudo-random bytes, written with O_DIRECT so the
// page cache holds none of it (reads then come from the disk).
offload::ExpertLayout write_synthetic(const fs::path& path, uint64_t bytes) {
  const uint64_t header = 123457;  // a safetensors header: experts start unaligned
  const int n = int((bytes - header) / kK3ExpertBytes);
  if (n < 4) throw Error("bench io: --file-gib too small for 4 K3-sized experts");
  const uint64_t total = align_up(header + uint64_t(n) * kK3ExpertBytes);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
  bool direct = fd >= 0;
  if (fd < 0) fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(path.string() + ": cannot create: " + std::strerror(errno));
  const uint64_t chunk = 8ull << 20;
  void* buf = mmap(nullptr, chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  STRATA_ASSERT(buf != MAP_FAILED);
  std::mt19937_64 rng(1);
  for (uint64_t off = 0; off < total; off += chunk) {
    auto* w = static_cast<uint64_t*>(buf);
    for (uint64_t i = 0; i < chunk / 8; i++) w[i] = rng();
    uint64_t len = std::min(chunk, total - off);
    if (::pwrite(fd, buf, len, off_t(off)) != ssize_t(len)) {
      int err = errno;
      ::close(fd);
      munmap(buf, chunk);
      throw Error(path.string() + ": write failed: " + std::strerror(err) + " (disk full?)");
    }
  }
  munmap(buf, chunk);
  ::fsync(fd);
  if (!direct) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  offload::ExpertLayout L;
  L.files = {path};
  L.num_layers = 1;
  L.num_experts = n;
  L.spans.resize(size_t(n));
  for (int e = 0; e < n; e++)
    L.spans[size_t(e)] = {{0, header + uint64_t(e) * kK3ExpertBytes, kK3ExpertBytes}};
  return L;
}

// (layer, expert) of every expert in the layout.
std::vector<std::pair<int, int>> all_experts(const offload::ExpertLayout& L) {
  std::vector<std::pair<int, int>> v;
  for (int l = 0; l < L.num_layers; l++)
    for (int e = 0; e < L.num_experts; e++)
      if (L.has(l, e)) v.emplace_back(l, e);
  return v;
}

// The raw reference: a bare io_uring loop over the aligned spans of `pick`, `qd` reads of at most
// `block` bytes in flight, O_DIRECT, into one reused buffer.
class RawReader {
 public:
  RawReader(const offload::ExpertLayout& L, uint64_t block, int qd)
      : L_(L), block_(block), qd_(qd) {
    for (auto& f : L.files) {
      int fd = ::open(f.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
      if (fd < 0) throw Error(f.string() + ": cannot open with O_DIRECT: " + std::strerror(errno));
      fds_.push_back(fd);
    }
    int rc = io_uring_queue_init(unsigned(qd), &ring_, 0);
    if (rc < 0) throw Error(std::string("bench io: io_uring unavailable: ") + std::strerror(-rc));
    // Huge pages as in the store's arena: fewer segments per read (virtio-blk limits them).
    buf_ = static_cast<uint8_t*>(mmap(nullptr, block * uint64_t(qd), PROT_READ | PROT_WRITE,
                                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    STRATA_ASSERT(buf_ != MAP_FAILED);
    madvise(buf_, block * uint64_t(qd), MADV_HUGEPAGE);
    std::memset(buf_, 0, block * uint64_t(qd));
    iovec iov{buf_, size_t(block * uint64_t(qd))};
    fixed_ = io_uring_register_buffers(&ring_, &iov, 1) == 0;
  }
  bool fixed() const { return fixed_; }
  ~RawReader() {
    io_uring_queue_exit(&ring_);
    munmap(buf_, block_ * uint64_t(qd_));
    for (int fd : fds_) ::close(fd);
  }
  uint64_t read(const std::vector<std::pair<int, int>>& pick) {
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
    size_t next = 0, done = 0;
    int in_flight = 0;
    std::vector<int> free_slots;
    for (int i = 0; i < qd_; i++) free_slots.push_back(i);
    while (done < reqs.size()) {
      while (!free_slots.empty() && next < reqs.size()) {
        int s = free_slots.back();
        free_slots.pop_back();
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        uint8_t* dst = buf_ + uint64_t(s) * block_;
        const unsigned len = unsigned(reqs[next].len);
        if (fixed_)
          io_uring_prep_read_fixed(sqe, reqs[next].fd, dst, len, off_t(reqs[next].off), 0);
        else
          io_uring_prep_read(sqe, reqs[next].fd, dst, len, off_t(reqs[next].off));
        io_uring_sqe_set_data64(sqe, uint64_t(s));
        next++;
        in_flight++;
      }
      io_uring_submit_and_wait(&ring_, 1);
      io_uring_cqe* cqe;
      while (io_uring_peek_cqe(&ring_, &cqe) == 0) {
        if (cqe->res < 0)
          throw Error(std::string("bench io: raw read failed: ") + std::strerror(-cqe->res));
        free_slots.push_back(int(io_uring_cqe_get_data64(cqe)));
        io_uring_cqe_seen(&ring_, cqe);
        in_flight--;
        done++;
      }
    }
    return bytes;
  }

 private:
  const offload::ExpertLayout& L_;
  uint64_t block_;
  int qd_;
  std::vector<int> fds_;
  io_uring ring_;
  uint8_t* buf_ = nullptr;
  bool fixed_ = false;
};

// Random distinct experts, none of which is in `avoid` (resident in the store).
std::vector<std::pair<int, int>> pick_experts(const std::vector<std::pair<int, int>>& all, int n,
                                              std::mt19937& rng,
                                              const offload::ExpertStore* avoid) {
  std::vector<std::pair<int, int>> cand;
  for (auto& le : all)
    if (!avoid || avoid->residency(le.first, le.second) == offload::Residency::disk)
      cand.push_back(le);
  std::shuffle(cand.begin(), cand.end(), rng);
  if (int(cand.size()) < n)
    throw Error("bench io: only " + std::to_string(cand.size()) +
                " experts not resident; raise --file-gib");
  cand.resize(size_t(n));
  return cand;
}

int run(const Options& o) {
  BenchReport rep("bench io: expert streaming vs raw O_DIRECT");
  std::unique_ptr<Checkpoint> ck;
  offload::ExpertLayout L;
  fs::path tmp;
  if (!o.model.empty()) {
    CheckpointOptions co;
    co.validate_expert_scales = false;
    ck = std::make_unique<Checkpoint>(o.model, co);
    L = offload::ExpertLayout::from_checkpoint(*ck);
    rep.note("data: the expert spans of checkpoint " + o.model + " (page cache may hold them)");
  } else {
    fs::path dir = o.dir.empty() ? fs::temp_directory_path() : fs::path(o.dir);
    tmp = dir / ("strata-bench-io-" + std::to_string(::getpid()) + ".bin");
    L = write_synthetic(tmp, uint64_t(o.file_gib * double(1ull << 30)));
    rep.note("data: " + tmp.string() + ", " + std::to_string(L.num_experts) +
             " K3-sized experts of " + std::to_string(kK3ExpertBytes) +
             " bytes, written with O_DIRECT (cold)");
  }
  struct Cleanup {
    fs::path p;
    bool keep;
    ~Cleanup() {
      std::error_code ec;
      if (!p.empty() && !keep) fs::remove(p, ec);
    }
  } cleanup{tmp, o.keep};

  const uint64_t block = o.block_kib * 1024;
  if (block == 0 || block % kDirectAlign) throw Error("--block-kib: must be a multiple of 4");
  const auto all = all_experts(L);
  const uint64_t expert_bytes = L.total_expert_bytes() / std::max<uint64_t>(1, all.size());
  char shape[96];
  std::snprintf(shape, sizeof shape, "%d experts × %.2f MB, %llu KiB, QD %d", o.experts,
                double(expert_bytes) / 1e6, (unsigned long long)o.block_kib, o.qd);
  std::mt19937 rng(7);

  // Raw O_DIRECT reference, measured before and after the store lines: the disk of a shared VM
  // drifts, and the ratio uses the faster of the two (conservative).
  RawReader rr(L, block, o.qd);
  auto raw_line = [&](const char* when) {
    BenchLine raw;
    uint64_t bytes = 0;
    raw.time =
        measure([&] { bytes = rr.read(pick_experts(all, o.experts, rng, nullptr)); }, o.repeats);
    raw.bytes = double(bytes);
    raw.name = std::string("io/raw-odirect-io_uring-") + when;
    raw.shape = shape;
    raw.note = rr.fixed() ? "bare io_uring loop, registered buffer"
                          : "bare io_uring loop (buffer registration failed)";
    return raw;
  };
  BenchLine raw_before = raw_line("before");
  raw_before.peak_name = "itself";
  raw_before.peak = raw_before.gbps();
  rep.add(raw_before);
  std::vector<BenchLine> store_lines;

  // The store, every access a miss (random experts not resident), one backend per line.
  for (IoBackend be : {IoBackend::kUring, IoBackend::kPread}) {
    offload::StoreConfig sc;
    sc.io.backend = be;
    sc.io.block_bytes = block;
    sc.io.queue_depth = o.qd;
    sc.io.pread_threads = o.pread_threads;
    sc.gpu = 0;
    // Room for one step's experts plus as many again (prefetch-like headroom).
    sc.host_budget_bytes = 2ull * uint64_t(o.experts) * (align_up(expert_bytes) + 2 * kDirectAlign);
    std::unique_ptr<offload::ExpertStore> st;
    try {
      st = std::make_unique<offload::ExpertStore>(L, sc);
    } catch (const Error& e) {
      rep.note(std::string("store/") + io_backend_name(be) + ": skipped: " + e.what());
      continue;
    }
    for (auto& line : st->describe()) rep.note(line);
    uint64_t bytes = 0;
    BenchLine bl;
    bl.time = measure(
        [&] {
          auto pick = pick_experts(all, o.experts, rng, st.get());
          std::map<int, std::vector<int>> by_layer;
          for (auto [l, e] : pick) by_layer[l].push_back(e);
          for (auto& [l, es] : by_layer) st->require(l, es);
          for (auto& [l, es] : by_layer)
            for (int e : es) st->acquire(l, e).release();
          bytes = uint64_t(o.experts) * expert_bytes;
        },
        o.repeats);
    bl.bytes = double(bytes);
    bl.name = std::string("io/store-") + io_backend_name(be);
    bl.shape = shape;
    bl.peak_name = "raw O_DIRECT (same run)";
    bl.peak = raw_before.gbps();
    auto t = st->telemetry();
    char note[160];
    std::snprintf(note, sizeof note, "%llu misses, %llu retries, reader busy %.2f GB/s",
                  (unsigned long long)t.disk_misses, (unsigned long long)t.read_retries,
                  t.read_gbps());
    bl.note = note;
    store_lines.push_back(bl);
  }
  BenchLine raw_after = raw_line("after");
  const double peak = std::max(raw_before.gbps(), raw_after.gbps());
  raw_after.peak_name = "raw before";
  raw_after.peak = raw_before.gbps();
  rep.add(raw_after);
  for (BenchLine& bl : store_lines) {
    bl.peak_name = "raw O_DIRECT, faster of before/after";
    bl.peak = peak;
    rep.add(bl);
    if (bl.name == "io/store-io_uring") {
      char r[128];
      std::snprintf(r, sizeof r, "store/io_uring reaches %.1f%% of raw O_DIRECT (target ≥ 90%%)",
                    bl.pct_of_peak());
      rep.note(r);
    }
  }
  if (!o.json.empty()) rep.write_json(o.json);
  return 0;
}

BenchSetup setup = [](CLI::App& app) {
  auto o = std::make_shared<Options>();
  app.add_option("-m,--model", o->model,
                 "read this checkpoint's expert spans instead of a temp file");
  app.add_option("--dir", o->dir, "where to write the temp file (default: the temp directory)");
  app.add_option("--file-gib", o->file_gib, "temp file size in GiB (default 2)");
  app.add_option("--experts", o->experts, "experts per repeat (default 16, K3's top-k)");
  app.add_option("--repeats", o->repeats, "timed repeats (default 5)");
  app.add_option("--block-kib", o->block_kib, "read block size in KiB (default 1024)");
  app.add_option("--qd", o->qd, "reads in flight (default 32)");
  app.add_option("--pread-threads", o->pread_threads, "pread backend threads (default 8)");
  app.add_flag("--keep", o->keep, "keep the temp file");
  app.add_option("--json", o->json, "also write the lines as JSON to FILE");
  return [o] { return run(*o); };
};

STRATA_BENCH("io", "expert streaming (io_uring and pread store) vs raw O_DIRECT disk bandwidth",
             setup);

}  // namespace

}  // namespace strata::tools
