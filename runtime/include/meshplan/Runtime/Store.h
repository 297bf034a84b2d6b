//===- Store.h - Where ranks find each other ------------------------------===//
//
// Ranks rendezvous through a key-value store named by one string, the value
// of MESHPLAN_STORE (set by `meshplan run`):
//   file:DIR            a directory on a file system all ranks see (Gloo's
//                       FileStore; one machine by default). It must be fresh
//                       per job: stale keys break the rendezvous.
//   redis://HOST:PORT   a Redis server (Gloo's RedisStore), for several
//                       machines.
//   tcp://HOST:PORT     a PyTorch c10d TCPStore server, such as the one
//                       torchrun's agent hosts at MASTER_ADDR:MASTER_PORT
//                       (TorchTcpStore.h speaks its protocol), so that a
//                       job started by torchrun needs no store of its own.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_STORE_H
#define MESHPLAN_RUNTIME_STORE_H

#include "meshplan/Core/Result.h"

#include <cstdint>
#include <string>
#include <string_view>

namespace meshplan::runtime {

struct StoreAddress {
  enum class Kind { File, Redis, Tcp };
  Kind kind = Kind::File;
  std::string path; ///< File: the directory
  std::string host; ///< Redis, Tcp
  int port = 0;     ///< Redis, Tcp

  /// The address as written ("file:/tmp/x", "redis://127.0.0.1:6379",
  /// "tcp://127.0.0.1:29500").
  std::string text() const;
};

/// Parses "file:DIR", "redis://HOST:PORT" or "tcp://HOST:PORT"; errors say
/// what is expected.
Result<StoreAddress> parseStoreAddress(std::string_view text);

} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_STORE_H
