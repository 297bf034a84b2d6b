//===- JsonReader.h - Fast reading of large untrusted JSON ----------------===//
//
// Why this exists: `meshplan verify` reads a thousand machine-written plans
// of up to a megabyte each, the runtime reads one per rank at start-up, and
// checkpoint metadata lists every chunk of every tensor. Building an
// nlohmann DOM for them (an allocation and an ordered map per value, a
// pointer string per container) cost ten times the rest of the work
// (docs/performance.md, section B). This reader tokenizes a document in one
// pass into a flat array of 16-byte nodes over the source text (a "tape":
// strings stay in the text unless they hold escapes, containers record where
// they end), and the typed helpers below read the plan, checkpoint, ...
// structures straight from it.
//
// It keeps every rule of Json.h's DOM reader, with the same messages, so
// both kinds of document fail alike:
//   - malformed JSON is "line L, column C: <nlohmann's explanation>" (the
//     explanation is taken from nlohmann's own parser, run again on the
//     text only when the document is malformed);
//   - a duplicate key is "<pointer>: duplicate key", nesting deeper than
//     the limit is "<pointer>: nested deeper than N levels", both found in
//     document order, where nlohmann's SAX parse would find them;
//   - closed objects, typed reads and their messages are Json.h's.
// JSON pointers are never built for values that are fine: readers pass a
// Path (a chain of keys and indices on their own stack frames) and the
// pointer string is made only for an error.
//
// Nothing here throws, allocates in proportion to a count the input states
// (only to what it actually contains), or recurses deeper than the depth
// limit (the tokenizer keeps an explicit stack; only Value::toJson, for
// messages, recurses, over a document already within the limit).
//
//===----------------------------------------------------------------------===//
#ifndef MESHPLAN_SUPPORT_JSONREADER_H
#define MESHPLAN_SUPPORT_JSONREADER_H

#include "meshplan/Support/Json.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace meshplan::json {

class Document;
class Value;
class Fields;

//===----------------------------------------------------------------------===//
// Lazy JSON pointers
//===----------------------------------------------------------------------===//

/// A JSON pointer as a chain of keys and indices. Each link lives on its
/// reader's stack frame, so a child must not outlive its parent; the
/// pointer string is built only by str(), i.e. for an error.
class Path {
public:
  /// The document root.
  Path() = default;
  /// A pointer given as a string ("/estimates"); `pointer` must outlive it.
  static Path fromString(std::string_view pointer) {
    Path p;
    p.kind = Kind::Prefix;
    p.key = pointer;
    return p;
  }

  Path child(std::string_view name) const { return Path(this, name); }
  Path child(size_t index) const { return Path(this, index); }

  /// The RFC 6901 pointer; "" for the root.
  std::string str() const;

private:
  enum class Kind : uint8_t { Root, Prefix, Key, Index };
  Path(const Path *parent, std::string_view name)
      : parent(parent), key(name), kind(Kind::Key) {}
  Path(const Path *parent, size_t index)
      : parent(parent), index(index), kind(Kind::Index) {}

  const Path *parent = nullptr;
  std::string_view key;
  size_t index = 0;
  Kind kind = Kind::Root;
};

//===----------------------------------------------------------------------===//
// Documents and values
//===----------------------------------------------------------------------===//

enum class ValueKind : uint8_t {
  Null,
  False,
  True,
  Unsigned, ///< an integer written without a minus sign, < 2^64
  Signed,   ///< a negative integer, >= -2^63
  Float,    ///< any other number (as nlohmann: fractions, exponents, and
            ///< integers beyond those ranges)
  String,
  Array,
  Object
};

/// One parsed document. Strings without escapes point into the text, which
/// must outlive the document and every Value taken from it.
class Document {
public:
  /// Tokenizes `text` (at most 4 GiB - 1). Errors as parseJson (Json.h),
  /// and, before the tape grows past them (docs/limits.md): more than
  /// `maxValues` values, or a string or key longer than kMaxJsonStringBytes,
  /// each named by its JSON pointer.
  static Result<Document> parse(std::string_view text,
                                int maxDepth = kMaxJsonDepth,
                                int64_t maxValues = INT64_MAX,
                                const char *maxValuesText = nullptr);

