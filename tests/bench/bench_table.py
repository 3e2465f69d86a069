"""The arithmetic of the benchmark suite (issue 6), kept apart from running anything so that
tests/bench/test_bench_table.py can check it on fixtures: per (group, contender) the median and
spread of the raw runs, the ratios (always computed from medians), the text table and the
verdict on each of the issue's targets.

A *sample* is one figure of one run: {"group", "contender", "metric", "value", "round"}; a value
of None means the figure does not exist for that run (printed "n/a"). A *group* is one section
of the table: one workload setting with its contenders, the metric its rows summarise and the
contender its ratios refer to.
"""

import statistics
from dataclasses import dataclass, field

# How a row's ratio is computed from the medians of the row (this) and of the baseline (base).
BASE_OVER_THIS = "base/this"  # a speed-up, for times: 10 means ten times faster than the baseline
THIS_OVER_BASE = "this/base"  # relative time (1.05 = 5% slower) or relative throughput
COST_PERCENT = "cost%"        # (this / base - 1) * 100: what an option costs over the baseline

# Group and contender names: the runner makes samples under these names, the targets read them.
CHURN_64 = "churn 64 live"
CHURN_64_KERNEL = "churn 64 live + kernel"
CHURN_1 = "churn 1 live"
CHURN_1_KERNEL = "churn 1 live + kernel"
ASYNC_64 = "async 64 live"
THREAD_COUNTS = (1, 2, 4, 8, 16)
TORCH = "torch"
OBSERVE_CHURN = "observability: churn 64 live"
OBSERVE_TORCH = "observability: torch"
OBSERVE_MODE_CHURN = "observe mode: churn 64 live"
OBSERVE_MODE_TORCH = "observe mode: torch"


def threads_group(count):
    return f"threads {count}"


NATIVE = "native"
SHIM_SYNC = "shim sync"
SHIM_ORDERED = "shim ordered"
NATIVE_DEFAULT_POOL = "native default pool"
NATIVE_DEFAULT_POOL_KEEP = "native default pool, threshold max"
DIRECT_POOL = "direct pool"
TORCH_CACHING = "native caching"
TORCH_ASYNC_BACKEND = "backend:cudaMallocAsync"
TORCH_UNCACHED = "uncached"
TORCH_UNCACHED_SYNC = "uncached + shim sync"
TORCH_UNCACHED_ORDERED = "uncached + shim ordered"
# The memory side of the cache: the same run with the cache held to 256 MiB (POOLSHIM_CACHE).
LOG_OFF = "log off"
LOG_100MS = "log 100 ms"
BACKTRACE_8 = "backtrace 8"
# POOLSHIM_EVENTS (issue 17): one CSV row per allocation and free, through the lock-free queue.
EVENT_LOG = "event log"
# Observe mode (issue 15): every call native, each allocation tracked and logged.
OBSERVE_MODE = "observe mode"
OBSERVE_MODE_BT = "observe mode, backtrace 8"

MET, NOT_MET, NOT_MEASURED = "MET", "NOT MET", "NOT MEASURED"


@dataclass
class Group:
    name: str
    workload: str
    metric: str                 # the sample metric the rows summarise
    unit: str                   # what the metric is, for the heading
    baseline: str               # the contender the ratios refer to
    ratio: str                  # BASE_OVER_THIS, THIS_OVER_BASE or COST_PERCENT
    contenders: list
    digits: int = 2             # decimals of the metric in the table
    higher_is_better: bool = False
    extras: tuple = ()          # (metric, heading, digits): medians shown in extra columns
    show_delta: bool = False    # a column with this median - the baseline's median


def summarize(values):
    """Median, min, max and count of the values that exist; None when none does."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return {"median": statistics.median(present), "min": min(present), "max": max(present), "n": len(present)}


def ratio_of(kind, this, base):
    if this is None or base is None:
        return None
    if kind == BASE_OVER_THIS:
        return base / this if this else None
    if base == 0:
        return None
    if kind == THIS_OVER_BASE:
        return this / base
    if kind == COST_PERCENT:
        return (this / base - 1) * 100
    raise ValueError(f"unknown ratio kind {kind!r}")


def group_rows(group, samples):
    """One row per contender of the group, in the group's order."""
    values = {}
    for s in samples:
        if s["group"] == group.name:
            values.setdefault((s["contender"], s["metric"]), []).append(s["value"])
    base = summarize(values.get((group.baseline, group.metric), []))
    base_median = base["median"] if base else None
    rows = []
    for contender in group.contenders:
        stats = summarize(values.get((contender, group.metric), []))
        median = stats["median"] if stats else None
        extras = {}
        for metric, _, _ in group.extras:
            extra = summarize(values.get((contender, metric), []))
            extras[metric] = extra["median"] if extra else None
        rows.append({
            "group": group.name, "contender": contender, "metric": group.metric,
            "median": median, "min": stats["min"] if stats else None, "max": stats["max"] if stats else None,
            "n": stats["n"] if stats else 0,
            "ratio": ratio_of(group.ratio, median, base_median), "ratio_kind": group.ratio,
            "delta": median - base_median if median is not None and base_median is not None else None,
            "extras": extras})
    return rows


