// The batch job's output + journal (engine/batch_journal.h): an existing output is refused
// without resume; resume recovers from every crash point of the commit sequence (record written
// but not journaled, partial record, partial journal entry, header never written) without losing
// or repeating a committed record; a different job is refused; two writers are refused; parts
// merge in input order and incomplete or missing parts are named.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include "engine/batch_journal.h"
#include "storage/error.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace strata::engine;

namespace {

using strata::test::slurp;

void append_raw(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::app);
  f << s;
}

JobHeader header(int rank = 0, int ranks = 1, int64_t requests = 10) {
  JobHeader h;
  h.input = "in.jsonl";
  h.input_bytes = 1234;
  h.input_fnv = "00112233aabbccdd";
  h.requests = requests;
  h.rank = rank;
  h.ranks = ranks;
  return h;
}

std::string rec(int64_t line) {
  return "{\"line\":" + std::to_string(line) + "}";
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const strata::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("batch journal: create, refuse an existing output, resume", "[engine][batch]") {
  const fs::path d = strata::test::scratch_dir("batch_journal_basic");
  const fs::path out = d / "out.jsonl";
  {
    BatchOutput o(out, header(), false);
    CHECK(o.done().empty());
    o.append(3, rec(3));
    o.append(1, rec(1));
    CHECK_THROWS(o.append(3, rec(3)));  // answered twice: refused
  }
  CHECK(slurp(out) == rec(3) + "\n" + rec(1) + "\n");
  CHECK(slurp(journal_path(out)).find("\n3 11\n1 22\n") != std::string::npos);
  const std::string before = slurp(out);
  const std::string e = error_of([&] { BatchOutput o(out, header(), false); });
  CHECK(e.find("exists; add --resume") != std::string::npos);
  CHECK(slurp(out) == before);  // never overwritten
  {
    BatchOutput o(out, header(), true);
    CHECK(o.done() == std::set<int64_t>{1, 3});
    CHECK(o.recovered_output_bytes() == 0);
    o.append(2, rec(2));
  }
  CHECK(slurp(out) == before + rec(2) + "\n");
}

TEST_CASE("batch journal: resume cuts what was not committed, at every crash point",
          "[engine][batch]") {
  const fs::path d = strata::test::scratch_dir("batch_journal_crash");
  const fs::path out = d / "out.jsonl";
  {
    BatchOutput o(out, header(), false);
    o.append(1, rec(1));
    o.append(2, rec(2));
  }
  const std::string committed = slurp(out);
  const std::string journal = slurp(journal_path(out));
  struct Crash {
    const char* name;
    std::string out_tail, journal_tail;
  };
  const std::vector<Crash> crashes = {
      {"killed inside the record write", "{\"li", ""},
      {"killed after the record, before its entry", rec(4) + "\n", ""},
      {"killed inside the entry write", rec(4) + "\n", "4 3"},
      {"entry torn to garbage", rec(4) + "\n", "4 \x01\n"},
  };
  for (const Crash& c : crashes) {
    SECTION(c.name) {
      append_raw(out, c.out_tail);
      append_raw(journal_path(out), c.journal_tail);
      {
        BatchOutput o(out, header(), true);
        CHECK(o.done() == std::set<int64_t>{1, 2});
        CHECK(o.recovered_output_bytes() == c.out_tail.size());
        CHECK(o.recovered_journal_bytes() == c.journal_tail.size());
        CHECK(slurp(out) == committed);
        CHECK(slurp(journal_path(out)) == journal);
        o.append(4, rec(4));  // runs again, written once
      }
      CHECK(slurp(out) == committed + rec(4) + "\n");
      const JobPart p = read_job_part(out);
      REQUIRE(p.records.size() == 3);
      CHECK(p.records[2] == std::make_pair(int64_t(4), rec(4)));
    }
  }
}

TEST_CASE("batch journal: a job that never wrote its header starts afresh", "[engine][batch]") {
  const fs::path d = strata::test::scratch_dir("batch_journal_noheader");
  const fs::path out = d / "out.jsonl";
  append_raw(journal_path(out), "{\"strata_batch");  // killed while writing the header
  {
    BatchOutput o(out, header(), true);
    CHECK(o.done().empty());
    o.append(5, rec(5));
  }
  CHECK(read_job_part(out).records.size() == 1);
}

TEST_CASE("batch journal: refusals name the file and the reason", "[engine][batch]") {
  const fs::path d = strata::test::scratch_dir("batch_journal_refuse");
  const fs::path out = d / "out.jsonl";
  append_raw(out, "someone else's data\n");
  std::string e = error_of([&] { BatchOutput o(out, header(), true); });
  CHECK(e.find("exists without its journal") != std::string::npos);
  CHECK(slurp(out) == "someone else's data\n");

  const fs::path out2 = d / "out2.jsonl";
  { BatchOutput o(out2, header(), false); }
  JobHeader other = header();
  other.input_fnv = "ffffffffffffffff";
  e = error_of([&] { BatchOutput o(out2, other, true); });
  CHECK(e.find("the job being resumed answers") != std::string::npos);
  e = error_of([&] { BatchOutput o(out2, header(1, 2), true); });
  CHECK(e.find("rank 0 of 1") != std::string::npos);

  BatchOutput first(out2, header(), true);
  e = error_of([&] { BatchOutput o(out2, header(), true); });
  CHECK(e.find("in use by another strata batch job") != std::string::npos);
}

TEST_CASE("batch journal: output modified behind the journal's back is refused",
          "[engine][batch]") {
  const fs::path d = strata::test::scratch_dir("batch_journal_modified");
  const fs::path out = d / "out.jsonl";
  {
    BatchOutput o(out, header(), false);
    o.append(1, rec(1));
  }
  fs::resize_file(out, 3);
  const std::string e = error_of([&] { BatchOutput o(out, header(), true); });
  CHECK(e.find("holds 3 bytes but its journal commits") != std::string::npos);
}

TEST_CASE("batch journal: merge parts in input order", "[engine][batch]") {
  const fs::path d = strata::test::scratch_dir("batch_journal_merge");
  const fs::path out = d / "out.jsonl";
  const fs::path p0 = part_path(out, 0, 2), p1 = part_path(out, 1, 2);
  CHECK(p0.filename() == "out.jsonl.rank-0-of-2");
  CHECK(part_path(out, 0, 1) == out);
  {
    BatchOutput a(p0, header(0, 2, 2), false);  // lines 1, 3 (0-based 0, 2)
    a.append(3, rec(3));
    a.append(1, rec(1));
    BatchOutput b(p1, header(1, 2, 2), false);  // lines 2, 4
    b.append(4, rec(4));
  }
  std::string e = error_of([&] { merge_job_parts({p0, p1}, d / "m.jsonl"); });
  CHECK(e.find("incomplete (1 of 2 results)") != std::string::npos);
  CHECK_FALSE(fs::exists(d / "m.jsonl"));
  {
    BatchOutput b(p1, header(1, 2, 2), true);
    b.append(2, rec(2));
  }
  e = error_of([&] { merge_job_parts({p0}, d / "m.jsonl"); });
  CHECK(e.find("rank 1 of 2 is missing") != std::string::npos);
  e = error_of([&] { merge_job_parts({p0, p0}, d / "m.jsonl"); });
  CHECK(e.find("given twice") != std::string::npos);

  CHECK(merge_job_parts({p1, p0}, d / "m.jsonl") == 4);
  CHECK(slurp(d / "m.jsonl") == rec(1) + "\n" + rec(2) + "\n" + rec(3) + "\n" + rec(4) + "\n");
  e = error_of([&] { merge_job_parts({p0, p1}, d / "m.jsonl"); });
  CHECK(e.find("exists") != std::string::npos);

  const fs::path q = d / "other.jsonl";
  {
    JobHeader h = header(0, 1, 0);
    h.input_fnv = "0000000000000001";
    BatchOutput o(q, h, false);
  }
  e = error_of([&] { merge_job_parts({p0, q}, d / "m2.jsonl"); });
  CHECK(e.find("not parts of one job") != std::string::npos);
}
