// A/B of what an idle gVisor instance costs under candidate runsc and node flags, on the
// provider alone: each variant runs through a runsc wrapper that adds its runsc flags and writes
// its node flags into the bundle's command line. Per round, variants in turn (order alternating):
// N instances of the `sandbox` image started one after another, then idle; the machine's
// MemTotal - MemAvailable added per instance, the cgroups' charge, each part's PSS, start times.
// Medians over rounds. Run: npx tsx bench/microvm-idle-ab.ts [instances] [rounds] [variant...]
import { chmodSync, readFileSync, writeFileSync } from "node:fs";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  builtinImages,
  checkGvisor,
  createGvisorProvider,
  findRunsc,
  type IsolatedProvider,
} from "../vm-runtime/service/index.ts";
import { pssKiB, roleOf, usedKiB } from "./gvisor-parts.ts";
import { IDLE_GC_AFTER_MS } from "../vm-runtime/runtime/idle-gc.ts";
import { median, pause } from "./stats.ts";

interface Variant {
  readonly runscFlags?: readonly string[];
  readonly nodeFlags?: readonly string[];
  /** Environment of runsc and what it starts (Go's GOGC, ...). */
  readonly env?: Readonly<Record<string, string>>;
  /** Environment variables added to the instance's process (`NAME=value`). */
  readonly instanceEnv?: readonly string[];
  /** A sed expression run over the runtime bundle in the instance's root (`s|a|b|`). */
  readonly runtimeSed?: string;
}

const idleGc = "--import=data:text/javascript,setTimeout(()=>globalThis.gc(),2000).unref()";

const idleGcLastResort =
  "--import=data:text/javascript,setTimeout(()=>globalThis.gc({type:'major',execution:'sync',flavor:'last-resort'}),2000).unref()";
const idleSizeGc =
  "--import=data:text/javascript,setTimeout(()=>{process.getBuiltinModule('v8').setFlagsFromString('--optimize-for-size');" +
  "globalThis.gc({type:'major',execution:'sync',flavor:'last-resort'})},2000).unref()";

/** Candidates by name; `base` is the provider's own command line. */
const variants: Record<string, Variant> = {
  base: {},
  "malloc-arena-1": { instanceEnv: ["MALLOC_ARENA_MAX=1"] },
  "malloc-trim-64k": { instanceEnv: ["MALLOC_TRIM_THRESHOLD_=65536"] },
  "no-idle-gc": { runtimeSed: "s|collectWhenIdle(server, options.idleGcAfterMs);|;|" },
  "max-lazy": { nodeFlags: ["--max-lazy"] },
  "no-opt": { nodeFlags: ["--no-opt"] },
  "max-opt=1": { nodeFlags: ["--max-opt=1"] },
  "semi-space-0.5": { nodeFlags: ["--min-semi-space-size=1"] },
  "no-expose-wasm": { nodeFlags: ["--no-expose-wasm"] },
  "idle-gc": { nodeFlags: ["--expose-gc", idleGc] },
  "optimize-for-size": { nodeFlags: ["--optimize-for-size"] },
  "idle-gc-last-resort": { nodeFlags: ["--expose-gc", idleGcLastResort] },
  "idle-size-gc": { nodeFlags: ["--expose-gc", idleSizeGc] },
  "directfs-off": { runscFlags: ["--directfs=false"] },
  "file-access-shared": { runscFlags: ["--file-access=shared"] },
  "overlay2-root-memory": { runscFlags: ["--overlay2=root:memory"] },
  "gogc-50": { env: { GOGC: "50" } },
  "gogc-25": { env: { GOGC: "25" } },
  "gomemlimit-1": { env: { GOMEMLIMIT: "1MiB" } },
  "gomemlimit-4": { env: { GOMEMLIMIT: "4MiB" } },
  "gogc-25-gomemlimit-1": { env: { GOGC: "25", GOMEMLIMIT: "1MiB" } },
  "semi-space-max-0": { nodeFlags: ["--max-semi-space-size=0"] },
  "v8-pool-0": { nodeFlags: ["--v8-pool-size=0"] },
  "platform-ptrace": { runscFlags: ["--platform=ptrace"] },
  "no-sparkplug-maglev": { nodeFlags: ["--no-sparkplug", "--no-maglev"] },
};

const MiB = 1024 * 1024;
/** Idle time before the reading: past the runtime's collection once idle (IDLE_GC_AFTER_MS). */
const SETTLE_MS = IDLE_GC_AFTER_MS + 3_000;

/** The group's own figures in memory.stat (cgroup v1) and its kernel memory, MiB, found by one of its pids. */
function memoryStat(pid: number): Record<string, number> {
  try {
    const path = /^\d+:memory:(.*)$/m.exec(readFileSync(`/proc/${pid}/cgroup`, "utf8"))?.[1];
    const dir = `/sys/fs/cgroup/memory${path}`;
    const stat = readFileSync(`${dir}/memory.stat`, "utf8");
    const field = (name: string) => Number(new RegExp(`^${name} (\\d+)`, "m").exec(stat)?.[1] ?? 0) / MiB;
    const kmem = Number(readFileSync(`${dir}/memory.kmem.usage_in_bytes`, "utf8")) / MiB;
    return { rss: field("rss"), cache: field("cache"), shmem: field("shmem"), kmem };
  } catch {
    return {};
  }
}

