//===- JsonSupport.h - Reading untrusted JSON with located errors ---------===//
//
// Internal to the frontend. Input documents are untrusted, and the frontend
// may be linked into MLIR code built with -fno-exceptions, so nothing here
// throws or catches: JSON is parsed through nlohmann's SAX interface (which
// reports errors by callback), values are type-checked before they are read,
// and every failure is an Error whose message starts with the JSON pointer of
// the offending value.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_LIB_FRONTEND_JSONSUPPORT_H
#define MESHPLAN_LIB_FRONTEND_JSONSUPPORT_H

#include "meshplan/Core/Result.h"
#include "meshplan/Frontend/Schema.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshplan::frontend::detail {

/// Keeps keys in document order, so "the first unknown key" is the first
/// one the user wrote.
using Json = nlohmann::ordered_json;

/// Largest nesting depth accepted; deeper documents are refused before any
/// recursive code sees them.
constexpr int kMaxJsonDepth = 64;

/// Parses a whole document. Malformed JSON gives "line L, column C: ...";
/// a duplicate key gives "<pointer>: duplicate key".
Result<Json> parseJson(std::string_view text);

/// Reads a whole file; the error names the path and the reason.
Result<std::string> readFile(const std::string &path);

/// JSON pointers (RFC 6901), built as strings; "" is the document root.
std::string childPointer(const std::string &pointer, std::string_view key);
std::string childPointer(const std::string &pointer, size_t index);
/// The error "<pointer>: <message>" (the root prints as "/").
Error errorAt(const std::string &pointer, const std::string &message);

/// "string \"2\"", "number 2.5", "an array", "null" ... for "got ...".
std::string describe(const Json &value);
/// `text` in double quotes, with JSON escapes.
std::string quote(std::string_view text);
/// "a, b, c"
std::string joinNames(const std::vector<std::string_view> &names);
std::string joinNames(const std::vector<std::string> &names);

/// Levenshtein distance.
size_t editDistance(std::string_view a, std::string_view b);
/// " (did you mean \"x\"?)" when some candidate is close to `word`, else "".
std::string didYouMean(std::string_view word,
                       const std::vector<std::string_view> &candidates);

/// Checks that `value` is an object obeying `section`: no unknown keys
/// (suggesting the closest known one), every required key present, every
/// present key of its declared type (arrays element by element), every
/// closed-set string one of its values.
Result<void> checkObject(const Json &value, const std::string &pointer,
                         const SectionRule &section);

/// Typed readers; `value` must already have passed checkObject's type check
/// or these check again. Ranges are inclusive.
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
                                          int64_t min, int64_t max);
/// A string that must be one of `values`; returns its index.
Result<int> readEnum(const Json &value, const std::string &pointer,
                     std::string_view what,
                     const std::vector<std::string_view> &values);

/// The member `key` of an object, or null when absent.
const Json *member(const Json &object, std::string_view key);

/// True for names made of letters, digits and '_' that do not start with a
/// digit.
bool isIdentifier(std::string_view name);

} // namespace meshplan::frontend::detail

#endif // MESHPLAN_LIB_FRONTEND_JSONSUPPORT_H
