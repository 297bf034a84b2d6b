//===- Text.h - Small text helpers for core's parsers ---------------------===//
#ifndef MESHPLAN_CORE_TEXT_H
#define MESHPLAN_CORE_TEXT_H

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshplan {

std::string_view trim(std::string_view text);
/// Splits at `sep` outside (), [] and {}.
std::vector<std::string_view> splitTopLevel(std::string_view text, char sep);
/// A whole decimal integer (optional leading '-'), without overflow.
std::optional<int64_t> parseInt(std::string_view text);
/// Removes one pair of surrounding double quotes.
std::string_view unquote(std::string_view text);
std::string joinInts(const std::vector<int64_t> &values,
                     std::string_view sep = ",");
/// Letters, digits and '_', not starting with a digit: what mesh axes and
/// the names a view defines (flatten, unflatten) may be called.
bool isIdentifier(std::string_view name);
/// `text` with every byte outside printable ASCII written as \xHH, for
/// messages that quote a name the input gave.
std::string printable(std::string_view text);

} // namespace meshplan

#endif // MESHPLAN_CORE_TEXT_H
