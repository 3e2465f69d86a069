// What the library itself says at exit on stderr (README "Options": verbose, summary), for plain
// LD_PRELOAD use without the launcher: the log's path (POOLSHIM_VERBOSE=1) and a short summary
// of the run (POOLSHIM_SUMMARY=1), as mimalloc's MIMALLOC_SHOW_STATS does. Made from the same
// figures as the exit record, after it is written, on the background thread: never in a hook.
#pragma once

#include <string>
#include <vector>

#include "records.h"

namespace poolshim {

/// Where the run's log went: "log PATH", "no log written (PATH could not be opened)" or
/// "log disabled (POOLSHIM_LOG is empty)". `written`: the log was open to the end.
std::string exit_log_line(const std::string& log_path, bool written);

/// The summary's lines (print_stderr puts "poolshim: " before each), e.g.
///   summary of pid 42, log run-42.jsonl
///     device 0: 71 allocations pooled (0 async), 70 freed; 0 allocations and 0 frees passed
///     through
///       peak reserved 64.0 MiB, peak used 23.0 MiB, peak requested 19.0 MiB
///       out of memory: 0 (0 with enough unused pool memory), 0 retried after a trim (0 succeeded)
///     leaks at exit: 1 allocation, 3.0 MiB
/// In observe mode a device's lines count tracked allocations instead.
std::vector<std::string> exit_summary_lines(int pid, const std::string& log_path, bool written,
                                            const ExitSummary& summary);

}  // namespace poolshim
