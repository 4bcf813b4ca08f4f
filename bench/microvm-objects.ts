// The object rows of the default run (issue 54's targets), through the microVM API as a user
// calls it (the SDK's object client): a call to an active object (against a proxied RPC to an
// instance in the same run), the first call of a new object (its activation, a wall booted
// ahead), storage puts and gets per second inside one call to one object, and alarms fired per
// second across active objects.
import { fileURLToPath } from "node:url";
import { httpClient } from "../client/index.ts";
import { microvmApi } from "../schemas/index.ts";
import { objectConnection, type ObjectConnection } from "../vm-runtime/index.ts";
import { bundleImageModule } from "../vm-runtime/service/index.ts";
import type { MicrovmEnvironment } from "./microvm-environment.ts";
import { expectHello, launchAndCall, terminate } from "./microvm-instances.ts";
import { pause, percentiles, type Percentiles } from "./stats.ts";

/** Issue 54's targets: call p50 (ms), cold activation p50 (ms). */
export const objectTargets = { callP50Ms: 2, activationP50Ms: 300 } as const;

export interface ObjectRows {
  call: Percentiles;
  /** A hello through the proxy to an instance, sampled between the calls. */
  proxiedRpc: Percentiles;
  activation: Percentiles;
  putsPerSecond: number;
  getsPerSecond: number;
  alarms: { objects: number; perSecond: number };
}

const CALLS = 300;
const STORAGE_OPS = 500;
const ALARM_OBJECTS = 20;

export async function measureObjects(env: MicrovmEnvironment, activations: number): Promise<ObjectRows> {
  const module = await bundleImageModule(fileURLToPath(new URL("./images/object-bench.ts", import.meta.url)));
  // Over HTTP, as the calls: the image is the calling principal's.
  await httpClient(microvmApi, env.microvmUrl).createImage({ name: "object-bench", module });
  // Through the SDK's object client, as the proxied RPC goes through the SDK's stub: one HTTP
  // transport for both (undici's fetch costs a few hundred µs more per call than node:http's).
  const connections = new Map<string, ObjectConnection>();
  const call = (name: string, method: string, args: unknown[] = []) => {
    let connection = connections.get(name);
    if (!connection) {
      connection = objectConnection("object-bench", name, { url: env.microvmUrl });
      connections.set(name, connection);
    }
    return connection.call(method, args);
  };
  const timed = async (work: () => Promise<unknown>) => {
    const began = performance.now();
    await work();
    return performance.now() - began;
  };
  {
    // Activation: the first call of a new object each time, a wall booted ahead between them.
    const activation: number[] = [];
    for (let i = 0; i < activations; i++) {
      await pause(1_500);
      activation.push(await timed(() => call(`cold-${i}`, "noop")));
    }
    // An active object against a proxied RPC, taking turns.
    const vm = await launchAndCall(env.api);
    await call("hot", "noop");
    const calls: number[] = [];
    const proxied: number[] = [];
    for (let i = 0; i < CALLS; i++) {
      calls.push(await timed(() => call("hot", "noop")));
      proxied.push(await timed(() => expectHello(vm.stub)));
    }
    await terminate(env.api, vm.microvmId);
    await call("store", "puts", [100]);
    const puts = await timed(() => call("store", "puts", [STORAGE_OPS]));
    const gets = await timed(() => call("store", "gets", [STORAGE_OPS]));
    // Alarms: ALARM_OBJECTS active objects, one alarm each, all due at one moment.
    const names = Array.from({ length: ALARM_OBJECTS }, (_, i) => `alarm-${i}`);
    for (const name of names) await call(name, "noop");
    const due = Date.now() + 2_000;
    await Promise.all(names.map((name) => call(name, "alarmAt", [due])));
    const fired: number[] = [];
    for (const name of names) {
      for (;;) {
        const at = (await call(name, "firedAt")) as number | null;
        if (at !== null) {
          fired.push(at);
          break;
        }
        await pause(100);
      }
    }
    const spanMs = Math.max(1, Math.max(...fired) - due);
    return {
      call: percentiles(calls),
      proxiedRpc: percentiles(proxied),
      activation: percentiles(activation),
      putsPerSecond: Math.round((STORAGE_OPS / puts) * 1000),
      getsPerSecond: Math.round((STORAGE_OPS / gets) * 1000),
      alarms: { objects: ALARM_OBJECTS, perSecond: +((ALARM_OBJECTS / spanMs) * 1000).toFixed(1) },
    };
  }
}

export function formatObjectRows(rows: ObjectRows): string {
  const ms = (p: Percentiles) => `${p.p50.toFixed(2)} ms | ${p.p99.toFixed(2)} ms`;
  const verdict = (met: boolean) => (met ? "met" : "missed");
  return [
    "| objects | p50 | p99 | target (idle machine) | verdict |",
    "| --- | --- | --- | --- | --- |",
    `| call to an active object (${CALLS}) | ${ms(rows.call)} | ≤ ${objectTargets.callP50Ms} ms | ` +
      `${verdict(rows.call.p50 <= objectTargets.callP50Ms)} |`,
    `| proxied RPC to an instance, between them | ${ms(rows.proxiedRpc)} | | |`,
    `| first call of a new object (activation) | ${ms(rows.activation)} | ≤ ${objectTargets.activationP50Ms} ms | ` +
      `${verdict(rows.activation.p50 <= objectTargets.activationP50Ms)} |`,
    "",
    `storage on one object, inside one call (${STORAGE_OPS} each): ${rows.putsPerSecond} puts/s, ` +
      `${rows.getsPerSecond} gets/s; alarms: ${rows.alarms.objects} active objects due at one moment, ` +
      `${rows.alarms.perSecond} fired/s (from the due time to the last one's run)`,
  ].join("\n");
}
