// The batch output and its journal (engine/batch_journal.h): creation without overwriting,
// recovery on resume, commit of each record, read-back and merge of parts.
#include "engine/batch_journal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "storage/error.h"

namespace strata::engine {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void io_fail(const fs::path& p, const std::string& what) {
  throw Error(p.string() + ": " + what + ": " + std::strerror(errno));
}

void write_all(int fd, const char* data, size_t n, const fs::path& p) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      io_fail(p, "write failed");
    }
    data += w;
    n -= size_t(w);
  }
}

void sync_fd(int fd, const fs::path& p) {
  while (::fdatasync(fd) != 0) {
    if (errno != EINTR) io_fail(p, "fdatasync failed");
  }
}

// Makes a created or renamed entry itself durable.
void sync_dir(const fs::path& file) {
  fs::path dir = file.parent_path();
  if (dir.empty()) dir = ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) io_fail(dir, "cannot open directory");
  ::fsync(fd);  // some file systems refuse fsync on directories; nothing more to do then
  ::close(fd);
}

std::string read_all(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) io_fail(p, "cannot open");
  std::string s;
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      io_fail(p, "read failed");
    }
    if (r == 0) break;
    s.append(buf, size_t(r));
  }
  ::close(fd);
  return s;
}

uint64_t size_of(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) io_fail(p, "cannot stat");
  return uint64_t(st.st_size);
}

std::string header_line(const JobHeader& h) {
  nlohmann::ordered_json j;
  j["strata_batch_journal"] = 1;
  j["input"] = h.input;
  j["input_bytes"] = h.input_bytes;
  j["input_fnv"] = h.input_fnv;
  j["requests"] = h.requests;
  j["rank"] = h.rank;
  j["ranks"] = h.ranks;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

JobHeader parse_header(const std::string& line, const fs::path& journal) {
  auto j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("strata_batch_journal", 0) != 1)
    throw Error(journal.string() + ": line 1: not a strata batch journal header");
  JobHeader h;
  try {
    h.input = j.at("input").get<std::string>();
    h.input_bytes = j.at("input_bytes").get<uint64_t>();
    h.input_fnv = j.at("input_fnv").get<std::string>();
    h.requests = j.at("requests").get<int64_t>();
    h.rank = j.at("rank").get<int>();
    h.ranks = j.at("ranks").get<int>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(journal.string() + ": line 1: bad journal header (" + e.what() + ")");
  }
  return h;
}

// The journal's content split into its header and its whole, valid entries. `valid_bytes` is the
// length of the journal up to the last valid entry; anything after it is an interrupted write.
struct ParsedJournal {
  bool has_header = false;
  JobHeader header;
  std::vector<std::pair<int64_t, uint64_t>> entries;  // (line, output end)
  uint64_t valid_bytes = 0;
};

bool parse_entry(std::string_view s, int64_t& line, uint64_t& end) {
  const size_t sp = s.find(' ');
  if (sp == std::string_view::npos || sp == 0 || sp + 1 >= s.size()) return false;
  auto num = [](std::string_view d, uint64_t& v) {
    if (d.empty() || d.size() > 19) return false;
    v = 0;
    for (char ch : d) {
      if (ch < '0' || ch > '9') return false;
      v = v * 10 + uint64_t(ch - '0');
    }
    return true;
  };
  uint64_t l = 0;
  if (!num(s.substr(0, sp), l) || !num(s.substr(sp + 1), end) || l == 0) return false;
  line = int64_t(l);
  return true;
}

ParsedJournal parse_journal(const std::string& text, const fs::path& journal) {
  ParsedJournal pj;
  const size_t nl = text.find('\n');
  if (nl == std::string::npos) return pj;  // no whole header: the job never started
  pj.header = parse_header(text.substr(0, nl), journal);
  pj.has_header = true;
  size_t pos = nl + 1;
  pj.valid_bytes = pos;
  uint64_t prev_end = 0;
  std::set<int64_t> seen;
  while (pos < text.size()) {
    const size_t e = text.find('\n', pos);
    if (e == std::string::npos) break;  // a partial entry: cut
    int64_t line = 0;
    uint64_t end = 0;
    // An entry that does not parse can only be the torn tail of an interrupted append (entries
    // are appended and synced one at a time): stop there.
    if (!parse_entry(std::string_view(text).substr(pos, e - pos), line, end) || end <= prev_end)
      break;
    if (!seen.insert(line).second)
      throw Error(journal.string() + ": input line " + std::to_string(line) +
                  " is answered twice; the journal was modified");
    pj.entries.emplace_back(line, end);
    prev_end = end;
    pos = e + 1;
    pj.valid_bytes = pos;
  }
  return pj;
}

