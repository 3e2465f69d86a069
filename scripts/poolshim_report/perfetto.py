"""Chrome trace-event JSON ("JSON Object Format") for ui.perfetto.dev and chrome://tracing.

One trace process per run (its pid, or a stand-in when two runs share a pid), named by pid,
rank, host and command. Per device, counter events ("ph": "C") named "device D reserved",
"device D used", "device D requested" and "device D cap", each with one numeric arg "bytes"
(Perfetto shows a track per name and arg: "device 0 reserved bytes"), "device D pool
slack" with arg "percent", "device D cached" (the heap's free blocks, arg "bytes") and "device D
cache hits" (a running count, arg "count"); for a schema 2 log, "device D native", "device D VMM physical" and
"device D other" where a sample has them above zero (observe mode has no reserved, used or
pool slack or cache tracks: nothing was pooled). OOMs and warnings are instant events ("ph": "i",
process scope) with their details in args; the start and the exit of a run are instant events too.
Timestamps are microseconds: the run's `t`, shifted by its start time relative to the earliest
run with --align wall (the default), or not shifted with --align zero; never negative.
"""

import json

from .fmt import fmt_bytes, fmt_bytes_or_none, shorten_middle, site_text

TID = 1
# (track, field, arg, scale) of the counters of every device; POOL_ONLY are left out in observe mode.
COUNTERS = (("reserved", "reserved_bytes", "bytes", None), ("used", "used_bytes", "bytes", None),
            ("requested", "requested_bytes", "bytes", None), ("cap", "cap_bytes", "bytes", None),
            ("pool slack", "pool_slack", "percent", 100), ("cached", "cached_bytes", "bytes", None),
            ("cache hits", "cache_hits", "count", None))
POOL_ONLY = ("reserved", "used", "pool slack", "cached", "cache hits")


def _clean(args):
    """Args without null values (a trace viewer shows nothing useful for them)."""
    return {k: v for k, v in args.items() if v is not None}


def _us(seconds):
    return round(seconds * 1e6, 3)


def _site_lines(sites, limit):
    """Call-site groups as args: "8.0 MiB in 2: site" (without "in N" where groups have no count)."""
    return [f"{fmt_bytes_or_none(s.get('bytes'))}" + (f" in {s.get('count')}" if "count" in s else "")
            + f": {site_text(s.get('site'), callers=1)}" for s in sites[:limit]]


def _start_ns(run):
    """A run's start in ns since 1970: start_unix_ns where the start record has it and it agrees
    with start_unix_s (ranks line up to the ns, not the second), else start_unix_s; None if none."""
    s = run.start_unix_s
    if s is None:
        return None
    ns = (run.start or {}).get("start_unix_ns")
    return ns if type(ns) is int and ns // 10 ** 9 == s else round(s * 10 ** 9)  # noqa: E721


