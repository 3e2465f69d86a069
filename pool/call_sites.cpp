#include "call_sites.h"

#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <unwind.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace poolshim {

namespace {

std::uint64_t hash_frames(const std::uintptr_t* frames, int depth) {
  std::uint64_t h = 0xcbf29ce484222325ULL ^ static_cast<std::uint64_t>(depth);
  for (int i = 0; i < depth; ++i) {
    h ^= static_cast<std::uint64_t>(frames[i]);
    h *= 0x100000001b3ULL;
    h ^= h >> 29;
  }
  return h == 0 ? 1 : h;  // 0 marks a free slot
}

constexpr int kMaxProbes = 64;

}  // namespace

CallSiteTable::CallSiteTable(std::size_t capacity) : capacity_(capacity) {
  void* p = mmap(nullptr, capacity_ * sizeof(Slot), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    capacity_ = 0;  // every site becomes "unknown": reports lose call sites, nothing else
    return;
  }
  slots_ = static_cast<Slot*>(p);  // zero pages: every slot free
}

CallSiteTable::~CallSiteTable() {
  if (slots_ != nullptr) munmap(slots_, capacity_ * sizeof(Slot));
}

std::uint32_t CallSiteTable::intern(const std::uintptr_t* frames, int depth) {
  if (depth <= 0 || capacity_ == 0) return 0;
  if (depth > kMaxCallSiteFrames) depth = kMaxCallSiteFrames;
  const std::uint64_t h = hash_frames(frames, depth);
  const std::size_t mask = capacity_ - 1;
  for (int probe = 0; probe < kMaxProbes; ++probe) {
    const std::size_t i = (h + static_cast<std::uint64_t>(probe)) & mask;
    Slot& s = slots_[i];
    std::uint64_t seen = s.hash.load(std::memory_order_acquire);
    if (seen == 0) {
      if (s.hash.compare_exchange_strong(seen, h, std::memory_order_acq_rel)) {
        s.depth = depth;
        std::memcpy(s.frames, frames, sizeof(std::uintptr_t) * static_cast<std::size_t>(depth));
        s.ready.store(true, std::memory_order_release);
        return static_cast<std::uint32_t>(i + 1);
      }
      // Another thread claimed it: `seen` now holds its hash; look at it below.
    }
    if (seen == h) {
      // The same hash: wait (briefly) for the claimer to publish, then compare the frames.
      while (!s.ready.load(std::memory_order_acquire)) {
      }
      if (s.depth == depth &&
          std::memcmp(s.frames, frames, sizeof(std::uintptr_t) * static_cast<std::size_t>(depth)) ==
              0) {
        return static_cast<std::uint32_t>(i + 1);
      }
    }
  }
  overflowed_.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

std::vector<std::uintptr_t> CallSiteTable::frames(std::uint32_t id) const {
  if (id == 0 || id > capacity_) return {};
  const Slot& s = slots_[id - 1];
  if (!s.ready.load(std::memory_order_acquire)) return {};
  return std::vector<std::uintptr_t>(s.frames, s.frames + s.depth);
}

namespace {

constexpr int kMaxWalk = kMaxCallSiteFrames + 16;  // frames walked at most, frame 0 included
constexpr int kWays = 4;
constexpr int kSets = kSiteCacheEntries / kWays;
static_assert(kSets > 0 && (kSets & (kSets - 1)) == 0, "a power of two of sets");

// One walk of _Unwind_Backtrace. The callback sees frame k with IP_k (_Unwind_GetIP: the
// return address into the k-th function, k = 0 being the function that called
// _Unwind_Backtrace) and CFA_k (_Unwind_GetCFA: the CFA of the frame that returns to IP_k,
// so IP_k lies at CFA_k - 8 on x86-64), as glibc's backtrace() sees them.
struct Walk {
  std::uintptr_t* out;
  int max_frames;  // application frames wanted
  int limit;       // frames walked at most, frame 0 included (backtrace's `size` before)
  std::uintptr_t skip_begin;
  std::uintptr_t skip_end;
  int seen = 0;    // frames walked
  int stored = 0;  // frames written to `out`
  bool skipping = true;
  bool stopped = false;       // the callback ended the walk
  bool signal_frame = false;  // a frame's IP was not a return address
  std::uintptr_t prev_ip = 0;
  std::uintptr_t prev_cfa = 0;
  // When recording (capture_site), for every frame k walked: slot[k] and value[k] (the return
  // address slot and what it held; k = 0 is capture_site's own, not checked) and rbp[k], the
  // frame pointer register in function k at its call.
  std::uintptr_t* slot = nullptr;
  std::uintptr_t* value = nullptr;
  std::uintptr_t* rbp = nullptr;

  Walk(std::uintptr_t* frames, int max, std::uintptr_t begin, std::uintptr_t end)
      : out(frames), max_frames(max), limit(max + 16), skip_begin(begin), skip_end(end) {}
};

_Unwind_Reason_Code on_frame(_Unwind_Context* context, void* arg) {
  Walk& w = *static_cast<Walk*>(arg);
  int before_insn = 0;
  const auto ip = static_cast<std::uintptr_t>(_Unwind_GetIPInfo(context, &before_insn));
  const auto cfa = static_cast<std::uintptr_t>(_Unwind_GetCFA(context));
  const int k = w.seen++;
  if (before_insn != 0) w.signal_frame = true;
  if (w.slot != nullptr) {
    w.slot[k] = cfa - sizeof(std::uintptr_t);
    w.value[k] = ip;
    w.rbp[k] = static_cast<std::uintptr_t>(_Unwind_GetGR(context, 6));  // DWARF 6: rbp
  }
  // backtrace()'s ends: a null return address (the outermost frame, dropped), or no progress.
  if (ip == 0 || (k > 0 && ip == w.prev_ip && cfa == w.prev_cfa)) {
    w.stopped = true;
    return _URC_END_OF_STACK;
  }
  w.prev_ip = ip;
  w.prev_cfa = cfa;
  // Frame 0 is the capturing function; then the shim's frames up to the application's call.
  if (k > 0 && !(w.skipping && ip >= w.skip_begin && ip < w.skip_end)) {
    w.skipping = false;
    w.out[w.stored++] = ip;
  }
  if (w.stored == w.max_frames || w.seen == w.limit) {
    w.stopped = true;
    return _URC_END_OF_STACK;
  }
  return _URC_NO_REASON;
}

// ---- the per-thread cache of verified call chains (see capture_site in the header) ----------

struct Entry {
  std::uintptr_t key;  // capture_site's frame address; 0 = empty
  const CallSiteTable* table;
  std::uintptr_t skip_begin;
  std::uintptr_t skip_end;
  std::int32_t max_frames;
  std::uint32_t id;
  std::uint32_t count;  // slots to check
  // Return-address slots, then frame-pointer copies (see remember): at most two per frame.
  std::uint32_t offset[2 * kMaxWalk];     // slot address - key
  std::uintptr_t expected[2 * kMaxWalk];  // what the slot held
};

struct ThreadCache {
  std::uintptr_t stack_lo;  // the thread's stack, [lo, hi)
  std::uintptr_t stack_hi;
  std::uint32_t busy;  // a capture is using the entries (a signal handler's capture unwinds)
  std::uint32_t next_way[kSets];
  Entry entries[kSets][kWays];
};

// Initial-exec: no __tls_get_addr (and no allocation in it) on the hot path.
__thread ThreadCache* t_cache __attribute__((tls_model("initial-exec"))) = nullptr;
__thread bool t_no_cache __attribute__((tls_model("initial-exec"))) = false;
__thread std::uint64_t t_hits __attribute__((tls_model("initial-exec"))) = 0;
__thread std::uint64_t t_unwinds __attribute__((tls_model("initial-exec"))) = 0;

// ---- the first capture of a thread: nothing that is not async-signal-safe --------------------
// A hook may run in a signal handler, and a thread's first capture may be that one (issue 12):
// it must neither allocate nor take a lock. pthread_getattr_np does both (it reads
// /proc/self/maps with stdio on the main thread and reallocates a CPU set on every thread),
// and so does registering a thread_local destructor (__cxa_thread_atexit_impl calls calloc).
// So the stack's bounds come from /proc/self/maps read with open/read into a buffer on the
// stack, and the block is released at thread exit by a pthread key made at load time.

// Finds in /proc/self/maps the main thread's stack ("[stack]", when `address` is 0) or the
// mapping that holds `address`: [*lo, *hi). Only async-signal-safe calls; false if not found.
bool find_mapping(std::uintptr_t address, std::uintptr_t* lo, std::uintptr_t* hi) {
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  // A line: "lo-hi perms offset dev inode   path". Parsed byte by byte: addresses in hex,
  // then the last 8 bytes of the line, to recognize the "[stack]" path.
  enum { kLo, kHi, kRest } state = kLo;
  std::uintptr_t line_lo = 0;
  std::uintptr_t line_hi = 0;
  char tail[8] = {};
  bool found = false;
  char buffer[4096];
  while (!found) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n && !found; ++i) {
      const char c = buffer[i];
      if (c == '\n') {
        const bool main_stack = std::memcmp(tail + 1, "[stack]", 7) == 0;
        if (address == 0 ? main_stack : address >= line_lo && address < line_hi) {
          *lo = line_lo;
          *hi = line_hi;
          found = true;
        }
        state = kLo;
        line_lo = line_hi = 0;
        std::memset(tail, 0, sizeof tail);
        continue;
      }
      std::memmove(tail, tail + 1, sizeof tail - 1);
      tail[sizeof tail - 1] = c;
      const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (state == kLo) {
        if (digit >= 0) {
          line_lo = line_lo * 16 + static_cast<std::uintptr_t>(digit);
        } else {
          state = c == '-' ? kHi : kRest;
        }
      } else if (state == kHi) {
        if (digit >= 0) {
          line_hi = line_hi * 16 + static_cast<std::uintptr_t>(digit);
        } else {
          state = kRest;
        }
      }
    }
  }
  ::close(fd);
  return found;
}

