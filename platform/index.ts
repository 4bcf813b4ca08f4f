// Public entry of the platform layer: NATS connections, the private server, KV buckets, logs.
export * from "./connect.ts";
export * from "./server.ts";
export * from "./nats-binary.ts";
export * from "./nats-sync.ts";
export * from "./nats-auth.ts";
export * from "./buckets.ts";
export * from "./log.ts";
export * from "./requester.ts";
export * from "./replies.ts";
export * from "./failures.ts";
export * from "./record-store.ts";
export * from "./lease-store.ts";
export * from "./batch.ts";
export * from "./metrics.ts";
export * from "./instance-lock.ts";
export * from "./version.ts";
export * from "./tracing.ts";
