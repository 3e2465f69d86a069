// The one table of options (DESIGN §4). Every option is listed once in POOLSHIM_OPTIONS; the
// struct, the parser, the verbose printer, the start record and the README table (checked by
// tests/unit/test_readme.cpp) all come from it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "units.h"

namespace poolshim {

// X(name, kind, default, meaning). The variable is POOLSHIM_<NAME>; the POOLSHIM_CONF key is
// the name. Choice options list their values in choice_values().
#define POOLSHIM_OPTIONS(X)                                                                        \
  X(enable, Bool, "1",                                                                             \
    "Route allocations into the pool; 0 passes every call through untouched (for A/B runs).")      \
  X(mode, Choice, "pool",                                                                          \
    "pool: serve allocations from poolshim's pool. observe: every allocation and free goes to "    \
    "the real function unchanged and is tracked as pooled ones are (size, stream, age, call "      \
    "site), with the same records, so that an out-of-memory error is explained as it happens "     \
    "natively; `limit` still caps each device.")                                                   \
  X(log, Path, "poolshim-%p.jsonl",                                                                \
    "Log file (JSON Lines), created at the first device-memory call. %p pid, %h host, %r rank, "   \
    "%t start time, %% a percent sign; empty disables the log.")                                   \
  X(sample_ms, Milliseconds, "1000",                                                               \
    "Interval between `sample` records of why `interval` (ms, or with an s suffix); 0 writes "     \
    "none (samples of why `peak`, `oom` and `exit` are written all the same).")                    \
  X(release_threshold, Size, "0",                                                                  \
    "Unused pool memory kept cached after the pool has been idle for idle_trim_ms (bytes with "    \
    "K/M/G/T, or % of device memory).")                                                            \
  X(idle_trim_ms, Milliseconds, "5000",                                                            \
    "Idle time after which unused pool memory is given back gradually (half of what is above "     \
    "release_threshold each tick); 0 never trims.")                                                \
  X(reuse_follow_event_deps, Bool, "1",                                                            \
    "cudaMemPoolReuseFollowEventDependencies: reuse a block freed on another stream once an "      \
    "event orders the two streams.")                                                               \
  X(reuse_opportunistic, Bool, "1",                                                                \
    "cudaMemPoolReuseAllowOpportunistic: reuse a block freed on another stream once its free has " \
    "completed.")                                                                                  \
  X(reuse_internal_deps, Bool, "0",                                                                \
    "cudaMemPoolReuseAllowInternalDependencies: let the driver make a stream wait for another "    \
    "stream's free in order to reuse its block. Off: a cudaMalloc could then wait for the "        \
    "application's streams, which the native one never does.")                                     \
  X(free, Choice, "auto",                                                                          \
    "cudaFree mode. sync: synchronize the device, then return the block to the heap (native "      \
    "ordering). ordered: no host stall; the block serves other streams once the work of every "    \
    "stream of the device before the free has completed (sync where that cannot be proven). "      \
    "auto: ordered in a PyTorch process (libc10_cuda.so loaded), sync otherwise.")                 \
  X(cache, Size, "64M",                                                                            \
    "Free memory the heap keeps beyond the memory in use: whole free segments per device, and "    \
    "mapped free pages of all paged arenas together (past them a request first moves free "        \
    "pages); more go back every tick of the background thread (bytes with K/M/G/T, or % of "       \
    "device memory).")                                                                             \
  X(page, Size, "20M",                                                                             \
    "Page of the heap's paged large arenas: requests over 1 MiB are placed in one range of "       \
    "reserved addresses per arena and only the pages under blocks in use (and `cache` more) are "  \
    "backed by device memory (cuMemCreate/cuMemMap); free pages move to where memory is needed. "  \
    "Used where the process sees one device (cuDeviceGetCount, after CUDA_VISIBLE_DEVICES) and "   \
    "it supports virtual memory management; 0 (and elsewhere): large blocks from segments of the " \
    "pool.")                                                                                       \
  X(legacy_reuse, Bool, "1",                                                                       \
    "1: a block freed in the legacy default stream's order (cudaFree in free mode ordered while "  \
    "its device has no non-blocking stream, or cudaFreeAsync on stream 0) serves the next "        \
    "cudaMalloc (while there is still no non-blocking stream) or cudaMallocAsync on stream 0 at "  \
    "once: while the legacy stream is the only one in use with nothing more; else behind one "     \
    "event recorded on it, which every blocking stream then waits for. Non-blocking streams made " \
    "later first wait for its last such event. 0: such a block waits for a fence.")                \
  X(ipc, Bool, "1",                                                                                \
    "1: the paged arenas' pages are made exportable (POSIX file descriptor handle type), so that " \
    "legacy IPC (cudaIpcGetMemHandle, cuIpcGetMemHandle) exports blocks over 1 MiB to another "    \
    "process under poolshim, through a socket opened at the first export. 0: they are not, and "   \
    "such an export fails as it does for smaller blocks.")                                         \
  X(oom_retry, Bool, "1",                                                                          \
    "On out-of-memory, synchronize, trim the pool's unused memory and retry once.")                \
  X(limit, Size, "0",                                                                              \
    "A cap on the pool of every device (bytes with K/M/G/T, or % of device memory; 0: none), or "  \
    "in observe mode on its tracked allocations: allocations past it fail with the native "        \
    "out-of-memory error, and cudaMemGetInfo reports the cap as total. POOLSHIM_LIMIT_<device> "   \
    "sets one device's.")                                                                          \
  X(backtrace, Frames, "0",                                                                        \
    "Record up to this many return addresses (at most 32) per live allocation, for the call "      \
    "sites of OOM and leak reports; 0 records none.")                                              \
  X(prom_file, Path, "",                                                                           \
    "Also write the per-device figures in Prometheus text format to this file at each sample "     \
    "(rewritten atomically, for node_exporter's textfile collector), removed at exit; empty: "     \
    "none.")                                                                                       \
  X(events, Path, "",                                                                              \
    "Also write one CSV line per allocation, free and failed allocation to this file, in the "     \
    "columns of RMM's logging_resource_adaptor (for RMM's replay benchmark) and then device, "     \
    "call site and t; written by the background thread from a bounded queue that drops records "   \
    "(counted in the exit record) rather than make a call wait. The log's % escapes; empty: "      \
    "none.")                                                                                       \
  X(verbose, Bool, "0",                                                                            \
    "Print the effective configuration, where each value came from and the bytes each size "       \
    "resolves to, to stderr at start, and the log's path at exit.")                                \
  X(summary, Bool, "0",                                                                            \
    "Print a short summary of the run (allocations, peaks, out-of-memory errors, leaks at exit "   \
    "of all devices together) to stderr at exit, once the exit record is written, as the "         \
    "launcher does from the log.")                                                                 \
  X(strict, Bool, "0", "Refuse to start (exit status 2) on a bad option instead of warning.")

enum class OptionKind { Bool, Path, Milliseconds, Size, Choice, Frames };

/// Where an option's value came from.
enum class Source { default_value, conf_string, environment };

struct OptionInfo {
  const char* name;
  OptionKind kind;
  const char* default_text;
  const char* meaning;
};

/// The table, in declaration order.
const std::vector<OptionInfo>& option_table();

/// The accepted values of a Choice option.
std::vector<std::string> choice_values(std::string_view option_name);

/// "POOLSHIM_RELEASE_THRESHOLD" for "release_threshold".
std::string env_name(std::string_view option_name);

namespace detail {
template <OptionKind K>
struct ValueType;
template <>
struct ValueType<OptionKind::Bool> {
  using type = bool;
};
template <>
struct ValueType<OptionKind::Path> {
  using type = std::string;
};
template <>
struct ValueType<OptionKind::Milliseconds> {
  using type = std::uint64_t;
};
template <>
struct ValueType<OptionKind::Size> {
  using type = SizeValue;
};
template <>
struct ValueType<OptionKind::Choice> {
  using type = std::string;
};
template <>
struct ValueType<OptionKind::Frames> {
  using type = int;
};
}  // namespace detail

struct Config {
#define POOLSHIM_FIELD(name, kind, def, meaning) detail::ValueType<OptionKind::kind>::type name{};
  POOLSHIM_OPTIONS(POOLSHIM_FIELD)
#undef POOLSHIM_FIELD

