#!/usr/bin/env bash
# Extracts one Debian package of another suite into a directory, fetched with apt's own tools
# from the Debian mirror this machine is configured with, through a temporary sources list:
# the system's apt sources and state are left as they are.
#
#   bash scripts/debian-fetch.sh PACKAGE SUITE DEST     # e.g. nats-server unstable .tools/nats-server
#   bash scripts/debian-fetch.sh --mirror               # prints the mirror's URI and keyring
set -euo pipefail

# The system's Debian mirror: the first `deb` source of the main archive (not -security),
# from deb822 .sources files or one-line .list files.
mirror() {
  local file
  for file in /etc/apt/sources.list.d/*.sources; do
    [ -f "$file" ] || continue
    awk '
      /^[[:space:]]*$/ { if (deb && uri != "" && suites !~ /-security/) { print uri, key; exit } deb = 0; uri = ""; suites = ""; key = ""; next }
      /^Types:/ { deb = ($0 ~ /[[:space:]]deb([[:space:]]|$)/) }
      /^URIs:/ { uri = $2 }
      /^Suites:/ { suites = $0 }
      /^Signed-By:/ { key = $2 }
      END { if (deb && uri != "" && suites !~ /-security/) print uri, key }
    ' "$file"
  done
  for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$file" ] || continue
    # deb [signed-by=...] URI SUITE COMPONENTS
    sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\)[[:space:]]\+\([^[:space:]]\+\).*/\2 \3/p' "$file" |
      awk '$2 !~ /-security|-updates|-backports/ && $1 ~ /debian/ { print $1; exit }'
  done
}

if [ "${1:-}" = "--mirror" ]; then mirror | head -n 1; exit 0; fi
package="$1" suite="$2" dest="$3"

read -r uri key < <(mirror | head -n 1) || true
if [ -z "${uri:-}" ]; then
  echo "error: no Debian mirror found in /etc/apt/sources.list or /etc/apt/sources.list.d/" >&2
  exit 1
fi
key="${key:-/usr/share/keyrings/debian-archive-keyring.gpg}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
echo "deb [signed-by=$key] $uri $suite main" > "$work/sources.list"
apt_opts=(
  -o "Dir::Etc::SourceList=$work/sources.list"
  -o "Dir::Etc::SourceParts=/dev/null"
  -o "Dir::State::Lists=$work/lists"
  -o "Dir::Cache=$work/cache"
  -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
)
# The files live in a private temp dir the unprivileged _apt user cannot enter.
[ "$(id -u)" -ne 0 ] || apt_opts+=(-o "APT::Sandbox::User=root")
echo "fetching $package from Debian $suite ($uri) into $dest" >&2
apt-get "${apt_opts[@]}" -qq update
(cd "$work" && apt-get "${apt_opts[@]}" -qq download "$package")
rm -rf "$dest"
mkdir -p "$dest"
dpkg-deb -x "$work"/"${package}"_*.deb "$dest"
