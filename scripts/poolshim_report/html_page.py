"""One self-contained HTML page: no network access of any kind (inline CSS, SVG drawn here,
and a small inline script for the hover read-out; a Content-Security-Policy forbids every
fetch). The charts are complete without the script.

Stable hooks for tests and tools:
  <section class="process" id="run-N-pid-P" data-pid="P">            one per run
  <svg class="timeline" id="tl-N-D" data-pid="P" data-device="D">     one per device of a run
    <polyline class="series reserved|used|requested|cap" points="x,y ...">
    <polyline class="series native|vmm|other" ...>   schema 2, where a sample has them above 0
                                                    (observe mode draws no reserved or used)
    <g class="oom-marker" data-verdict="..." data-t="...">            one per OOM on the device
  <svg class="histogram" data-device="D" data-t="T">                 live allocations by size
    <g class="bucket" data-from="BYTES" data-count="N">               one per size with allocations
  <p class="hint gap" data-cause="cache|fences|pool|rounding">       reserved far above requested
  <table class="figures (bytes|owners|shares|cache|counts)|ooms|peak-sites|peak-largest|leaks|vmm-sites|warnings|processes|merged-devices|merged-leaks|merged-vmm">
The script sets data-interactive="1" on every timeline it has wired up.
"""

import datetime
import html
import json
import math

from . import fmt
from .fmt import (NONE, OBSERVE_LINE, fmt_bytes, fmt_bytes_or_none, fmt_count, fmt_duration, fmt_pct, fmt_seconds,
                  fmt_unix)
from .model import oom_owners_text, oom_pool_text, verdict_counts_text

