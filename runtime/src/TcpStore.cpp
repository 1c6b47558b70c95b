//===- TcpStore.cpp - the TCP rendezvous of torchrun-style launches -------===//
//
// Without an MPI launcher the ranks meet at MASTER_ADDR:MASTER_PORT: rank 0
// listens there, every other rank connects, says who it is and receives
// rank 0's blob (the ncclUniqueId). The exchange, one connection per rank:
//
//   rank r -> rank 0:  "moertS01", rank (int32, big endian), size (int32)
//   rank 0 -> rank r:  status (int32: 0 ok, 1 refused), length (uint32),
//                      then the blob, or the reason it was refused
//
// Connections that do not start with the magic (port scanners, a stray
// client) are dropped. Everything is polled against one deadline
// (MOERT_COMM_TIMEOUT): a rank that never shows up is named, nothing blocks
// forever.
//
//===----------------------------------------------------------------------===//

#include "TcpStore.h"

#include "moert/Error.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <thread>
#include <vector>

namespace moert::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kMagic[8] = {'m', 'o', 'e', 'r', 't', 'S', '0', '1'};

std::string seconds(double t) {
  char s[32];
  std::snprintf(s, sizeof(s), "%g", t);
  return s;
}

int remainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                  deadline - Clock::now())
                  .count();
  return left <= 0 ? 0 : left > 1000000 ? 1000000 : int(left);
}

/// Sends or receives exactly `n` bytes before the deadline; false on a
/// closed connection, an error or the deadline.
bool transfer(int fd, void *data, size_t n, bool send,
              Clock::time_point deadline) {
  char *p = static_cast<char *>(data);
  while (n) {
    pollfd pfd{fd, short(send ? POLLOUT : POLLIN), 0};
    int ready = ::poll(&pfd, 1, remainingMs(deadline));
    if (ready < 0 && errno == EINTR)
      continue;
    if (ready <= 0)
      return false;
    ssize_t k = send ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (k <= 0)
      return false;
    p += k;
    n -= size_t(k);
  }
  return true;
}

void putInt(char *p, uint32_t v) {
  v = htonl(v);
  std::memcpy(p, &v, 4);
}
uint32_t getInt(const char *p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return ntohl(v);
}

bool reply(int fd, int status, const std::string &payload,
           Clock::time_point deadline) {
  char head[8];
  putInt(head, uint32_t(status));
  putInt(head + 4, uint32_t(payload.size()));
  std::string message(head, 8);
  message += payload;
  return transfer(fd, message.data(), message.size(), /*send=*/true, deadline);
}

std::string where(const StoreAddress &a) {
  return a.host + ":" + std::to_string(a.port) + " (" + a.portWhere + ")";
}

std::string missingRanks(const std::vector<bool> &seen) {
  std::vector<int> missing;
  for (size_t r = 0; r < seen.size(); ++r)
    if (!seen[r])
      missing.push_back(int(r));
  std::string s = missing.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < missing.size(); ++i) {
    if (i == 8) {
      s += ", ... (" + std::to_string(missing.size()) + " in all)";
      break;
    }
    s += (i ? ", " : "") + std::to_string(missing[i]);
  }
  return s;
}

/// A socket listening on every interface (IPv6 with IPv4 mapped, else IPv4).
int listenOn(const StoreAddress &a) {
  int one = 1;
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int zero = 0;
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(uint16_t(a.port));
    if (::bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0 &&
        ::listen(fd, 128) == 0)
      return fd;
    int err = errno;
    ::close(fd);
    if (err == EADDRINUSE)
      fail("rank 0: cannot listen on port " + std::to_string(a.port) + " (" +
           a.portWhere + ") for the other ranks: " + std::strerror(err) +
           "; choose a free port (or set MOERT_STORE_PORT)");
  }
  fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    fail(std::string("rank 0: socket() failed: ") + std::strerror(errno));
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(uint16_t(a.port));
  if (::bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd, 128) != 0)
    fail("rank 0: cannot listen on port " + std::to_string(a.port) + " (" +
         a.portWhere + ") for the other ranks: " + std::strerror(errno) +
         "; choose a free port (or set MOERT_STORE_PORT)");
  return fd;
}