// The calling thread's own stack, wherever it runs now (a capture may come from a fiber's
// stack): the main thread's is "[stack]", as deep as RLIMIT_STACK lets it grow (what
// pthread_getattr_np reported); any other thread's is the mapping that holds its thread
// descriptor, which glibc places at the top of the thread's stack.
bool thread_stack(std::uintptr_t* lo, std::uintptr_t* hi) {
  if (::getpid() != static_cast<pid_t>(::syscall(SYS_gettid))) {
    return find_mapping(static_cast<std::uintptr_t>(pthread_self()), lo, hi);
  }
  if (!find_mapping(0, lo, hi)) return false;
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_STACK, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
      limit.rlim_cur < *hi && *hi - limit.rlim_cur < *lo) {
    *lo = *hi - limit.rlim_cur;
  }
  return true;
}

void release_thread_cache(void* block) {
  t_cache = nullptr;
  t_no_cache = true;  // captures later in this thread's exit unwind
  munmap(block, sizeof(ThreadCache));
}

// Made at load time, before any hook can run. glibc keeps the values of keys below 32
// (PTHREAD_KEY_2NDLEVEL_SIZE) in the thread descriptor itself: pthread_setspecific of such a
// key neither allocates nor locks. A higher key could allocate: then no thread caches chains.
struct ThreadExitKey {
  pthread_key_t key{};
  bool usable = false;
  ThreadExitKey() {
    usable = pthread_key_create(&key, &release_thread_cache) == 0 &&
             static_cast<unsigned long>(key) < 32;
  }
};
const ThreadExitKey g_thread_exit;

