"""Reading poolshim logs (JSON Lines, schema versions 1 and 2; README.md "The log").

Used by the launcher's end summary, the tests and the report tool. Standard library only.

A log is read only when every line is within the bounds of what poolshim writes, so that
whatever is read can be summarized and rendered (text, HTML page, Perfetto trace); anything
else is refused with a LogError naming the file and line ("file:line: why"):
  - UTF-8 text, each non-blank line one JSON object, nested at most MAX_DEPTH (32) deep
    (poolshim's records nest 6 deep);
  - integers from -2^63 to 2^64-1 (the writer's int64 and uint64 fields); other numbers
    finite and within +-2^64 (the writer's doubles: times, ages, shares); no NaN or Infinity;
  - no lone UTF-16 surrogate (a "\ud800" escape without its pair) in any string or key: like
    bytes that are not UTF-8, it is not text (poolshim itself writes U+FFFD for those);
  - the common fields: schema 1 or 2, a known type, t a number of seconds from 0 to 2^31 (68
    years: microseconds of it stay exact in a Perfetto trace), pid an integer from 0 to
    2^31-1 (a pid_t).
poolshim_report.model checks the fields of each record type on top of this.
"""

import glob
import json
import os
import re
import reprlib
import socket

# poolshim's version is set in one place, CMakeLists.txt's project(): an installed copy of this
# module has the next line rewritten to it (CMakeLists.txt), the source tree's reads it there.
VERSION = None

SCHEMA_VERSION = 2  # the one written now
SCHEMA_VERSIONS = (1, 2)  # 2 added fields only: a version 1 log reads the same
RECORD_TYPES = ("start", "sample", "oom", "warning", "exit")
COMMON_FIELDS = ("schema", "type", "t", "pid")

MAX_DEPTH = 32
MIN_INT, MAX_INT = -2 ** 63, 2 ** 64 - 1
MAX_NUMBER = 2.0 ** 64
MAX_T = 2 ** 31
MAX_PID = 2 ** 31 - 1


def version():
    """poolshim's version ("0.2.0"), or "unknown" in a source tree without its CMakeLists.txt."""
    if VERSION:
        return VERSION
    try:
        with open(os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "CMakeLists.txt")) as f:
            found = re.search(r"^project\(poolshim VERSION ([0-9.]+)", f.read(), re.MULTILINE)
    except OSError:
        found = None
    return found.group(1) if found else "unknown"


class LogError(Exception):
    """A log that is not a poolshim log of a schema this tool reads: says where and why."""


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = _SHORT.maxlong = 40
_SHORT.maxlevel = 2


def short_repr(value):
    """repr(value) in about 40 characters (long strings, numbers and lists cut, nesting not
    followed): for messages about a value from a log."""
    return _SHORT.repr(value)


class _LongInteger:
    """An integer literal too long to be in range, kept as its length: Python refuses to convert
    one of more than 4300 digits (sys.set_int_max_str_digits), and it would be refused anyway."""

    def __init__(self, text):
        self.digits = len(text.lstrip("-"))

    def __repr__(self):
        return f"<{self.digits}-digit integer>"


def _parse_int(text):
    # 20 characters hold every integer in range ("18446744073709551615", "-9223372036854775808").
    return int(text) if len(text) <= 20 else _LongInteger(text)


class _Refused(Exception):
    def __init__(self, why):
        super().__init__(why)
        self.why = why
        self.where = []          # keys and indexes, outermost first (filled in on the way out)

    def __str__(self):
        where = "".join(_step(k) for k in self.where).lstrip(".")
        return f"{where}: {self.why}" if where else self.why


def _step(key):
    """One step of a path to a value, as the messages of poolshim_report.model write them:
    .name, [3], or ['a key'] for keys that are not plain names."""
    if isinstance(key, int):
        return f"[{key}]"
    return f".{key}" if key.isidentifier() and key.isascii() else f"[{ascii(key)}]"


_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_string(text):
    found = _SURROGATE.search(text)
    if found:
        raise _Refused(f"a lone UTF-16 surrogate (\\u{ord(found.group()):04x}) in a string: not Unicode text")


def _integer_out_of_range(digits, value):
    shown = f"integer {value}" if value is not None and digits <= 24 else f"{digits}-digit integer"
    return _Refused(f"{shown} out of range (poolshim writes -2^63 to 2^64-1)")