std::string serve(const StoreAddress &a, int size, const std::string &blob,
                  double timeout) {
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(timeout));
  int listener = listenOn(a);
  std::vector<bool> seen(size_t(size), false);
  seen[0] = true;
  int waiting = size - 1;
  while (waiting > 0) {
    pollfd pfd{listener, POLLIN, 0};
    int ready = ::poll(&pfd, 1, remainingMs(deadline));
    if (ready < 0 && errno == EINTR)
      continue;
    if (ready <= 0) {
      ::close(listener);
      fail("rank 0: timed out after " + seconds(timeout) +
           " s (MOERT_COMM_TIMEOUT) waiting for " + missingRanks(seen) +
           " to connect to port " + std::to_string(a.port) + " (" +
           a.portWhere +
           "): that rank did not start, or has another "
           "MASTER_ADDR/MASTER_PORT");
    }
    int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0)
      continue;
    // A short deadline for the greeting: a silent client is dropped, not
    // waited for.
    auto greet = std::min(deadline, Clock::now() + std::chrono::seconds(10));
    char hello[16];
    if (!transfer(fd, hello, sizeof(hello), /*send=*/false, greet) ||
        std::memcmp(hello, kMagic, sizeof(kMagic)) != 0) {
      ::close(fd);
      continue;
    }
    int rank = int(getInt(hello + 8)), theirSize = int(getInt(hello + 12));
    std::string refusal;
    if (theirSize != size)
      refusal = "rank " + std::to_string(rank) +
                " has WORLD_SIZE=" + std::to_string(theirSize) +
                ", rank 0 WORLD_SIZE=" + std::to_string(size) +
                ": every rank must be given the same";
    else if (rank <= 0 || rank >= size)
      refusal = "a rank connected as rank " + std::to_string(rank) +
                ", which is not in 1.." + std::to_string(size - 1);
    else if (seen[size_t(rank)])
      refusal = "two processes connected as rank " + std::to_string(rank) +
                ": every rank needs its own RANK";
    if (!refusal.empty()) {
      reply(fd, 1, refusal, greet);
      ::close(fd);
      ::close(listener);
      fail("rank 0: " + refusal);
    }
    if (!reply(fd, 0, blob, greet)) {
      // It went away before it had the blob; it may come back.
      ::close(fd);
      continue;
    }
    ::close(fd);
    seen[size_t(rank)] = true;
    --waiting;
  }
  ::close(listener);
  return blob;
}

