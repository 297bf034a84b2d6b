//===- TorchTcpStore.h - A client of PyTorch's c10d TCPStore ----*- C++ -*-===//
//
// torchrun's elastic agent hosts a c10d TCPStore at MASTER_ADDR:MASTER_PORT
// for the whole job (TORCHELASTIC_USE_AGENT_STORE=True) before it starts the
// workers. Speaking enough of its protocol to set, get and wait lets a
// meshplan program started by torchrun rendezvous there, with no store of
// its own and no second port to agree on (docs/runtime.md, "torchrun").
//
// The protocol, as torch/csrc/distributed/c10d/TCPStore.cpp and
// TCPStoreBackend.hpp define it (both the classic and the libuv server):
// every query is one QueryType byte followed by its arguments; integers are
// little-endian in the sender's native width (uint32 magic, uint64 counts
// and lengths); a string or byte vector is a uint64 length and the bytes.
//   VALIDATE  magic 0x3C85F7CE                     (no answer; bad: closed)
//   SET       key, value                           (no answer)
//   GET       key                       -> value   (the key must exist)
//   CHECK     count, keys...            -> READY or NOT_READY
// (The server's blocking WAIT is not used: it would hold the one connection
// while another thread of the rank may have to set the awaited key.)
// Keys are ours: torch's own keys start with "/" or its PrefixStore's
// prefixes; ours with the session's job name (GlooBackend.cpp).
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_BACKENDS_GLOO_TORCHTCPSTORE_H
#define MESHPLAN_RUNTIME_BACKENDS_GLOO_TORCHTCPSTORE_H

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

namespace meshplan::runtime {

/// A gloo store over a c10d TCPStore server. Throws gloo::IoException on a
/// broken connection and on a wait that times out ("Timeout ..." as Gloo's
/// own stores say, which CancellableStore relies on). One connection, one
/// query at a time (the protocol has no request ids); a wait polls, never
/// holding the connection between its queries.
class TorchTcpStore final : public gloo::rendezvous::Store {
public:
  /// Connects (retrying refused connections until `timeout`: the server may
  /// still be starting) and validates.
  TorchTcpStore(const std::string &host, int port,
                std::chrono::milliseconds timeout);
  ~TorchTcpStore() override;
  TorchTcpStore(const TorchTcpStore &) = delete;
  TorchTcpStore &operator=(const TorchTcpStore &) = delete;

  void set(const std::string &key, const std::vector<char> &data) override;
  std::vector<char> get(const std::string &key) override;
  void wait(const std::vector<std::string> &keys) override;
  void wait(const std::vector<std::string> &keys,
            const std::chrono::milliseconds &timeout) override;

private:
  void send(const std::vector<char> &bytes);
  void receive(void *data, size_t size);
  bool readable(std::chrono::milliseconds timeout);
  /// One CHECK of every key.
  bool allPresent(const std::vector<std::string> &keys);
  [[noreturn]] void fail(const std::string &what) const;

  std::string address; ///< "HOST:PORT", for messages
  std::chrono::milliseconds timeout;
  int fd = -1;
  std::mutex mutex;
};

} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_BACKENDS_GLOO_TORCHTCPSTORE_H
