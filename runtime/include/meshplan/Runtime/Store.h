//===- Store.h - Where ranks find each other ------------------------------===//
//
// Ranks rendezvous through a key-value store named by one string, the value
// of MESHPLAN_STORE (set by `meshplan run`):
//   file:DIR            a directory on a file system all ranks see (Gloo's
//                       FileStore; one machine by default). It must be fresh
//                       per job: stale keys break the rendezvous.
//   redis://HOST:PORT   a Redis server (Gloo's RedisStore), for several
//                       machines.
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
  enum class Kind { File, Redis };
  Kind kind = Kind::File;
  std::string path; ///< File: the directory
  std::string host; ///< Redis
  int port = 0;     ///< Redis

  /// The address as written ("file:/tmp/x", "redis://127.0.0.1:6379").
  std::string text() const;
};

/// Parses "file:DIR" or "redis://HOST:PORT"; errors say what is expected.
Result<StoreAddress> parseStoreAddress(std::string_view text);

} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_STORE_H
