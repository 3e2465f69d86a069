// POOLSHIM_PROM_FILE: the per-device figures in the Prometheus text exposition format, for
// node_exporter's textfile collector. Rewritten whole at each sample (write to a temporary
// file in the same folder, then rename): a scraper never reads half a file, and removed at
// exit, after the last write, so that a finished process leaves no stale figures. No listener.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

#include "records.h"
#include "router.h"

namespace poolshim {

/// The exposition text for these devices: every series labelled host, rank and device (stable
/// across restarts), and one poolshim_info series with the pid, version and `mode`.
std::string prometheus_text(const std::vector<DeviceSnapshot>& devices, const ProcessInfo& info,
                            std::string_view mode);

/// Which file a path named when it was written: a later removal takes only that one.
struct FileIdentity {
  bool valid = false;
  dev_t device = 0;
  ino_t inode = 0;
};

/// Writes `text` to `path` atomically. Empty string on success, else why. On success
/// `*written` (when given) identifies the file now at `path`.
std::string write_file_atomically(const std::string& path, const std::string& text,
                                  FileIdentity* written = nullptr);

/// Removes `path` if it is still the regular file `written` identifies. A path that is gone or
/// now names another file (replaced by someone else) is left as it is: empty string. Else why
/// the removal failed (nothing else happens: the file stays).
std::string remove_file_if_ours(const std::string& path, const FileIdentity& written);

}  // namespace poolshim
