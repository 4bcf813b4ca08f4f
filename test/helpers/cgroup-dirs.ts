// Removing a cgroup directory whose processes are ending: the kernel refuses (EBUSY) until the
// last of them has left, which happens as it exits; a process that stays fails the caller.
import { rmdirSync } from "node:fs";
import { pollUntil } from "../../vm-runtime/host/provider-util.ts";

/** How long the processes of a group just stopped may take to leave it. */
export const CGROUP_EMPTY_BOUND_MS = 5_000;

/**
 * Removes the cgroup directory `dir` (gone already is fine) once it is empty. Past the bound,
 * the last attempt's error (EBUSY: a process is left) is thrown.
 */
export async function rmdirOnceEmpty(dir: string, boundMs = CGROUP_EMPTY_BOUND_MS): Promise<void> {
  const removed = () => {
    try {
      rmdirSync(dir);
      return true;
    } catch (err) {
      return (err as NodeJS.ErrnoException).code === "ENOENT";
    }
  };
  if (!(await pollUntil(removed, boundMs))) rmdirSync(dir);
}