  Document(Document &&) noexcept = default;
  Document &operator=(Document &&) noexcept = default;
  ~Document();

  Value root() const;
  /// The values it holds, counted as `maxValues` counts them: a reader that
  /// parses a large document piece by piece (checkpoint metadata) keeps one
  /// limit over all the pieces.
  int64_t valueCount() const { return valueCount_; }

private:
  friend class Value;
  friend class Tokenizer;
  Document() = default;

  /// Trivial (no member initializers), so that node arrays are allocated
  /// without being cleared.
  struct Node {
    ValueKind kind;
    bool inArena; ///< strings: decoded into `arena`, not in `text`
    /// Strings: the length. Containers: the number of elements or members.
    uint32_t size;
    /// Strings: the offset in `text` or `arena`. Containers: the index of
    /// the node after the container (its members come first, a key node
    /// before each value). Numbers: the value's bits.
    uint64_t payload;
  };
  static_assert(sizeof(Node) == 16);

  /// Node storage. The array of the last document destroyed on a thread is
  /// kept for the next one parsed there: a fresh megabyte per plan would be
  /// page-faulted in again each time, which cost as much as tokenizing.
  struct Nodes {
    std::unique_ptr<Node[]> data;
    size_t capacity = 0;

    Nodes() = default;
    Nodes(Nodes &&o) noexcept
        : data(std::move(o.data)), capacity(std::exchange(o.capacity, 0)) {}
    Nodes &operator=(Nodes &&o) noexcept {
      data = std::move(o.data);
      capacity = std::exchange(o.capacity, 0);
      return *this;
    }
  };
  static thread_local Nodes spare;

  std::string_view text;
  std::string arena; ///< strings that held escapes, decoded
  Nodes nodes;       ///< the root first; capacity beyond the last is spare
  int64_t valueCount_ = 0;
};

/// A view of one value of a Document.
class Value {
public:
  ValueKind kind() const { return node().kind; }
  bool isNull() const { return kind() == ValueKind::Null; }
  bool isBool() const {
    return kind() == ValueKind::False || kind() == ValueKind::True;
  }
  bool isNumber() const {
    return kind() == ValueKind::Unsigned || kind() == ValueKind::Signed ||
           kind() == ValueKind::Float;
  }
  bool isString() const { return kind() == ValueKind::String; }
  bool isArray() const { return kind() == ValueKind::Array; }
  bool isObject() const { return kind() == ValueKind::Object; }

  /// Preconditions: the matching is...() holds.
  bool boolean() const { return kind() == ValueKind::True; }
  std::string_view string() const;
  uint64_t unsignedValue() const { return node().payload; }
  int64_t signedValue() const { return static_cast<int64_t>(node().payload); }
  double floatValue() const;
  /// Any number as a double (as nlohmann's get<double>()).
  double numberAsDouble() const;

  /// Elements of an array or members of an object; 0 for anything else.
  size_t size() const { return isArray() || isObject() ? node().size : 0; }

  /// Range-for over an array's elements (none for a non-array).
  class Elements;
  Elements elements() const;
  /// Range-for over an object's members (none for a non-object).
  class Members;
  Members members() const;

  /// The member `key` of an object, if it is one and has it.
  std::optional<Value> find(std::string_view key) const;

  /// The same value as an nlohmann value; for messages (describe, dump).
  Json toJson() const;

private:
  friend class Document;
  friend class Fields;
  friend Result<Fields> checkObject(Value value, const Path &path,
                                    const SectionRule &section);
  Value(const Document *doc, uint32_t index) : doc(doc), index(index) {}
  const Document::Node &node() const { return doc->nodes.data[index]; }
  /// The node after the value at node `i`.
  uint32_t next(uint32_t i) const {
    const Document::Node &n = doc->nodes.data[i];
    return n.kind == ValueKind::Array || n.kind == ValueKind::Object
               ? static_cast<uint32_t>(n.payload)
               : i + 1;
  }

