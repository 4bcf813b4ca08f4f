// Ending an isolated provider's walls: asked (the runtime's SIGTERM, then force), forced (the
// wall's init, then its cgroup), and at once when the OOM killer took one of its processes.
import { noteMembers, type Tracked } from "./isolated-walls.ts";
import { within } from "./provider-util.ts";
import { MicrovmProviderError } from "./provider.ts";

const OOM_POLL_MS = 250;

/** Ends a wall at once: its init first, then every process in its cgroup. */
export async function forceStop(entry: Tracked): Promise<void> {
  noteMembers(entry);
  await entry.cgroup.thaw().catch(() => undefined);
  await entry.launched.kill().catch(() => undefined);
  if (await within(entry.exited, 1_000)) return;
  await entry.cgroup.kill().catch(() => undefined);
  entry.launched.child.kill("SIGKILL");
}

/** Ends a wall that serves no instance (a warm one at close): asked briefly, then forced. */
export async function stopEntry(entry: Tracked): Promise<void> {
  entry.stopping = true;
  noteMembers(entry);
  await entry.launched.stop().catch(() => undefined);
  if (!(await within(entry.exited, 500))) await forceStop(entry);
  await entry.released;
}

/** Ends an instance's wall: asked, given `graceMs`, then forced; fails if it outlives SIGKILL. */
export async function terminateEntry(entry: Tracked, microvmId: string, graceMs: number): Promise<void> {
  entry.stopping = true;
  noteMembers(entry);
  await entry.cgroup.thaw().catch(() => undefined);
  await entry.launched.stop().catch(() => undefined);
  if (await within(entry.exited, graceMs)) return;
  await forceStop(entry);
  if (!(await within(entry.exited, 5_000))) throw new MicrovmProviderError(`instance ${microvmId} survived SIGKILL`);
}

/**
 * Force-stops every wall of `tracked` with an OOM kill: the OOM killer may end one process of
 * a wall (gVisor's Sentry, a helper) and leave the rest waiting, but an instance with an OOM
 * kill is over, whatever still runs of it. Returns the watch's stop.
 */
export function watchOom(tracked: ReadonlySet<Tracked>): () => void {
  const timer = setInterval(() => {
    for (const entry of tracked) {
      if (!entry.done && !entry.stopping && entry.cgroup.oomKills() > 0) void forceStop(entry).catch(() => undefined);
    }
  }, OOM_POLL_MS);
  timer.unref();
  return () => clearInterval(timer);
}