// Once per thread, on its first capture_site: a block for its cache, released at thread exit.
__attribute__((noinline, cold)) ThreadCache* open_thread_cache() {
  t_no_cache = true;  // until it is ready (a capture from a signal handler meanwhile unwinds)
  std::uintptr_t lo = 0;
  std::uintptr_t hi = 0;
  if (!g_thread_exit.usable || !thread_stack(&lo, &hi)) return nullptr;
  void* p = mmap(nullptr, sizeof(ThreadCache), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  if (p == MAP_FAILED) return nullptr;  // every capture of this thread unwinds
  if (pthread_setspecific(g_thread_exit.key, p) != 0) {
    munmap(p, sizeof(ThreadCache));
    return nullptr;
  }
  auto* cache = static_cast<ThreadCache*>(p);  // zero pages: every entry empty
  cache->stack_lo = lo;
  cache->stack_hi = hi;
  t_cache = cache;
  t_no_cache = false;
  return cache;
}

inline std::uint32_t set_of(std::uintptr_t key) {
  return static_cast<std::uint32_t>((static_cast<std::uint64_t>(key) * 0x9e3779b97f4a7c15ULL) >>
                                    60) &
         (kSets - 1);
}

// still_holds and remember read stack words of the caller's frames by design (return-address
// slots, saved frame pointers, and a stale slot in a realigned frame's alignment gap that
// AddressSanitizer keeps poisoned as a redzone): those reads are not instrumented.
#define POOLSHIM_RAW_STACK_READS __attribute__((no_sanitize("address", "hwaddress")))

POOLSHIM_RAW_STACK_READS inline bool still_holds(const Entry& e, std::uintptr_t key) {
  for (std::uint32_t i = 0; i < e.count; ++i) {
    if (*reinterpret_cast<const std::uintptr_t*>(key + e.offset[i]) != e.expected[i]) return false;
  }
  return true;
}

// Keeps the chain just walked, when every slot lies in the thread's stack above `key` and holds
// what the unwinder reported.
POOLSHIM_RAW_STACK_READS void remember(ThreadCache& cache, std::uintptr_t key,
                                       const CallSiteTable* table, int max_frames,
                                       std::uintptr_t skip_begin, std::uintptr_t skip_end,
                                       const Walk& w, std::uint32_t id) {
  const std::uint32_t set = set_of(key);
  // Round robin: up to kWays chains filled one after another in a set all stay.
  Entry* victim = &cache.entries[set][cache.next_way[set]++ % kWays];
  victim->key = 0;
  std::uint32_t count = 0;
  for (int k = 1; k < w.seen; ++k) {
    const std::uintptr_t slot = w.slot[k];
    if (slot <= key || slot - key > 0xffffffffu || slot > cache.stack_hi - sizeof(std::uintptr_t))
      return;
    if (*reinterpret_cast<const std::uintptr_t*>(slot) != w.value[k]) {
      // The outermost frame (_start, clone3) leaves its return address undefined in its CFI:
      // the unwinder reports 0 without reading the slot, as the previous frame's IP (checked)
      // decides. Anything else the slot does not hold: the chain is not kept.
      if (w.value[k] == 0 && k == w.seen - 1) continue;
      return;
    }
    victim->offset[count] = static_cast<std::uint32_t>(slot - key);
    victim->expected[count] = w.value[k];
    ++count;
  }
  if (count == 0) return;
  // A function whose frame is addressed by its frame pointer (CFA = rbp + 16: alloca, VLAs,
  // stack realignment, or code built with frame pointers) can sit at another address while
  // everything inside it stays put, so that its old return-address slot (checked above) may
  // hold stale data. Its frame pointer's value is its position, and the innermost function
  // inside it that changed rbp saved that value in its prologue, a slot written at every call
  // (a leftover copy elsewhere could be stale: a review showed one defeat the check). A hit
  // must find that copy unchanged too; a chain where it is not found is not kept.
  for (int j = 1; j + 1 < w.seen; ++j) {
    const std::uintptr_t fp = w.rbp[j];
    if (fp != w.slot[j + 1] - sizeof(std::uintptr_t)) continue;  // not addressed by rbp
    int i = j - 1;
    while (i > 0 && w.rbp[i] == fp) --i;  // functions that kept rbp as it was
    if (w.rbp[i] == fp) return;
    std::uintptr_t at = 0;
    if (w.rbp[i] == w.slot[i + 1] - sizeof(std::uintptr_t)) {
      // Function i is addressed by rbp too (capture_site always is): `push rbp; mov rbp, rsp`
      // left the saved value where its rbp points, just below its return address.
      if (*reinterpret_cast<const std::uintptr_t*>(w.rbp[i]) == fp) at = w.rbp[i];
    } else if (i > 0) {
      // It uses rbp as an ordinary register: the prologue pushed it among the callee-saved
      // registers at the top of its frame, just below its return address.
      const std::uintptr_t top = w.slot[i + 1] - sizeof(std::uintptr_t);
      const std::uintptr_t bottom = w.slot[i] + sizeof(std::uintptr_t);
      for (int n = 0; n < 16 && top >= bottom + n * sizeof(std::uintptr_t); ++n) {
        const std::uintptr_t a = top - n * sizeof(std::uintptr_t);
        if (*reinterpret_cast<const std::uintptr_t*>(a) == fp) {
          at = a;
          break;
        }
      }
    }
    if (at < key || at >= cache.stack_hi) return;
    victim->offset[count] = static_cast<std::uint32_t>(at - key);
    victim->expected[count] = fp;
    ++count;
  }
  victim->table = table;
  victim->skip_begin = skip_begin;
  victim->skip_end = skip_end;
  victim->max_frames = max_frames;
  victim->id = id;
  victim->count = count;
  victim->key = key;
}

}  // namespace