SERIES = (("reserved", "reserved_bytes"), ("used", "used_bytes"), ("requested", "requested_bytes"))
OBSERVE_SERIES = (("requested", "requested_bytes"),)   # nothing pooled: no reserved or used bytes
UNITS = (("TiB", 1024 ** 4), ("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024), ("B", 1))

# Chart geometry (SVG user units; the SVG scales to the width of its box).
W, H = 900, 300
ML, MR, MT, MB = 70, 18, 16, 34


def esc(text):
    return html.escape("" if text is None else str(text), quote=True)


# ---- the chart ------------------------------------------------------------------------------


def _nice_step(span, target):
    raw = span / max(target, 1)
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _byte_unit(value):
    for name, size in UNITS:
        if value >= size:
            return name, size
    return "B", 1


def _byte_ticks(top):
    """(tick values, upper bound) for a bytes axis from 0 to at least `top`."""
    if top <= 0:
        top = 1024 ** 2
    name, size = _byte_unit(top)
    step = _nice_step(top / size, 5) * size
    n = math.ceil(top / step - 1e-9)
    return [i * step for i in range(n + 1)], n * step, (name, size)


def _time_ticks(t0, t1):
    step = _nice_step(t1 - t0, 8)
    first = math.ceil(t0 / step - 1e-9) * step
    ticks = []
    t = first
    while t <= t1 + 1e-9:
        ticks.append(round(t, 9))
        t += step
    return ticks


def _tick_label(value, unit):
    name, size = unit
    v = value / size
    return f"{v:g} {name}" if v else "0"


def _seconds_label(t):
    return f"{t:g} s"


DOT_SPAN = 24      # a series narrower than this (SVG units) gets a dot at its last point
MAX_POINTS = 1600   # samples drawn per chart; longer runs keep each stretch's first, last, lowest, highest


def _thin(rows, series=SERIES, limit=MAX_POINTS):
    """`rows` (in time order) cut down to about `limit`, keeping in each stretch the first and
    last row and those with the lowest and highest value of each of `series`, so that no peak is lost."""
    if len(rows) <= limit:
        return rows
    buckets = max(limit // 8, 1)
    size = -(-len(rows) // buckets)
    keep = set()
    for start in range(0, len(rows), size):
        chunk = range(start, min(start + size, len(rows)))
        keep.update((chunk[0], chunk[-1]))
        for _, field in series:
            values = [(rows[i].get(field), i) for i in chunk if isinstance(rows[i].get(field), (int, float))]
            if values:
                keep.add(min(values)[1])
                keep.add(max(values)[1])
    return [rows[i] for i in sorted(keep)]


def _points(rows, field):
    out = []
    for r in rows:
        v = r.get(field)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append((r["t"], v))
    return out


def chart_series(run, device):
    """(class, name, field) of the lines of a device's timeline: the pool's, then the owners' that
    are above zero somewhere (schema 2)."""
    pool = [(name, name, field) for name, field in (OBSERVE_SERIES if run.observe else SERIES)]
    return pool + device.owner_series()


def timeline_svg(run, device, svg_id):
    """The SVG timeline of one device of one run, and the data the hover script reads."""
    lines = chart_series(run, device)
    # Every sample, whatever their spacing, and the exit record's figures as the last point.
    rows = _thin(device.rows, [(name, field) for name, _, field in lines])
    series = {name: _points(rows, field) for name, _, field in lines}
    cap = _points(rows, "cap_bytes")
    ooms = sorted(device.ooms, key=lambda o: o["t"])
    times = [t for pts in list(series.values()) + [cap] for t, _ in pts] + [o["t"] for o in ooms]
    t0 = min([0.0] + times)
    t1 = max([t0 + 1e-3] + times + [run.t_max or 0])
    data_top = max([v for pts in series.values() for _, v in pts] + [0])
    cap_top = max([v for _, v in cap] + [0])
    cap_on_scale = bool(cap) and (data_top == 0 or cap_top <= 4 * data_top)
    ticks, y_top, unit = _byte_ticks(max(data_top, cap_top if cap_on_scale else 0) * 1.04)
    pw, ph = W - ML - MR, H - MT - MB

    def x(t):
        return ML + (t - t0) / (t1 - t0) * pw

    def y(v):
        return MT + ph - min(v, y_top) / y_top * ph

    names = [label for _, label, _ in lines]
    drawn = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
    out = [f'<svg class="timeline" id="{esc(svg_id)}" data-pid="{run.pid}" data-device="{device.device}" '
           f'viewBox="0 0 {W} {H}" preserveAspectRatio="xMidYMid meet" role="img" '
           f'aria-label="device {device.device}: {esc(drawn)} bytes over time">']
    # grid and axes
    out.append('<g class="grid">')
    for v in ticks:
        out.append(f'<line x1="{ML}" x2="{W - MR}" y1="{y(v):.1f}" y2="{y(v):.1f}"/>')
    out.append('</g><g class="axis y">')
    for v in ticks:
        out.append(f'<text x="{ML - 8}" y="{y(v) + 4:.1f}" text-anchor="end">{esc(_tick_label(v, unit))}</text>')
    out.append('</g><g class="axis x">')
    for t in _time_ticks(t0, t1):
        out.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{MT + ph}" y2="{MT + ph + 5}"/>'
                   f'<text x="{x(t):.1f}" y="{MT + ph + 20}" text-anchor="middle">{esc(_seconds_label(t))}</text>')
    out.append(f'<line class="baseline" x1="{ML}" x2="{W - MR}" y1="{MT + ph}" y2="{MT + ph}"/>')
    out.append('</g>')
    # the area under reserved, then the lines
    res = series.get("reserved", [])
    if len(res) > 1:
        poly = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in res)
        out.append(f'<polygon class="area reserved" points="{x(res[0][0]):.1f},{y(0):.1f} {poly} '
                   f'{x(res[-1][0]):.1f},{y(0):.1f}"/>')
    for name, _, _ in lines:
        pts = series[name]
        if not pts:
            continue
        points = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
        out.append(f'<polyline class="series {name}" data-series="{name}" points="{points}"/>')
        if x(pts[-1][0]) - x(pts[0][0]) < DOT_SPAN:
            # One point, or points too close together to make a visible line: a dot at the last.
            out.append(f'<circle class="dot {name}" cx="{x(pts[-1][0]):.1f}" cy="{y(pts[-1][1]):.1f}" r="5"/>')
    if cap and cap_on_scale:
        points = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in cap)
        out.append(f'<polyline class="series cap" data-series="cap" points="{points}"/>')
        out.append(f'<text class="cap-label" x="{W - MR - 4}" y="{y(cap[-1][1]) - 6:.1f}" text-anchor="end">'
                   f'cap {esc(fmt_bytes(cap[-1][1]))}</text>')
    elif cap:
        # Far above the data: drawn along the top edge, labelled with its value.
        points = " ".join(f"{x(t):.1f},{MT:.1f}" for t, _ in cap)
        out.append(f'<polyline class="series cap off-scale" data-series="cap" points="{points}"/>')
        out.append(f'<text class="cap-label" x="{W - MR - 4}" y="{MT + 14}" text-anchor="end">'
                   f'cap {esc(fmt_bytes(cap[-1][1]))} (off scale)</text>')
    for o in ooms:
        verdict = o.get("verdict") or "unknown"
        xo = x(o["t"])
        title = (f"OOM at {o['t']:.3f} s: {fmt_bytes_or_none(o.get('request_bytes'))} requested "
                 f"({o.get('api') or '?'}), verdict {verdict}" + (f"\n{o['hint']}" if o.get("hint") else ""))
        if "site" in o:
            title += "\nat " + fmt.site_text(o.get("site"), callers=2)
        out.append(f'<g class="oom-marker" data-verdict="{esc(verdict)}" data-t="{o["t"]}">'
                   f'<title>{esc(title)}</title>'
                   f'<line x1="{xo:.1f}" x2="{xo:.1f}" y1="{MT}" y2="{MT + ph}"/>'
                   f'<path d="M{xo - 7:.1f},{MT - 2} L{xo + 7:.1f},{MT - 2} L{xo:.1f},{MT + 10} Z"/>'
                   f'</g>')
    out.append(f'<line class="cursor" x1="0" x2="0" y1="{MT}" y2="{MT + ph}" visibility="hidden"/>')
    out.append('</svg>')
    data = {"plot": [ML, W - MR, t0, t1], "t": [r["t"] for r in rows]}
    data.update({name: [r.get(field) for r in rows] for name, _, field in lines})
    data["cap"] = [r.get("cap_bytes") for r in rows]
    if not run.observe:
        data["slack"] = [r.get("pool_slack") for r in rows]
    return "".join(out), data


HW, HH = 900, 170
HML, HMR, HMT, HMB = 70, 18, 18, 34


def histogram_svg(device):
    """A bar chart of the device's live allocations by size (Device.histogram), or ""."""
    row, buckets = device.histogram()
    if not buckets:
        return ""
    top = max(count for _, count in buckets)
    pw, ph = HW - HML - HMR, HH - HMT - HMB
    slot = pw / len(buckets)
    width = max(min(slot * 0.7, 60), 2)
    caption = (f"live allocations by size at t={row['t']:.3f} s (the most bytes requested, "
               f"{fmt_bytes_or_none(row.get('requested_bytes'))})")
    out = [f'<figure class="sizes"><figcaption>{esc(caption)}</figcaption>'
           f'<svg class="histogram" data-device="{device.device}" data-t="{row["t"]}" viewBox="0 0 {HW} {HH}" '
           f'preserveAspectRatio="xMidYMid meet" role="img" aria-label="device {device.device}: {esc(caption)}">'
           f'<line class="baseline" x1="{HML}" x2="{HW - HMR}" y1="{HMT + ph}" y2="{HMT + ph}"/>']
    for i, (size, count) in enumerate(buckets):
        height = max(count / top * ph, 1.5)
        cx = HML + slot * (i + 0.5)
        out.append(f'<g class="bucket" data-from="{size}" data-count="{count}">'
                   f'<title>{esc(f"{fmt_count(count)} from {fmt_bytes(size)} up to {fmt_bytes(2 * size)}")}</title>'
                   f'<rect class="bar" x="{cx - width / 2:.1f}" y="{HMT + ph - height:.1f}" width="{width:.1f}" '
                   f'height="{height:.1f}"/>'
                   f'<text class="count" x="{cx:.1f}" y="{HMT + ph - height - 4:.1f}" text-anchor="middle">'
                   f'{esc(fmt_count(count))}</text>'
                   f'<text class="size" x="{cx:.1f}" y="{HMT + ph + 18}" text-anchor="middle">{esc(fmt_bytes(size))}</text>'
                   f'</g>')
    out.append('</svg></figure>')
    return "".join(out)


def gap_html(run, device):
    """The hint of a device whose reserved bytes are far above its requested ones, or ""."""
    gap = None if run.observe else device.reserve_gap((run.start or {}).get("config"))
    if gap is None:
        return ""
    return (f'<p class="hint gap" data-cause="{esc(gap["cause"])}"><b>reserved far above requested:</b> '
            f'{esc(gap["text"])}</p>')


# ---- tables ---------------------------------------------------------------------------------


def _table(cls, header, rows, numeric=()):
    """`rows` are lists of HTML (already escaped) cells; `numeric` are column indexes set right."""
    out = [f'<table class="{cls}"><thead><tr>']
    for i, h in enumerate(header):
        out.append(f'<th{" class=num" if i in numeric else ""}>{esc(h)}</th>')
    out.append('</tr></thead><tbody>')
    for row in rows:
        out.append("<tr>" + "".join(f'<td{" class=num" if i in numeric else ""}>{c}</td>'
                                    for i, c in enumerate(row)) + "</tr>")
    out.append('</tbody></table>')
    return "".join(out)


def _sites_table(cls, header, sites, figures, numeric):
    """A table of call-site groups: `figures(group)` gives the (escaped) cells under `header`,
    then the call site."""
    return _table(cls, header + ["call site"], [figures(s) + [site_html(s.get("site"))] for s in sites],
                  numeric=numeric)


def site_html(site, callers=1):
    """A call site: its top frame (and caller) on one line; the whole stack in a <details>."""
    if site is None:
        return '<span class="muted">not recorded</span>'
    if not site:
        return '<span class="muted">no frames</span>'
    short = esc(fmt.site_text(site, callers=callers))
    items = []
    for f in site:
        f = f if isinstance(f, dict) else {}
        where = f.get("module") or "?"
        if f.get("offset") is not None:
            where += f" +0x{int(f['offset']):x}"
        items.append(f'<li><code>{esc(fmt.frame_text(f, short=False))}</code>'
                     f'<span class="module">{esc(where)}</span></li>')
    frames = "".join(items)
    return (f'<details class="site"><summary><code>{short}</code></summary>'
            f'<ol class="stack">{frames}</ol></details>')


def _holders(title, entries):
    """A short list of (amount, call site) under an OOM, or "" when there are none."""
    if not entries:
        return ""
    return (f'<div class="holders"><span class="muted">{esc(title)}:</span><ul>' + "".join(
        f'<li><span class="amount">{esc(amount)}</span>{site_html(site, callers=0)}</li>' for amount, site in entries)
        + "</ul></div>")


def _verdict(v):
    v = v or "unknown"
    return f'<span class="verdict {esc(v)}">{esc(v)}</span>'


def figures_table(run, device):
    """The figures beside a timeline. In observe mode the pool's own (reserved, used, slack,
    rounding, fallbacks) are left out: nothing was pooled."""
    def triple(field):
        last, high, mean = device.share(field)
        return [esc(fmt_pct(last)), esc(fmt_pct(high)), esc(fmt_pct(mean))]

    columns = OBSERVE_SERIES if run.observe else SERIES
    rows = [[when] + [esc(fmt_bytes_or_none(figure(field))) for _, field in columns]
            for when, figure in (("peak", device.peak), ("final", device.last))]
    out = [_table("figures bytes", [""] + [name for name, _ in columns], rows,
                  numeric=tuple(range(1, len(columns) + 1)))]
    if device.has_owners:
        out.append(_table("figures owners", ["memory by owner", "final", "peak"],
                          [[esc(name), esc(fmt_bytes_or_none(device.last(field))),
                            esc(fmt_bytes_or_none(device.peak(field)))] for name, field in run.owners],
                          numeric=(1, 2)))
    if not run.observe:
        shares = [["pool slack"] + triple("pool_slack")]
        if device.has_cache:
            shares += [["· cached"] + triple("slack_cached"),
                       ["· other"] + triple("slack_other")]
        shares.append(["rounding waste"] + triple("rounding_waste"))
        out.append(_table("figures shares", ["", "last", "max", "mean"], shares, numeric=(1, 2, 3)))
    if not run.observe and device.has_cache:
        out.append(_table("figures cache", ["cache", ""],
                          [["cached, final", esc(fmt_bytes_or_none(device.last("cached_bytes")))],
                           ["cached, peak", esc(fmt_bytes_or_none(device.peak("cached_bytes")))],
                           ["hits", esc(device.cache_hits_text())],
                           ["misses", esc(fmt_count(device.counter("cache_misses")))],
                           ["segments given back", esc(fmt_count(device.counter("cache_returns")))],
                           ["fences", esc(fmt_count(device.counter("fences")))]], numeric=(1,)))
    counts = [("tracked" if run.observe else "pooled", "allocs"), ("async", "async_allocs"),
              ("passed through", "passthrough_allocs")] + ([] if run.observe else [("fallback", "fallback_allocs")]) + \
        [("failed", "failed_allocs"), ("frees", "frees")]
    out.append(_table("figures counts", ["allocations", ""],
                      [[esc(label), esc(fmt_count(device.counter(field)))] for label, field in counts],
                      numeric=(1,)))
    return "".join(out)


# ---- sections -------------------------------------------------------------------------------


def _legend(run, device):
    items = [(name, label) for name, label, _ in chart_series(run, device)]
    if device.cap is not None:
        items.append(("cap", "cap"))
    parts = [f'<span class="key {k}"><i></i>{esc(label)}</span>' for k, label in items]
    for v in sorted({o.get("verdict") or "unknown" for o in device.ooms}):
        parts.append(f'<span class="key oom {esc(v)}"><b></b>OOM: {esc(v)}</span>')
    return '<div class="legend">' + "".join(parts) + "</div>"


def run_section(run, data):
    out = [f'<section class="process" id="{esc(run.anchor)}" data-pid="{run.pid}">']
    out.append(f'<h2>{esc(run.label)}'
               + (f' <span class="tag">{esc("poolshim " + run.version)}</span>' if run.version else "")
               + ("" if run.exit is not None else ' <span class="tag running">still running</span>' if run.alive
                  else ' <span class="tag bad">no exit record</span>')
               + ('<span class="tag">observe mode</span>' if run.observe else "")
               + '</h2>')
    if run.observe:
        out.append(f'<p class="mode observe">{esc(OBSERVE_LINE)}</p>')
    meta = [("command", f"<code>{esc(run.command or '(no start record)')}</code>"),
            ("log", f"<code>{esc(run.path)}</code>")]
    when = fmt_unix(run.start_unix_s)
    meta.append(("ran", esc(fmt_duration(run.duration) + (f" from {when}" if when else "")
                            + f", {fmt_count(len(run.samples))} samples")))
    meta.append(("ended", esc(run.ending)))
    if run.config_changes:
        meta.append(("options", ", ".join(f"<code>{esc(k)}={esc(v)}</code>"
                                          + (f" <span class=muted>({esc(s)})</span>" if s else "")
                                          for k, v, s in run.config_changes)))
    ex = run.exit or {}
    if ex.get("events_dropped"):
        meta.append(("events dropped", f'<span class="bad">{esc(fmt_count(ex["events_dropped"]))} '
                                       '(the log is incomplete)</span>'))
    for note in run.notes:
        meta.append(("note", esc(note)))
    if ex.get("paths"):
        meta.append(("ways in", esc(", ".join(f"{k} {v}" for k, v in ex["paths"].items()))))
    out.append('<dl class="meta">' + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in meta) + "</dl>")

    if not run.devices:
        out.append('<p class="muted">No device memory was pooled.</p>')
    for d in run.devices.values():
        svg_id = f"tl-{run.index}-{d.device}"
        svg, series = timeline_svg(run, d, svg_id)
        data[svg_id] = series
        title = f"device {d.device}" + (f" · {d.name}" if d.name else "") + \
            (f" · {fmt_bytes(d.total_bytes)}" if d.total_bytes else "")
        cap = f' <span class="tag">cap {esc(fmt_bytes(d.cap))}</span>' if d.cap is not None else ""
        out.append(f'<div class="device" data-device="{d.device}"><h3>{esc(title)}{cap}</h3>'
                   f'<div class="device-body"><div class="chart">{_legend(run, d)}{svg}'
                   f'<div class="readout" hidden></div>{gap_html(run, d)}{histogram_svg(d)}</div>'
                   f'<div class="side">{figures_table(run, d)}</div></div></div>')

    ooms = run.ooms_sorted
    if ooms or run.oom_repeats:
        repeats = (f' <span class="muted small">and {esc(fmt_count(run.oom_repeats))} more of the same situations, '
                   'not logged again</span>') if run.oom_repeats else ""
        out.append(f'<h3>Out-of-memory errors <span class="count">{len(ooms)}</span>{repeats}</h3>')
    if ooms:
        rows = []
        for o in ooms:
            cap = f"cap {fmt_bytes(o['cap_bytes'])}" if o.get("cap_bytes") is not None else None
            state = "; ".join(filter(None, [", ".join(filter(None, [oom_pool_text(o), cap])),
                                            f"device free {fmt_bytes_or_none(o.get('device_free'))}"]))
            owners = oom_owners_text(o)
            holders = _holders("live memory by call site",
                               [(f'{fmt_bytes_or_none(s.get("bytes"))} in {fmt_count(s.get("count"))}', s.get("site"))
                                for s in (o.get("by_site") or [])[:5]])
            holders += _holders("VMM memory by call site", [(fmt_bytes_or_none(s.get("bytes")), s.get("site"))
                                                            for s in (o.get("vmm_by_site") or [])[:5]])
            rows.append([f'{esc(fmt_seconds(o["t"]))}', esc(o["device"]), esc(fmt_bytes_or_none(o.get("request_bytes"))),
                         esc(o.get("api") or ""), _verdict(o.get("verdict")),
                         f'<div>{esc(o.get("hint") or "")}</div><div class="muted small">{esc(state)}</div>'
                         + (f'<div class="muted small owners">{esc(owners)}</div>' if owners else ""),
                         (site_html(o.get("site"), callers=1) if "site" in o else '<span class="muted">-</span>')
                         + holders])
        out.append(_table("ooms", ["t", "device", "request", "API", "verdict", "hint", "call site"], rows,
                          numeric=(0, 1, 2)))

    for d in run.devices.values():
        pc = d.peak_consumers
        if not pc:
            continue
        peak = (d.exit_row or {}).get("requested_bytes_peak")
        out.append(f'<h3>Peak consumers on device {esc(d.device)} <span class="count">'
                   f'{esc(fmt_bytes_or_none(pc.get("live_bytes")))} · {esc(fmt_count(pc.get("live_allocs")))} '
                   f'allocations at {esc(fmt_seconds(pc.get("t")))}</span></h3>')
        out.append(f'<p class="muted small">The live allocations when the shim saw the most live bytes '
                   f'(it looks every 50 ms); the requested peak was {esc(fmt_bytes_or_none(peak))}.</p>')
        sites = d.peak_sites
        if sites:
            out.append(_sites_table("peak-sites", ["bytes", "allocations"], sites,
                                    lambda s: [esc(fmt_bytes_or_none(s.get("bytes"))), esc(fmt_count(s.get("count")))],
                                    numeric=(0, 1)))
        elif pc.get("largest"):
            rows = [[esc(fmt_bytes_or_none(b.get("bytes"))), esc(fmt_seconds(b.get("age_s"))),
                     "yes" if b.get("async") else "no"] for b in pc["largest"]]
            out.append('<p class="muted small">Call sites were not recorded (set POOLSHIM_BACKTRACE): '
                       'the largest allocations then.</p>')
            out.append(_table("peak-largest", ["bytes", "age", "async"], rows, numeric=(0, 1)))

    leaks = run.leaks
    if leaks is not None:
        out.append(f'<h3>Leaks at exit <span class="count">{esc(fmt_count(leaks["count"]))} · '
                   f'{esc(fmt_bytes(leaks["bytes"]))}</span></h3>')
        if leaks["by_site"]:
            out.append(_sites_table("leaks", ["bytes", "allocations"], leaks["by_site"],
                                    lambda s: [esc(fmt_bytes_or_none(s.get("bytes"))), esc(fmt_count(s.get("count")))],
                                    numeric=(0, 1)))
        elif leaks["count"]:
            rows = [[esc(fmt_bytes_or_none(b.get("bytes"))), esc(b.get("device", "?")), esc(fmt_seconds(b.get("age_s"))),
                     "yes" if b.get("async") else "no"] for b in leaks["largest"]]
            out.append('<p class="muted small">Call sites were not recorded: the largest leaked allocations.</p>')
            out.append(_table("leaks largest", ["bytes", "device", "age", "async"], rows, numeric=(0, 1, 2)))
        else:
            out.append('<p class="muted">None: every pooled allocation was freed.</p>')

    vmm = [dict(s, device=d.device) for d in run.devices.values() for s in d.vmm_sites]
    if vmm:
        live = sum((d.exit_row or {}).get("vmm_physical_bytes") or 0 for d in run.devices.values())
        out.append(f'<h3>The application\'s VMM memory at exit <span class="count">{esc(fmt_bytes(live))}</span></h3>')
        out.append(_sites_table("vmm-sites", ["device", "bytes"], vmm,
                                lambda s: [esc(s["device"]), esc(fmt_bytes_or_none(s.get("bytes")))], numeric=(0, 1)))

    if run.warnings:
        out.append(f'<h3>Warnings <span class="count">{len(run.warnings)}</span></h3>')
        out.append(_table("warnings", ["t", "message"],
                          [[esc(fmt_seconds(w["t"])), esc(w.get("message") or "")] for w in run.warnings],
                          numeric=(0,)))
    out.append('</section>')
    return "".join(out)


