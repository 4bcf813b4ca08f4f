// Public entry of the platform layer: NATS connections, the private server, KV buckets, logs.
export * from "./connect.ts";
export * from "./server.ts";
export * from "./buckets.ts";
export * from "./log.ts";
export * from "./requester.ts";
export * from "./record-store.ts";
export * from "./lease-store.ts";
export * from "./batch.ts";
export * from "./metrics.ts";
