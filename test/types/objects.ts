// Type-level checks of object classes, run by `npx tsc --noEmit -p .` (nothing here runs): a
// handler's context is typed from `defineObject`, and the client shape drops it.
import { defineObject, type ObjectShape } from "../../vm-runtime/index.ts";

export const counter = defineObject({
  methods: {
    inc: {
      handler: async (ctx, by = 1) => {
        const n = ((await ctx.storage.get<number>("n")) ?? 0) + by;
        await ctx.storage.put("n", n);
        return n;
      },
    },
    named: { handler: (ctx) => ctx.name },
    at: { handler: (ctx, when: number) => ctx.setAlarm(when) },
  },
  alarm: async (ctx) => {
    await ctx.deleteAlarm();
  },
});

declare const stub: ObjectShape<typeof counter>;
export const shape: {
  inc(by?: number): Promise<number>;
  named(): Promise<string>;
  at(when: number): Promise<number>;
} = stub;

export const incremented: Promise<number> = stub.inc();

// @ts-expect-error the client passes no context: the first argument is `by`
export const withContext = () => stub.inc({ name: "x" });

// @ts-expect-error `at` takes a number
export const wrongArgument = () => stub.at("soon");

// @ts-expect-error an object's method names what it calls: there is no `dec`
export const unknownMethod = () => stub.dec();

export const badHibernate = () =>
  // @ts-expect-error hibernate is "none" or "snapshot"
  defineObject({ methods: {}, hibernate: "always" });
