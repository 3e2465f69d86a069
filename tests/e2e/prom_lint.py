"""A strict reader of Prometheus' text exposition format (version 0.0.4), with the lint rules of
`promtool check metrics` (client_golang's promlint), for the tests of POOLSHIM_PROM_FILE.

promtool itself is in Debian's `prometheus` package, a server of 96 MB with its own user and
service; the tests use it when it is on PATH (check_with_promtool) and otherwise rely on this
module, whose rules follow the format's specification
(https://prometheus.io/docs/instrumenting/exposition_formats/) and promlint's source:

Format (errors, as promtool's parser, expfmt.TextParser, reports them):
- a line is `# HELP name text`, `# TYPE name type`, another comment, blank, or a sample
  `name{label="value",...} value [timestamp]`;
- names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]* and do not start
  with `__`; label values are quoted with only \\\\, \\" and \\n escaped; no label twice;
- values are floats (or +Inf, -Inf, NaN), timestamps integers;
- at most one HELP and one TYPE per family, both before its first sample; TYPE is one of
  counter, gauge, histogram, summary, untyped; a family's samples are contiguous (a family
  that comes back after another is "second TYPE line" / "duplicate" in expfmt);
- no two samples with the same name and labels; the text ends with a newline.
Lint (problems promtool prints and exits 1 on):
- "no help text"; "counter metrics should have \"_total\" suffix"; non-histogram,
  non-summary names ending in _count, _sum or _bucket; "metric names should not contain ':'";
  names and label names in snake_case (no capital letters); no type name in a metric name
  ("metric name should not include type '...'"); base units only (seconds, bytes, ...: no
  milliseconds, kilobytes, ...) and no abbreviated units (_ms, _kb, ...).
"""

import math
import re
import shutil
import subprocess
import tempfile

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
# promlint's units: the non-base units it names, and abbreviations it refuses.
NON_BASE_UNITS = {"minutes": "seconds", "hours": "seconds", "days": "seconds", "weeks": "seconds",
                  "milliseconds": "seconds", "microseconds": "seconds", "nanoseconds": "seconds",
                  "kilobytes": "bytes", "megabytes": "bytes", "gigabytes": "bytes", "terabytes": "bytes",
                  "petabytes": "bytes", "kibibytes": "bytes", "mebibytes": "bytes", "gibibytes": "bytes",
                  "tebibytes": "bytes", "pebibytes": "bytes", "bits": "bytes", "percent": "ratios",
                  "celsius": "celsius"}
ABBREVIATIONS = ("_ms", "_us", "_ns", "_sec", "_secs", "_kb", "_mb", "_gb", "_kib", "_mib", "_gib", "_pct",
                 "_perc", "_cnt", "_c", "_d", "_h", "_m", "_s", "_b", "_byte")


class PromError(Exception):
    """The text is not valid exposition format (line number and reason)."""


def _family(name, types):
    """The family a sample belongs to: histogram and summary samples carry suffixes."""
    for suffix in ("_bucket", "_count", "_sum"):
        base = name[:-len(suffix)]
        if name.endswith(suffix) and types.get(base) in ("histogram", "summary"):
            return base
    return name


def _labels(text, n):
    """Parses `a="x",b="y"` (the inside of the braces) into a list of (name, value)."""
    out, i = [], 0
    while i < len(text):
        m = re.compile(r"\s*([^=\s]+)\s*=\s*\"").match(text, i)
        if not m:
            raise PromError(f"line {n}: bad label list {text!r}")
        name = m.group(1)
        if not LABEL_NAME.match(name) or name.startswith("__"):
            raise PromError(f"line {n}: bad label name {name!r}")
        i, value = m.end(), []
        while True:
            if i >= len(text):
                raise PromError(f"line {n}: unterminated label value of {name}")
            c = text[i]
            if c == "\\":
                nxt = text[i + 1:i + 2]
                if nxt not in ("\\", '"', "n"):
                    raise PromError(f"line {n}: bad escape \\{nxt} in label {name}")
                value.append("\n" if nxt == "n" else nxt)
                i += 2
            elif c == '"':
                i += 1
                break
            elif c == "\n":
                raise PromError(f"line {n}: newline in label {name}")
            else:
                value.append(c)
                i += 1
        if name in [k for k, _ in out]:
            raise PromError(f"line {n}: label {name} twice")
        out.append((name, "".join(value)))
        m = re.compile(r"\s*(,|\Z)").match(text, i)
        if not m:
            raise PromError(f"line {n}: expected ',' after label {name}")
        i = m.end()
    return out


