//===- JsonDetail.h - Messages shared by the DOM and tape readers ---------===//
//
// Json.cpp (DOM values) and JsonReader.cpp (tape values) must word every
// message alike, so the wording lives here, once. Private to lib/Support.
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_LIB_SUPPORT_JSONDETAIL_H
#define MESHPLAN_LIB_SUPPORT_JSONDETAIL_H

#include "meshplan/Support/Json.h"

namespace meshplan::json {

/// The error for malformed JSON in `text`: "line L, column C: <nlohmann's
/// explanation>". `offset` is where the caller's own tokenizer stopped; it
/// is used only if nlohmann finds nothing wrong (which would be a bug in
/// that tokenizer).
Error syntaxError(std::string_view text, size_t offset);

/// `text`, cut at `limit` bytes (at a character boundary) and followed by
/// "..." if longer.
std::string truncatedText(std::string text, size_t limit = 60);

/// "unknown <what> \"x\"; expected one of a, b, c (did you mean \"a\"?)".
std::string unknownNameMessage(std::string_view what, std::string_view text,
                               std::span<const std::string_view> values);

/// "an integer", "an array of strings", ...: what a key of `type` (arrays:
/// of `items`) expects.
std::string expectedTypeText(JsonType type, std::optional<JsonType> items);

/// The word for a closed-set key's values in "unknown <what>": "style",
/// "kind", "dtype".
std::string_view enumNoun(const KeyRule &rule);

} // namespace meshplan::json

#endif // MESHPLAN_LIB_SUPPORT_JSONDETAIL_H
