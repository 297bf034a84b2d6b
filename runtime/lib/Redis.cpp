//===- Redis.cpp - The one hiredis wrapper --------------------------------===//
//
// See Redis.h. hiredis is included here only.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Runtime/Redis.h"

#include <hiredis.h>

#include <cerrno>
#include <cstring>
#include <sys/time.h>

namespace meshplan::runtime {

namespace {

timeval toTimeval(std::chrono::milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

RedisReply copyReply(const redisReply *r) {
  RedisReply out;
  switch (r->type) {
  case REDIS_REPLY_STRING:
    out.type = RedisReply::Type::String;
    break;
  case REDIS_REPLY_STATUS:
    out.type = RedisReply::Type::Status;
    break;
  case REDIS_REPLY_ERROR:
    out.type = RedisReply::Type::Error;
    break;
  case REDIS_REPLY_INTEGER:
    out.type = RedisReply::Type::Integer;
    out.integer = r->integer;
    return out;
  case REDIS_REPLY_NIL:
    out.type = RedisReply::Type::Nil;
    return out;
  case REDIS_REPLY_ARRAY:
    out.type = RedisReply::Type::Array;
    for (size_t i = 0; i < r->elements; ++i)
      out.elements.push_back(copyReply(r->element[i]));
    return out;
  default:
    out.type = RedisReply::Type::Other;
    return out;
  }
  if (r->str)
    out.str.assign(r->str, r->len);
  return out;
}

std::vector<const char *> argvOf(const std::vector<std::string> &args,
                                 std::vector<size_t> &lens) {
  std::vector<const char *> argv;
  for (const std::string &a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  return argv;
}

} // namespace

std::string RedisReply::text() const {
  if (type == Type::String || type == Type::Status || type == Type::Error)
    return str;
  if (type == Type::Integer)
    return std::to_string(integer);
  return "";
}

RedisConnection::~RedisConnection() { close(); }

void RedisConnection::close() {
  if (ctx)
    redisFree(ctx);
  ctx = nullptr;
}

std::string RedisConnection::failure() const {
  if (!ctx)
    return "cannot allocate a connection (out of memory)";
  std::string why = ctx->errstr;
  // hiredis reports a read that hit SO_RCVTIMEO as EAGAIN's text.
  if (ctx->err == REDIS_ERR_IO &&
      (why == std::strerror(EAGAIN) || why == std::strerror(EWOULDBLOCK)))
    return "no reply within " + std::to_string(io.count()) +
           " ms (the store is hung or unreachable)";
  return why.empty() ? "no reply" : why;
}

Result<void> RedisConnection::connect(const std::string &host, int port,
                                      std::chrono::milliseconds connectTimeout,
                                      std::chrono::milliseconds ioTimeout,
                                      bool keepAlive) {
  close();
  io = ioTimeout;
  // hiredis wants an IPv6 address without its brackets.
  std::string bare =
      host.size() > 2 && host.front() == '[' && host.back() == ']'
          ? host.substr(1, host.size() - 2)
          : host;
  ctx = redisConnectWithTimeout(bare.c_str(), port, toTimeval(connectTimeout));
  if (!ctx || ctx->err) {
    std::string why = failure();
    close();
    return makeError(why);
  }
  if (redisSetTimeout(ctx, toTimeval(ioTimeout)) != REDIS_OK) {
    std::string why = "cannot set the I/O timeout: " + failure();
    close();
    return makeError(why);
  }
  if (keepAlive)
    redisEnableKeepAlive(ctx);
  return {};
}

Result<RedisReply>
RedisConnection::command(const std::vector<std::string> &args) {
  if (!ctx)
    return makeError("not connected");
  std::vector<size_t> lens;
  std::vector<const char *> argv = argvOf(args, lens);
  auto *r = static_cast<redisReply *>(redisCommandArgv(
      ctx, static_cast<int>(argv.size()), argv.data(), lens.data()));
  if (!r) {
    std::string why = failure();
    close();
    return makeError(why);
  }
  RedisReply out = copyReply(r);
  freeReplyObject(r);
  return out;
}

Result<std::vector<RedisReply>> RedisConnection::pipeline(
    const std::vector<std::vector<std::string>> &commands) {
  if (!ctx)
    return makeError("not connected");
  for (const std::vector<std::string> &args : commands) {
    std::vector<size_t> lens;
    std::vector<const char *> argv = argvOf(args, lens);
    redisAppendCommandArgv(ctx, static_cast<int>(argv.size()), argv.data(),
                           lens.data());
  }
  std::vector<RedisReply> out;
  for (size_t i = 0; i < commands.size(); ++i) {
    void *raw = nullptr;
    if (redisGetReply(ctx, &raw) != REDIS_OK || !raw) {
      std::string why = failure();
      close();
      return makeError(why);
    }
    out.push_back(copyReply(static_cast<redisReply *>(raw)));
    freeReplyObject(raw);
  }
  return out;
}

} // namespace meshplan::runtime
