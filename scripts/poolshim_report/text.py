"""The terminal summary: one section per run, then a merged section when there are several.

By default a section stays within about 40 lines (the longest lists are cut to their first
entries, with a line saying how many more `--full` shows); `full=True` shows everything,
whole call stacks included.
"""

import textwrap

from poolshim_log import for_terminal

from .fmt import (NONE, OBSERVE_LINE, fmt_bytes, fmt_bytes_or_none, fmt_count, fmt_duration, fmt_pct, fmt_seconds,
                  fmt_unix, frame_text, shorten_middle, site_key, site_text, site_texts)
from .model import oom_owners_text, oom_pool_text, verdict_counts_text

WIDTH = 120            # site lines are cut, hints wrapped, to this width unless --full
DEVICES_PER_TABLE = 4  # device columns side by side
SHORT_LIMITS = {"ooms": 3, "leak_sites": 3, "vmm_sites": 3, "warnings": 3, "notes": 2, "merged_sites": 5}


def table(rows, align, indent=2, gap=2):
    """Lines of an aligned table; `align` is a string of "l"/"r", one per column."""
    widths = [0] * len(align)
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in rows:
        cells = [cell.ljust(widths[i]) if align[i] == "l" else cell.rjust(widths[i]) for i, cell in enumerate(row)]
        lines.append((" " * indent + (" " * gap).join(cells)).rstrip())
    return lines


def _cut(text, full, width=WIDTH):
    return text if full else shorten_middle(text, width)


def _more(lines, shown, total, what, indent):
    if total > shown:
        lines.append(" " * indent + f"... {total - shown} more {what} (--full shows all)")


def _share_triple(device, field):
    last, high, mean = device.share(field)
    if last is None and high is None:
        return NONE
    return f"{fmt_pct(last)} / {fmt_pct(high)} / {fmt_pct(mean)}"


def _now_and_peak(device, field):
    """"8.0 MiB (peak 24.0 MiB)", or - when the device has no such figure."""
    last, peak = device.last(field), device.peak(field)
    return NONE if last is None and peak is None else f"{fmt_bytes_or_none(last)} (peak {fmt_bytes_or_none(peak)})"


