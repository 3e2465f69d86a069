#!/usr/bin/env python3
"""Checks a memory snapshot (poolshim-report --memory-viz, or torch.cuda.memory._dump_snapshot)
the way PyTorch's viewers read it, and prints what they rendered.

    python3 tests/gpu/memory_viz_check.py FILE.pickle

1. The pickle uses only the opcodes that MemoryViz.js's own unpickler (pytorch.org/memory_viz,
   torch/utils/viz/MemoryViz.js `unpickle`) knows, with protocol 2 to 4.
2. The views of MemoryViz.js, replayed here in Python: "Active Memory Timeline"
   (process_alloc_data: each alloc paired with its free_completed, or the "free" that
   annotate_snapshot makes of free_requested + free_completed) and "Allocator State History"
   (MemoryView.simulate_memory: from the segments, the trace undone backwards; every block must
   lie inside a segment at every step, or the view fails in find_segment).
3. torch.cuda._memory_viz (when torch is importable): segsum, trace, trace_plot,
   segment_plot where the installed version has them; the sizes of what they return.

Exit status: 0 all checks passed; 1 a check failed, or torch is not importable (the other checks
still run and print); 2 bad usage or an unreadable file. Standard library only, apart from torch.
"""

import bisect
import pickle
import pickletools
import sys

# MemoryViz.js `unpickle`: the opcodes it has a case for; any other throws "UNKNOWN OPCODE".
VIEWER_OPCODES = frozenset((
    "APPENDS", "BINGET", "BININT", "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME", "LONG1",
    "LONG_BINGET", "MARK", "MEMOIZE", "PROTO", "SETITEMS", "SHORT_BINUNICODE", "STOP", "TUPLE2", "APPEND",
    "NEWFALSE", "BINPUT", "BINUNICODE", "EMPTY_TUPLE", "NEWTRUE", "NONE", "BINFLOAT", "TUPLE", "TUPLE1",
    "TUPLE3", "LONG_BINPUT", "LIST", "DICT", "SETITEM"))


class CheckError(Exception):
    pass


def check_opcodes(data):
    """The opcodes of `data` and its protocol; CheckError for one MemoryViz.js cannot read."""
    seen = set()
    for op, arg, pos in pickletools.genops(data):
        if op.name not in VIEWER_OPCODES:
            raise CheckError(f"opcode {op.name} at byte {pos}: MemoryViz.js's unpickler does not know it")
        if op.name == "PROTO" and not 2 <= arg <= 4:
            raise CheckError(f"protocol {arg}: MemoryViz.js reads 2 to 4")
        if op.name == "LONG1" and abs(arg) >= 1 << 53:
            # Read through a BigInt64Array and Number(), or as a BigInt beyond 8 bytes: either way
            # not an exact Number that the views can add.
            raise CheckError(f"integer {arg} at byte {pos}: MemoryViz.js reads it inexactly (above 2^53)")
        seen.add(op.name)
    return seen


def _frames_ok(frames, where):
    if not isinstance(frames, list):
        raise CheckError(f"{where}: frames should be a list")
    for i, f in enumerate(frames):
        if not (isinstance(f, dict) and isinstance(f.get("filename"), str) and isinstance(f.get("name"), str)
                and isinstance(f.get("line"), int)):
            # frameFilter calls name.includes() and filename.includes(): both must be strings.
            raise CheckError(f"{where}: frames[{i}] should be {{'filename': str, 'line': int, 'name': str}}: {f!r}")


def check_shape(snap):
    if not isinstance(snap, dict) or not isinstance(snap.get("segments"), list) \
            or not isinstance(snap.get("device_traces"), list):
        raise CheckError("not a snapshot: a dict with the lists 'segments' and 'device_traces'")
    for i, seg in enumerate(snap["segments"]):
        where = f"segments[{i}]"
        for key in ("device", "address", "total_size", "stream"):
            if not isinstance(seg.get(key), int):
                raise CheckError(f"{where}: {key} should be an integer")
        _frames_ok(seg.get("frames", []), where)
        if sum(b["size"] for b in seg["blocks"]) != seg["total_size"]:
            # annotate_snapshot lays the blocks end to end from the segment's address.
            raise CheckError(f"{where}: its blocks' sizes do not add up to total_size")
        for j, b in enumerate(seg["blocks"]):
            if b.get("state") not in ("active_allocated", "active_pending_free", "inactive"):
                raise CheckError(f"{where}.blocks[{j}]: state {b.get('state')!r}")
            _frames_ok(b.get("frames", []), f"{where}.blocks[{j}]")
    for d, trace in enumerate(snap["device_traces"]):
        for i, e in enumerate(trace):
            where = f"device_traces[{d}][{i}]"
            if not isinstance(e.get("action"), str) or not isinstance(e.get("size"), int):
                raise CheckError(f"{where}: action and size")
            if e["action"] == "oom":
                if not isinstance(e.get("device_free"), int):
                    raise CheckError(f"{where}: an oom entry needs device_free")
            elif not isinstance(e.get("addr"), int):
                raise CheckError(f"{where}: addr")
            _frames_ok(e.get("frames", []), where)