int open_locked(const fs::path& p, int flags) {
  const int fd = ::open(p.c_str(), flags | O_CLOEXEC, 0644);
  if (fd < 0) io_fail(p, (flags & O_EXCL) ? "cannot create" : "cannot open");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    throw Error(p.string() + ": in use by another strata batch job");
  }
  return fd;
}

void truncate_to(int fd, uint64_t size, const fs::path& p) {
  if (::ftruncate(fd, off_t(size)) != 0) io_fail(p, "cannot truncate");
  if (::lseek(fd, 0, SEEK_END) < 0) io_fail(p, "cannot seek");
  sync_fd(fd, p);
}

}  // namespace

fs::path journal_path(const fs::path& output) {
  return fs::path(output.string() + ".journal");
}

fs::path part_path(const fs::path& output, int rank, int ranks) {
  if (ranks <= 1) return output;
  return fs::path(output.string() + ".rank-" + std::to_string(rank) + "-of-" +
                  std::to_string(ranks));
}

BatchOutput::BatchOutput(const fs::path& output, const JobHeader& header, bool resume)
    : output_(output), journal_(journal_path(output)) {
  try {
    open_job(header, resume);
  } catch (...) {
    // No destructor runs for a constructor that throws: release the files (and the lock) here.
    if (out_fd_ >= 0) ::close(out_fd_);
    if (journal_fd_ >= 0) ::close(journal_fd_);
    throw;
  }
}

