"""--memory-viz: the event log (POOLSHIM_EVENTS) as a PyTorch memory snapshot.

The file is what torch.cuda.memory._dump_snapshot writes: a pickle of a dict with "segments"
and "device_traces", for pytorch.org/memory_viz (torch/utils/viz/MemoryViz.js) and
torch.cuda._memory_viz. What MemoryViz.js reads of it:

- device_traces[device]: entries with "action", "addr", "size", "stream", "frames" (and
  "device_free" for "oom"). "Active Memory Timeline" pairs "alloc" with "free_completed" (or
  the "free" it makes of an adjacent "free_requested" + "free_completed"). "Allocator State
  History" starts from the segments and undoes the trace backwards: every block it brings back
  must fall inside a segment, so the trace also holds "segment_alloc" / "segment_free".
- segments: "device", "address", "total_size", "stream", "frames", and "blocks" laid end to
  end from the segment's address ("size", "requested_size", "state", "frames").
- frames: {"filename", "line", "name"}, innermost first; "name" and "filename" must be strings.

The event log has no segments of the pool (cudaMemPool's own chunks are not visible to
poolshim per allocation), so each allocation is one segment of its own: a "segment_alloc"
before its "alloc", a "segment_free" after its free, and one segment per block live at the end.
Sizes are the bytes asked for (the CSV's Size): the pool's 512-byte rounding is not in the log.

MemoryViz.js has its own unpickler that knows protocols 2 to 4 and a fixed set of opcodes
(no classes, no bytes): the snapshot holds only dicts, lists, one tuple, str, int and bool,
pickled with protocol 4.
"""

import os
import pickle
import re

from poolshim_log import LogError

HEADER = "Thread,Time,Action,Pointer,Size,Stream,Device,Site,T"
PICKLE_PROTOCOL = 4   # MemoryViz.js: "Unhandled version" above 4
LARGE_SEGMENT = 1 << 20   # PyTorch's segment_type: "large" above 1 MiB

_ROW = re.compile(
    r"(?P<thread>[0-9]+),"
    r"(?P<time>[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}),"
    r"(?P<action>allocate|free|allocate failure),"
    r"0x(?P<pointer>[0-9a-f]+),"
    r"(?P<size>[0-9]+),"
    r"0x(?P<stream>[0-9a-f]+),"
    r"(?P<device>[0-9]+),"
    r"(?P<site>[0-9]+),"
    r"(?P<t_s>[0-9]+)\.(?P<t_ns>[0-9]{9})")
_U64 = 1 << 64
_COLUMNS = HEADER.count(",") + 1


class Event:
    """One row of the event log."""

    __slots__ = ("line", "action", "pointer", "size", "stream", "device", "site", "t_ns")

    def __init__(self, line, action, pointer, size, stream, device, site, t_ns):
        self.line = line
        self.action = action
        self.pointer = pointer
        self.size = size
        self.stream = stream
        self.device = device
        self.site = site
        self.t_ns = t_ns


