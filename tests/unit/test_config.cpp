#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "config.h"

using namespace poolshim;

namespace {
std::size_t index_of(const char* name) {
  const auto& t = option_table();
  for (std::size_t i = 0; i < t.size(); ++i) {
    if (std::string(t[i].name) == name) return i;
  }
  FAIL("no option " << name);
  return 0;
}
}  // namespace

TEST_CASE("config: defaults come from the table") {
  const ParsedConfig p = parse_config({});
  CHECK(p.warnings.empty());
  CHECK(p.config.enable);
  CHECK(p.config.log == "poolshim-%p.jsonl");
  CHECK(p.config.sample_ms == 1000);
  CHECK(p.config.release_threshold.bytes == 0);
  CHECK(p.config.idle_trim_ms == 5000);
  CHECK(p.config.free == "sync");
  CHECK(p.config.oom_retry);
  CHECK_FALSE(p.config.verbose);
  CHECK_FALSE(p.config.strict);
  for (Source s : p.config.sources) CHECK(s == Source::default_value);
}

TEST_CASE("config: variables set options and record where they came from") {
  const ParsedConfig p = parse_config({"POOLSHIM_SAMPLE_MS=250", "POOLSHIM_RELEASE_THRESHOLD=1G",
                                       "POOLSHIM_OOM_RETRY=off", "PATH=/bin"});
  CHECK(p.warnings.empty());
  CHECK(p.config.sample_ms == 250);
  CHECK(p.config.release_threshold.bytes == 1ULL << 30);
  CHECK_FALSE(p.config.oom_retry);
  CHECK(p.config.sources[index_of("sample_ms")] == Source::environment);
  CHECK(p.config.texts[index_of("release_threshold")] == "1G");
}

TEST_CASE("config: POOLSHIM_CONF sets options; a variable wins over it") {
  const ParsedConfig p = parse_config(
      {"POOLSHIM_CONF=sample_ms=100, verbose=yes,release_threshold=10%", "POOLSHIM_SAMPLE_MS=300"});
  CHECK(p.warnings.empty());
  CHECK(p.config.sample_ms == 300);
  CHECK(p.config.sources[index_of("sample_ms")] == Source::environment);
  CHECK(p.config.verbose);
  CHECK(p.config.sources[index_of("verbose")] == Source::conf_string);
  CHECK(p.config.release_threshold.is_percent);
  CHECK(p.config.release_threshold.percent == 10.0);
}

TEST_CASE(
    "config: a bad value keeps the default with a warning naming variable, value and default") {
  const ParsedConfig p = parse_config({"POOLSHIM_SAMPLE_MS=soon"});
  REQUIRE(p.warnings.size() == 1);
  CHECK(p.warnings[0] ==
        "POOLSHIM_SAMPLE_MS=\"soon\" is not a duration in milliseconds (e.g. 500, 500ms, 2s); "
        "using 1000 (the default)");
  CHECK(p.config.sample_ms == 1000);
  CHECK(p.config.sources[index_of("sample_ms")] == Source::default_value);
}

TEST_CASE("config: a bad value in POOLSHIM_CONF names the key") {
  const ParsedConfig p = parse_config({"POOLSHIM_CONF=free=lazy"});
  REQUIRE(p.warnings.size() == 1);
  CHECK(p.warnings[0] ==
        "POOLSHIM_CONF free=\"lazy\" is not one of sync|ordered; using sync (the default)");
}

TEST_CASE("config: unknown names are reported with the nearest option") {
  const ParsedConfig p =
      parse_config({"POOLSHIM_RELEASE_TRESHOLD=1G", "POOLSHIM_CONF=sampel_ms=5,zzzz=1,novalue"});
  REQUIRE(p.warnings.size() == 4);
  CHECK(p.warnings[0] ==
        "POOLSHIM_CONF: \"sampel_ms\" is not a poolshim option (did you mean sample_ms?); ignored");
  CHECK(p.warnings[1] == "POOLSHIM_CONF: \"zzzz\" is not a poolshim option; ignored");
  CHECK(p.warnings[2] == "POOLSHIM_CONF: \"novalue\" is not key=value; ignored");
  CHECK(p.warnings[3] ==
        "POOLSHIM_RELEASE_TRESHOLD is not a poolshim option (did you mean "
        "POOLSHIM_RELEASE_THRESHOLD?); ignored");
}

TEST_CASE("config: log path escapes are checked") {
  CHECK(parse_config({"POOLSHIM_LOG=/tmp/x-%h-%r-%t-%p-%%.jsonl"}).warnings.empty());
  const ParsedConfig bad = parse_config({"POOLSHIM_LOG=/tmp/x-%q.jsonl"});
  REQUIRE(bad.warnings.size() == 1);
  CHECK(bad.config.log == "poolshim-%p.jsonl");
  CHECK(parse_config({"POOLSHIM_LOG="}).config.log.empty());
}

TEST_CASE("config: strict and enable are ordinary options") {
  const ParsedConfig p = parse_config({"POOLSHIM_STRICT=1", "POOLSHIM_ENABLE=0"});
  CHECK(p.config.strict);
  CHECK_FALSE(p.config.enable);
}

TEST_CASE("config: describe lists every option with its source") {
  const ParsedConfig p = parse_config({"POOLSHIM_VERBOSE=1"});
  const auto lines = describe_config(p.config);
  REQUIRE(lines.size() == option_table().size());
  CHECK(lines[index_of("verbose")] == "verbose = 1 (environment)");
  CHECK(lines[index_of("log")] == "log = poolshim-%p.jsonl (default)");
}

TEST_CASE("config: variable names are POOLSHIM_ and the upper-case name") {
  CHECK(env_name("idle_trim_ms") == "POOLSHIM_IDLE_TRIM_MS");
}