def _annotated(trace):
    """annotate_snapshot's rewrite of one device's trace: free_requested followed by the
    free_completed of its address becomes one "free"."""
    out = []
    for e in trace:
        if e["action"] == "free_completed" and out and out[-1]["action"] == "free_requested" \
                and out[-1]["addr"] == e["addr"]:
            out[-1] = dict(out[-1], action="free")
            continue
        out.append(e)
    return out


def timeline(snap, device, plot_segments=False):
    """process_alloc_data: (elements, actions, initially allocated); the peak of the
    timeline's bytes."""
    trace = _annotated(snap["device_traces"][device])
    alloc = "segment_alloc" if plot_segments else "alloc"
    frees = ("segment_free",) if plot_segments else ("free", "free_completed")
    elements, actions, initially, by_addr = [], [], [], {}
    for e in trace:
        if e["action"] == alloc:
            elements.append(e)
            by_addr[e["addr"]] = len(elements) - 1
            actions.append(len(elements) - 1)
        elif e["action"] in frees:
            if e["addr"] in by_addr:
                actions.append(by_addr.pop(e["addr"]))
            else:
                elements.append(e)
                initially.append(len(elements) - 1)
                actions.append(len(elements) - 1)
    for seg in snap["segments"]:
        if seg["device"] != device:
            continue
        if plot_segments:
            if seg["address"] not in by_addr:
                elements.append({"size": seg["total_size"]})
                initially.append(len(elements) - 1)
        else:
            addr = seg["address"]
            for b in seg["blocks"]:
                if b["state"] == "active_allocated" and addr not in by_addr:
                    elements.append({"size": b["requested_size"]})
                    initially.append(len(elements) - 1)
                addr += b["size"]
    total = sum(elements[i]["size"] for i in initially)
    peak, live = total, set(initially)
    for i in actions:
        if i in live:
            live.discard(i)
            total -= elements[i]["size"]
        else:
            live.add(i)
            total += elements[i]["size"]
        peak = max(peak, total)
    return {"elements": len(elements), "actions": len(actions), "peak": peak, "end": total}