def read_events(path):
    """The rows of a POOLSHIM_EVENTS file, in order. Raises LogError naming the file and line."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise LogError(f"cannot read the event log {path}: {e.strerror or e}") from None
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise LogError(f"{path}:{line}: not an event log: a byte that is not ASCII") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()   # the last row's newline
    if not lines:
        raise LogError(f"{path}: empty: not an event log (POOLSHIM_EVENTS writes its header first)")
    if lines[0].rstrip("\r") != HEADER:
        raise LogError(f"{path}:1: not a poolshim event log: the header should be {HEADER!r}, "
                       f"not {lines[0][:100]!r}")
    events = []
    for number, row in enumerate(lines[1:], start=2):
        m = _ROW.fullmatch(row)
        if m is None:
            raise LogError(f"{path}:{number}: {_row_problem(row)}")
        values = (int(m["pointer"], 16), int(m["size"]), int(m["stream"], 16))
        if any(v >= _U64 for v in values) or int(m["device"]) >= 1 << 31 or int(m["site"]) >= 1 << 32:
            raise LogError(f"{path}:{number}: a value beyond what poolshim writes: {row[:120]!r}")
        events.append(Event(number, m["action"], values[0], values[1], values[2], int(m["device"]),
                            int(m["site"]), int(m["t_s"]) * 10 ** 9 + int(m["t_ns"])))
    return events


def _row_problem(row):
    cells = row.split(",")
    if len(cells) != _COLUMNS:
        return f"{len(cells)} columns, not {_COLUMNS} ({HEADER}): {row[:120]!r}"
    names = HEADER.split(",")
    patterns = (r"[0-9]+", r"[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}", r"allocate|free|allocate failure",
                r"0x[0-9a-f]+", r"[0-9]+", r"0x[0-9a-f]+", r"[0-9]+", r"[0-9]+", r"[0-9]+\.[0-9]{9}")
    for name, pattern, cell in zip(names, patterns, cells):
        if re.fullmatch(pattern, cell) is None:
            return f"bad {name} {cell[:60]!r}"
    return f"bad row {row[:120]!r}"   # not reached: the cells match one by one


# ---- the run the event log belongs to ---------------------------------------------------------

def pick_run(report):
    """The run whose event log this is: the only run of the logs, or the only one with
    POOLSHIM_EVENTS set. Raises LogError otherwise."""
    def events_option(run):
        return ((run.start or {}).get("config") or {}).get("events")

    if len(report.runs) == 1:
        run = report.runs[0]
        if events_option(run) == "":
            raise LogError(f"{run.path}: pid {run.pid} ran without an event log (POOLSHIM_EVENTS was not set): "
                           "--events names another run's")
        return run
    with_events = [r for r in report.runs if events_option(r)]
    if len(with_events) == 1:
        return with_events[0]
    candidates = with_events or report.runs
    which = ", ".join(f"pid {r.pid} in {r.path}" for r in candidates)
    held = f"{len(candidates)} runs" + (" with POOLSHIM_EVENTS set" if with_events else "")
    raise LogError(f"--memory-viz takes the log of the run that wrote the event log; these logs hold {held} "
                   f"({which}): give that run's log alone")


def _site_frames(run):
    """{site id: [MemoryViz frames]} from the exit record's event_log_sites ({} when absent or
    null). Raises LogError for a value of the wrong shape."""
    sites = (run.exit or {}).get("event_log_sites")
    if sites is None:
        return {}
    where = f"{run.path}: the exit record of pid {run.pid}: event_log_sites"
    if not isinstance(sites, dict):
        raise LogError(f"{where} should be an object or null")
    out = {}
    for key, frames in sites.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 10):
            raise LogError(f"{where}: the key {key[:40]!r} should be a call-site id (decimal)")
        if frames is None:
            continue
        if not isinstance(frames, list):
            raise LogError(f"{where}[{key}] should be a list of frames or null")
        converted = []
        for i, frame in enumerate(frames):
            if not (isinstance(frame, dict) and isinstance(frame.get("module"), str)
                    and type(frame.get("offset")) is int  # noqa: E721  (not bool)
                    and (frame.get("function") is None or isinstance(frame.get("function"), str))):
                raise LogError(f"{where}[{key}][{i}] should be a frame ({{\"module\": str, \"offset\": int, "
                               f"\"function\": str or null, ...}})")
            converted.append(viz_frame(frame))
        out[int(key)] = converted
    return out


def viz_frame(frame):
    """A poolshim frame as MemoryViz's {"filename", "line", "name"}: the source file and line
    where addr2line placed it (lines.annotate's "line": "file.cpp:27"), else the module and
    line 0; the function's name, else the offset in the module ("0x1a2b", what addr2line -e
    module takes), as the viewer needs a string."""
    place = frame.get("line")
    filename, line = frame["module"], 0
    if isinstance(place, str):
        source, _, number = place.rpartition(":")
        if source and number.isdigit():
            filename, line = source, int(number)
    name = frame.get("function") or hex(frame["offset"])
    return {"filename": filename, "line": line, "name": name}


# ---- the snapshot -----------------------------------------------------------------------------

def _start_ns(run):
    """The run's start in ns since 1970 (start_unix_ns, else start_unix_s), or None."""
    start = run.start or {}
    ns, s = start.get("start_unix_ns"), start.get("start_unix_s")
    if type(ns) is int and ns >= 0:  # noqa: E721
        return ns
    if isinstance(s, (int, float)) and not isinstance(s, bool) and s >= 0:
        return int(s) * 10 ** 9
    return None


def _device_free(run, event):
    """cudaMemGetInfo's free bytes at a failed allocation: the run's oom record of that device
    and size nearest in time (within 1 s), else the last sample of the device before it, else 0
    (unknown; MemoryViz prints it)."""
    t = event.t_ns / 1e9
    best = None
    for oom in run.ooms:
        if oom.get("device") == event.device and oom.get("request_bytes") == event.size \
                and isinstance(oom.get("device_free"), int) and abs(oom["t"] - t) <= 1.0:
            if best is None or abs(oom["t"] - t) < abs(best["t"] - t):
                best = oom
    if best is not None:
        return best["device_free"]
    before = [s for s in run.samples if s.get("device") == event.device and s["t"] <= t
              and isinstance(s.get("device_free"), int)]
    return before[-1]["device_free"] if before else 0


