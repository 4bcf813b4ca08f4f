// The invasive fault tests (network partitions with iptables, a JetStream store on a full tmpfs)
// need root, iptables, cgroup v2 and mount. Where they cannot run they are skipped with the
// reason; with REQUIRE_INVASIVE_FAULTS=1 (.ci/run sets it when run as root) they fail instead.
import assert from "node:assert/strict";

type Skippable = { skip(message?: string): void; name?: string };

/** Fails `t` when REQUIRE_INVASIVE_FAULTS=1 says it must run here but it cannot (`reason`). */
export function failIfRequired(t: Skippable, reason: string): void {
  if (process.env.REQUIRE_INVASIVE_FAULTS === "1")
    assert.fail(`"${t.name}" cannot run here (${reason}), and REQUIRE_INVASIVE_FAULTS=1 requires it`);
}

/** Skips `t` for `reason` with the reason printed, or fails it (see `failIfRequired`). */
export function skipUnlessRequired(t: Skippable, reason: string): void {
  failIfRequired(t, reason);
  console.log(`# skipped "${t.name}": ${reason}`);
  t.skip(reason);
}
