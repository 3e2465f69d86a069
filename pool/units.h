// Parsing and printing of the value kinds that options and reports use: byte sizes with
// K/M/G/T suffixes (powers of 1024) or a percentage, booleans, durations in milliseconds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace poolshim {

/// A byte count, or a share of the device's memory resolved once the device is known.
struct SizeValue {
  std::uint64_t bytes = 0;
  double percent = 0.0;  // used when is_percent
  bool is_percent = false;

  /// Bytes for a device with `device_total` bytes of memory.
  std::uint64_t resolve(std::uint64_t device_total) const;
  bool operator==(const SizeValue& o) const {
    return bytes == o.bytes && percent == o.percent && is_percent == o.is_percent;
  }
};

/// "1048576", "512K", "1.5G", "2GiB", "64mb", "25%" (when allow_percent). Case-insensitive;
/// surrounding spaces ignored. nullopt on anything else, on negatives and on overflow.
std::optional<SizeValue> parse_size(std::string_view text, bool allow_percent);

/// "1/0/true/false/on/off/yes/no", case-insensitive.
std::optional<bool> parse_bool(std::string_view text);

/// Whole milliseconds: "250", "250ms", "2s". Not negative; at most about 24 days.
std::optional<std::uint64_t> parse_milliseconds(std::string_view text);

/// "0 B", "512 B", "1.5 KiB", "3.0 GiB": for people, never parsed back.
std::string format_bytes(std::uint64_t bytes);

std::string_view trim(std::string_view text);
std::string to_lower(std::string_view text);

}  // namespace poolshim
