#include "json.h"

#include <cmath>
#include <cstdio>

namespace poolshim {

// Length of the well-formed UTF-8 sequence starting at s[i] (Unicode 15, table 3-7), or 0 if
// there is none: overlong forms, UTF-16 surrogates (ED A0..BF) and code points above U+10FFFF
// are not UTF-8, and a log that carried them would be refused by strict JSON readers.
std::size_t utf8_sequence_length(std::string_view s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = byte(0);
  std::size_t n = 0;
  unsigned char lo = 0x80;  // the range of the second byte
  unsigned char hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong below U+0800
    if (c == 0xED) hi = 0x9F;  // surrogates U+D800..DFFF
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;  // overlong below U+10000
    if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size() || byte(1) < lo || byte(1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k) {
    if ((byte(k) & 0xC0) != 0x80) return 0;
  }
  return n;
}

std::string json_string(std::string_view value) {
  std::string out = "\"";
  for (std::size_t i = 0; i < value.size(); ++i) {
    const auto c = static_cast<unsigned char>(value[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      default:
        break;
    }
    if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (const std::size_t n = utf8_sequence_length(value, i); n > 0) {
      out.append(value.substr(i, n));
      i += n - 1;
    } else {
      // Not UTF-8 (a Latin-1 argument, a surrogate from a mangled path: Linux arguments and
      // paths are any bytes): each such byte becomes U+FFFD, so the line stays valid JSON.
      out += "\\ufffd";
    }
  }
  return out + "\"";
}

void JsonObject::key(std::string_view k) {
  if (!first_) text_ += ',';
  first_ = false;
  text_ += json_string(k);
  text_ += ':';
}

JsonObject& JsonObject::add(std::string_view k, std::string_view value) {
  key(k);
  text_ += json_string(value);
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, std::uint64_t value) {
  key(k);
  text_ += std::to_string(value);
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, std::int64_t value) {
  key(k);
  text_ += std::to_string(value);
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, double value) {
  key(k);
  if (!std::isfinite(value)) {
    text_ += "null";
    return *this;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", value);
  text_ += buf;
  return *this;
}

JsonObject& JsonObject::add(std::string_view k, bool value) {
  key(k);
  text_ += value ? "true" : "false";
  return *this;
}

JsonObject& JsonObject::add_null(std::string_view k) {
  key(k);
  text_ += "null";
  return *this;
}

JsonObject& JsonObject::add_raw(std::string_view k, std::string_view json) {
  key(k);
  text_.append(json);
  return *this;
}

}  // namespace poolshim
