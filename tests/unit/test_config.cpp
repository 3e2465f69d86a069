#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "config.h"
#include "json.h"

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
  CHECK(p.config.free == "auto");
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

TEST_CASE("config: POOLSHIM_CONF sets options, a variable wins over it") {
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

TEST_CASE("config: POOLSHIM_CONF takes key:value as PyTorch's and jemalloc's strings do") {
  const ParsedConfig colon = parse_config({"POOLSHIM_CONF=cache:32M,free:ordered"});
  CHECK(colon.warnings.empty());
  CHECK(colon.config.cache.bytes == 32ULL << 20);
  CHECK(colon.config.free == "ordered");
  CHECK(colon.config.sources[index_of("cache")] == Source::conf_string);
  CHECK(colon.config.texts[index_of("cache")] == "32M");
  // Mixed, with spaces around either separator.
  const ParsedConfig mixed = parse_config({"POOLSHIM_CONF=cache : 48M, free=sync ,sample_ms:250"});
  CHECK(mixed.warnings.empty());
  CHECK(mixed.config.cache.bytes == 48ULL << 20);
  CHECK(mixed.config.free == "sync");
  CHECK(mixed.config.sample_ms == 250);
}

TEST_CASE(
    "config: a POOLSHIM_CONF item splits at its first '=' or ':', so values may hold either") {
  const ParsedConfig a = parse_config({"POOLSHIM_CONF=log:/tmp/a=b.jsonl"});
  CHECK(a.warnings.empty());
  CHECK(a.config.log == "/tmp/a=b.jsonl");
  const ParsedConfig b =
      parse_config({"POOLSHIM_CONF=log=/mnt/x:y.jsonl,prom_file:/tmp/p:q=r.prom"});
  CHECK(b.warnings.empty());
  CHECK(b.config.log == "/mnt/x:y.jsonl");
  CHECK(b.config.prom_file == "/tmp/p:q=r.prom");
  // A bad value given with ':' is reported as with '=': the key, then the value.
  const ParsedConfig bad = parse_config({"POOLSHIM_CONF=free:lazy,cache"});
  REQUIRE(bad.warnings.size() == 2);
  CHECK(bad.warnings[0] == "POOLSHIM_CONF: \"cache\" is not key=value or key:value; ignored");
  CHECK(bad.warnings[1] ==
        "POOLSHIM_CONF free=\"lazy\" is not one of auto|sync|ordered; using auto (the default)");
  // An item with no key is not key=value either.
  const ParsedConfig empty_key = parse_config({"POOLSHIM_CONF=:5, =6"});
  REQUIRE(empty_key.warnings.size() == 2);
  CHECK(empty_key.warnings[0] == "POOLSHIM_CONF: \":5\" is not key=value or key:value; ignored");
  CHECK(empty_key.warnings[1] == "POOLSHIM_CONF: \"=6\" is not key=value or key:value; ignored");
}

TEST_CASE("config: summary is an ordinary option, off by default") {
  CHECK_FALSE(parse_config({}).config.summary);
  CHECK(parse_config({"POOLSHIM_SUMMARY=1"}).config.summary);
  CHECK(parse_config({"POOLSHIM_CONF=summary:on"}).config.summary);
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
        "POOLSHIM_CONF free=\"lazy\" is not one of auto|sync|ordered; using auto (the default)");
}

TEST_CASE("config: unknown names are reported with the nearest option") {
  const ParsedConfig p =
      parse_config({"POOLSHIM_RELEASE_TRESHOLD=1G", "POOLSHIM_CONF=sampel_ms=5,zzzz=1,novalue"});
  REQUIRE(p.warnings.size() == 4);
  CHECK(p.warnings[0] ==
        "POOLSHIM_CONF: \"sampel_ms\" is not a poolshim option (did you mean sample_ms?); ignored");
  CHECK(p.warnings[1] == "POOLSHIM_CONF: \"zzzz\" is not a poolshim option; ignored");
  CHECK(p.warnings[2] == "POOLSHIM_CONF: \"novalue\" is not key=value or key:value; ignored");
  CHECK(p.warnings[3] ==
        "POOLSHIM_RELEASE_TRESHOLD is not a poolshim option (did you mean "
        "POOLSHIM_RELEASE_THRESHOLD?); ignored");
}

TEST_CASE("config: log path escapes are checked") {
  CHECK(parse_config({"POOLSHIM_LOG=/tmp/x-%h-%r-%t-%p-%%.jsonl"}).warnings.empty());
  const ParsedConfig bad = parse_config({"POOLSHIM_LOG=/tmp/x-%q.jsonl"});
  REQUIRE(bad.warnings.size() == 1);
  CHECK(bad.config.log == "/tmp/poolshim-%p.jsonl");
  CHECK(parse_config({"POOLSHIM_LOG="}).config.log.empty());
}

