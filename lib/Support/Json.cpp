//===- Json.cpp - Reading untrusted JSON with located errors --------------===//

#include "meshplan/Support/Json.h"

#include "meshplan/Core/Text.h"

#include "JsonDetail.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <limits>
#include <sys/stat.h>
#include <unistd.h>

namespace meshplan::json {

//===----------------------------------------------------------------------===//
// Pointers and messages
//===----------------------------------------------------------------------===//

std::string childPointer(const std::string &pointer, std::string_view key) {
  std::string out = pointer;
  out += '/';
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

std::string childPointer(const std::string &pointer, size_t index) {
  return pointer + "/" + std::to_string(index);
}

Error errorAt(const std::string &pointer, const std::string &message) {
  return Error{(pointer.empty() ? std::string("/") : pointer) + ": " + message};
}

Error typeError(const std::string &pointer, const Json &value,
                std::string_view expected) {
  return errorAt(pointer, "expected " + std::string(expected) + ", got " +
                              describe(value));
}

static std::string dumpSafe(const Json &value) {
  // The replace handler never throws on invalid UTF-8 (the strict default
  // would).
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string truncatedText(std::string text, size_t limit) {
  if (text.size() <= limit)
    return text;
  // Cut at a character boundary, never inside a UTF-8 sequence.
  while (limit > 0 && (static_cast<unsigned char>(text[limit]) & 0xC0) == 0x80)
    --limit;
  return text.substr(0, limit) + "...";
}

/// Keeps valid UTF-8 and replaces any other byte by "\xNN", so messages
/// quoting raw input stay valid text (and valid in JSON output).
static std::string sanitizeUtf8(std::string_view text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    size_t length = c < 0x80           ? 1
                    : (c >> 5) == 0x6  ? 2
                    : (c >> 4) == 0xE  ? 3
                    : (c >> 3) == 0x1E ? 4
                                       : 0;
    bool valid = length > 0 && i + length <= text.size();
    for (size_t k = 1; valid && k < length; ++k)
      valid = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
    if (valid) {
      out.append(text.substr(i, length));
      i += length;
    } else {
      static const char *hex = "0123456789ABCDEF";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 0xF];
      ++i;
    }
  }
  return out;
}

std::string quote(std::string_view text) {
  constexpr size_t kMaxQuoted = 200;
  if (text.size() <= kMaxQuoted)
    return dumpSafe(Json(std::string(text)));
  size_t limit = kMaxQuoted;
  while (limit > 0 && (static_cast<unsigned char>(text[limit]) & 0xC0) == 0x80)
    --limit;
  return dumpSafe(Json(std::string(text.substr(0, limit)))) + "...";
}

std::string describe(const Json &value) {
  switch (value.type()) {
  case Json::value_t::null:
    return "null";
  case Json::value_t::boolean:
    return std::string("boolean ") + (value.get<bool>() ? "true" : "false");
  case Json::value_t::number_integer:
  case Json::value_t::number_unsigned:
    return "integer " + dumpSafe(value);
  case Json::value_t::number_float:
    return "number " + dumpSafe(value);
  case Json::value_t::string:
    return "string " + truncatedText(dumpSafe(value));
  case Json::value_t::array:
    return "an array";
  case Json::value_t::object:
    return "an object";
  default:
    return "an unsupported value";
  }
}

std::string joinNames(std::span<const std::string_view> names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i)
      out += ", ";
    out += names[i];
  }
  return out;
}

std::string joinNames(const std::vector<std::string> &names) {
  return joinNames(std::vector<std::string_view>(names.begin(), names.end()));
}

size_t editDistance(std::string_view a, std::string_view b) {
  // Optimal string alignment: an adjacent transposition ("shrad" for
  // "shard") counts as one edit, the most common typo.
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i)
    d[i][0] = i;
  for (size_t j = 0; j <= m; ++j)
    d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] =
          std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

std::string didYouMean(std::string_view word,
                       std::span<const std::string_view> candidates) {
  if (word.size() > 200)
    return "";
  size_t limit = word.size() <= 3 ? 1 : word.size() <= 6 ? 2 : 3;
  std::string_view best;
  size_t bestDistance = limit + 1;
  for (std::string_view candidate : candidates) {
    size_t d = editDistance(word, candidate);
    if (d < bestDistance && d > 0) {
      best = candidate;
      bestDistance = d;
    }
  }
  if (best.empty())
    return "";
  return " (did you mean " + quote(best) + "?)";
}

