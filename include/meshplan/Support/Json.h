//===- Json.h - Reading untrusted JSON with located errors ----------------===//
//
// Why this exists: every document meshplan reads (the parallelism spec, the
// model description, the per-rank plans) is untrusted JSON, and every reader
// must report a bad value the same way: "<JSON pointer>: expected ..., got
// ...", never an exception and never a silently resolved duplicate key. The
// frontend and the plan reader used to carry separate copies of these
// helpers, whose messages had drifted apart; this is the one copy of the
// rules. Readers of large documents (plans, checkpoint metadata) use
// JsonReader.h, which applies the same rules, with the same messages,
// without building a DOM.
//
// Nothing here throws or catches, because callers may be linked into MLIR
// code built with -fno-exceptions: JSON is parsed through nlohmann's SAX
// interface (which reports errors by callback), values are type-checked
// before they are read, and every failure is an Error whose message starts
// with the JSON pointer of the offending value.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_SUPPORT_JSON_H
#define MESHPLAN_SUPPORT_JSON_H

#include "meshplan/Core/Limits.h"
#include "meshplan/Core/Result.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace meshplan::json {

/// Keeps keys in document order, so "the first unknown key" is the first
/// one the user wrote.
using Json = nlohmann::ordered_json;

/// Default largest nesting depth accepted (deeper documents are refused
/// before any recursive code sees them) and largest file readFile accepts;
/// both live with every other limit in Core/Limits.h.
using meshplan::kMaxFileBytes;
using meshplan::kMaxJsonDepth;

/// Parses a whole document. Malformed JSON gives "line L, column C: ...";
/// a duplicate key gives "<pointer>: duplicate key"; nesting deeper than
/// `maxDepth` gives "<pointer>: nested deeper than N levels".
Result<Json> parseJson(std::string_view text, int maxDepth = kMaxJsonDepth);

/// Reads a whole regular file of at most `maxBytes`; the error names the
/// path and the reason.
Result<std::string> readFile(const std::string &path,
                             int64_t maxBytes = kMaxFileBytes);
/// The same into `out`, reusing its capacity (readers of many files keep
/// one buffer per thread).
Result<void> readFileInto(const std::string &path, std::string &out,
                          int64_t maxBytes = kMaxFileBytes);

/// JSON pointers (RFC 6901), built as strings; "" is the document root.
std::string childPointer(const std::string &pointer, std::string_view key);
std::string childPointer(const std::string &pointer, size_t index);
/// The error "<pointer>: <message>" (the root prints as "/").
Error errorAt(const std::string &pointer, const std::string &message);
/// The error "<pointer>: expected <expected>, got <describe(value)>".
Error typeError(const std::string &pointer, const Json &value,
                std::string_view expected);

/// "string \"2\"", "number 2.5", "an array", "null" ... for "got ...".
std::string describe(const Json &value);
/// `text` in double quotes, with JSON escapes; text longer than 200 bytes is
/// cut and followed by "...".
std::string quote(std::string_view text);
/// "a, b, c"
std::string joinNames(std::span<const std::string_view> names);
std::string joinNames(const std::vector<std::string> &names);

/// Levenshtein distance (an adjacent transposition counts as one edit).
size_t editDistance(std::string_view a, std::string_view b);
/// " (did you mean \"x\"?)" when some candidate is close to `word`, else "".
std::string didYouMean(std::string_view word,
                       std::span<const std::string_view> candidates);

//===----------------------------------------------------------------------===//
// Closed objects
//===----------------------------------------------------------------------===//

/// JSON value types, named as JSON Schema names them.
enum class JsonType { Object, Array, String, Integer, Number, Boolean };
std::string_view jsonTypeName(JsonType type);

/// One key an object accepts.
struct KeyRule {
  std::string_view name;
  JsonType type = JsonType::Object;
  bool required = false;
  /// For arrays: the element type.
  std::optional<JsonType> items = std::nullopt;
  /// For objects, or arrays of objects: the name of the section describing
  /// them (informational; checkObject does not descend).
  std::string_view section = {};
  /// For strings (or arrays of strings) with a closed set of values.
  std::vector<std::string_view> values = {};
  /// For arrays of a fixed length (e.g. AdamW's betas).
  std::optional<int> length = std::nullopt;
  /// For closed-set strings: the word in "unknown <noun> ..."; defaults to
  /// the key's name.
  std::string_view noun = {};
  /// Whether null is accepted in place of a value (meaning "absent").
  bool nullable = false;
};

/// The keys one kind of object accepts.
struct SectionRule {
  std::string_view name; ///< "" for a document root
  std::vector<KeyRule> keys;

  const KeyRule *find(std::string_view key) const;
  /// "a, b, c" in table order; used by "expected one of" messages.
  std::string keyList() const;
};

/// Checks that `value` is an object obeying `section`: no unknown keys
/// (suggesting the closest known one), every required key present, every
/// present key of its declared type (arrays element by element), every
/// closed-set string one of its values.
Result<void> checkObject(const Json &value, const std::string &pointer,
                         const SectionRule &section);

//===----------------------------------------------------------------------===//
// Typed access
//===----------------------------------------------------------------------===//

/// Typed readers; `value` may or may not have passed checkObject's type
/// check, these check again. Integers are JSON Schema integers (a number
/// with no fractional part). Ranges are inclusive.
Result<int64_t> readInt(const Json &value, const std::string &pointer,
                        int64_t min = INT64_MIN, int64_t max = INT64_MAX);
Result<uint64_t> readUInt64(const Json &value, const std::string &pointer);
Result<double> readNumber(const Json &value, const std::string &pointer);
Result<bool> readBool(const Json &value, const std::string &pointer);
Result<std::string> readString(const Json &value, const std::string &pointer);
Result<std::vector<std::string>> readStringArray(const Json &value,
                                                 const std::string &pointer);
Result<std::vector<int64_t>> readIntArray(const Json &value,
                                          const std::string &pointer,
                                          int64_t min = INT64_MIN,
                                          int64_t max = INT64_MAX);
/// A string that must be one of `values` ("unknown <what> \"x\"; expected
/// one of ..."); returns its index.
Result<int> readEnum(const Json &value, const std::string &pointer,
                     std::string_view what,
                     std::span<const std::string_view> values);

/// The member `key` of an object, or null when absent (or not an object).
const Json *member(const Json &object, std::string_view key);

/// True for names made of letters, digits and '_' that do not start with a
/// digit.
bool isIdentifier(std::string_view name);

} // namespace meshplan::json

#endif // MESHPLAN_SUPPORT_JSON_H
