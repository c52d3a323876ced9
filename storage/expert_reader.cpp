// ExpertReader: the backend-independent part (job queues, block carving, retries, fault
// injection, EOF handling, statistics), the pread thread-pool backend, and backend selection.
// The io_uring backend is in expert_reader_uring.cpp.
#include "storage/expert_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "storage/error.h"

namespace strata {

namespace detail {
// Defined in expert_reader_uring.cpp: returns nullptr and sets *why when no ring can be set up.
std::unique_ptr<ExpertReader> make_uring_reader(const ReaderConfig& c, std::string* why);
}  // namespace detail

using Clock = std::chrono::steady_clock;

IoBackend parse_io_backend(std::string_view s) {
  if (s == "auto") return IoBackend::kAuto;
  if (s == "io_uring" || s == "uring") return IoBackend::kUring;
  if (s == "pread") return IoBackend::kPread;
  throw Error("--io: unknown I/O backend '" + std::string(s) +
              "', expected auto, io_uring or pread");
}

const char* io_backend_name(IoBackend b) {
  switch (b) {
    case IoBackend::kAuto:
      return "auto";
    case IoBackend::kUring:
      return "io_uring";
    case IoBackend::kPread:
      return "pread";
  }
  return "?";
}

struct ExpertReader::Job {
  ReadJob job;
  ReadCompletion done;
  size_t next_span = 0;  // carving position: span index and offset inside it
  uint64_t next_off = 0;
  bool carved_all = false;
  int outstanding = 0;  // blocks handed out (in flight or waiting for a retry)
  bool failed = false;
  bool started = false;
  Clock::time_point start;
  ReadResult result;
};

struct ExpertReader::State {
  struct File {
    std::filesystem::path path;
    int fd = -1;
    uint64_t size = 0;
    bool direct = false;
  };
  mutable std::mutex mu;
  std::condition_variable work_cv;  // pread workers wait here
  std::condition_variable idle_cv;  // drain() waits here
  std::deque<Job*> queue[2];        // by ReadPriority
  std::deque<Block> retry;          // blocks to re-issue before anything else
  std::deque<File> files;
  std::vector<std::string> notes;
  ReaderStats stats;
  uint64_t jobs_pending = 0;
  int in_flight = 0;
  Clock::time_point busy_since;
  std::mt19937_64 rng;
  bool stop = false;
  bool paused = false;  // pause(): next_block hands out nothing
};

ExpertReader::ExpertReader(const ReaderConfig& config, IoBackend backend)
    : config_(config), backend_(backend), s_(std::make_unique<State>()) {
  STRATA_ASSERT(config_.block_bytes >= kDirectAlign && config_.block_bytes % kDirectAlign == 0);
  STRATA_ASSERT(config_.queue_depth >= 1 && config_.max_retries >= 0);
  s_->rng.seed(config_.faults.seed);
  if (config_.faults.any()) add_note("fault injection is ON (tests only)");
}

ExpertReader::~ExpertReader() {
  for (auto& f : s_->files)
    if (f.fd >= 0) ::close(f.fd);
}

void ExpertReader::add_note(std::string s) {
  std::lock_guard lk(s_->mu);
  s_->notes.push_back(std::move(s));
}

std::vector<std::string> ExpertReader::notes() const {
  std::lock_guard lk(s_->mu);
  return s_->notes;
}

ReaderStats ExpertReader::stats() const {
  std::lock_guard lk(s_->mu);
  ReaderStats st = s_->stats;
  if (s_->in_flight > 0)
    st.busy_seconds += std::chrono::duration<double>(Clock::now() - s_->busy_since).count();
  return st;
}

int ExpertReader::add_file(const std::filesystem::path& path) {
  State::File f;
  f.path = path;
  if (config_.direct) {
    f.fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (f.fd >= 0) {
      // Some file systems accept O_DIRECT at open and refuse it at read time: probe one block.
      void* probe = nullptr;
      if (posix_memalign(&probe, kDirectAlign, kDirectAlign) != 0) throw Error("out of memory");
      ssize_t r = ::pread(f.fd, probe, kDirectAlign, 0);
      int err = errno;
      std::free(probe);
      if (r < 0 && (err == EINVAL || err == EOPNOTSUPP)) {
        ::close(f.fd);
        f.fd = -1;
      } else {
        f.direct = true;
      }
    }
    if (f.fd < 0 && errno != ENOENT && errno != EACCES)
      add_note(path.string() + ": file system refuses O_DIRECT; buffered reads with FADV_DONTNEED");
  }
  if (f.fd < 0) f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) throw Error(path.string() + ": cannot open for reading: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) {
    int err = errno;
    ::close(f.fd);
    throw Error(path.string() + ": cannot stat: " + std::strerror(err));
  }
  f.size = uint64_t(st.st_size);
  std::lock_guard lk(s_->mu);
  s_->files.push_back(std::move(f));
  return int(s_->files.size()) - 1;
}

