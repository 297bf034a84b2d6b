//===- JsonReaderTest.cpp - The tape reader against the DOM reader --------===//
//
// The tape reader (JsonReader.h) must accept exactly what the DOM reader
// (Json.h's parseJson) accepts, read the same values, and fail with the same
// message: the tests below check literal messages for the cases users meet,
// and compare the two readers on thousands of mutated documents.
//
//===----------------------------------------------------------------------===//

#include "meshplan/Support/JsonReader.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include <sys/stat.h>
#include <unistd.h>

using namespace meshplan;
using namespace meshplan::json;

namespace {

/// "ok <dump>" or the error message.
std::string tape(std::string_view text, int maxDepth = kMaxJsonDepth) {
  Result<Document> d = Document::parse(text, maxDepth);
  return d ? "ok " + dump(d->root()) : d.error().message;
}
std::string dom(std::string_view text, int maxDepth = kMaxJsonDepth) {
  Result<Json> d = parseJson(text, maxDepth);
  return d ? "ok " + d->dump(-1, ' ', false, Json::error_handler_t::replace)
           : d.error().message;
}

TEST(JsonReader, MalformedJsonNamesLineAndColumn) {
  struct Case {
    std::string text, error;
  };
  std::vector<Case> cases = {
      {"{\"a\": }", "line 1, column 7: syntax error while parsing value - "
                    "unexpected '}'; expected '[', '{', or a literal"},
      {"{\n  \"a\": 1,\n  \"b\" 2\n}",
       "line 3, column 7: syntax error while parsing object separator - "
       "unexpected number literal; expected ':'"},
      {"{\"a\": [1, 2", "line 1, column 12: syntax error while parsing array "
                        "- unexpected end of input; expected ']'"},
      {"", "line 1, column 1: syntax error while parsing value - unexpected "
           "end of input; expected '[', '{', or a literal"},
      {"[1.]", "line 1, column 4: syntax error while parsing value - invalid "
               "number; expected digit after '.'; last read: '1.]'"},
      {"[tru]", "line 1, column 5: syntax error while parsing value - "
                "invalid literal; last read: '[tru]'"},
      {"{} x", "line 1, column 4: syntax error while parsing value - invalid "
               "literal; last read: '{} x'; expected end of input"},
      {"[\"a\\qb\"]", "line 1, column 5: syntax error while parsing value - "
                      "invalid string: forbidden character after backslash; "
                      "last read: '\"a\\q'"},
      {"[\"\xff\"]", "line 1, column 3: syntax error while parsing value - "
                     "invalid string: ill-formed UTF-8 byte; last read: "
                     "'\"\\xFF'"},
      {"[\"\\udc00\"]",
       "line 1, column 8: syntax error while parsing value - invalid string: "
       "surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF; last read: "
       "'\"\\udc00'"},
      // nlohmann refuses a number that overflows a double.
      {"[0, 1e400]", "line 1, column 9: [json.exception.out_of_range.406] "
                     "number overflow parsing '1e400'"},
  };
  for (const Case &c : cases) {
    EXPECT_EQ(tape(c.text), c.error) << c.text;
    EXPECT_EQ(dom(c.text), c.error) << c.text;
  }
}

TEST(JsonReader, ReadsValuesAsTheDomReaderDoes) {
  for (std::string text :
       {"\xEF\xBB\xBF[1]", "  {\"a\" :\t[ true ,false,null ] }\r\n",
        "[0, -0, 1E5, 2.5e-3, 1e-400, -1e-400, 18446744073709551615, "
        "18446744073709551616, -9223372036854775808, -9223372036854775809]",
        "[\"\\u00e9\\ud83d\\ude00\\n\\\"\\/\", \"\xc3\xa9\xf0\x9f\x98\x80\"]",
        "{\"\": {\"a/b\": {\"c~d\": []}}}"}) {
    EXPECT_EQ(tape(text), dom(text)) << text;
    EXPECT_EQ(tape(text).substr(0, 3), "ok ") << text;
  }
  Result<Document> d =
      Document::parse("[18446744073709551615, -2, 2.0, \"x\\u0000y\"]");
  ASSERT_TRUE(d.ok());
  std::vector<Value> v(d->root().elements().begin(),
                       d->root().elements().end());
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0].kind(), ValueKind::Unsigned);
  EXPECT_EQ(v[0].unsignedValue(), UINT64_MAX);
  EXPECT_EQ(v[1].kind(), ValueKind::Signed);
  EXPECT_EQ(v[1].signedValue(), -2);
  EXPECT_EQ(v[2].kind(), ValueKind::Float);
  EXPECT_EQ(v[3].string(), std::string_view("x\0y", 3));
}