def _value(text, n):
    if text in ("+Inf", "-Inf", "NaN", "Inf"):
        return float(text.replace("Inf", "inf").replace("NaN", "nan"))
    try:
        v = float(text)
    except ValueError:
        raise PromError(f"line {n}: bad value {text!r}")
    if math.isnan(v) and text != "NaN":
        raise PromError(f"line {n}: bad value {text!r}")
    return v


def parse(text):
    """Families as {name: {"type", "help", "samples": [(name, labels tuple, value)]}}, in order.
    Raises PromError for anything promtool's parser refuses."""
    if text and not text.endswith("\n"):
        raise PromError("the text does not end with a newline")
    families, types, done, seen, current = {}, {}, set(), set(), None
    for n, line in enumerate(text.split("\n")[:-1], start=1):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not METRIC_NAME.match(name):
                    raise PromError(f"line {n}: bad metric name {name!r}")
                fam = families.setdefault(name, {"type": None, "help": None, "samples": []})
                if name in done or fam["samples"]:
                    raise PromError(f"line {n}: {parts[1]} for {name} after its samples")
                key = parts[1].lower()
                if fam[key] is not None:
                    raise PromError(f"line {n}: second {parts[1]} line for {name}")
                if parts[1] == "TYPE":
                    if len(parts) < 4 or parts[3].strip() not in TYPES:
                        raise PromError(f"line {n}: bad type {parts[3:]!r} for {name}")
                    fam["type"] = types[name] = parts[3].strip()
                else:
                    fam["help"] = parts[3] if len(parts) > 3 else ""
                if current is not None and current != name:
                    done.add(current)
                current = name
            continue
        m = re.match(r"([^\s{]+)(?:\{(.*)\})?\s+(\S+)(?:\s+(\S+))?\s*\Z", line)
        if not m:
            raise PromError(f"line {n}: not a sample: {line!r}")
        name, labels, value, stamp = m.groups()
        if not METRIC_NAME.match(name):
            raise PromError(f"line {n}: bad metric name {name!r}")
        labels = tuple(_labels(labels, n)) if labels else ()
        _value(value, n)
        if stamp is not None and not re.fullmatch(r"-?\d+", stamp):
            raise PromError(f"line {n}: bad timestamp {stamp!r}")
        fam_name = _family(name, types)
        if fam_name in done:
            raise PromError(f"line {n}: samples of {fam_name} are not together")
        if current is not None and current != fam_name:
            done.add(current)
        current = fam_name
        key = (name, tuple(sorted(labels)))
        if key in seen:
            raise PromError(f"line {n}: second sample of {name}{dict(labels)}")
        seen.add(key)
        families.setdefault(fam_name, {"type": None, "help": None, "samples": []})["samples"].append(
            (name, labels, _value(value, n)))
    return families


def lint(families):
    """promlint's problems, as (metric, text) pairs."""
    problems = []
    for name, fam in families.items():
        kind = fam["type"] or "untyped"
        if not fam["help"]:
            problems.append((name, "no help text"))
        if kind == "counter" and not name.endswith("_total"):
            problems.append((name, 'counter metrics should have "_total" suffix'))
        if kind not in ("histogram", "summary"):
            for suffix in ("_count", "_sum", "_bucket"):
                if name.endswith(suffix):
                    problems.append((name, f'non-histogram and non-summary metrics should not have "{suffix}" '
                                           "suffix"))
        if ":" in name:
            problems.append((name, "metric names should not contain ':'"))
        if name != name.lower():
            problems.append((name, "metric names should be written in 'snake_case' not 'camelCase'"))
        for _, labels, _ in fam["samples"]:
            for label, _ in labels:
                if label != label.lower():
                    problems.append((name, "label names should be written in 'snake_case' not 'camelCase'"))
        words = name.split("_")
        for t in TYPES[:4]:
            if t in words:
                problems.append((name, f"metric name should not include type '{t}'"))
        for unit, base in NON_BASE_UNITS.items():
            if unit in words:
                problems.append((name, f'use base unit "{base}" instead of "{unit}"'))
        if any(a[1:] in words for a in ABBREVIATIONS):
            problems.append((name, "metric names should not contain abbreviated units"))
    return problems


def check(text):
    """Parses and lints `text`; returns promtool-style problem lines (empty: it passes)."""
    try:
        families = parse(text)
    except PromError as e:
        return [f"error while linting: {e}"]
    return [f"{name} {problem}" for name, problem in lint(families)]


def check_with_promtool(text):
    """`promtool check metrics` on `text` when promtool is on PATH: (returncode, output), or None."""
    promtool = shutil.which("promtool")
    if promtool is None:
        return None
    with tempfile.TemporaryFile("w+") as f:
        f.write(text)
        f.seek(0)
        r = subprocess.run([promtool, "check", "metrics"], stdin=f, capture_output=True, text=True, timeout=60)
    return r.returncode, (r.stdout + r.stderr).strip()
