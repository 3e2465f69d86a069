#include "units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

namespace poolshim {

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  return text;
}

std::string to_lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::uint64_t SizeValue::resolve(std::uint64_t device_total) const {
  if (!is_percent) return bytes;
  const long double b = static_cast<long double>(device_total) * percent / 100.0L;
  return static_cast<std::uint64_t>(b);
}

namespace {

// Parses a non-negative decimal number with an optional fraction ("1", "1.5", ".5").
std::optional<long double> parse_decimal(std::string_view digits) {
  if (digits.empty()) return std::nullopt;
  long double value = 0;
  bool seen_digit = false;
  bool in_fraction = false;
  long double scale = 1;
  for (char c : digits) {
    if (c == '.' && !in_fraction) {
      in_fraction = true;
    } else if (c >= '0' && c <= '9') {
      seen_digit = true;
      if (in_fraction) {
        scale /= 10;
        value += (c - '0') * scale;
      } else {
        value = value * 10 + (c - '0');
      }
    } else {
      return std::nullopt;
    }
  }
  if (!seen_digit) return std::nullopt;
  return value;
}

}  // namespace

std::optional<SizeValue> parse_size(std::string_view text, bool allow_percent) {
  const std::string s = to_lower(trim(text));
  if (s.empty()) return std::nullopt;
  if (s.back() == '%') {
    if (!allow_percent) return std::nullopt;
    auto v = parse_decimal(trim(std::string_view(s).substr(0, s.size() - 1)));
    if (!v || *v > 100) return std::nullopt;
    SizeValue out;
    out.is_percent = true;
    out.percent = static_cast<double>(*v);
    return out;
  }
  // Split number and unit: digits and '.' first, then an optional unit.
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  auto number = parse_decimal(std::string_view(s).substr(0, i));
  if (!number) return std::nullopt;
  const std::string unit(trim(std::string_view(s).substr(i)));
  long double multiplier = 1;
  static const struct {
    const char* names[4];
    long double factor;
  } units[] = {
      {{"", "b", nullptr, nullptr}, 1.0L},
      {{"k", "kb", "kib", nullptr}, 1024.0L},
      {{"m", "mb", "mib", nullptr}, 1024.0L * 1024},
      {{"g", "gb", "gib", nullptr}, 1024.0L * 1024 * 1024},
      {{"t", "tb", "tib", nullptr}, 1024.0L * 1024 * 1024 * 1024},
  };
  bool known = false;
  for (const auto& u : units) {
    for (const char* name : u.names) {
      if (name != nullptr && unit == name) {
        multiplier = u.factor;
        known = true;
      }
    }
  }
  if (!known) return std::nullopt;
  const long double bytes = std::floor(*number * multiplier);
  if (bytes > static_cast<long double>(std::numeric_limits<std::uint64_t>::max()))
    return std::nullopt;
  SizeValue out;
  out.bytes = static_cast<std::uint64_t>(bytes);
  return out;
}

std::optional<bool> parse_bool(std::string_view text) {
  const std::string s = to_lower(trim(text));
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  return std::nullopt;
}

std::optional<std::uint64_t> parse_milliseconds(std::string_view text) {
  const std::string s = to_lower(trim(text));
  std::size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == 0 || i > 12) return std::nullopt;
  const std::uint64_t number = std::stoull(s.substr(0, i));
  const std::string unit(trim(std::string_view(s).substr(i)));
  std::uint64_t ms = 0;
  if (unit.empty() || unit == "ms") {
    ms = number;
  } else if (unit == "s") {
    ms = number * 1000;
  } else {
    return std::nullopt;
  }
  constexpr std::uint64_t kMax = 24ULL * 24 * 3600 * 1000;  // keeps steady_clock arithmetic safe
  if (ms > kMax) return std::nullopt;
  return ms;
}

std::string format_bytes(std::uint64_t bytes) {
  static const char* const names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", value, names[unit]);
  }
  return buf;
}

}  // namespace poolshim
