#!/usr/bin/env bash
# Puts a nats-server >= 2.12 in .tools/nats-server/ (gitignored): Debian unstable's package
# (2.15 when written), fetched by scripts/debian-fetch.sh (the system's apt sources and state
# are left as they are). Its binary links only glibc (>= 2.34), so unstable's package runs on
# bookworm. Does nothing when a >= 2.12 binary is already there, named by NATS_SERVER_BIN, or on
# PATH; an older one in .tools/ (trixie's 2.10, fetched before) is replaced.
set -euo pipefail
cd "$(dirname "$0")/.."

dest="$PWD/.tools/nats-server"
suite="${NATS_SERVER_SUITE:-unstable}"
# MIN_NATS_SERVER in platform/nats-binary.ts (test/nats-binary.test.ts checks they agree).
minimum="2.12"

# "nats-server: v2.15.1" -> 0 when the binary answers with a version >= $minimum.
recent() {
  local version
  version="$("$1" --version 2>/dev/null | sed -n 's/.*v\([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1 \2/p')" || return 1
  [ -n "$version" ] || return 1
  set -- $version "${minimum%.*}" "${minimum#*.}"
  [ "$1" -gt "$3" ] || { [ "$1" -eq "$3" ] && [ "$2" -ge "$4" ]; }
}

for candidate in "${NATS_SERVER_BIN:-}" "$dest/usr/sbin/nats-server" "$(command -v nats-server || true)" /usr/sbin/nats-server; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && recent "$candidate"; then
    echo "$("$candidate" --version) at $candidate"
    exit 0
  fi
done

# debian-fetch.sh empties $dest first: a too-old binary there goes.
bash scripts/debian-fetch.sh nats-server "$suite" "$dest"
recent "$dest/usr/sbin/nats-server" || {
  echo "error: $dest/usr/sbin/nats-server is not >= $minimum: $("$dest/usr/sbin/nats-server" --version 2>&1)" >&2
  exit 1
}
echo "$("$dest/usr/sbin/nats-server" --version) at $dest/usr/sbin/nats-server"