std::string fetch(const StoreAddress &a, int rank, int size, double timeout) {
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(timeout));
  std::string me = "rank " + std::to_string(rank) + ": ";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo *list = nullptr;
  std::string port = std::to_string(a.port);
  if (int rc = ::getaddrinfo(a.host.c_str(), port.c_str(), &hints, &list))
    fail(me + "MASTER_ADDR='" + a.host +
         "' does not resolve: " + ::gai_strerror(rc));
  std::string lastError = "no address";
  int fd = -1;
  while (fd < 0) {
    for (addrinfo *ai = list; ai && fd < 0; ai = ai->ai_next) {
      int s = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
                       ai->ai_protocol);
      if (s < 0)
        continue;
      int flags = ::fcntl(s, F_GETFL, 0);
      ::fcntl(s, F_SETFL, flags | O_NONBLOCK);
      int rc = ::connect(s, ai->ai_addr, ai->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        pollfd pfd{s, POLLOUT, 0};
        int wait = std::min(remainingMs(deadline), 2000);
        if (::poll(&pfd, 1, wait) == 1) {
          int err = 0;
          socklen_t len = sizeof(err);
          ::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
          rc = err ? -1 : 0;
          errno = err ? err : ETIMEDOUT;
        } else {
          rc = -1;
          errno = ETIMEDOUT;
        }
      }
      if (rc == 0) {
        fd = s;
        break;
      }
      lastError = std::strerror(errno);
      ::close(s);
    }
    if (fd >= 0)
      break;
    if (remainingMs(deadline) == 0) {
      ::freeaddrinfo(list);
      fail(me + "timed out after " + seconds(timeout) +
           " s (MOERT_COMM_TIMEOUT) connecting to rank 0 at " + where(a) +
           ", last error: " + lastError +
           ": is rank 0 running, with the same MASTER_ADDR/MASTER_PORT?");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::freeaddrinfo(list);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  char hello[16];
  std::memcpy(hello, kMagic, sizeof(kMagic));
  putInt(hello + 8, uint32_t(rank));
  putInt(hello + 12, uint32_t(size));
  char head[8];
  if (!transfer(fd, hello, sizeof(hello), /*send=*/true, deadline) ||
      !transfer(fd, head, sizeof(head), /*send=*/false, deadline)) {
    ::close(fd);
    fail(me + "rank 0 at " + where(a) +
         " accepted the connection but did not answer within " +
         seconds(timeout) + " s (MOERT_COMM_TIMEOUT)");
  }
  uint32_t status = getInt(head), length = getInt(head + 4);
  if (length > (1u << 20)) {
    ::close(fd);
    fail(me + "the process at " + where(a) +
         " does not speak libmoert's store protocol");
  }
  std::string payload(length, '\0');
  if (length &&
      !transfer(fd, payload.data(), length, /*send=*/false, deadline)) {
    ::close(fd);
    fail(me + "the connection to rank 0 at " + where(a) +
         " closed before its answer arrived");
  }
  ::close(fd);
  if (status != 0)
    fail(me + "rank 0 refused this rank: " + payload);
  return payload;
}

int portVar(const char *var) {
  const char *value = std::getenv(var);
  char *end = nullptr;
  long p = std::strtol(value, &end, 10);
  if (!*value || *end || p < 1 || p > 65535)
    fail(std::string(var) + "='" + value + "' is not a port (1..65535)");
  return int(p);
}

} // namespace

StoreAddress storeAddress(int worldSize) {
  std::string why = "WORLD_SIZE=" + std::to_string(worldSize) +
                    " ranks without an MPI launcher meet at "
                    "MASTER_ADDR:MASTER_PORT (rank 0 listens), but ";
  const char *host = std::getenv("MASTER_ADDR");
  if (!host)
    fail(why + "MASTER_ADDR is not set: set it to rank 0's host name or "
               "address (127.0.0.1 on one machine)");
  if (!std::getenv("MASTER_PORT") && !std::getenv("MOERT_STORE_PORT"))
    fail(why + "MASTER_PORT is not set: set it to a free TCP port on rank "
               "0's host");
  StoreAddress a;
  a.host = host;
  if (std::getenv("MOERT_STORE_PORT")) {
    a.port = portVar("MOERT_STORE_PORT");
    a.portWhere = "MOERT_STORE_PORT";
  } else {
    a.port = portVar("MASTER_PORT");
    a.portWhere = "MASTER_PORT";
    const char *agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
    if (agent && std::strcmp(agent, "True") == 0) {
      // torchrun's agent serves its own store on MASTER_PORT.
      if (a.port == 65535)
        fail("MASTER_PORT=65535 is torchrun's store; libmoert's would be "
             "the next port: set MOERT_STORE_PORT to a free one");
      a.port += 1;
      a.portWhere = "MASTER_PORT+1, beside torchrun's store";
    }
  }
  return a;
}

std::string storeBroadcast(const StoreAddress &address, int rank, int size,
                           const std::string &blob, double timeout) {
  if (size <= 1)
    return blob;
  return rank == 0 ? serve(address, size, blob, timeout)
                   : fetch(address, rank, size, timeout);
}

} // namespace moert::comm
