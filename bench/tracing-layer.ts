// What tracing itself costs a create, by sampler: the calls the gateway and the actor make for
// one createTask (the gateway's span and its attributes, the NATS request's span and its
// `traceparent` in NATS headers, the actor's span read from them, one KV call), with no NATS
// and no HTTP around them, so that a few microseconds show on a busy machine. The samplers run
// in turns in every round, and each one's CPU per create is compared with tracing off in the
// same round. Spans go over OTLP/HTTP to a receiver here that discards them (its CPU counted);
// at this pace the SDK's batch processor drops what its queue (2,048 spans) cannot hold, as it
// does in a service under load, so the figure with every request sampled is a floor.
// Run on plain node, as the service runs (under tsx, with source maps on, a recorded span costs
// more): npx esbuild bench/tracing-layer.ts --bundle --platform=node --format=esm
// --packages=external --outfile=dist/tracing-layer.mjs && node dist/tracing-layer.mjs [creates
// per turn, default 20000] [rounds, default 7]
import { once } from "node:events";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { context, ROOT_CONTEXT } from "@opentelemetry/api";
import { headers as natsHeaders, type MsgHdrs } from "@nats-io/transport-node";
import { injectTrace, SpanKind, startTracing, traceAttribute, traced, tracedMethods } from "../platform/index.ts";

const creates = Number(process.argv[2] ?? 20_000);
const rounds = Number(process.argv[3] ?? 7);
/** `parentbased_traceidratio` at each ratio; `off`: tracing not started. */
const samplers: [string, string | undefined][] = [
  ["off", undefined],
  ["0", "0"],
  ["0.1", "0.1"],
  ["1", "1"],
];

const receiver = createServer((req, res) => {
  req.resume();
  req.on("end", () => res.writeHead(200, { "content-type": "application/json" }).end("{}"));
});
receiver.listen(0, "127.0.0.1");
await once(receiver, "listening");
process.env.OTEL_EXPORTER_OTLP_ENDPOINT = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}`;
process.env.OTEL_TRACES_SAMPLER = "parentbased_traceidratio";

async function tracing(ratio: string | undefined) {
  if (ratio === undefined) return undefined;
  process.env.OTEL_TRACES_SAMPLER_ARG = ratio;
  return startTracing("tracing-layer");
}

// A store made while tracing is on, as the service makes its stores.
const store = await (async () => {
  const stop = await tracing("1");
  const made = tracedMethods({ create: async (_key: string, _value: string) => 1 }, "kv tasks");
  await stop?.();
  return made;
})();

const attributes = { "operation.name": "createTask" };
const actor = (h: MsgHdrs) =>
  traced("handle createTask", SpanKind.SERVER, h, async () => {
    await store.create("key", "value");
    return "{}";
  });
const gateway = (requestHeaders: Record<string, string>) =>
  traced(
    "POST /",
    SpanKind.SERVER,
    requestHeaders,
    async () => {
      traceAttribute("request.id", "0123456789abcdef");
      const reply = await traced("request tasks.create", SpanKind.CLIENT, undefined, async () => {
        const h = natsHeaders();
        h.set("X-Request-Id", "0123456789abcdef");
        injectTrace(h);
        // The actor runs in another process: in no trace context but what the headers carry.
        return context.with(ROOT_CONTEXT, () => actor(h));
      });
      traceAttribute("http.response.status_code", 200);
      return reply;
    },
    attributes,
  );

async function turn(ratio: string | undefined): Promise<number> {
  const stop = await tracing(ratio);
  const run = async (n: number) => {
    for (let i = 0; i < n; i++) await gateway({ host: "localhost", "content-type": "application/json" });
  };
  await run(2_000);
  const before = process.cpuUsage();
  await run(creates);
  await stop?.(); // exports what is left: counted
  const cpu = process.cpuUsage(before);
  return (cpu.user + cpu.system) / creates;
}

const perCreate: Record<string, number[]> = {};
for (let round = 0; round <= rounds; round++) {
  const order = round % 2 === 1 ? [...samplers].reverse() : samplers;
  for (const [name, ratio] of order) {
    const micros = await turn(ratio);
    if (round > 0) (perCreate[name] ??= []).push(micros); // round 0 warms up
  }
}
receiver.close();

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
console.log(`node ${process.version}, ${creates} creates per turn, ${rounds} rounds; CPU µs per create, medians`);
console.log("| sampler | µs per create | over off, same round |");
console.log("|---|---:|---:|");
for (const [name] of samplers) {
  const xs = perCreate[name]!;
  const over = xs.map((x, i) => x - perCreate.off![i]!);
  const label = name === "off" ? "off" : `parentbased_traceidratio ${name}`;
  console.log(`| ${label} | ${median(xs).toFixed(1)} | ${name === "off" ? "-" : `+${median(over).toFixed(1)}`} |`);
}
