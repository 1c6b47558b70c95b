//===- TcpStore.h - the TCP rendezvous of torchrun-style launches -*- C++
//-*-===//
#ifndef MOERT_SRC_TCPSTORE_H
#define MOERT_SRC_TCPSTORE_H

#include <string>

namespace moert::comm {

/// How an NCCL communicator meets its peers.
struct StoreAddress {
  std::string host;      ///< MASTER_ADDR
  int port = 0;          ///< MASTER_PORT, or what replaces it
  std::string portWhere; ///< where the port came from, for messages
};

/// MASTER_ADDR and the port the store listens on: MOERT_STORE_PORT, else
/// MASTER_PORT, or MASTER_PORT + 1 under torchrun's agent store
/// (TORCHELASTIC_USE_AGENT_STORE=True: the agent holds MASTER_PORT).
/// Missing variables are errors naming them.
StoreAddress storeAddress(int worldSize);

/// The TCP store's one operation: rank 0 listens on `address.port`, every
/// other rank connects to `address.host` and receives `blob` from rank 0
/// (its own argument is ignored). Rank 0 returns once all `size - 1` ranks
/// have it, so this is also a rendezvous. A rank that does not show up
/// within `timeout` seconds, disagreeing sizes or a rank number used twice
/// are errors (moert::Error), naming the ranks and the address.
std::string storeBroadcast(const StoreAddress &address, int rank, int size,
                           const std::string &blob, double timeout);

} // namespace moert::comm

#endif
