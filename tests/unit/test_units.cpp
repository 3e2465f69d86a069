#include <catch2/catch.hpp>

#include "units.h"

using poolshim::format_bytes;
using poolshim::parse_bool;
using poolshim::parse_milliseconds;
using poolshim::parse_size;

TEST_CASE("size: plain bytes and powers-of-1024 suffixes") {
  CHECK(parse_size("1048576", false)->bytes == 1048576);
  CHECK(parse_size("512K", false)->bytes == 512ULL * 1024);
  CHECK(parse_size("64mb", false)->bytes == 64ULL << 20);
  CHECK(parse_size("2GiB", false)->bytes == 2ULL << 30);
  CHECK(parse_size("1.5G", false)->bytes == 3ULL << 29);
  CHECK(parse_size(" 1T ", false)->bytes == 1ULL << 40);
  CHECK(parse_size("0", false)->bytes == 0);
}

TEST_CASE("size: percent only where allowed, at most 100") {
  auto v = parse_size("25%", true);
  REQUIRE(v);
  CHECK(v->is_percent);
  CHECK(v->resolve(1000) == 250);
  CHECK_FALSE(parse_size("25%", false));
  CHECK_FALSE(parse_size("101%", true));
}

TEST_CASE("size: rejects junk, negatives, unknown units and overflow") {
  CHECK_FALSE(parse_size("", false));
  CHECK_FALSE(parse_size("abc", false));
  CHECK_FALSE(parse_size("-1", false));
  CHECK_FALSE(parse_size("12Q", false));
  CHECK_FALSE(parse_size("1.2.3", false));
  CHECK_FALSE(parse_size("99999999999T", false));
}

TEST_CASE("bool: 1/0 true/false on/off yes/no in any case") {
  for (const char* t : {"1", "true", "ON", "Yes"}) CHECK(parse_bool(t) == true);
  for (const char* f : {"0", "FALSE", "off", "no"}) CHECK(parse_bool(f) == false);
  CHECK_FALSE(parse_bool("2"));
  CHECK_FALSE(parse_bool(""));
}

TEST_CASE("milliseconds: bare, ms and s suffixes") {
  CHECK(parse_milliseconds("250") == 250u);
  CHECK(parse_milliseconds("250ms") == 250u);
  CHECK(parse_milliseconds("2s") == 2000u);
  CHECK_FALSE(parse_milliseconds("-5"));
  CHECK_FALSE(parse_milliseconds("5 min"));
  CHECK_FALSE(parse_milliseconds("9999999999999"));
}

TEST_CASE("format_bytes: readable units") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(1536) == "1.5 KiB");
  CHECK(format_bytes(3ULL << 30) == "3.0 GiB");
}
