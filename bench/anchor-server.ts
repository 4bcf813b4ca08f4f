// The no-hop anchor: the least a user could write with the service's libraries, a polka server
// writing tasks straight to JetStream KV (no actor hop, no cache), connected as the nats.js docs
// advise for a hot connection (`noAsyncTraces`: no stack captured per request). Runs as its own
// process, like bare-server.ts, and says `{"msg":"ready","port":N}` once it listens. Environment: NATS_URL,
// NATS_NKEY (a seed file), NATS_INBOX_PREFIX, ANCHOR_BUCKET, KV_REPLICAS (default 1), BENCH_PORT.
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { Kvm } from "@nats-io/kv";
import { connect, nkeyAuthenticator } from "@nats-io/transport-node";
import polka from "polka";

const env = process.env;
const BODY_LIMIT_BYTES = 1024 * 1024;
/** Every id this server hands out is a uuid: any other id names no task (and may not be a valid key). */
const ID = /^[0-9a-f-]{1,64}$/;

const nc = await connect({
  servers: env.NATS_URL,
  name: "anchor",
  authenticator: nkeyAuthenticator(new TextEncoder().encode(readFileSync(env.NATS_NKEY!, "utf8").trim())),
  inboxPrefix: env.NATS_INBOX_PREFIX,
  noAsyncTraces: true,
});
// The service's tasks bucket's settings: one revision of history, direct gets.
const kv = await new Kvm(nc).create(env.ANCHOR_BUCKET!, {
  history: 1,
  replicas: Number(env.KV_REPLICAS ?? 1),
  allow_direct: true,
});

function send(res: ServerResponse, status: number, body: string | Uint8Array): void {
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
  res.end(body);
}

const fail = (res: ServerResponse, status: number, _tag: string, message: string) =>
  send(res, status, JSON.stringify({ _tag, message }));

/** The body as JSON, or undefined when it is over the limit or not JSON. */
async function readJson(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > BODY_LIMIT_BYTES) return undefined;
    chunks.push(chunk);
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch {
    return undefined;
  }
}

const app = polka({
  onError: (err: unknown, _req: IncomingMessage, res: ServerResponse) => {
    console.error(JSON.stringify({ level: 50, msg: "anchor failed", err: String(err) }));
    if (!res.headersSent) fail(res, 500, "InternalServerError", "internal error");
  },
});

app.post("/", async (req, res) => {
  const title = ((await readJson(req)) as { title?: unknown } | undefined)?.title;
  if (typeof title !== "string") return fail(res, 400, "ValidationFailed", "title must be a string");
  const task = { id: randomUUID(), title, completed: false };
  const json = JSON.stringify(task);
  await kv.create(task.id, json);
  send(res, 200, json);
});

app.get("/:id", async (req, res) => {
  const id = req.params.id!;
  const entry = ID.test(id) ? await kv.get(id) : null;
  if (entry && entry.operation === "PUT") return send(res, 200, entry.value);
  fail(res, 404, "TaskNotFound", `no task "${id}"`);
});

const port = Number(env.BENCH_PORT ?? 0);
app.listen(port, "127.0.0.1");
await new Promise((resolve) => app.server!.once("listening", resolve));
console.log(JSON.stringify({ msg: "ready", port: (app.server!.address() as AddressInfo).port }));

const stop = () => app.server!.close(() => void nc.drain().finally(() => process.exit(0)));
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
