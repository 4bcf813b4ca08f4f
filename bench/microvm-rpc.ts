// RPC round trips for the microVM bench, on one RUNNING instance: the client stub (fetch)
// and a raw keep-alive node:http call through the host's proxy, and the same raw call to a
// runtime started by hand (directly, and behind a bare proxy process): sequential p50/p99,
// req/s with N concurrent callers, and the CPU each process spends per call.
import { randomBytes } from "node:crypto";
import { createAuthToken as signToken, RUNTIME_PORT } from "../vm-runtime/service/index.ts";
import { startBuiltServer } from "./stacks.ts";
import type { Connected } from "./microvm-instances.ts";
import {
  concurrent,
  keepAliveAgent,
  rawRpc,
  sequential,
  stubCall,
  targetOf,
  type RawTarget,
  type RpcCall,
  type Throughput,
} from "./microvm-http.ts";
import type { Percentiles } from "./stats.ts";
import type { DirectRuntime } from "./microvm-direct.ts";
import { cpuSeconds } from "./proc.ts";

export interface RpcSettings {
  /** Sequential calls per path (after 100 unmeasured). */
  calls: number;
  callers: number;
  /** Seconds of concurrent load per path. */
  seconds: number;
}

export interface RpcPath {
  path: string;
  sequential: Percentiles;
  concurrent: Throughput;
  /** CPU per call under the concurrent load, µs, by process. */
  cpuUsPerCall: Record<string, number>;
}

/** A process, or several counted as one (an instance's processes: bwrap's, or runsc's and the Sentry's stubs). */
export type CpuSubject = number | readonly number[];

const cpuOf = (subject: CpuSubject) =>
  typeof subject === "number" ? cpuSeconds(subject) : subject.reduce((sum, pid) => sum + cpuSeconds(pid), 0);

/**
 * One path: 1 s of unmeasured concurrent load (a freshly started process runs cold code),
 * then sequential calls, then concurrent load with the CPU of `pids` (by name) sampled.
 */
export async function measurePath(
  path: string,
  calls: { sequential: RpcCall; concurrent: RpcCall },
  pids: Record<string, CpuSubject>,
  settings: RpcSettings,
): Promise<RpcPath> {
  await concurrent(calls.concurrent, settings.callers, 1);
  const seq = await sequential(calls.sequential, settings.calls);
  const before = Object.fromEntries(Object.entries(pids).map(([name, subject]) => [name, cpuOf(subject)]));
  const load = await concurrent(calls.concurrent, settings.callers, settings.seconds);
  const cpuUsPerCall = Object.fromEntries(
    Object.entries(pids).map(([name, subject]) => [
      name,
      Math.round(((cpuOf(subject) - before[name]!) * 1e6) / Math.max(1, load.requests)),
    ]),
  );
  return { path, sequential: seq, concurrent: load, cpuUsPerCall };
}

/** The host's proxy: the stub (fetch) and a raw keep-alive call. */
export async function measureHostProxy(
  vm: Connected,
  pids: Record<string, CpuSubject>,
  settings: RpcSettings,
): Promise<RpcPath[]> {
  const target = targetOf(vm.endpoint, { "x-aws-proxy-auth": vm.token });
  const stub = stubCall(() => vm.stub.hello("x"));
  return [
    await measurePath(
      "stub.hello via host proxy (client stub)",
      { sequential: stub, concurrent: stub },
      pids,
      settings,
    ),
    await measurePath("raw http via host proxy", rawCalls(target, settings), pids, settings),
  ];
}

/** A runtime started by hand: called directly, and through a bare proxy process. */
export async function measureDirect(runtime: DirectRuntime, settings: RpcSettings): Promise<RpcPath[]> {
  const direct: RawTarget = { host: "127.0.0.1", port: runtime.port, headers: runtime.headers };
  const paths = [
    await measurePath(
      "raw http direct to a runtime (by hand)",
      rawCalls(direct, settings),
      { instance: runtime.pid },
      settings,
    ),
  ];
  const key = randomBytes(32).toString("base64url");
  const { child: proxy, port } = await startBuiltServer("bare-proxy", "bench/microvm-bare-proxy.ts", {
    PATH: process.env.PATH,
    BENCH_UPSTREAM_PORT: String(runtime.port),
    BENCH_UPSTREAM_SECRET: runtime.headers["x-instance-secret"],
    BENCH_TOKEN_KEY: key,
    BENCH_MICROVM_ID: "bench-direct",
  });
  try {
    const { token } = signToken(
      { microvmId: "bench-direct", expirationInMinutes: 60, allowedPorts: [{ port: RUNTIME_PORT }] },
      key,
    );
    const proxied: RawTarget = { host: "127.0.0.1", port, headers: { "x-aws-proxy-auth": token } };
    paths.push(
      await measurePath(
        "raw http via bare proxy process → runtime (by hand)",
        rawCalls(proxied, settings),
        { proxy: proxy.pid, instance: runtime.pid },
        settings,
      ),
    );
  } finally {
    await proxy.stop();
  }
  return paths;
}

function rawCalls(target: RawTarget, settings: RpcSettings) {
  return {
    sequential: rawRpc(target, keepAliveAgent(1), "hello", ["x"]),
    concurrent: rawRpc(target, keepAliveAgent(settings.callers), "hello", ["x"]),
  };
}
