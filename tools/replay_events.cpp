// The replay program of scripts/poolshim-replay (issue 17; README "Replaying an event log";
// DESIGN §5.1): reads an allocation event log (POOLSHIM_EVENTS's CSV, or RMM's) and makes its
// allocations and frees again, in file order, with the CUDA runtime's own calls, so that the
// library preloaded under it (poolshim with some options) serves them as it would have served
// the recorded program. It is an ordinary CUDA program: it knows nothing of poolshim, which
// keeps its figures (the exit record) itself. It prints one JSON object of counts and call
// times on stdout.
//
//     replay_events [--device N] [--progress ROWS] [--label TEXT] EVENTS
//
// Rows: `allocate` on Stream 0 replays as cudaMalloc, on another stream as cudaMallocAsync on
// a non-blocking stream made for that recorded stream at its first row (0x1 and 0x2 are the
// legacy and the per-thread default streams' handles, replayed as those); `free` likewise as
// cudaFree or cudaFreeAsync, of the replayed pointer that the recorded one maps to.
// `allocate failure` rows, rows of another device than N (default: the first row's) and frees
// of pointers with no live allocation are counted and skipped. An allocation that fails in the
// replay (out of memory) is counted and the replay goes on; its free is then skipped.
//
// Exit status: 0 replayed; 2 bad usage, or an event log that cannot be read or has a malformed
// row (the message names the file and line); 1 no CUDA device to replay on.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace {

constexpr const char* kProgram = "replay_events";
// The name messages start with (--label: the driver's, so that its user reads one tool's name).
std::string g_label = kProgram;

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr, "%s: %s\nusage: %s [--device N] [--progress ROWS] [--label TEXT] EVENTS\n",
               g_label.c_str(), why.c_str(), kProgram);
  std::exit(2);
}

// A malformed event log: "FILE:LINE: why", exit 2.
[[noreturn]] void input_error(const std::string& path, std::uint64_t line, const std::string& why) {
  std::fprintf(stderr, "%s: %s:%" PRIu64 ": %s\n", g_label.c_str(), path.c_str(), line,
               why.c_str());
  std::exit(2);
}

// The columns the replay reads, found by name in the header as RMM's log parser finds them.
struct Columns {
  int action = -1, pointer = -1, size = -1, stream = -1, device = -1;
  std::size_t needed = 0;  // cells a row must have: one past the last column read
};

std::vector<std::string_view> split_cells(std::string_view line) {
  std::vector<std::string_view> cells;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = line.find(',', start);
    if (comma == std::string_view::npos) {
      cells.push_back(line.substr(start));
      return cells;
    }
    cells.push_back(line.substr(start, comma - start));
    start = comma + 1;
  }
}

// Unsigned numbers in one base, the whole cell and nothing else ("0x" first for base 16).
bool parse_unsigned(std::string_view cell, int base, std::uint64_t* out) {
  if (base == 16) {
    if (cell.size() < 3 || cell[0] != '0' || (cell[1] != 'x' && cell[1] != 'X')) return false;
    cell.remove_prefix(2);
  }
  if (cell.empty() || cell.size() > 20) return false;
  std::uint64_t value = 0;
  for (const char c : cell) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (base == 16 && c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (base == 16 && c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      return false;
    }
    if (digit >= base) return false;
    if (value > (UINT64_MAX - static_cast<std::uint64_t>(digit)) / static_cast<std::uint64_t>(base))
      return false;
    value = value * static_cast<std::uint64_t>(base) + static_cast<std::uint64_t>(digit);
  }
  *out = value;
  return true;
}

std::string shown(std::string_view cell) {
  std::string out = "'";
  for (const char c : cell.substr(0, 40)) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + (cell.size() > 40 ? "...'" : "'");
}

Columns read_header(std::string_view line, const std::string& path) {
  Columns c;
  const auto cells = split_cells(line);
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const std::string_view name = cells[i];
    int* slot = name == "Action"    ? &c.action
                : name == "Pointer" ? &c.pointer
                : name == "Size"    ? &c.size
                : name == "Stream"  ? &c.stream
                : name == "Device"  ? &c.device
                                    : nullptr;
    if (slot != nullptr && *slot < 0) *slot = static_cast<int>(i);
  }
  std::string missing;
  for (const auto& [name, index] : {std::pair<const char*, int>{"Action", c.action},
                                    {"Pointer", c.pointer},
                                    {"Size", c.size},
                                    {"Stream", c.stream}}) {
    if (index < 0) missing += std::string(missing.empty() ? "" : ", ") + name;
  }
  if (!missing.empty()) {
    input_error(path, 1,
                "not an event log: the header has no " + missing +
                    " column (POOLSHIM_EVENTS writes Thread,Time,Action,Pointer,Size,Stream,"
                    "Device,Site,T)");
  }
  for (const int index : {c.action, c.pointer, c.size, c.stream, c.device}) {
    c.needed = std::max(c.needed, static_cast<std::size_t>(index + 1));
  }
  return c;
}

