// RPC callers for the microVM bench and how they are timed: a raw `node:http` request on a
// keep-alive Agent (what an RPC costs without fetch's own 1-2 ms), sequential latency
// percentiles, and req/s with N concurrent callers.
import { Agent, request } from "node:http";
import { percentiles, roundMs, type Percentiles } from "./stats.ts";

/** One RPC; resolves with the HTTP status (the body is read and dropped). */
export type RpcCall = () => Promise<number>;

export interface RawTarget {
  readonly host: string;
  readonly port: number;
  /** Added to every request: the proxy token, or the runtime's secret for a direct call. */
  readonly headers: Readonly<Record<string, string>>;
}

/** `host:port` → a raw target with `headers`. */
export function targetOf(endpoint: string, headers: Readonly<Record<string, string>>): RawTarget {
  const at = endpoint.lastIndexOf(":");
  return { host: endpoint.slice(0, at), port: Number(endpoint.slice(at + 1)), headers };
}

/** POST /__rpc__/<method> with a JSON array body on a keep-alive socket of `agent`. */
export function rawRpc(target: RawTarget, agent: Agent, method: string, args: unknown[]): RpcCall {
  const body = JSON.stringify(args);
  const headers = {
    ...target.headers,
    "content-type": "application/json",
    "content-length": String(Buffer.byteLength(body)),
  };
  const path = `/__rpc__/${encodeURIComponent(method)}`;
  return () =>
    new Promise((resolve, reject) => {
      const req = request({ host: target.host, port: target.port, method: "POST", path, headers, agent }, (res) => {
        res.on("data", () => undefined);
        res.once("end", () => resolve(res.statusCode ?? 0));
        res.once("error", reject);
      });
      req.once("error", reject);
      req.end(body);
    });
}

export const keepAliveAgent = (maxSockets: number) => new Agent({ keepAlive: true, maxSockets });

/** Times `n` calls one after another; a non-2xx answer fails the measurement. */
export async function sequential(call: RpcCall, n: number, warmup = Math.min(100, n)): Promise<Percentiles> {
  for (let i = 0; i < warmup; i++) expectOk(await call());
  const samples: number[] = [];
  for (let i = 0; i < n; i++) {
    const started = performance.now();
    expectOk(await call());
    samples.push(performance.now() - started);
  }
  return percentiles(samples);
}

export interface Throughput {
  callers: number;
  seconds: number;
  requests: number;
  rps: number;
  p50: number;
  p99: number;
}

/** `callers` loops calling back to back for `seconds`; every answer must be 2xx. */
export async function concurrent(call: RpcCall, callers: number, seconds: number): Promise<Throughput> {
  const samples: number[] = [];
  const started = performance.now();
  const end = started + seconds * 1000;
  await Promise.all(
    Array.from({ length: callers }, async () => {
      while (performance.now() < end) {
        const t = performance.now();
        expectOk(await call());
        samples.push(performance.now() - t);
      }
    }),
  );
  const elapsed = (performance.now() - started) / 1000;
  const { p50, p99 } = percentiles(samples);
  return {
    callers,
    seconds: roundMs(elapsed),
    requests: samples.length,
    rps: Math.round(samples.length / elapsed),
    p50,
    p99,
  };
}

function expectOk(status: number): void {
  if (status < 200 || status > 299) throw new Error(`RPC answered ${status}`);
}

/** A stub call as an RpcCall (it throws on failure, so success is 200). */
export const stubCall =
  (call: () => Promise<unknown>): RpcCall =>
  async () => (await call(), 200);
