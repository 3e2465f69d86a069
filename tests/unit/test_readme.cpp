// README.md documents the options and the log schema; these tests fail when it drifts from
// the tables in code (STYLE: the parser, the printer and the README table agree).
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "config.h"
#include "stats.h"

using namespace poolshim;

namespace {

std::string readme_section(const std::string& name) {
  std::ifstream in(POOLSHIM_README);
  REQUIRE(in.good());
  std::stringstream all;
  all << in.rdbuf();
  const std::string text = all.str();
  const std::string begin = "<!-- " + name + ":begin -->";
  const std::string end = "<!-- " + name + ":end -->";
  const auto b = text.find(begin);
  const auto e = text.find(end);
  REQUIRE(b != std::string::npos);
  REQUIRE(e != std::string::npos);
  return text.substr(b + begin.size(), e - b - begin.size());
}

std::vector<std::string> cells(const std::string& row) {
  std::vector<std::string> out;
  std::string cell;
  for (std::size_t i = 1; i < row.size(); ++i) {
    if (row[i] == '|') {
      out.push_back(std::string(trim(cell)));
      cell.clear();
    } else {
      cell += row[i];
    }
  }
  return out;
}

std::string unquote(const std::string& s) {
  return s.size() >= 2 && s.front() == '`' && s.back() == '`' ? s.substr(1, s.size() - 2) : s;
}

}  // namespace

TEST_CASE("README: the option table lists every option with the code's default and meaning") {
  std::istringstream section(readme_section("options"));
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(section, line)) {
    if (line.rfind("| `POOLSHIM_", 0) == 0) rows.push_back(cells(line));
  }
  const auto& table = option_table();
  REQUIRE(rows.size() == table.size());
  for (std::size_t i = 0; i < table.size(); ++i) {
    INFO("option " << table[i].name);
    REQUIRE(rows[i].size() == 4);
    CHECK(unquote(rows[i][0]) == env_name(table[i].name));
    CHECK(unquote(rows[i][1]) == table[i].name);
    const std::string shown = unquote(rows[i][2]);
    CHECK((shown == "(empty)" ? std::string() : shown) == table[i].default_text);
    CHECK(rows[i][3] == table[i].meaning);
  }
}

TEST_CASE("README: the log schema names every counter and gauge of a sample") {
  const std::string schema = readme_section("schema");
  std::vector<std::string> fields = {"schema",
                                     "type",
                                     "t",
                                     "pid",
                                     "device",
                                     "reserved_bytes",
                                     "reserved_bytes_peak",
                                     "used_bytes",
                                     "used_bytes_peak",
                                     "cached_bytes",
                                     "cached_bytes_peak",
                                     "pool_slack",
                                     "rounding_waste",
                                     "device_free",
                                     "device_total",
                                     "size_histogram",
                                     "pooled_allocs",
                                     "leaks",
                                     "verdict",
                                     "hint"};
#define POOLSHIM_README_COUNTER(name, meaning) fields.push_back(#name);
  POOLSHIM_COUNTERS(POOLSHIM_README_COUNTER)
#undef POOLSHIM_README_COUNTER
#define POOLSHIM_README_GAUGE(name, meaning) \
  fields.push_back(#name);                   \
  fields.push_back(#name "_peak");           \
  fields.push_back(#name "_total");
  POOLSHIM_GAUGES(POOLSHIM_README_GAUGE)
#undef POOLSHIM_README_GAUGE
  for (const auto& f : fields) {
    INFO("field " << f);
    CHECK(schema.find("`" + f + "`") != std::string::npos);
  }
}
