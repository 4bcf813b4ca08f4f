#!/usr/bin/env bash
# Prints the path of a Docker Compose v2 (`docker compose` when the client has the plugin,
# else Debian trixie's docker-compose package, put in .tools/docker-compose/ (gitignored):
# a Go binary that runs on bookworm, invoked standalone as `docker-compose`).
set -euo pipefail
cd "$(dirname "$0")/.."

plugin="$PWD/.tools/docker-compose/usr/libexec/docker/cli-plugins/docker-compose"
if docker compose version >/dev/null 2>&1; then
  echo "docker compose"
  exit 0
fi
if ! [ -x "$plugin" ]; then
  bash scripts/debian-fetch.sh docker-compose "${DOCKER_COMPOSE_SUITE:-trixie}" "$PWD/.tools/docker-compose"
fi
"$plugin" version >&2
echo "$plugin"