// Issue 12, defect 10: the fallback of a bad log template was the working folder.
TEST_CASE("config: a bad log template falls back to the default name in the folder it named") {
  const ParsedConfig p = parse_config({"POOLSHIM_LOG=/scratch/runs/x-%q.jsonl"});
  REQUIRE(p.warnings.size() == 1);
  CHECK(p.warnings[0] ==
        "POOLSHIM_LOG=\"/scratch/runs/x-%q.jsonl\" is not a path whose % escapes are %p, %h, %r, "
        "%t or %%; using \"/scratch/runs/poolshim-%p.jsonl\" (the default name there)");
  CHECK(p.config.log == "/scratch/runs/poolshim-%p.jsonl");
  CHECK(p.config.texts[index_of("log")] == "/scratch/runs/poolshim-%p.jsonl");
  // A folder part that is itself a bad template, or none at all: the default.
  CHECK(parse_config({"POOLSHIM_LOG=/a-%q/x.jsonl"}).config.log == "poolshim-%p.jsonl");
  CHECK(parse_config({"POOLSHIM_LOG=x-%q.jsonl"}).config.log == "poolshim-%p.jsonl");
}

TEST_CASE("config: a value in a message is quoted, escaped and cut short") {
  const ParsedConfig p = parse_config({"POOLSHIM_SAMPLE_MS=1\n\x1b[31mred\x07\"\\",
                                       "POOLSHIM_CACHE=" + std::string(100000, '9') + "Q"});
  REQUIRE(p.warnings.size() == 2);
  CHECK(
      p.warnings[0] ==
      "POOLSHIM_SAMPLE_MS=\"1\\x0a\\x1b[31mred\\x07\\x22\\x5c\" is not a duration in milliseconds "
      "(e.g. 500, 500ms, 2s); using 1000 (the default)");
  CHECK(p.warnings[1] ==
        "POOLSHIM_CACHE=\"" + std::string(60, '9') +
            "\"... (100001 bytes) is not a size (bytes with K/M/G/T, e.g. 512M, or "
            "a % of device memory); using 64M (the default)");
  // UTF-8 stays readable; bytes that are not UTF-8 are shown as \xNN.
  const ParsedConfig u = parse_config({"POOLSHIM_FREE=caf\xc3\xa9\xff"});
  REQUIRE(u.warnings.size() == 1);
  CHECK(u.warnings[0] ==
        "POOLSHIM_FREE=\"caf\xc3\xa9\\xff\" is not one of auto|sync|ordered; using auto (the "
        "default)");
  // An unknown name is shown the same way, without quotes.
  const ParsedConfig n = parse_config({"POOLSHIM_\x1b]0;x\x07=1"});
  REQUIRE(n.warnings.size() == 1);
  CHECK(n.warnings[0] == "POOLSHIM_\\x1b]0;x\\x07 is not a poolshim option; ignored");
}

TEST_CASE("config: strict mode's errors name the problem, not a value it will not use") {
  const ParsedConfig p = parse_config({"POOLSHIM_STRICT=1", "POOLSHIM_CACHE=lots"});
  REQUIRE(p.errors.size() == 1);
  CHECK(p.errors[0] ==
        "POOLSHIM_CACHE=\"lots\" is not a size (bytes with K/M/G/T, e.g. 512M, or a % of device "
        "memory)");
  REQUIRE(p.warnings.size() == 1);
  CHECK(p.warnings[0] == p.errors[0] + "; using 64M (the default)");
}

