//===- JsonReader.cpp - Fast reading of large untrusted JSON --------------===//
//
// The tokenizer is a loop over an explicit stack of open containers (no
// recursion) that appends one node per value and per key. Its hot paths are
// the ones machine-written plans exercise: short strings without escapes
// (scanned eight bytes at a time), small integers, and objects of a dozen
// keys (a repeated key is found by comparing a 20-byte print of each key
// with the earlier ones', so that distinct keys are never compared).
//
//===----------------------------------------------------------------------===//

#include "meshplan/Support/JsonReader.h"

#include "JsonDetail.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <memory>
#include <unordered_set>

namespace meshplan::json {

//===----------------------------------------------------------------------===//
// Paths
//===----------------------------------------------------------------------===//

std::string Path::str() const {
  // Collect the chain root-first; only errors get here.
  std::vector<const Path *> chain;
  for (const Path *p = this; p; p = p->parent)
    chain.push_back(p);
  std::string out;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const Path &p = **it;
    switch (p.kind) {
    case Kind::Root:
      break;
    case Kind::Prefix:
      out += p.key;
      break;
    case Kind::Key:
      out = childPointer(out, p.key);
      break;
    case Kind::Index:
      out = childPointer(out, p.index);
      break;
    }
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Tokenizer
//===----------------------------------------------------------------------===//

thread_local Document::Nodes Document::spare;

Document::~Document() {
  // Keep the larger array for the next document, up to 64 MiB.
  constexpr size_t kMaxSpare = (size_t(64) << 20) / sizeof(Node);
  if (nodes.capacity > spare.capacity && nodes.capacity <= kMaxSpare)
    spare = std::move(nodes);
}

namespace {

/// Bit 7 of each byte of the result is set where the byte of `w` is zero
/// (exact for the lowest such byte, which is all the callers use).
inline uint64_t zeroBytes(uint64_t w) {
  return (w - 0x0101010101010101ull) & ~w & 0x8080808080808080ull;
}

inline uint64_t load8(const char *at) {
  uint64_t w;
  std::memcpy(&w, at, 8);
  return w;
}

/// A key's length and first and last eight bytes: two keys that differ
/// there (all the keys of a plan's objects do) are told apart without
/// comparing them.
struct KeyPrint {
  uint64_t head, tail;
  uint32_t size;
  uint32_t node;
  bool operator==(const KeyPrint &o) const {
    return head == o.head && tail == o.tail && size == o.size;
  }
};

/// Objects with more members than this keep their keys in a hash set
/// instead of comparing each new key's print with all earlier ones.
constexpr uint32_t kSmallObject = 16;

} // namespace

/// Builds a Document's nodes; see the file comment.
class Tokenizer {
public:
  Tokenizer(Document &doc, int maxDepth, int64_t maxValues,
            const char *maxValuesText)
      : doc(doc), begin(doc.text.data()), p(begin),
        end(begin + doc.text.size()), maxDepth(maxDepth), maxValues(maxValues),
        maxValuesText(maxValuesText) {}

  Result<void> run();
  /// Values tokenized (the unit of `maxValues`).
  int64_t valuesRead() const { return values; }

private:
  using Node = Document::Node;

  /// An open container.
  struct Open {
    uint32_t node;      ///< its node
    uint32_t count = 0; ///< elements or members so far
    uint32_t key = 0;   ///< objects: the node of the current member's key
    bool object = false;
  };

  /// A syntax error at `at`: nlohmann's explanation (see syntaxError).
  Error syntax(const char *at) const;
  /// "<pointer of the value about to be stored>: <message>"; with
  /// `inInnermost`, the pointer of the innermost open container (a key
  /// being read is not a value yet).
  Error located(const std::string &message, bool inInnermost = false) const;

  void skipSpace() {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
      ++p;
  }
  Node *append() {
    if (out == limit) [[unlikely]]
      grow();
    return out++;
  }
  void grow();
  uint32_t size() const {
    return static_cast<uint32_t>(out - doc.nodes.data.get());
  }
  Node &at(uint32_t i) { return doc.nodes.data[i]; }

  /// Scans the string whose opening quote is at `p` and appends its node
  /// (keys are string nodes too). False on a syntax error, with `p` at the
  /// offending byte.
  bool string();
  /// Decodes a string with escapes or non-ASCII bytes from `start` (after
  /// the quote) into the arena; `p` ends after the closing quote.
  bool escapedString(const char *start);
  /// Refuses a string of `bytes` bytes (see longString).
  bool tooLong(int64_t bytes) {
    longString = static_cast<size_t>(bytes);
    return false;
  }
  bool number();
  bool literal(std::string_view word, ValueKind kind);
  /// Parses a key (at `p`, after any space) and the colon after it.
  bool key(Open &open);

  /// The value about to be appended becomes the current element or member
  /// of the innermost container: for a container after the depth check, for
  /// a scalar after it was scanned (where nlohmann's SAX parser hands it
  /// over, so that errors come in the same order). A repeated key is an
  /// error.
  Result<void> store() {
    if (stack.empty() || !stack.back().object)
      return {};
    if (isDuplicate(stack.back()))
      return located("duplicate key");
    return {};
  }
  std::string_view keyText(uint32_t node) const {
    const Node &n = doc.nodes.data[node];
    const char *base = n.inArena ? doc.arena.data() : begin;
    return std::string_view(base + n.payload, n.size);
  }
  bool isDuplicate(const Open &open);

  Document &doc;
  const char *begin, *p, *end;
  Node *out = nullptr, *limit = nullptr;
  int maxDepth;
  int64_t maxValues;
  const char *maxValuesText;
  int64_t values = 0;
  /// Set by string() when it refuses a string longer than
  /// kMaxJsonStringBytes: syntax() then reports the limit instead.
  size_t longString = 0;
  bool longKey = false; ///< the refused string was a key
  std::vector<Open> stack;
  /// Prints of the keys of each open object, by depth.
  std::vector<std::vector<KeyPrint>> prints;
  /// Keys of the open objects beyond kSmallObject members, by depth.
  std::vector<std::unique_ptr<std::unordered_set<std::string_view>>> bigKeys;
};

Error Tokenizer::syntax(const char *at) const {
  if (longString)
    return located(std::string(longKey ? "a key" : "a string") + " of " +
                       std::to_string(longString) +
                       " bytes or more; strings are at most " +
                       kMaxJsonStringBytesText + " (docs/limits.md)",
                   longKey);
  return syntaxError(doc.text, static_cast<size_t>(at - begin));
}

Error Tokenizer::located(const std::string &message, bool inInnermost) const {
  std::string pointer;
  size_t n = stack.size() - (inInnermost && !stack.empty() ? 1 : 0);
  for (size_t i = 0; i < n; ++i) {
    const Open &o = stack[i];
    pointer = o.object ? childPointer(pointer, keyText(o.key))
                       : childPointer(pointer, size_t(o.count - 1));
  }
  return errorAt(pointer, message);
}

void Tokenizer::grow() {
  size_t used = size();
  // No document has more nodes than bytes (plus the one of an empty text).
  size_t capacity =
      std::max(std::min(std::max<size_t>(2 * used, 1024), doc.text.size() + 1),
               used + 1);
  auto bigger = std::make_unique_for_overwrite<Node[]>(capacity);
  if (used)
    std::memcpy(bigger.get(), doc.nodes.data.get(), used * sizeof(Node));
  doc.nodes.data = std::move(bigger);
  doc.nodes.capacity = capacity;
  out = doc.nodes.data.get() + used;
  limit = doc.nodes.data.get() + capacity;
}

bool Tokenizer::isDuplicate(const Open &open) {
  std::string_view key = keyText(open.key);
  size_t depth = stack.size() - 1;
  if (open.count > kSmallObject) {
    auto &set = bigKeys[depth];
    if (open.count == kSmallObject + 1) {
      if (!set)
        set = std::make_unique<std::unordered_set<std::string_view>>();
      set->clear();
      for (const KeyPrint &k : prints[depth])
        set->insert(keyText(k.node));
    }
    return !set->insert(key).second;
  }
  KeyPrint print{0, 0, static_cast<uint32_t>(key.size()), open.key};
  if (key.size() >= 8) {
    print.head = load8(key.data());
    print.tail = load8(key.data() + key.size() - 8);
  } else if (std::endian::native == std::endian::little &&
             key.data() + 8 <= end && !at(open.key).inArena) {
    // A short key in the text: its closing quote follows, so eight bytes
    // can be read and the ones after the key masked off.
    print.head = load8(key.data()) & ((uint64_t(1) << (8 * key.size())) - 1);
  } else {
    for (size_t i = 0; i < key.size(); ++i)
      print.head |= uint64_t(static_cast<unsigned char>(key[i])) << (8 * i);
  }
  std::vector<KeyPrint> &seen = prints[depth];
  for (const KeyPrint &k : seen)
    if (k == print && keyText(k.node) == key)
      return true;
  seen.push_back(print);
  return false;
}

bool Tokenizer::escapedString(const char *start) {
  // The key set of a big object (isDuplicate) holds views of arena keys
  // while later strings are appended, so the arena must never reallocate:
  // decoded strings are no longer than their source, so the text's size
  // bounds them all.
  if (doc.arena.capacity() < doc.text.size())
    doc.arena.reserve(doc.text.size());
  size_t offset = doc.arena.size();
  std::string &decoded = doc.arena;
  const char *q = start;
  auto hex4 = [&](const char *from, uint32_t &value) {
    if (end - from < 4)
      return false;
    value = 0;
    for (int k = 0; k < 4; ++k) {
      char c = from[k];
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0)
        return false;
      value = value << 4 | uint32_t(d);
    }
    return true;
  };
  /// The length of the UTF-8 sequence at `q` (RFC 3629, as nlohmann
  /// checks it), or 0 if it is not valid.
  auto utf8Length = [&]() -> size_t {
    size_t left = static_cast<size_t>(end - q);
    auto byte = [&](size_t k) { return static_cast<unsigned char>(q[k]); };
    auto cont = [&](size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) {
      return k < left && byte(k) >= lo && byte(k) <= hi;
    };
    unsigned char c = byte(0);
    if (c >= 0xC2 && c <= 0xDF)
      return cont(1) ? 2 : 0;
    if (c == 0xE0)
      return cont(1, 0xA0) && cont(2) ? 3 : 0;
    if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
      return cont(1) && cont(2) ? 3 : 0;
    if (c == 0xED)
      return cont(1, 0x80, 0x9F) && cont(2) ? 3 : 0;
    if (c == 0xF0)
      return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
    if (c >= 0xF1 && c <= 0xF3)
      return cont(1) && cont(2) && cont(3) ? 4 : 0;
    if (c == 0xF4)
      return cont(1, 0x80, 0x8F) && cont(2) && cont(3) ? 4 : 0;
    return 0;
  };
  auto fail = [&](const char *at) {
    p = at;
    return false;
  };
  while (true) {
    if (q >= end)
      return fail(q);
    if (decoded.size() - offset > size_t(kMaxJsonStringBytes)) [[unlikely]]
      return tooLong(static_cast<int64_t>(decoded.size() - offset));
    unsigned char c = static_cast<unsigned char>(*q);
    if (c == '"')
      break;
    if (c < 0x20)
      return fail(q);
    if (c >= 0x80) {
      size_t length = utf8Length();
      if (!length)
        return fail(q);
      decoded.append(q, length);
      q += length;
      continue;
    }
    if (c != '\\') {
      decoded += static_cast<char>(c);
      ++q;
      continue;
    }
    if (end - q < 2)
      return fail(q);
    char e = q[1];
    q += 2;
    switch (e) {
    case '"':
    case '\\':
    case '/':
      decoded += e;
      continue;
    case 'b':
      decoded += '\b';
      continue;
    case 'f':
      decoded += '\f';
      continue;
    case 'n':
      decoded += '\n';
      continue;
    case 'r':
      decoded += '\r';
      continue;
    case 't':
      decoded += '\t';
      continue;
    case 'u':
      break;
    default:
      return fail(q - 1);
    }
    uint32_t cp;
    if (!hex4(q, cp))
      return fail(q);
    q += 4;
    if (cp >= 0xDC00 && cp <= 0xDFFF)
      return fail(q); // a low surrogate must follow a high one
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      uint32_t low;
      if (end - q < 6 || q[0] != '\\' || q[1] != 'u' || !hex4(q + 2, low) ||
          low < 0xDC00 || low > 0xDFFF)
        return fail(q);
      q += 6;
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    if (cp < 0x80) {
      decoded += static_cast<char>(cp);
    } else if (cp < 0x800) {
      decoded += static_cast<char>(0xC0 | (cp >> 6));
      decoded += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      decoded += static_cast<char>(0xE0 | (cp >> 12));
      decoded += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      decoded += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      decoded += static_cast<char>(0xF0 | (cp >> 18));
      decoded += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      decoded += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      decoded += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  p = q + 1;
  *append() = Node{ValueKind::String, true,
                   static_cast<uint32_t>(decoded.size() - offset), offset};
  return true;
}

bool Tokenizer::string() {
  const char *start = p + 1;
  const char *q = start;
  // Eight bytes at a time up to the first quote, backslash, control
  // character or non-ASCII byte.
  if constexpr (std::endian::native == std::endian::little) {
    while (end - q >= 8) {
      uint64_t w = load8(q);
      uint64_t special = zeroBytes(w ^ 0x2222222222222222ull) |
                         zeroBytes(w ^ 0x5C5C5C5C5C5C5C5Cull) |
                         ((w - 0x2020202020202020ull) & ~w) | w;
      special &= 0x8080808080808080ull;
      if (special) {
        q += std::countr_zero(special) / 8;
        break;
      }
      q += 8;
    }
  }
  while (q < end) {
    unsigned char c = static_cast<unsigned char>(*q);
    if (c == '"') {
      if (q - start > kMaxJsonStringBytes) [[unlikely]]
        return tooLong(q - start);
      *append() =
          Node{ValueKind::String, false, static_cast<uint32_t>(q - start),
               static_cast<uint64_t>(start - begin)};
      p = q + 1;
      return true;
    }
    if (c == '\\' || c >= 0x80)
      return escapedString(start);
    if (c < 0x20)
      break;
    ++q;
  }
  p = q;
  return false;
}

bool Tokenizer::number() {
  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  const char *start = p;
  const char *q = p;
  bool negative = *q == '-';
  if (negative)
    ++q;
  auto digit = [&](const char *at) {
    return at < end && *at >= '0' && *at <= '9';
  };
  auto fail = [&](const char *at) {
    p = at;
    return false;
  };
  if (!digit(q))
    return fail(q);
  const char *intStart = q;
  // Small integers, the common case, are accumulated while scanned.
  uint64_t magnitude = 0;
  if (*q == '0') {
    ++q;
  } else {
    while (digit(q) && q - intStart < 19)
      magnitude = magnitude * 10 + uint64_t(*q++ - '0');
    while (digit(q))
      ++q;
  }
  const char *intEnd = q;
  bool isFloat = false;
  if (q < end && *q == '.') {
    ++q;
    if (!digit(q))
      return fail(q);
    while (digit(q))
      ++q;
    isFloat = true;
  }
  const char *exponentAt = q;
  if (q < end && (*q == 'e' || *q == 'E')) {
    ++q;
    if (q < end && (*q == '+' || *q == '-'))
      ++q;
    if (!digit(q))
      return fail(q);
    while (digit(q))
      ++q;
    isFloat = true;
  }
  p = q;
  if (!isFloat) {
    // As nlohmann: an integer that does not fit is read as a float.
    bool fits = true;
    for (const char *d = intStart + 19; fits && d < intEnd; ++d)
      fits = !__builtin_mul_overflow(magnitude, 10, &magnitude) &&
             !__builtin_add_overflow(magnitude, uint64_t(*d - '0'), &magnitude);
    if (fits && !negative) {
      *append() = Node{ValueKind::Unsigned, false, 0, magnitude};
      return true;
    }
    if (fits && magnitude <= uint64_t(1) << 63) {
      *append() = Node{ValueKind::Signed, false, 0, 0 - magnitude};
      return true;
    }
  }
  double value = 0;
  auto [ptr, ec] = std::from_chars(start, q, value);
  if (ec == std::errc::result_out_of_range) {
    // from_chars leaves the value alone where strtod (which nlohmann uses)
    // gives +-HUGE_VAL on overflow and +-0 on underflow. nlohmann refuses an
    // infinite number ("number overflow"), so only underflow reads: the
    // decimal magnitude (where the first significant digit is, plus the
    // exponent) tells which it was.
    int64_t exponent = 0;
    if (exponentAt != q) {
      const char *d = exponentAt + 1;
      bool minus = *d == '-';
      if (*d == '+' || *d == '-')
        ++d;
      for (; d < q; ++d)
        exponent = std::min<int64_t>(exponent * 10 + (*d - '0'), 1 << 30);
      if (minus)
        exponent = -exponent;
    }
    int64_t magnitude10 = intEnd - intStart;
    if (*intStart == '0') {
      magnitude10 = 0;
      for (const char *d = intEnd + 1; d < exponentAt && *d == '0'; ++d)
        --magnitude10;
    }
    if (magnitude10 + exponent > 0)
      return fail(start);
    value = negative ? -0.0 : 0.0;
  }
  *append() = Node{ValueKind::Float, false, 0, std::bit_cast<uint64_t>(value)};
  return true;
}

bool Tokenizer::literal(std::string_view word, ValueKind kind) {
  if (static_cast<size_t>(end - p) < word.size() ||
      std::memcmp(p, word.data(), word.size()) != 0) {
    // Point at the first byte that differs (for the fallback message).
    for (size_t k = 0; p < end && k < word.size() && *p == word[k]; ++k)
      ++p;
    return false;
  }
  p += word.size();
  *append() = Node{kind, false, 0, 0};
  return true;
}

bool Tokenizer::key(Open &open) {
  if (p == end || *p != '"')
    return false;
  if (!string()) {
    longKey = longString != 0;
    return false;
  }
  open.key = size() - 1;
  ++open.count;
  skipSpace();
  if (p == end || *p != ':')
    return false;
  ++p;
  return true;
}

Result<void> Tokenizer::run() {
  if (doc.text.size() >= UINT32_MAX)
    return makeError("the document has " + std::to_string(doc.text.size()) +
                     " bytes; at most 4 GiB - 1 can be read");
  doc.nodes = std::move(Document::spare);
  out = doc.nodes.data.get();
  limit = out + doc.nodes.capacity;
  // A UTF-8 byte order mark is skipped, as nlohmann does.
  if (end - p >= 3 && std::memcmp(p, "\xEF\xBB\xBF", 3) == 0)
    p += 3;
  while (true) {
    // A value is expected.
    if (++values > maxValues) [[unlikely]]
      return located("the document has more than " +
                     std::string(maxValuesText ? maxValuesText
                                               : std::to_string(maxValues)) +
                     " values (docs/limits.md)");
    skipSpace();
    if (p == end)
      return syntax(p);
    char c = *p;
    if (c == '{' || c == '[') {
      if (static_cast<int>(stack.size()) >= maxDepth)
        return located("nested deeper than " + std::to_string(maxDepth) +
                       " levels");
      MESHPLAN_TRY(store());
      bool object = c == '{';
      stack.push_back(Open{size(), 0, 0, object});
      *append() =
          Node{object ? ValueKind::Object : ValueKind::Array, false, 0, 0};
      if (object) {
        size_t depth = stack.size() - 1;
        if (prints.size() <= depth) {
          prints.resize(depth + 1);
          bigKeys.resize(depth + 1);
        }
        prints[depth].clear();
      }
      ++p;
      skipSpace();
      if (p == end || *p != (object ? '}' : ']')) {
        Open &open = stack.back();
        if (!object)
          ++open.count;
        else if (!key(open))
          return syntax(p);
        continue;
      }
      ++p;
      at(stack.back().node).payload = size();
      stack.pop_back();
    } else {
      bool ok;
      switch (c) {
      case '"':
        ok = string();
        break;
      case 't':
        ok = literal("true", ValueKind::True);
        break;
      case 'f':
        ok = literal("false", ValueKind::False);
        break;
      case 'n':
        ok = literal("null", ValueKind::Null);
        break;
      default:
        ok = (c == '-' || (c >= '0' && c <= '9')) && number();
      }
      if (!ok)
        return syntax(p);
      MESHPLAN_TRY(store());
    }
    // After a value: a separator, the ends of containers, or the end.
    while (true) {
      skipSpace();
      if (stack.empty()) {
        if (p != end)
          return syntax(p);
        return {};
      }
      if (p == end)
        return syntax(p);
      Open &open = stack.back();
      if (*p == ',') {
        ++p;
        if (open.object) {
          skipSpace();
          if (!key(open))
            return syntax(p);
        } else {
          ++open.count;
        }
        break;
      }
      if (*p != (open.object ? '}' : ']'))
        return syntax(p);
      ++p;
      Node &n = at(open.node);
      n.size = open.count;
      n.payload = size();
      stack.pop_back();
    }
  }
}

Result<Document> Document::parse(std::string_view text, int maxDepth,
                                 int64_t maxValues, const char *maxValuesText) {
  Document doc;
  doc.text = text;
  Tokenizer tokenizer(doc, maxDepth, maxValues, maxValuesText);
  MESHPLAN_TRY(tokenizer.run());
  doc.valueCount_ = tokenizer.valuesRead();
  return doc;
}

//===----------------------------------------------------------------------===//
// Values
//===----------------------------------------------------------------------===//

std::string_view Value::string() const {
  const Document::Node &n = node();
  const char *base = n.inArena ? doc->arena.data() : doc->text.data();
  return std::string_view(base + n.payload, n.size);
}

double Value::floatValue() const {
  return std::bit_cast<double>(node().payload);
}

double Value::numberAsDouble() const {
  switch (kind()) {
  case ValueKind::Unsigned:
    return static_cast<double>(unsignedValue());
  case ValueKind::Signed:
    return static_cast<double>(signedValue());
  default:
    return floatValue();
  }
}

std::optional<Value> Value::find(std::string_view key) const {
  for (Member m : members())
    if (m.key == key)
      return m.value;
  return std::nullopt;
}

Json Value::toJson() const {
  switch (kind()) {
  case ValueKind::Null:
    return Json(nullptr);
  case ValueKind::False:
    return Json(false);
  case ValueKind::True:
    return Json(true);
  case ValueKind::Unsigned:
    return Json(unsignedValue());
  case ValueKind::Signed:
    return Json(signedValue());
  case ValueKind::Float:
    return Json(floatValue());
  case ValueKind::String:
    return Json(std::string(string()));
  case ValueKind::Array: {
    // Recursion bounded by the document's depth limit.
    Json out = Json::array();
    for (Value e : elements())
      out.push_back(e.toJson());
    return out;
  }
  case ValueKind::Object: {
    Json out = Json::object();
    for (Member m : members())
      out[std::string(m.key)] = m.value.toJson();
    return out;
  }
  }
  return Json();
}

//===----------------------------------------------------------------------===//
// Messages and typed access
//===----------------------------------------------------------------------===//

Error errorAt(const Path &path, const std::string &message) {
  return errorAt(path.str(), message);
}

std::string describe(Value value) {
  if (value.isArray())
    return "an array";
  if (value.isObject())
    return "an object";
  return describe(value.toJson());
}

std::string dump(Value value) {
  return value.toJson().dump(-1, ' ', false, Json::error_handler_t::replace);
}

Error typeError(const Path &path, Value value, std::string_view expected) {
  return errorAt(path, "expected " + std::string(expected) + ", got " +
                           describe(value));
}

namespace {

/// An integer in JSON Schema's sense, as asInt in Json.cpp.
std::optional<int64_t> asInt(Value value, bool &outOfRange) {
  outOfRange = false;
  switch (value.kind()) {
  case ValueKind::Unsigned:
    if (value.unsignedValue() > static_cast<uint64_t>(INT64_MAX)) {
      outOfRange = true;
      return std::nullopt;
    }
    return static_cast<int64_t>(value.unsignedValue());
  case ValueKind::Signed:
    return value.signedValue();
  case ValueKind::Float: {
    double d = value.floatValue();
    if (!std::isfinite(d) || std::floor(d) != d)
      return std::nullopt;
    if (d < -9.2e18 || d > 9.2e18) {
      outOfRange = true;
      return std::nullopt;
    }
    return static_cast<int64_t>(d);
  }
  default:
    return std::nullopt;
  }
}

inline bool hasType(Value value, JsonType type) {
  // The common cases first, inline.
  ValueKind kind = value.kind();
  if (type == JsonType::String)
    return kind == ValueKind::String;
  if (type == JsonType::Integer &&
      (kind == ValueKind::Unsigned || kind == ValueKind::Signed))
    return true;
  bool outOfRange;
  switch (type) {
  case JsonType::Object:
    return value.isObject();
  case JsonType::Array:
    return value.isArray();
  case JsonType::String:
    return value.isString();
  case JsonType::Integer:
    return value.kind() == ValueKind::Unsigned ||
           value.kind() == ValueKind::Signed ||
           asInt(value, outOfRange).has_value() || outOfRange;
  case JsonType::Number:
    return value.isNumber();
  case JsonType::Boolean:
    return value.isBool();
  }
  return false;
}

std::string rangeText(int64_t min, int64_t max) {
  if (min != INT64_MIN && max != INT64_MAX)
    return " in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
  if (min != INT64_MIN)
    return " >= " + std::to_string(min);
  if (max != INT64_MAX)
    return " <= " + std::to_string(max);
  return "";
}

Result<void> checkEnum(Value value, const Path &path, std::string_view what,
                       std::span<const std::string_view> values) {
  std::string_view text = value.string();
  if (std::find(values.begin(), values.end(), text) != values.end())
    return {};
  return errorAt(path, unknownNameMessage(what, text, values));
}

} // namespace

Result<int64_t> readInt(Value value, const Path &path, int64_t min,
                        int64_t max) {
  // The common case first: a plain integer in range.
  if (value.kind() == ValueKind::Unsigned &&
      value.unsignedValue() <= static_cast<uint64_t>(INT64_MAX)) {
    int64_t v = static_cast<int64_t>(value.unsignedValue());
    if (v >= min && v <= max)
      return v;
  }
  bool outOfRange = false;
  std::optional<int64_t> v = asInt(value, outOfRange);
  if (v && *v >= min && *v <= max)
    return *v;
  if (!v && !outOfRange)
    return typeError(path, value, "an integer" + rangeText(min, max));
  return errorAt(path, "expected an integer" + rangeText(min, max) + ", got " +
                           truncatedText(dump(value)));
}

Result<double> readNumber(Value value, const Path &path) {
  // Always finite: the tokenizer refuses numbers that overflow.
  if (!value.isNumber())
    return typeError(path, value, "a number");
  return value.numberAsDouble();
}

Result<bool> readBool(Value value, const Path &path) {
  if (!value.isBool())
    return typeError(path, value, "a boolean");
  return value.boolean();
}

Result<std::string> readString(Value value, const Path &path) {
  if (!value.isString())
    return typeError(path, value, "a string");
  return std::string(value.string());
}

Result<void> readStringInto(Value value, const Path &path, std::string &out) {
  if (!value.isString())
    return typeError(path, value, "a string");
  out.assign(value.string());
  return {};
}

Result<void> readStringArrayInto(Value value, const Path &path,
                                 std::vector<std::string> &out) {
  if (!value.isArray())
    return typeError(path, value, "an array of strings");
  out.resize(value.size());
  size_t i = 0;
  for (Value e : value.elements()) {
    if (!e.isString())
      return typeError(path.child(i), e, "a string");
    out[i++].assign(e.string());
  }
  return {};
}

Result<std::vector<std::string>> readStringArray(Value value,
                                                 const Path &path) {
  std::vector<std::string> out;
  MESHPLAN_TRY(readStringArrayInto(value, path, out));
  return out;
}

Result<void> readIntArrayInto(Value value, const Path &path,
                              std::vector<int64_t> &out, int64_t min,
                              int64_t max) {
  if (!value.isArray())
    return typeError(path, value, "an array of integers");
  out.clear();
  out.reserve(value.size());
  size_t i = 0;
  for (Value e : value.elements()) {
    Result<int64_t> v = readInt(e, path.child(i++), min, max);
    if (!v)
      return v.error();
    out.push_back(*v);
  }
  return {};
}

Result<std::vector<int64_t>> readIntArray(Value value, const Path &path,
                                          int64_t min, int64_t max) {
  std::vector<int64_t> out;
  MESHPLAN_TRY(readIntArrayInto(value, path, out, min, max));
  return out;
}

Result<int> readEnum(Value value, const Path &path, std::string_view what,
                     std::span<const std::string_view> values) {
  if (!value.isString())
    return typeError(path, value, "a string");
  std::string_view text = value.string();
  for (size_t i = 0; i < values.size(); ++i)
    if (sameText(values[i], text))
      return static_cast<int>(i);
  return errorAt(path, unknownNameMessage(what, text, values));
}

//===----------------------------------------------------------------------===//
// Closed objects
//===----------------------------------------------------------------------===//

Value Fields::missing() {
  // The null of a document that is just "null". Never destroyed: a
  // Document's destructor hands its nodes to a thread_local, which may be
  // gone by the time statics are destroyed.
  static const Document *nullDocument = [] {
    Result<Document> d = Document::parse("null");
    return new Document(std::move(d.value()));
  }();
  return nullDocument->root();
}

Result<Fields> checkObject(Value value, const Path &path,
                           const SectionRule &section) {
  if (!value.isObject())
    return typeError(path, value, "an object");
  Fields fields;
  fields.doc = value.doc;
  fields.section = &section;
  const size_t n = section.keys.size();
  if (n > Fields::kMaxKeys)
    return errorAt(path, "internal error: section \"" +
                             std::string(section.name) + "\" has more than " +
                             std::to_string(Fields::kMaxKeys) + " keys");
  // Members to slots, unknown keys first (in document order). Members
  // usually come in table order, so the search starts after the last hit.
  size_t cursor = 0;
  for (uint32_t i = value.index + 1,
                end = static_cast<uint32_t>(value.node().payload);
       i != end; i = value.next(i + 1)) {
    std::string_view key = Value(value.doc, i).string();
    size_t k = 0;
    for (; k < n; ++k) {
      size_t r = cursor + k < n ? cursor + k : cursor + k - n;
      if (sameText(section.keys[r].name, key)) {
        fields.slots[r] = i + 1;
        cursor = r + 1 < n ? r + 1 : 0;
        break;
      }
    }
    if (k == n) {
      std::vector<std::string_view> known;
      for (const KeyRule &rule : section.keys)
        known.push_back(rule.name);
      return errorAt(path.child(key), "unknown key; expected one of " +
                                          section.keyList() +
                                          didYouMean(key, known));
    }
  }
  for (size_t r = 0; r < n; ++r) {
    const KeyRule &rule = section.keys[r];
    if (!fields.slots[r]) {
      if (rule.required)
        return errorAt(path.child(rule.name),
                       "missing required key; expected " +
                           expectedTypeText(rule.type, rule.items));
      continue;
    }
    Value child(value.doc, fields.slots[r]);
    if (rule.nullable && child.isNull())
      continue;
    if (!hasType(child, rule.type))
      return typeError(path.child(rule.name), child,
                       expectedTypeText(rule.type, std::nullopt));
    if (rule.type == JsonType::String && !rule.values.empty())
      MESHPLAN_TRY(
          checkEnum(child, path.child(rule.name), enumNoun(rule), rule.values));
    if (rule.type != JsonType::Array)
      continue;
    if (rule.length && child.size() != static_cast<size_t>(*rule.length))
      return errorAt(path.child(rule.name),
                     "expected " + std::to_string(*rule.length) +
                         " elements, got " + std::to_string(child.size()));
    if (!rule.items)
      continue;
    size_t i = 0;
    for (Value element : child.elements()) {
      if (!hasType(element, *rule.items))
        return typeError(path.child(rule.name).child(i), element,
                         expectedTypeText(*rule.items, std::nullopt));
      if (*rule.items == JsonType::String && !rule.values.empty())
        MESHPLAN_TRY(checkEnum(element, path.child(rule.name).child(i),
                               enumNoun(rule), rule.values));
      ++i;
    }
  }
  return fields;
}

} // namespace meshplan::json