const std::filesystem::path& ExpertReader::file_path(int file) const {
  std::lock_guard lk(s_->mu);
  STRATA_ASSERT(file >= 0 && size_t(file) < s_->files.size());
  return s_->files[file].path;
}

uint64_t ExpertReader::file_size(int file) const {
  std::lock_guard lk(s_->mu);
  STRATA_ASSERT(file >= 0 && size_t(file) < s_->files.size());
  return s_->files[file].size;
}

int ExpertReader::fd(int file) const {
  return s_->files[file].fd;
}

void ExpertReader::submit(ReadJob job, ReadCompletion done) {
  uint64_t nfiles;
  {
    std::lock_guard lk(s_->mu);
    nfiles = s_->files.size();
  }
  STRATA_ASSERT(!job.spans.empty());
  for (auto& sp : job.spans) {
    STRATA_ASSERT(sp.nbytes > 0);
    STRATA_ASSERT(sp.file >= 0 && uint64_t(sp.file) < nfiles);
    STRATA_ASSERT(sp.offset % kDirectAlign == 0 && sp.nbytes % kDirectAlign == 0);
    STRATA_ASSERT(reinterpret_cast<uintptr_t>(sp.dst) % kDirectAlign == 0);
  }
  auto* j = new Job;
  j->job = std::move(job);
  j->done = std::move(done);
  j->result.tag = j->job.tag;
  {
    std::lock_guard lk(s_->mu);
    s_->jobs_pending++;
    s_->queue[int(j->job.priority)].push_back(j);
  }
  s_->work_cv.notify_one();
  wake();
}

void ExpertReader::promote(uint64_t tag) {
  std::lock_guard lk(s_->mu);
  auto& q = s_->queue[int(ReadPriority::kPrefetch)];
  for (auto it = q.begin(); it != q.end(); ++it) {
    if ((*it)->job.tag != tag) continue;
    Job* j = *it;
    q.erase(it);
    j->job.priority = ReadPriority::kDemand;
    s_->queue[int(ReadPriority::kDemand)].push_back(j);
    return;
  }
}

void ExpertReader::drain() {
  pause(false);  // a paused reader would never drain
  std::unique_lock lk(s_->mu);
  s_->idle_cv.wait(lk, [&] { return s_->jobs_pending == 0; });
}

void ExpertReader::pause(bool paused) {
  {
    std::lock_guard lk(s_->mu);
    if (s_->paused == paused) return;
    s_->paused = paused;
  }
  if (!paused) {
    s_->work_cv.notify_all();
    wake();
  }
}

bool ExpertReader::has_queued_work() {
  std::lock_guard lk(s_->mu);
  return !s_->retry.empty() || !s_->queue[0].empty() || !s_->queue[1].empty();
}

void ExpertReader::note_fixed_read() {
  std::lock_guard lk(s_->mu);
  s_->stats.fixed_reads++;
}

void ExpertReader::stop_requested_wake() {
  {
    std::lock_guard lk(s_->mu);
    s_->stop = true;
  }
  s_->work_cv.notify_all();
}

