// Test-only image, pushed as one self-contained module: `fill(mib)` holds that many MiB of
// incompressible bytes (a xorshift stream) and answers their SHA-256; `verify()` hashes them
// again; `limits()` answers what the instance sees of its memory and CPUs.
const inlineDefineImage =
  `const defineImage = (d) => Object.freeze({ kind: "typed-service/microvm-image", ` +
  `methods: d.methods, fetch: d.fetch ?? (() => new Response("no", { status: 404 })) });`;

export const fillerModule = `
import os, { availableParallelism } from "node:os";
${inlineDefineImage}
let data = new Uint8Array(0);
const hex = async (bytes) => Buffer.from(await crypto.subtle.digest("SHA-256", bytes)).toString("hex");
export default defineImage({
  methods: {
    fill: {
      handler: async (mib) => {
        data = new Uint8Array(mib * 1024 * 1024);
        const words = new Uint32Array(data.buffer);
        let x = (Date.now() ^ 0x9e3779b9) >>> 0 || 1;
        for (let i = 0; i < words.length; i++) {
          x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
          words[i] = x;
        }
        return hex(data);
      },
    },
    verify: { handler: () => hex(data) },
    limits: {
      handler: () => ({
        totalmem: os.totalmem(),
        parallelism: os.availableParallelism(),
        imported: availableParallelism(),
        cpus: os.cpus().length,
        hardwareConcurrency: navigator.hardwareConcurrency,
      }),
    },
  },
});
`;