// Call times in ns, with their total, median and 99th percentile.
struct Timings {
  std::vector<std::uint64_t> ns;
  std::uint64_t total = 0;
  void add(std::uint64_t t) {
    ns.push_back(t);
    total += t;
  }
  // The value at rank ceil(q * n) (nearest rank), 0 with no calls.
  std::uint64_t quantile(double q) {
    if (ns.empty()) return 0;
    std::size_t rank = static_cast<std::size_t>(q * static_cast<double>(ns.size()));
    if (static_cast<double>(rank) < q * static_cast<double>(ns.size())) ++rank;
    const std::size_t index = rank == 0 ? 0 : rank - 1;
    std::nth_element(ns.begin(), ns.begin() + static_cast<std::ptrdiff_t>(index), ns.end());
    return ns[index];
  }
};

struct Live {
  void* ptr;            // the replayed pointer; null when the replayed allocation failed
  std::uint64_t bytes;  // the recorded size
};

struct Counts {
  std::uint64_t rows = 0, allocations = 0, frees = 0, recorded_failures = 0, other_device = 0,
                unknown_frees = 0, missing_frees = 0, replay_alloc_failures = 0,
                replay_free_failures = 0, frees_of_failed = 0;
  std::uint64_t live_bytes = 0, live_bytes_peak = 0;
  std::string first_error;
};

class Replay {
 public:
  explicit Replay(Counts& counts) : counts_(counts) {}

  void allocate(std::uint64_t recorded, std::uint64_t bytes, std::uint64_t stream) {
    auto found = live_.find(recorded);
    if (found != live_.end()) {
      // The address was handed out again, so it was freed: its free row is missing (a log
      // whose queue dropped records). Freed here, late, so that it does not stay live forever.
      ++counts_.missing_frees;
      release(found->second, 0, false);
      live_.erase(found);
    }
    void* p = nullptr;
    cudaStream_t s = nullptr;
    const bool async = stream != 0;
    if (async) s = stream_for(stream);
    const auto start = std::chrono::steady_clock::now();
    const cudaError_t e = async ? cudaMallocAsync(&p, bytes, s) : cudaMalloc(&p, bytes);
    alloc_ns.add(elapsed_ns(start));
    ++counts_.allocations;
    if (e != cudaSuccess) {
      ++counts_.replay_alloc_failures;
      note_error(async ? "cudaMallocAsync" : "cudaMalloc", e);
      p = nullptr;
    }
    live_.emplace(recorded, Live{p, bytes});
    if (p == nullptr) return;
    counts_.live_bytes += bytes;
    counts_.live_bytes_peak = std::max(counts_.live_bytes_peak, counts_.live_bytes);
  }

  void free(std::uint64_t recorded, std::uint64_t stream) {
    auto found = live_.find(recorded);
    if (found == live_.end()) {
      ++counts_.unknown_frees;
      return;
    }
    const Live l = found->second;
    live_.erase(found);
    release(l, stream, true);
  }

  std::size_t streams() const { return streams_.size(); }

  Timings alloc_ns, free_ns;