def snapshot(run, events, events_path=None):
    """The snapshot dict of `events` (read_events) of `run` (model.Run). Raises LogError for a
    row of a device the run did not have."""
    devices = [d.get("device") for d in (run.start or {}).get("devices") or [] if isinstance(d, dict)]
    devices = [d for d in devices if type(d) is int and d >= 0]  # noqa: E721
    for e in events:
        if devices and e.device not in devices:
            raise LogError(f"{events_path or 'the event log'}:{e.line}: device {e.device} is not one of the "
                           f"devices of pid {run.pid} in {run.path} ({', '.join(map(str, sorted(devices)))}): "
                           "an event log of another run?")
    count = max([d + 1 for d in devices] + [e.device + 1 for e in events] + [1])
    traces = [[] for _ in range(count)]
    frames_of = _site_frames(run)
    start_ns = _start_ns(run)
    live = {}   # (device, address) -> the alloc entry
    notes = {"zero_size_allocations": 0, "frees_without_allocation": 0, "frees_inferred": 0}
    no_frames = []

    def entry(action, e, addr, size, stream, frames):
        t_ns = e.t_ns if start_ns is None else start_ns + e.t_ns
        d = {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": t_ns // 1000,
             "frames": frames}
        traces[e.device].append(d)
        return d

    for e in events:
        frames = frames_of.get(e.site, no_frames)
        key = (e.device, e.pointer)
        if e.action == "allocate":
            if e.size == 0:
                # A block of no bytes lies in no segment: MemoryViz's state view fails on it.
                notes["zero_size_allocations"] += 1
                continue
            if key in live:
                # The same address again without its free: the free's row was dropped (a full
                # queue); it is put here, at the latest moment it can have happened.
                notes["frees_inferred"] += 1
                for d in _ends(live.pop(key), e, entry):
                    d["poolshim_inferred"] = True
            entry("segment_alloc", e, e.pointer, e.size, e.stream, frames)
            live[key] = entry("alloc", e, e.pointer, e.size, e.stream, frames)
        elif e.action == "free":
            block = live.pop(key, None)
            if block is None:
                if e.size == 0:
                    notes["zero_size_allocations"] += 1
                    continue
                # Allocated before the log's first row, or its row was dropped: MemoryViz shows
                # it as allocated from the start.
                notes["frees_without_allocation"] += 1
                block = {"addr": e.pointer, "size": e.size, "stream": e.stream, "frames": frames}
            _ends(block, e, entry)
        else:
            d = {"action": "oom", "size": e.size, "stream": e.stream, "device_free": _device_free(run, e),
                 "time_us": (e.t_ns if start_ns is None else start_ns + e.t_ns) // 1000, "frames": frames}
            traces[e.device].append(d)

    segments = []
    for (device, address), block in sorted(live.items()):
        size = block["size"]
        segments.append({
            "device": device, "address": address, "total_size": size, "allocated_size": size,
            "active_size": size, "requested_size": size, "stream": block["stream"],
            "segment_type": "large" if size > LARGE_SEGMENT else "small", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": block["frames"],
            "blocks": [{"address": address, "size": size, "requested_size": size, "state": "active_allocated",
                        "frames": block["frames"]}],
        })
    exit_record = run.exit or {}
    return {
        "segments": segments,
        "device_traces": traces,
        "poolshim": {
            "pid": run.pid, "log": run.path, "events": events_path, "rows": len(events),
            "segments": "one per allocation: the pool's segments are not in the event log",
            "event_log_written": exit_record.get("event_log_written"),
            "event_log_dropped": exit_record.get("event_log_dropped"),
            "call_sites": "event_log_sites" in exit_record and exit_record["event_log_sites"] is not None,
            **notes,
        },
    }


def _ends(block, e, entry):
    """The entries that end `block` at the row `e` (a free, or the allocation that shows its
    free was lost): the allocation's size, stream and frames, as PyTorch's free entries carry
    the block's."""
    return [entry(action, e, block["addr"], block["size"], block["stream"], block["frames"])
            for action in ("free_requested", "free_completed", "segment_free")]


def warnings(run, events, snap):
    """What the user should know about the export: lines for stderr."""
    out = []
    info = snap["poolshim"]
    written, dropped = info["event_log_written"], info["event_log_dropped"]
    if type(dropped) is int and dropped > 0:  # noqa: E721
        out.append(f"the event log lost {dropped} records (a full queue or a failed write): the timeline misses them")
    if type(written) is int and written != len(events):  # noqa: E721
        out.append(f"the exit record of pid {run.pid} counts {written} event-log rows written, the file has "
                   f"{len(events)}: another run's file, or cut")
    if run.exit is None:
        out.append(f"pid {run.pid} has no exit record: no call-site frames (event_log_sites)")
    elif not info["call_sites"] and any(e.site for e in events):
        out.append(f"the exit record of pid {run.pid} has no event_log_sites: no call-site frames")
    return out


def dumps(snap):
    return pickle.dumps(snap, protocol=PICKLE_PROTOCOL)


def export(report, events_path):
    """(pickle bytes, warnings) of the event log at `events_path` for its run in `report`."""
    run = pick_run(report)
    events = read_events(events_path)
    snap = snapshot(run, events, events_path=os.fspath(events_path))
    return dumps(snap), warnings(run, events, snap)
