// MicroVM test service: a private NATS, one or more microVM hosts in the test process, the
// microVM API gateway on port 0, and typed clients over both transports. Plus the checks
// every microVM test file ends with (no instance process left).
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { KV } from "@nats-io/kv";
import { startMicrovmHost, type MicrovmHost, type MicrovmHostOptions } from "../../actors/index.ts";
import { httpClient, natsClient, type Client } from "../../client/index.ts";
import { createGateways } from "../../gateway/index.ts";
import { connectNats, openBuckets, type NatsHandle } from "../../platform/index.ts";
import { microvmApi } from "../../schemas/index.ts";
import { childProcessesWith, INSTANCE_MARKER, readProcStat, type MicrovmState } from "../../vm-runtime/index.ts";
import type { Defer } from "./defer.ts";
import { testNats, type TestNats } from "./nats.ts";

export type MicrovmClient = Client<typeof microvmApi>;

export interface MicrovmService {
  nats: TestNats;
  handle: NatsHandle;
  kv: KV;
  host: MicrovmHost;
  dataDir: string;
  microvmUrl: string;
  overNats: MicrovmClient;
  overHttp: MicrovmClient;
  /** Starts one more host on the same NATS (its own connection and data dir). */
  addHost(options?: Partial<MicrovmHostOptions>): Promise<{ host: MicrovmHost; handle: NatsHandle }>;
}

export const policy = (overrides: Partial<{ maxIdleDurationSeconds: number; suspendedDurationSeconds: number; autoResumeEnabled: boolean }> = {}) => ({
  maxIdleDurationSeconds: 600,
  suspendedDurationSeconds: 600,
  autoResumeEnabled: true,
  ...overrides,
});

export async function startMicrovmService(defer: Defer, options: Partial<MicrovmHostOptions> = {}): Promise<MicrovmService> {
  const nats = await testNats(defer);
  const addHost = async (hostOptions: Partial<MicrovmHostOptions> = {}) => {
    const handle = await connectNats({ servers: nats.url, name: "test-microvm-host" });
    defer(() => handle.close());
    const { microvms } = await openBuckets(handle.nc);
    const dataDir = await mkdtemp(join(tmpdir(), "microvm-host-"));
    defer(() => rm(dataDir, { recursive: true, force: true }));
    const host = await startMicrovmHost(handle.nc, { kv: microvms, dataDir, ...hostOptions });
    defer(() => host.close());
    return { host, handle, dataDir, kv: microvms };
  };
  const first = await addHost(options);
  const gateway = createGateways({ nats: first.handle }).microvm;
  const port = await gateway.listen(0, "127.0.0.1");
  defer(() => gateway.close());
  const microvmUrl = `http://127.0.0.1:${port}`;
  return {
    nats,
    handle: first.handle,
    kv: first.kv,
    host: first.host,
    dataDir: first.dataDir,
    microvmUrl,
    overNats: natsClient(microvmApi, first.handle.nc),
    overHttp: httpClient(microvmApi, microvmUrl),
    addHost: async (hostOptions) => {
      const { host, handle } = await addHost(hostOptions);
      return { host, handle };
    },
  };
}

/** Polls GetMicrovm until the state is one of `states`; fails the test after `timeoutMs`. */
export async function waitForState(client: MicrovmClient, microvmId: string, states: readonly MicrovmState[], timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const vm = await client.getMicrovm({ microvmIdentifier: microvmId });
    if (states.includes(vm.state as MicrovmState)) return vm;
    if (Date.now() > deadline) assert.fail(`${microvmId} is ${vm.state} (${vm.stateReason ?? ""}), expected ${states.join("|")}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Instance processes started by this test process (the in-process hosts' children). */
export function instanceChildren(): number[] {
  return childProcessesWith(process.pid, INSTANCE_MARKER);
}

/** The file's last check: every instance process of this test process is gone. */
export async function assertNoInstanceLeft(): Promise<void> {
  const deadline = Date.now() + 5_000;
  while (instanceChildren().length > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  assert.deepEqual(instanceChildren(), [], "an instance process was left running");
}

/** One-letter process state from /proc ('T' stopped), or undefined when gone. */
export const processState = (pid: number) => readProcStat(pid)?.state;
