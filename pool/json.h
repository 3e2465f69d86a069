// A minimal JSON object writer for log records: one object per line, keys in the order
// written, strings escaped (invalid UTF-8 replaced), non-finite numbers written as null.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace poolshim {

class JsonObject {
 public:
  JsonObject() : text_("{") {}

  JsonObject& add(std::string_view key, std::string_view value);
  JsonObject& add(std::string_view key, const char* value) {
    return add(key, std::string_view(value));
  }
  JsonObject& add(std::string_view key, const std::string& value) {
    return add(key, std::string_view(value));
  }
  JsonObject& add(std::string_view key, std::uint64_t value);
  JsonObject& add(std::string_view key, std::int64_t value);
  JsonObject& add(std::string_view key, int value) {
    return add(key, static_cast<std::int64_t>(value));
  }
  JsonObject& add(std::string_view key, unsigned value) {
    return add(key, static_cast<std::uint64_t>(value));
  }
  JsonObject& add(std::string_view key, double value);
  JsonObject& add(std::string_view key, bool value);
  JsonObject& add_null(std::string_view key);
  /// `json` must already be valid JSON (an object or array built with these helpers).
  JsonObject& add_raw(std::string_view key, std::string_view json);

  /// The finished object, without a newline.
  std::string str() const { return text_ + "}"; }

 private:
  void key(std::string_view k);
  std::string text_;
  bool first_ = true;
};

/// The length of the well-formed UTF-8 sequence that starts at s[i] (1 to 4 bytes for
/// s[i] >= 0x80), or 0 when none does (overlong, surrogate, above U+10FFFF, cut short).
std::size_t utf8_sequence_length(std::string_view s, std::size_t i);

/// `"escaped"`, with quotes. Bytes that are not UTF-8 become U+FFFD each.
std::string json_string(std::string_view value);

/// "[a,b,c]" from already-serialized elements.
template <typename Container>
std::string json_array(const Container& elements) {
  std::string out = "[";
  bool first = true;
  for (const auto& e : elements) {
    if (!first) out += ',';
    out += e;
    first = false;
  }
  return out + "]";
}

}  // namespace poolshim