 private:
  static std::uint64_t elapsed_ns(std::chrono::steady_clock::time_point start) {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now() - start)
                                          .count());
  }

  void note_error(const char* call, cudaError_t e) {
    if (counts_.first_error.empty()) {
      counts_.first_error = std::string(call) + ": " + cudaGetErrorName(e);
    }
    cudaGetLastError();  // an allocation's error is not sticky: clear it for the next call
  }

  // `timed`: a free of the log (a missing free's late one is not timed or counted as a free).
  void release(const Live& l, std::uint64_t stream, bool timed) {
    if (l.ptr == nullptr) {
      if (timed) ++counts_.frees_of_failed;
      return;
    }
    counts_.live_bytes -= l.bytes;
    const bool async = stream != 0;
    cudaStream_t s = async ? stream_for(stream) : nullptr;
    const auto start = std::chrono::steady_clock::now();
    const cudaError_t e = async ? cudaFreeAsync(l.ptr, s) : cudaFree(l.ptr);
    if (timed) {
      free_ns.add(elapsed_ns(start));
      ++counts_.frees;
    }
    if (e != cudaSuccess) {
      ++counts_.replay_free_failures;
      note_error(async ? "cudaFreeAsync" : "cudaFree", e);
    }
  }

  cudaStream_t stream_for(std::uint64_t recorded) {
    // The default streams' handles (cudaStreamLegacy, cudaStreamPerThread) are the same in
    // every process: replayed as themselves.
    if (recorded == reinterpret_cast<std::uintptr_t>(cudaStreamLegacy)) return cudaStreamLegacy;
    if (recorded == reinterpret_cast<std::uintptr_t>(cudaStreamPerThread)) {
      return cudaStreamPerThread;
    }
    auto found = streams_.find(recorded);
    if (found != streams_.end()) return found->second;
    // Made at its first row: the shim's rules change when the first non-blocking stream
    // appears (the legacy rule, DESIGN §7), so it should not appear before the log's.
    cudaStream_t s = nullptr;
    const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      std::fprintf(stderr, "%s: cudaStreamCreateWithFlags: %s\n", g_label.c_str(),
                   cudaGetErrorName(e));
      std::exit(1);
    }
    streams_.emplace(recorded, s);
    return s;
  }

  Counts& counts_;
  std::unordered_map<std::uint64_t, Live> live_;
  std::unordered_map<std::uint64_t, cudaStream_t> streams_;
};

void json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
}

void json_timings(std::string& out, const char* name, Timings& t) {
  char buf[256];
  const std::uint64_t p50 = t.quantile(0.5), p99 = t.quantile(0.99);
  std::snprintf(buf, sizeof buf,
                "\"%s\": {\"calls\": %zu, \"total_ns\": %" PRIu64 ", \"median_ns\": %" PRIu64
                ", \"p99_ns\": %" PRIu64 "}",
                name, t.ns.size(), t.total, p50, p99);
  out += buf;
}

}  // namespace