def _check_value(value, depth, strings):
    """Refuses (raises _Refused) what poolshim cannot have written in the object or array
    `value`: see the module's docstring. `strings`: whether to look for lone surrogates (only
    a line with a \\ud escape can hold one; skipping the others keeps long logs fast)."""
    if depth >= MAX_DEPTH:
        raise _Refused(f"arrays or objects nested more than {MAX_DEPTH} deep")
    is_dict = type(value) is dict
    for key, item in (value.items() if is_dict else enumerate(value)):
        kind = type(item)
        try:
            if kind is int:
                if not MIN_INT <= item <= MAX_INT:
                    raise _integer_out_of_range(len(str(abs(item))), item)
            elif kind is float:
                if item != item:
                    raise _Refused("NaN is not a number poolshim writes")
                if not -MAX_NUMBER <= item <= MAX_NUMBER:
                    raise _Refused(f"number {item!r} out of range (poolshim writes finite numbers within +-2^64)")
            elif kind is dict or kind is list:
                _check_value(item, depth + 1, strings)
            elif kind is _LongInteger:
                raise _integer_out_of_range(item.digits, None)
            elif kind is str and strings:
                _check_string(item)
            if is_dict and strings:
                _check_string(key)
        except _Refused as e:
            if not e.why.startswith("arrays or objects nested"):   # the path of one that deep says nothing
                e.where.insert(0, key)
            raise


def _parse(line):
    """The record on one line (a dict), or raises _Refused saying why not."""
    try:
        try:
            record = json.loads(line)
        except ValueError as e:
            if isinstance(e, json.JSONDecodeError):
                raise
            # An integer Python refuses to convert (over 4300 digits): read again, keeping
            # such integers as their length, so that the check below says where it is.
            record = json.loads(line, parse_int=_parse_int)
    except json.JSONDecodeError as e:
        raise _Refused(f"not JSON ({e.msg})") from None
    except RecursionError:
        raise _Refused(f"arrays or objects nested more than {MAX_DEPTH} deep") from None
    if not isinstance(record, dict):
        raise _Refused("not a JSON object")
    missing = [f for f in COMMON_FIELDS if f not in record]
    if missing:
        raise _Refused(f"not a poolshim record (no {', '.join(missing)})")
    schema = record["schema"]
    if type(schema) is not int or schema not in SCHEMA_VERSIONS:  # noqa: E721 (true is not 1)
        raise _Refused(f"schema {short_repr(schema)}; this tool reads schemas 1 and {SCHEMA_VERSION}")
    if record["type"] not in RECORD_TYPES:
        raise _Refused(f"unknown record type {short_repr(record['type'])}")
    t, pid = record["t"], record["pid"]
    if type(t) not in (int, float) or not 0 <= t <= MAX_T:   # (NaN is not)
        raise _Refused(f"bad {record['type']} record: t should be a number of seconds from 0 to 2^31, "
                       f"not {short_repr(t)}")
    if type(pid) is not int or not 0 <= pid <= MAX_PID:  # noqa: E721
        raise _Refused(f"bad {record['type']} record: pid should be an integer from 0 to 2^31-1, "
                       f"not {short_repr(pid)}")
    _check_value(record, 0, "\\ud" in line or "\\uD" in line)
    return record


def read_numbered(path):
    """(line number, record) of every record of one log file, in order. Raises LogError naming
    the line at fault."""
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
                records.append((number, _parse(line)))
            except _Refused as e:
                raise LogError(f"{path}:{number}: {e}") from None
    if not records:
        raise LogError(f"{path}: empty: no poolshim records")
    return records


def read_log(path):
    """All records of one log file, in order. Raises LogError naming the line at fault."""
    return [record for _, record in read_numbered(path)]


class LibraryError(Exception):
    """The library to preload (or a program beside it) is not there: says which and why."""


