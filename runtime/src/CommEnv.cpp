//===- CommEnv.cpp - the launch settings of the communication layer -------===//
//
// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/MASTER_PORT, the MPI launcher's
// variables, MOERT_COMM_BACKEND, MOERT_COMM_TIMEOUT and MOERT_COMM_OVERLAP:
// read once, checked, and errors naming the variable.
//
//===----------------------------------------------------------------------===//

#include "CommProtocol.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace moert::comm {

int envInt(const char *var) {
  const char *value = std::getenv(var);
  if (!value || !*value)
    return -1;
  char *end = nullptr;
  errno = 0;
  long v = std::strtol(value, &end, 10);
  if (*end || errno || v < 0 || v > (1 << 24))
    fail(std::string(var) + "='" + value + "' is not a non-negative integer");
  return int(v);
}

namespace {

/// Like envInt, but a set and empty variable is malformed too.
int intVar(const char *var) {
  const char *value = std::getenv(var);
  if (value && !*value)
    fail(std::string(var) + "='' is not a non-negative integer");
  return envInt(var);
}

LaunchEnv readLaunchEnv() {
  LaunchEnv env;
  env.rank = intVar("RANK");
  env.worldSize = intVar("WORLD_SIZE");
  env.localRank = intVar("LOCAL_RANK");
  // MPI launchers announce themselves (Open MPI, PMIx, MPICH/hydra, Slurm).
  for (auto [var, sizeVar] :
       {std::pair<const char *, const char *>{"OMPI_COMM_WORLD_SIZE",
                                              "OMPI_COMM_WORLD_SIZE"},
        {"PMIX_RANK", nullptr},
        {"PMI_SIZE", "PMI_SIZE"},
        {"PMI_RANK", nullptr}}) {
    if (std::getenv(var)) {
      env.mpiLauncherVar = var;
      if (sizeVar)
        env.mpiLauncherSize = intVar(sizeVar);
      break;
    }
  }
  if (env.worldSize == 0)
    fail("WORLD_SIZE=0: there must be at least one rank");
  // Under an MPI launcher, MPI gives the rank (RANK/WORLD_SIZE, if set, are
  // checked against it); otherwise both must be set together.
  if (env.worldSize > 0 && env.rank < 0 && !env.mpiLauncherVar)
    fail("RANK is not set, but WORLD_SIZE=" + std::to_string(env.worldSize) +
         " is: set RANK to this process's rank (0.." +
         std::to_string(env.worldSize - 1) + ")");
  if (env.rank >= 0 && env.worldSize < 0 && !env.mpiLauncherVar)
    fail("WORLD_SIZE is not set, but RANK=" + std::to_string(env.rank) +
         " is: set WORLD_SIZE to the number of ranks");
  if (env.rank >= 0 && env.worldSize > 0 && env.rank >= env.worldSize)
    fail("RANK=" + std::to_string(env.rank) +
         " is not below WORLD_SIZE=" + std::to_string(env.worldSize));
  if (env.localRank >= 0 && env.worldSize > 0 && env.localRank >= env.worldSize)
    fail("LOCAL_RANK=" + std::to_string(env.localRank) +
         " is not below WORLD_SIZE=" + std::to_string(env.worldSize));
  if (const char *port = std::getenv("MASTER_PORT")) {
    int p = intVar("MASTER_PORT");
    if (p < 1 || p > 65535)
      fail(std::string("MASTER_PORT='") + port + "' is not a port (1..65535)");
  }
  if (const char *addr = std::getenv("MASTER_ADDR"); addr && !*addr)
    fail("MASTER_ADDR is set but empty");
  return env;
}

double parseTimeout() {
  const char *value = std::getenv("MOERT_COMM_TIMEOUT");
  if (!value)
    return 300.0;
  char *end = nullptr;
  double t = std::strtod(value, &end);
  if (!*value || *end || !std::isfinite(t) || t <= 0)
    fail(std::string("MOERT_COMM_TIMEOUT='") + value +
         "' is not a positive number of seconds");
  // Deadlines are kept in nanoseconds (64 bits: about 292 years); far
  // larger values used to wrap around, and every exchange timed out at once.
  constexpr double kMaxTimeout = 1e8; // about 3 years
  if (t > kMaxTimeout)
    fail(std::string("MOERT_COMM_TIMEOUT='") + value +
         "' is more than the largest timeout, 1e8 seconds (about 3 years)");
  return t;
}

bool parseOverlap() {
  const char *value = std::getenv("MOERT_COMM_OVERLAP");
  if (!value || !*value)
    return true;
  if (std::strcmp(value, "1") == 0)
    return true;
  if (std::strcmp(value, "0") == 0)
    return false;
  fail(std::string("MOERT_COMM_OVERLAP='") + value + "' is not 0 or 1");
}

} // namespace

const LaunchEnv &launchEnv() {
  static LaunchEnv env = readLaunchEnv();
  return env;
}

const std::string &backendChoice() {
  static const std::string backend = [] {
    std::string b = "auto";
    if (const char *v = std::getenv("MOERT_COMM_BACKEND"))
      b = v;
    if (b != "auto" && b != "mpi" && b != "self" && b != "nccl")
      fail("MOERT_COMM_BACKEND='" + b +
           "' is not one of auto, mpi, self, nccl");
    return b;
  }();
  return backend;
}

double timeoutSeconds() {
  static double t = parseTimeout();
  return t;
}

bool overlapEnabled() {
  static bool on = parseOverlap();
  return on;
}

} // namespace moert::comm
