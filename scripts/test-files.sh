#!/usr/bin/env bash
# The files `npm test` runs when TEST_FILES names none: every test/*.test.ts, the longest first.
# npm test runs several files at a time and starts them in the order given: a long file started
# last would run alone at the end while the other slots sit idle (the whole pass took 726 s on
# 2 cores in alphabetical order, where its files' own times allow about 625). Prints them, one line.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each above 45 s on 2 cores, three files at a time (docs/testing.md), longest first.
longest=(
  test/microvm-snapshot-memory.test.ts
  test/sandbox-escapes.test.ts
  test/docs.test.ts
  test/sandbox-escapes-wall-alone.test.ts
  test/microvm-launch.test.ts
  test/microvm-host-errors.test.ts
  test/microvm-image-check-hostile.test.ts
  test/sandbox-provider.test.ts
  test/object-hosts.test.ts
  test/object-hibernate.test.ts
  test/microvm-snapshots.test.ts
  test/microvm-image-check-hostile-sandbox.test.ts
  test/cli.test.ts
)
files=()
for file in "${longest[@]}"; do
  [ -f "$file" ] || { echo "scripts/test-files.sh: $file does not exist" >&2; exit 1; }
  files+=("$file")
done
for file in test/*.test.ts; do
  [[ " ${longest[*]} " == *" $file "* ]] || files+=("$file")
done
echo "${files[*]}"