// One rule for every name (mesh axes, view names, spec and model names):
// core's.
bool isIdentifier(std::string_view name) {
  return meshplan::isIdentifier(name);
}

//===----------------------------------------------------------------------===//
// Parsing
//===----------------------------------------------------------------------===//

namespace {

/// Builds the DOM like nlohmann's own SAX DOM parser, but refuses duplicate
/// keys (which nlohmann would silently resolve to the last one) and deep
/// nesting, and records errors instead of throwing.
class DomBuilder : public nlohmann::json_sax<Json> {
public:
  DomBuilder(Json &root, int maxDepth) : root(root), maxDepth(maxDepth) {}

  bool null() override { return put(Json(nullptr)); }
  bool boolean(bool value) override { return put(Json(value)); }
  bool number_integer(number_integer_t value) override {
    return put(Json(value));
  }
  bool number_unsigned(number_unsigned_t value) override {
    return put(Json(value));
  }
  bool number_float(number_float_t value, const string_t &) override {
    return put(Json(value));
  }
  bool string(string_t &value) override { return put(Json(std::move(value))); }
  bool binary(binary_t &) override {
    return fail(currentPointer(), "binary values are not JSON");
  }
  bool start_object(std::size_t) override { return open(Json::object()); }
  bool key(string_t &name) override {
    // Duplicates are found when the value is stored (one search, not two).
    pendingKey = std::move(name);
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(Json::array()); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t position, const std::string &,
                   const nlohmann::detail::exception &ex) override {
    syntaxPosition = position;
    syntaxMessage = ex.what();
    return false;
  }

  std::optional<Error> error;
  std::optional<size_t> syntaxPosition;
  std::string syntaxMessage;

private:
  /// The pointer of the open container at `depth` (0: the root): built
  /// only for errors, from each container's key or index in its parent.
  std::string pointerAt(size_t depth) const {
    std::string pointer;
    for (size_t i = 1; i <= depth; ++i)
      pointer = segments[i].isIndex ? childPointer(pointer, segments[i].index)
                                    : childPointer(pointer, segments[i].key);
    return pointer;
  }

  /// The pointer of the value about to be stored.
  std::string currentPointer() const {
    if (stack.empty())
      return "";
    const Json *parent = stack.back();
    std::string pointer = pointerAt(stack.size() - 1);
    if (parent->is_array())
      return childPointer(pointer, parent->size());
    return childPointer(pointer, pendingKey);
  }

  bool fail(const std::string &pointer, const std::string &message) {
    error = errorAt(pointer, message);
    return false;
  }

  /// Stores a value at the current position and returns where it went, or
  /// null (after recording the error) for a duplicate key.
  Json *store(Json value) {
    if (stack.empty()) {
      root = std::move(value);
      return &root;
    }
    Json *parent = stack.back();
    if (parent->is_array()) {
      parent->push_back(std::move(value));
      return &parent->back();
    }
    auto [it, inserted] = parent->emplace(pendingKey, std::move(value));
    if (!inserted) {
      fail(currentPointer(), "duplicate key");
      return nullptr;
    }
    return &it.value();
  }

  bool put(Json value) { return store(std::move(value)) != nullptr; }

  bool open(Json container) {
    if (static_cast<int>(stack.size()) >= maxDepth)
      return fail(currentPointer(),
                  "nested deeper than " + std::to_string(maxDepth) + " levels");
    Segment segment;
    if (!stack.empty()) {
      if (stack.back()->is_array()) {
        segment.isIndex = true;
        segment.index = stack.back()->size();
      } else {
        segment.key = pendingKey;
      }
    }
    // Pointers into ancestors stay valid: only the innermost open container
    // grows, and its earlier elements are never open.
    Json *stored = store(std::move(container));
    if (!stored)
      return false;
    stack.push_back(stored);
    segments.push_back(std::move(segment));
    return true;
  }

  bool close() {
    stack.pop_back();
    segments.pop_back();
    return true;
  }

  /// Where an open container sits in its parent.
  struct Segment {
    bool isIndex = false;
    size_t index = 0;
    std::string key;
  };

  Json &root;
  int maxDepth;
  std::vector<Json *> stack;
  std::vector<Segment> segments; ///< parallel to stack; [0] is the root
  std::string pendingKey;
};

} // namespace