int main(int argc, char** argv) {
  int device = -1;  // -1: the first row's
  std::uint64_t progress = 0;
  std::string path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      return argv[++i];
    };
    std::uint64_t n = 0;
    if (arg == "--device") {
      const std::string v = value();
      if (!parse_unsigned(v, 10, &n) || n > 1024)
        usage_error("--device: not a device ordinal: " + v);
      device = static_cast<int>(n);
    } else if (arg == "--progress") {
      const std::string v = value();
      if (!parse_unsigned(v, 10, &n)) usage_error("--progress: not a row count: " + v);
      progress = n;
    } else if (arg == "--label") {
      g_label = value();
    } else if (arg == "--version") {
      // Loads nothing but the runtime: the launcher's probe that the program (and a preloaded
      // library's option check) starts.
      std::printf("%s\n", kProgram);
      return 0;
    } else if (arg.size() > 1 && arg[0] == '-') {
      usage_error("unknown option " + arg);
    } else if (path.empty()) {
      path = arg;
    } else {
      usage_error("more than one event log given");
    }
  }
  if (path.empty()) usage_error("no event log given");

  FILE* in = std::fopen(path.c_str(), "r");
  if (in == nullptr) {
    std::fprintf(stderr, "%s: %s: cannot read: %s\n", g_label.c_str(), path.c_str(),
                 std::strerror(errno));
    return 2;
  }
  char* buffer = nullptr;
  std::size_t capacity = 0;
  std::uint64_t line_number = 0;
  auto next_line = [&](std::string_view* line) {
    const ssize_t n = getline(&buffer, &capacity, in);
    if (n < 0) return false;
    ++line_number;
    std::string_view l(buffer, static_cast<std::size_t>(n));
    while (!l.empty() && (l.back() == '\n' || l.back() == '\r')) l.remove_suffix(1);
    *line = l;
    return true;
  };
  std::string_view line;
  if (!next_line(&line)) input_error(path, 1, "empty: no header");
  const Columns columns = read_header(line, path);

  Counts counts;
  std::unique_ptr<Replay> replay;
  const auto start = std::chrono::steady_clock::now();
  while (next_line(&line)) {
    if (line.empty()) continue;
    const auto cells = split_cells(line);
    if (cells.size() < columns.needed) {
      input_error(path, line_number,
                  std::to_string(cells.size()) + " cells, the header's columns need " +
                      std::to_string(columns.needed));
    }
    const std::string_view action = cells[static_cast<std::size_t>(columns.action)];
    std::uint64_t pointer = 0, size = 0, stream = 0, row_device = 0;
    if (action != "allocate" && action != "free" && action != "allocate failure") {
      input_error(path, line_number,
                  "Action " + shown(action) + " is not allocate, free or allocate failure");
    }
    if (!parse_unsigned(cells[static_cast<std::size_t>(columns.pointer)], 16, &pointer)) {
      input_error(path, line_number,
                  "Pointer " + shown(cells[static_cast<std::size_t>(columns.pointer)]) +
                      " is not 0x and hex digits");
    }
    if (!parse_unsigned(cells[static_cast<std::size_t>(columns.size)], 10, &size)) {
      input_error(path, line_number,
                  "Size " + shown(cells[static_cast<std::size_t>(columns.size)]) +
                      " is not a decimal byte count");
    }
    if (!parse_unsigned(cells[static_cast<std::size_t>(columns.stream)], 16, &stream)) {
      input_error(path, line_number,
                  "Stream " + shown(cells[static_cast<std::size_t>(columns.stream)]) +
                      " is not 0x and hex digits");
    }
    if (columns.device >= 0 &&
        (!parse_unsigned(cells[static_cast<std::size_t>(columns.device)], 10, &row_device) ||
         row_device > 1024)) {
      input_error(path, line_number,
                  "Device " + shown(cells[static_cast<std::size_t>(columns.device)]) +
                      " is not a device ordinal");
    }
    ++counts.rows;
    if (replay == nullptr) {
      if (device < 0) device = static_cast<int>(row_device);
      int device_count = 0;
      cudaError_t e = cudaGetDeviceCount(&device_count);
      if (e == cudaSuccess && device >= device_count) e = cudaErrorInvalidDevice;
      if (e == cudaSuccess) e = cudaSetDevice(device);
      if (e != cudaSuccess) {
        std::fprintf(stderr, "%s: cannot replay on device %d: %s (%d devices)\n", g_label.c_str(),
                     device, cudaGetErrorName(e), device_count);
        return 1;
      }
      replay = std::make_unique<Replay>(counts);
    }
    if (static_cast<int>(row_device) != device) {
      ++counts.other_device;
    } else if (action == "allocate failure") {
      ++counts.recorded_failures;
    } else if (action == "allocate") {
      replay->allocate(pointer, size, stream);
    } else {
      replay->free(pointer, stream);
    }
    if (progress != 0 && counts.rows % progress == 0) {
      std::fprintf(stderr, "%s: %" PRIu64 " rows replayed\n", g_label.c_str(), counts.rows);
    }
  }
  if (std::ferror(in)) {
    std::fprintf(stderr, "%s: %s: cannot read: %s\n", g_label.c_str(), path.c_str(),
                 std::strerror(errno));
    return 2;
  }
  std::fclose(in);
  std::free(buffer);
  if (replay != nullptr) cudaDeviceSynchronize();  // the last asynchronous frees done
  const auto wall_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();

  std::string out = "{";
  char buf[1024];
  std::snprintf(
      buf, sizeof buf,
      "\"device\": %s, \"rows\": %" PRIu64 ", \"allocations\": %" PRIu64 ", \"frees\": %" PRIu64
      ", \"recorded_failures_skipped\": %" PRIu64 ", \"other_device_rows_skipped\": %" PRIu64
      ", \"unknown_frees\": %" PRIu64 ", \"missing_frees\": %" PRIu64
      ", \"streams\": %zu"
      ", \"replay_alloc_failures\": %" PRIu64 ", \"replay_free_failures\": %" PRIu64
      ", \"frees_of_failed_allocations\": %" PRIu64 ", \"live_bytes_peak\": %" PRIu64
      ", \"live_bytes_at_end\": %" PRIu64 ", \"wall_ns\": %lld, ",
      device < 0 ? "null" : std::to_string(device).c_str(), counts.rows, counts.allocations,
      counts.frees, counts.recorded_failures, counts.other_device, counts.unknown_frees,
      counts.missing_frees, replay != nullptr ? replay->streams() : std::size_t{0},
      counts.replay_alloc_failures, counts.replay_free_failures, counts.frees_of_failed,
      counts.live_bytes_peak, counts.live_bytes, static_cast<long long>(wall_ns));
  out += buf;
  Timings none;
  json_timings(out, "alloc", replay != nullptr ? replay->alloc_ns : none);
  out += ", ";
  json_timings(out, "free", replay != nullptr ? replay->free_ns : none);
  out += ", \"first_error\": ";
  if (counts.first_error.empty()) {
    out += "null";
  } else {
    json_string(out, counts.first_error);
  }
  out += "}\n";
  std::fputs(out.c_str(), stdout);
  return 0;
}