def device_table(run, full):
    """Rows of figures, one column per device. In observe mode the pool's own figures (reserved,
    used, slack, rounding, fallbacks, retries, trims) are left out: nothing was pooled."""
    devices = list(run.devices.values())
    pool = not run.observe
    pooled = "pooled" if pool else "tracked"
    lines = []
    for first in range(0, len(devices), DEVICES_PER_TABLE):
        chunk = devices[first:first + DEVICES_PER_TABLE]
        rows = [[""] + [f"device {d.device}" for d in chunk]]

        def row(label, fn):
            rows.append([label] + [fn(d) for d in chunk])

        if any(d.has_cap_field for d in devices):
            row("cap", lambda d: fmt_bytes(d.cap) if d.cap is not None else "none")
        if pool:
            row("peak reserved", lambda d: fmt_bytes_or_none(d.peak("reserved_bytes")))
            row("peak used", lambda d: fmt_bytes_or_none(d.peak("used_bytes")))
        row("peak requested", lambda d: fmt_bytes_or_none(d.peak("requested_bytes")))
        if pool:
            row("final reserved", lambda d: fmt_bytes_or_none(d.last("reserved_bytes")))
            row("final used", lambda d: fmt_bytes_or_none(d.last("used_bytes")))
        row("final requested", lambda d: fmt_bytes_or_none(d.last("requested_bytes")))
        if full:
            row("live allocations at the end", lambda d: fmt_count(d.last("live_allocs")))
            row("peak live allocations", lambda d: fmt_count(d.peak("live_allocs")))
        if any(d.has_owners for d in chunk):
            row("memory by owner at the end", lambda d: "")
            for name, field in run.owners:
                row("  " + name, lambda d, f=field: _now_and_peak(d, f))
            if full:
                row("  VMM mapped", lambda d: _now_and_peak(d, "vmm_mapped_bytes"))
                row("  VMM released, still mapped", lambda d: _now_and_peak(d, "vmm_released_mapped_bytes"))
                row("  VMM creates/releases/maps/unmaps", lambda d: " / ".join(
                    fmt_count(d.counter(f"vmm_{c}")) for c in ("creates", "releases", "maps", "unmaps")))
        cache = pool and any(d.has_cache for d in chunk)
        if cache:
            row("cached free blocks", lambda d: _now_and_peak(d, "cached_bytes"))
            row("cache hits", lambda d: d.cache_hits_text())
            if full:
                row("  misses/returns/fences", lambda d: " / ".join(
                    fmt_count(d.counter(f)) for f in ("cache_misses", "cache_returns", "fences")))
        if pool:
            row("pool slack (last/max/mean)", lambda d: _share_triple(d, "pool_slack"))
            if cache:
                row("  cached, reusable at once", lambda d: _share_triple(d, "slack_cached"))
                row("  other (the driver pool's)", lambda d: _share_triple(d, "slack_other"))
            row("rounding waste (last/max/mean)", lambda d: _share_triple(d, "rounding_waste"))
        row(f"allocations {pooled}", lambda d: fmt_count(d.counter("allocs")))
        row("  async", lambda d: fmt_count(d.counter("async_allocs")))
        row("  passed through", lambda d: fmt_count(d.counter("passthrough_allocs")))
        if pool:
            row("  fallback (not pooled)", lambda d: fmt_count(d.counter("fallback_allocs")))
        row("  failed", lambda d: fmt_count(d.counter("failed_allocs")))
        if full:
            row(f"frees {pooled}", lambda d: fmt_count(d.counter("frees")))
            row("  async", lambda d: fmt_count(d.counter("async_frees")))
            row("  ordered", lambda d: fmt_count(d.counter("ordered_frees")))
            row("  passed through", lambda d: fmt_count(d.counter("passthrough_frees")))
            row("application pool allocations", lambda d: fmt_count(d.counter("app_pool_allocs")))
            if pool:
                row("OOM retries (succeeded)", lambda d: f"{fmt_count(d.counter('oom_retries'))} "
                                                        f"({fmt_count(d.counter('oom_retry_successes'))})")
                row("idle trims (bytes)", lambda d: f"{fmt_count(d.counter('idle_trims'))} "
                                                   f"({fmt_bytes_or_none(d.counter('idle_trimmed_bytes'))})")
            row("dropped by device reset", lambda d: fmt_count(d.counter("reset_dropped")))
            row("samples", lambda d: fmt_count(len(d.samples)))
        if lines:
            lines.append("")
        lines.extend(table(rows, "l" + "r" * len(chunk)))
    return lines


HISTOGRAM_COLUMNS = 8   # buckets per row of the size table


def histogram_lines(d):
    """A compact table of one device's live allocations by size (Device.histogram): bucket
    lower bounds over counts, HISTOGRAM_COLUMNS buckets a row; [] without a histogram."""
    row, buckets = d.histogram()
    if not buckets:
        return []
    lines = [f"  live allocations by size on device {d.device} at t={row['t']:.3f} s "
             f"(the most bytes requested, {fmt_bytes_or_none(row.get('requested_bytes'))})"]
    for first in range(0, len(buckets), HISTOGRAM_COLUMNS):
        chunk = buckets[first:first + HISTOGRAM_COLUMNS]
        lines.extend(table([["from"] + [fmt_bytes(size) for size, _ in chunk],
                            ["count"] + [fmt_count(count) for _, count in chunk]], "l" + "r" * len(chunk), indent=4))
    return lines


def gap_lines(run, d):
    """The hint of a device whose reserved bytes are far above its requested ones, wrapped."""
    gap = d.reserve_gap((run.start or {}).get("config"))
    if gap is None:
        return []
    return textwrap.wrap(f"reserved far above requested on device {d.device}: {gap['text']}", WIDTH,
                         initial_indent="  ", subsequent_indent="    ")