def all_rows(groups, samples):
    """{(group, contender): row} over every group."""
    return {(r["group"], r["contender"]): r for g in groups for r in group_rows(g, samples)}


# ---- the table ---------------------------------------------------------------------------------

def fmt_number(value, digits):
    return "n/a" if value is None else f"{value:.{digits}f}"


def fmt_ratio(kind, value):
    if value is None:
        return "n/a"
    if kind == BASE_OVER_THIS:
        return f"{value:.2f}x"
    if kind == COST_PERCENT:
        return f"{value:+.1f}%"
    return f"{value:.3f}"


RATIO_MEANING = {
    BASE_OVER_THIS: "ratio = {base} / contender (speed-up)",
    THIS_OVER_BASE: "ratio = contender / {base}",
    COST_PERCENT: "cost = contender / {base} - 1",
}


def render_group(group, rows, status=None, notes=()):
    """The table section of one group: a heading, one line per contender, then notes."""
    better = "higher" if group.higher_is_better else "lower"
    lines = [f"== {group.name}: {group.unit} ({better} is better); "
             + RATIO_MEANING[group.ratio].format(base=group.baseline)]
    if status:
        lines.append(f"   !! {status}")
    headings = ["contender", "median", "spread (min-max)", "runs", "cost" if group.ratio == COST_PERCENT else "ratio"]
    if group.show_delta:
        headings.append("delta")
    headings += [heading for _, heading, _ in group.extras]
    table = [headings]
    for r in rows:
        digits = group.digits
        spread = "n/a" if r["min"] is None else f"{fmt_number(r['min'], digits)}-{fmt_number(r['max'], digits)}"
        ratio = fmt_ratio(group.ratio, r["ratio"])
        line = [r["contender"], fmt_number(r["median"], digits), spread, str(r["n"]), ratio]
        if group.show_delta:
            line.append("n/a" if r["delta"] is None else f"{r['delta']:+.{digits}f}")
        line += [fmt_number(r["extras"].get(metric), digits) for metric, _, digits in group.extras]
        table.append(line)
    widths = [max(len(row[i]) for row in table) for i in range(len(headings))]
    for row in table:
        cells = [row[0].ljust(widths[0])] + [cell.rjust(widths[i]) for i, cell in enumerate(row) if i > 0]
        lines.append("   " + "  ".join(cells).rstrip())
    lines += [f"   note: {n}" for n in notes]
    return "\n".join(lines)


# ---- targets -----------------------------------------------------------------------------------

@dataclass
class Target:
    text: str       # the issue's target, in words
    kind: str       # ratio_at_least, ratio_at_most, delta_at_most, cross_ratio_at_least,
                    # min_ratio_at_least, extra_ratio_at_most
    limit: float
    params: dict = field(default_factory=dict)