/** Host threads of a process (each counts against the kernel's pid_max). */
function threadsOf(pid: number): number {
  try {
    return Number(/^Threads:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1] ?? 0);
  } catch {
    return 0;
  }
}

/** A runsc that adds the variant's flags: its own before runsc's, node's after `--no-warnings`. */
function wrapper(dir: string, name: string, variant: Variant): string {
  const path = join(dir, `runsc-${name.replace(/[^a-z0-9.=-]/gi, "_")}`);
  const nodeJson = (variant.nodeFlags ?? []).map((flag) => JSON.stringify(flag)).join(",");
  const sedSafe = nodeJson.replace(/[\\&|]/g, "\\$&");
  const script = [
    "#!/bin/sh",
    'for arg; do case "$arg" in --bundle=*) bundle="${arg#--bundle=}";; esac; done',
    nodeJson &&
      `[ -n "$bundle" ] && sed -i 's|"--no-warnings"|"--no-warnings",${sedSafe.replace(/'/g, "'\\''")}|' "$bundle/config.json"`,
    ...Object.entries(variant.env ?? {}).map(([key, value]) => `export ${key}=${value}`),
    variant.instanceEnv?.length &&
      `[ -n "$bundle" ] && sed -i 's|"env":\\[|"env":[${variant.instanceEnv.map((entry) => JSON.stringify(entry)).join(",")},|' "$bundle/config.json"`,
    variant.runtimeSed && `[ -n "$bundle" ] && sed -i '${variant.runtimeSed}' "$bundle/rootfs/app/image.mjs"`,
    `exec ${findRunsc()} ${(variant.runscFlags ?? []).join(" ")} "$@"`,
  ].filter(Boolean);
  writeFileSync(path, `${script.join("\n")}\n`);
  chmodSync(path, 0o755);
  return path;
}

interface Sample {
  machineMiB: number;
  chargedMiB: number;
  startMs: number;
  parts: Record<string, number>;
}

async function idleRound(provider: IsolatedProvider, instances: number, round: number): Promise<Sample> {
  await pause(2_000);
  const before = usedKiB();
  const starts: number[] = [];
  for (let i = 0; i < instances; i++) {
    const began = performance.now();
    await provider.start({ microvmId: `ab-${round}-${i}`, image: builtinImages.sandbox });
    starts.push(performance.now() - began);
  }
  await pause(SETTLE_MS);
  const machineMiB = (usedKiB() - before) / 1024 / instances;
  const parts: Record<string, number> = {};
  let charged = 0;
  for (const handle of provider.live()) {
    const group = provider.cgroupOf(handle)!;
    charged += group.memoryBytes();
    const [first] = group.pids();
    for (const [key, mib] of Object.entries(first === undefined ? {} : memoryStat(first)))
      parts[`cg.${key}`] = (parts[`cg.${key}`] ?? 0) + mib / instances;
    for (const pid of group.pids()) {
      parts[roleOf(pid)] = (parts[roleOf(pid)] ?? 0) + pssKiB(pid) / 1024 / instances;
      parts.threads = (parts.threads ?? 0) + threadsOf(pid) / instances;
    }
  }
  await Promise.all(provider.live().map((handle) => provider.terminate(handle)));
  return { machineMiB, chargedMiB: charged / MiB / instances, startMs: median(starts), parts };
}

async function main(): Promise<void> {
  const instances = Number(process.argv[2] ?? 5);
  const rounds = Number(process.argv[3] ?? 3);
  const names = process.argv.slice(4).length ? process.argv.slice(4) : ["base", "max-lazy"];
  const check = await checkGvisor();
  if (!check.ok) throw new Error(check.reason);
  const dir = await mkdtemp(join(tmpdir(), "idle-ab-"));
  const providers = new Map<string, IsolatedProvider>();
  try {
    for (const [index, name] of names.entries()) {
      const variant = variants[name];
      if (!variant) throw new Error(`unknown variant ${name}: ${Object.keys(variants).join(", ")}`);
      const provider = await createGvisorProvider({
        hostKey: `idle-ab-${process.pid}-${index}`,
        warmInstances: 0,
        runsc: wrapper(dir, name, variant),
      });
      await provider.prepare([builtinImages.sandbox]);
      providers.set(name, provider);
    }
    const samples = new Map<string, Sample[]>(names.map((name) => [name, []]));
    for (let round = 0; round < rounds; round++) {
      const order = round % 2 ? [...names].reverse() : names;
      for (const name of order) {
        const sample = await idleRound(providers.get(name)!, instances, round);
        samples.get(name)!.push(sample);
        console.error(`round ${round} ${name}`, JSON.stringify(sample));
      }
    }
    const fixed = (value: number) => +value.toFixed(1);
    for (const [name, list] of samples) {
      const roles = [...new Set(list.flatMap((sample) => Object.keys(sample.parts)))];
      console.log(
        name,
        JSON.stringify({
          machineMiB: fixed(median(list.map((s) => s.machineMiB))),
          chargedMiB: fixed(median(list.map((s) => s.chargedMiB))),
          startMs: Math.round(median(list.map((s) => s.startMs))),
          ...Object.fromEntries(roles.map((role) => [role, fixed(median(list.map((s) => s.parts[role] ?? 0)))])),
        }),
      );
    }
  } finally {
    for (const provider of providers.values()) await provider.close();
  }
}

await main();