def state_history(snap, device):
    """MemoryView.simulate_memory at every event, last to first: (events, the most segments and
    blocks at once). CheckError where a block lies in no segment (find_segment returns null).
    Every block is checked once at the end state, then only what an event can break: a block
    that comes back (a free undone) must lie in a segment, and a segment that goes (its
    allocation undone) must hold no block. Sorted addresses and bisection keep it n log n, so
    that a real run's tens of thousands of events check in seconds."""
    trace = _annotated(snap["device_traces"][device])
    seg_size, seg_starts = {}, []       # segment address -> size; the addresses, sorted
    blocks, block_starts = {}, []       # block address -> size; the addresses, sorted

    def add_segment(addr, size):
        if addr not in seg_size:
            bisect.insort(seg_starts, addr)
        seg_size[addr] = size

    def add_block(addr, size):
        if addr not in blocks:
            bisect.insort(block_starts, addr)
        blocks[addr] = size

    def drop_block(addr):
        if blocks.pop(addr, None) is not None:
            del block_starts[bisect.bisect_left(block_starts, addr)]

    def in_segment(addr):
        i = bisect.bisect_right(seg_starts, addr) - 1
        return i >= 0 and addr < seg_starts[i] + seg_size[seg_starts[i]]

    def fail(addr, idx):
        raise CheckError(f"device {device}, at event {idx}: the block at {addr:#x} lies in no segment "
                         "(Allocator State History fails in find_segment)")

    for seg in snap["segments"]:
        if seg["device"] != device:
            continue
        add_segment(seg["address"], seg["total_size"])
        addr = seg["address"]
        for b in seg["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                add_block(addr, b["size"])
            addr += b["size"]
    for addr in block_starts:
        if not in_segment(addr):
            fail(addr, len(trace) - 1)

    most_segments, most_blocks = len(seg_starts), len(blocks)
    for idx in range(len(trace) - 1, 0, -1):
        e = trace[idx]
        action = e["action"]
        if action in ("free", "free_completed"):
            add_block(e["addr"], e["size"])
            if not in_segment(e["addr"]):
                fail(e["addr"], idx - 1)
        elif action == "free_requested":
            if e["addr"] not in blocks:
                raise CheckError(f"device {device}, event {idx}: free_requested of {e['addr']:#x}, no such block")
        elif action == "alloc":
            drop_block(e["addr"])
        elif action in ("segment_free", "segment_unmap"):
            add_segment(e["addr"], e["size"])
        elif action in ("segment_alloc", "segment_map"):
            if e["addr"] not in seg_size:
                if action == "segment_alloc":
                    raise CheckError(f"device {device}, event {idx}: segment_alloc of {e['addr']:#x}, "
                                     "which is not a segment then")
            else:
                start, size = e["addr"], seg_size.pop(e["addr"])
                del seg_starts[bisect.bisect_left(seg_starts, start)]
                i = bisect.bisect_left(block_starts, start)
                while i < len(block_starts) and block_starts[i] < start + size:
                    if not in_segment(block_starts[i]):
                        fail(block_starts[i], idx - 1)
                    i += 1
        most_segments, most_blocks = max(most_segments, len(seg_starts)), max(most_blocks, len(blocks))
    return {"events": len(trace), "most_segments": most_segments, "most_blocks": most_blocks}


def devices_shown(snap):
    """The devices MemoryViz.js offers: a trace with entries, or segments."""
    with_segments = {s["device"] for s in snap["segments"]}
    return [d for d, t in enumerate(snap["device_traces"]) if t or d in with_segments]


def check_viewer(data):
    """Checks 1 and 2; returns (snapshot, lines to print)."""
    opcodes = check_opcodes(data)
    snap = pickle.loads(data)
    check_shape(snap)
    out = [f"pickle: {len(data)} bytes, {len(opcodes)} kinds of opcode, all known to MemoryViz.js"]
    for d in devices_shown(snap):
        t = timeline(snap, d)
        s = timeline(snap, d, plot_segments=True)
        h = state_history(snap, d)
        out.append(f"device {d}: Active Memory Timeline {t['elements']} allocations, peak {t['peak']} bytes, "
                   f"{t['end']} at the end; Active Cached Segment Timeline peak {s['peak']} bytes; "
                   f"Allocator State History {h['events']} events, up to {h['most_segments']} segments and "
                   f"{h['most_blocks']} blocks")
    return snap, out


def check_torch(snap):
    """Check 3: lines to print; raises ImportError without torch, other errors on failure."""
    from torch.cuda import _memory_viz
    out = []
    for name, call in (("segsum", lambda: _memory_viz.segsum(snap)),
                       ("trace", lambda: _memory_viz.trace(snap)),
                       ("trace_plot", lambda: _memory_viz.trace_plot(snap)),
                       ("trace_plot segments", lambda: _memory_viz.trace_plot(snap, plot_segments=True)),
                       ("segment_plot", lambda: _memory_viz.segment_plot(snap))):
        if not hasattr(_memory_viz, name.split()[0]):
            out.append(f"torch.cuda._memory_viz.{name}: not in this torch")
            continue
        text = call()
        if not isinstance(text, str) or not text:
            raise CheckError(f"torch.cuda._memory_viz.{name} returned {type(text).__name__}, not text")
        out.append(f"torch.cuda._memory_viz.{name}: {len(text)} characters")
        if name == "segsum":
            out += ["  " + line for line in text.splitlines() if line.startswith(("segments:", "total_"))]
    return out


def main(argv):
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: memory_viz_check.py FILE.pickle", file=sys.stderr if len(argv) != 1 else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    try:
        with open(argv[0], "rb") as f:
            data = f.read()
    except OSError as e:
        print(f"memory_viz_check: cannot read {argv[0]}: {e.strerror}", file=sys.stderr)
        return 2
    try:
        snap, lines = check_viewer(data)
        print("\n".join(lines))
    except (CheckError, pickle.UnpicklingError, KeyError, TypeError, ValueError) as e:
        print(f"memory_viz_check: FAIL: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    try:
        lines = check_torch(snap)
    except ImportError as e:
        print(f"memory_viz_check: FAIL: torch.cuda._memory_viz cannot be imported ({e})", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001  (whatever torch raises is the finding)
        print(f"memory_viz_check: FAIL: torch.cuda._memory_viz: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    print("memory_viz_check: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