def overview(report):
    rows = []
    for run in report.runs:
        peak = max([d.peak("reserved_bytes") or 0 for d in run.devices.values()] + [0])
        leaks = run.leaks
        counts = {}
        for o in run.ooms:
            counts[o.get("verdict") or "unknown"] = counts.get(o.get("verdict") or "unknown", 0) + 1
        rows.append([
            f'<a href="#{esc(run.anchor)}">{run.pid}</a>', esc(run.rank if run.rank is not None else NONE),
            esc(run.host or NONE), f'<code class="cmd">{esc(fmt.shorten_middle(run.command or "?", 70))}</code>',
            esc(", ".join(str(d) for d in run.devices) or NONE), esc(NONE if run.observe else fmt_bytes(peak)),
            esc(NONE if run.observe else fmt_count(run.total("allocs"))),
            (f'<span class="bad">{len(run.ooms)}</span> <span class="muted small">{esc(verdict_counts_text(counts))}</span>'
             if run.ooms else "0"),
            esc(NONE if leaks is None else f'{fmt_count(leaks["count"])} · {fmt_bytes(leaks["bytes"])}'),
            esc(len(run.warnings)), esc(fmt_duration(run.duration)),
            "exit" if run.exit is not None else '<span class="running">still running</span>' if run.alive
            else '<span class="bad">no exit record</span>',
        ])
    return _table("processes", ["pid", "rank", "host", "command", "devices", "peak reserved", "pooled", "OOMs",
                                "leaks", "warnings", "ran", "end"], rows, numeric=(0, 5, 6, 9, 10))


