"""Logs -> runs -> figures.

A *run* is one process's records: grouped by pid within a file, a `start` record opening a new
run (several runs may have appended to one file, and a pid may come back), an `exit` record
closing it. Every field beyond the four common ones is optional: a log of an older shape (no
cap, no call sites) gives a report without those parts. Fields that are present are checked
for their type, so that a damaged record is reported as `file:line: ...` instead of failing
later; poolshim_log.read_log has checked the bounds of every value and the common fields.
"""

import copy
import math
import os
import shlex
import socket

import poolshim_log

from . import lines
from poolshim_log import LogError

from .fmt import NONE, fmt_bytes, fmt_bytes_or_none, fmt_count, fmt_share, site_key

VERDICTS = ("exhausted", "cap", "fragmentation")

# ---- validation ---------------------------------------------------------------------------

# Kinds: "int", "num", "str", "bool", "hist" (object of counts), "site" (null or a list of
# frames), ("list", spec) (a list of objects), ("obj", spec). A field may be absent or null
# unless it is listed in the spec's "!required" entry.


def _is_int(v):
    return type(v) is int  # noqa: E721  (not bool, a subclass of int)


def _is_num(v):
    t = type(v)
    return t is int or (t is float and math.isfinite(v))


def _is_unix_time(v):
    # Up to 2^32 (the year 2106): with t's bound, a Perfetto trace's times stay within int64 ns.
    return _is_num(v) and 0 <= v <= 2 ** 32


def _is_size(key):
    return key.isascii() and key.isdigit() and len(key) <= 20