def _grouped(allocations):
    """Runs of allocations of the same size, kind, device and call site: [(count, first, ages)]."""
    out = []
    for a in allocations:
        key = (a.get("bytes"), bool(a.get("async")), a.get("device"), site_key(a.get("site")))
        if out and out[-1][0] == key:
            out[-1][1].append(a)
        else:
            out.append((key, [a]))
    return [(len(group), group[0], [g.get("age_s") for g in group]) for _, group in out]


def _age_range(ages):
    ages = [a for a in ages if a is not None]
    if not ages:
        return NONE
    low, high = min(ages), max(ages)
    return f"{low:.1f} s" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}-{high:.1f} s"


def _oom_lines(run, full):
    lines = []
    ooms = run.ooms_sorted
    if not ooms:
        if run.oom_repeats:
            lines.append(f"  out of memory: {fmt_count(run.oom_repeats)} (repeats of situations not in this log)")
        return lines
    counts = {}
    for o in ooms:
        counts[o.get("verdict") or "unknown"] = counts.get(o.get("verdict") or "unknown", 0) + 1
    repeats = run.oom_repeats
    lines.append(f"  out of memory: {len(ooms)} ({verdict_counts_text(counts)})"
                 + (f" + {fmt_count(repeats)} repeats not logged" if repeats else ""))
    shown = ooms if full else ooms[:SHORT_LIMITS["ooms"]]
    rows = []
    details = []
    for o in shown:
        rows.append([f"t={o['t']:.3f} s", f"device {o['device']}", fmt_bytes_or_none(o.get("request_bytes")),
                     o.get("api") or "", o.get("verdict") or "?"])
    row_lines = table(rows, "rlrll", indent=4)
    for o, row_line in zip(shown, row_lines):
        details = [row_line]
        if o.get("hint"):
            wrapped = textwrap.wrap(o["hint"], WIDTH - 12) if not full else [o["hint"]]
            details.append("      hint  " + wrapped[0])
            details.extend("            " + w for w in wrapped[1:])
        if "site" in o:
            if full and o.get("site"):
                details.append("      at    " + frame_text(o["site"][0], short=False))
                details.extend("            " + frame_text(f, short=False) for f in o["site"][1:])
            else:
                details.append("      at    " + site_text(o.get("site"), callers=1, width=None if full else WIDTH - 12))
        owners = oom_owners_text(o)
        if owners:
            details.append("      owner " + owners)
            vmm = o.get("vmm_by_site") or []
            for entry in vmm if full else vmm[:1]:
                details.append(f"      vmm   {fmt_bytes_or_none(entry.get('bytes'))} at "
                               f"{site_text(entry.get('site'), callers=1, width=None if full else WIDTH - 28)}")
        if full:
            pool = oom_pool_text(o)
            details.append(("      pool  " + pool + ", " if pool else "      state ") +
                           f"cap {fmt_bytes(o['cap_bytes']) if o.get('cap_bytes') is not None else 'none'}; device free "
                           f"{fmt_bytes_or_none(o.get('device_free'))} of {fmt_bytes_or_none(o.get('device_total'))}; "
                           f"live {fmt_bytes_or_none(o.get('live_bytes'))} in {fmt_count(o.get('live_allocs'))}")
            for entry in o.get("by_site") or []:
                details.append(f"      live  {fmt_bytes_or_none(entry.get('bytes')):>10} in {fmt_count(entry.get('count')):>4} "
                               f"at {site_text(entry.get('site'), callers=1)}")
            for n, big, ages in _grouped(o.get("largest") or []):
                details.append(f"      large {n:>2} x {fmt_bytes_or_none(big.get('bytes')):>9}, age {_age_range(ages)}"
                               f"{', async' if big.get('async') else ''} at {site_text(big.get('site'), callers=1)}")
            hist = o.get("size_histogram") or {}
            if hist:
                details.append("      sizes " + ", ".join(f">={fmt_bytes(int(k))}: {v}"
                                                          for k, v in sorted(hist.items(), key=lambda kv: int(kv[0]))))
        lines.extend(details)
    _more(lines, len(shown), len(ooms), "out-of-memory errors", 4)
    return lines


