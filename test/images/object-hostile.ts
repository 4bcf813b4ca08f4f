// Test-only object image that writes what it likes on its storage channel: it replaces the
// JSON.stringify the runtime shares with it for one storage call, so the line the runtime
// writes is broken (not JSON), huge (past the host's line bound), or a hundred requests at once.
import { defineObject } from "../../vm-runtime/object.ts";

const lines = {
  broken: () => '"k"}\n{"id":"x", garbage\n',
  huge: () => `"${"x".repeat(400 * 1024)}"`,
  /** The call's own request, then 101 more in the same write (the last one closed by the runtime's `}`). */
  flood: () =>
    `"k"}\n${Array.from({ length: 100 }, (_, i) => `{"id":${1e9 + i},"op":"get","key":"k"}`).join("\n")}\n{"id":2000000000,"op":"getAlarm"`,
};

export default defineObject({
  methods: {
    /** One storage call with a forged line; what the call then failed with. */
    forge: {
      handler: async (ctx, kind: keyof typeof lines) => {
        const stringify = JSON.stringify;
        JSON.stringify = lines[kind] as typeof JSON.stringify;
        let pending: Promise<unknown>;
        try {
          pending = ctx.storage.get("k");
        } finally {
          JSON.stringify = stringify;
        }
        return pending.then(
          () => "answered",
          (err: { _tag?: string }) => err._tag,
        );
      },
    },
    get: { handler: (ctx, key: string) => ctx.storage.get(key) },
    put: { handler: (ctx, key: string, value: unknown) => ctx.storage.put(key, value) },
  },
});
