// User-facing file handling (storage/files.h).
#include "storage/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "storage/error.h"

namespace strata {

namespace fs = std::filesystem;

namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symbolic link";
  return "not a regular file";
}

}  // namespace

bool file_id(const fs::path& p, FileId* out) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return false;
  *out = {st.st_dev, st.st_ino};
  return true;
}

std::string read_small_file(const fs::path& p, const std::string& what, uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  const int fd = ::open(p.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw Error(what + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(what + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(what + ": is " + kind_of(st.st_mode) + ", expected a regular file");
  }
  if (uint64_t(st.st_size) > max_bytes) {
    ::close(fd);
    throw Error(what + ": " + std::to_string(st.st_size) + " bytes, more than the " +
                std::to_string(max_bytes) + " this file may hold");
  }
  std::string s(size_t(st.st_size), '\0');
  size_t got = 0;
  while (got < s.size()) {
    const ssize_t r = ::read(fd, s.data() + got, s.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      throw Error(what + ": read failed: " + std::strerror(err));
    }
    if (r == 0) break;  // shrank while we read: use what is there
    got += size_t(r);
  }
  ::close(fd);
  s.resize(got);
  return s;
}

OutputPath::OutputPath(std::string flag, const fs::path& path, const std::vector<FileId>& inputs)
    : flag_(std::move(flag)), path_(path) {
  const std::string where = flag_ + " " + path.string();
  if (path.empty()) throw Error(flag_ + ": empty path");
  // The target itself, following symlinks (what rename would replace is the link; what the user
  // names is the file behind it: refuse both when either is an input).
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode))
      throw Error(where + ": is " + std::string(kind_of(st.st_mode)) +
                  "; an output must be a regular file (it is written beside and renamed over)");
    for (const FileId& in : inputs)
      if (in.dev == st.st_dev && in.ino == st.st_ino)
        throw Error(where +
                    ": is a file this command reads (the model's or an input); "
                    "refusing to replace it");
  }
  // The link itself, and the ".partial" file written beside the target (truncated on open).
  fs::path partial = path;
  partial += ".partial";
  for (const fs::path& q : {path, partial}) {
    struct stat lst {};
    if (::lstat(q.c_str(), &lst) == 0)
      for (const FileId& in : inputs)
        if (in.dev == lst.st_dev && in.ino == lst.st_ino)
          throw Error(flag_ + " " + q.string() +
                      ": is a file this command reads; refusing to replace it");
  }
  fs::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  struct stat dst {};
  if (::stat(dir.c_str(), &dst) != 0)
    throw Error(where + ": directory " + dir.string() + " does not exist");
  if (!S_ISDIR(dst.st_mode)) throw Error(where + ": " + dir.string() + " is not a directory");
  if (::access(dir.c_str(), W_OK) != 0)
    throw Error(where + ": directory " + dir.string() +
                " is not writable: " + std::strerror(errno));
  // access() says yes to root on read-only places (/proc, a read-only mount): create the file
  // the writer will create, and remove it again.
  const int fd = open_partial_for_write(partial, where);
  ::close(fd);
  ::unlink(partial.c_str());
}

std::vector<FileId> input_file_ids(const fs::path& dir, const std::vector<fs::path>& extra) {
  std::vector<FileId> ids;
  std::error_code ec;
  if (fs::is_directory(dir, ec))
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      FileId id;
      if (e.is_regular_file(ec) && file_id(e.path(), &id)) ids.push_back(id);
    }
  for (const fs::path& p : extra) {
    FileId id;
    if (!p.empty() && file_id(p, &id)) ids.push_back(id);
  }
  return ids;
}

int open_partial_for_write(const fs::path& p, const std::string& what) {
  // O_NOFOLLOW: a planted symlink is not followed; O_NONBLOCK: a FIFO does not block the open.
  const int fd =
      ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(what + ": cannot create " + p.string() + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(what + ": " + p.string() + " exists and is not a regular file");
  }
  // Back to blocking writes (O_NONBLOCK has no effect on regular files, but be explicit).
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

void write_file_atomic(const fs::path& p, std::string_view data, const std::string& what) {
  fs::path tmp = p;
  tmp += ".partial";
  const int fd = open_partial_for_write(tmp, what);
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t w = ::write(fd, data.data() + off, data.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error(what + ": write to " + tmp.string() + " failed: " + std::strerror(err));
    }
    off += size_t(w);
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(what + ": close of " + tmp.string() + " failed: " + std::strerror(err));
  }
  if (::rename(tmp.c_str(), p.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(what + ": cannot rename " + tmp.string() + " to " + p.string() + ": " +
                std::strerror(err));
  }
}

}  // namespace strata
