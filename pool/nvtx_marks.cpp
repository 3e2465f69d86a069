#include "nvtx_marks.h"

// The toolkit's headers may warn under -Wextra; they are not ours to change.
#define NVTX_AS_SYSTEM_HEADER
#include <nvtx3/nvToolsExt.h>

#include <string>

#include "units.h"

namespace poolshim::nvtx_marks {
namespace {

// Categories of the domain (nvtxDomainNameCategoryA), each with its color (ARGB).
enum Category : std::uint32_t { kOom = 1, kTrim = 2, kFence = 3, kWait = 4 };
constexpr std::uint32_t kColors[] = {0, 0xFFD32F2F, 0xFF388E3C, 0xFFF9A825, 0xFF1976D2};
constexpr const char* kCategoryNames[] = {"", "out of memory", "trim", "fence", "wait"};

constexpr const char* kWaitNames[] = {
    "fence: synchronizing cudaFree", "fence: free memory waits for a fence",
    "fence: out-of-memory retry",    "fence: idle trim",
    "fence: legacy stream handout",  "wait: free on another context's stream",
    "wait: oom record written",
};
constexpr int kWaits = static_cast<int>(sizeof kWaitNames / sizeof kWaitNames[0]);
static_assert(kWaits == static_cast<int>(Wait::oom_record) + 1, "a name for each Wait");

constexpr const char* kTrimNames[] = {"trim: idle", "trim: out-of-memory retry",
                                      "trim: out of memory"};
constexpr int kTrims = static_cast<int>(sizeof kTrimNames / sizeof kTrimNames[0]);
static_assert(kTrims == static_cast<int>(Trim::oom) + 1, "a name for each Trim");

struct Marks {
  nvtxDomainHandle_t domain = nullptr;  // null: no tool attached
  nvtxStringHandle_t waits[kWaits] = {};
  nvtxStringHandle_t trims[kTrims] = {};
};

Marks make_marks() {
  Marks m;
  // NVTX's first call: with NVTX_INJECTION64_PATH unset it loads nothing and returns null.
  m.domain = nvtxDomainCreateA("poolshim");
  if (m.domain == nullptr) return m;
  for (std::uint32_t c = kOom; c <= kWait; ++c) {
    nvtxDomainNameCategoryA(m.domain, c, kCategoryNames[c]);
  }
  for (int i = 0; i < kWaits; ++i) m.waits[i] = nvtxDomainRegisterStringA(m.domain, kWaitNames[i]);
  for (int i = 0; i < kTrims; ++i) m.trims[i] = nvtxDomainRegisterStringA(m.domain, kTrimNames[i]);
  return m;
}

const Marks& marks() {
  static const Marks m = make_marks();
  return m;
}

nvtxEventAttributes_t attributes(Category category) {
  nvtxEventAttributes_t a = {};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.category = category;
  a.colorType = NVTX_COLOR_ARGB;
  a.color = kColors[category];
  return a;
}

// A registered message, a 32-bit payload.
nvtxEventAttributes_t registered(Category category, nvtxStringHandle_t message, int value) {
  nvtxEventAttributes_t a = attributes(category);
  a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  a.message.registered = message;
  a.payloadType = NVTX_PAYLOAD_TYPE_INT32;
  a.payload.iValue = value;
  return a;
}

// An ASCII message, a byte count as the payload.
void mark(Category category, const std::string& text, std::uint64_t bytes) {
  nvtxEventAttributes_t a = attributes(category);
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = text.c_str();
  a.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
  a.payload.ullValue = bytes;
  nvtxDomainMarkEx(marks().domain, &a);
}

std::string figure(std::uint64_t bytes) {
  return std::to_string(bytes) + " bytes (" + format_bytes(bytes) + ")";
}

}  // namespace

void start() {
  marks();
}

bool active() {
  return marks().domain != nullptr;
}

void mark_oom(int device, std::uint64_t bytes, const char* verdict) {
  if (!active()) return;
  mark(kOom,
       "out of memory: device " + std::to_string(device) + ", " + figure(bytes) +
           " requested, verdict " + verdict,
       bytes);
}

std::uint64_t trim(Trim why, int device, FunctionRef<std::uint64_t()> trim) {
  if (!active()) return trim();
  const Marks& m = marks();
  const int i = static_cast<int>(why);
  const nvtxEventAttributes_t a = registered(kTrim, m.trims[i], device);
  nvtxDomainRangePushEx(m.domain, &a);
  const std::uint64_t released = trim();
  nvtxDomainRangePop(m.domain);
  mark(kTrim,
       std::string(kTrimNames[i]) + ": device " + std::to_string(device) + ", " + figure(released) +
           " released",
       released);
  return released;
}

void mark_cache_return(int device, std::uint64_t bytes) {
  if (!active()) return;
  mark(kTrim, "cache return: device " + std::to_string(device) + ", " + figure(bytes), bytes);
}

WaitRange::WaitRange(Wait why, int device) {
  if (!active()) return;
  const Marks& m = marks();
  const Category category = why < Wait::foreign_stream ? kFence : kWait;
  const nvtxEventAttributes_t a = registered(category, m.waits[static_cast<int>(why)], device);
  nvtxDomainRangePushEx(m.domain, &a);
  pushed_ = true;
}

WaitRange::~WaitRange() {
  if (pushed_) nvtxDomainRangePop(marks().domain);
}

}  // namespace poolshim::nvtx_marks
