// Images in the microVM bench: registration (createImage: the host parses the module, starts
// it in a sandboxed instance, reads its methods, stores it) and the first launch of an image
// the host has not cached against a launch of the same image cached, in the same run. A host
// that never saw a push fetches the module from the object store; here its module file is
// removed from the host's cache directory first, which sends the host down that same path.
import { rm } from "node:fs/promises";
import { join } from "node:path";
import { hostWorkDir } from "../vm-runtime/service/config.ts";
import { connectMicrovm } from "../vm-runtime/index.ts";
import type { MicrovmEnvironment } from "./microvm-environment.ts";
import { percentiles, type Percentiles } from "./stats.ts";
import { launch, mintToken, terminate } from "./microvm-instances.ts";

/** The targets (#13). */
export const imageTargets = { registrationMs: 1_000, uncachedExtraMs: 100 };

export interface ImageResults {
  samples: number;
  /** createImage request → answer (the image is registered and runnable). */
  registration: Percentiles;
  /** RunMicrovm → RUNNING → token → first RPC, the module not in the host's cache. */
  uncachedFirstRpc: Percentiles;
  /** The same, the module cached (the same image launched again). */
  cachedFirstRpc: Percentiles;
  /** Per image, uncached minus cached: the median is what a first run on a host adds. */
  uncachedExtra: Percentiles;
}

const module = (stamp: string) =>
  `const defineImage = (d) => Object.freeze({ kind: "typed-service/microvm-image", methods: d.methods, ` +
  `fetch: () => new Response("no", { status: 404 }) });\n` +
  `export default defineImage({ methods: { greet: { handler: (name) => "hi, " + name } } });\n// ${stamp}\n`;

/** Launch → RUNNING → token → first `greet("x")`; the instance is terminated after. */
async function firstRpc(env: MicrovmEnvironment, imageIdentifier: string): Promise<number> {
  const started = performance.now();
  const launched = await launch(env.api, imageIdentifier);
  const stub = connectMicrovm<{ greet(name: string): Promise<string> }>({
    endpoint: launched.endpoint,
    authToken: await mintToken(env.api, launched.microvmId),
  });
  const answer = await stub.greet("x");
  const ms = performance.now() - started;
  await terminate(env.api, launched.microvmId);
  if (answer !== "hi, x") throw new Error(`greet answered ${JSON.stringify(answer)}`);
  return ms;
}

export async function measureImages(env: MicrovmEnvironment, samples: number): Promise<ImageResults> {
  const cacheDir = join(hostWorkDir(env.dataDir, env.hostId), "image-cache");
  const registration: number[] = [];
  const uncached: number[] = [];
  const cached: number[] = [];
  const stamp = `${process.pid}-${Date.now()}`;
  for (let i = 0; i < samples; i++) {
    const name = `bench-image-${i}`;
    const began = performance.now();
    const image = await env.api.createImage({ name, module: module(`${stamp}-${i}`) });
    registration.push(performance.now() - began);
    await rm(join(cacheDir, `${image.digest.slice("sha256:".length)}.mjs`));
    uncached.push(await firstRpc(env, name));
    cached.push(await firstRpc(env, name));
    await env.api.deleteImage({ name });
  }
  const extra = uncached.map((ms, i) => ms - cached[i]!);
  return {
    samples,
    registration: percentiles(registration),
    uncachedFirstRpc: percentiles(uncached),
    cachedFirstRpc: percentiles(cached),
    uncachedExtra: percentiles(extra),
  };
}

export function formatImages(results: ImageResults): string {
  const rows = [
    ["registration: createImage → registered", results.registration, `≤ ${imageTargets.registrationMs}`],
    ["first RPC, module not cached on the host", results.uncachedFirstRpc, ""],
    ["first RPC, module cached", results.cachedFirstRpc, ""],
    ["not cached − cached (same image, per pair)", results.uncachedExtra, `≤ ${imageTargets.uncachedExtraMs}`],
  ] as const;
  const lines = rows.map(([label, stats, target]) => {
    const met = target === "" ? "" : stats.p50 <= Number(target.slice(2)) ? "met" : "MISSED";
    return `| ${label} | ${stats.p50.toFixed(1)} | ${stats.p99.toFixed(1)} | ${target} ${met} |`;
  });
  return [`| images (${results.samples} samples) | p50 ms | p99 ms | target |`, "|---|---|---|---|", ...lines].join(
    "\n",
  );
}
