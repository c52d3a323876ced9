// The io_uring backend of ExpertReader (liburing 2.3): one ring, one I/O thread that keeps up to
// queue_depth block reads in flight, read_fixed into registered buffers, and an eventfd poll so a
// submit() wakes a ring that is waiting for completions (completion-driven, no timed polling).
#include <liburing.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "storage/error.h"
#include "storage/expert_reader.h"

namespace strata {

namespace {

constexpr uint64_t kWakeTag = ~0ull;
constexpr uint64_t kMaxRegisteredIovec = 1ull << 30;  // the kernel's per-buffer limit

class UringReader final : public ExpertReader {
 public:
  UringReader(const ReaderConfig& c, io_uring& ring, int efd)
      : ExpertReader(c, IoBackend::kUring), ring_(ring), efd_(efd), slots_(c.queue_depth) {
    for (int i = c.queue_depth - 1; i >= 0; i--) free_.push_back(i);
    rng_.seed(c.faults.seed ^ 0x9e3779b97f4a7c15ull);
    thread_ = std::thread([this] { run(); });
  }

  ~UringReader() override {
    drain();
    stop_.store(true);
    wake();
    thread_.join();
    io_uring_queue_exit(&ring_);
    ::close(efd_);
  }

  void register_buffer(void* p, uint64_t n) override {
    std::lock_guard lk(reg_mu_);
    // Split into kernel-sized pieces; all pieces are registered again together.
    auto* base = static_cast<uint8_t*>(p);
    std::vector<iovec> add;
    for (uint64_t off = 0; off < n; off += kMaxRegisteredIovec)
      add.push_back({base + off, size_t(std::min(kMaxRegisteredIovec, n - off))});
    std::vector<iovec> all = iovs_;
    all.insert(all.end(), add.begin(), add.end());
    if (!iovs_.empty()) io_uring_unregister_buffers(&ring_);
    int rc = io_uring_register_buffers(&ring_, all.data(), unsigned(all.size()));
    if (rc == 0) {
      iovs_ = std::move(all);
      add_note("io_uring: " + std::to_string(n >> 20) + " MiB registered for fixed-buffer reads");
      return;
    }
    add_note("io_uring: registering " + std::to_string(n >> 20) + " MiB of buffers failed (" +
             std::strerror(-rc) + "; RLIMIT_MEMLOCK?): those reads use unregistered buffers");
    if (!iovs_.empty() && io_uring_register_buffers(&ring_, iovs_.data(), unsigned(iovs_.size())))
      iovs_.clear();
  }

 protected:
  void wake() override {
    uint64_t one = 1;
    ssize_t r = ::write(efd_, &one, sizeof one);
    (void)r;  // a full counter (EAGAIN) still wakes the ring
  }

 private:
  // Index of the registered buffer holding [p, p+n), or -1.
  int fixed_index(const uint8_t* p, uint64_t n) {
    std::lock_guard lk(reg_mu_);
    for (size_t i = 0; i < iovs_.size(); i++) {
      auto* b = static_cast<const uint8_t*>(iovs_[i].iov_base);
      if (p >= b && p + n <= b + iovs_[i].iov_len) return int(i);
    }
    return -1;
  }

  void arm_wake_poll() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    STRATA_ASSERT(sqe);  // the SQ has one entry more than queue_depth for this
    io_uring_prep_poll_add(sqe, efd_, POLLIN);
    io_uring_sqe_set_data64(sqe, kWakeTag);
  }

  void run() {
    arm_wake_poll();
    int in_flight = 0;
    std::vector<std::pair<uint64_t, int>> done;  // (user data, res)
    std::vector<io_uring_cqe*> cqes(size_t(config_.queue_depth) + 2);
    for (;;) {
      // Fill the queue: demand blocks first (next_block orders them).
      Block b;
      while (!free_.empty() && next_block(b)) {
        int slot = free_.back();
        free_.pop_back();
        slots_[slot] = b;
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        STRATA_ASSERT(sqe);
        uint8_t* dst = b.dst + b.done;
        unsigned len = unsigned(b.len - b.done);
        off_t off = off_t(b.offset + b.done);
        int idx = fixed_index(dst, len);
        if (idx >= 0) {
          io_uring_prep_read_fixed(sqe, fd(b.file), dst, len, off, idx);
          note_fixed_read();
        } else {
          io_uring_prep_read(sqe, fd(b.file), dst, len, off);
        }
        io_uring_sqe_set_data64(sqe, uint64_t(slot));
        in_flight++;
      }
      if (stop_.load() && in_flight == 0 && !has_queued_work()) return;
      int rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0 && rc != -EINTR && rc != -EBUSY && rc != -EAGAIN) {
        std::fprintf(stderr, "strata: io_uring_submit_and_wait: %s\n", std::strerror(-rc));
        std::abort();  // the ring is unusable; nothing sane to continue with
      }
      unsigned n = io_uring_peek_batch_cqe(&ring_, cqes.data(), unsigned(cqes.size()));
      done.clear();
      for (unsigned i = 0; i < n; i++)
        done.emplace_back(io_uring_cqe_get_data64(cqes[i]), cqes[i]->res);
      io_uring_cq_advance(&ring_, n);
      if (config_.faults.reorder) std::shuffle(done.begin(), done.end(), rng_);
      for (auto [tag, res] : done) {
        if (tag == kWakeTag) {
          uint64_t v;
          ssize_t r = ::read(efd_, &v, sizeof v);
          (void)r;
          arm_wake_poll();
          continue;
        }
        int slot = int(tag);
        Block blk = slots_[slot];
        free_.push_back(slot);
        in_flight--;
        complete_block(blk, res);
      }
    }
  }

  io_uring ring_;
  int efd_;
  std::vector<Block> slots_;
  std::vector<int> free_;
  std::mutex reg_mu_;
  std::vector<iovec> iovs_;
  std::atomic<bool> stop_{false};
  std::mt19937_64 rng_;
  std::thread thread_;
};

}  // namespace

namespace detail {

std::unique_ptr<ExpertReader> make_uring_reader(const ReaderConfig& c, std::string* why) {
  io_uring ring;
  io_uring_params p{};
  int rc = io_uring_queue_init_params(unsigned(c.queue_depth + 1), &ring, &p);
  if (rc < 0) {
    *why = std::string("io_uring_queue_init: ") + std::strerror(-rc);
    if (rc == -ENOSYS) *why += " (kernel without io_uring, or gVisor)";
    if (rc == -EPERM) *why += " (blocked by seccomp or kernel.io_uring_disabled)";
    return nullptr;
  }
  io_uring_probe* probe = io_uring_get_probe_ring(&ring);
  bool ok = probe && io_uring_opcode_supported(probe, IORING_OP_READ) &&
            io_uring_opcode_supported(probe, IORING_OP_READ_FIXED) &&
            io_uring_opcode_supported(probe, IORING_OP_POLL_ADD);
  if (probe) io_uring_free_probe(probe);
  if (!ok) {
    io_uring_queue_exit(&ring);
    *why = "io_uring lacks READ/READ_FIXED/POLL_ADD";
    return nullptr;
  }
  int efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (efd < 0) {
    io_uring_queue_exit(&ring);
    *why = std::string("eventfd: ") + std::strerror(errno);
    return nullptr;
  }
  auto r = std::make_unique<UringReader>(c, ring, efd);
  // Note: the ring struct was copied into the reader before its thread started.
  return r;
}

}  // namespace detail

}  // namespace strata
