// Test-only image that reports what the instance can see and do: its environment keys,
// whether files outside its scratch directory can be read, and whether it can spawn.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { defineImage } from "../../vm-runtime/image.ts";

function attempt(action: () => unknown): string {
  try {
    action();
    return "allowed";
  } catch (error) {
    return (error as { code?: string }).code ?? "failed";
  }
}

export default defineImage({
  methods: {
    envKeys: { handler: () => Object.keys(process.env).sort() },
    pid: { handler: () => process.pid },
    /** Blocks the event loop for `ms` (a SIGTERM handler cannot run meanwhile). */
    spin: {
      handler: (ms: number) => {
        const end = Date.now() + ms;
        while (Date.now() < end);
        return ms;
      },
    },
    /** "allowed" or the error code (ERR_ACCESS_DENIED under the permission model). */
    readFile: { handler: (path: string) => attempt(() => readFileSync(path)) },
    writeScratch: {
      handler: () => attempt(() => writeFileSync(join(process.env.HOME ?? "/nonexistent", "probe.txt"), "ok")),
    },
    spawn: {
      handler: async () => {
        try {
          const childProcess = await import("node:child_process");
          return attempt(() => childProcess.execFileSync("/bin/true"));
        } catch (error) {
          return (error as { code?: string }).code ?? "failed";
        }
      },
    },
  },
});
