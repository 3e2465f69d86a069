#include <catch2/catch.hpp>

#include <cmath>

#include "json.h"

using poolshim::json_string;
using poolshim::JsonObject;

TEST_CASE("json: strings are escaped, control characters as backslash-u escapes") {
  CHECK(json_string("a\"b\\c\nd\te\x01") == "\"a\\\"b\\\\c\\nd\\te\\u0001\"");
}

TEST_CASE("json: valid UTF-8 passes, invalid bytes become U+FFFD") {
  CHECK(json_string("caf\xc3\xa9") == "\"caf\xc3\xa9\"");
  CHECK(json_string("bad\xe9!") == "\"bad\\ufffd!\"");
}

// Issue 12: these passed through and made logs that strict readers (Python's json) refuse.
TEST_CASE("json: surrogates, overlong forms and code points above U+10FFFF become U+FFFD") {
  CHECK(json_string("\xed\xa0\x80") == "\"\\ufffd\\ufffd\\ufffd\"");  // U+D800
  CHECK(json_string("\xed\xbf\xbf") == "\"\\ufffd\\ufffd\\ufffd\"");  // U+DFFF
  CHECK(json_string("\xe0\x80\xaf") == "\"\\ufffd\\ufffd\\ufffd\"");  // overlong '/'
  CHECK(json_string("\xf0\x80\x80\xaf") == "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");
  CHECK(json_string("\xf4\x90\x80\x80") == "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");  // U+110000
  CHECK(json_string("\xc0\xaf") == "\"\\ufffd\\ufffd\"");
  // The edges that are UTF-8 stay as they are.
  CHECK(json_string("\xed\x9f\xbf") == "\"\xed\x9f\xbf\"");          // U+D7FF
  CHECK(json_string("\xee\x80\x80") == "\"\xee\x80\x80\"");          // U+E000
  CHECK(json_string("\xe0\xa0\x80") == "\"\xe0\xa0\x80\"");          // U+0800
  CHECK(json_string("\xf0\x90\x80\x80") == "\"\xf0\x90\x80\x80\"");  // U+10000
  CHECK(json_string("\xf4\x8f\xbf\xbf") == "\"\xf4\x8f\xbf\xbf\"");  // U+10FFFF
  CHECK(json_string("x\xe2\x82") == "\"x\\ufffd\\ufffd\"");          // cut short
}

TEST_CASE("json: objects keep key order, non-finite numbers are null") {
  JsonObject o;
  o.add("a", std::uint64_t{18446744073709551615ULL}).add("b", -3).add("c", 0.25).add("d", true);
  o.add("e", std::nan("")).add_raw("f", "[1,2]").add_null("g");
  CHECK(o.str() ==
        "{\"a\":18446744073709551615,\"b\":-3,\"c\":0.25,\"d\":true,\"e\":null,\"f\":[1,2],\"g\":"
        "null}");
}