TEST_CASE("config: every bad value of a key is reported, and the value used is named") {
  // Issue 12: the first bad value was dropped silently when the key came again.
  const ParsedConfig conf = parse_config({"POOLSHIM_CONF=sample_ms=soon,sample_ms=200"});
  REQUIRE(conf.warnings.size() == 1);
  CHECK(conf.warnings[0] ==
        "POOLSHIM_CONF sample_ms=\"soon\" is not a duration in milliseconds (e.g. 500, 500ms, 2s); "
        "using \"200\" (POOLSHIM_CONF sample_ms)");
  CHECK(conf.config.sample_ms == 200);
  // A bad variable does not lose the good value POOLSHIM_CONF gave.
  const ParsedConfig both = parse_config({"POOLSHIM_CONF=sample_ms=300", "POOLSHIM_SAMPLE_MS=x"});
  REQUIRE(both.warnings.size() == 1);
  CHECK(both.warnings[0] ==
        "POOLSHIM_SAMPLE_MS=\"x\" is not a duration in milliseconds (e.g. 500, 500ms, 2s); using "
        "\"300\" (POOLSHIM_CONF sample_ms)");
  CHECK(both.config.sample_ms == 300);
  CHECK(both.config.sources[index_of("sample_ms")] == Source::conf_string);
  // Two bad ones: two warnings, the default used.
  const ParsedConfig two = parse_config({"POOLSHIM_CONF=sample_ms=a", "POOLSHIM_SAMPLE_MS=b"});
  REQUIRE(two.warnings.size() == 2);
  CHECK(two.warnings[0].rfind("POOLSHIM_CONF sample_ms=\"a\" is not", 0) == 0);
  CHECK(two.warnings[1].rfind("POOLSHIM_SAMPLE_MS=\"b\" is not", 0) == 0);
  CHECK(two.warnings[1].find("; using 1000 (the default)") != std::string::npos);
}

