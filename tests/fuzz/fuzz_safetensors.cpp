// Fuzz target: a whole safetensors file (8-byte header length, JSON header, data) → the reader's
// full validation, then every tensor's first and last byte read through the mapping (ASan sees
// any span the validation let past the end). The bytes go to a memfd, so the real open / fstat /
// mmap path runs. Seeds: small files written from the golden tensors (fuzz_seeds).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>

#include "fuzz_target.h"
#include "storage/safetensors.h"

STRATA_FUZZ_TARGET(safetensors) {
  const int fd = ::memfd_create("strata-fuzz", MFD_CLOEXEC);
  if (fd < 0) return;
  size_t off = 0;
  while (off < size) {
    const ssize_t w = ::write(fd, data + off, size - off);
    if (w <= 0) break;
    off += size_t(w);
  }
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  try {
    strata::SafetensorsFile f(path);
    volatile uint8_t sink = 0;
    for (const strata::TensorInfo& t : f.tensors()) {
      auto b = f.bytes(t);
      if (!b.empty()) sink = uint8_t(sink + b.front() + b.back());
      if (f.find(t.name) != &t) __builtin_trap();
    }
    (void)sink;
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}