def merged(report):
    out = ['<section class="merged" id="merged"><h2>All processes</h2>']
    runs = report.runs
    leak_count, leak_bytes = report.leak_totals()
    no_exit = report.runs_without_exit()
    running = report.runs_still_running()
    totals = [
        ("processes", f"{len(runs)} from {len(report.paths)} log{'s' if len(report.paths) != 1 else ''}"
                      + (f"; {no_exit} without an exit record" if no_exit else "")
                      + (f" ({running} still running)" if running else "")),
        ("hosts", ", ".join(report.hosts()) or NONE),
        ("ranks", ", ".join(report.ranks()) or NONE),
        ("allocations", report.allocations_text()),
        ("out of memory", report.ooms_text()),
        ("leaks at exit", f"{fmt_count(leak_count)} allocations, {fmt_bytes(leak_bytes)}"),
        ("warnings", str(sum(len(r.warnings) for r in runs))),
    ]
    out.append('<dl class="meta totals">' + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in totals) + "</dl>")
    rows = []
    for run, d in report.device_rows():
        rows.append([esc(d.device), esc(run.rank if run.rank is not None else NONE), esc(run.host or NONE),
                     f'<a href="#{esc(run.anchor)}">{run.pid}</a>',
                     esc(fmt_bytes_or_none(d.peak("reserved_bytes"))), esc(fmt_bytes_or_none(d.peak("used_bytes"))),
                     esc(fmt_bytes_or_none(d.peak("requested_bytes"))), esc(fmt_bytes_or_none(d.last("reserved_bytes"))),
                     esc(fmt_bytes_or_none(d.last("requested_bytes"))),
                     esc(NONE if run.observe else fmt_count(d.counter("allocs"))), esc(len(d.ooms))])
    out.append('<h3>Devices across processes</h3>')
    out.append(_table("merged-devices", ["device", "rank", "host", "pid", "peak reserved", "peak used",
                                         "peak requested", "final reserved", "live at end", "pooled", "OOMs"],
                      rows, numeric=(0, 3, 4, 5, 6, 7, 8, 9, 10)))
    rows = [[esc(o["device"]), esc(o["processes"]),
             esc(f"{fmt_bytes(o['high'][0])} ({report.process_name(o['high'][1])})"),
             esc(f"{fmt_bytes(o['low'][0])} ({report.process_name(o['low'][1])})"), esc(fmt_bytes(o["sum"])),
             esc(o["ooms"])] for o in report.ordinal_peaks()]
    out.append('<h3>Per device ordinal, over its processes</h3>')
    out.append(_table("merged-ordinals", ["device", "processes", "highest peak reserved", "lowest peak reserved",
                                          "sum of peaks", "OOMs"], rows, numeric=(0, 1, 2, 3, 4, 5)))
    def processes(s):
        return ", ".join(f'<a href="#{esc(r.anchor)}">{r.pid}</a>' for r in s["runs"])

    for cls, title, header, sites, figures in (
            ("merged-leaks", "Leaks by call site, all processes", ["bytes", "allocations"], report.leak_sites(),
             lambda s: [esc(fmt_bytes(s["bytes"])), esc(fmt_count(s["count"]))]),
            ("merged-ooms", "Out-of-memory errors by failing call site, all processes", ["OOMs", "requested"],
             report.oom_sites(), lambda s: [esc(s["count"]), esc(fmt_bytes(s["bytes"]))]),
            ("merged-vmm", "The application's VMM memory at exit by call site, all processes", ["bytes"],
             report.vmm_sites(), lambda s: [esc(fmt_bytes(s["bytes"]))])):
        if sites:
            out.append(f'<h3>{esc(title)}</h3>')
            out.append(_sites_table(cls, header + ["processes"], sites, lambda s, f=figures: f(s) + [processes(s)],
                                    numeric=tuple(range(len(header)))))
    out.append('</section>')
    return "".join(out)


