// Type-level checks of object classes, run by `npx tsc --noEmit -p .` (nothing here runs): a
// handler's context is typed from `defineObject`, and the client shape drops it.
import { defineObject, type ObjectShape } from "../../vm-runtime/index.ts";
import type counter from "../images/object-counter.ts";

declare const stub: ObjectShape<typeof counter>;
export const shape: {
  inc(by?: number): Promise<number>;
  name(): Promise<string>;
  setAlarm(at: number): Promise<number>;
  getAlarm(): Promise<number | null>;
  remove(key: string): Promise<boolean>;
} = stub;

export const incremented: Promise<number> = stub.inc();

// @ts-expect-error the client passes no context: the first argument is `by`
export const withContext = () => stub.inc({ name: "x" });

// @ts-expect-error `setAlarm` takes a number
export const wrongArgument = () => stub.setAlarm("soon");

// @ts-expect-error an object's method names what it calls: there is no `dec`
export const unknownMethod = () => stub.dec();

export const badHibernate = () =>
  // @ts-expect-error hibernate is "none" or "snapshot"
  defineObject({ methods: {}, hibernate: "always" });

export const contextTyped = defineObject({
  methods: {
    // @ts-expect-error the context has no `storage.incr`
    bad: { handler: (ctx) => ctx.storage.incr("n") },
  },
});
