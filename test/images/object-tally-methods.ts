// The methods and alarm of the test tally objects (object-tally.ts, object-tally-brief.ts,
// object-tally-hibernating.ts, object-tally-hibernating-long.ts).
import type { ObjectContext } from "../../vm-runtime/index.ts";

/** Calls of `visits` in this instance's memory, not its storage (what a hibernation keeps). */
let visits = 0;

const count = async (ctx: ObjectContext, key: string) => (await ctx.storage.get<number>(key)) ?? 0;

export const tallyMethods = {
  inc: {
    handler: async (ctx: ObjectContext, by = 1) => {
      const n = (await count(ctx, "n")) + by;
      await ctx.storage.put("n", n);
      return n;
    },
  },
  read: { handler: (ctx: ObjectContext) => count(ctx, "n") },
  /** `inc` that reads, marks `started`, waits `ms`, then writes (a paused host's write comes late). */
  slowInc: {
    handler: async (ctx: ObjectContext, ms: number) => {
      const n = (await count(ctx, "n")) + 1;
      await ctx.storage.put("started", true);
      await new Promise((resolve) => setTimeout(resolve, ms));
      await ctx.storage.put("n", n);
      return n;
    },
  },
  alarmIn: { handler: (ctx: ObjectContext, ms: number) => ctx.setAlarm(Date.now() + ms) },
  alarms: { handler: (ctx: ObjectContext) => count(ctx, "alarms") },
  hang: { handler: () => new Promise<never>(() => undefined) },
  visits: { handler: () => ++visits },
  /** Writes `text` to stdout and `err <text>` to stderr. */
  say: {
    handler: (_ctx: ObjectContext, text: string) => {
      console.log(text);
      console.error(`err ${text}`);
      return text;
    },
  },
};

export async function tallyAlarm(ctx: ObjectContext): Promise<void> {
  await ctx.storage.put("alarms", (await count(ctx, "alarms")) + 1);
}
