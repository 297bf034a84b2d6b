//===- FuzzSupport.h - Helpers shared by the libFuzzer targets ------------===//
//
// What a fuzz target treats as a defect, besides what the sanitizers and
// libFuzzer catch themselves (crashes, memory errors, undefined behaviour,
// leaks, hangs, huge allocations): a promise of meshplan's that the input
// broke, reported by defect() (abort, so libFuzzer saves the input). The
// promises are meshplan's own: a bad input gets an error with a message;
// what the reader accepts, the writer writes back and the reader accepts
// again unchanged; what the spec resolver accepts, the planner plans (an
// "internal error", exit 3, must be unreachable from any input).
//
// Several targets read a few named fields from one input, one per line:
//
//   mesh dp=4,tp=2
//   view slice(tp)
//   rank 3
//
// ("key value"; the first space separates; a key may repeat). Lines make the
// fields independent for libFuzzer's mutations and keep seeds readable.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_FUZZ_FUZZSUPPORT_H
#define MESHPLAN_FUZZ_FUZZSUPPORT_H

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace meshplan::fuzz {

/// Text printed with a defect, e.g. the documents a target made of its
/// input bytes (the input itself is what libFuzzer saves).
inline std::string &defectContext() {
  static std::string context;
  return context;
}

/// Reports a broken promise and aborts; libFuzzer keeps the input.
[[noreturn]] inline void defect(const std::string &what) {
  std::fprintf(stderr, "\nmeshplan fuzz defect: %s\n", what.c_str());
  if (!defectContext().empty())
    std::fprintf(stderr, "--- input as read:\n%s\n", defectContext().c_str());
  std::fflush(stderr);
  std::abort();
}

inline void check(bool ok, const std::string &what) {
  if (!ok)
    defect(what);
}

/// Every error meshplan reports must say something.
inline void checkMessage(const std::string &message, const char *where) {
  check(!message.empty(), std::string(where) + " failed with an empty message");
}

inline std::string_view asText(const uint8_t *data, size_t size) {
  return {reinterpret_cast<const char *>(data), size};
}

/// The "key value" lines of an input (see file comment).
class Fields {
public:
  explicit Fields(std::string_view text) {
    while (!text.empty()) {
      size_t end = text.find('\n');
      std::string_view line = text.substr(0, end);
      text = end == std::string_view::npos ? std::string_view()
                                           : text.substr(end + 1);
      size_t space = line.find(' ');
      entries.emplace_back(std::string(line.substr(0, space)),
                           space == std::string_view::npos
                               ? std::string()
                               : std::string(line.substr(space + 1)));
    }
  }
  bool has(std::string_view key) const {
    for (const auto &[k, v] : entries)
      if (k == key)
        return true;
    return false;
  }
  /// The last value of `key`, or "".
  std::string get(std::string_view key) const {
    std::string value;
    for (const auto &[k, v] : entries)
      if (k == key)
        value = v;
    return value;
  }
  std::vector<std::string> all(std::string_view key) const {
    std::vector<std::string> values;
    for (const auto &[k, v] : entries)
      if (k == key)
        values.push_back(v);
    return values;
  }
  /// The last value of `key` as an integer, as CLI11 reads an int64 flag;
  /// nullopt when absent or not a number.
  std::optional<int64_t> integer(std::string_view key) const {
    if (!has(key))
      return std::nullopt;
    std::string text = get(key);
    int64_t value = 0;
    auto [end, ec] =
        std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size())
      return std::nullopt;
    return value;
  }

private:
  std::vector<std::pair<std::string, std::string>> entries;
};

/// Splits an input into documents at lines that are exactly "---" (which no
/// JSON document can contain outside a string, and no JSON string can hold
/// a raw newline). At most `maxParts` documents; the rest stays in the last.
inline std::vector<std::string_view> splitDocuments(std::string_view text,
                                                    size_t maxParts) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < maxParts) {
    size_t at = text.find("\n---\n");
    if (at == std::string_view::npos)
      break;
    parts.push_back(text.substr(0, at + 1));
    text = text.substr(at + 5);
  }
  parts.push_back(text);
  return parts;
}

} // namespace meshplan::fuzz

#endif // MESHPLAN_FUZZ_FUZZSUPPORT_H