TEST(JsonReader, DuplicateKeys) {
  EXPECT_EQ(tape("{\"a\":1,\"a\":2}"), "/a: duplicate key");
  EXPECT_EQ(tape("{\"x\":{\"b\":1,\"c\":2,\"b\":[3]}}"), "/x/b: duplicate key");
  EXPECT_EQ(tape("[{\"k\":1},{\"k\":1,\"k\":2}]"), "/1/k: duplicate key");
  // Equal once decoded.
  EXPECT_EQ(tape("{\"k\":1,\"\\u006b\":2}"), "/k: duplicate key");
  // Same length, head and tail; different in the middle: not duplicates.
  EXPECT_EQ(
      tape("{\"abcdefgh1ijklmnop\":1,\"abcdefgh2ijklmnop\":2}").substr(0, 3),
      "ok ");
  // A repeat in an object too big for the pairwise check.
  std::string big = "{";
  for (int i = 0; i < 40; ++i)
    big += "\"key" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  EXPECT_EQ(tape(big + "\"key39\":0}"), "/key39: duplicate key");
  EXPECT_EQ(tape(big + "\"key3\":0}"), "/key3: duplicate key");
  EXPECT_EQ(tape(big + "\"key40\":0}").substr(0, 3), "ok ");
  // The first problem in document order wins, as in nlohmann's SAX order:
  // a repeat before a syntax error, a syntax error before a repeat.
  EXPECT_EQ(tape("{\"a\":1,\"a\":2,}"), "/a: duplicate key");
  EXPECT_EQ(tape("{\"a\":1,\"a\":tru}"), dom("{\"a\":1,\"a\":tru}"));
  EXPECT_NE(tape("{\"a\":1,\"a\":tru}"), "/a: duplicate key");
}

TEST(JsonReader, DepthLimit) {
  EXPECT_EQ(tape(std::string(4, '[') + std::string(4, ']'), 4), "ok [[[[]]]]");
  EXPECT_EQ(tape(std::string(5, '[') + std::string(5, ']'), 4),
            "/0/0/0/0: nested deeper than 4 levels");
  EXPECT_EQ(tape("{\"a\":{\"b\":[{\"c\":{}}]}}", 4),
            "/a/b/0/c: nested deeper than 4 levels");
  // Refused before the rest is looked at, however deep the input goes.
  std::string deep(100000, '[');
  EXPECT_EQ(tape(deep, 2), "/0/0: nested deeper than 2 levels");
}

TEST(JsonReader, ValueLimit) {
  auto parse = [](std::string_view text, int64_t maxValues) {
    Result<Document> d = Document::parse(text, kMaxJsonDepth, maxValues);
    return d ? "ok " + dump(d->root()) : d.error().message;
  };
  // Containers count as values, keys do not.
  EXPECT_EQ(parse("[1,2,3]", 4), "ok [1,2,3]");
  EXPECT_EQ(parse("[1,2,3,4]", 4),
            "/3: the document has more than 4 values (docs/limits.md)");
  EXPECT_EQ(parse(R"({"a":{"b":1,"c":2}})", 4), R"(ok {"a":{"b":1,"c":2}})");
  EXPECT_EQ(parse(R"({"a":{"b":1,"c":[]}})", 3),
            "/a/c: the document has more than 3 values (docs/limits.md)");
  // Refused where the limit is passed, before the rest is tokenized (a
  // syntax error further on is never reached).
  std::string many = "[" + std::string(200000, '0') + "]";
  for (size_t i = 2; i < many.size() - 1; i += 2)
    many[i] = ',';
  EXPECT_EQ(parse(many + "garbage", 1000),
            "/999: the document has more than 1000 values (docs/limits.md)");
}

