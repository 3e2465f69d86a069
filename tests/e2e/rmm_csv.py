"""RMM's rules for reading a memory event log, re-implemented to check poolshim's POOLSHIM_EVENTS
file against them (issue 17). From RMM's source:

- rmm/benchmarks/utilities/log_parser.hpp `parse_csv`: a rapidcsv Document with
  LabelParams(0, -1) (row 0 names the columns, no row labels); columns found by name:
  `Thread` as std::size_t, `Action` as a string, `Pointer` through
  `std::stoll(str, nullptr, 16)`, `Size` as std::size_t, `Stream` as uintptr_t; all columns of
  one length ("Size mismatch in columns of parsed log."); each action exactly `allocate`,
  `free` or `allocate failure` ("Invalid action string."). `Time` is not read.
- rapidcsv 6.10 (rmm/benchmarks/replay/rapidcsv.h) `Converter::ToVal`: unsigned long and
  unsigned long long through std::stoul / std::stoull, base 10; cells split at ',' (no
  trimming), a cell in double quotes may hold one.
- rmm/mr/device/logging_resource_adaptor.hpp: the header `Thread,Time,Action,Pointer,Size,Stream`.

A drift in poolshim's columns, action names or number formats makes `parse` raise RmmParseError
where RMM's replay benchmark would throw.
"""

import re

RMM_HEADER = "Thread,Time,Action,Pointer,Size,Stream"
ACTIONS = ("allocate", "free", "allocate failure")


class RmmParseError(ValueError):
    pass


def _stoul(text, what):
    """std::stoul(text) / std::stoull(text): base 10, leading white space and a sign allowed,
    then at least one digit; parsing stops at the first other character."""
    m = re.match(r"[ \t\n\v\f\r]*([+-]?)([0-9]+)", text)
    if not m:
        raise RmmParseError(f"{what}: std::stoul({text!r}) throws invalid_argument")
    value = int(m.group(2))
    if value >= 1 << 64:
        raise RmmParseError(f"{what}: std::stoul({text!r}) throws out_of_range")
    return (-value) % (1 << 64) if m.group(1) == "-" else value


def _stoll16(text, what):
    """std::stoll(text, nullptr, 16): an optional 0x or 0X, then hex digits; must fit a long long."""
    m = re.match(r"[ \t\n\v\f\r]*([+-]?)(?:0[xX](?=[0-9a-fA-F]))?([0-9a-fA-F]+)", text)
    if not m:
        raise RmmParseError(f"{what}: std::stoll({text!r}, 16) throws invalid_argument")
    value = int(m.group(2), 16)
    value = -value if m.group(1) == "-" else value
    if not -(1 << 63) <= value < 1 << 63:
        raise RmmParseError(f"{what}: std::stoll({text!r}, 16) throws out_of_range")
    return value


def _cells(line):
    """One rapidcsv row: cells split at ',', a double-quoted cell may hold ',' ("" is a quote)."""
    cells, cell, quoted, i = [], "", False, 0
    while i < len(line):
        c = line[i]
        if c == '"':
            if quoted and i + 1 < len(line) and line[i + 1] == '"':
                cell += '"'
                i += 1
            else:
                quoted = not quoted
        elif c == "," and not quoted:
            cells.append(cell)
            cell = ""
        else:
            cell += c
        i += 1
    cells.append(cell)
    return cells


def parse(path):
    """The events of an RMM log as RMM's parse_csv builds them: a list of dicts with `thread`,
    `action`, `pointer`, `size`, `stream`, `index`. Raises RmmParseError where parse_csv throws."""
    with open(path, newline="") as f:
        text = f.read()
    rows = [_cells(line) for line in text.split("\n") if line != ""]
    if not rows:
        raise RmmParseError(f"{path}: empty")
    names = rows[0]

    def column(name, convert):
        if name not in names:
            raise RmmParseError(f"{path}: column not found: {name}")
        idx = names.index(name)
        out = []
        for n, row in enumerate(rows[1:], start=2):
            if idx >= len(row):
                raise RmmParseError(f"{path}:{n}: no cell {idx} (vector::at throws out_of_range)")
            out.append(convert(row[idx], f"{path}:{n} {name}"))
        return out

    threads = column("Thread", _stoul)
    actions = column("Action", lambda s, what: s)
    pointers = column("Pointer", _stoll16)
    sizes = column("Size", _stoul)
    streams = column("Stream", _stoul)
    if not all(len(c) == len(sizes) for c in (threads, actions, pointers, streams)):
        raise RmmParseError(f"{path}: Size mismatch in columns of parsed log.")
    events = []
    for i, action in enumerate(actions):
        if action not in ACTIONS:
            raise RmmParseError(f"{path}:{i + 2}: Invalid action string. ({action!r})")
        events.append({"thread": threads[i], "action": action, "pointer": pointers[i], "size": sizes[i],
                       "stream": streams[i], "index": i})
    return events
