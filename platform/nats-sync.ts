// NATS_SYNC: how often the private server and the local cluster fsync JetStream's files.
// `1s` (the default) bounds the loss on power loss to about a second of acknowledged writes,
// like Redis' `appendfsync everysec`; `always` syncs every write before it is acknowledged.
// Written as `sync_interval` in the server's `jetstream {}` block.

export const DEFAULT_NATS_SYNC = "1s";

/** A Go duration nats-server accepts (`100ms`, `1s`, `1m30s`), not zero. */
const GO_DURATION = /^(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))+$/;

/** The value to write, or an error with a one-line message for an invalid one. */
export function parseNatsSync(raw: string | undefined): string {
  if (raw === undefined || raw === "") return DEFAULT_NATS_SYNC;
  if (raw === "always") return raw;
  if (GO_DURATION.test(raw) && /[1-9]/.test(raw)) return raw;
  throw new Error(`NATS_SYNC must be "always" or a positive duration such as 1s, 100ms or 2m, got "${raw}"`);
}

/** The `sync_interval` line of the `jetstream {}` block. */
export function syncIntervalConfig(sync: string): string {
  return `sync_interval: ${JSON.stringify(sync)}`;
}
