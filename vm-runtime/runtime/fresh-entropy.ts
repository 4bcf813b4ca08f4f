// Inside an instance restored from a launch snapshot: everything random that the snapshot froze
// is made fresh before the instance gets its identity. Node draws from OpenSSL's DRBG, whose
// state is in the saved memory (two restores would draw the same bytes), and caches bytes for
// randomUUID and randomInt; V8 seeds Math.random once. A template's node runs with OpenSSL's
// rdrand engine as its RAND method from its start (`LAUNCH_OPENSSL_CONFIG`: every draw asks the
// CPU, no DRBG state to freeze), so here both caches are drained and Math.random draws from crypto.
import { randomBytes, randomFillSync, randomInt, randomUUID } from "node:crypto";

/**
 * OpenSSL's configuration for a template's node (`--openssl-config`): RAND from the CPU's
 * RDRAND. Node refuses to start where the engine cannot load, so no snapshot is taken there.
 */
export const LAUNCH_OPENSSL_CONFIG = [
  "nodejs_conf = nodejs_init",
  "[nodejs_init]",
  "engines = engines_section",
  "[engines_section]",
  "rdrand = rdrand_section",
  "[rdrand_section]",
  "engine_id = rdrand",
  "default_algorithms = RAND",
  "init = 1",
  "",
].join("\n");

/** A restored instance cannot be given fresh randomness: it must not serve. */
export class EntropyError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "EntropyError";
  }
}

/** randomUUID's cache holds this many UUIDs (node's kBatchSize). */
const UUID_BATCH = 128;
/** randomInt's cache holds 6 KiB, 6 bytes per draw: one more draw than that refills it. */
const RANDOM_INT_DRAWS = 1024 + 1;
const MATH_POOL_BYTES = 4096;

/** Makes crypto and Math.random draw fresh values; throws EntropyError where it cannot. */
export function refreshEntropy(): void {
  const first = randomBytes(32);
  const second = randomBytes(32);
  if (first.equals(second) || first.every((byte) => byte === 0xff) || first.every((byte) => byte === 0))
    throw new EntropyError("RDRAND answers with constant bytes");
  // Each call past the cache's last entry refills it from the engine: a full turn reaches it.
  for (let i = 0; i < UUID_BATCH; i += 1) randomUUID();
  for (let i = 0; i < RANDOM_INT_DRAWS; i += 1) randomInt(0xffff_ffff_fffe);
  Math.random = cryptoMathRandom();
}

/** Math.random drawing 53-bit fractions from crypto, a pool at a time. */
function cryptoMathRandom(): () => number {
  const pool = Buffer.alloc(MATH_POOL_BYTES);
  let offset = pool.length;
  return function random() {
    if (offset === pool.length) {
      randomFillSync(pool);
      offset = 0;
    }
    const high = pool.readUInt32BE(offset) >>> 11;
    const low = pool.readUInt32BE(offset + 4);
    offset += 8;
    return (high * 2 ** 32 + low) / 2 ** 53;
  };
}
