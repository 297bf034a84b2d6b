//===- FrontendTestHelpers.h - Shared glue for the frontend tests ---------===//
#ifndef MESHPLAN_UNITTESTS_FRONTEND_FRONTENDTESTHELPERS_H
#define MESHPLAN_UNITTESTS_FRONTEND_FRONTENDTESTHELPERS_H

#include "meshplan/Core/Result.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace testutil {

/// The source tree, so tests read the shipped examples and schemas.
inline std::string sourcePath(const std::string &relative) {
  return std::string(MESHPLAN_SOURCE_DIR) + "/" + relative;
}

inline std::string readText(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

inline bool startsWith(const std::string &text, const std::string &prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

/// Expects an error whose message starts with `prefix` (typically a JSON
/// pointer followed by the start of the explanation).
template <typename T>
::testing::AssertionResult failsWith(const meshplan::Result<T> &result,
                                     const std::string &prefix) {
  if (result.ok())
    return ::testing::AssertionFailure() << "expected an error starting with \""
                                         << prefix << "\", but it succeeded";
  const std::string &message = result.error().message;
  if (!startsWith(message, prefix))
    return ::testing::AssertionFailure()
           << "expected an error starting with\n  \"" << prefix
           << "\"\ngot\n  \"" << message << "\"";
  return ::testing::AssertionSuccess();
}

template <typename T>
::testing::AssertionResult succeeds(const meshplan::Result<T> &result) {
  if (!result.ok())
    return ::testing::AssertionFailure() << result.error().message;
  return ::testing::AssertionSuccess();
}

/// A located error: a JSON pointer ("/..."), or a line and column for
/// malformed JSON.
inline bool isLocated(const std::string &message) {
  return startsWith(message, "/") || startsWith(message, "line ");
}

/// Every JSON pointer in a document (RFC 6901 escapes), root first: the
/// places random-mutation tests edit.
/// Generic over nlohmann's json and ordered_json (no conversion copies).
template <typename Json>
void collectPointers(const Json &value, const std::string &at,
                     std::vector<std::string> &out) {
  out.push_back(at);
  if (value.is_object()) {
    for (auto it = value.begin(); it != value.end(); ++it) {
      std::string key;
      for (char c : it.key())
        key += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
      collectPointers(it.value(), at + "/" + key, out);
    }
  } else if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i)
      collectPointers(value[i], at + "/" + std::to_string(i), out);
  }
}

} // namespace testutil

#endif // MESHPLAN_UNITTESTS_FRONTEND_FRONTENDTESTHELPERS_H
