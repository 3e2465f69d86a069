#include "config.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "json.h"

namespace poolshim {

const std::vector<OptionInfo>& option_table() {
  // Never destroyed: the background thread reads it during exit (a ThreadSanitizer run caught
  // the start record reading it after static destruction had freed it).
  static const auto* const table = new std::vector<OptionInfo>{
#define POOLSHIM_INFO(name, kind, def, meaning) {#name, OptionKind::kind, def, meaning},
      POOLSHIM_OPTIONS(POOLSHIM_INFO)
#undef POOLSHIM_INFO
  };
  return *table;
}

std::vector<std::string> choice_values(std::string_view option_name) {
  if (option_name == "free") return {"auto", "sync", "ordered"};
  if (option_name == "mode") return {"pool", "observe"};
  return {};
}

std::string env_name(std::string_view option_name) {
  std::string out = "POOLSHIM_";
  for (char c : option_name) out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

const char* source_name(Source s) {
  switch (s) {
    case Source::default_value:
      return "default";
    case Source::conf_string:
      return "POOLSHIM_CONF";
    case Source::environment:
      return "environment";
  }
  return "?";
}

namespace {

const char* kind_expectation(OptionKind kind) {
  switch (kind) {
    case OptionKind::Bool:
      return "a boolean (1/0, true/false, on/off, yes/no)";
    case OptionKind::Path:
      return "a path whose % escapes are %p, %h, %r, %t or %%";
    case OptionKind::Milliseconds:
      return "a duration in milliseconds (e.g. 500, 500ms, 2s)";
    case OptionKind::Size:
      return "a size (bytes with K/M/G/T, e.g. 512M, or a % of device memory)";
    case OptionKind::Choice:
      return "one of";
    case OptionKind::Frames:
      return "a number of frames from 0 to 32";
  }
  return "?";
}

bool valid_path_template(std::string_view text) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') continue;
    if (i + 1 == text.size()) return false;
    const char c = text[i + 1];
    if (c != 'p' && c != 'h' && c != 'r' && c != 't' && c != '%') return false;
    ++i;
  }
  return true;
}

// Sets `field` from `text`; false when the text is not a valid value of the kind.
bool assign(bool& field, std::string_view text, const OptionInfo&) {
  auto v = parse_bool(text);
  if (v) field = *v;
  return v.has_value();
}
bool assign(std::string& field, std::string_view text, const OptionInfo& info) {
  if (info.kind == OptionKind::Path) {
    if (!valid_path_template(text)) return false;
    field = std::string(text);
    return true;
  }
  const std::string value = to_lower(trim(text));
  const auto values = choice_values(info.name);
  if (std::find(values.begin(), values.end(), value) == values.end()) return false;
  field = value;
  return true;
}
bool assign(std::uint64_t& field, std::string_view text, const OptionInfo&) {
  auto v = parse_milliseconds(text);
  if (v) field = *v;
  return v.has_value();
}
bool assign(int& field, std::string_view text, const OptionInfo&) {
  const std::string s(trim(text));
  if (s.empty() || s.size() > 2 || s.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  const int v = std::stoi(s);
  if (v > 32) return false;
  field = v;
  return true;
}
bool assign(SizeValue& field, std::string_view text, const OptionInfo&) {
  auto v = parse_size(text, /*allow_percent=*/true);
  if (v) field = *v;
  return v.has_value();
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string suggestion_for(std::string_view unknown_key) {
  std::string best;
  std::size_t best_distance = 4;  // suggest only near misses
  for (const auto& info : option_table()) {
    const std::size_t d = edit_distance(unknown_key, info.name);
    if (d < best_distance) {
      best_distance = d;
      best = info.name;
    }
  }
  return best;
}

// Variables of poolshim's own scripts, not options of the library: they reach the
// application's environment through the launcher and must not draw a warning there.
bool is_tool_variable(std::string_view name) {
  return name == "POOLSHIM_LIBRARY" || name == "POOLSHIM_BUILD_DIR" || name == "POOLSHIM_GPU_OUT";
}

// 3 for POOLSHIM_LIMIT_3, -1 for anything else.
int device_limit_index(std::string_view name) {
  constexpr std::string_view prefix = "POOLSHIM_LIMIT_";
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 3 ||
      name.substr(0, prefix.size()) != prefix) {
    return -1;
  }
  const std::string digits(name.substr(prefix.size()));
  if (digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoi(digits);
}

// A value as a message shows it (issue 12: warnings echoed values raw, so a 100 KB value made a
// 100 KB line, and newlines or terminal escape codes reached the terminal): in quotes, control
// characters, quotes, backslashes and bytes that are not UTF-8 as \xNN, cut after 60 bytes with
// the length said.
std::string shown(std::string_view text, bool quoted, std::size_t limit = 60) {
  std::string out = quoted ? "\"" : "";
  std::size_t i = 0;
  for (; i < text.size() && i < limit; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
      continue;
    }
    if (c >= 0x80) {
      const std::size_t n = utf8_sequence_length(text, i);
      if (n > 0 && i + n <= limit) {
        out.append(text.substr(i, n));
        i += n - 1;
        continue;
      }
    }
    static const char hex[] = "0123456789abcdef";
    out += "\\x";
    out += hex[c >> 4];
    out += hex[c & 15];
  }
  if (quoted) out += '"';
  if (i < text.size()) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}
std::string shown_value(std::string_view text) {
  return shown(text, true);
}
std::string shown_name(std::string_view text) {
  return shown(text, false);
}

std::string choice_list(std::string_view option_name) {
  std::string out;
  for (const auto& v : choice_values(option_name)) out += (out.empty() ? "" : "|") + v;
  return out;
}

}  // namespace

Config Config::defaults() {
  Config c;
  for (const auto& info : option_table()) {
    c.sources.push_back(Source::default_value);
    c.texts.emplace_back(info.default_text);
  }
#define POOLSHIM_DEFAULT(NAME, KIND, DEFAULT, MEANING)                                \
  {                                                                                   \
    static const OptionInfo info{#NAME, OptionKind::KIND, DEFAULT, MEANING};          \
    [[maybe_unused]] const bool ok = assign(c.NAME, std::string_view(DEFAULT), info); \
  }
  POOLSHIM_OPTIONS(POOLSHIM_DEFAULT)
#undef POOLSHIM_DEFAULT
  return c;
}

namespace {

// Problems are capped: an environment with thousands of unknown names or bad values must not
// print thousands of lines (issue 12).
constexpr std::size_t kMaxProblems = 16;

struct Problems {
  ParsedConfig& out;
  std::size_t more = 0;  // problems beyond kMaxProblems, summarized in one line
  // `what` is the problem; `instead` what is done about it (left out of strict mode's error,
  // which refuses to start instead).
  void add(const std::string& what, const std::string& instead) {
    if (out.errors.size() == kMaxProblems) {
      ++more;
      return;
    }
    out.warnings.push_back(what + "; " + instead);
    out.errors.push_back(what);
  }
  ~Problems() {
    if (more == 0) return;
    const std::string line = "... and " + std::to_string(more) + " more problem" +
                             (more == 1 ? "" : "s") + " with POOLSHIM_* variables or POOLSHIM_CONF";
    out.warnings.push_back(line + " (not shown)");
    out.errors.push_back(line);
  }
};

// One value given for an option, and where it came from.
struct Setting {
  std::string text;
  Source source;
  std::string origin;  // how to name it in a message: POOLSHIM_X, or "POOLSHIM_CONF key"
};

// The default log name, in the folder a bad log template named (issue 12: falling back to the
// working folder surprised a user who had named a folder), when that folder's part is valid.
std::string log_fallback(const std::string& bad_template, const char* default_text) {
  const auto slash = bad_template.rfind('/');
  if (slash == std::string::npos) return default_text;
  const std::string folder = bad_template.substr(0, slash + 1);
  return valid_path_template(folder) ? folder + default_text : default_text;
}

// Sets `field` from the valid setting of highest precedence (the last in `settings`); warns
// once for each invalid one, naming what is used instead.
template <typename T>
void apply_option(T& field, std::size_t index, const OptionInfo& info,
                  const std::vector<Setting>& settings, Config& config, Problems& problems) {
  const Setting* chosen = nullptr;
  for (const Setting& s : settings) {
    T value = field;
    if (assign(value, s.text, info)) {
      field = value;
      chosen = &s;
    }
  }
  std::string instead;
  if (chosen != nullptr) {
    config.sources[index] = chosen->source;
    config.texts[index] = chosen->text;
    instead = "using " + shown_value(chosen->text) + " (" + chosen->origin + ")";
  } else if (std::string_view(info.name) == "log") {
    const std::string fallback = log_fallback(settings.back().text, info.default_text);
    [[maybe_unused]] const bool ok = assign(field, fallback, info);
    config.texts[index] = fallback;
    instead = "using " + shown_value(fallback) +
              (fallback == info.default_text ? " (the default)" : " (the default name there)");
  } else {
    instead = std::string("using ") + (*info.default_text ? info.default_text : "\"\"") +
              " (the default)";
  }
  std::string expect = kind_expectation(info.kind);
  if (info.kind == OptionKind::Choice) expect += " " + choice_list(info.name);
  for (const Setting& s : settings) {
    if (&s == chosen) continue;
    T scratch = field;
    if (assign(scratch, s.text, info)) continue;  // valid, only outranked
    problems.add(s.origin + "=" + shown_value(s.text) + " is not " + expect, instead);
  }
}

}  // namespace

ParsedConfig parse_config(const std::vector<std::string>& environment) {
  ParsedConfig out;
  out.config = Config::defaults();
  const auto& table = option_table();
  Problems problems{out};

  // Collect values: POOLSHIM_CONF first, then variables, so that variables win.
  std::map<std::string, std::vector<Setting>> settings;
  std::vector<std::pair<std::string, std::string>> variables;
  for (const auto& entry : environment) {
    const auto eq = entry.find('=');
    if (eq == std::string::npos || entry.compare(0, 9, "POOLSHIM_") != 0) continue;
    variables.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
  }
  auto find_option = [&](std::string_view key) -> const OptionInfo* {
    const std::string lower = to_lower(key);
    for (const auto& info : table) {
      if (lower == info.name) return &info;
    }
    return nullptr;
  };
  for (const auto& [name, value] : variables) {
    if (name != "POOLSHIM_CONF") continue;
    std::string_view rest(value);
    while (!rest.empty()) {
      const auto comma = rest.find(',');
      const std::string_view item = trim(rest.substr(0, comma));
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      if (item.empty()) continue;
      // key=value or key:value, split at the first of either (config.h).
      const auto eq = item.find_first_of("=:");
      if (eq == std::string_view::npos || trim(item.substr(0, eq)).empty()) {
        problems.add("POOLSHIM_CONF: " + shown_value(item) + " is not key=value or key:value",
                     "ignored");
        continue;
      }
      const std::string key = to_lower(trim(item.substr(0, eq)));
      const OptionInfo* info = find_option(key);
      if (info == nullptr) {
        const std::string near = suggestion_for(key);
        problems.add("POOLSHIM_CONF: " + shown_value(key) + " is not a poolshim option" +
                         (near.empty() ? "" : " (did you mean " + near + "?)"),
                     "ignored");
        continue;
      }
      settings[info->name].push_back(
          {std::string(trim(item.substr(eq + 1))), Source::conf_string, "POOLSHIM_CONF " + key});
    }
  }
  for (const auto& [name, value] : variables) {
    if (name == "POOLSHIM_CONF" || is_tool_variable(name)) continue;
    if (const int device = device_limit_index(name); device >= 0) {
      if (auto v = parse_size(value, /*allow_percent=*/true)) {
        out.config.device_limits[device] = *v;
      } else {
        problems.add(
            name + "=" + shown_value(value) + " is not " + kind_expectation(OptionKind::Size),
            "using no cap of its own");
      }
      continue;
    }
    const OptionInfo* info = find_option(std::string_view(name).substr(9));
    if (info == nullptr || env_name(info->name) != name) {
      const std::string near = suggestion_for(to_lower(std::string_view(name).substr(9)));
      problems.add(shown_name(name) + " is not a poolshim option" +
                       (near.empty() ? "" : " (did you mean " + env_name(near) + "?)"),
                   "ignored");
      continue;
    }
    settings[info->name].push_back({value, Source::environment, name});
  }

  // Apply them through the typed fields.
  std::size_t index = 0;
#define POOLSHIM_APPLY(NAME, KIND, DEFAULT, MEANING)                                        \
  {                                                                                         \
    const auto it = settings.find(#NAME);                                                   \
    if (it != settings.end()) {                                                             \
      apply_option(out.config.NAME, index, table[index], it->second, out.config, problems); \
    }                                                                                       \
    ++index;                                                                                \
  }
  POOLSHIM_OPTIONS(POOLSHIM_APPLY)
#undef POOLSHIM_APPLY
  return out;
}

std::uint64_t Config::cap_for(int device, std::uint64_t device_total) const {
  const auto it = device_limits.find(device);
  const SizeValue& v = it != device_limits.end() ? it->second : limit;
  return v.resolve(device_total);
}

namespace {

// What a size resolves to, after its text: " = 64.0 MiB", " = 51.2 MiB" for a percentage of
// devices of one size, " = 51.2 MiB on device 0, 102.4 MiB on device 1" for devices of
// several, " of device memory" with none known; "" for 0 bytes, which needs no resolving.
std::string resolved(const SizeValue& value, const std::map<int, std::uint64_t>& device_totals) {
  if (!value.is_percent) return value.bytes == 0 ? "" : " = " + format_bytes(value.bytes);
  if (device_totals.empty()) return " of device memory";
  const std::uint64_t first = device_totals.begin()->second;
  const bool one_size = std::all_of(device_totals.begin(), device_totals.end(),
                                    [first](const auto& d) { return d.second == first; });
  if (one_size) return " = " + format_bytes(value.resolve(first));
  std::string out;
  for (const auto& [device, total] : device_totals) {
    out += (out.empty() ? " = " : ", ") + format_bytes(value.resolve(total)) + " on device " +
           std::to_string(device);
  }
  return out;
}
// Only sizes resolve.
template <typename T>
std::string resolved(const T&, const std::map<int, std::uint64_t>&) {
  return "";
}

}  // namespace

std::vector<std::string> describe_config(const Config& config,
                                         const std::map<int, std::uint64_t>& device_totals) {
  std::vector<std::string> lines;
  const auto& table = option_table();
  std::size_t index = 0;
  // A valid value may hold any byte (a path): escaped like a bad one, but shown whole.
#define POOLSHIM_DESCRIBE(NAME, KIND, DEFAULT, MEANING)                                   \
  {                                                                                       \
    std::string line =                                                                    \
        std::string(table[index].name) + " = " +                                          \
        (config.texts[index].empty() ? "\"\"" : shown(config.texts[index], false, 4096)); \
    line += resolved(config.NAME, device_totals);                                         \
    lines.push_back(line + " (" + source_name(config.sources[index]) + ")");              \
    ++index;                                                                              \
  }
  POOLSHIM_OPTIONS(POOLSHIM_DESCRIBE)
#undef POOLSHIM_DESCRIBE
  for (const auto& [device, value] : config.device_limits) {
    std::map<int, std::uint64_t> its_total;
    if (const auto it = device_totals.find(device); it != device_totals.end()) {
      its_total.insert(*it);
    }
    lines.push_back(
        "limit of device " + std::to_string(device) + " = " +
        (value.is_percent ? std::to_string(value.percent) + "%" : std::to_string(value.bytes)) +
        resolved(value, its_total) + " (environment)");
  }
  return lines;
}

}  // namespace poolshim
