//===- Redis.h - The one hiredis wrapper: connections, commands, replies --===//
//
// Membership and `meshplan run --fault-tolerant` both talk to Redis through
// this wrapper, so hiredis stays a private dependency of the runtime and
// its error handling lives in one place. A reply is copied out of hiredis
// into plain values; transport failures are errors in words a user can act
// on, and callers add which store and which operation they concern.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_RUNTIME_REDIS_H
#define MESHPLAN_RUNTIME_REDIS_H

#include "meshplan/Core/Result.h"

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

struct redisContext;

namespace meshplan::runtime {

/// One reply, owned (hiredis's is freed as soon as it is copied).
struct RedisReply {
  enum class Type { String, Status, Error, Integer, Nil, Array, Other };
  Type type = Type::Nil;
  std::string str;                  ///< String, Status and Error replies
  int64_t integer = 0;              ///< Integer replies
  std::vector<RedisReply> elements; ///< Array replies

  bool isNil() const { return type == Type::Nil; }
  bool isString() const { return type == Type::String; }
  bool isInteger() const { return type == Type::Integer; }
  bool isArray() const { return type == Type::Array; }
  bool isError() const { return type == Type::Error; }
  /// The text of a string, status or error reply, an integer in decimal,
  /// "" for anything else.
  std::string text() const;
};

/// One connection. Not thread-safe: each thread uses its own.
class RedisConnection {
public:
  RedisConnection() = default;
  ~RedisConnection();
  RedisConnection(const RedisConnection &) = delete;
  RedisConnection &operator=(const RedisConnection &) = delete;

  /// Connects to HOST:PORT (brackets around an IPv6 address are dropped)
  /// within `connectTimeout`; reads and writes then give up after
  /// `ioTimeout`. `keepAlive` turns on TCP keep-alive probes, which notice a
  /// peer that vanished without closing the connection. The error is the
  /// reason alone.
  Result<void> connect(const std::string &host, int port,
                       std::chrono::milliseconds connectTimeout,
                       std::chrono::milliseconds ioTimeout,
                       bool keepAlive = false);
  bool connected() const { return ctx != nullptr; }
  void close();

  /// Runs one command. A transport failure closes the connection (hiredis
  /// cannot use it again) and is an error giving the reason; an error reply
  /// is a RedisReply of Type::Error, for the caller to word.
  Result<RedisReply> command(const std::vector<std::string> &args);
  /// Runs several commands in one round trip; their replies in order.
  Result<std::vector<RedisReply>>
  pipeline(const std::vector<std::vector<std::string>> &commands);

private:
  /// The reason the context failed, in words a user can act on.
  std::string failure() const;

  redisContext *ctx = nullptr;
  std::chrono::milliseconds io{0};
};

} // namespace meshplan::runtime

#endif // MESHPLAN_RUNTIME_REDIS_H
