#!/usr/bin/env python3
"""Fails when libpoolshim.so exports anything but CUDA entry points, dlsym and poolshim_*
(STYLE: sealed dependencies; rmm had real clashes from leaked fmt symbols)."""
import re
import subprocess
import sys

ALLOWED = re.compile(r"^(cuda[A-Za-z0-9_]+|cu[A-Z][A-Za-z0-9_]*|dlsym|poolshim_[a-z0-9_]+)$")

library = sys.argv[1]
out = subprocess.run(["nm", "-D", "--defined-only", library], check=True, capture_output=True, text=True).stdout
symbols = [line.split()[-1] for line in out.splitlines() if line.strip()]
bad = [s for s in symbols if not ALLOWED.match(s.split("@")[0])]
if bad:
    print(f"{library} exports {len(bad)} symbols it must not:")
    for s in bad[:50]:
        print("  " + s)
    sys.exit(1)
if "cudaMalloc" not in symbols or "poolshim_version" not in symbols:
    print(f"{library} lacks cudaMalloc or poolshim_version: is it the right file?")
    sys.exit(1)
print(f"{library}: {len(symbols)} exported symbols, all CUDA entry points or poolshim_*")