TEST(JsonReader, ValueCountIsTheLimitsUnit) {
  // What a reader of a document in pieces adds up against one limit: a
  // document of exactly `maxValues` values parses, and counts that many.
  for (std::string_view text : {"[1,2,3]", R"({"a":{"b":1,"c":[]}})", "\"x\"",
                                "[]", R"({"k":[[],{}]})"}) {
    Result<Document> d = Document::parse(text);
    ASSERT_TRUE(d.ok()) << text;
    int64_t n = d->valueCount();
    EXPECT_TRUE(Document::parse(text, kMaxJsonDepth, n).ok()) << text;
    EXPECT_FALSE(Document::parse(text, kMaxJsonDepth, n - 1).ok()) << text;
  }
  EXPECT_EQ(Document::parse("[1,2,3]")->valueCount(), 4);
  EXPECT_EQ(Document::parse(R"({"a":{"b":1,"c":[]}})")->valueCount(), 4);
}

TEST(JsonReader, StringLengthLimit) {
  const size_t max = static_cast<size_t>(kMaxJsonStringBytes);
  auto quoted = [](std::string body) { return "\"" + body + "\""; };
  std::string fits(max, 'x');
  EXPECT_EQ(tape(quoted(fits)).size(), 3 + max + 2);
  std::string limitText = std::string("bytes or more; strings are at most ") +
                          kMaxJsonStringBytesText + " (docs/limits.md)";
  EXPECT_EQ(tape("[1," + quoted(fits + "x") + "]"),
            "/1: a string of " + std::to_string(max + 1) + " " + limitText);
  // With escapes, decoded: refused as soon as the decoded text passes it.
  std::string escaped;
  for (size_t i = 0; i <= max; ++i)
    escaped += "\\n";
  EXPECT_EQ(tape(R"({"a":{"b":)" + quoted(escaped) + "}}"),
            "/a/b: a string of " + std::to_string(max + 1) + " " + limitText);
  // A key: named by the object that holds it.
  EXPECT_EQ(tape(R"({"a":{"b":1,)" + quoted(fits + "\u00e9") + ":2}}"),
            "/a: a key of " + std::to_string(max + 2) + " " + limitText);
  EXPECT_EQ(tape("{" + quoted(fits + "y") + ":1}"),
            "/: a key of " + std::to_string(max + 1) + " " + limitText);
}

TEST(JsonReader, EveryTruncationFailsAsTheDomReaderDoes) {
  std::string text = R"({"id":"w","kind":"param_shard","shape":[8,4],
    "scale":{"amax":"a\u00e9","index":1,"power_of_2":true},"x":-1.5e-3,
    "list":[null,false,"\ud83d\ude00"]})";
  ASSERT_EQ(tape(text).substr(0, 3), "ok ");
  for (size_t n = 0; n < text.size(); ++n) {
    std::string prefix = text.substr(0, n);
    std::string got = tape(prefix);
    EXPECT_NE(got.substr(0, 3), "ok ") << prefix;
    EXPECT_EQ(got, dom(prefix)) << prefix;
  }
}

