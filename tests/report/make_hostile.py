#!/usr/bin/env python3
"""Writes the hostile logs of tests/report/hostile (deterministic; run it again after changing
it, and update what test_report.py's HostileCorpus expects).

    python3 tests/report/make_hostile.py

Each is one small valid log (BASE: a start record, two samples, a warning and an exit record)
with one defect of issue 12 ("Hardening"), named after it. Some of them a reader must refuse
with file:line and why; the others it must read and render in every output.
"""

import json
import os

HERE = os.path.dirname(os.path.realpath(__file__))
HOSTILE = os.path.join(HERE, "hostile")
MiB = 1 << 20

FRAME = {"module": "/opt/app/bin/app", "offset": 0x1234, "function": "Solver::step(int)", "function_offset": 0x40}


def figures(reserved, used):
    """A device's figures, as sample records and the exit record's devices have them."""
    return {"device": 0, "reserved_bytes": reserved, "reserved_bytes_peak": reserved, "used_bytes": used,
            "used_bytes_peak": used, "requested_bytes": used, "requested_bytes_peak": used, "allocs": 10,
            "frees": 5, "pool_slack": round(1 - used / reserved, 3), "rounding_waste": 0.0,
            "size_histogram": {"1048576": 5}}


def sample(t, reserved, used):
    return dict({"schema": 1, "type": "sample", "t": t, "pid": 4100}, **figures(reserved, used))


def base():
    """The records of the valid log every hostile one is made from (line n is records[n - 1])."""
    return [
        {"schema": 1, "type": "start", "t": 0.001, "pid": 4100, "version": "0.3.0", "host": "node-1", "rank": "0",
         "start_unix_s": 1796300000, "command_line": ["./app", "--steps", "10"], "config": {"limit": "0"},
         "config_sources": {"limit": "default"}, "devices": [{"device": 0, "name": "NVIDIA H200",
                                                              "total_bytes": 150102114304}]},
        sample(0.5, 8 * MiB, 4 * MiB),
        {"schema": 1, "type": "warning", "t": 0.6, "pid": 4100, "message": "POOLSHIM_FREE=fast: not a mode; using sync"},
        sample(1.0, 8 * MiB, 2 * MiB),
        {"schema": 1, "type": "exit", "t": 1.2, "pid": 4100, "pooled_allocs": 10,
         "devices": [figures(8 * MiB, 2 * MiB)],
         "leaks": {"count": 1, "bytes": 2 * MiB,
                   "largest": [{"device": 0, "bytes": 2 * MiB, "age_s": 0.7, "async": False, "stream": 0,
                                "site": [FRAME]}],
                   "by_site": [{"site": [FRAME], "count": 1, "bytes": 2 * MiB}]},
         "notes": []},
    ]


PLACE = "\u0000raw\u0000"   # stands for a raw JSON text json.dumps cannot write


def dump(record, raw=None):
    text = json.dumps(record, separators=(",", ":"))
    return text if raw is None else text.replace(json.dumps(PLACE), raw)


def log(records, raws=None):
    """JSON Lines of `records`; raws: {line number: raw JSON text for the PLACE in it}."""
    raws = raws or {}
    return "".join(dump(r, raws.get(n)) + "\n" for n, r in enumerate(records, start=1))


def hostile_logs():
    """{file name: text}."""
    out = {}

    r = base()
    r[4]["leaks"]["largest"][0]["stream"] = PLACE
    out["integer_5000_digits.jsonl"] = log(r, {5: "9" * 5000})

    r = base()
    r[1]["reserved_bytes"] = PLACE
    out["reserved_bytes_400_digits.jsonl"] = log(r, {2: "7" * 400})

    r = base()
    r[2]["context"] = PLACE
    out["arrays_nested_5000_deep.jsonl"] = log(r, {3: "[" * 5000 + "]" * 5000})

    r = base()
    r[4]["notes"] = PLACE
    out["objects_nested_5000_deep.jsonl"] = log(r, {5: '{"a":' * 5000 + "1" + "}" * 5000})

    r = base()   # deep enough to be refused, not so deep that Python's parser gives up first
    r[2]["context"] = PLACE
    out["arrays_nested_40_deep.jsonl"] = log(r, {3: "[" * 40 + "]" * 40})

    r = base()
    r[3]["t"] = PLACE
    out["time_1e308.jsonl"] = log(r, {4: "1e308"})

    r = base()
    r[4]["leaks"]["largest"][0]["age_s"] = PLACE
    out["age_1e308.jsonl"] = log(r, {5: "1e308"})

    r = base()
    r[1]["pool_slack"] = PLACE
    out["pool_slack_nan.jsonl"] = log(r, {2: "NaN"})

    r = base()
    r[2]["message"] = PLACE
    out["lone_surrogate.jsonl"] = log(r, {3: '"cannot open /data/\\ud800.bin"'})

    r = base()
    r[0]["config"] = PLACE
    out["lone_surrogate_in_a_key.jsonl"] = log(r, {1: '{"limit":"0","\\udc80":"1"}'})

    r = base()   # readable: the exit record's figures are the only ones (no sample records)
    out["exit_without_samples.jsonl"] = log([r[0], r[2], r[4]])

    r = base()   # readable: every figure at the bound the reader allows
    r[0]["start_unix_s"] = 2 ** 32
    r[3].update(t=2 ** 31, reserved_bytes=2 ** 64 - 1, reserved_bytes_peak=2 ** 64 - 1, used_bytes=2.0 ** 64)
    r[4]["t"] = 2 ** 31
    r[4]["leaks"]["largest"][0]["age_s"] = 2.0 ** 64
    out["figures_at_the_bounds.jsonl"] = log(r)

    r = base()   # readable: control characters in every kind of text the summary shows
    r[0]["command_line"] = ["./app\x1b]0;owned\x07", "--steps\r\x1b[2K10"]
    r[0]["host"] = "node\x1b[31m-1"
    r[0]["devices"][0]["name"] = "NVIDIA\x08\x08H100"
    r[2]["message"] = "\x1b[2J\x1b[Hscreen cleared\x07 and \u202eright-to-left"
    r[4]["leaks"]["by_site"][0]["site"] = [dict(FRAME, function="evil\x1b[5m()", module="/opt/\x9b31mlib.so")]
    r[4]["notes"] = ["note\nwith a line break"]
    out["control_characters.jsonl"] = log(r)

    r = base()   # readable: a warning of 100 000 characters
    r[2]["message"] = "0123456789" * 10_000
    out["warning_100_kb.jsonl"] = log(r)
    return out


def main():
    os.makedirs(HOSTILE, exist_ok=True)
    for name, text in hostile_logs().items():
        with open(os.path.join(HOSTILE, name), "w", encoding="utf-8") as f:
            f.write(text)
    print(f"wrote {len(hostile_logs())} logs in {HOSTILE}")


if __name__ == "__main__":
    main()