TEST_CASE("config: thousands of problems give sixteen lines and one that counts the rest") {
  std::string conf = "POOLSHIM_CONF=";
  for (int i = 0; i < 10000; ++i) conf += "nosuchkey" + std::to_string(i) + "=1,";
  const ParsedConfig p = parse_config({conf, "POOLSHIM_STRICT=1"});
  REQUIRE(p.warnings.size() == 17);
  CHECK(p.warnings[0] == "POOLSHIM_CONF: \"nosuchkey0\" is not a poolshim option; ignored");
  CHECK(p.warnings[16] ==
        "... and 9984 more problems with POOLSHIM_* variables or POOLSHIM_CONF (not shown)");
  REQUIRE(p.errors.size() == 17);
  CHECK(p.errors[16] == "... and 9984 more problems with POOLSHIM_* variables or POOLSHIM_CONF");
  CHECK(p.config.strict);
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

TEST_CASE("config: describe shows the bytes a size resolves to beside the text given") {
  const ParsedConfig p =
      parse_config({"POOLSHIM_LIMIT=5%", "POOLSHIM_CONF=cache:512K",
                    "POOLSHIM_RELEASE_THRESHOLD=1048576", "POOLSHIM_LIMIT_1=50%"});
  REQUIRE(p.warnings.empty());
  const std::uint64_t GiB = 1ULL << 30;
  const auto one = describe_config(p.config, {{0, 140 * GiB}});
  CHECK(one[index_of("limit")] == "limit = 5% = 7.0 GiB (environment)");
  CHECK(one[index_of("cache")] == "cache = 512K = 512.0 KiB (POOLSHIM_CONF)");
  CHECK(one[index_of("release_threshold")] ==
        "release_threshold = 1048576 = 1.0 MiB (environment)");
  CHECK(one[index_of("page")] == "page = 20M = 20.0 MiB (default)");
  CHECK(one.back() == "limit of device 1 = 50.000000% of device memory (environment)");
  // Devices of two sizes: device by device.
  const auto two = describe_config(p.config, {{0, 140 * GiB}, {1, 80 * GiB}});
  CHECK(two[index_of("limit")] ==
        "limit = 5% = 7.0 GiB on device 0, 4.0 GiB on device 1 (environment)");
  CHECK(two.back() == "limit of device 1 = 50.000000% = 40.0 GiB (environment)");
  // No device known yet; and 0, which needs no resolving.
  const auto none = describe_config(p.config);
  CHECK(none[index_of("limit")] == "limit = 5% of device memory (environment)");
  CHECK(describe_config(parse_config({}).config)[index_of("limit")] == "limit = 0 (default)");
  // Other kinds show their text only.
  CHECK(one[index_of("sample_ms")] == "sample_ms = 1000 (default)");
}

TEST_CASE("config: variable names are POOLSHIM_ and the upper-case name") {
  CHECK(env_name("idle_trim_ms") == "POOLSHIM_IDLE_TRIM_MS");
}

// ---- hostile environments, generated (issue 12: fuzzing that stays) -----------------------

namespace {

// A value worth trying: valid forms of every kind, their near misses, huge and odd ones.
std::string hostile_value(std::mt19937& rng) {
  static const std::vector<std::string> pieces = {"0",
                                                  "1",
                                                  "yes",
                                                  "off",
                                                  "500",
                                                  "2s",
                                                  "500ms",
                                                  "1.5s",
                                                  "-1",
                                                  "18446744073709551616",
                                                  "99999999999999999999T",
                                                  "1e400",
                                                  "nan",
                                                  "inf",
                                                  "5%",
                                                  "100%",
                                                  "101%",
                                                  "-5%",
                                                  "0.0001%",
                                                  "512M",
                                                  "1G",
                                                  "3T",
                                                  "16E",
                                                  "1K1",
                                                  " 1G ",
                                                  "sync",
                                                  "ordered",
                                                  "lazy",
                                                  "%p",
                                                  "%q",
                                                  "%",
                                                  "%%",
                                                  "x-%h-%r-%t.jsonl",
                                                  "/tmp/a/b",
                                                  "",
                                                  ",",
                                                  "=",
                                                  "==",
                                                  "\x1b[31m",
                                                  "\r\n",
                                                  "\x07",
                                                  "\xed\xa0\x80",
                                                  "\xc0\xaf",
                                                  "\xff",
                                                  "caf\xc3\xa9",
                                                  "32",
                                                  "33",
                                                  "007",
                                                  "4294967296"};
  std::uniform_int_distribution<int> kind(0, 9);
  std::uniform_int_distribution<std::size_t> pick(0, pieces.size() - 1);
  switch (kind(rng)) {
    case 0: {  // random bytes (no NUL: environment strings cannot hold one)
      std::uniform_int_distribution<int> length(0, 80);
      std::uniform_int_distribution<int> byte(1, 255);
      std::string v(static_cast<std::size_t>(length(rng)), 'x');
      for (auto& c : v) c = static_cast<char>(byte(rng));
      return v;
    }
    case 1:  // very long
      return std::string(std::uniform_int_distribution<int>(100, 20000)(rng), '9') + "M";
    case 2:
    case 3:  // two pieces glued
      return pieces[pick(rng)] + pieces[pick(rng)];
    default:
      return pieces[pick(rng)];
  }
}

bool printable_utf8(const std::string& line) {
  for (std::size_t i = 0; i < line.size(); ++i) {
    const auto c = static_cast<unsigned char>(line[i]);
    if (c < 0x20 || c == 0x7f) return false;
    if (c >= 0x80) {
      const std::size_t n = utf8_sequence_length(line, i);
      if (n == 0) return false;
      i += n - 1;
    }
  }
  return true;
}

}  // namespace

TEST_CASE("config: 2000 generated hostile environments give bounded, printable messages") {
  std::mt19937 rng(20261203);  // fixed: the same environments on every run
  const auto& table = option_table();
  std::uniform_int_distribution<std::size_t> option(0, table.size() - 1);
  std::uniform_int_distribution<int> entries(0, 12);
  std::uniform_int_distribution<int> shape(0, 9);
  std::size_t total_warnings = 0;
  for (int round = 0; round < 2000; ++round) {
    std::vector<std::string> env;
    std::string conf;
    for (int e = entries(rng); e > 0; --e) {
      const std::string name = table[option(rng)].name;
      const std::string value = hostile_value(rng);
      switch (shape(rng)) {
        case 0:
          env.push_back("POOLSHIM_" + hostile_value(rng) + "=" + value);  // a mangled name
          break;
        case 1:
          env.push_back("POOLSHIM_LIMIT_" + hostile_value(rng) + "=" + value);
          break;
        case 2:
        case 3:
        case 4:
          conf += name + "=" + value + ",";
          break;
        default:
          env.push_back(env_name(name) + "=" + value);
      }
    }
    if (!conf.empty()) env.push_back("POOLSHIM_CONF=" + conf);
    const ParsedConfig p = parse_config(env);
    INFO("round " << round);
    REQUIRE(p.warnings.size() == p.errors.size());
    REQUIRE(p.warnings.size() <= 17);
    total_warnings += p.warnings.size();
    for (const auto& w : p.warnings) {
      CHECK(printable_utf8(w));
      CHECK(w.size() <= 400);
    }
    for (const auto& e : p.errors) CHECK(e.find("; using ") == std::string::npos);
    for (const auto& line : describe_config(p.config)) CHECK(printable_utf8(line));
    REQUIRE(p.config.sources.size() == table.size());
    REQUIRE(p.config.texts.size() == table.size());
    CHECK(p.config.backtrace >= 0);
    CHECK(p.config.backtrace <= 32);
    CHECK((p.config.free == "auto" || p.config.free == "sync" || p.config.free == "ordered"));
    // Parsing is a function of the environment: the same answer again.
    const ParsedConfig again = parse_config(env);
    CHECK(again.warnings == p.warnings);
    CHECK(again.config.texts == p.config.texts);
  }
  // The generator does make problems (a generator that made none would test nothing).
  CHECK(total_warnings > 2000);
}
