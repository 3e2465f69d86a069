"""The command line of poolshim-report."""

import argparse
import os
import sys

import poolshim_log
from poolshim_log import LogError

from . import model

PROG = "poolshim-report"

DESCRIPTION = """\
Summarize poolshim logs (JSON Lines, schema 1 or 2; README.md "The log").

Each LOG is one log file: one per process or rank, or one that several processes appended to
(records are grouped by pid, and a start record opens a new run, so a file may hold several
runs). With more than one process, a merged summary follows: totals across processes, every
device of every rank side by side, and leaks and out-of-memory errors by call site.

By default the summary is printed on standard output; --html, --perfetto and --memory-viz
write files too (add --quiet to print nothing)."""

EPILOG = """\
the summary, per process:
  peaks and final figures of reserved, used and requested bytes per device (and the cap when
  one is set); the heap's cache: cached free blocks and cache hits; pool slack (1 - handed
  out/reserved, split into cached free blocks and the driver pool's other memory) and rounding
  waste (1 - requested/handed out), each as last / max / mean over the samples ("-" where
  nothing is reserved or nothing live); why reserved is far above requested, when it is, with
  the option that bounds it; the live allocations by size (--full); allocations pooled,
  async, passed through, fallback and failed; out-of-memory errors with verdict, hint and call
  site; leaks at exit by call site; warnings; for a run without an exit record, whether it
  is still running (its pid alive on this host) or, from another host, that it cannot tell.
  Bytes are in powers of 1024 (KiB, MiB, GiB). A call site is shown by its first frame outside the CUDA libraries and poolshim.
  Schema 2 logs add memory by owner per device (pool reserved, passed through, the
  application's own VMM physical memory, other), the VMM memory live at exit by call site, and
  at each out-of-memory error the mode and the native, VMM and other bytes. A run in observe
  mode (POOLSHIM_MODE=observe) says so first and shows tracked bytes and allocations instead
  of the pool's figures (reserved, used, slack, rounding waste, fallbacks).

exit status:
  0  done
  1  an output file could not be written
  2  bad usage, or a log that cannot be read: missing, empty, not JSON, not a poolshim log,
     a newer schema, a record with a field of the wrong type, or a value poolshim does not
     write (integers beyond -2^63..2^64-1, other numbers beyond +-2^64, NaN, a t beyond
     0..2^31 s, nesting deeper than 32, a lone UTF-16 surrogate); the message names the file
     and line; with --memory-viz, an event log that is missing, empty or not one (its header, or
     a row: the line is named), a row of a device the run did not have, or logs that do not hold
     exactly one run that can have written it

examples:
  poolshim-report poolshim-4242.jsonl
  poolshim-report --full run.jsonl
  poolshim-report --html report.html --perfetto trace.json logs/rank*.jsonl
  poolshim-report --memory-viz snapshot.pickle --events events.csv poolshim-4242.jsonl
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        print(f"{PROG}: error: {message}", file=sys.stderr)
        sys.exit(2)


def parser():
    p = _Parser(prog=PROG, description=DESCRIPTION, epilog=EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"{PROG} {poolshim_log.version()}")
    p.add_argument("logs", metavar="LOG", nargs="+", help="poolshim log file(s) (JSON Lines)")
    p.add_argument("--full", action="store_true",
                   help="print everything: every OOM with the pool's state, live memory by call site and the "
                        "largest live allocations at the failure; every leak site with its whole stack; every "
                        "warning; every counter (by default a process takes about 40 lines)")
    p.add_argument("--html", metavar="FILE",
                   help="write one self-contained HTML page (no network access: inline CSS, SVG and script): a "
                        "timeline per device (reserved, used, requested bytes, the cap, OOMs as markers; native, "
                        "VMM and other bytes where a schema 2 log has them) and tables of processes, OOMs, leaks "
                        "and VMM memory by call site and warnings")
    p.add_argument("--perfetto", metavar="FILE",
                   help="write a Chrome trace-event JSON file for ui.perfetto.dev (or chrome://tracing): byte "
                        "counters per device (native, VMM physical and other too, for schema 2 logs), OOMs and "
                        "warnings as instant events, one track per process")
    p.add_argument("--memory-viz", metavar="FILE",
                   help="write the event log (--events) as a PyTorch memory snapshot, the pickle that "
                        "torch.cuda.memory._dump_snapshot writes, for pytorch.org/memory_viz: every allocation, "
                        "free and failed allocation per device with its time, stream and call-site frames, and "
                        "the blocks live at the end; each allocation is its own segment (the pool's segments "
                        "are not in the event log); the LOGs must hold the run that wrote the event log")
    p.add_argument("--events", metavar="CSV",
                   help="the event log (POOLSHIM_EVENTS) that --memory-viz reads; its call-site frames come "
                        "from the run's exit record (event_log_sites)")
    p.add_argument("--align", choices=("wall", "zero"), default="wall",
                   help="Perfetto time axis: 'wall' (default) places each process at its start time "
                        "(start_unix_ns, or start_unix_s where a log has only whole seconds) so that "
                        "runs and ranks line up; 'zero' starts every process at 0")
    p.add_argument("--no-lines", action="store_true",
                   help="do not ask addr2line for the file and line of call-site frames (by default "
                        "it is asked when it is on PATH and the modules are readable)")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="print nothing but errors (with --html, --perfetto or --memory-viz): no summary, no "
                        "'wrote FILE' line")
    return p


def _write(path, text):
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with (open(tmp, "wb") if isinstance(text, bytes) else open(tmp, "w", encoding="utf-8")) as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise OSError(f"cannot write {path}: {e.strerror or e}") from None


def main(argv=None):
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        sys.stdout.reconfigure(errors="replace")
    except (AttributeError, ValueError):
        pass
    if args.memory_viz and not args.events:
        parser().error("--memory-viz needs --events CSV (the event log to export)")
    if args.events and not args.memory_viz:
        parser().error("--events is only read by --memory-viz")
    inputs = {os.path.realpath(p): "one of the logs" for p in args.logs}
    if args.events:
        inputs.setdefault(os.path.realpath(args.events), "the event log")
    outputs = (("--html", args.html), ("--perfetto", args.perfetto), ("--memory-viz", args.memory_viz))
    for option, path in outputs:
        if path and os.path.realpath(path) in inputs:
            print(f"{PROG}: error: {option} {path} is {inputs[os.path.realpath(path)]}: refusing to overwrite it",
                  file=sys.stderr)
            return 2
    named = [(option, os.path.realpath(path)) for option, path in outputs if path]
    for i, (option, path) in enumerate(named):
        for other, other_path in named[i + 1:]:
            if path == other_path:
                print(f"{PROG}: error: {option} and {other} name the same file", file=sys.stderr)
                return 2
    model.ANNOTATE_LINES = not args.no_lines
    try:
        report = model.load(args.logs)
    except LogError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if args.memory_viz:
        from . import memory_viz
        try:
            snapshot, notes = memory_viz.export(report, args.events)
        except LogError as e:
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return 2
        for note in notes if not args.quiet else ():
            print(f"{PROG}: warning: --memory-viz: {note}", file=sys.stderr)
    try:
        if args.memory_viz:
            _write(args.memory_viz, snapshot)
        if args.html:
            from . import html_page
            _write(args.html, html_page.render(report))
        if args.perfetto:
            from . import perfetto
            _write(args.perfetto, perfetto.dumps(report, align=args.align))
    except OSError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    if not args.quiet:
        from . import text
        try:
            sys.stdout.write(text.summary(report, full=args.full))
            sys.stdout.flush()
        except BrokenPipeError:
            # The reader went away (| head): not an error of ours.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 0
    for label, path in (("HTML page", args.html), ("Perfetto trace", args.perfetto),
                        ("memory snapshot", args.memory_viz)):
        if path and not args.quiet:
            print(f"{PROG}: wrote {label} {path}", file=sys.stderr)
    return 0