def trace(report, align="wall"):
    events = []
    used_pids = set()
    starts = [_start_ns(r) for r in report.runs]
    wall = align == "wall" and all(s is not None for s in starts)
    base = min(starts) if wall else 0
    # Each run's offset so that its earliest t lands at >= 0.
    for order, run in enumerate(report.runs):
        pid = run.pid
        while pid in used_pids:
            # Two runs with one pid (pid reuse, or another host): a stand-in, kept within the
            # unsigned 32 bits a trace's pid has.
            pid = (pid + 10_000_000) % 2 ** 32
        used_pids.add(pid)
        offset = (_start_ns(run) - base) / 1e9 if wall else 0.0
        if (run.t_min or 0.0) + offset < 0:
            offset = -run.t_min

        def ts(t, offset=offset):
            return max(_us(t + offset), 0.0)

        name = f"pid {run.pid}"
        if run.rank is not None:
            name += f" rank {run.rank}"
        if run.host:
            name += f" @{run.host}"
        if run.command:
            name += ": " + shorten_middle(run.command, 80)
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0,
                       "args": {"sort_index": order}})
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": TID, "ts": 0,
                       "args": {"name": "poolshim events"}})
        if run.start is not None:
            events.append({"ph": "i", "s": "p", "name": "start", "cat": "poolshim", "pid": pid, "tid": TID,
                           "ts": ts(run.start["t"]),
                           "args": {"pid": run.pid, "host": run.host, "rank": run.rank, "command": run.command,
                                    "poolshim": run.version, "log": run.path,
                                    "mode": "observe" if run.observe else None}})
        for d in run.devices.values():
            rows = d.samples if d.samples else ([d.exit_row] if d.exit_row else [])
            # A counter is a step function: a sample repeating the value before it adds
            # nothing but size (the last sample is always kept, to mark where the run ends).
            counters = [c for c in COUNTERS if not (run.observe and c[0] in POOL_ONLY)]
            counters += [(label, field, "bytes", None) for _, label, field in d.owner_series()]
            last = {}
            for i, r in enumerate(rows):
                for label, field, arg, scale in counters:
                    v = r.get(field)
                    if not isinstance(v, (int, float)) or isinstance(v, bool):
                        continue
                    if scale:
                        v = round(scale * v, 3)
                    if last.get(label) == v and i != len(rows) - 1:
                        continue
                    last[label] = v
                    events.append({"ph": "C", "name": f"device {d.device} {label}", "cat": "poolshim",
                                   "pid": pid, "tid": TID, "ts": ts(r["t"]), "args": {arg: v}})
        for o in run.ooms_sorted:
            pool = o.get("mode") != "observe"   # else reserved and used are the tracked bytes ("native")
            args = {"device": o["device"], "request": fmt_bytes_or_none(o.get("request_bytes")),
                    "request_bytes": o.get("request_bytes"), "api": o.get("api"), "verdict": o.get("verdict"),
                    "hint": o.get("hint"), "reserved": fmt_bytes_or_none(o.get("reserved_bytes")) if pool else None,
                    "used": fmt_bytes_or_none(o.get("used_bytes")) if pool else None,
                    "device_free": fmt_bytes_or_none(o.get("device_free"))}
            if o.get("cap_bytes") is not None:
                args["cap"] = fmt_bytes(o["cap_bytes"])
            if "site" in o:
                args["site"] = site_text(o.get("site"), callers=3)
            if o.get("by_site"):
                args["live_by_site"] = _site_lines(o["by_site"], 5)
            args["mode"] = o.get("mode")
            for key, field in (("native", "native_bytes"), ("vmm", "vmm_bytes"), ("other", "other_bytes")):
                if o.get(field) is not None:
                    args[key] = fmt_bytes(o[field])
            if o.get("vmm_by_site"):
                args["vmm_by_site"] = _site_lines(o["vmm_by_site"], 5)
            events.append({"ph": "i", "s": "p", "name": f"OOM device {o['device']} "
                                                        f"{fmt_bytes_or_none(o.get('request_bytes'))} ({o.get('verdict') or '?'})",
                           "cat": "oom", "pid": pid, "tid": TID, "ts": ts(o["t"]), "args": args})
        for w in run.warnings:
            events.append({"ph": "i", "s": "p", "name": "warning", "cat": "warning", "pid": pid, "tid": TID,
                           "ts": ts(w["t"]), "args": {"message": w.get("message")}})
        if run.exit is not None:
            leaks = run.leaks
            args = {"leaked_allocations": leaks["count"], "leaked": fmt_bytes(leaks["bytes"]),
                    "oom_repeats": run.oom_repeats or None}
            if leaks["by_site"]:
                args["leaks_by_site"] = _site_lines(leaks["by_site"], 10)
            vmm = [f"device {d.device}: {line}" for d in run.devices.values() for line in _site_lines(d.vmm_sites, 10)]
            if vmm:
                args["vmm_by_site"] = vmm
            events.append({"ph": "i", "s": "p", "name": "exit", "cat": "poolshim", "pid": pid, "tid": TID,
                           "ts": ts(run.exit["t"]), "args": args})
    for e in events:
        if "args" in e:
            e["args"] = _clean(e["args"])
    # Metadata first; the rest in the order written (per run: start, counters by device, OOMs,
    # warnings, exit). Trace viewers sort events by time themselves.
    meta_first = [e for e in events if e["ph"] == "M"]
    rest = [e for e in events if e["ph"] != "M"]
    return {"traceEvents": meta_first + rest, "displayTimeUnit": "ms",
            "otherData": {"generator": "poolshim-report", "logs": list(report.paths),
                          "time_axis": "wall" if wall else "zero"}}


def dumps(report, align="wall"):
    return json.dumps(trace(report, align), separators=(",", ":"), allow_nan=False) + "\n"
