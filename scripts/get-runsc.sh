#!/usr/bin/env bash
# Puts gVisor's runsc in .tools/runsc/ (gitignored): Debian's bookworm-backports package,
# fetched by scripts/debian-fetch.sh (the system's apt sources and state are left as they are).
# The binary is static. Why that suite: every Debian build is gVisor 2024-07-29, but unstable's
# (built with Go 1.26) and trixie's (Go 1.24) are newer Go than that gVisor knew; unstable's
# panicked in the Sentry in 4 of 10 starts here; the backport, built with Go 1.22 as gVisor was
# then, ran every start we tried.
# Does nothing when one is already there, named by MICROVM_RUNSC, or on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

dest="$PWD/.tools/runsc"
suite="${RUNSC_SUITE:-bookworm-backports}"

# The first line of `runsc --version` (read whole: a pipe into head would SIGPIPE runsc).
version() {
  local text
  text="$("$1" --version 2>/dev/null)" || return 1
  echo "${text%%$'\n'*}"
}

for candidate in "${MICROVM_RUNSC:-}" "$dest/usr/bin/runsc" "$(command -v runsc || true)"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && line="$(version "$candidate")"; then
    echo "$line at $candidate"
    exit 0
  fi
done

bash scripts/debian-fetch.sh runsc "$suite" "$dest"
echo "$(version "$dest/usr/bin/runsc") at $dest/usr/bin/runsc"
