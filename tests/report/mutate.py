"""Hostile logs made from valid ones, for the property test of test_report.py (class Fuzz).

mutants(seed, count, sources) yields (name, bytes): each one a valid log (a fixture) with one
to three damages of the kinds an audit found or a damaged disk, a foreign writer or an
attacker could make: cut short, bytes flipped, control bytes inserted, lines dropped,
duplicated or reordered, garbage lines, and values replaced by huge or odd numbers, deep
nesting, lone surrogates, control characters, long strings, wrong types, missing fields and
record types swapped. The same seed gives the same logs on every machine and Python version
(only random.Random.random() is used: its sequence for a seed is the one Python promises to
keep).
"""

import json
import random

# Raw JSON texts put in place of a value. Some cannot come out of json.dumps (numbers Python
# refuses to convert, lone surrogates, NaN, nesting past its recursion limit).
HOSTILE_VALUES = [
    "9" * 5000, "9" * 400, "-" + "9" * 30, "18446744073709551616", "-9223372036854775809", "-1", "0",
    "1e308", "-1e308", "1e400", "NaN", "Infinity", "-Infinity", "4294967296.5", "2147483648", "0.5", "-0.0",
    "true", "false", "null", '""', '"x"', '"0x10"', '"\\u00b2"', '"' + "9" * 5000 + '"', '"\\ud800"',
    '"a\\udfffb"', '"\\u001b[2J\\u001b[31mred\\u0007\\r"', '"\\u0000"', '"\\u202eevil"', '"A\\nB"',
    '"' + "W" * 100_000 + '"', "[]", "{}", '[{"module": 5}]', '{"a": 1}', "[" * 5000 + "]" * 5000,
    '{"a":' * 3000 + "1" + "}" * 3000, "[" * 40 + "]" * 40, '["\\u001b]0;title\\u0007"]',
]

PLACEHOLDER = "\u0000poolshim-mutate\u0000"
RECORD_TYPES = ("start", "sample", "oom", "warning", "exit")


class _Rng:
    def __init__(self, seed):
        self._random = random.Random(seed).random

    def below(self, n):
        """0 <= an integer < n."""
        return int(self._random() * n)

    def pick(self, items):
        return items[self.below(len(items))]


def _locations(value, out, depth=0):
    """(container, key) of every value inside `value` (lists and objects), outermost first."""
    if depth > 12:
        return
    if isinstance(value, dict):
        for k in list(value):
            out.append((value, k))
            _locations(value[k], out, depth + 1)
    elif isinstance(value, list):
        for i in range(len(value)):
            out.append((value, i))
            _locations(value[i], out, depth + 1)


def _dump(record, raw=None):
    text = json.dumps(record, separators=(",", ":"))
    if raw is not None:
        text = text.replace(json.dumps(PLACEHOLDER), raw, 1)
    return text.encode("utf-8")


def _mutate_record(rng, line):
    """One damage to the record on `line` (bytes), or None when the line is not a JSON object."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):           # damaged already (by an earlier damage)
        return None
    if not isinstance(record, dict):
        return None
    places = []
    _locations(record, places)
    if not places:
        return None
    container, key = rng.pick(places)
    kind = rng.below(6)
    if kind <= 2:                                   # a hostile value in place of any value
        container[key] = PLACEHOLDER
        return _dump(record, rng.pick(HOSTILE_VALUES))
    if kind == 3:                                   # a field missing
        del container[key]
        return _dump(record)
    if kind == 4:                                   # another record type's shape
        record["type"] = rng.pick(RECORD_TYPES)
        return _dump(record)
    if isinstance(container, dict):                 # an unknown field next to a known one
        container["x_" + str(key)] = PLACEHOLDER
    else:                                           # an item more in a list
        container.append(PLACEHOLDER)
    return _dump(record, rng.pick(HOSTILE_VALUES))


GARBAGE_LINES = [b"", b"{}", b"[]", b"null", b'{"schema":1}', b'{"schema":1,"type":"exit","t":0,"pid":1}',
                 b"\xff\xfe\x00", b'{"schema":1,"type":"sample","t":0,"pid":1,"device":0}', b"{" * 3000]


def _damage(rng, lines):
    """`lines` (a list of bytes, without newlines) with one damage."""
    lines = list(lines)
    kind = rng.below(10)
    i = rng.below(len(lines)) if lines else 0
    if kind <= 3 and lines:
        mutated = _mutate_record(rng, lines[i])
        if mutated is not None:
            lines[i] = mutated
    elif kind == 4 and lines:                       # bytes flipped
        line = bytearray(lines[i])
        for _ in range(1 + rng.below(3)):
            if line:
                j = rng.below(len(line))
                line[j] ^= 1 << rng.below(8)
        lines[i] = bytes(line)
    elif kind == 5 and lines:                       # a control byte inserted
        j = rng.below(len(lines[i]) + 1)
        lines[i] = lines[i][:j] + bytes([rng.pick(list(range(0, 32)) + [127])]) + lines[i][j:]
    elif kind == 6 and lines:                       # a line dropped or duplicated
        if rng.below(2) == 0:
            del lines[i]
        else:
            lines.insert(rng.below(len(lines) + 1), lines[i])
    elif kind == 7 and len(lines) > 1:              # records reordered
        j = rng.below(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif kind == 8:
        lines.insert(rng.below(len(lines) + 1), rng.pick(GARBAGE_LINES))
    else:                                           # cut short (inside a line, as a crash leaves it)
        text = b"\n".join(lines)
        lines = text[:rng.below(len(text) + 1)].split(b"\n")
    return lines


def mutants(seed, count, sources):
    """`count` (name, bytes) hostile logs made from the files `sources` (a list of paths)."""
    rng = _Rng(seed)
    texts = []
    for path in sources:
        with open(path, "rb") as f:
            texts.append((path, f.read().split(b"\n")))
    for n in range(count):
        path, lines = texts[rng.below(len(texts))]
        for _ in range(rng.pick((1, 1, 1, 2, 3))):
            lines = _damage(rng, lines)
        yield f"mutant-{seed}-{n}", b"\n".join(lines) + b"\n"
