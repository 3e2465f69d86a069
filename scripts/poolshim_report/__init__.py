"""poolshim-report: summaries, an HTML page and a Perfetto trace from poolshim logs.

Modules: model (reading logs into runs, the figures), fmt (bytes, times, call sites), text
(the terminal summary), html_page (the self-contained HTML page), perfetto (Chrome trace-event
JSON), cli (the command line). Standard library only; the logs are read with
scripts/poolshim_log.py, which must be importable (scripts/ on sys.path).
"""

__all__ = ["main"]


def main(argv=None):
    from .cli import main as _main
    return _main(argv)
