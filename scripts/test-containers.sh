#!/usr/bin/env bash
# `npm run test:containers`: the container suite, against the Docker engine at DOCKER_HOST (or
# /var/run/docker.sock); `eval "$(bash scripts/docker-engine.sh start)"` starts one.
#  1. the core contract tests with their NATS from testcontainers (@testcontainers/nats), ryuk
#     off (TESTCONTAINERS_RYUK_DISABLED=true): each file stops and removes its own container;
#  2. test/containers/: compose.yaml up in Docker, faults, `docker compose down -v`.
# Images come from scripts/build-images.sh (no registry); what a crashed run left is removed.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS

if ! docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
  echo "error: no Docker engine answers${DOCKER_HOST:+ at $DOCKER_HOST}; start one with: eval \"\$(bash scripts/docker-engine.sh start)\"" >&2
  exit 1
fi
DOCKER_COMPOSE="$(bash scripts/get-docker-compose.sh)"
export DOCKER_COMPOSE
bash scripts/build-images.sh
# The NATS nodes' users, from the contracts of this checkout.
npx tsx cluster/compose-auth.ts

# Whatever a killed run left: testcontainers' NATS containers and the compose test's projects
# (their containers, networks and volumes, by label).
sweep() {
  local ids project
  ids="$(docker ps -aq --filter label=org.testcontainers=true)"
  if [ -n "$ids" ]; then echo "removing leftover testcontainers:" $ids; docker rm -f $ids >/dev/null; fi
  for project in $(docker ps -a --format '{{.Label "com.docker.compose.project"}}' | grep '^typed-service-test-' | sort -u); do
    echo "removing leftover compose project $project"
    docker rm -f $(docker ps -aq --filter "label=com.docker.compose.project=$project") >/dev/null
    docker network rm $(docker network ls -q --filter "label=com.docker.compose.project=$project") >/dev/null 2>&1 || true
    docker volume rm $(docker volume ls -q --filter "label=com.docker.compose.project=$project") >/dev/null 2>&1 || true
  done
}
trap sweep EXIT

status=0
TEST_NATS=testcontainers TESTCONTAINERS_RYUK_DISABLED=true node --import tsx --test --test-concurrency=1 \
  --test-reporter=tap --test-reporter-destination=stdout \
  --test-reporter=./test/helpers/failure-summary.mjs --test-reporter-destination=stdout \
  test/task-api.test.ts test/job-api.test.ts test/nats-direct.test.ts test/malformed-requests.test.ts \
  test/client.test.ts test/api-keys.test.ts test/oversized-body.test.ts \
  test/containers/*.test.ts || status=$?
echo "# container suite: $((SECONDS - started)) s (images included)"
exit $status
