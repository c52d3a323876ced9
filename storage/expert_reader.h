// ExpertReader: asynchronous O_DIRECT reads of 4 KiB-aligned file spans into caller-owned memory —
// the transfer that moves routed experts from disk (the released safetensors shards) to the host
// expert cache. Two backends behind one interface (STYLE §7: a transfer is not a tier):
//   * io_uring (liburing 2.3): one ring driven by one I/O thread, queue_depth reads in flight,
//     read_fixed into registered buffers where the destination lies in one, completion-driven
//     (an eventfd poll wakes the ring when work arrives);
//   * pread thread pool: the same interface, chosen automatically when io_uring cannot be set up
//     (ENOSYS under gVisor, EPERM from seccomp or kernel.io_uring_disabled) and selectable with
//     `--io pread`. The choice and its reason are in notes(); nothing falls back silently (STYLE
//     §12).
// Every job is split into blocks of at most block_bytes. Short reads and EIO/EAGAIN/EINTR are
// retried up to max_retries times per block, then the job fails with an error naming the file and
// offset; a failed job's completion is delivered only after none of its reads is in flight, and the
// caller must not use its destination (a half-read expert is never used). Demand jobs always go
// before prefetch jobs; a queued prefetch job can be promoted to demand.
// Fault injection (EIO, short reads with the unread tail poisoned, delays, reordered completions,
// a persistent bad offset) lives in the backends' completion path so tests exercise the real retry
// code. Not here: which experts to read or where they live (offload/expert_store.h).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

inline constexpr uint64_t kDirectAlign = 4096;  // O_DIRECT offset/length/address alignment we use

inline uint64_t align_down(uint64_t x, uint64_t a = kDirectAlign) {
  return x / a * a;
}
inline uint64_t align_up(uint64_t x, uint64_t a = kDirectAlign) {
  return (x + a - 1) / a * a;
}

enum class IoBackend { kAuto, kUring, kPread };
// "auto" | "io_uring" (also "uring") | "pread"; throws strata::Error naming the flag otherwise.
IoBackend parse_io_backend(std::string_view s);
const char* io_backend_name(IoBackend b);

// Test-only fault injection. Rates are per block read; the generator is seeded, so a failing test
// reproduces.
struct FaultConfig {
  uint64_t seed = 1;
  double eio_rate = 0;    // the read returns -EIO
  double short_rate = 0;  // the read returns fewer bytes; the bytes it "did not read" are poisoned
  double delay_rate = 0;  // the completion is delayed by up to max_delay_us
  int max_delay_us = 0;
  bool reorder = false;     // io_uring: completions of a batch handled in shuffled order
  int bad_file = -1;        // every read covering (bad_file, bad_offset) fails with -EIO
  uint64_t bad_offset = 0;  // (persistent fault: the job must fail after max_retries)
  bool any() const {
    return eio_rate > 0 || short_rate > 0 || delay_rate > 0 || reorder || bad_file >= 0;
  }
};

struct ReaderConfig {
  IoBackend backend = IoBackend::kAuto;
  int queue_depth = 32;               // reads in flight (io_uring SQ entries)
  uint64_t block_bytes = 1ull << 20;  // one read is at most this many bytes (multiple of 4 KiB)
  int pread_threads = 4;              // pread backend: threads (= reads in flight)
  int max_retries = 3;                // per block, for EIO/EAGAIN/EINTR and short reads
  bool direct = true;                 // O_DIRECT; buffered (logged) where the file system refuses
  FaultConfig faults;
};

// One read: `nbytes` bytes of file `file` at `offset` into `dst`. offset, nbytes and the address
// of dst must be multiples of kDirectAlign. A span may run past the end of the file (the rounded
// tail of the last tensor): bytes past the end are zero-filled.
struct ReadSpan {
  int file = 0;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  uint8_t* dst = nullptr;
};

enum class ReadPriority { kDemand = 0, kPrefetch = 1 };

