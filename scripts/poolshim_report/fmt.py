"""Formatting shared by the terminal summary, the HTML page and the trace: bytes, counts,
shares, times and call sites."""

import datetime
import os
import re

from poolshim_log import CUDA_RUNTIME_PREFIXES, fmt_bytes, fmt_share  # noqa: F401  (re-exported)

NONE = "-"
# What every output says first about a run in observe mode (POOLSHIM_MODE=observe).
OBSERVE_LINE = "observe mode: every allocation went to the real function; nothing was pooled"

# Leading frames in these modules, or in functions with these names (the CUDA runtime linked
# statically into the program), are the CUDA runtime/driver or poolshim itself: the call site
# shown first is the first frame outside them (all frames stay in the full stack).
_PLUMBING_PREFIXES = ("libpoolshim", "libcudart", "libcuda.so")
_RUNTIME_FUNCTIONS = CUDA_RUNTIME_PREFIXES


def fmt_count(n):
    return NONE if n is None else f"{int(n):,}"


def fmt_bytes_or_none(n):
    return NONE if n is None else fmt_bytes(n)


def fmt_pct(x):
    return NONE if x is None else fmt_share(x)


def fmt_seconds(t):
    return NONE if t is None else f"{t:.3f} s"


def fmt_duration(t):
    if t is None:
        return NONE
    if t < 1:
        return f"{t * 1000:.0f} ms"
    if t < 60:
        return f"{t:.1f} s"
    minutes, seconds = divmod(t, 60)
    if minutes < 60:
        return f"{int(minutes)} min {seconds:.0f} s"
    hours, minutes = divmod(minutes, 60)
    return f"{int(hours)} h {int(minutes)} min"


def fmt_unix(s):
    if s is None:
        return None
    try:
        return datetime.datetime.fromtimestamp(s, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return None


def shorten_middle(text, width):
    """`text` cut in the middle to at most `width` characters."""
    if width is None or len(text) <= width:
        return text
    keep = max(width - 3, 2)
    head = (keep + 1) // 2
    return text[:head] + "..." + text[len(text) - (keep - head):]


def strip_arguments(name):
    """A demangled function name without its parameter list: "ns::f(int, char const*) const"
    -> "ns::f()". Names without a balanced trailing list are returned unchanged."""
    end = len(name)
    for suffix in (" const", " volatile", " &&", " &"):
        if name[:end].endswith(suffix):
            end -= len(suffix)
    if end == 0 or name[end - 1] != ")":
        return name
    depth = 0
    for i in range(end - 1, -1, -1):
        c = name[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                if i == 0:
                    return name
                return name[:i] + ("()" if i + 1 == end - 1 else "(...)")
    return name


def _depth0_split(text, sep):
    """Split `text` at `sep` outside <> and () (None when brackets do not balance)."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c in "<(":
            depth += 1
        elif c in ">)":
            depth -= 1
            if depth < 0:
                return None
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    if depth != 0:
        return None
    parts.append(text[start:])
    return parts


def _collapse_templates(text):
    out, depth = [], 0
    for c in text:
        if c == "<":
            if depth == 0:
                out.append("<...>")
            depth += 1
        elif c == ">":
            depth -= 1
        elif depth == 0:
            out.append(c)
    return "".join(out)


# What GCC appends to a specialized copy of a function ("f(int) [clone .isra.0]"), and the scope
# of an anonymous namespace: neither helps to tell call sites apart on one line.
_CLONE_SUFFIXES = re.compile(r"( \[clone [^\]]*\])+$")
_ANONYMOUS = "(anonymous namespace)"


def short_function(name):
    """A short form of a demangled name for one-line display: no parameters, no return type,
    template arguments as <...>, no clone suffix or anonymous namespace, the last two scopes:
    "c10::cuda::Alloc::malloc(void**)" -> "Alloc::malloc". Names it cannot parse (operators,
    odd brackets) are returned whole."""
    name = _CLONE_SUFFIXES.sub("", name) or name
    if "operator" in name or "lambda" in name or "{" in name:
        return strip_arguments(name)
    text = strip_arguments(name)
    if text.endswith("(...)") or text.endswith("()"):
        text = text[:text.rindex("(")]
    words = _depth0_split(text, " ")
    if not words:
        return strip_arguments(name)
    text = words[-1]                       # drop a return type ("void ns::f<int>")
    scopes = [s for s in _depth0_split(text, "::") or [] if s != _ANONYMOUS]
    if not scopes:
        return strip_arguments(name)
    return _collapse_templates("::".join(scopes[-2:])) or name


def frame_module(frame):
    module = frame.get("module") if isinstance(frame, dict) else None
    return os.path.basename(module) if module else "?"


def frame_text(frame, short=True, width=None, offsets=True):
    """One frame: "function+0x38 (libapp.so)", or "libapp.so+0x1a2b" when not symbolized.
    short: the function's short form (short_function); offsets=False leaves out +0x..;
    width: the function name is cut in the middle to fit."""
    if not isinstance(frame, dict):
        return "?"
    base = frame_module(frame)
    function = frame.get("function")
    if function:
        name = short_function(function) if short else function
        offset = frame.get("function_offset")
        suffix = f"+0x{int(offset):x}" if offsets and offset is not None else ""
        place = f" at {frame['line']}" if frame.get("line") else ""
        if width is not None:
            name = shorten_middle(name, max(width - len(base) - len(suffix) - len(place) - 3, 12))
        return f"{name}{suffix} ({base}){place}"
    offset = frame.get("offset")
    return base if offset is None else f"{base}+0x{int(offset):x}"


def top_frame_index(site):
    """Index of the frame shown for a call site: the first outside the CUDA libraries and
    poolshim (0 when all are inside)."""
    for i, frame in enumerate(site):
        function = (frame.get("function") if isinstance(frame, dict) else None) or ""
        if not frame_module(frame).startswith(_PLUMBING_PREFIXES) and not function.startswith(_RUNTIME_FUNCTIONS):
            return i
    return 0


def site_texts(sites, width, callers=1):
    """site_text of each of `sites` in one style: with offsets unless one of them does not fit."""
    texts = [site_text(s, callers=callers) for s in sites]
    if width is not None and any(len(t) > width for t in texts):
        texts = [site_text(s, callers=callers, width=width, offsets=False) for s in sites]
    return texts


def site_text(site, short=True, width=None, callers=0, offsets=True):
    """A call site on one line: its top frame, and up to `callers` of its callers; cut to
    `width` by leaving out offsets, then shortening names."""
    if site is None:
        return "(call site not recorded)"
    if not site:
        return "(no frames)"
    first = top_frame_index(site)
    frames = site[first:first + 1 + callers]
    text = " <- ".join(frame_text(f, short=short, offsets=offsets) for f in frames)
    if width is None or len(text) <= width:
        return text
    text = " <- ".join(frame_text(f, short=short, offsets=False) for f in frames)
    if len(text) <= width:
        return text
    each = max((width - 4 * (len(frames) - 1)) // len(frames), 20)
    text = " <- ".join(frame_text(f, short=short, offsets=False, width=each) for f in frames)
    return shorten_middle(text, width)


def site_key(site):
    """Identity of a call site across processes: (module, offset, function) of each frame. Offsets are
    module-relative, so the same code location has the same key in every process."""
    if not site:
        return None
    return tuple((f.get("module"), f.get("offset"), f.get("function")) if isinstance(f, dict) else (None, None, None)
                 for f in site)