ISSUE_TARGETS = [
    Target("churn 64 live: shim sync at least 10x faster than native", "ratio_at_least", 10.0,
           {"group": CHURN_64, "contender": SHIM_SYNC}),
    Target("churn 64 live: shim ordered at least 30x faster than native", "ratio_at_least", 30.0,
           {"group": CHURN_64, "contender": SHIM_ORDERED}),
    Target("async: shim cudaMallocAsync+cudaFreeAsync at most 1.05x direct cudaMallocFromPoolAsync",
           "ratio_at_most", 1.05, {"group": ASYNC_64, "contender": SHIM_SYNC}),
    Target("threads: shim aggregate at 8 threads at least 4x the 1-thread direct-pool rate",
           "cross_ratio_at_least", 4.0,
           {"numerator": (threads_group(8), SHIM_SYNC), "denominator": (threads_group(1), DIRECT_POOL)}),
    Target("threads (issue 13): shim aggregate at 8 threads at least 4x the shim's own 1-thread rate",
           "cross_ratio_at_least", 4.0,
           {"numerator": (threads_group(8), SHIM_SYNC), "denominator": (threads_group(1), SHIM_SYNC)}),
    Target("threads: shim at least the direct pool's rate at every thread count", "min_ratio_at_least", 1.0,
           {"groups": [threads_group(n) for n in THREAD_COUNTS], "contender": SHIM_SYNC}),
    Target("PyTorch uncached + shim ordered: step time at most 1.0x PyTorch's native caching allocator",
           "ratio_at_most", 1.0, {"group": TORCH, "contender": TORCH_UNCACHED_ORDERED}),
    Target("PyTorch uncached + shim ordered: peak reserved at most backend:cudaMallocAsync's",
           "extra_ratio_at_most", 1.0,
           {"group": TORCH, "contender": TORCH_UNCACHED_ORDERED, "other": TORCH_ASYNC_BACKEND,
            "metric": "peak_reserved_mb"}),
    Target("logging every 100 ms costs at most 2% (churn 64 live)", "ratio_at_most", 2.0,
           {"group": OBSERVE_CHURN, "contender": LOG_100MS}),
    Target("logging every 100 ms costs at most 2% (PyTorch uncached + shim ordered)", "ratio_at_most", 2.0,
           {"group": OBSERVE_TORCH, "contender": LOG_100MS}),
    Target("POOLSHIM_BACKTRACE=8 costs at most 1.5 us per allocation (churn 64 live)", "delta_at_most", 1.5,
           {"group": OBSERVE_CHURN, "contender": BACKTRACE_8}),
]


def _usable(rows, broken, group, contender):
    if group in broken:
        return None
    return rows.get((group, contender))


def _measure(target, rows, broken):
    """(value, figure text) of a target, or (None, why not)."""
    p = target.params
    if target.kind in ("ratio_at_least", "ratio_at_most", "delta_at_most"):
        row = _usable(rows, broken, p["group"], p["contender"])
        key = "delta" if target.kind == "delta_at_most" else "ratio"
        if row is None or row[key] is None:
            return None, f"{p['group']} / {p['contender']} not measured"
        value = row[key]
        if target.kind == "delta_at_most":
            return value, f"{value:+.2f} us per allocation ({p['group']}, {p['contender']})"
        return value, f"{fmt_ratio(row['ratio_kind'], value)} ({p['group']}, {p['contender']})"
    if target.kind == "cross_ratio_at_least":
        num = _usable(rows, broken, *p["numerator"])
        den = _usable(rows, broken, *p["denominator"])
        if num is None or den is None or num["median"] is None or not den["median"]:
            return None, "not measured"
        value = num["median"] / den["median"]
        return value, (f"{value:.2f}x ({p['numerator'][1]} {p['numerator'][0]}: {num['median']:.3f} / "
                       f"{p['denominator'][1]} {p['denominator'][0]}: {den['median']:.3f})")
    if target.kind == "min_ratio_at_least":
        found = []
        for g in p["groups"]:
            row = _usable(rows, broken, g, p["contender"])
            if row is None or row["ratio"] is None:
                return None, f"{g} not measured"
            found.append((row["ratio"], g))
        value, where = min(found)
        return value, f"lowest {value:.3f} at {where}"
    if target.kind == "extra_ratio_at_most":
        this = _usable(rows, broken, p["group"], p["contender"])
        other = _usable(rows, broken, p["group"], p["other"])
        a = this["extras"].get(p["metric"]) if this else None
        b = other["extras"].get(p["metric"]) if other else None
        if a is None or not b:
            return None, f"{p['metric']} not measured"
        value = a / b
        return value, f"{value:.3f} ({a:.0f} / {b:.0f})"
    raise ValueError(f"unknown target kind {target.kind!r}")


def evaluate_targets(targets, rows, broken=()):
    """One verdict per target: MET, NOT MET, or NOT MEASURED (its workload did not run, broke,
    or lacks the figure)."""
    out = []
    for t in targets:
        value, figure = _measure(t, rows, set(broken))
        if value is None:
            verdict = NOT_MEASURED
        elif t.kind.endswith("at_least"):
            verdict = MET if value >= t.limit else NOT_MET
        else:
            verdict = MET if value <= t.limit else NOT_MET
        out.append({"target": t.text, "limit": t.limit, "value": value, "figure": figure, "verdict": verdict})
    return out


def render_targets(verdicts):
    width = max((len(v["verdict"]) for v in verdicts), default=0)
    lines = ["== targets (issue 6; one of issue 13)"]
    for v in verdicts:
        lines.append(f"   {v['verdict'].ljust(width)}  {v['target']}: {v['figure']}")
    return "\n".join(lines)