// Takes the next block under the lock. Jobs whose carving finished leave the queue; a job that
// failed is skipped (its remaining blocks are never read).
bool ExpertReader::next_block(Block& out) {
  std::lock_guard lk(s_->mu);
  if (s_->paused) return false;
  auto hand_out = [&](Block& b) {
    if (s_->in_flight++ == 0) s_->busy_since = Clock::now();
    out = b;
  };
  if (!s_->retry.empty()) {
    Block b = s_->retry.front();
    s_->retry.pop_front();
    hand_out(b);
    return true;
  }
  for (auto& q : s_->queue) {
    while (!q.empty()) {
      Job* j = q.front();
      if (j->failed || j->carved_all) {  // failed jobs normally leave the queue in complete_block
        q.pop_front();
        continue;
      }
      const ReadSpan& sp = j->job.spans[j->next_span];
      Block b;
      b.job = j;
      b.file = sp.file;
      b.offset = sp.offset + j->next_off;
      b.len = std::min<uint64_t>(config_.block_bytes, sp.nbytes - j->next_off);
      b.dst = sp.dst + j->next_off;
      j->next_off += b.len;
      if (j->next_off == sp.nbytes) {
        j->next_span++;
        j->next_off = 0;
        if (j->next_span == j->job.spans.size()) {
          j->carved_all = true;
          q.pop_front();
        }
      }
      if (!j->started) {
        j->started = true;
        j->start = Clock::now();
      }
      j->outstanding++;
      hand_out(b);
      return true;
    }
  }
  return false;
}

int ExpertReader::inject_fault(const Block& b, int res) {
  const FaultConfig& f = config_.faults;
  if (!f.any()) return res;
  uint64_t lo = b.offset + b.done, hi = b.offset + b.len;
  if (f.bad_file == b.file && f.bad_offset >= lo && f.bad_offset < hi) return -EIO;
  double u_eio, u_short, u_delay;
  uint64_t r;
  {
    std::lock_guard lk(s_->mu);
    std::uniform_real_distribution<double> U(0, 1);
    u_eio = U(s_->rng);
    u_short = U(s_->rng);
    u_delay = U(s_->rng);
    r = s_->rng();
  }
  if (u_delay < f.delay_rate && f.max_delay_us > 0)
    std::this_thread::sleep_for(std::chrono::microseconds(r % uint64_t(f.max_delay_us)));
  if (res <= 0) return res;
  uint8_t* got = b.dst + b.done;
  if (u_eio < f.eio_rate) {
    std::memset(got, 0xFF, size_t(res));  // whatever arrived must not be trusted
    return -EIO;
  }
  if (u_short < f.short_rate) {
    // Half the time an aligned count, half the time an arbitrary one (forces a block restart).
    uint64_t n = r % uint64_t(res);
    if (r & (1ull << 40)) n = align_down(n);
    std::memset(got + n, 0xFF, size_t(res) - n);  // "unread" tail: poison
    return int(n);
  }
  return res;
}

