// The object the bench calls: a no-op (call latency), loops of storage puts and gets inside one
// call (storage operations per second on one object), and an alarm that records when it ran.
import { defineObject, type ObjectContext } from "../../vm-runtime/index.ts";

export default defineObject({
  methods: {
    noop: { handler: () => null },
    puts: {
      handler: async (ctx: ObjectContext, count: number) => {
        for (let i = 0; i < count; i++) await ctx.storage.put(`k${i % 100}`, i);
        return count;
      },
    },
    gets: {
      handler: async (ctx: ObjectContext, count: number) => {
        for (let i = 0; i < count; i++) await ctx.storage.get(`k${i % 100}`);
        return count;
      },
    },
    alarmAt: { handler: (ctx: ObjectContext, at: number) => ctx.setAlarm(at) },
    firedAt: { handler: (ctx: ObjectContext) => ctx.storage.get<number>("firedAt") },
  },
  alarm: async (ctx: ObjectContext) => {
    await ctx.storage.put("firedAt", Date.now());
  },
  idleSeconds: 600,
});
