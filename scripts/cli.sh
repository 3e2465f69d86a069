# Sourced by the bash scripts of scripts/: the command-line conventions they share (README
# "Scripts"). Each script defines usage() (its --help text, first line "usage: scripts/NAME ...")
# and sets prog=scripts/NAME before sourcing this file.

# The version of project() in CMakeLists.txt, the one place it lives (poolshim --version and
# poolshim-report --version read it there too, scripts/poolshim_log.py).
poolshim_version() {
  local v
  v=$(sed -n 's/^project(poolshim VERSION \([0-9.]*\).*/\1/p' "$(dirname "${BASH_SOURCE[0]}")/../CMakeLists.txt" 2>/dev/null)
  echo "${v:-unknown}"
}

# --help or -h: usage on stdout, exit 0; --version: "scripts/NAME VERSION", exit 0. Nothing else
# runs first: no tool, no GPU, no file written.
cli_help_or_version() {
  case "${1:-}" in
    -h | --help) usage; exit 0 ;;
    --version) echo "$prog $(poolshim_version)"; exit 0 ;;
  esac
}

# A bad command line: what is wrong and the usage on stderr, exit 2.
cli_usage_error() {
  echo "$prog: $1" >&2
  usage >&2
  exit 2
}