__attribute__((noinline, noclone)) int capture_frames(std::uintptr_t* out, int max_frames,
                                                      std::uintptr_t skip_begin,
                                                      std::uintptr_t skip_end) {
  if (max_frames <= 0) return 0;
  if (max_frames > kMaxCallSiteFrames) max_frames = kMaxCallSiteFrames;
  Walk w(out, max_frames, skip_begin, skip_end);
  _Unwind_Backtrace(&on_frame, &w);
  return w.stored;
}

__attribute__((noinline, noclone)) std::uint32_t capture_site(CallSiteTable& table, int max_frames,
                                                              std::uintptr_t skip_begin,
                                                              std::uintptr_t skip_end) {
  if (max_frames <= 0) return 0;
  if (max_frames > kMaxCallSiteFrames) max_frames = kMaxCallSiteFrames;
  // The key: this frame's address, the same at every call from the same stack depth.
  const auto key = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  ThreadCache* cache = t_cache;
  if (cache == nullptr && !t_no_cache) cache = open_thread_cache();
  if (cache != nullptr && (cache->busy != 0 || key < cache->stack_lo || key >= cache->stack_hi)) {
    cache = nullptr;  // nested in a capture (a signal handler), or on a foreign stack
  }
  if (cache != nullptr) {
    // Busy from here to the end: a capture in a signal handler meanwhile neither reads an entry
    // this one is writing nor rewrites one this one is reading.
    cache->busy = 1;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    for (const Entry& e : cache->entries[set_of(key)]) {
      if (e.key == key && e.table == &table && e.max_frames == max_frames &&
          e.skip_begin == skip_begin && e.skip_end == skip_end && still_holds(e, key)) {
        const std::uint32_t id = e.id;
        std::atomic_signal_fence(std::memory_order_seq_cst);
        cache->busy = 0;
        ++t_hits;
        return id;
      }
    }
  }
  std::uintptr_t frames[kMaxCallSiteFrames];
  std::uintptr_t slot[kMaxWalk];
  std::uintptr_t value[kMaxWalk];
  std::uintptr_t rbp[kMaxWalk];
  Walk w(frames, max_frames, skip_begin, skip_end);
  if (cache != nullptr) {
    w.slot = slot;
    w.value = value;
    w.rbp = rbp;
  }
  const _Unwind_Reason_Code rc = _Unwind_Backtrace(&on_frame, &w);
  ++t_unwinds;
  const std::uint32_t id = table.intern(frames, w.stored);
  if (cache != nullptr) {
    // Not kept: id 0 (the table is full: every such capture counts as overflowed), a walk
    // through a signal frame, one the unwinder ended on an error.
    if (id != 0 && !w.signal_frame && (w.stopped || rc == _URC_END_OF_STACK))
      remember(*cache, key, &table, max_frames, skip_begin, skip_end, w, id);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    cache->busy = 0;
  }
  return id;
}

SiteCacheCounts site_cache_counts() {
  SiteCacheCounts counts;
  counts.hits = t_hits;
  counts.unwinds = t_unwinds;
  return counts;
}

void warm_up_unwinder() {
  void* raw[4];
  backtrace(raw, 4);  // glibc's: dlopens libgcc_s on its first call
  std::uintptr_t frames[4];
  capture_frames(frames, 4, 0, 0);  // _Unwind_Backtrace's first FDE look-ups
}

}  // namespace poolshim