def _json_for_script(obj):
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render(report):
    data = {}
    sections = "".join(run_section(run, data) for run in report.runs)
    ooms = report.oom_counts()
    total_ooms = sum(ooms.values())
    title = "poolshim report"
    if len(report.runs) == 1:
        title += f": {report.runs[0].program or 'pid ' + str(report.runs[0].pid)}"
    generated = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    summary = (f"{len(report.runs)} process{'es' if len(report.runs) != 1 else ''} from {len(report.paths)} "
               f"log{'s' if len(report.paths) != 1 else ''} · {total_ooms} out-of-memory error"
               f"{'s' if total_ooms != 1 else ''}" + (f" ({verdict_counts_text(ooms)})" if ooms else "")
               + f" · generated {generated}")
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">",
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
        f'<header><h1>{esc(title)}</h1><p class="muted">{esc(summary)}</p></header>',
        '<section class="overview"><h2>Processes</h2>', overview(report), "</section>",
        merged(report) if report.several else "",
        sections,
        f'<script type="application/json" id="timeline-data">{_json_for_script(data)}</script>',
        f"<script>{SCRIPT}</script>",
        "</body></html>\n",
    ])


CSS = """
:root { --reserved: #2563eb; --used: #d97706; --requested: #059669; --cap: #111827;
  --native: #0891b2; --vmm: #9333ea; --other: #78716c;
  --exhausted: #dc2626; --capv: #7c3aed; --fragmentation: #db2777; --ink: #1f2937; --muted: #6b7280;
  --line: #e5e7eb; --bg: #f6f7f9; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px 48px; background: var(--bg); color: var(--ink);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
header, section { max-width: 1400px; margin: 0 auto 20px; }
h1 { font-size: 22px; margin: 0 0 2px; }
h2 { font-size: 17px; margin: 0 0 12px; }
h3 { font-size: 14px; margin: 18px 0 8px; }
section { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 16px 20px; }
code { font: 12.5px/1.4 ui-monospace, "SFMono-Regular", Menlo, Consolas, "DejaVu Sans Mono", monospace; }
a { color: var(--reserved); text-decoration: none; } a:hover { text-decoration: underline; }
.muted { color: var(--muted); } .small { font-size: 12px; } .bad { color: var(--exhausted); font-weight: 600; }
.tag { display: inline-block; font-size: 11.5px; font-weight: 500; padding: 1px 8px; border-radius: 10px;
  background: #eef2ff; color: #3730a3; vertical-align: 2px; margin-left: 6px; }
.tag.bad { background: #fee2e2; color: #991b1b; }
.count { color: var(--muted); font-weight: 400; margin-left: 4px; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 3px 16px; margin: 0 0 8px; }
dl.meta dt { color: var(--muted); } dl.meta dd { margin: 0; overflow-wrap: anywhere; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { text-align: left; padding: 5px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-weight: 600; color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .03em; }
td.num, th.num { text-align: right; white-space: nowrap; }
tbody tr:nth-child(even) { background: #fafbfc; }
.device { border-top: 1px solid var(--line); margin-top: 14px; padding-top: 4px; }
.device-body { display: grid; grid-template-columns: minmax(0, 1fr) 330px; gap: 20px; align-items: start; }
@media (max-width: 1000px) { .device-body { grid-template-columns: 1fr; } }
.chart { position: relative; }
.side table { margin-bottom: 10px; font-size: 13px; } .side th, .side td { padding: 3px 8px; }
.legend { display: flex; flex-wrap: wrap; gap: 14px; font-size: 12.5px; color: var(--muted); margin: 2px 0 4px; }
.legend .key i { display: inline-block; width: 18px; height: 3px; vertical-align: middle; margin-right: 6px;
  border-radius: 2px; }
.legend .reserved i { background: var(--reserved); } .legend .used i { background: var(--used); opacity: .55; height: 5px; }
.legend .requested i { background: var(--requested); }
.legend .native i { background: var(--native); } .legend .vmm i { background: var(--vmm); }
.legend .other i { background: var(--other); }
.legend .cap i { background: repeating-linear-gradient(90deg, var(--cap) 0 5px, transparent 5px 9px); }
.legend .oom b { display: inline-block; width: 0; height: 0; border-left: 6px solid transparent;
  border-right: 6px solid transparent; border-top: 9px solid var(--exhausted); margin-right: 6px; vertical-align: middle; }
.legend .oom.cap b { border-top-color: var(--capv); } .legend .oom.fragmentation b { border-top-color: var(--fragmentation); }
svg.timeline { width: 100%; height: auto; display: block; font-size: 12px; overflow: visible; }
svg.timeline .grid line { stroke: #eef0f3; } svg.timeline .baseline { stroke: #9ca3af; }
svg.timeline .axis text { fill: var(--muted); } svg.timeline .axis line { stroke: #9ca3af; }
svg.timeline .series { fill: none; stroke-width: 2; stroke-linejoin: round; stroke-linecap: round; }
svg.timeline .series.reserved { stroke: var(--reserved); } svg.timeline .area.reserved { fill: var(--reserved); opacity: .08; }
svg.timeline .series.used { stroke: var(--used); stroke-width: 5; opacity: .45; }
svg.timeline .series.requested { stroke: var(--requested); stroke-width: 1.6; }
svg.timeline .series.cap { stroke: var(--cap); stroke-width: 1.5; stroke-dasharray: 6 4; }
svg.timeline .series.native { stroke: var(--native); stroke-width: 1.6; }
svg.timeline .series.vmm { stroke: var(--vmm); stroke-width: 1.6; }
svg.timeline .series.other { stroke: var(--other); stroke-width: 1.4; stroke-dasharray: 2 3; }
svg.timeline .dot.native { fill: var(--native); } svg.timeline .dot.vmm { fill: var(--vmm); }
svg.timeline .dot.other { fill: var(--other); }
svg.timeline .cap-label { fill: var(--cap); font-size: 11.5px; }
svg.timeline .dot.reserved { fill: var(--reserved); } svg.timeline .dot.used { fill: var(--used); }
svg.timeline .dot.requested { fill: var(--requested); }
svg.timeline .oom-marker line { stroke: var(--exhausted); stroke-width: 1.2; stroke-dasharray: 3 3; }
svg.timeline .oom-marker path { fill: var(--exhausted); }
svg.timeline .oom-marker[data-verdict="cap"] line { stroke: var(--capv); } svg.timeline .oom-marker[data-verdict="cap"] path { fill: var(--capv); }
svg.timeline .oom-marker[data-verdict="fragmentation"] line { stroke: var(--fragmentation); }
svg.timeline .oom-marker[data-verdict="fragmentation"] path { fill: var(--fragmentation); }
svg.timeline .cursor { stroke: #374151; stroke-width: 1; }
.readout { position: absolute; pointer-events: none; background: rgba(17, 24, 39, .92); color: #fff; font-size: 12px;
  padding: 6px 9px; border-radius: 6px; white-space: nowrap; line-height: 1.5; }
.readout i { display: inline-block; width: 8px; height: 8px; border-radius: 2px; margin-right: 6px; }
.verdict { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600; color: #fff;
  background: var(--exhausted); }
.verdict.cap { background: var(--capv); } .verdict.fragmentation { background: var(--fragmentation); }
.verdict.unknown { background: var(--muted); }
details.site summary { cursor: pointer; } details.site summary code { overflow-wrap: anywhere; }
ol.stack { margin: 4px 0 4px; padding-left: 22px; font-size: 12px; }
ol.stack li { margin: 2px 0; } ol.stack code { overflow-wrap: anywhere; }
ol.stack .module { display: block; color: var(--muted); font-size: 11.5px; overflow-wrap: anywhere; }
.holders { margin-top: 8px; font-size: 12.5px; } .holders ul { margin: 2px 0 0; padding: 0; list-style: none; }
.holders li { display: grid; grid-template-columns: 92px minmax(0, 1fr); gap: 8px; margin: 1px 0; }
.holders .amount { text-align: right; color: var(--muted); white-space: nowrap; }
table.ooms { table-layout: fixed; }
table.ooms th:nth-child(1) { width: 72px; } table.ooms th:nth-child(2) { width: 64px; }
table.ooms th:nth-child(3) { width: 78px; } table.ooms th:nth-child(4) { width: 124px; }
table.ooms th:nth-child(5) { width: 128px; } table.ooms th:nth-child(6) { width: 30%; }
table.leaks th:nth-child(1), table.leaks th:nth-child(2) { width: 110px; }
table.warnings th:nth-child(1) { width: 90px; }
table.merged-leaks th:nth-child(-n+3), table.merged-ooms th:nth-child(-n+3) { width: 110px; }
code.cmd { overflow-wrap: anywhere; }
p.mode.observe { margin: -6px 0 10px; font-weight: 600; color: #0e7490; }
table.processes td { white-space: nowrap; } table.processes td:nth-child(4) { white-space: normal; }
table.merged-devices td, table.merged-ordinals td { white-space: nowrap; }
dl.totals { margin-bottom: 4px; }
.tag.running { background: #dcfce7; color: #166534; } .running { color: #166534; font-weight: 600; }
p.hint.gap { margin: 8px 0 4px; padding: 6px 10px; background: #fffbeb; border-left: 3px solid var(--used);
  font-size: 13px; }
figure.sizes { margin: 10px 0 0; } figure.sizes figcaption { font-size: 12.5px; color: var(--muted); }
svg.histogram { width: 100%; height: auto; display: block; font-size: 12px; }
svg.histogram .bar { fill: var(--requested); opacity: .8; } svg.histogram .baseline { stroke: #9ca3af; }
svg.histogram text { fill: var(--muted); } svg.histogram text.count { fill: var(--ink); }
"""

