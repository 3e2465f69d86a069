"""Reading poolshim logs (JSON Lines, schema version 1; README.md "The log").

Used by the launcher's end summary, the tests and the report tool. Standard library only.
"""

import glob
import json
import os
import socket

SCHEMA_VERSION = 1
RECORD_TYPES = ("start", "sample", "oom", "warning", "exit")
COMMON_FIELDS = ("schema", "type", "t", "pid")


class LogError(Exception):
    """A log that is not a poolshim log of a schema this tool reads: says where and why."""


def read_log(path):
    """All records of one log file, in order. Raises LogError naming the line at fault."""
    records = []
    try:
        handle = open(path, "rb")
    except OSError as e:
        raise LogError(f"{path}: cannot read: {e.strerror}") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise LogError(f"{path}:{number}: not UTF-8 text") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise LogError(f"{path}:{number}: not JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise LogError(f"{path}:{number}: not a JSON object")
            missing = [f for f in COMMON_FIELDS if f not in record]
            if missing:
                raise LogError(f"{path}:{number}: not a poolshim record (no {', '.join(missing)})")
            schema = record["schema"]
            if type(schema) is not int or schema != SCHEMA_VERSION:  # noqa: E721 (true is not 1)
                raise LogError(f"{path}:{number}: schema {schema!r}; this tool reads schema {SCHEMA_VERSION}")
            if record["type"] not in RECORD_TYPES:
                raise LogError(f"{path}:{number}: unknown record type {record['type']!r}")
            records.append(record)
    if not records:
        raise LogError(f"{path}: empty: no poolshim records")
    return records


def expand_pattern(template, host=None):
    """A glob pattern for the files a log template (%p %h %r %t %%) can produce."""
    host = host or socket.gethostname()
    out = []
    i = 0
    while i < len(template):
        c = template[i]
        if c == "%" and i + 1 < len(template):
            e = template[i + 1]
            out.append({"p": "*", "h": glob.escape(host), "r": "*", "t": "*", "%": "%"}.get(e, "%" + e))
            i += 2
            continue
        out.append(glob.escape(c))
        i += 1
    return "".join(out)


def logs_since(template, since_epoch):
    """Log files matching `template` modified at or after `since_epoch`, oldest first."""
    paths = [p for p in glob.glob(expand_pattern(template)) if os.path.getmtime(p) >= since_epoch - 1]
    return sorted(paths, key=os.path.getmtime)


def fmt_bytes(n):
    if n is None:
        return "?"
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    value = float(n)
    unit = 0
    while value >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    return f"{int(n)} B" if unit == 0 else f"{value:.1f} {units[unit]}"


def plural(n, word):
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def fmt_share(x):
    return "?" if x is None else f"{100 * x:.1f}%"


CUDA_RUNTIME_PREFIXES = ("cudart::", "__cudart", "cuda", "__cuda", "libcudart_static_")


def site_text(site):
    """The first frame of a call site that is not the CUDA runtime's, for people."""
    if not site:
        return "(call sites not recorded: set POOLSHIM_BACKTRACE)"
    chosen = site[0]
    for frame in site:
        module = os.path.basename(frame.get("module") or "")
        function = frame.get("function") or ""
        if module.startswith(("libcudart", "libcuda.so")) or function.startswith(CUDA_RUNTIME_PREFIXES):
            continue
        chosen = frame
        break
    if chosen.get("function"):
        return f"{chosen['function']}+{chosen.get('function_offset') or 0:#x} ({chosen.get('module')})"
    return f"? ({chosen.get('module')}+{chosen.get('offset', 0):#x})"


def process_summaries(records):
    """One dict per process (by pid) in the records: start, devices' final and peak figures,
    OOMs, warnings and leaks."""
    by_pid = {}
    for r in records:
        p = by_pid.setdefault(r["pid"], {"pid": r["pid"], "start": None, "exit": None, "samples": [],
                                         "ooms": [], "warnings": []})
        if r["type"] == "start":
            p["start"] = r
        elif r["type"] == "exit":
            p["exit"] = r
        elif r["type"] == "sample":
            p["samples"].append(r)
        elif r["type"] == "oom":
            p["ooms"].append(r)
        elif r["type"] == "warning":
            p["warnings"].append(r["message"])
    for p in by_pid.values():
        devices = {}
        rows = list(p["samples"]) + (list(p["exit"]["devices"]) if p["exit"] else [])
        for row in rows:
            d = devices.setdefault(row["device"], {"device": row["device"], "max_pool_slack": 0.0})
            d["last"] = row
            d["max_pool_slack"] = max(d["max_pool_slack"], row.get("pool_slack") or 0.0)
        p["devices"] = devices
    return [by_pid[k] for k in sorted(by_pid)]


def summary_text(path, records):
    """The launcher's end summary for one log."""
    lines = []
    for p in process_summaries(records):
        start = p["start"] or {}
        command = " ".join(start.get("command_line", []))
        lines.append(f"poolshim: pid {p['pid']} ({command}), log {path}")
        names = {d["device"]: d["name"] for d in start.get("devices", [])}
        if not p["devices"]:
            lines.append("  no device memory was pooled")
        for dev, d in sorted(p["devices"].items()):
            last = d["last"]
            lines.append(f"  device {dev} ({names.get(dev, '?')}): {last['allocs']} allocations pooled "
                         f"({last['async_allocs']} async), {last['frees']} freed; "
                         f"{last['passthrough_allocs']} allocations and {last['passthrough_frees']} frees passed through")
            lines.append(f"    peak reserved {fmt_bytes(last['reserved_bytes_peak'])}, peak used "
                         f"{fmt_bytes(last['used_bytes_peak'])}, peak requested {fmt_bytes(last['requested_bytes_peak'])}")
            if "cache_hits" in last:  # logs written before the cache existed lack these
                served = last["cache_hits"] + last["cache_misses"]
                share = f" ({fmt_share(last['cache_hits'] / served)})" if served else ""
                lines.append(f"    cache: {last['cache_hits']} of {served} allocations served without a driver call{share}, "
                             f"{fmt_bytes(last['cached_bytes'])} cached at the end (peak {fmt_bytes(last['cached_bytes_peak'])}), "
                             f"{last['cache_returns']} blocks given back, {last['fences']} fences")
            lines.append(f"    fragmentation: pool slack {fmt_share(last['pool_slack'])} at the end "
                         f"(highest sampled {fmt_share(d['max_pool_slack'])}), rounding waste {fmt_share(last['rounding_waste'])}")
            lines.append(f"    out of memory: {last['ooms']} ({last['oom_with_slack']} with enough unused pool memory), "
                         f"retried after a trim {last['oom_retries']} ({last['oom_retry_successes']} succeeded)")
        ex = p["exit"]
        if ex is None:
            lines.append("  no exit record: the process ended without running its exit handlers (killed, or _exit/abort)")
        else:
            leaks = ex["leaks"]
            if leaks["count"]:
                big = leaks["largest"][0]
                lines.append(f"  leaks at exit: {plural(leaks['count'], 'allocation')}, {fmt_bytes(leaks['bytes'])} "
                             f"(largest {fmt_bytes(big['bytes'])} on device {big['device']}, age {big['age_s']:.1f} s)")
            else:
                lines.append("  leaks at exit: none")
            for group in leaks.get("by_site", [])[:3]:
                lines.append(f"    leaked from: {plural(group['count'], 'allocation')}, {fmt_bytes(group['bytes'])}, "
                             f"{site_text(group.get('site'))}")
            paths = ex.get("paths") or {}
            if paths:
                lines.append("  ways in: " + ", ".join(f"{k} {v}" for k, v in paths.items()))
            for note in ex.get("notes", []):
                lines.append(f"  note: {note}")
        for o in p["ooms"]:
            lines.append(f"  OOM at t={o['t']:.3f}s on device {o['device']}: {fmt_bytes(o['request_bytes'])} requested, "
                         f"verdict {o['verdict']}: {o['hint']}")
    return "\n".join(lines)
