"""File and line of call-site frames, where the module's debug information has them.

The library records module + offset (and function names) only; the file and line come here,
offline, from binutils' addr2line when it is on PATH and the module file is readable. Frames
get a "line" entry ("oom_cases.cpp:27") when addr2line knows it; nothing changes otherwise."""

import os
import shutil
import subprocess


def _frames(value, out):
    """Every frame dict (a dict with "module" and "offset") found anywhere in `value`."""
    if isinstance(value, dict):
        if "module" in value and "offset" in value:
            out.append(value)
            return
        for v in value.values():
            _frames(v, out)
    elif isinstance(value, list):
        for v in value:
            _frames(v, out)


def annotate(records):
    """Adds "line" to the frames in `records` that addr2line can place."""
    tool = shutil.which("addr2line")
    if tool is None:
        return
    frames = []
    _frames(records, frames)
    by_module = {}
    for f in frames:
        module, offset = f.get("module"), f.get("offset")
        if isinstance(module, str) and isinstance(offset, int) and os.path.isfile(module):
            by_module.setdefault(module, set()).add(offset)
    places = {}
    for module, offsets in by_module.items():
        ordered = sorted(offsets)
        try:
            done = subprocess.run([tool, "-e", module] + [hex(o) for o in ordered], capture_output=True,
                                  text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        answers = done.stdout.splitlines()
        if done.returncode != 0 or len(answers) != len(ordered):
            continue
        for offset, answer in zip(ordered, answers):
            path, _, line = answer.rpartition(":")
            line = line.split()[0] if line else ""
            if path and path != "??" and line.isdigit() and line != "0":
                places[(module, offset)] = f"{os.path.basename(path)}:{line}"
    for f in frames:
        place = places.get((f.get("module"), f.get("offset")))
        if place:
            f["line"] = place
