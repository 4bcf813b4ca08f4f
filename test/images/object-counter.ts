// Test-only object image: a counter in storage, storage and alarm calls passed through as they
// are, an alarm handler that counts its runs, a flood of concurrent writes, and a count in memory.
import { defineObject } from "../../vm-runtime/object.ts";

/** Calls of `visits` in this instance's memory (what a checkpoint keeps). */
let visits = 0;

export default defineObject({
  methods: {
    inc: {
      handler: async (ctx, by = 1) => {
        const n = ((await ctx.storage.get<number>("n")) ?? 0) + by;
        await ctx.storage.put("n", n);
        return n;
      },
    },
    name: { handler: (ctx) => ctx.name },
    visits: { handler: () => ++visits },
    get: { handler: (ctx, key: string) => ctx.storage.get(key) },
    put: { handler: (ctx, key: string, value: unknown) => ctx.storage.put(key, value) },
    remove: { handler: (ctx, key: string) => ctx.storage.delete(key) },
    list: {
      handler: async (ctx, options?: { prefix?: string; limit?: number; cursor?: string }) => {
        const page = await ctx.storage.list(options);
        return { keys: page.map((entry) => entry.key), values: page.map((entry) => entry.value), cursor: page.cursor };
      },
    },
    setAlarm: { handler: (ctx, at: number) => ctx.setAlarm(at) },
    getAlarm: { handler: (ctx) => ctx.getAlarm() },
    deleteAlarm: { handler: (ctx) => ctx.deleteAlarm() },
    /** `count` puts at once: each one's outcome, `ok` or its error's tag. */
    flood: {
      handler: async (ctx, count: number) => {
        const puts = Array.from({ length: count }, (_, i) => ctx.storage.put(`flood-${i}`, i));
        const settled = await Promise.allSettled(puts);
        return settled.map((s) => (s.status === "fulfilled" ? "ok" : (s.reason as { _tag?: string })._tag));
      },
    },
  },
  alarm: async (ctx) => {
    await ctx.storage.put("alarms", ((await ctx.storage.get<number>("alarms")) ?? 0) + 1);
  },
  idleSeconds: 30,
});