void BatchOutput::open_job(const JobHeader& header, bool resume) {
  const bool out_exists = fs::exists(output_), journal_exists = fs::exists(journal_);
  if (!resume && (out_exists || journal_exists))
    throw Error((out_exists ? output_ : journal_).string() +
                ": exists; add --resume to continue that job, or choose another output (an "
                "existing output is never overwritten)");
  bool fresh = !journal_exists;
  if (journal_exists) {
    journal_fd_ = open_locked(journal_, O_RDWR | O_APPEND);
    const ParsedJournal pj = parse_journal(read_all(journal_), journal_);
    const uint64_t out_bytes = out_exists ? size_of(output_) : 0;
    if (!pj.has_header) {
      // Killed while creating the job: nothing can have been committed.
      if (out_bytes > 0)
        throw Error(journal_.string() + ": has no header but " + output_.string() +
                    " holds data; refusing to touch them");
      truncate_to(journal_fd_, 0, journal_);
      fresh = true;
    } else {
      if (!pj.header.same_job(header))
        throw Error(journal_.string() + ": the job being resumed answers " + pj.header.input +
                    " (" + std::to_string(pj.header.input_bytes) + " bytes, fnv " +
                    pj.header.input_fnv + ", " + std::to_string(pj.header.requests) +
                    " requests, rank " + std::to_string(pj.header.rank) + " of " +
                    std::to_string(pj.header.ranks) + "), not " + header.input + " (" +
                    std::to_string(header.input_bytes) + " bytes, fnv " + header.input_fnv + ", " +
                    std::to_string(header.requests) + " requests, rank " +
                    std::to_string(header.rank) + " of " + std::to_string(header.ranks) + ")");
      const uint64_t committed = pj.entries.empty() ? 0 : pj.entries.back().second;
      if (committed > out_bytes)
        throw Error(output_.string() + ": holds " + std::to_string(out_bytes) +
                    " bytes but its journal commits " + std::to_string(committed) +
                    "; the output was modified or truncated");
      out_fd_ =
          ::open(output_.c_str(), O_RDWR | O_APPEND | O_CLOEXEC | (out_exists ? 0 : O_CREAT), 0644);
      if (out_fd_ < 0) io_fail(output_, "cannot open");
      if (committed > 0) {
        char last = 0;
        if (::pread(out_fd_, &last, 1, off_t(committed - 1)) != 1 || last != '\n')
          throw Error(output_.string() + ": byte " + std::to_string(committed - 1) +
                      " should end a record (line feed); the output was modified");
      }
      cut_output_ = out_bytes - committed;
      cut_journal_ = size_of(journal_) - pj.valid_bytes;
      truncate_to(out_fd_, committed, output_);
      truncate_to(journal_fd_, pj.valid_bytes, journal_);
      out_size_ = committed;
      for (const auto& [line, end] : pj.entries) done_.insert(line);
    }
  } else if (out_exists) {
    throw Error(output_.string() + ": exists without its journal " + journal_.string() +
                "; it was not written by strata batch (or the journal was removed); refusing to "
                "touch it");
  }
  if (fresh) {
    // The journal (with its header) first, then the output: a job killed in between is seen as
    // never started.
    if (journal_fd_ < 0) journal_fd_ = open_locked(journal_, O_RDWR | O_APPEND | O_CREAT | O_EXCL);
    const std::string h = header_line(header);
    write_all(journal_fd_, h.data(), h.size(), journal_);
    sync_fd(journal_fd_, journal_);
    if (out_fd_ < 0) {
      out_fd_ = ::open(output_.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
      if (out_fd_ < 0) io_fail(output_, "cannot create");
    }
    truncate_to(out_fd_, 0, output_);
    sync_dir(output_);
  }
}

BatchOutput::~BatchOutput() {
  if (out_fd_ >= 0) ::close(out_fd_);
  if (journal_fd_ >= 0) ::close(journal_fd_);  // releases the lock
}

void BatchOutput::append(int64_t line, const std::string& record) {
  if (!done_.insert(line).second)
    throw Error("internal: input line " + std::to_string(line) + " answered twice");
  std::string rec = record;
  rec += '\n';
  write_all(out_fd_, rec.data(), rec.size(), output_);
  sync_fd(out_fd_, output_);
  out_size_ += rec.size();
  const std::string entry = std::to_string(line) + " " + std::to_string(out_size_) + "\n";
  write_all(journal_fd_, entry.data(), entry.size(), journal_);
  sync_fd(journal_fd_, journal_);
}

JobPart read_job_part(const fs::path& output) {
  const fs::path journal = journal_path(output);
  if (!fs::exists(journal))
    throw Error(journal.string() + ": missing (every part of a strata batch job has a journal)");
  const ParsedJournal pj = parse_journal(read_all(journal), journal);
  if (!pj.has_header) throw Error(journal.string() + ": the job never started (no header)");
  const std::string out = fs::exists(output) ? read_all(output) : std::string();
  JobPart part;
  part.output = output;
  part.header = pj.header;
  uint64_t begin = 0;
  for (const auto& [line, end] : pj.entries) {
    if (end > out.size() || out[end - 1] != '\n')
      throw Error(output.string() + ": does not match its journal at input line " +
                  std::to_string(line) + "; the output was modified");
    part.records.emplace_back(line, out.substr(begin, end - 1 - begin));
    begin = end;
  }
  return part;
}

int64_t merge_job_parts(const std::vector<fs::path>& parts, const fs::path& merged) {
  if (parts.empty()) throw Error("strata batch merge: no parts given");
  if (fs::exists(merged))
    throw Error(merged.string() + ": exists (merge never overwrites an output)");
  std::vector<JobPart> ps;
  for (const auto& p : parts) ps.push_back(read_job_part(p));
  const JobHeader& h0 = ps[0].header;
  std::map<int, const JobPart*> by_rank;
  for (const JobPart& p : ps) {
    const JobHeader& h = p.header;
    if (h.input_fnv != h0.input_fnv || h.input_bytes != h0.input_bytes || h.ranks != h0.ranks)
      throw Error(p.output.string() + ": answers " + h.input + " with " + std::to_string(h.ranks) +
                  " ranks, but " + ps[0].output.string() + " answers " + h0.input + " with " +
                  std::to_string(h0.ranks) + " ranks (fnv " + h.input_fnv + " vs " + h0.input_fnv +
                  "): not parts of one job");
    if (!by_rank.emplace(h.rank, &p).second)
      throw Error(p.output.string() + ": rank " + std::to_string(h.rank) +
                  " is given twice (also " + by_rank[h.rank]->output.string() + ")");
    if (int64_t(p.records.size()) != h.requests)
      throw Error(p.output.string() + ": incomplete (" + std::to_string(p.records.size()) + " of " +
                  std::to_string(h.requests) +
                  " results); finish it with strata batch --resume before merging");
  }
  for (int r = 0; r < h0.ranks; ++r)
    if (!by_rank.count(r))
      throw Error("strata batch merge: the part of rank " + std::to_string(r) + " of " +
                  std::to_string(h0.ranks) + " is missing (give every OUTPUT.rank-R-of-" +
                  std::to_string(h0.ranks) + ")");
  std::vector<std::pair<int64_t, const std::string*>> all;
  for (const JobPart& p : ps)
    for (const auto& [line, rec] : p.records) all.emplace_back(line, &rec);
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < all.size(); ++i)
    if (all[i].first == all[i - 1].first)
      throw Error("strata batch merge: input line " + std::to_string(all[i].first) +
                  " is answered by two parts");
  // Written to a temporary name and linked into place: link() never replaces, and a merge
  // killed half-way leaves no partial output under the final name.
  const fs::path tmp = merged.string() + ".merging";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_fail(tmp, "cannot create");
  std::string buf;
  for (const auto& [line, rec] : all) {
    buf += *rec;
    buf += '\n';
    if (buf.size() > (1u << 20)) {
      write_all(fd, buf.data(), buf.size(), tmp);
      buf.clear();
    }
  }
  write_all(fd, buf.data(), buf.size(), tmp);
  sync_fd(fd, tmp);
  ::close(fd);
  if (::link(tmp.c_str(), merged.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    errno = err;
    io_fail(merged, "cannot create");
  }
  ::unlink(tmp.c_str());
  sync_dir(merged);
  return int64_t(all.size());
}

}  // namespace strata::engine
