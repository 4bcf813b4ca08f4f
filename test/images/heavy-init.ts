// Test-only image with a heavy import: it bundles Ajv and compiles a few hundred JSON schemas
// while it is imported (what an image doing real work at start-up costs a cold start), then
// validates with them per call. The launch snapshot measurements use it beside `sandbox`, and
// the bench's launch-from-snapshot row (bench/microvm-launch-snapshots.ts) through `identity`.
import { randomUUID } from "node:crypto";
import { Ajv } from "ajv";
import { defineImage } from "../../vm-runtime/image.ts";

const SCHEMAS = 300;
const ajv = new Ajv({ allErrors: true });
const validators = Array.from({ length: SCHEMAS }, (_, i) =>
  ajv.compile({
    $id: `https://example.test/record-${i}`,
    type: "object",
    required: ["id", "name", "tags"],
    properties: {
      id: { type: "integer", minimum: i },
      name: { type: "string", minLength: 1, maxLength: 64 + i },
      tags: { type: "array", items: { type: "string", pattern: `^t${i}-[a-z]+$` }, maxItems: 16 },
      nested: {
        type: "object",
        properties: { at: { type: "number" }, ok: { type: "boolean" }, [`field${i}`]: { enum: [i, `${i}`] } },
        additionalProperties: false,
      },
    },
    additionalProperties: false,
  }),
);

/** Who imported the module: the instance's own id on a cold start, "" in a launch snapshot's template. */
const importedAs = process.env.MICROVM_ID ?? "";
const importUuid = randomUUID();

export default defineImage({
  methods: {
    identity: { handler: () => ({ importedAs, importUuid, uuid: randomUUID() }) },
    hello: { handler: (name: unknown) => `hello, ${String(name)}` },
    check: {
      handler: (index: unknown, value: unknown) => validators[Number(index) % SCHEMAS]!(value),
    },
  },
});
