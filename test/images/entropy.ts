// Test-only image for launch snapshots: it draws randomness and reads the clock while it is
// imported (what a snapshot taken after the import captures); `sample` draws again on each call,
// through every API an image may use, and `writeNote`/`readNote` keep a scratch file.
import { generateKeyPairSync, getRandomValues, randomBytes, randomInt, randomUUID } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { defineImage } from "../../vm-runtime/image.ts";

/** Drawn at import: the same in every instance restored from one launch snapshot. */
const atImport = { uuid: randomUUID(), math: Math.random(), at: Date.now() };
const note = () => join(process.env.HOME ?? "/scratch", "note.txt");

export default defineImage({
  methods: {
    sample: {
      handler: () => ({
        uuid: randomUUID(),
        values: Buffer.from(getRandomValues(new Uint8Array(16))).toString("hex"),
        webValues: Buffer.from(globalThis.crypto.getRandomValues(new Uint8Array(16))).toString("hex"),
        bytes: randomBytes(16).toString("hex"),
        int: randomInt(2 ** 47),
        math: Math.random(),
        publicKey: generateKeyPairSync("ed25519").publicKey.export({ format: "der", type: "spki" }).toString("hex"),
        microvmId: process.env.MICROVM_ID ?? "",
        atImport,
      }),
    },
    writeNote: {
      handler: (text: unknown) => {
        writeFileSync(note(), String(text));
        return true;
      },
    },
    readNote: {
      handler: () => {
        try {
          return readFileSync(note(), "utf8");
        } catch {
          return null;
        }
      },
    },
  },
});