def _site_table(sites, columns, figures, full, limit, width):
    """Lines of a table of call-site groups, most first: `figures(group)` gives the cells under
    `columns`, then the call site (cut to `width` unless `full`); `limit` groups unless `full`."""
    shown = sites if full else sites[:limit]
    rows = [columns + ["call site"]]
    texts = site_texts([s.get("site") for s in shown], None if full else width)
    rows += [figures(s) + [t] for s, t in zip(shown, texts)]
    lines = table(rows, "r" * len(columns) + "l", indent=4)
    _more(lines, len(shown), len(sites), "call sites", 4)
    return lines


def _site_stacks(sites):
    """The whole stack of each group's call site (--full)."""
    lines = []
    for s in sites:
        if s.get("site"):
            lines.append(f"    stack of the {fmt_bytes_or_none(s.get('bytes'))} site:")
            lines.extend("      " + frame_text(f, short=False) for f in s["site"])
    return lines


def _leak_lines(run, full):
    leaks = run.leaks
    if leaks is None:
        return []
    if not leaks["count"]:
        return ["  leaks at exit: none"]
    lines = [f"  leaks at exit: {fmt_count(leaks['count'])} allocation{'s' if leaks['count'] != 1 else ''}, "
             f"{fmt_bytes(leaks['bytes'])}"]
    sites = leaks["by_site"] or []
    if sites:
        lines.extend(_site_table(sites, ["bytes", "count"],
                                 lambda s: [fmt_bytes_or_none(s.get("bytes")), fmt_count(s.get("count"))],
                                 full, SHORT_LIMITS["leak_sites"], WIDTH - 20))
    elif leaks["largest"]:
        big = leaks["largest"][0]
        lines.append(f"    largest {fmt_bytes_or_none(big.get('bytes'))} on device {big.get('device', '?')}, "
                     f"age {fmt_duration(big.get('age_s'))}")
    if full:
        for n, big, ages in _grouped(leaks["largest"]):
            lines.append(f"    large {n:>2} x {fmt_bytes_or_none(big.get('bytes')):>9} on device {big.get('device', '?')}, "
                         f"age {_age_range(ages)}{', async' if big.get('async') else ''}"
                         + (f" at {site_text(big.get('site'), callers=1)}" if 'site' in big else ""))
        lines.extend(_site_stacks(sites))
    return lines


def _peak_lines(run, full):
    """Per device, the live allocations when the shim saw the most live bytes, by call site."""
    lines = []
    for d in run.devices.values():
        pc = d.peak_consumers
        if not pc:
            continue
        peak = (d.exit_row or {}).get("requested_bytes_peak")
        lines.append(f"  peak consumers on device {d.device}: {fmt_bytes_or_none(pc.get('live_bytes'))} in "
                     f"{fmt_count(pc.get('live_allocs'))} allocation{'s' if pc.get('live_allocs') != 1 else ''} "
                     f"at {fmt_seconds(pc.get('t'))} (requested peak {fmt_bytes_or_none(peak)})")
        sites = d.peak_sites
        if sites:
            lines.extend(_site_table(sites, ["bytes", "count"],
                                     lambda s: [fmt_bytes_or_none(s.get("bytes")), fmt_count(s.get("count"))],
                                     full, SHORT_LIMITS["leak_sites"], WIDTH - 20))
            if full:
                lines.extend(_site_stacks(sites))
        elif pc.get("largest"):
            big = pc["largest"][0]
            lines.append(f"    largest {fmt_bytes_or_none(big.get('bytes'))} (call sites not recorded: "
                         "set POOLSHIM_BACKTRACE)")
    return lines