void ExpertReader::complete_block(Block& b, int res) {
  res = inject_fault(b, res);
  Job* finished = nullptr;
  bool requeued = false;
  {
    std::lock_guard lk(s_->mu);
    auto& st = s_->stats;
    const State::File& f = s_->files[b.file];
    Job& j = *b.job;
    st.block_reads++;
    auto fail = [&](const std::string& why) {
      if (!j.failed) {
        j.failed = true;
        j.result.error = f.path.string() + ": read of " + std::to_string(b.len - b.done) +
                         " bytes at offset " + std::to_string(b.offset + b.done) +
                         " failed after " + std::to_string(b.attempts) + " retries: " + why;
        for (auto& q : s_->queue) {
          auto it = std::find(q.begin(), q.end(), &j);
          if (it != q.end()) q.erase(it);
        }
      }
    };
    auto retry = [&]() {
      b.attempts++;
      st.retries++;
      j.result.retries++;
      s_->retry.push_back(b);
      requeued = true;
    };
    bool block_done = false;
    if (j.failed) {
      block_done = true;
    } else if (res < 0) {
      st.io_errors++;
      bool retryable = res == -EIO || res == -EAGAIN || res == -EINTR;
      if (retryable && b.attempts < config_.max_retries)
        retry();
      else {
        fail(std::strerror(-res));
        block_done = true;
      }
    } else {
      uint64_t want = b.offset >= f.size ? 0 : std::min<uint64_t>(b.len, f.size - b.offset);
      if (res > 0) {
        st.bytes_read += uint64_t(res);
        j.result.bytes_read += uint64_t(res);
      }
      b.done += uint64_t(res);
      if (!f.direct && res > 0)
        ::posix_fadvise(f.fd, off_t(b.offset + b.done - res), res, POSIX_FADV_DONTNEED);
      if (b.done >= want) {
        if (b.len > want) std::memset(b.dst + want, 0, b.len - want);  // past end of file
        block_done = true;
      } else {
        st.short_reads++;
        if (b.attempts < config_.max_retries) {
          // O_DIRECT continues only from an aligned position; otherwise re-read the block.
          if (f.direct && b.done % kDirectAlign != 0) {
            j.result.bytes_read -= b.done;
            b.done = 0;
          }
          retry();
        } else {
          // A file that shrank since it was opened explains the short read: say so.
          struct stat now {};
          std::string why = "short read (" + std::to_string(res) + " bytes, expected " +
                            std::to_string(want - (b.done - uint64_t(res))) + ")";
          if (::fstat(f.fd, &now) == 0 && uint64_t(now.st_size) < f.size)
            why += ": the file is now " + std::to_string(now.st_size) + " bytes, it was " +
                   std::to_string(f.size) + " when opened (truncated while in use)";
          fail(why);
          block_done = true;
        }
      }
    }
    // A requeued block leaves flight too; next_block hands it out again.
    if (--s_->in_flight == 0)
      st.busy_seconds += std::chrono::duration<double>(Clock::now() - s_->busy_since).count();
    if (block_done && --j.outstanding == 0 && (j.carved_all || j.failed)) {
      // Failed jobs complete only when none of their reads is in flight any more.
      finished = &j;
      j.result.ok = !j.failed;
      j.result.seconds = std::chrono::duration<double>(Clock::now() - j.start).count();
      if (j.failed)
        st.jobs_failed++;
      else
        st.jobs_done++;
    }
  }
  if (requeued) {
    s_->work_cv.notify_one();
    wake();
  }
  if (finished) {
    finished->done(std::move(finished->result));
    delete finished;
    std::lock_guard lk(s_->mu);
    if (--s_->jobs_pending == 0) s_->idle_cv.notify_all();
  }
}

namespace {

// The pread thread pool: each worker takes one block at a time (demand first) and preads it.
class PreadReader final : public ExpertReader {
 public:
  PreadReader(const ReaderConfig& c) : ExpertReader(c, IoBackend::kPread) {
    int n = std::max(1, c.pread_threads);
    for (int i = 0; i < n; i++) threads_.emplace_back([this] { run(); });
  }
  ~PreadReader() override {
    drain();
    stop_requested_wake();
    for (auto& t : threads_) t.join();
  }
  void register_buffer(void*, uint64_t) override {}

 protected:
  void wake() override {}

 private:
  void run() {
    for (;;) {
      Block b;
      {
        std::unique_lock lk(s_->mu);
        s_->work_cv.wait(lk, [&] {
          return s_->stop || (!s_->paused && (!s_->retry.empty() || !s_->queue[0].empty() ||
                                              !s_->queue[1].empty()));
        });
        if (s_->stop) return;
      }
      if (!next_block(b)) continue;
      ssize_t r = ::pread(fd(b.file), b.dst + b.done, b.len - b.done, off_t(b.offset + b.done));
      complete_block(b, r < 0 ? -errno : int(r));
    }
  }
  std::vector<std::thread> threads_;
};

}  // namespace

std::unique_ptr<ExpertReader> ExpertReader::create(const ReaderConfig& config) {
  STRATA_ASSERT(config.block_bytes <= (1ull << 30));  // results are ints
  if (config.backend == IoBackend::kPread) {
    auto r = std::make_unique<PreadReader>(config);
    r->add_note("I/O backend: pread thread pool (" + std::to_string(config.pread_threads) +
                " threads), selected by --io pread");
    return r;
  }
  std::string why;
  auto r = detail::make_uring_reader(config, &why);
  if (r) return r;
  if (config.backend == IoBackend::kUring)
    throw Error("--io io_uring: io_uring is unavailable: " + why + " (use --io pread or auto)");
  auto p = std::make_unique<PreadReader>(config);
  p->add_note("I/O backend: pread thread pool (" + std::to_string(config.pread_threads) +
              " threads) because io_uring is unavailable: " + why);
  return p;
}

}  // namespace strata