  /// POOLSHIM_LIMIT_<device>: caps of single devices, over `limit`.
  std::map<int, SizeValue> device_limits;
  /// The cap of `device` (0: none), for a device of `device_total` bytes.
  std::uint64_t cap_for(int device, std::uint64_t device_total) const;

  /// Where each option's value came from, in table order.
  std::vector<Source> sources;
  /// The text each value was parsed from (the default's text for defaults), in table order.
  std::vector<std::string> texts;

  /// All defaults.
  static Config defaults();
};

struct ParsedConfig {
  Config config;
  /// One line per problem: names the variable, the bad value (quoted, escaped, cut short) and
  /// the value used instead. At most 16, then one line counting the rest.
  std::vector<std::string> warnings;
  /// The same problems for POOLSHIM_STRICT's refusal to start: without what would be done
  /// instead.
  std::vector<std::string> errors;
};

/// Reads POOLSHIM_* variables and POOLSHIM_CONF="key=value,..." from `environment`
/// ("NAME=value" strings, like environ). An item of POOLSHIM_CONF is split at its first '=' or
/// ':', whichever comes first ("cache:64M" as PyTorch's and jemalloc's strings; no key holds
/// either, so a value may: "log:/tmp/a=b.jsonl"). A variable wins over the same key in
/// POOLSHIM_CONF.
/// A bad value keeps the default and adds a warning; so does an unknown POOLSHIM_* name.
ParsedConfig parse_config(const std::vector<std::string>& environment);

/// Lines for POOLSHIM_VERBOSE: "release_threshold = 0 (default)"; a size other than 0 shows the
/// bytes it resolves to, a percentage on the devices of `device_totals` (ordinal: bytes):
/// "limit = 5% = 51.2 MiB (environment)", "... = 5% = 51.2 MiB on device 0, 102.4 MiB on device
/// 1 (...)" where their totals differ, "... = 5% of device memory (...)" with no device known.
std::vector<std::string> describe_config(const Config& config,
                                         const std::map<int, std::uint64_t>& device_totals = {});

const char* source_name(Source s);

}  // namespace poolshim
