// Durable output of a batch job (DESIGN decision 8): the output file (OpenAI batch records, one
// per line) and its journal OUTPUT.journal, a header naming the job (input fingerprint, shard)
// followed by one entry "LINE END" per committed record: the input line it answers and the output
// file's length once it was written.
//
// Commit order for each result: append the record to the output, fdatasync it; append the entry
// to the journal, fdatasync it. A record is committed once its entry is on disk. So after a crash
// at any point:
//   - a committed record is in the output (it was synced before its entry was written): nothing
//     finished is lost;
//   - the output may hold one record past the last entry (synced, entry not yet written) and the
//     journal may end in a partial entry: resume cuts the journal back to its last whole entry and
//     the output back to that entry's END, so the request runs again and is written once.
// The journal is locked (flock) while a job writes it, so two jobs cannot share an output.
// Not here: what a record holds (engine/batch_format.h), the scheduling (engine/batch_scheduler.h).
#pragma once
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace strata::engine {

// What a job's output answers: resuming or merging against a different input is refused.
struct JobHeader {
  std::string input;         // the input file as given (for messages)
  uint64_t input_bytes = 0;  // its size
  std::string input_fnv;     // FNV-1a 64 of its bytes (hex)
  int64_t requests = 0;      // request lines (non-blank) this shard answers
  int rank = 0, ranks = 1;   // shard: input lines i (0-based) with i % ranks == rank
  bool same_job(const JobHeader& o) const {
    return input_bytes == o.input_bytes && input_fnv == o.input_fnv && requests == o.requests &&
           rank == o.rank && ranks == o.ranks;
  }
};

std::filesystem::path journal_path(const std::filesystem::path& output);

class BatchOutput {
 public:
  // Creates `output` and its journal; refuses (strata::Error) when either exists, unless
  // `resume`, in which case the job is recovered as described above (a job that never wrote its
  // header starts afresh). The header must match the existing job's.
  BatchOutput(const std::filesystem::path& output, const JobHeader& header, bool resume);
  ~BatchOutput();
  BatchOutput(const BatchOutput&) = delete;
  BatchOutput& operator=(const BatchOutput&) = delete;

  // Input lines (1-based) that already have a committed record.
  const std::set<int64_t>& done() const { return done_; }
  // Bytes cut from the output's tail / the journal's tail by recovery (for the start-up line).
  uint64_t recovered_output_bytes() const { return cut_output_; }
  uint64_t recovered_journal_bytes() const { return cut_journal_; }

  // Appends `record` (one JSON line, no line feed) answering input line `line` and commits it.
  // Throws strata::Error on an I/O failure (naming the file) or a line answered twice.
  void append(int64_t line, const std::string& record);

 private:
  void open_job(const JobHeader& header, bool resume);
  std::filesystem::path output_, journal_;
  int out_fd_ = -1, journal_fd_ = -1;
  uint64_t out_size_ = 0;
  std::set<int64_t> done_;
  uint64_t cut_output_ = 0, cut_journal_ = 0;
};

// A job's committed records, read back (for `strata batch merge` and tests): the header and
// (line, record) in commit order. Ignores an uncommitted tail exactly as resume would cut it.
struct JobPart {
  std::filesystem::path output;
  JobHeader header;
  std::vector<std::pair<int64_t, std::string>> records;
};
JobPart read_job_part(const std::filesystem::path& output);

// Merges complete parts into one output in input-line order. Every part must answer the same
// input, the parts must be exactly the shards 0..N-1 of one job, and each must be complete (as many
// records as its header's requests); otherwise strata::Error says which part is missing or
// incomplete. `merged` must not exist. Returns the number of records written.
int64_t merge_job_parts(const std::vector<std::filesystem::path>& parts,
                        const std::filesystem::path& merged);

// The part of rank r of n: OUTPUT itself when n == 1, else "OUTPUT.rank-R-of-N".
std::filesystem::path part_path(const std::filesystem::path& output, int rank, int ranks);

}  // namespace strata::engine
