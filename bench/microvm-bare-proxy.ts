// A child process for the microVM bench: vm-runtime's instance proxy alone (token check and
// forward, no lifecycle machine, no KV writer, no host) in front of a runtime started by
// hand, so the RPC path splits into proxy cost and host cost. Env: BENCH_PORT (default: a free
// one), BENCH_UPSTREAM_PORT, BENCH_UPSTREAM_SECRET, BENCH_TOKEN_KEY, BENCH_MICROVM_ID. Says
// `{"msg":"ready","port":N}` once it listens.
import { createInstanceProxy, RUNTIME_PORT } from "../vm-runtime/service/index.ts";
import { INSTANCE_SECRET_HEADER } from "../vm-runtime/wire/rpc.ts";

const env = process.env;
const upstreamPort = Number(env.BENCH_UPSTREAM_PORT);
const upstreamHeaders = { [INSTANCE_SECRET_HEADER]: env.BENCH_UPSTREAM_SECRET ?? "" };

const proxy = createInstanceProxy({
  microvmId: env.BENCH_MICROVM_ID ?? "bench-direct",
  tokenKey: env.BENCH_TOKEN_KEY ?? "",
  state: () => "RUNNING",
  resolveUpstream: (port) => (port === RUNTIME_PORT ? { host: "127.0.0.1", port: upstreamPort } : undefined),
  upstreamHeaders: () => upstreamHeaders,
});

const address = await proxy.listen(Number(env.BENCH_PORT ?? 0), "127.0.0.1");
console.log(JSON.stringify({ msg: "ready", port: Number(address.slice(address.lastIndexOf(":") + 1)) }));
const stop = () => void proxy.close().then(() => process.exit(0));
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