def find_library(installed, built, fix):
    """The library to preload: POOLSHIM_LIBRARY when set (an error if it names no ELF file),
    else `installed` (the installed copy's path, or None in a source tree), else the first of
    `built` (paths of libpoolshim.so in build folders) that is there. `fix`: what the error
    says to do when none is. The launcher and poolshim-replay find it so."""
    named = os.environ.get("POOLSHIM_LIBRARY", "")
    if named:
        try:
            with open(named, "rb") as f:
                elf = f.read(4) == b"\x7fELF"
        except OSError as e:
            raise LibraryError(f"POOLSHIM_LIBRARY={named} names no loadable library: {e.strerror}") from None
        if not elf:
            raise LibraryError(f"POOLSHIM_LIBRARY={named} names no loadable library: not an ELF file")
        return os.path.realpath(named)
    candidates = [installed] if installed else list(built)
    for c in candidates:
        if os.path.isfile(c):
            return os.path.realpath(c)
    raise LibraryError(f"libpoolshim.so not found at {' or '.join(os.path.normpath(c) for c in candidates)}: {fix}")


# Sanitizer runtimes that must come first in the initial library list (ASan refuses to start
# otherwise): a preload list that starts with one keeps it first.
SANITIZER_RUNTIME = re.compile(r"lib(clang_rt\.)?(asan|hwasan|msan|tsan)[-.]")


def preload_list(library, existing):
    """LD_PRELOAD with `library` in front of what was there, or right behind a sanitizer runtime
    at its head."""
    parts = [p for p in (existing or "").split(":") if p]
    at = 1 if parts and SANITIZER_RUNTIME.match(os.path.basename(parts[0])) else 0
    return ":".join(parts[:at] + [library] + parts[at:])


def conf_items(conf):
    """POOLSHIM_CONF's items as (key, value), each split at its first '=' or ':' as the library
    splits them (pool/config.h); items with neither are left out."""
    for piece in conf.split(","):
        m = re.fullmatch(r"([^=:]*)[=:](.*)", piece, re.DOTALL)
        if m:
            yield m.group(1).strip().lower(), m.group(2).strip()


def fill_template(template, fields, literal=lambda c: c):
    """A log template (%p %h %r %t %%) with each escape %X replaced by fields[X] (one it does
    not name stays as written) and every other character passed through `literal`."""
    out = []
    i = 0
    while i < len(template):
        c = template[i]
        if c == "%" and i + 1 < len(template):
            e = template[i + 1]
            out.append(fields.get(e, "%" + e))
            i += 2
            continue
        out.append(literal(c))
        i += 1
    return "".join(out)


def expand_pattern(template, host=None):
    """A glob pattern for the files a log template (%p %h %r %t %%) can produce."""
    host = host or socket.gethostname()
    return fill_template(template, {"p": "*", "h": glob.escape(host), "r": "*", "t": "*", "%": "%"}, glob.escape)


def logs_since(template, since_epoch):
    """Log files matching `template` modified at or after `since_epoch`, oldest first."""
    found = []
    for path in glob.glob(expand_pattern(template)):
        try:
            found.append((os.path.getmtime(path), path))
        except OSError:          # removed since the glob
            continue
    return [path for mtime, path in sorted(found) if mtime >= since_epoch - 1]


def records_of_run(records, child_pid, since_epoch):
    """The records of the processes that a launcher's command started: the process
    `child_pid`, and every process whose start record says it started at or after
    `since_epoch` (whole seconds), as its descendants did; each from its start record on.
    A log cannot say whose child a process was: one that started while the command ran is
    taken as the command's; one that started before it (another run appending to the same
    file, another job's log in the folder) is left out."""
    runs = {}                    # pid -> the records of its latest run that is ours
    ours = {}
    for r in records:
        pid = r["pid"]
        if r["type"] == "start":
            started = r.get("start_unix_s")
            ours[pid] = pid == child_pid or (started is not None and started >= int(since_epoch))
            if ours[pid]:
                runs[pid] = []   # a pid used again: the older process's records are not ours
        if ours.get(pid):
            runs[pid].append(r)
    return [r for rs in runs.values() for r in rs]


# Characters that a terminal acts on (C0 and C1 controls: escape sequences, CR, BEL,
# backspace) or that reorder or hide text (bidirectional overrides, zero-width and other
# format characters, line and paragraph separators). Logs hold text anyone can write
# (command lines, messages, symbol names): printed, these are shown as escapes (\x1b).
TERMINAL_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\xad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
                             "\ufeff\ufff9-\ufffb\ud800-\udfff\U000e0000-\U000e007f]")
