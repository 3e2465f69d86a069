// Replays an allocation trace through the heap over a stand-in segment source and prints what
// the heap would reserve against the trace's live bytes: the figure issue 13's footprint turns
// on, found without a GPU. The trace is a CSV of `action,address,size,stream` lines in host
// order, actions `alloc` and `free_requested` (others are skipped): what PyTorch's memory
// history records (tests/perf/alloc_trace.py writes one from the GPT-2 loop on a GPU;
// docs/measurements/2026-12-03-gpt2-alloc-trace.csv.gz is one, gunzipped).
//
//     heap_replay [--page MIB] [--slack MIB] [--unfenced 1] TRACE.csv
//
// --page: large blocks in paged arenas (page_map.h) with pages of MIB (0: segments, the
// default); --slack: the mapped bytes an arena may hold beyond its blocks (default 64).
//
// Every free is ready at once (the sync free mode, or stream 0 alone), so the figure is the
// heap's fragmentation alone; with --unfenced 1 no free's fence ever completes, so a freed block
// serves only its own stream (a non-blocking stream's frees between fences).
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>

#include "device_heap.h"

namespace {

using poolshim::DeviceHeap;

struct PeakSource : poolshim::SegmentSource {
  CUdeviceptr next = 0x10000000;
  std::uint64_t held = 0, peak = 0, reserves = 0;
  bool reserve(std::uint64_t bytes, CUdeviceptr* out, CUresult*) override {
    *out = next;
    next +=
        (bytes + (std::uint64_t{4} << 20)) / (std::uint64_t{2} << 20) * (std::uint64_t{2} << 20);
    held += bytes;
    ++reserves;
    if (held > peak) peak = held;
    return true;
  }
  void release(CUdeviceptr, std::uint64_t bytes) override { held -= bytes; }
};

// Physical pages counted: what is held (created, not destroyed) and its peak, and the calls.
struct CountingPhysical : poolshim::PhysicalMemory {
  CUdeviceptr next_va = 0x7f0000000000;
  std::uint64_t held = 0, peak = 0, maps = 0, unmaps = 0, creates = 0;
  CUmemGenericAllocationHandle next = 1;
  CUresult reserve(std::uint64_t bytes, CUdeviceptr* out) override {
    *out = next_va;
    next_va += bytes;
    return CUDA_SUCCESS;
  }
  void unreserve(CUdeviceptr, std::uint64_t) override {}
  CUresult create(std::uint64_t bytes, CUmemGenericAllocationHandle* out) override {
    held += bytes;
    ++creates;
    if (held > peak) peak = held;
    *out = next++;
    return CUDA_SUCCESS;
  }
  void destroy(CUmemGenericAllocationHandle, std::uint64_t bytes) override { held -= bytes; }
  CUresult map(CUdeviceptr, std::uint64_t, CUmemGenericAllocationHandle) override {
    ++maps;
    return CUDA_SUCCESS;
  }
  void unmap(CUdeviceptr, std::uint64_t) override { ++unmaps; }
};

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t page_mib = 0, slack_mib = 64;
  bool unfenced = false;
  int arg = 1;
  for (; arg + 1 < argc && argv[arg][0] == '-'; arg += 2) {
    if (std::strcmp(argv[arg], "--page") == 0) {
      page_mib = std::strtoull(argv[arg + 1], nullptr, 10);
    } else if (std::strcmp(argv[arg], "--slack") == 0) {
      slack_mib = std::strtoull(argv[arg + 1], nullptr, 10);
    } else if (std::strcmp(argv[arg], "--unfenced") == 0) {
      unfenced = std::strcmp(argv[arg + 1], "0") != 0;
    } else {
      break;
    }
  }
  if (arg + 1 != argc || argv[arg][0] == '-') {
    std::fprintf(stderr,
                 "usage: heap_replay [--page MIB] [--slack MIB] [--unfenced 1] TRACE.csv\n");
    return 2;
  }
  std::FILE* f = std::fopen(argv[arg], "r");
  if (f == nullptr) {
    std::perror(argv[arg]);
    return 2;
  }
  PeakSource source;
  CountingPhysical physical;
  DeviceHeap::Paging paging;
  if (page_mib > 0) {
    paging.physical = &physical;
    paging.page = page_mib << 20;
    paging.span = std::uint64_t{1} << 40;
    paging.slack = slack_mib << 20;
  }
  DeviceHeap heap(source, paging);
  std::unordered_map<std::uint64_t, DeviceHeap::Block> live;
  std::uint64_t live_bytes = 0, live_peak = 0, allocs = 0, lines = 0;
  char action[32];
  unsigned long long addr = 0, size = 0, stream = 0;
  const std::uint64_t completed = unfenced ? 0 : ~0ULL;
  while (std::fscanf(f, "%31[^,],%llu,%llu,%llu\n", action, &addr, &size, &stream) == 4) {
    ++lines;
    const std::uintptr_t token = stream == 0 ? 1 : stream;
    if (std::strcmp(action, "alloc") == 0) {
      DeviceHeap::Block b;
      CUresult why = CUDA_SUCCESS;
      if (!heap.allocate_from_free(size, token, completed, &b) &&
          !heap.allocate(size, token, completed, &b, &why)) {
        std::fprintf(stderr, "line %" PRIu64 ": allocation failed\n", lines);
        return 1;
      }
      live[addr] = b;
      live_bytes += size;
      if (live_bytes > live_peak) live_peak = live_bytes;
      ++allocs;
    } else if (std::strcmp(action, "free_requested") == 0) {
      auto it = live.find(addr);
      if (it == live.end()) continue;
      heap.free(it->second.arena, it->second.node, it->second.size, token, unfenced ? 1 : 0,
                completed);
      live_bytes -= size;
      live.erase(it);
    }
  }
  std::fclose(f);
  // Segments and pages are held at once: their peaks added bound the peak of the sum.
  const std::uint64_t peak = source.peak + physical.peak;
  std::printf("allocations %" PRIu64
              " live_peak_mib %.1f reserved_peak_mib %.1f ratio %.3f"
              " segments %" PRIu64 " segment_peak_mib %.1f page_peak_mib %.1f maps %" PRIu64
              " unmaps %" PRIu64 " creates %" PRIu64 "\n",
              allocs, live_peak / 1048576.0, peak / 1048576.0,
              static_cast<double>(peak) / live_peak, source.reserves, source.peak / 1048576.0,
              physical.peak / 1048576.0, physical.maps, physical.unmaps, physical.creates);
  return 0;
}
