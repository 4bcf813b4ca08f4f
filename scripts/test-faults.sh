#!/usr/bin/env bash
# `npm run test:faults`: the fault files (test/faults/), one at a time, and beside them the fuzz
# suite at FUZZ_RUNS cases per property (default 10,000). The fuzz suite is CPU work with no
# fault in it; the fault files hold beside a CPU hog (docs/reliability.md), and it goes beside
# the first of them, which put no bound on a recovery after a fault (slow clients, graceful
# shutdown, microVM launches). Its TAP is printed after theirs.
set -euo pipefail
cd "$(dirname "$0")/.."

reporters=(
  --test-reporter=tap --test-reporter-destination=stdout
  --test-reporter=./test/helpers/failure-summary.mjs --test-reporter-destination=stdout
)
first=(test/faults/slow-clients.test.ts test/faults/shutdown.test.ts test/faults/microvm-launches.test.ts)
for file in "${first[@]}"; do [ -f "$file" ] || { echo "scripts/test-faults.sh: $file does not exist" >&2; exit 1; }; done
files=("${first[@]}")
for file in test/faults/*.test.ts; do
  [[ " ${first[*]} " == *" $file "* ]] || files+=("$file")
done

fuzz_log="$(mktemp)"
trap 'rm -f "$fuzz_log"' EXIT
FUZZ_RUNS="${FUZZ_RUNS:-10000}" node --import tsx --test "${reporters[@]}" test/fuzz.test.ts >"$fuzz_log" 2>&1 &
fuzz=$!
status=0
node --import tsx --test "${reporters[@]}" --test-concurrency=1 "${files[@]}" || status=$?
wait "$fuzz" || status=$?
echo "# the fuzz suite (FUZZ_RUNS=${FUZZ_RUNS:-10000}), run beside the fault files:"
cat "$fuzz_log"
exit "$status"