_ESCAPES = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
TEXT_LIMIT = 1000   # characters of one string from a log that a terminal summary shows


def _escape(match):
    c = match.group()
    n = ord(c)
    return _ESCAPES.get(c) or (f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")


def terminal_text(text, limit=TEXT_LIMIT):
    """`text` safe to print on a terminal: control and format characters escaped ("\\x1b"),
    and cut after `limit` characters with a note of how many more there were."""
    if len(text) > limit:
        text = text[:limit] + f"... [{len(text) - limit:,} more characters]"
    return TERMINAL_UNSAFE.sub(_escape, text)


def for_terminal(value):
    """A copy of `value` (a record, or any value in one) with every string in it, keys
    included, passed through terminal_text."""
    if isinstance(value, str):
        return terminal_text(value)
    if isinstance(value, dict):
        return {terminal_text(k): for_terminal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [for_terminal(v) for v in value]
    return value


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
    return f"? ({chosen.get('module')}+{chosen.get('offset') or 0:#x})"


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
            p["warnings"].append(r.get("message"))
    for p in by_pid.values():
        devices = {}
        rows = list(p["samples"]) + list((p["exit"] or {}).get("devices") or [])
        for row in rows:
            d = devices.setdefault(row["device"], {"device": row["device"], "max_pool_slack": None})
            d["last"] = row
            # Slack is a share of reserved memory: a row with nothing reserved has none.
            if isinstance(row.get("pool_slack"), (int, float)) and row.get("reserved_bytes") != 0:
                d["max_pool_slack"] = max(d["max_pool_slack"] or 0.0, row["pool_slack"])
        p["devices"] = devices
    return [by_pid[k] for k in sorted(by_pid)]


def _shown(value):
    return "?" if value is None else value


def outside_text(last):
    """The memory outside the pool of one device's last figures (schema 2), or "" when none:
    allocations passed through, the application's VMM memory, the rest of the device's use."""
    parts = []
    if last.get("native_bytes_peak") and (last.get("reserved_bytes_peak") or 0) > 0:
        parts.append(f"passed through peak {fmt_bytes(last['native_bytes_peak'])}")
    if last.get("vmm_physical_bytes_peak"):
        parts.append(f"VMM (cuMemCreate) peak {fmt_bytes(last['vmm_physical_bytes_peak'])}, "
                     f"{fmt_bytes(last.get('vmm_physical_bytes'))} at the end")
    if last.get("other_bytes"):
        parts.append(f"other {fmt_bytes(last['other_bytes'])} at the end")
    return ("outside the pool: " + "; ".join(parts)) if parts else ""


def slack_text(last, highest):
    """What the pool holds beyond the memory handed out, and the rounding waste, of one device's
    last figures: the slack split into the heap's cached free blocks (reusable at once) and the
    rest; no share of 0 reserved bytes, and no rounding waste while nothing is live."""
    reserved, used, cached = last.get("reserved_bytes"), last.get("used_bytes"), last.get("cached_bytes")
    if reserved == 0:
        slack = "pool slack: nothing reserved at the end"
    else:
        slack = f"pool slack {fmt_share(last.get('pool_slack'))} of reserved at the end"
        if reserved is not None and used is not None and cached is not None:
            slack += (f" ({fmt_bytes(cached)} cached, reusable at once; {fmt_bytes(max(reserved - used, 0))} "
                      "other)")
        if highest is not None:
            slack += f", highest sampled {fmt_share(highest)}"
    if last.get("requested_bytes") == 0 or last.get("live_allocs") == 0:
        rounding = "rounding waste: nothing live at the end"
    else:
        rounding = f"rounding waste {fmt_share(last.get('rounding_waste'))}"
    return f"{slack}; {rounding}"


def summary_text(path, records):
    """The launcher's end summary for one log: `records` as poolshim_report.model.read_records
    returns them (every field but the common four may be missing: shown as ?)."""
    lines = []
    path = terminal_text(path)
    # Sample records are most of a long log and hold no text that the summary shows.
    for p in process_summaries([r if r["type"] == "sample" else for_terminal(r) for r in records]):
        start = p["start"] or {}
        command = " ".join(start.get("command_line") or [])
        lines.append(f"poolshim: pid {p['pid']} ({command}), log {path}")
        names = {d["device"]: d.get("name") for d in start.get("devices") or []}
        observe = (start.get("config") or {}).get("mode") == "observe"
        if not p["devices"]:
            lines.append("  no device memory was " + ("tracked" if observe else "pooled"))
        for dev, d in sorted(p["devices"].items()):
            last = {k: v for k, v in d["last"].items() if v is not None}

            def n(key, last=last):
                return _shown(last.get(key))

            if observe:  # POOLSHIM_MODE=observe: every call native, nothing pooled
                lines.append(f"  device {dev} ({_shown(names.get(dev))}): observe mode, {n('allocs')} allocations "
                             f"tracked ({n('async_allocs')} async), {n('frees')} freed, nothing pooled")
                lines.append(f"    peak tracked {fmt_bytes(last.get('native_bytes_peak'))}, peak requested "
                             f"{fmt_bytes(last.get('requested_bytes_peak'))}")
                outside = outside_text(last)
                if outside:
                    lines.append(f"    {outside}")
                lines.append(f"    out of memory: {n('ooms')}")
                continue
            lines.append(f"  device {dev} ({_shown(names.get(dev))}): {n('allocs')} allocations pooled "
                         f"({n('async_allocs')} async), {n('frees')} freed; "
                         f"{n('passthrough_allocs')} allocations and {n('passthrough_frees')} frees passed through")
            lines.append(f"    peak reserved {fmt_bytes(last.get('reserved_bytes_peak'))}, peak used "
                         f"{fmt_bytes(last.get('used_bytes_peak'))}, peak requested "
                         f"{fmt_bytes(last.get('requested_bytes_peak'))}")
            if "cache_hits" in last:  # logs written before the cache existed lack these
                hits, misses = last["cache_hits"], last.get("cache_misses")
                served = hits + misses if misses is not None else None
                share = f" ({fmt_share(hits / served)})" if served else ""
                lines.append(f"    cache: {hits} of {_shown(served)} allocations served without a driver call{share}, "
                             f"{fmt_bytes(last.get('cached_bytes'))} cached at the end (peak "
                             f"{fmt_bytes(last.get('cached_bytes_peak'))}), {n('cache_returns')} blocks given back, "
                             f"{n('fences')} fences")
            lines.append("    " + slack_text(last, d["max_pool_slack"]))
            outside = outside_text(last)
            if outside:
                lines.append(f"    {outside}")
            lines.append(f"    out of memory: {n('ooms')} ({n('oom_with_slack')} with enough unused pool memory), "
                         f"retried after a trim {n('oom_retries')} ({n('oom_retry_successes')} succeeded)")
        ex = p["exit"]
        if ex is None:
            lines.append("  no exit record: the process ended without running its exit handlers (killed, or _exit/abort)")
        else:
            leaks = ex.get("leaks") or {}
            count, largest = leaks.get("count"), leaks.get("largest") or []
            if count:
                line = f"  leaks at exit: {plural(count, 'allocation')}, {fmt_bytes(leaks.get('bytes'))}"
                if largest:
                    big = largest[0]
                    age = big.get("age_s")
                    line += (f" (largest {fmt_bytes(big.get('bytes'))} on device {_shown(big.get('device'))}, age "
                             f"{'?' if age is None else format(age, '.1f')} s)")
                lines.append(line)
            else:
                lines.append("  leaks at exit: " + ("none" if count == 0 else "?"))
            for group in (leaks.get("by_site") or [])[:3]:
                lines.append(f"    leaked from: {plural(_shown(group.get('count')), 'allocation')}, "
                             f"{fmt_bytes(group.get('bytes'))}, {site_text(group.get('site'))}")
            paths = ex.get("paths") or {}
            if paths:
                lines.append("  ways in: " + ", ".join(f"{k} {v}" for k, v in paths.items()))
            for note in ex.get("notes") or []:
                lines.append(f"  note: {note}")
        for o in p["ooms"]:
            lines.append(f"  OOM at t={o['t']:.3f}s on device {o['device']}: {fmt_bytes(o.get('request_bytes'))} "
                         f"requested, verdict {_shown(o.get('verdict'))}: {_shown(o.get('hint'))}")
    return "\n".join(lines)
