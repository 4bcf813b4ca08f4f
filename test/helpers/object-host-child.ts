// A microVM host in a process of its own, for tests that kill it: it joins NATS as the microVM
// host role (`OBJECT_HOST_LOGIN`, connect options as JSON), serves the test tally image as
// `tally`, activates the object `OBJECT_NAME` of `OBJECT_PRINCIPAL` with one `inc` call, prints
// `active <status> <body>`, then calls it once per line of its stdin (`{"method", "args"}`),
// printing `answer <status> <body>` (or `failed <error name>`), and serves until it is killed.
import { createInterface } from "node:readline";
import { connectNats, openBuckets } from "../../platform/index.ts";
import { startMicrovmHost } from "../../vm-runtime/service/index.ts";

const env = (name: string) => process.env[name] ?? "";
const nats = await connectNats({ ...JSON.parse(env("OBJECT_HOST_LOGIN")), name: "object-host-child" });
const { microvms } = await openBuckets(nats.nc, { only: ["microvms"] });
const host = await startMicrovmHost(nats.nc, {
  kv: microvms,
  dataDir: env("DATA_DIR"),
  hostId: env("HOST_ID"),
  images: { tally: env("TALLY_IMAGE") },
  objects: { leaseTtlMs: Number(env("LEASE_TTL_MS")) || 1_000 },
});
const object = { principal: env("OBJECT_PRINCIPAL"), image: "tally", name: env("OBJECT_NAME") };
const answer = await host.objects.call(object, "inc", [1]);
process.stdout.write(`active ${answer.status} ${Buffer.from(answer.body).toString("utf8")}\n`);

for await (const line of createInterface({ input: process.stdin })) {
  const { method, args } = JSON.parse(line) as { method: string; args: unknown[] };
  const answered = await host.objects.call(object, method, args).catch((err: unknown) => err as Error);
  process.stdout.write(
    answered instanceof Error
      ? `failed ${answered.name}\n`
      : `answer ${answered.status} ${Buffer.from(answered.body).toString("utf8")}\n`,
  );
}