  const Document *doc;
  uint32_t index;
};

inline Value Document::root() const { return Value(this, 0); }

/// One member of an object.
struct Member {
  std::string_view key;
  Value value;
};

class Value::Elements {
public:
  class iterator {
  public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Value;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = Value;

    Value operator*() const { return Value(doc, i); }
    iterator &operator++() {
      i = Value(doc, i).next(i);
      return *this;
    }
    bool operator==(const iterator &o) const { return i == o.i; }

  private:
    friend class Elements;
    iterator(const Document *doc, uint32_t i) : doc(doc), i(i) {}
    const Document *doc;
    uint32_t i;
  };
  iterator begin() const { return iterator(doc, first); }
  iterator end() const { return iterator(doc, last); }

private:
  friend class Value;
  Elements(const Document *doc, uint32_t first, uint32_t last)
      : doc(doc), first(first), last(last) {}
  const Document *doc;
  uint32_t first, last;
};

class Value::Members {
public:
  class iterator {
  public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Member;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = Member;

    Member operator*() const {
      return Member{Value(doc, i).string(), Value(doc, i + 1)};
    }
    iterator &operator++() {
      i = Value(doc, i).next(i + 1);
      return *this;
    }
    bool operator==(const iterator &o) const { return i == o.i; }

  private:
    friend class Members;
    iterator(const Document *doc, uint32_t i) : doc(doc), i(i) {}
    const Document *doc;
    uint32_t i;
  };
  iterator begin() const { return iterator(doc, first); }
  iterator end() const { return iterator(doc, last); }

private:
  friend class Value;
  Members(const Document *doc, uint32_t first, uint32_t last)
      : doc(doc), first(first), last(last) {}
  const Document *doc;
  uint32_t first, last;
};

inline Value::Elements Value::elements() const {
  if (!isArray())
    return Elements(doc, 0, 0);
  return Elements(doc, index + 1, static_cast<uint32_t>(node().payload));
}

inline Value::Members Value::members() const {
  if (!isObject())
    return Members(doc, 0, 0);
  return Members(doc, index + 1, static_cast<uint32_t>(node().payload));
}

//===----------------------------------------------------------------------===//
// Messages and typed access (Json.h's rules and messages, on Values)
//===----------------------------------------------------------------------===//

Error errorAt(const Path &path, const std::string &message);
/// Json.h's childPointer on a Path, for pointers built inside a message or
/// as an errorAt argument (so, only for an error).
inline std::string childPointer(const Path &path, std::string_view key) {
  return childPointer(path.str(), key);
}
inline std::string childPointer(const Path &path, size_t index) {
  return childPointer(path.str(), index);
}
/// "<pointer>: expected <expected>, got <describe(value)>".
Error typeError(const Path &path, Value value, std::string_view expected);
/// "string \"2\"", "number 2.5", "an array", ... as describe(const Json &).
std::string describe(Value value);
/// The value as JSON text (invalid UTF-8 cannot occur: the tokenizer
/// refuses it), for messages quoting a bad value.
std::string dump(Value value);

Result<int64_t> readInt(Value value, const Path &path, int64_t min = INT64_MIN,
                        int64_t max = INT64_MAX);
Result<double> readNumber(Value value, const Path &path);
Result<bool> readBool(Value value, const Path &path);
Result<std::string> readString(Value value, const Path &path);
Result<std::vector<std::string>> readStringArray(Value value, const Path &path);
Result<std::vector<int64_t>> readIntArray(Value value, const Path &path,
                                          int64_t min = INT64_MIN,
                                          int64_t max = INT64_MAX);