namespace {
/// nlohmann's parse error of a document: its byte position and its message
/// ("[json.exception.parse_error.101] parse error at line 3, column 5:
/// syntax error while ...").
struct ParseFailure {
  size_t position = 0;
  std::string message;
};
} // namespace

/// The "line L, column C: ..." error for an nlohmann parse failure. Keeps
/// nlohmann's explanation, but computes the location from the byte
/// position: nlohmann reports an offending newline as column 0 of the next
/// line.
static Error syntaxErrorAt(std::string_view text, const ParseFailure &f) {
  std::string message = f.message;
  size_t at = message.find(": syntax error");
  message = at != std::string::npos ? message.substr(at + 2) : message;
  size_t offending = f.position > 0 ? std::min(f.position - 1, text.size()) : 0;
  size_t line = 1, lineStart = 0;
  for (size_t i = 0; i < offending; ++i) {
    if (text[i] == '\n') {
      ++line;
      lineStart = i + 1;
    }
  }
  message = "line " + std::to_string(line) + ", column " +
            std::to_string(offending - lineStart + 1) + ": " +
            sanitizeUtf8(message);
  return Error{truncatedText(message, 300)};
}

Result<Json> parseJson(std::string_view text, int maxDepth) {
  Json root;
  DomBuilder builder(root, maxDepth);
  bool ok = Json::sax_parse(text.begin(), text.end(), &builder,
                            Json::input_format_t::json, /*strict=*/true);
  if (ok)
    return root;
  if (builder.error)
    return *builder.error;
  return syntaxErrorAt(
      text, {builder.syntaxPosition.value_or(0), builder.syntaxMessage});
}

namespace {
/// Accepts every value: only nlohmann's verdict on the syntax is wanted.
class SyntaxOnly : public nlohmann::json_sax<Json> {
public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t &) override { return true; }
  bool string(string_t &) override { return true; }
  bool binary(binary_t &) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t &) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t position, const std::string &,
                   const nlohmann::detail::exception &ex) override {
    failure = ParseFailure{position, ex.what()};
    return false;
  }
  std::optional<ParseFailure> failure;
};
} // namespace

Error syntaxError(std::string_view text, size_t offset) {
  SyntaxOnly check;
  Json::sax_parse(text.begin(), text.end(), &check, Json::input_format_t::json,
                  /*strict=*/true);
  if (check.failure)
    return syntaxErrorAt(text, *check.failure);
  return syntaxErrorAt(text,
                       {std::min(offset, text.size()) + 1, "syntax error"});
}

/// "64 MiB", "1 GiB", "1000 bytes".
static std::string byteSize(int64_t bytes) {
  if (bytes > 0 && bytes % (int64_t(1) << 30) == 0)
    return std::to_string(bytes >> 30) + " GiB";
  if (bytes > 0 && bytes % (int64_t(1) << 20) == 0)
    return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}

