//===- TorchTcpStore.cpp - A client of PyTorch's c10d TCPStore ------------===//

#include "TorchTcpStore.h"

#include <gloo/common/error.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace meshplan::runtime {

namespace {

// torch/csrc/distributed/c10d/TCPStoreBackend.hpp
enum class Query : uint8_t {
  Validate = 0,
  Set = 1,
  Get = 3,
  Check = 5,
};
enum class CheckAnswer : uint8_t { Ready = 0, NotReady = 1 };
constexpr uint32_t kValidationMagic = 0x3C85F7CE;

using Clock = std::chrono::steady_clock;

/// A query being written: the type byte, then its arguments.
class Message {
public:
  explicit Message(Query q) { bytes.push_back(static_cast<char>(q)); }
  template <typename T> Message &value(T v) {
    const char *p = reinterpret_cast<const char *>(&v);
    bytes.insert(bytes.end(), p, p + sizeof v);
    return *this;
  }
  Message &string(const std::string &s) {
    value<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  Message &data(const std::vector<char> &d) {
    value<uint64_t>(d.size());
    bytes.insert(bytes.end(), d.begin(), d.end());
    return *this;
  }
  std::vector<char> bytes;
};

/// One connection attempt to any address of host:port; -1 and errno set.
int connectOnce(const std::string &host, int port, std::string &why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo *found = nullptr;
  int rc =
      ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    why = std::string("cannot resolve the host: ") + ::gai_strerror(rc);
    errno = EHOSTUNREACH;
    return -1;
  }
  int fd = -1;
  for (addrinfo *a = found; a; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0)
      continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0)
      break;
    int e = errno;
    ::close(fd);
    fd = -1;
    errno = e;
  }
  if (fd < 0)
    why = std::strerror(errno);
  ::freeaddrinfo(found);
  return fd;
}

} // namespace

TorchTcpStore::TorchTcpStore(const std::string &host, int port,
                             std::chrono::milliseconds timeout)
    : address(host + ":" + std::to_string(port)), timeout(timeout) {
  Clock::time_point deadline = Clock::now() + timeout;
  std::string why;
  while (true) {
    fd = connectOnce(host, port, why);
    if (fd >= 0)
      break;
    // Refused: the server is not listening yet (a worker may start before
    // the agent of node 0 on another machine). Anything else is final.
    if (errno != ECONNREFUSED || Clock::now() >= deadline)
      fail("cannot connect: " + why);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  send(Message(Query::Validate).value(kValidationMagic).bytes);
}

TorchTcpStore::~TorchTcpStore() {
  if (fd >= 0)
    ::close(fd);
}

void TorchTcpStore::fail(const std::string &what) const {
  throw gloo::IoException("c10d TCPStore at " + address + ": " + what);
}

void TorchTcpStore::send(const std::vector<char> &bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n =
        ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      fail(std::string("send: ") + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

bool TorchTcpStore::readable(std::chrono::milliseconds wait) {
  Clock::time_point deadline = Clock::now() + wait;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    pollfd p{fd, POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      fail(std::string("poll: ") + std::strerror(errno));
    return n > 0;
  }
}

void TorchTcpStore::receive(void *data, size_t size) {
  char *p = static_cast<char *>(data);
  size_t done = 0;
  while (done < size) {
    // A server that never answers must not hang the rank forever.
    if (!readable(timeout))
      fail("no answer within " + std::to_string(timeout.count()) + " ms");
    ssize_t n = ::recv(fd, p + done, size - done, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n == 0)
      fail("the server closed the connection (torchrun's agent ended, or "
           "it is not a c10d TCPStore)");
    if (n < 0)
      fail(std::string("recv: ") + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

void TorchTcpStore::set(const std::string &key, const std::vector<char> &data) {
  std::lock_guard<std::mutex> lock(mutex);
  send(Message(Query::Set).string(key).data(data).bytes);
}

std::vector<char> TorchTcpStore::get(const std::string &key) {
  // GET of a missing key is an error on the server: wait for it first, as
  // torch's own client does.
  wait({key}, timeout);
  std::lock_guard<std::mutex> lock(mutex);
  send(Message(Query::Get).string(key).bytes);
  uint64_t size = 0;
  receive(&size, sizeof size);
  if (size > (uint64_t(1) << 32))
    fail("a value of " + std::to_string(size) + " bytes for key \"" + key +
         "\" (not a c10d TCPStore?)");
  std::vector<char> value(size);
  if (size > 0)
    receive(value.data(), size);
  return value;
}

void TorchTcpStore::wait(const std::vector<std::string> &keys) {
  wait(keys, timeout);
}

bool TorchTcpStore::allPresent(const std::vector<std::string> &keys) {
  std::lock_guard<std::mutex> lock(mutex);
  Message m(Query::Check);
  m.value<uint64_t>(keys.size());
  for (const std::string &key : keys)
    m.string(key);
  send(m.bytes);
  CheckAnswer answer{};
  receive(&answer, 1);
  if (answer != CheckAnswer::Ready && answer != CheckAnswer::NotReady)
    fail("unexpected answer " + std::to_string(int(answer)) + " to CHECK");
  return answer == CheckAnswer::Ready;
}

void TorchTcpStore::wait(const std::vector<std::string> &keys,
                         const std::chrono::milliseconds &limit) {
  // Polled with CHECK rather than a blocking WAIT: the connection is shared
  // and a WAIT would hold it, so another thread of this rank could not set
  // the key being waited for. The delay grows from 1 to 50 ms.
  Clock::time_point deadline = Clock::now() + limit;
  std::chrono::milliseconds delay(1);
  while (!allPresent(keys)) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    if (left.count() <= 0) {
      std::string names;
      for (const std::string &key : keys)
        names += (names.empty() ? "" : ", ") + key;
      // "Timeout" as Gloo's stores say it: CancellableStore retries on it.
      throw gloo::IoException(
          "c10d TCPStore at " + address + ": Timeout waiting for key(s) " +
          names + " after " + std::to_string(limit.count()) + " ms");
    }
    std::this_thread::sleep_for(std::min(delay, left));
    delay = std::min(delay * 2, std::chrono::milliseconds(50));
  }
}

} // namespace meshplan::runtime
