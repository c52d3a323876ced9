// Scale-out of `strata batch` over MPI ranks (DESIGN decision 6): under `mpirun -np N`, rank r
// answers the input lines i (0-based) with i % N == r and writes its own output part; at the end
// the ranks' counts are summed for one job summary. MPI is initialised only when the process was
// launched by an MPI launcher (so a plain `strata batch` never starts MPI), and is optional at
// build time (STRATA_HAVE_MPI); without it an mpirun launch is refused with a clear message.
// Not here: the sharding of the input (tools/cmd_batch.cpp), merging parts
// (engine/batch_journal.h).
#pragma once
#include <vector>

namespace strata::tools {

class MpiJob {
 public:
  MpiJob();   // MPI_Init when launched by mpirun; rank 0 of 1 otherwise
  ~MpiJob();  // MPI_Finalize
  MpiJob(const MpiJob&) = delete;
  MpiJob& operator=(const MpiJob&) = delete;

  bool active() const { return active_; }
  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  // Element-wise sums over all ranks, returned on every rank (collective: every rank calls it).
  std::vector<double> sum(const std::vector<double>& v) const;
  // Ends every rank of the job (a rank that fails must not leave the others waiting).
  [[noreturn]] void abort(int status) const;

 private:
  bool active_ = false;
  int rank_ = 0, ranks_ = 1;
};

}  // namespace strata::tools
