// POOLSHIM_PROM_FILE: the per-device figures in the Prometheus text exposition format, for
// node_exporter's textfile collector. Rewritten whole at each sample (write to a temporary
// file in the same folder, then rename): a scraper never reads half a file. No listener.
#pragma once

#include <string>
#include <vector>

#include "records.h"
#include "router.h"

namespace poolshim {

/// The exposition text for these devices, labelled with the process.
std::string prometheus_text(const std::vector<DeviceSnapshot>& devices, const ProcessInfo& info);

/// Writes `text` to `path` atomically. Empty string on success, else why.
std::string write_file_atomically(const std::string& path, const std::string& text);

}  // namespace poolshim