/// The same, into `out`, reusing its capacity (and its strings'): readers
/// that fill one structure after another allocate nothing once warm. On an
/// error `out` holds what was read so far.
Result<void> readStringInto(Value value, const Path &path, std::string &out);
Result<void> readStringArrayInto(Value value, const Path &path,
                                 std::vector<std::string> &out);
Result<void> readIntArrayInto(Value value, const Path &path,
                              std::vector<int64_t> &out,
                              int64_t min = INT64_MIN, int64_t max = INT64_MAX);
/// A string that must be one of `values`; returns its index.
Result<int> readEnum(Value value, const Path &path, std::string_view what,
                     std::span<const std::string_view> values);

/// Whether two texts are equal. Keys and enum names are compared millions
/// of times per plan directory; a call to memcmp, or a byte loop, cost more
/// than this: at most two (overlapping) loads of each for up to 16 bytes.
[[gnu::always_inline]] inline bool sameText(std::string_view a,
                                            std::string_view b) {
  size_t n = a.size();
  if (n != b.size())
    return false;
  const char *x = a.data(), *y = b.data();
  auto load64 = [](const char *at) {
    uint64_t w;
    std::memcpy(&w, at, 8);
    return w;
  };
  auto load32 = [](const char *at) {
    uint32_t w;
    std::memcpy(&w, at, 4);
    return w;
  };
  if (n >= 8) {
    for (size_t i = 0; i + 8 < n; i += 8)
      if (load64(x + i) != load64(y + i))
        return false;
    return load64(x + n - 8) == load64(y + n - 8);
  }
  if (n >= 4)
    return load32(x) == load32(y) && load32(x + n - 4) == load32(y + n - 4);
  for (size_t i = 0; i < n; ++i)
    if (x[i] != y[i])
      return false;
  return true;
}

/// The members of an object that passed checkObject, by key name. Lookups
/// start after the previous hit, so reading keys in table order (as the
/// readers do) costs one comparison each, and are always inlined, so that
/// it is a comparison with the literal at the call site (4% of reading a
/// plan directory).
class Fields {
public:
  /// The member for `key` (a name of the section), if present and not a
  /// null that the section allows in place of a value.
  [[gnu::always_inline]] std::optional<Value> get(std::string_view key) const {
    size_t n = section->keys.size();
    for (size_t k = 0; k < n; ++k) {
      size_t i = cursor + k < n ? cursor + k : cursor + k - n;
      const KeyRule &rule = section->keys[i];
      if (!sameText(rule.name, key))
        continue;
      cursor = i + 1 < n ? i + 1 : 0;
      if (!slots[i])
        return std::nullopt;
      Value v(doc, slots[i]);
      if (rule.nullable && v.isNull())
        return std::nullopt;
      return v;
    }
    return std::nullopt;
  }
  /// A required member: present after checkObject. A name that is not the
  /// section's reads as null, so that the typed read reports it.
  [[gnu::always_inline]] Value at(std::string_view key) const {
    std::optional<Value> v = get(key);
    return v ? *v : missing();
  }

  /// The most keys a section checked this way may have (the plan's
  /// instructions have 17).
  static constexpr size_t kMaxKeys = 20;

private:
  friend Result<Fields> checkObject(Value value, const Path &path,
                                    const SectionRule &section);
  static Value missing();

  const Document *doc = nullptr;
  const SectionRule *section = nullptr;
  /// Node index of each key's value (0: absent; the root is never a
  /// member). Small, as it is cleared for every object read.
  std::array<uint32_t, kMaxKeys> slots{};
  mutable size_t cursor = 0;
};

/// Json.h's checkObject on a Value: no unknown keys (the first in document
/// order is reported, with the closest known one), every required key
/// present (in table order), every present key of its declared type, arrays
/// element by element, closed-set strings among their values.
Result<Fields> checkObject(Value value, const Path &path,
                           const SectionRule &section);

} // namespace meshplan::json

#endif // MESHPLAN_SUPPORT_JSONREADER_H