struct ReadJob {
  uint64_t tag = 0;  // caller's id, echoed in the result (promote() finds queued jobs by it)
  ReadPriority priority = ReadPriority::kDemand;
  std::vector<ReadSpan> spans;
};

struct ReadResult {
  uint64_t tag = 0;
  bool ok = false;
  std::string error;  // when !ok: "FILE: read of N bytes at offset O failed after R retries: …"
  uint64_t bytes_read = 0;  // bytes that came from the file (excluding zero fill)
  int retries = 0;          // retried block reads in this job (faults that were absorbed)
  double seconds = 0;       // from the job's first read issued to its completion
};

// The completion callback runs on an I/O thread; it must be short and must not call back into the
// reader except submit().
using ReadCompletion = std::function<void(ReadResult&&)>;

struct ReaderStats {
  uint64_t jobs_done = 0, jobs_failed = 0;
  uint64_t bytes_read = 0;
  uint64_t block_reads = 0, retries = 0, short_reads = 0, io_errors = 0;
  uint64_t fixed_reads = 0;  // io_uring reads into registered buffers
  double busy_seconds = 0;   // wall time with at least one read in flight
};

class ExpertReader {
 public:
  // Chooses the backend (kAuto: io_uring if a ring can be set up, else pread, with the reason in
  // notes()). Throws strata::Error if kUring is asked for explicitly and cannot be set up.
  static std::unique_ptr<ExpertReader> create(const ReaderConfig& config);
  virtual ~ExpertReader();
  ExpertReader(const ExpertReader&) = delete;
  ExpertReader& operator=(const ExpertReader&) = delete;

  // Opens a file for reading (O_DIRECT unless refused by the file system; logged in notes()).
  // Returns its index for ReadSpan::file. Throws strata::Error naming the file if it cannot open.
  int add_file(const std::filesystem::path& path);
  const std::filesystem::path& file_path(int file) const;
  uint64_t file_size(int file) const;

  // Registers [p, p+n) for io_uring fixed-buffer reads (call before submitting; no effect for
  // pread). A failure (e.g. RLIMIT_MEMLOCK) is logged in notes() and reads stay unregistered.
  virtual void register_buffer(void* p, uint64_t n) = 0;

  // Queues a job; returns at once. `done` is called exactly once, on an I/O thread.
  void submit(ReadJob job, ReadCompletion done);
  // Moves a queued prefetch job to demand priority (no effect once its reads started).
  void promote(uint64_t tag);
  // Blocks until every submitted job has completed. Ends a pause first.
  void drain();
  // Test hook: while paused, no read is handed to the backend (reads already in flight finish), so
  // a test can queue jobs and promotions in a known order before any of them starts.
  void pause(bool paused);

  IoBackend backend() const { return backend_; }
  const char* backend_name() const { return io_backend_name(backend_); }
  const ReaderConfig& config() const { return config_; }
  std::vector<std::string> notes() const;  // start-up decisions and fallbacks, for the log
  ReaderStats stats() const;

 protected:
  struct Job;
  struct Block {
    Job* job = nullptr;
    int file = 0;
    uint64_t offset = 0, len = 0;  // the block; `done` bytes already read
    uint8_t* dst = nullptr;
    uint64_t done = 0;
    int attempts = 0;
  };
  ExpertReader(const ReaderConfig& config, IoBackend backend);
  // Backend hooks.
  virtual void wake() = 0;  // new work is queued
  // Takes the next block to read (demand jobs first), or false when none is queued.
  bool next_block(Block& out);
  // Applies fault injection to a raw read result (bytes or -errno) of block b.
  int inject_fault(const Block& b, int res);
  // Accounts a finished read of block b (res = bytes or -errno): retries, EOF zero-fill, errors,
  // job completion. Called without the lock held.
  void complete_block(Block& b, int res);
  void add_note(std::string s);
  int fd(int file) const;
  bool has_queued_work();
  void stop_requested_wake();
  void note_fixed_read();
  ReaderConfig config_;
  IoBackend backend_;
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace strata