_SCALARS = {
    "int": (_is_int, "an integer"),
    "num": (_is_num, "a number"),
    "unix_time": (_is_unix_time, "seconds since 1970 from 0 to 2^32"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
}

FRAME = {"module": "str", "offset": "int", "function": "str", "function_offset": "int"}
SITE_ROW = {"site": "site", "count": "num", "bytes": "num"}

DEVICE_NUMBERS = (
    "reserved_bytes", "reserved_bytes_peak", "used_bytes", "used_bytes_peak", "requested_bytes",
    "requested_bytes_peak", "requested_bytes_total", "live_allocs", "live_allocs_peak",
    "live_allocs_total", "allocs", "frees", "async_allocs", "async_frees", "ordered_frees",
    "app_pool_allocs", "passthrough_allocs", "passthrough_frees", "failed_allocs", "ooms",
    "oom_with_slack", "oom_retries", "oom_retry_successes", "fallback_allocs", "idle_trims",
    "idle_trimmed_bytes", "reset_dropped", "pool_slack", "rounding_waste", "device_free",
    "device_total", "cap_bytes", "cached_bytes", "cached_bytes_peak", "cache_hits", "cache_misses",
    "cache_returns", "fences", "bounded_syncs", "retired_blocks", "legacy_reuses",
    # schema 2
    "native_bytes", "native_bytes_peak", "native_allocs", "vmm_physical_bytes", "vmm_physical_bytes_peak",
    "vmm_physical_bytes_total", "vmm_mapped_bytes", "vmm_mapped_bytes_peak", "vmm_mapped_bytes_total",
    "vmm_released_mapped_bytes", "vmm_released_mapped_bytes_peak", "vmm_released_mapped_bytes_total",
    "vmm_creates", "vmm_releases", "vmm_maps", "vmm_unmaps", "vmm_reset_dropped", "other_bytes")
ALLOCATION_ROW = {"device": "int", "bytes": "num", "age_s": "num", "async": "bool", "stream": "num",
                  "site": "site"}
DEVICE_ROW = dict({f: "num" for f in DEVICE_NUMBERS}, device="int", size_histogram="hist",
                  vmm_by_site=("list", SITE_ROW), why="str",
                  peak_consumers=("obj", {"t": "num", "live_bytes": "num", "live_allocs": "num",
                                          "largest": ("list", ALLOCATION_ROW), "by_site": ("list", SITE_ROW)}))
DEVICE_ROW["!required"] = ("device",)

SPECS = {
    "start": {
        "version": "str", "host": "str", "start_unix_s": "unix_time", "log": "str",
        "command_line": ("strs",), "config": "obj", "config_sources": "obj",
        "devices": ("list", {"device": "int", "name": "str", "total_bytes": "num", "!required": ("device",)}),
    },
    "sample": DEVICE_ROW,
    "oom": {
        "device": "int", "request_bytes": "num", "api": "str", "stream": "num", "device_free": "num",
        "device_total": "num", "reserved_bytes": "num", "used_bytes": "num", "pool_unused_bytes": "num",
        "released_bytes": "num", "live_bytes": "num", "live_allocs": "num", "retried": "bool",
        "verdict": "str", "hint": "str", "cap_bytes": "num", "site": "site",
        "largest": ("list", {"bytes": "num", "age_s": "num", "async": "bool", "stream": "num", "site": "site",
                             "device": "int"}),
        "by_site": ("list", SITE_ROW), "size_histogram": "hist",
        "mode": "str", "native_bytes": "num", "vmm_bytes": "num", "other_bytes": "num",
        "vmm_by_site": ("list", SITE_ROW),
        "!required": ("device",),
    },
    "warning": {"message": "str"},
    "exit": {
        "pooled_allocs": "num", "events_dropped": "num", "devices": ("list", DEVICE_ROW),
        "leaks": ("obj", {"count": "num", "bytes": "num", "by_site": ("list", SITE_ROW),
                          "largest": ("list", {"device": "int", "bytes": "num", "age_s": "num",
                                               "async": "bool", "stream": "num", "site": "site"})}),
        "paths": "obj", "notes": ("strs",), "oom_repeats": "num", "event_log_written": "num",
        "event_log_dropped": "num", "event_log_sites": "obj",
    },
}


class _Invalid(Exception):
    pass


_short = poolshim_log.short_repr


def _check(value, kind, where):
    if value is None:
        return
    if isinstance(kind, str) and kind in _SCALARS:
        test, what = _SCALARS[kind]
        if not test(value):
            raise _Invalid(f"{where} should be {what}, not {_short(value)}")
    elif kind == "obj":
        if not isinstance(value, dict):
            raise _Invalid(f"{where} should be an object, not {_short(value)}")
    elif kind == "hist":
        # Keys are the buckets' sizes in bytes, as decimal text.
        if not isinstance(value, dict) or not all(_is_num(v) and _is_size(k) for k, v in value.items()):
            raise _Invalid(f"{where} should be an object of counts by size, not {_short(value)}")
    elif kind == "site":
        if not isinstance(value, list):
            raise _Invalid(f"{where} should be null or a list of frames, not {_short(value)}")
        for i, frame in enumerate(value):
            _check_object(frame, FRAME, f"{where}[{i}]")
    elif kind[0] == "strs":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _Invalid(f"{where} should be a list of strings, not {_short(value)}")
    elif kind[0] == "list":
        if not isinstance(value, list):
            raise _Invalid(f"{where} should be a list, not {_short(value)}")
        for i, item in enumerate(value):
            _check_object(item, kind[1], f"{where}[{i}]")
    elif kind[0] == "obj":
        _check_object(value, kind[1], where)


def _check_object(value, spec, where):
    if not isinstance(value, dict):
        raise _Invalid(f"{where} should be an object, not {_short(value)}")
    for name in spec.get("!required", ()):
        if value.get(name) is None:
            raise _Invalid(f"{where + '.' if where else ''}{name} is missing")
    for name, item in value.items():
        kind = spec.get(name)
        if kind is None or item is None or name == "!required":
            continue
        if kind == "num" and _is_num(item):   # the common case, checked without a call
            continue
        _check(item, kind, f"{where + '.' if where else ''}{name}")


def _check_record(record):
    _check_object(record, SPECS[record["type"]], "")


# Whether frames get their file:line from addr2line (cli's --no-lines turns it off).
ANNOTATE_LINES = True


def read_records(path):
    """poolshim_log.read_log, plus a type check of the fields the report uses. Raises LogError."""
    try:
        numbered = poolshim_log.read_numbered(path)
    except MemoryError:
        raise LogError(f"{path}: too large to read") from None
    for line, record in numbered:
        try:
            _check_record(record)
        except _Invalid as e:
            raise LogError(f"{path}:{line}: bad {record['type']} record: {e}") from None
    records = [record for _, record in numbered]
    if ANNOTATE_LINES:
        lines.annotate(records)
    return records


# ---- runs ----------------------------------------------------------------------------------

# Who holds a device's memory (schema 2): the field, its name in pool mode and in observe mode
# (None: not shown, as the pool reserves nothing then), and its chart series and trace counter
# as (class, name) (None: the pool's own series stand for it).
OWNERS = (("reserved_bytes", "pool reserved", None, None),
          ("native_bytes", "passed through", "tracked", ("native", "native")),
          ("vmm_physical_bytes", "VMM physical", "VMM physical", ("vmm", "VMM physical")),
          ("other_bytes", "other", "other", ("other", "other")))


def _num(v):
    return v if _is_num(v) else None


class Device:
    """One device of one run: its sample rows (in time order) and its exit row."""

    def __init__(self, device):
        self.device = device
        self.name = None
        self.total_bytes = None
        self.samples = []
        self.exit_row = None
        self.ooms = []
        self._memo = {}

    def _memoized(self, key, compute):
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    # The rows with figures, sample records first, the exit row last.
    @property
    def rows(self):
        return self.samples + ([self.exit_row] if self.exit_row is not None else [])

    @property
    def final(self):
        if self.exit_row is not None:
            return self.exit_row
        return self.samples[-1] if self.samples else {}

    def last(self, field):
        return _num(self.final.get(field))

    def _values(self, rows, field):
        return [v for v in (r.get(field) for r in rows) if _is_num(v)]

    def peak(self, field):
        """Highest `field` or `field`_peak seen (peaks restart when a pool is re-created)."""
        def compute():
            rows = self.rows
            values = self._values(rows, field + "_peak") + self._values(rows, field)
            return max(values) if values else None
        return self._memoized(("peak", field), compute)

    def counter(self, field):
        """A running total: its highest value seen (the final one unless the log is damaged)."""
        def compute():
            values = self._values(self.rows, field)
            return max(values) if values else None
        return self._memoized(("counter", field), compute)

    def share(self, field):
        """(last, max, mean) of a 0..1 figure (share_value: pool_slack, rounding_waste and the
        two parts of the slack); mean over the sample records (the exit row only when there are
        none). Rows where the figure's denominator is 0 have no value: no slack when nothing is
        reserved, no rounding waste when nothing is live."""
        def compute():
            def values(rows):
                return [v for v in (share_value(r, field) for r in rows) if v is not None]
            sampled = values(self.samples or self.rows)
            every = values(self.rows)
            if not every:
                return (None, None, None)
            return (share_value(self.final, field), max(every), sum(sampled) / len(sampled) if sampled else None)
        return self._memoized(("share", field), compute)

    @property
    def has_cache(self):
        """Whether the rows have the heap's cache figures (logs before the cache have none)."""
        return any("cache_hits" in r or "cached_bytes" in r for r in self.rows)

    def cache_hits_text(self):
        """"90 of 100 (90.0%)": allocations served from the heap's free blocks, of those that
        were served by a free block or a new segment; "-" without the figures."""
        hits, misses = self.counter("cache_hits"), self.counter("cache_misses")
        if hits is None:
            return NONE
        served = hits + misses if misses is not None else None
        share = f" ({fmt_share(hits / served)})" if served else ""
        return f"{fmt_count(hits)} of {fmt_count(served)}{share}"

    def histogram(self):
        """(row, [(lower bound, count)]) of the live allocations by size where they were the
        most bytes (the row of the highest requested bytes with a histogram, the latest such),
        or (None, []) when no row has a histogram with an allocation in it."""
        def compute():
            best = None
            for r in self.rows:
                hist = r.get("size_histogram") or {}
                if not any((_num(v) or 0) > 0 for v in hist.values()):
                    continue
                key = _num(r.get("requested_bytes")) or 0
                if best is None or key >= best[0]:
                    best = (key, r)
            if best is None:
                return (None, [])
            hist = best[1]["size_histogram"]
            return (best[1], sorted(((int(k), v) for k, v in hist.items() if (_num(v) or 0) > 0)))
        return self._memoized("histogram", compute)

    def reserve_gap(self, config):
        """Why reserved is far above requested, or None: when the peak reserved bytes are at
        least twice the peak requested bytes and 16 MiB more. The cause is read from the latest
        row at the highest reserved bytes (its reserved, used, cached and requested figures):
        the largest part of what that row holds beyond its live bytes. Returns {"row",
        "reserved", "requested", "cause" ("cache", "fences", "pool" or "rounding"), "bytes" (the
        cause's), "text" (the figures, the cause and the option that bounds it)}."""
        def compute():
            rows = [r for r in self.rows if _num(r.get("reserved_bytes")) is not None]
            if not rows:
                return None
            top = max(r["reserved_bytes"] for r in rows)
            row = [r for r in rows if r["reserved_bytes"] == top][-1]
            return reserve_gap(row, self.peak("reserved_bytes"), self.peak("requested_bytes"),
                               self.counter("ordered_frees"), config)
        return self._memoized("reserve_gap", compute)

    @property
    def cap(self):
        """The cap in bytes (the last one set), or None."""
        caps = [_num(r.get("cap_bytes")) for r in self.rows]
        caps = [c for c in caps if c is not None]
        return caps[-1] if caps else None

    @property
    def has_cap_field(self):
        return any("cap_bytes" in r for r in self.rows) or any("cap_bytes" in o for o in self.ooms)

    def series(self, field):
        """[(t, value)] over the samples (or the exit row when there are none)."""
        rows = self.samples if self.samples else ([self.exit_row] if self.exit_row else [])
        out = []
        for r in rows:
            v = _num(r.get(field))
            if v is not None:
                out.append((r["t"], v))
        return out

    @property
    def used(self):
        return bool(self.rows) or bool(self.ooms)

    @property
    def has_owners(self):
        """Whether the rows say who holds the memory (schema 2: native, VMM and other bytes)."""
        return any("native_bytes" in r or "vmm_physical_bytes" in r for r in self.rows)

    def owner_series(self):
        """(class, name, field) of the owner figures some row has above zero: the timeline and the
        trace draw these besides the pool's."""
        return [series + (field,) for field, _, _, series in OWNERS
                if series and any((_num(r.get(field)) or 0) > 0 for r in self.rows)]

    @property
    def vmm_sites(self):
        """The exit row's `vmm_by_site`: call sites of the application's live VMM memory at exit."""
        return (self.exit_row or {}).get("vmm_by_site") or []

    @property
    def peak_consumers(self):
        """The exit row's `peak_consumers` (the live allocations when the shim saw the most live
        bytes, by call site), or None."""
        return (self.exit_row or {}).get("peak_consumers")

    @property
    def peak_sites(self):
        """The peak consumers' rows by call site when call sites were recorded, else []."""
        sites = (self.peak_consumers or {}).get("by_site") or []
        return sites if any(s.get("site") for s in sites) else []


class Run:
    """One process run: the records of one pid between a start record and an exit record."""

    def __init__(self, path, pid, file_index):
        self.path = path
        self.pid = pid
        self.file_index = file_index   # position among the runs of its file
        self.start = None
        self.exit = None
        self.samples = []
        self.ooms = []
        self.warnings = []
        self.record_count = 0
        self.t_min = None
        self.t_max = None
        self.index = None              # position in the report; set by Report
        self._devices = None

    def add(self, record):
        self.record_count += 1
        t = record["t"]
        self.t_min = t if self.t_min is None else min(self.t_min, t)
        self.t_max = t if self.t_max is None else max(self.t_max, t)
        kind = record["type"]
        if kind == "start":
            self.start = record
        elif kind == "exit":
            self.exit = record
        elif kind == "sample":
            self.samples.append(record)
        elif kind == "oom":
            self.ooms.append(record)
        elif kind == "warning":
            self.warnings.append(record)
        self._devices = None

    def with_text(self, convert):
        """A copy of this run with `convert` (poolshim_log.for_terminal) applied to its path and
        to the records that hold text: sample records are shared as they are (most of a long
        log), as the only strings in them that a report shows are size_histogram's keys,
        which are digits."""
        other = copy.copy(self)
        other.path = convert(self.path)
        other.start = convert(self.start)
        other.exit = convert(self.exit)
        other.ooms = [convert(r) for r in self.ooms]
        other.warnings = [convert(r) for r in self.warnings]
        other._devices = None
        return other

    # -- identity --
    @property
    def host(self):
        return (self.start or {}).get("host")

    @property
    def rank(self):
        rank = (self.start or {}).get("rank")
        return None if rank is None else str(rank)

    @property
    def version(self):
        return (self.start or {}).get("version")

    @property
    def start_unix_s(self):
        return _num((self.start or {}).get("start_unix_s"))

    @property
    def command_line(self):
        return (self.start or {}).get("command_line") or []

    @property
    def command(self):
        return shlex.join(self.command_line) if self.command_line else None

    @property
    def program(self):
        """The command's program name (no path; for an interpreter, with its script or module),
        or None."""
        if not self.command_line:
            return None
        name = os.path.basename(self.command_line[0])
        rest = self.command_line[1:]
        if name.startswith(("python", "pypy")) and rest:
            if rest[0] == "-m" and len(rest) > 1:
                return f"{name} -m {rest[1]}"
            if not rest[0].startswith("-"):
                return f"{name} {os.path.basename(rest[0])}"
        return name

    @property
    def label(self):
        parts = [f"pid {self.pid}"]
        if self.rank is not None:
            parts.append(f"rank {self.rank}")
        if self.host:
            parts.append(f"host {self.host}")
        return ", ".join(parts)

    @property
    def anchor(self):
        return f"run-{self.index}-pid-{self.pid}"

    @property
    def duration(self):
        return self.t_max

    @property
    def config_changes(self):
        """(key, value, source) of the options not at their default; keys without a source
        (per-device ones such as limit_1) are always listed, with source None."""
        start = self.start or {}
        config = start.get("config") or {}
        sources = start.get("config_sources") or {}
        out = []
        for k, v in config.items():
            v = str(v)
            if sources.get(k) == "default" or (k not in sources and v in ("", "0")):
                continue
            if k.startswith("limit") and _is_size(v) and int(v) >= 1024:
                v += f" ({poolshim_log.fmt_bytes(int(v))})"
            out.append((k, v, sources.get(k)))
        return out

    @property
    def observe(self):
        """Whether the run was in observe mode (the start record's config): nothing was pooled,
        and the allocation figures count the tracked native allocations."""
        return ((self.start or {}).get("config") or {}).get("mode") == "observe"

    @property
    def owners(self):
        """(name, field) of the figures that say who holds device memory, as this run's mode names
        them (for devices with has_owners)."""
        names = [(observe_name if self.observe else name, field) for field, name, observe_name, _ in OWNERS]
        return [(name, field) for name, field in names if name]

    @property
    def oom_repeats(self):
        """OOMs of an already reported situation, not written as records (exit record)."""
        return _num((self.exit or {}).get("oom_repeats")) or 0

    # -- devices --
    @property
    def devices(self):
        """{ordinal: Device} of the devices this run used (with samples, exit figures or OOMs)."""
        if self._devices is None:
            devices = {}
            for s in sorted(self.samples, key=lambda r: r["t"]):
                devices.setdefault(s["device"], Device(s["device"])).samples.append(s)
            for row in (self.exit or {}).get("devices") or []:
                # The exit record's time is its rows' (they have none of their own): charts and
                # traces place the figures of a run without samples there.
                row = dict(row, t=self.exit["t"])
                devices.setdefault(row["device"], Device(row["device"])).exit_row = row
            for o in self.ooms:
                devices.setdefault(o["device"], Device(o["device"])).ooms.append(o)
            for d in (self.start or {}).get("devices") or []:
                if d["device"] in devices:
                    devices[d["device"]].name = d.get("name")
                    devices[d["device"]].total_bytes = _num(d.get("total_bytes"))
            self._devices = {k: devices[k] for k in sorted(devices)}
        return self._devices

    def total(self, field):
        values = [d.counter(field) for d in self.devices.values()]
        values = [v for v in values if v is not None]
        return sum(values) if values else None

    @property
    def ooms_sorted(self):
        return sorted(self.ooms, key=lambda o: o["t"])

    @property
    def leaks(self):
        """The exit record's `leaks` (count, bytes, largest, by_site) or None without exit."""
        if self.exit is None:
            return None
        leaks = self.exit.get("leaks") or {}
        return {"count": _num(leaks.get("count")) or 0, "bytes": _num(leaks.get("bytes")) or 0,
                "largest": leaks.get("largest") or [], "by_site": leaks.get("by_site"),
                "has_by_site": "by_site" in leaks}

    @property
    def notes(self):
        return (self.exit or {}).get("notes") or []

    @property
    def alive(self):
        """Whether the run's process is still running: True (its pid is alive on this host and
        started no later than the log's start record), False (on this host and gone, or its pid
        now names a later process), None (no exit record but no way to tell: another host, or no
        start record naming host and pid). Always False once the exit record is written."""
        if self.exit is not None:
            return False
        if self.start is None or not self.host:
            return None
        if self.host != socket.gethostname():
            return None
        return process_alive_since(self.pid, self.start_unix_s)

    @property
    def ended(self):
        """Whether the run is known to have ended (an exit record, or its process is gone)."""
        return self.exit is not None or self.alive is False

    @property
    def end_tag(self):
        """A short word for how the run ended: "exit", "still running", "no exit record"."""
        if self.exit is not None:
            return "exit"
        return "still running" if self.alive else "no exit record"

    @property
    def ending(self):
        """How the run ended, in words."""
        if self.exit is not None:
            return "normally (exit record written)"
        alive = self.alive
        if alive:
            return f"still running (no exit record yet; pid {self.pid} is alive on this host)"
        if alive is None and self.start is not None and self.host:
            oom = self.ooms and self.ooms_sorted[-1]["t"] >= (self.t_max or 0) - 1.0
            return "no exit record (other host: cannot tell)" + (", right after an out-of-memory error" if oom else "")
        if self.ooms and self.ooms_sorted[-1]["t"] >= (self.t_max or 0) - 1.0:
            return "no exit record, right after an out-of-memory error (killed, _exit, abort or a fatal signal)"
        return "no exit record (killed, _exit, abort or a fatal signal)"


def process_alive_since(pid, start_unix_s):
    """Whether process `pid` of this host exists and started no later than `start_unix_s` (plus
    a second of the clocks' rounding): a pid reused by a later process does not count. Without a
    start time, whether the pid exists."""
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return False
    if start_unix_s is None:
        return True
    try:
        # Field 22 (after the parenthesized name, which may hold spaces): start time in clock
        # ticks after boot; /proc/stat's btime is the boot time in seconds since 1970.
        ticks = int(stat[stat.rindex(")") + 2:].split()[19])
        with open("/proc/stat", encoding="ascii") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        started = boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return True
    return started <= start_unix_s + 1.0


def share_value(row, field):
    """A 0..1 figure of one row, or None where its denominator is 0 (or a field is missing):
    pool_slack (of reserved), rounding_waste (of handed out; none while nothing is live), and
    the slack's parts, of reserved: "slack_cached" (the heap's free blocks, reusable at once)
    and "slack_other" (reserved but not in the heap's segments: the driver pool's free memory)."""
    reserved = _num(row.get("reserved_bytes"))
    if field == "pool_slack":
        return None if reserved == 0 else _num(row.get("pool_slack"))
    if field == "rounding_waste":
        if _num(row.get("requested_bytes")) == 0 or _num(row.get("live_allocs")) == 0:
            return None
        return _num(row.get("rounding_waste"))
    if field in ("slack_cached", "slack_other"):
        cached, used = _num(row.get("cached_bytes")), _num(row.get("used_bytes"))
        if not reserved or cached is None or used is None:
            return None
        part = cached if field == "slack_cached" else reserved - used
        return min(max(part / reserved, 0.0), 1.0)
    return _num(row.get(field))


GAP_MIN_BYTES = 16 * 1024 * 1024


def _config_bytes(config, key):
    """An option's value in bytes as the start record's config gives it ("64M", "1G", "0"), or
    None (a share of device memory, or no value)."""
    text = str((config or {}).get(key, "")).strip()
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    number, unit = text.rstrip("KMGTkmgtBb"), text[len(text.rstrip("KMGTkmgtBb")):].upper().rstrip("B")
    if not number.isdigit() or unit not in units:
        return None
    return int(number) * units[unit]


def reserve_gap(row, reserved, requested, ordered_frees, config):
    """Device.reserve_gap: `reserved` and `requested` are the peaks, `row` the row read for the
    cause, `config` the start record's."""
    if reserved is None or requested is None or reserved < 2 * requested or reserved - requested < GAP_MIN_BYTES:
        return None
    used, cached, live = (_num(row.get(f)) for f in ("used_bytes", "cached_bytes", "requested_bytes"))
    if used is None or cached is None or live is None:
        return None
    row_reserved = row["reserved_bytes"]
    pool = max(row_reserved - used, 0)          # the driver pool's free memory
    rounding = max(used - cached - live, 0)     # handed out beyond the bytes asked for
    config = config or {}
    cache_limit = _config_bytes(config, "cache")
    cause, part = max((("cache", cached), ("pool", pool), ("rounding", rounding)), key=lambda c: c[1])
    figures = (f"peak reserved {fmt_bytes(reserved)} for a peak of {fmt_bytes(requested)} requested; "
               f"at t={row['t']:.3f} s it is")
    if cause == "cache" and (ordered_frees or 0) > 0 and cache_limit is not None and cached > cache_limit:
        cause = "fences"
        why = (f" mostly freed blocks waiting for their fences ({fmt_bytes(cached)} in the heap's free blocks, "
               f"beyond the {config.get('cache')} cache; {fmt_count(ordered_frees)} cudaFree calls were ordered, "
               f"not synchronized): POOLSHIM_FREE=sync makes each cudaFree's block reusable at once")
    elif cause == "cache":
        now = f" (now {config.get('cache')})" if config.get("cache") not in (None, "") else ""
        why = (f" mostly the heap's cache ({fmt_bytes(cached)} of free blocks kept for reuse, served again "
               f"without a driver call): POOLSHIM_CACHE{now} bounds it"
               + ("" if cache_limit is None or cached <= cache_limit else
                  "s whole free segments; the rest are free blocks in segments still partly in use"))
    elif cause == "pool":
        threshold = config.get("release_threshold")
        now = f" (now {threshold})" if threshold not in (None, "") else ""
        why = (f" mostly free memory the driver pool holds ({fmt_bytes(pool)} reserved but not in the heap's "
               f"segments, given back only when the pool is idle, down to the release threshold): "
               f"POOLSHIM_RELEASE_THRESHOLD{now} sets what it keeps, POOLSHIM_IDLE_TRIM_MS when it trims")
    else:
        why = (f" mostly rounding ({fmt_bytes(rounding)} handed out beyond the bytes asked for: 512-byte "
               f"granules and the unsplit rest of segments); no option changes it")
    return {"row": row, "reserved": reserved, "requested": requested, "cause": cause, "bytes": part,
            "text": f"{figures}{why}"}


def group_runs(path, records):
    """Runs of one file, in order of their first record."""
    runs = []
    current = {}   # pid -> open run
    for record in records:
        pid = record["pid"]
        run = current.get(pid)
        if record["type"] == "start":
            # A start opens a new run, unless the open one has no start and no exit yet (its
            # records came before the start record, from the same process).
            if run is None or run.start is not None or run.exit is not None:
                run = Run(path, pid, len(runs))
                runs.append(run)
                current[pid] = run
        elif run is None or run.exit is not None:
            run = Run(path, pid, len(runs))
            runs.append(run)
            current[pid] = run
        run.add(record)
    return runs


def rank_key(rank):
    """Sort key of a rank: numbers in numeric order, then other text, then none."""
    if rank is None:
        return (2, 0, "")
    return (0, int(rank), "") if _is_size(rank.removeprefix("-")) else (1, 0, rank)


def _merge_site_rows(rows_with_run):
    """[(run, {"site", "count", "bytes"})] -> [{"site", "count", "bytes", "runs"}] merged by call
    site, largest bytes first."""
    merged = {}
    for run, row in rows_with_run:
        key = site_key(row.get("site"))
        entry = merged.setdefault(key, {"site": row.get("site"), "count": 0, "bytes": 0, "runs": []})
        entry["count"] += _num(row.get("count")) or 0
        entry["bytes"] += _num(row.get("bytes")) or 0
        if run not in entry["runs"]:
            entry["runs"].append(run)
    return sorted(merged.values(), key=lambda e: (-e["bytes"], -e["count"]))


class Report:
    """Every run of every log given, in the order given."""

    def __init__(self, paths, runs):
        self.paths = paths
        self.runs = runs
        for i, run in enumerate(runs):
            run.index = i

    @property
    def several(self):
        return len(self.runs) > 1

    def with_text(self, convert):
        """A copy of this report with `convert` applied to its paths and records (Run.with_text)."""
        return Report([convert(p) for p in self.paths], [run.with_text(convert) for run in self.runs])

    def device_rows(self):
        """(run, device) of every device of every run, by device, then rank, host, pid."""
        rows = [(run, d) for run in self.runs for d in run.devices.values()]
        return sorted(rows, key=lambda rd: (rd[1].device, rank_key(rd[0].rank), rd[0].host or "", rd[0].pid,
                                            rd[0].index))

    def total(self, field, runs=None):
        values = [run.total(field) for run in (self.runs if runs is None else runs)]
        values = [v for v in values if v is not None]
        return sum(values) if values else None

    def oom_counts(self):
        counts = {}
        for run in self.runs:
            for o in run.ooms:
                v = o.get("verdict") or "unknown"
                counts[v] = counts.get(v, 0) + 1
        return counts

    def hosts(self):
        return sorted({r.host for r in self.runs if r.host})

    def ranks(self):
        return sorted({r.rank for r in self.runs if r.rank is not None}, key=rank_key)

    def leak_totals(self):
        """(allocations, bytes) still live at exit, over every run."""
        return (sum((r.leaks or {}).get("count", 0) for r in self.runs),
                sum((r.leaks or {}).get("bytes", 0) for r in self.runs))

    def runs_without_exit(self):
        return sum(1 for r in self.runs if r.exit is None)

    def runs_still_running(self):
        return sum(1 for r in self.runs if r.exit is None and r.alive)

    def process_name(self, run):
        """How merged tables name a process: by rank where every run has a rank of its own, else by pid."""
        ranks = [r.rank for r in self.runs]
        unique = None not in ranks and len(set(ranks)) == len(ranks)
        return f"rank {run.rank}" if unique else f"pid {run.pid}"

    def ordinal_peaks(self):
        """Per device ordinal, over the processes that used it, by ordinal: [{"device", "processes",
        "high": (peak reserved bytes, run), "low": (bytes, run), "sum" (of the peaks), "ooms"}]."""
        by_device = {}
        for run, d in self.device_rows():
            by_device.setdefault(d.device, []).append((run, d))
        out = []
        for dev, entries in sorted(by_device.items()):
            peaks = [(d.peak("reserved_bytes") or 0, run) for run, d in entries]
            out.append({"device": dev, "processes": len(entries), "high": max(peaks, key=lambda p: p[0]),
                        "low": min(peaks, key=lambda p: p[0]), "sum": sum(p[0] for p in peaks),
                        "ooms": sum(len(d.ooms) for _, d in entries)})
        return out

    def allocations_text(self):
        """The merged allocation counts, as one line (observe mode's tracked ones apart)."""
        pooled = [r for r in self.runs if not r.observe]
        tracked = self.total("allocs", [r for r in self.runs if r.observe])
        return (f"{fmt_count(self.total('allocs', pooled))} pooled ({fmt_count(self.total('async_allocs', pooled))} "
                f"async), {fmt_count(self.total('passthrough_allocs'))} passed through, "
                f"{fmt_count(self.total('fallback_allocs'))} fallback, {fmt_count(self.total('failed_allocs'))} failed"
                + (f", {fmt_count(tracked)} tracked in observe mode" if tracked is not None else ""))

    def ooms_text(self):
        """The merged out-of-memory count, by verdict, with the repeats the shim did not log."""
        ooms = self.oom_counts()
        repeats = sum(r.oom_repeats for r in self.runs)
        return (f"{sum(ooms.values())}" + (f" ({verdict_counts_text(ooms)})" if ooms else "")
                + (f", and {fmt_count(repeats)} repeats not logged" if repeats else ""))

    def leak_sites(self):
        return _merge_site_rows([(run, row) for run in self.runs
                                 for row in ((run.leaks or {}).get("by_site") or [])])

    def vmm_sites(self):
        """The application's live VMM memory at exit merged by call site: [{"site", "bytes", "runs"}]."""
        return _merge_site_rows([(run, row) for run in self.runs for d in run.devices.values() for row in d.vmm_sites])

    def oom_sites(self):
        """OOMs merged by the failing call's site: [{"site", "count", "bytes" (requested), "runs"}]."""
        return _merge_site_rows([(run, {"site": o.get("site"), "count": 1, "bytes": o.get("request_bytes")})
                                 for run in self.runs for o in run.ooms if o.get("site")])


def load(paths):
    """A Report of the logs at `paths` (duplicates read once). Raises LogError."""
    seen = set()
    unique = []
    for path in paths:
        key = os.path.realpath(path)
        if key not in seen:
            seen.add(key)
            unique.append(path)
    runs = []
    for path in unique:
        runs.extend(group_runs(path, read_records(path)))
    if not runs:
        raise LogError("no poolshim records in " + ", ".join(unique))
    return Report(unique, runs)


def oom_pool_text(oom):
    """The pool's figures at an out-of-memory error ("reserved 5.5 GiB, used 5.0 GiB, unused 496.0
    MiB"), or None in observe mode, where they are the tracked allocations' (oom_owners_text)."""
    if oom.get("mode") == "observe":
        return None
    return (f"reserved {fmt_bytes_or_none(oom.get('reserved_bytes'))}, "
            f"used {fmt_bytes_or_none(oom.get('used_bytes'))}, unused {fmt_bytes_or_none(oom.get('pool_unused_bytes'))}")


def oom_owners_text(oom):
    """Who held the device's memory at an out-of-memory error, in one line (its mode, tracked or
    passed-through, VMM and other bytes), or None for a record without those fields (schema 1)."""
    if not any(k in oom for k in ("mode", "native_bytes", "vmm_bytes", "other_bytes")):
        return None
    mode = oom.get("mode")
    if mode == "observe":
        # The pool's figures are the tracked allocations' then (README "The log", oom).
        live = _num(oom.get("live_allocs"))
        parts = [f"{fmt_bytes(oom.get('live_bytes'))} in {fmt_count(live)} tracked allocation"
                 + ("" if live == 1 else "s")]
    else:
        parts = [f"reserved {fmt_bytes(oom.get('reserved_bytes'))}",
                 f"passed through {fmt_bytes(oom.get('native_bytes'))}"]
    other = oom.get("other_bytes")
    parts += [f"VMM {fmt_bytes(oom.get('vmm_bytes'))}", f"other {'unknown' if other is None else fmt_bytes(other)}"]
    return (f"{mode} mode: " if mode else "") + ", ".join(parts)


def verdict_counts_text(counts):
    order = list(VERDICTS) + sorted(k for k in counts if k not in VERDICTS)
    return ", ".join(f"{k} {counts[k]}" for k in order if counts.get(k))