def _vmm_lines(run, full):
    """The application's own VMM memory live at exit (schema 2), per device, by call site."""
    lines = []
    for d in run.devices.values():
        live = (d.exit_row or {}).get("vmm_physical_bytes")
        if not live and not d.vmm_sites:
            continue
        lines.append(f"  VMM memory at exit on device {d.device}: {fmt_bytes_or_none(live)}")
        lines.extend(_site_table(d.vmm_sites, ["bytes"], lambda s: [fmt_bytes_or_none(s.get("bytes"))], full,
                                 SHORT_LIMITS["vmm_sites"], WIDTH - 20))
        if full:
            lines.extend(_site_stacks(d.vmm_sites))
    return lines


def run_section(run, full=False, several_logs=False):
    lines = []
    head = run.label
    if run.version:
        head += f", poolshim {run.version}"
    if several_logs and not full:
        head += f"  [log {run.path}]"
    lines.append(f"== {head}")
    if run.observe:
        lines.append("  " + OBSERVE_LINE)
    meta = []
    meta.append(("command", _cut(run.command or "(no start record)", full)))
    if full:
        meta.append(("log", run.path))
    when = fmt_unix(run.start_unix_s)
    samples = len(run.samples)
    ran = f"{fmt_duration(run.duration)}" + (f" from {when}" if when else "") + \
        f", {samples:,} sample{'s' if samples != 1 else ''}"
    if run.exit is not None:
        meta.append(("ran", ran + ", exited normally"))
    else:
        meta.append(("ran", ran))
        meta.append(("ended", run.ending))
    changes = run.config_changes
    if changes:
        text = ", ".join(f"{k}={v}" + (f" ({s})" if full and s else "") for k, v, s in changes)
        meta.append(("options", _cut(text, full)))
    names = []
    for d in run.devices.values():
        desc = f"{d.device}: {d.name or '?'}"
        if d.total_bytes:
            desc += f", {fmt_bytes(d.total_bytes)}"
        names.append(desc)
    if names:
        meta.append(("devices", _cut("; ".join(names), full)))
    lines.extend(table([[k, v] for k, v in meta], "ll", indent=2))
    lines.append("")
    if run.devices:
        lines.extend(device_table(run, full))
        extra = []
        for d in run.devices.values():
            if not run.observe:
                extra.extend(gap_lines(run, d))
            if full:
                extra.extend(histogram_lines(d))
        if extra:
            lines.append("")
            lines.extend(extra)
    else:
        lines.append("  no device memory was pooled")
    ex = run.exit or {}
    if ex.get("events_dropped"):
        lines.append(f"  events dropped: {fmt_count(ex['events_dropped'])} (the log is incomplete)")
    body = _oom_lines(run, full) + _peak_lines(run, full) + _leak_lines(run, full) + _vmm_lines(run, full)
    if run.warnings:
        body.append(f"  warnings: {len(run.warnings)}")
        shown = run.warnings if full else run.warnings[:SHORT_LIMITS["warnings"]]
        for w in shown:
            wrapped = textwrap.wrap(w.get("message") or "", WIDTH - 16) or [""]
            body.append(f"    t={w['t']:.3f} s  " + wrapped[0])
            body.extend(" " * (len(f"    t={w['t']:.3f} s  ")) + x for x in wrapped[1:])
        _more(body, len(shown), len(run.warnings), "warnings", 4)
    notes = run.notes
    if notes:
        shown = notes if full else notes[:SHORT_LIMITS["notes"]]
        body.extend("  note: " + _cut(str(n), full) for n in shown)
        _more(body, len(shown), len(notes), "notes", 2)
    if full and ex.get("paths"):
        body.append("  ways in: " + ", ".join(f"{k} {v}" for k, v in ex["paths"].items()))
    if body:
        lines.append("")
        lines.extend(body)
    return lines


