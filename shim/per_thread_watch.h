// Seeing the per-thread default stream in use (DESIGN §7, the legacy rule): the first call on it
// ends the legacy rule's barrier-free case. CUDA 13's runtime looks up the per-thread variants
// of its stream functions at start in every program, so a lookup proves nothing; a call does:
// of a per-thread variant (`_ptsz`/`_ptds`), or of a legacy variant naming CU_STREAM_PER_THREAD
// as its stream. Such functions, handed out by the cuGetProcAddress and dlsym hooks or called
// by name (libpoolshim exports libcuda's names for them), go through watching thunks
// (per_thread_watch.S) that mark the process before the first such call reaches the driver.
#pragma once

namespace poolshim::shim {

/// What stands for a driver function: `watched` (`answer` is a thunk), `not_watched` (no stream
/// to watch; `answer` is the function), `exhausted` (no thunk left: the caller must mark the
/// process at once, as if the stream were used).
struct Watch {
  enum Status { watched, not_watched, exhausted } status;
  void* answer;
};

/// A thunk behaving as `real`, the per-thread variant of driver function `symbol` (a base name)
/// that libcuda handed out, that marks the process at its first call: the named thunk of
/// libcuda's export, else a slot, the same one for the same `real`. Null when no slot is left.
void* per_thread_watch(const char* symbol, void* real);

/// For `real`, the variant of driver function `symbol` (a base name, as cuGetProcAddress takes)
/// that libcuda handed out for the legacy stream: a thunk that marks the process at a call whose
/// stream is CU_STREAM_PER_THREAD, when `symbol` takes a stream.
Watch legacy_stream_watch(const char* symbol, void* real);

/// Whether libcuda's export `name` has a named thunk.
bool watched_name(const char* name);
/// For `real`, libcuda's export `name` found by dlsym: its named thunk, when it is watched.
Watch watch_by_name(const char* name, void* real);

}  // namespace poolshim::shim
