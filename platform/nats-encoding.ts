// nats.js encodes every protocol line, header block and string payload with one TextEncoder
// (`TE` of nats-core). Node's TextEncoder.encode allocates a fresh ArrayBuffer per call (about
// 1 µs for a short string); Buffer.from takes short strings from a shared pool (about 0.1 µs).
import { TE } from "@nats-io/nats-core/internal";

const POOLED_MAX = 4096;
let pooled = false;

/** Makes nats.js encode short strings into pooled buffers (once per process; the bytes are the same). */
export function poolNatsEncoding(): void {
  if (pooled) return;
  pooled = true;
  const encode = TE.encode.bind(TE);
  TE.encode = (input?: string): Uint8Array<ArrayBuffer> =>
    typeof input === "string" && input.length < POOLED_MAX
      ? (Buffer.from(input, "utf8") as Uint8Array<ArrayBuffer>)
      : encode(input);
}
