//===- Store.cpp - Store addresses ----------------------------------------===//

#include "meshplan/Runtime/Store.h"

#include "meshplan/Core/Text.h"

namespace meshplan::runtime {

std::string StoreAddress::text() const {
  if (kind == Kind::File)
    return "file:" + path;
  return (kind == Kind::Redis ? "redis://" : "tcp://") + host + ":" +
         std::to_string(port);
}

Result<StoreAddress> parseStoreAddress(std::string_view text) {
  auto expected = [&](const std::string &what) {
    return makeError(
        "store \"" + std::string(text) + "\": " + what +
        " (expected file:DIR, redis://HOST:PORT or tcp://HOST:PORT)");
  };
  StoreAddress a;
  if (text.starts_with("file:")) {
    a.kind = StoreAddress::Kind::File;
    a.path = std::string(text.substr(5));
    if (a.path.empty())
      return expected("the directory is empty");
    return a;
  }
  bool redis = text.starts_with("redis://");
  if (redis || text.starts_with("tcp://")) {
    a.kind = redis ? StoreAddress::Kind::Redis : StoreAddress::Kind::Tcp;
    std::string_view rest = text.substr(redis ? 8 : 6);
    size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos || colon == 0)
      return expected("no HOST:PORT");
    a.host = std::string(rest.substr(0, colon));
    std::optional<int64_t> port = parseInt(rest.substr(colon + 1));
    if (!port || *port < 1 || *port > 65535)
      return expected("the port must be 1..65535");
    a.port = static_cast<int>(*port);
    return a;
  }
  return expected("unknown kind");
}

} // namespace meshplan::runtime
