// The CPUs an instance counts: its CPU quota rounded up, not the machine's. An instance may run on
// every CPU (pinning a starved instance to few CPUs made it miss its start deadline on a busy
// host), so neither wall can make node count fewer; the runtime tells node's own answers before
// any image code runs. It informs, it does not bound: the quota bounds the CPU time.
import os from "node:os";
import { syncBuiltinESMExports } from "node:module";

/** The instance's variable naming the CPUs it counts. */
export const CPUS_ENV = "MICROVM_CPUS";

/** The CPUs an instance with a quota of `quota` cores counts, on a machine of `machine` CPUs. */
export function countedCpus(quota: number, machine = os.availableParallelism()): number {
  return Math.max(1, Math.min(machine, Math.ceil(quota)));
}

/**
 * Makes `os.availableParallelism()`, `os.cpus()` and `navigator.hardwareConcurrency` say `value`
 * CPUs (the variable's text) where that is fewer than they say now; anything else changes nothing.
 */
export function countCpusAs(value: string | undefined): void {
  const count = Number(value);
  if (!Number.isSafeInteger(count) || count < 1 || count >= os.availableParallelism()) return;
  const cpus = os.cpus;
  os.availableParallelism = () => count;
  os.cpus = () => cpus().slice(0, count);
  // `import { cpus } from "node:os"` in image code reads the same.
  syncBuiltinESMExports();
  const { navigator } = globalThis as { navigator?: object };
  if (typeof navigator === "object")
    Object.defineProperty(navigator, "hardwareConcurrency", { value: count, configurable: true, enumerable: true });
}