/// Both readers, on documents mutated at random positions: the same
/// verdict, the same values, the same message.
TEST(JsonReader, AgreesWithTheDomReaderOnMutatedDocuments) {
  std::vector<std::string> seeds = {
      R"({"format":"meshplan.plan","version":2,"mesh":{"axes":[{"name":"dp","size":2}]},
 "buffers":[{"id":"w","global_shape":[8,4],"offset":[0,0],"layout":"[{dp}, {}]"},
  {"id":"g.\u00e9","scale":{"amax":"amax","index":1,"power_of_2":true}}],
 "optimizer":{"lr":0.001,"eps":1e-08,"seed":-7,"big":18446744073709551616}})",
      R"([[[["a"]],{"k":[1,2,{"k":null}]}],"\n\t\\\"",-0.0,1E+2])",
      R"({"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,
 "k":11,"l":12,"m":13,"n":14,"o":15,"p":16,"q":17,"r":18,"s":19})",
  };
  const std::string alphabet = "{}[]:,\"\\ \n0123456789.eE+-tfnrulasx/b";
  const std::string high = "\xc3\xa9\xff\xed\xa0\x80\xf0\x9f\x98";
  std::mt19937 rng(12345);
  int checked = 0, malformed = 0;
  for (const std::string &seed : seeds) {
    for (int round = 0; round < 3000; ++round) {
      std::string text = seed;
      int edits = 1 + static_cast<int>(rng() % 3);
      for (int e = 0; e < edits && !text.empty(); ++e) {
        size_t at = rng() % text.size();
        char c = rng() % 8 ? alphabet[rng() % alphabet.size()]
                           : high[rng() % high.size()];
        switch (rng() % 5) {
        case 0:
          text.erase(at, 1);
          break;
        case 1:
          text.insert(at, 1, c);
          break;
        case 2:
          text[at] = c;
          break;
        case 3: { // repeat a span: makes duplicate keys
          size_t n = std::min<size_t>(rng() % 24, text.size() - at);
          text.insert(at, text.substr(at, n));
          break;
        }
        default:
          text.resize(at);
        }
      }
      for (int depth : {kMaxJsonDepth, 3}) {
        std::string a = tape(text, depth), b = dom(text, depth);
        ASSERT_EQ(a, b) << "text: " << text << "\ndepth " << depth;
        ++checked;
        malformed += a.substr(0, 3) != "ok ";
      }
    }
  }
  // Both kinds were exercised.
  EXPECT_GT(malformed, checked / 4);
  EXPECT_LT(malformed, checked);
}

//===----------------------------------------------------------------------===//
// Paths
//===----------------------------------------------------------------------===//

TEST(JsonReader, PathsAreBuiltOnDemand) {
  Path root;
  EXPECT_EQ(root.str(), "");
  Path buffers = root.child("buffers");
  Path b3 = buffers.child(3);
  EXPECT_EQ(b3.child("a/b~c").str(), "/buffers/3/a~1b~0c");
  Path prefix = Path::fromString("/estimates");
  EXPECT_EQ(prefix.child("x").str(), "/estimates/x");
  EXPECT_EQ(errorAt(root, "bad").message, "/: bad");
  EXPECT_EQ(errorAt(b3, "bad").message, "/buffers/3: bad");
}

//===----------------------------------------------------------------------===//
// Typed reads and closed objects: Json.h's messages, on both readers
//===----------------------------------------------------------------------===//

/// The message of `read` on the first element of `text` (an array) through
/// both readers; they must agree.
template <typename TapeRead, typename DomRead>
std::string both(const std::string &text, TapeRead tapeRead, DomRead domRead) {
  Result<Document> d = Document::parse(text);
  Result<Json> j = parseJson(text);
  EXPECT_TRUE(d.ok() && j.ok()) << text;
  if (!d.ok() || !j.ok())
    return "<parse error>";
  Value v = *d->root().elements().begin();
  std::string a = tapeRead(v), b = domRead((*j)[0]);
  EXPECT_EQ(a, b) << text;
  return a;
}

template <typename T> std::string show(const Result<T> &r) {
  if (!r)
    return r.error().message;
  if constexpr (std::is_same_v<T, void>)
    return "<ok>";
  else if constexpr (std::is_same_v<T, std::string>)
    return "<ok " + r.value() + ">";
  else if constexpr (std::is_same_v<T, std::vector<std::string>> ||
                     std::is_same_v<T, std::vector<int64_t>>)
    return "<ok " + std::to_string(r.value().size()) + ">";
  else
    return "<ok " + std::to_string(r.value()) + ">";
}

