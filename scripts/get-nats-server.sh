#!/usr/bin/env bash
# Puts a nats-server >= 2.10 in .tools/nats-server/ (gitignored): Debian trixie's package,
# fetched by scripts/debian-fetch.sh (the system's apt sources and state are left as they are). The
# binary is static, so trixie's package runs on bookworm. Does nothing when a >= 2.10 binary
# is already there, named by NATS_SERVER_BIN, or on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

dest="$PWD/.tools/nats-server"
suite="${NATS_SERVER_SUITE:-trixie}"

# "nats-server: v2.10.24" -> 0 when the binary answers with a version >= 2.10.
recent() {
  local version
  version="$("$1" --version 2>/dev/null | sed -n 's/.*v\([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1 \2/p')" || return 1
  [ -n "$version" ] || return 1
  set -- $version
  [ "$1" -gt 2 ] || { [ "$1" -eq 2 ] && [ "$2" -ge 10 ]; }
}

for candidate in "${NATS_SERVER_BIN:-}" "$dest/usr/sbin/nats-server" "$(command -v nats-server || true)" /usr/sbin/nats-server; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && recent "$candidate"; then
    echo "$("$candidate" --version) at $candidate"
    exit 0
  fi
done

bash scripts/debian-fetch.sh nats-server "$suite" "$dest"
recent "$dest/usr/sbin/nats-server" || {
  echo "error: $dest/usr/sbin/nats-server is not >= 2.10: $("$dest/usr/sbin/nats-server" --version 2>&1)" >&2
  exit 1
}
echo "$("$dest/usr/sbin/nats-server" --version) at $dest/usr/sbin/nats-server"
