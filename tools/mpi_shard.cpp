// MpiJob (tools/mpi_shard.h): OpenMPI when built with it, a one-rank stand-in otherwise.
#include "tools/mpi_shard.h"

#include <cstdlib>
#include <string>

#include "storage/error.h"

#if STRATA_HAVE_MPI
// The C API only: OpenMPI's deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace strata::tools {

namespace {

// Launchers export the world size: OpenMPI's mpirun (OMPI_COMM_WORLD_SIZE), PMIx (PMIX_RANK),
// Hydra/Slurm PMI (PMI_SIZE).
bool launched_by_mpi(int* size) {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const char* s = std::getenv(v)) {
      *size = std::atoi(s);
      return true;
    }
  }
  *size = 0;
  return std::getenv("PMIX_RANK") != nullptr;
}

}  // namespace

MpiJob::MpiJob() {
  int size = 0;
  if (!launched_by_mpi(&size)) return;
#if STRATA_HAVE_MPI
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks_);
  active_ = true;
#else
  if (size > 1)
    throw Error("launched by mpirun with " + std::to_string(size) +
                " ranks, but this strata was built without MPI (install libopenmpi-dev and "
                "rebuild; scripts/install-deps.sh does)");
#endif
}

MpiJob::~MpiJob() {
#if STRATA_HAVE_MPI
  if (active_) MPI_Finalize();
#endif
}

std::vector<double> MpiJob::sum(const std::vector<double>& v) const {
#if STRATA_HAVE_MPI
  if (active_) {
    std::vector<double> out(v.size());
    MPI_Allreduce(v.data(), out.data(), int(v.size()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return out;
  }
#endif
  return v;
}

void MpiJob::abort(int status) const {
#if STRATA_HAVE_MPI
  if (active_ && ranks_ > 1) MPI_Abort(MPI_COMM_WORLD, status);
#endif
  std::exit(status);
}

}  // namespace strata::tools
