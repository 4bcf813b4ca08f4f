#!/usr/bin/env bash
# The test files whose subject is what a Node version changes: CI runs every file on Node 26 and
# these on Node 24 (docs/testing.md, "Node versions"). Prints them, one line.
set -euo pipefail
cd "$(dirname "$0")/.."
files=(
  # the instance runtime on the host's node: its flags, boot, permission model, randomness
  # (the escapes with the permission model on; each wall alone, sandbox-escapes-wall-alone,
  # is the Node 26 pass's: without the permission model the node flags in play are the same)
  test/sandbox-escapes.test.ts
  test/sandbox-provider.test.ts
  test/microvm-provider.test.ts
  test/microvm-runtime.test.ts
  test/microvm-launch-snapshots.test.ts
  test/microvm-checkpoint.test.ts
  test/microvm-image-check-hostile.test.ts
  test/microvm-client.test.ts
  test/microvm-proxy.test.ts
  # node's HTTP parser and server
  test/task-api.test.ts
  test/malformed-input.test.ts
  test/malformed-requests.test.ts
  test/oversized-body.test.ts
  # the service as npm start runs it, the CLI's bundle (the docs' snippets, which run against
  # the same bundle, are the Node 26 pass's: what they check is the docs, not the Node version)
  test/npm-start-signals.test.ts
  test/cli.test.ts
  test/terminal-output.test.ts
  test/module-imports.test.ts
  # the OpenTelemetry SDK, loaded only with tracing on
  test/tracing.test.ts
)
for file in "${files[@]}"; do
  [ -f "$file" ] || { echo "scripts/node-version-tests.sh: $file does not exist" >&2; exit 1; }
done
echo "${files[*]}"