Result<void> readFileInto(const std::string &path, std::string &out,
                          int64_t maxBytes) {
  int fd = -1;
  auto fail = [&](const std::string &why) {
    if (fd >= 0)
      ::close(fd);
    out.clear();
    return makeError("cannot read \"" + path + "\": " + why);
  };
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused
  // below as not a regular file); reads of regular files ignore it.
  fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return fail(std::strerror(errno));
  struct stat info;
  if (::fstat(fd, &info) != 0)
    return fail(std::strerror(errno));
  if (!S_ISREG(info.st_mode))
    return fail("not a regular file");
  if (info.st_size > maxBytes)
    return fail("larger than " + byteSize(maxBytes));
  // Straight into the buffer. Resizing a reused buffer over its old
  // contents clears only what is new.
  size_t size = static_cast<size_t>(info.st_size), got = 0;
  out.resize(size);
  while (got < size) {
    ssize_t n = ::read(fd, out.data() + got, size - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return fail(std::strerror(errno));
    if (n == 0)
      break; // the file shrank meanwhile
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  // A file that grew meanwhile is read on, up to the limit.
  char chunk[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return fail(std::strerror(errno));
    if (n == 0)
      break;
    if (out.size() + static_cast<size_t>(n) > static_cast<size_t>(maxBytes))
      return fail("larger than " + byteSize(maxBytes));
    out.append(chunk, static_cast<size_t>(n));
  }
  ::close(fd);
  return {};
}

Result<std::string> readFile(const std::string &path, int64_t maxBytes) {
  std::string text;
  MESHPLAN_TRY(readFileInto(path, text, maxBytes));
  return text;
}

//===----------------------------------------------------------------------===//
// Typed access
//===----------------------------------------------------------------------===//

const Json *member(const Json &object, std::string_view key) {
  if (!object.is_object())
    return nullptr;
  auto it = object.find(std::string(key));
  return it == object.end() ? nullptr : &*it;
}

/// An integer in JSON Schema's sense: a number with no fractional part.
static std::optional<int64_t> asInt(const Json &value, bool &outOfRange) {
  outOfRange = false;
  if (value.is_number_unsigned()) {
    uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) {
      outOfRange = true;
      return std::nullopt;
    }
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer())
    return value.get<int64_t>();
  if (value.is_number_float()) {
    double d = value.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d)
      return std::nullopt;
    if (d < -9.2e18 || d > 9.2e18) {
      outOfRange = true;
      return std::nullopt;
    }
    return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

static bool hasType(const Json &value, JsonType type) {
  bool outOfRange;
  switch (type) {
  case JsonType::Object:
    return value.is_object();
  case JsonType::Array:
    return value.is_array();
  case JsonType::String:
    return value.is_string();
  case JsonType::Integer:
    return asInt(value, outOfRange).has_value() || outOfRange;
  case JsonType::Number:
    return value.is_number();
  case JsonType::Boolean:
    return value.is_boolean();
  }
  return false;
}

static std::string article(JsonType type) {
  switch (type) {
  case JsonType::Object:
    return "an object";
  case JsonType::Array:
    return "an array";
  case JsonType::String:
    return "a string";
  case JsonType::Integer:
    return "an integer";
  case JsonType::Number:
    return "a number";
  case JsonType::Boolean:
    return "a boolean";
  }
  return "a value";
}

static std::string plural(JsonType type) {
  switch (type) {
  case JsonType::Object:
    return "objects";
  case JsonType::Array:
    return "arrays";
  case JsonType::String:
    return "strings";
  case JsonType::Integer:
    return "integers";
  case JsonType::Number:
    return "numbers";
  case JsonType::Boolean:
    return "booleans";
  }
  return "values";
}

static Result<void> checkType(const Json &value, const std::string &pointer,
                              JsonType type) {
  if (!hasType(value, type))
    return typeError(pointer, value, article(type));
  return {};
}

std::string unknownNameMessage(std::string_view what, std::string_view text,
                               std::span<const std::string_view> values) {
  return "unknown " + std::string(what) + " " + truncatedText(quote(text)) +
         "; expected one of " + joinNames(values) + didYouMean(text, values);
}

static Result<void> checkEnum(const Json &value, const std::string &pointer,
                              std::string_view what,
                              std::span<const std::string_view> values) {
  const std::string &text = value.get_ref<const std::string &>();
  if (std::find(values.begin(), values.end(), text) != values.end())
    return {};
  return errorAt(pointer, unknownNameMessage(what, text, values));
}

std::string_view enumNoun(const KeyRule &rule) {
  return rule.noun.empty() ? rule.name : rule.noun;
}

std::string expectedTypeText(JsonType type, std::optional<JsonType> items) {
  std::string expected = article(type);
  if (items)
    expected += " of " + plural(*items);
  return expected;
}

std::string_view jsonTypeName(JsonType type) {
  switch (type) {
  case JsonType::Object:
    return "object";
  case JsonType::Array:
    return "array";
  case JsonType::String:
    return "string";
  case JsonType::Integer:
    return "integer";
  case JsonType::Number:
    return "number";
  case JsonType::Boolean:
    return "boolean";
  }
  return "?";
}

const KeyRule *SectionRule::find(std::string_view key) const {
  for (const KeyRule &rule : keys)
    if (rule.name == key)
      return &rule;
  return nullptr;
}

std::string SectionRule::keyList() const {
  std::string out;
  for (const KeyRule &rule : keys) {
    if (!out.empty())
      out += ", ";
    out += rule.name;
  }
  return out;
}

Result<void> checkObject(const Json &value, const std::string &pointer,
                         const SectionRule &section) {
  if (!value.is_object())
    return typeError(pointer, value, "an object");
  std::vector<std::string_view> known;
  for (const KeyRule &rule : section.keys)
    known.push_back(rule.name);
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (!section.find(it.key()))
      return errorAt(childPointer(pointer, it.key()),
                     "unknown key; expected one of " + section.keyList() +
                         didYouMean(it.key(), known));
  }
  for (const KeyRule &rule : section.keys) {
    const Json *child = member(value, rule.name);
    std::string childPtr = childPointer(pointer, rule.name);
    if (!child) {
      if (rule.required)
        return errorAt(childPtr, "missing required key; expected " +
                                     expectedTypeText(rule.type, rule.items));
      continue;
    }
    if (rule.nullable && child->is_null())
      continue;
    MESHPLAN_TRY(checkType(*child, childPtr, rule.type));
    if (rule.type == JsonType::String && !rule.values.empty())
      MESHPLAN_TRY(checkEnum(*child, childPtr, enumNoun(rule), rule.values));
    if (rule.type != JsonType::Array)
      continue;
    if (rule.length && child->size() != static_cast<size_t>(*rule.length))
      return errorAt(childPtr, "expected " + std::to_string(*rule.length) +
                                   " elements, got " +
                                   std::to_string(child->size()));
    if (!rule.items)
      continue;
    for (size_t i = 0; i < child->size(); ++i) {
      const Json &element = (*child)[i];
      std::string elementPtr = childPointer(childPtr, i);
      MESHPLAN_TRY(checkType(element, elementPtr, *rule.items));
      if (*rule.items == JsonType::String && !rule.values.empty())
        MESHPLAN_TRY(
            checkEnum(element, elementPtr, enumNoun(rule), rule.values));
    }
  }
  return {};
}

Result<int64_t> readInt(const Json &value, const std::string &pointer,
                        int64_t min, int64_t max) {
  bool outOfRange = false;
  std::optional<int64_t> v = asInt(value, outOfRange);
  std::string range;
  if (min != INT64_MIN && max != INT64_MAX)
    range = " in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
  else if (min != INT64_MIN)
    range = " >= " + std::to_string(min);
  else if (max != INT64_MAX)
    range = " <= " + std::to_string(max);
  if (!v || *v < min || *v > max) {
    if (!v && !outOfRange)
      return typeError(pointer, value, "an integer" + range);
    return errorAt(pointer, "expected an integer" + range + ", got " +
                                truncatedText(dumpSafe(value)));
  }
  return *v;
}

Result<uint64_t> readUInt64(const Json &value, const std::string &pointer) {
  if (value.is_number_unsigned())
    return value.get<uint64_t>();
  auto v = readInt(value, pointer, 0, INT64_MAX);
  if (!v)
    return typeError(pointer, value, "an integer in [0, 2^64)");
  return static_cast<uint64_t>(*v);
}

Result<double> readNumber(const Json &value, const std::string &pointer) {
  if (!value.is_number())
    return typeError(pointer, value, "a number");
  double d = value.get<double>();
  if (!std::isfinite(d))
    return errorAt(pointer, "expected a finite number, got " +
                                truncatedText(dumpSafe(value)));
  return d;
}

Result<bool> readBool(const Json &value, const std::string &pointer) {
  if (!value.is_boolean())
    return typeError(pointer, value, "a boolean");
  return value.get<bool>();
}

Result<std::string> readString(const Json &value, const std::string &pointer) {
  if (!value.is_string())
    return typeError(pointer, value, "a string");
  return value.get<std::string>();
}

Result<std::vector<std::string>> readStringArray(const Json &value,
                                                 const std::string &pointer) {
  if (!value.is_array())
    return typeError(pointer, value, "an array of strings");
  std::vector<std::string> out;
  for (size_t i = 0; i < value.size(); ++i) {
    auto s = readString(value[i], childPointer(pointer, i));
    if (!s)
      return s.error();
    out.push_back(std::move(*s));
  }
  return out;
}

Result<std::vector<int64_t>> readIntArray(const Json &value,
                                          const std::string &pointer,
                                          int64_t min, int64_t max) {
  if (!value.is_array())
    return typeError(pointer, value, "an array of integers");
  std::vector<int64_t> out;
  for (size_t i = 0; i < value.size(); ++i) {
    auto v = readInt(value[i], childPointer(pointer, i), min, max);
    if (!v)
      return v.error();
    out.push_back(*v);
  }
  return out;
}

Result<int> readEnum(const Json &value, const std::string &pointer,
                     std::string_view what,
                     std::span<const std::string_view> values) {
  if (!value.is_string())
    return typeError(pointer, value, "a string");
  MESHPLAN_TRY(checkEnum(value, pointer, what, values));
  const std::string &text = value.get_ref<const std::string &>();
  return static_cast<int>(std::find(values.begin(), values.end(), text) -
                          values.begin());
}

} // namespace meshplan::json
