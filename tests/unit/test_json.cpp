#include <catch2/catch.hpp>

#include <cmath>

#include "json.h"

using poolshim::json_string;
using poolshim::JsonObject;

TEST_CASE("json: strings are escaped, control characters as \\u") {
  CHECK(json_string("a\"b\\c\nd\te\x01") == "\"a\\\"b\\\\c\\nd\\te\\u0001\"");
}

TEST_CASE("json: valid UTF-8 passes, invalid bytes become U+FFFD") {
  CHECK(json_string("caf\xc3\xa9") == "\"caf\xc3\xa9\"");
  CHECK(json_string("bad\xe9!") == "\"bad\\ufffd!\"");
}

TEST_CASE("json: objects keep key order; non-finite numbers are null") {
  JsonObject o;
  o.add("a", std::uint64_t{18446744073709551615ULL}).add("b", -3).add("c", 0.25).add("d", true);
  o.add("e", std::nan("")).add_raw("f", "[1,2]").add_null("g");
  CHECK(o.str() ==
        "{\"a\":18446744073709551615,\"b\":-3,\"c\":0.25,\"d\":true,\"e\":null,\"f\":[1,2],\"g\":"
        "null}");
}