TEST(JsonReader, TypeMismatchesReadAsJsonH) {
  const Path p = Path::fromString("/v");
  auto readIntBoth = [&](const std::string &text, int64_t min, int64_t max) {
    return both(
        text, [&](Value v) { return show(readInt(v, p, min, max)); },
        [&](const Json &v) { return show(json::readInt(v, "/v", min, max)); });
  };
  EXPECT_EQ(readIntBoth("[7]", 0, 10), "<ok 7>");
  EXPECT_EQ(readIntBoth("[2.0]", 0, 10), "<ok 2>");
  EXPECT_EQ(readIntBoth("[-3]", 0, INT64_MAX),
            "/v: expected an integer >= 0, got -3");
  EXPECT_EQ(readIntBoth("[11]", INT64_MIN, 10),
            "/v: expected an integer <= 10, got 11");
  EXPECT_EQ(readIntBoth("[11]", 0, 10),
            "/v: expected an integer in [0, 10], got 11");
  EXPECT_EQ(readIntBoth("[2.5]", 0, 10),
            "/v: expected an integer in [0, 10], got number 2.5");
  EXPECT_EQ(readIntBoth("[\"2\"]", INT64_MIN, INT64_MAX),
            "/v: expected an integer, got string \"2\"");
  EXPECT_EQ(readIntBoth("[true]", INT64_MIN, INT64_MAX),
            "/v: expected an integer, got boolean true");
  EXPECT_EQ(readIntBoth("[null]", INT64_MIN, INT64_MAX),
            "/v: expected an integer, got null");
  EXPECT_EQ(readIntBoth("[[1]]", INT64_MIN, INT64_MAX),
            "/v: expected an integer, got an array");
  EXPECT_EQ(readIntBoth("[{}]", INT64_MIN, INT64_MAX),
            "/v: expected an integer, got an object");
  EXPECT_EQ(readIntBoth("[9223372036854775808]", INT64_MIN, INT64_MAX),
            "/v: expected an integer, got 9223372036854775808");
  EXPECT_EQ(readIntBoth("[1e19]", INT64_MIN, INT64_MAX),
            "/v: expected an integer, got 1e+19");

  auto other = [&](const std::string &text, auto tapeRead, auto domRead) {
    return both(
        text, [&](Value v) { return show(tapeRead(v)); },
        [&](const Json &v) { return show(domRead(v)); });
  };
  auto number = [&](const std::string &t) {
    return other(
        t, [&](Value v) { return readNumber(v, p); },
        [&](const Json &v) { return json::readNumber(v, "/v"); });
  };
  EXPECT_EQ(number("[\"1\"]"), "/v: expected a number, got string \"1\"");
  EXPECT_EQ(number("[-2]"), "<ok -2.000000>");
  auto boolean = [&](const std::string &t) {
    return other(
        t, [&](Value v) { return readBool(v, p); },
        [&](const Json &v) { return json::readBool(v, "/v"); });
  };
  EXPECT_EQ(boolean("[1]"), "/v: expected a boolean, got integer 1");
  EXPECT_EQ(boolean("[false]"), "<ok 0>");
  auto string = [&](const std::string &t) {
    return other(
        t, [&](Value v) { return readString(v, p); },
        [&](const Json &v) { return json::readString(v, "/v"); });
  };
  EXPECT_EQ(string("[1.5]"), "/v: expected a string, got number 1.5");
  EXPECT_EQ(string("[\"" + std::string(100, 'x') + "\"]").substr(0, 5),
            "<ok x");
  auto strings = [&](const std::string &t) {
    return other(
        t, [&](Value v) { return readStringArray(v, p); },
        [&](const Json &v) { return json::readStringArray(v, "/v"); });
  };
  EXPECT_EQ(strings("[\"a\"]"), "/v: expected an array of strings, got string "
                                "\"a\"");
  EXPECT_EQ(strings("[[\"a\", 2]]"), "/v/1: expected a string, got integer 2");
  EXPECT_EQ(strings("[[\"a\", \"b\"]]"), "<ok 2>");
  auto ints = [&](const std::string &t) {
    return other(
        t, [&](Value v) { return readIntArray(v, p, 0); },
        [&](const Json &v) { return json::readIntArray(v, "/v", 0); });
  };
  EXPECT_EQ(ints("[{}]"), "/v: expected an array of integers, got an object");
  EXPECT_EQ(ints("[[1, -1]]"), "/v/1: expected an integer >= 0, got -1");
  EXPECT_EQ(ints("[[1, 2, 3]]"), "<ok 3>");
  static constexpr std::array<std::string_view, 3> kinds = {
      "param_shard", "gathered", "gradient"};
  auto kind = [&](const std::string &t) {
    return other(
        t, [&](Value v) { return readEnum(v, p, "buffer kind", kinds); },
        [&](const Json &v) {
          return json::readEnum(v, "/v", "buffer kind", kinds);
        });
  };
  EXPECT_EQ(kind("[\"gradient\"]"), "<ok 2>");
  EXPECT_EQ(kind("[3]"), "/v: expected a string, got integer 3");
  EXPECT_EQ(kind("[\"gathred\"]"),
            "/v: unknown buffer kind \"gathred\"; expected one of "
            "param_shard, gathered, gradient (did you mean \"gathered\"?)");

  // The into variants reuse the caller's storage and read the same.
  Result<Document> d = Document::parse("[[\"long string number one\", \"b\"], "
                                       "[\"c\"], [4, 5]]");
  ASSERT_TRUE(d.ok());
  std::vector<Value> v(d->root().elements().begin(),
                       d->root().elements().end());
  std::vector<std::string> out = {"x", "y", "z"};
  ASSERT_TRUE(readStringArrayInto(v[0], p, out).ok());
  EXPECT_EQ(out, (std::vector<std::string>{"long string number one", "b"}));
  const char *kept = out[0].data();
  ASSERT_TRUE(readStringArrayInto(v[1], p, out).ok());
  EXPECT_EQ(out, std::vector<std::string>{"c"});
  EXPECT_EQ(out[0].data(), kept); // the same storage, reused
  std::vector<int64_t> numbers = {9, 9, 9};
  ASSERT_TRUE(readIntArrayInto(v[2], p, numbers).ok());
  EXPECT_EQ(numbers, (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(readIntArrayInto(v[0], p, numbers).error().message,
            "/v/0: expected an integer, got string \"long string number "
            "one\"");
  std::string s = "old";
  EXPECT_EQ(readStringInto(v[2], p, s).error().message,
            "/v: expected a string, got an array");
}

TEST(JsonReader, ClosedObjectsReadAsJsonH) {
  using T = JsonType;
  const SectionRule rule = {
      "thing",
      {
          {.name = "id", .type = T::String, .required = true},
          {.name = "size", .type = T::Integer, .required = true},
          {.name = "dims", .type = T::Array, .items = T::Integer},
          {.name = "pair", .type = T::Array, .items = T::String, .length = 2},
          {.name = "style",
           .type = T::String,
           .values = {"rowwise", "colwise"}},
          {.name = "view", .type = T::String, .nullable = true},
          {.name = "opts", .type = T::Object},
      }};
  auto check = [&](const std::string &text) {
    Result<Document> d = Document::parse(text);
    Result<Json> j = parseJson(text);
    EXPECT_TRUE(d.ok() && j.ok()) << text;
    if (!d.ok() || !j.ok())
      return std::string("<parse error>");
    Result<Fields> f = checkObject(d->root(), Path::fromString("/t"), rule);
    Result<void> g = json::checkObject(*j, "/t", rule);
    std::string a = f ? "<ok>" : f.error().message;
    std::string b = g ? "<ok>" : g.error().message;
    EXPECT_EQ(a, b) << text;
    return a;
  };
  EXPECT_EQ(check("[]"), "/t: expected an object, got an array");
  EXPECT_EQ(check(R"({"id":"a","size":1,"szie":2})"),
            "/t/szie: unknown key; expected one of id, size, dims, pair, "
            "style, view, opts (did you mean \"size\"?)");
  // Unknown keys first, in document order; then missing keys, in table
  // order; then types, in table order.
  EXPECT_EQ(check(R"({"size":"x","zz":1,"yy":2})"),
            "/t/zz: unknown key; expected one of id, size, dims, pair, "
            "style, view, opts");
  EXPECT_EQ(check(R"({"size":"x"})"),
            "/t/id: missing required key; expected a string");
  EXPECT_EQ(check(R"({"opts":1,"size":"x","id":"a"})"),
            "/t/size: expected an integer, got string \"x\"");
  EXPECT_EQ(check(R"({"id":"a","size":1,"dims":[1,"2"]})"),
            "/t/dims/1: expected an integer, got string \"2\"");
  EXPECT_EQ(check(R"({"id":"a","size":1,"dims":{}})"),
            "/t/dims: expected an array, got an object");
  EXPECT_EQ(check(R"({"id":"a","size":1,"pair":["a"]})"),
            "/t/pair: expected 2 elements, got 1");
  EXPECT_EQ(check(R"({"id":"a","size":1,"style":"rowise"})"),
            "/t/style: unknown style \"rowise\"; expected one of rowwise, "
            "colwise (did you mean \"rowwise\"?)");
  EXPECT_EQ(check(R"({"id":"a","size":1,"view":null})"), "<ok>");
  EXPECT_EQ(check(R"({"id":"a","size":1,"opts":null})"),
            "/t/opts: expected an object, got null");
  EXPECT_EQ(check(R"({"id":"a","size":1.0,"dims":[],"pair":["a","b"]})"),
            "<ok>");

  // Lookups, in any order, and a null allowed in place of a value.
  Result<Document> d = Document::parse(
      R"({"view":null,"size":3,"id":"x","dims":[1,2],"style":"colwise"})");
  ASSERT_TRUE(d.ok());
  Result<Fields> f = checkObject(d->root(), Path(), rule);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->at("id").string(), "x");
  EXPECT_EQ(f->at("size").unsignedValue(), 3u);
  EXPECT_EQ(f->get("dims")->size(), 2u);
  EXPECT_EQ(f->at("style").string(), "colwise");
  EXPECT_FALSE(f->get("view").has_value()); // null: absent
  EXPECT_FALSE(f->get("pair").has_value());
  EXPECT_EQ(f->at("id").string(), "x"); // again, after the cursor moved on
  // A name the section does not have reads as null, which no typed read
  // accepts.
  EXPECT_TRUE(f->at("nope").isNull());
  EXPECT_EQ(readString(f->at("nope"), Path().child("nope")).error().message,
            "/nope: expected a string, got null");
}

//===----------------------------------------------------------------------===//
// Files
//===----------------------------------------------------------------------===//

TEST(JsonReader, ReadsFilesIntoReusedBuffers) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() /
                              ("meshplan-json-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string big = (dir / "big").string(), small = (dir / "small").string();
  std::ofstream(big) << std::string(100000, 'b');
  std::ofstream(small) << "small";
  std::string buffer;
  ASSERT_TRUE(readFileInto(big, buffer).ok());
  EXPECT_EQ(buffer, std::string(100000, 'b'));
  const char *storage = buffer.data();
  ASSERT_TRUE(readFileInto(small, buffer).ok());
  EXPECT_EQ(buffer, "small");
  EXPECT_EQ(buffer.data(), storage); // no new allocation
  EXPECT_EQ(readFileInto(big, buffer, 1000).error().message,
            "cannot read \"" + big + "\": larger than 1000 bytes");
  EXPECT_EQ(buffer, "");
  EXPECT_EQ(readFileInto((dir / "none").string(), buffer).error().message,
            "cannot read \"" + (dir / "none").string() +
                "\": No such file or directory");
  EXPECT_EQ(readFile(dir.string()).error().message,
            "cannot read \"" + dir.string() + "\": not a regular file");
  // A FIFO is refused without waiting for a writer.
  std::string fifo = (dir / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(readFileInto(fifo, buffer).error().message,
            "cannot read \"" + fifo + "\": not a regular file");
  std::filesystem::remove_all(dir);
}

} // namespace