def _merged_sites(lines, title, figures_header, sites, figures, full):
    """Append a table of merged call sites (if any): `figures(site)` gives the cells before the
    process count and the call site."""
    if not sites:
        return
    lines.append("")
    lines.append(f"  {title}")
    lines.extend(_site_table(sites, figures_header + ["processes"], lambda s: figures(s) + [str(len(s["runs"]))],
                             full, SHORT_LIMITS["merged_sites"], WIDTH - 36))


def merged_section(report, full=False):
    runs = report.runs
    lines = [f"== merged: {len(runs)} processes from {len(report.paths)} log{'s' if len(report.paths) != 1 else ''}"]
    leak_count, leak_bytes = report.leak_totals()
    no_exit = report.runs_without_exit()
    running = report.runs_still_running()
    meta = [
        ("hosts", ", ".join(report.hosts()) or NONE),
        ("ranks", ", ".join(report.ranks()) or NONE),
        ("allocations", report.allocations_text()),
        ("out of memory", report.ooms_text()),
        ("leaks at exit", f"{fmt_count(leak_count)} allocations, {fmt_bytes(leak_bytes)}"
                          + (f"; {no_exit} process{'es' if no_exit != 1 else ''} without an exit record" if no_exit else "")
                          + (f" ({running} still running)" if running else "")),
        ("warnings", str(sum(len(r.warnings) for r in runs))),
    ]
    lines.extend(table([[k, v] for k, v in meta], "ll", indent=2))
    lines.append("")
    lines.append("  per device, across processes")
    rows = [["device", "rank", "host", "pid", "peak reserved", "peak used", "peak requested", "final reserved",
             "live at end", "pooled", "OOMs"]]
    for run, d in report.device_rows():
        rows.append([str(d.device), run.rank if run.rank is not None else NONE, run.host or NONE, str(run.pid),
                     fmt_bytes_or_none(d.peak("reserved_bytes")), fmt_bytes_or_none(d.peak("used_bytes")),
                     fmt_bytes_or_none(d.peak("requested_bytes")), fmt_bytes_or_none(d.last("reserved_bytes")),
                     fmt_bytes_or_none(d.last("requested_bytes")),
                     NONE if run.observe else fmt_count(d.counter("allocs")), str(len(d.ooms))])
    lines.extend(table(rows, "rllrrrrrrrr", indent=4))
    summary = [["device", "processes", "highest peak reserved", "lowest peak reserved", "sum of peaks", "OOMs"]]
    for o in report.ordinal_peaks():
        summary.append([str(o["device"]), str(o["processes"]),
                        f"{fmt_bytes(o['high'][0])} ({report.process_name(o['high'][1])})",
                        f"{fmt_bytes(o['low'][0])} ({report.process_name(o['low'][1])})", fmt_bytes(o["sum"]),
                        str(o["ooms"])])
    lines.append("")
    lines.append("  per device ordinal, over its processes")
    lines.extend(table(summary, "rrrrrr", indent=4))
    _merged_sites(lines, "leaks by call site, all processes", ["bytes", "count"], report.leak_sites(),
                  lambda s: [fmt_bytes(s["bytes"]), fmt_count(s["count"])], full)
    _merged_sites(lines, "out-of-memory errors by failing call site, all processes", ["OOMs", "requested"],
                  report.oom_sites(), lambda s: [str(s["count"]), fmt_bytes(s["bytes"])], full)
    _merged_sites(lines, "the application's VMM memory at exit by call site, all processes", ["bytes"],
                  report.vmm_sites(), lambda s: [fmt_bytes(s["bytes"])], full)
    return lines


def summary(report, full=False):
    # Every string from the logs (commands, messages, names, paths) with its control
    # characters escaped and cut to a readable length, before it reaches the terminal.
    report = report.with_text(for_terminal)
    out = []
    for run in report.runs:
        if out:
            out.append("")
        out.extend(run_section(run, full, several_logs=len(report.paths) > 1))
    if report.several:
        out.append("")
        out.extend(merged_section(report, full))
    return "\n".join(out) + "\n"
