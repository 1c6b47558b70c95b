//===- CommBackends.h - the communication backends --------------*- C++ -*-===//
//
// How each backend is made; CommBackend.cpp chooses among them. The
// backends depend on CommProtocol.h only, never on one another's files or
// on the choice.
//
//===----------------------------------------------------------------------===//
#ifndef MOERT_SRC_COMMBACKENDS_H
#define MOERT_SRC_COMMBACKENDS_H

#include "CommProtocol.h"
#include "TcpStore.h"

#include <memory>
#include <string>

namespace moert::comm {

/// The host communicator: MPI or one rank (never NCCL), for buffers in
/// host memory and the MPI bootstrap of NCCL (CommBackend.cpp).
Communicator &hostWorld();

/// One rank: every exchange is a copy (CommBackend.cpp).
std::unique_ptr<Communicator> createSelfCommunicator();

#ifdef MOERT_HAVE_MPI
/// MPI_COMM_WORLD (MpiComm.cpp); MPI_Init_thread unless MPI is initialized.
std::unique_ptr<Communicator> createMpiCommunicator(const LaunchEnv &env);
/// If MPI is initialized (and not finalized), ends the job with MPI_Abort.
/// Returns otherwise.
void abortMpiJob(int code);
#endif

/// Empty if libnccl loads (MOERT_NCCL_LIBRARY, else libnccl.so.2), else
/// why not.
std::string ncclLibraryError();

/// Empty if the NCCL backend can run here (libnccl loads, a GPU is there),
/// else why not.
std::string ncclUnavailable();

struct NcclBootstrap {
  int rank = 0, size = 1;
  /// The MPI communicator when launched by MPI (the id goes through it, and
  /// an abort ends the job with MPI_Abort); else the TCP store.
  Communicator *mpi = nullptr;
  StoreAddress store;
  /// A group's communicator (Communicator::split): the ids go through the
  /// communicator it splits, `colors` groups' at once, this rank's group
  /// being `color` (the bootstrap's rank and size are within it).
  Communicator *parent = nullptr;
  int color = 0, colors = 1;
};

/// The NCCL communicator (NcclComm.cpp): libnccl opened at run time
/// (MOERT_NCCL_LIBRARY overrides its path), the primary context of this
/// process's GPU, the ncclUniqueId shared by MPI or the TCP store. Failures
/// are errors naming what is missing.
std::unique_ptr<Communicator> createNcclCommunicator(const NcclBootstrap &b);

/// Device buffers over a host communicator (MPI, one rank; StagedComm.cpp):
/// every exchange copies them to host memory and back.
std::unique_ptr<Communicator> createStagedCommunicator(Communicator &host);
/// The same, owning its host communicator (a group's).
std::unique_ptr<Communicator>
createStagedCommunicator(std::unique_ptr<Communicator> host);

} // namespace moert::comm

#endif
