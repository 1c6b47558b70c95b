//===- StoreTest.cpp - the TCP rendezvous between local processes ---------===//
//
//   moert-store-test             one rank, from RANK, WORLD_SIZE, MASTER_ADDR,
//                                MASTER_PORT: rank 0 draws a 128-byte id (an
//                                ncclUniqueId's size), every rank prints
//                                "rank r: id <hash> (128 bytes)"
//   moert-store-test spawn N [--skip R] [--env R VAR=VALUE]...
//                                starts N such ranks on 127.0.0.1 and a free
//                                port (leaving out rank R; VAR=VALUE in rank
//                                R's environment), prints their lines in rank
//                                order, each rank's exit status and whether
//                                the ranks agree on the id
//
// This is the bootstrap of the NCCL backend in torchrun-style launches,
// without NCCL or a GPU.
//
//===----------------------------------------------------------------------===//

#include "CommProtocol.h"
#include "TcpStore.h"
#include "moert/Tool.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

using namespace moert::comm;

namespace {

uint64_t hash(const std::string &s) {
  uint64_t h = 1469598103934665603ull; // FNV-1a
  for (unsigned char c : s)
    h = (h ^ c) * 1099511628211ull;
  return h;
}

int oneRank() {
  const LaunchEnv &env = launchEnv();
  int rank = env.rank < 0 ? 0 : env.rank;
  int size = env.worldSize < 0 ? 1 : env.worldSize;
  std::string id(128, '\0');
  if (rank == 0) {
    std::random_device device;
    for (char &c : id)
      c = char(device());
  }
  StoreAddress address;
  if (size > 1)
    address = storeAddress(size);
  std::string got = storeBroadcast(address, rank, size, id, timeoutSeconds());
  std::printf("rank %d: id %016llx (%zu bytes)\n", rank,
              static_cast<unsigned long long>(hash(got)), got.size());
  return 0;
}

int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr *>(&addr), len) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr *>(&addr), &len) != 0) {
    std::perror("moert-store-test: no free port");
    std::exit(2);
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

int spawn(int argc, char **argv) {
  int n = std::atoi(argv[2]);
  int skip = -1;
  std::multimap<int, std::string> extra;
  for (int i = 3; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--skip") && i + 1 < argc)
      skip = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--env") && i + 2 < argc) {
      extra.emplace(std::atoi(argv[i + 1]), argv[i + 2]);
      i += 2;
    } else {
      std::fprintf(stderr, "moert-store-test: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  std::string port = std::to_string(freePort());
  std::vector<pid_t> pids(size_t(n), -1);
  std::vector<int> pipes(size_t(n), -1);
  for (int r = 0; r < n; ++r) {
    if (r == skip)
      continue;
    int fds[2];
    if (::pipe(fds) != 0) {
      std::perror("pipe");
      return 2;
    }
    pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(fds[1], 1);
      ::close(fds[0]);
      ::close(fds[1]);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", port.c_str(), 1);
      auto range = extra.equal_range(r);
      for (auto it = range.first; it != range.second; ++it)
        ::putenv(const_cast<char *>(it->second.c_str()));
      ::execl("/proc/self/exe", argv[0], static_cast<char *>(nullptr));
      std::perror("exec");
      ::_exit(127);
    }
    ::close(fds[1]);
    pids[size_t(r)] = pid;
    pipes[size_t(r)] = fds[0];
  }
  std::vector<std::string> out(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    if (pipes[size_t(r)] < 0)
      continue;
    char buf[4096];
    ssize_t k;
    while ((k = ::read(pipes[size_t(r)], buf, sizeof(buf))) > 0)
      out[size_t(r)].append(buf, size_t(k));
    ::close(pipes[size_t(r)]);
  }
  bool allOk = true;
  std::string firstId;
  bool agree = true;
  for (int r = 0; r < n; ++r) {
    if (pids[size_t(r)] < 0)
      continue;
    int status = 0;
    ::waitpid(pids[size_t(r)], &status, 0);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::fputs(out[size_t(r)].c_str(), stdout);
    std::printf("rank %d: exit status %d\n", r, code);
    allOk &= code == 0;
    std::string line = out[size_t(r)];
    size_t at = line.find(" id ");
    std::string id = at == std::string::npos ? "" : line.substr(at + 4, 16);
    if (firstId.empty())
      firstId = id;
    agree &= !id.empty() && id == firstId;
  }
  if (allOk && agree && skip < 0)
    std::printf("%d ranks agree on the id\n", n);
  else
    std::printf("the ranks do not all agree\n");
  return allOk && agree ? 0 : 1;
}

} // namespace

int main(int argc, char **argv) {
  if (argc >= 3 && !std::strcmp(argv[1], "spawn"))
    return spawn(argc, argv);
  if (argc != 1) {
    std::fprintf(stderr, "usage: moert-store-test\n"
                         "       moert-store-test spawn N [--skip R] [--env R "
                         "VAR=VALUE]...\n");
    return 2;
  }
  return moert::runTool(oneRank);
}