SCRIPT = r"""
(function () {
  var data = JSON.parse(document.getElementById('timeline-data').textContent);
  function bytes(n) {
    if (n === null || n === undefined) return '-';
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'], v = n, i = 0;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return i === 0 ? n + ' B' : v.toFixed(1) + ' ' + u[i];
  }
  var colors = {reserved: 'var(--reserved)', used: 'var(--used)', requested: 'var(--requested)',
                native: 'var(--native)', vmm: 'var(--vmm)', other: 'var(--other)', cap: 'var(--cap)'};
  var names = {vmm: 'VMM physical'};
  Array.prototype.forEach.call(document.querySelectorAll('svg.timeline'), function (svg) {
    var d = data[svg.id];
    if (!d || !d.t.length) return;
    var cursor = svg.querySelector('.cursor');
    var box = svg.parentNode.querySelector('.readout');
    var x0 = d.plot[0], x1 = d.plot[1], t0 = d.plot[2], t1 = d.plot[3];
    function xOf(t) { return x0 + (t - t0) / (t1 - t0) * (x1 - x0); }
    svg.addEventListener('mousemove', function (ev) {
      var m = svg.getScreenCTM();
      if (!m) return;
      var p = svg.createSVGPoint(); p.x = ev.clientX; p.y = ev.clientY;
      var q = p.matrixTransform(m.inverse());
      var t = t0 + (q.x - x0) / (x1 - x0) * (t1 - t0), best = 0;
      for (var i = 1; i < d.t.length; i++) if (Math.abs(d.t[i] - t) < Math.abs(d.t[best] - t)) best = i;
      var x = xOf(d.t[best]);
      cursor.setAttribute('x1', x); cursor.setAttribute('x2', x); cursor.setAttribute('visibility', 'visible');
      var html = '<b>t = ' + d.t[best].toFixed(3) + ' s</b>';
      Object.keys(colors).forEach(function (k) {
        if (d[k] && d[k][best] !== null && d[k][best] !== undefined)
          html += '<br><i style="background:' + colors[k] + '"></i>' + (names[k] || k) + ' ' + bytes(d[k][best]);
      });
      if (d.slack && d.slack[best] !== null && d.slack[best] !== undefined)
        html += '<br>pool slack ' + (100 * d.slack[best]).toFixed(1) + '%';
      box.innerHTML = html; box.hidden = false;
      var r = svg.getBoundingClientRect(), px = (x / svg.viewBox.baseVal.width) * r.width;
      box.style.top = '34px';
      box.style.left = (px > r.width / 2 ? px - box.offsetWidth - 12 : px + 12) + 'px';
    });
    svg.addEventListener('mouseleave', function () {
      cursor.setAttribute('visibility', 'hidden'); box.hidden = true;
    });
    svg.setAttribute('data-interactive', '1');
  });
})();
"""
