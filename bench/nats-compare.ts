// `--nats-compare PATH`: the service's stacks started a second time with every nats-server of
// them running PATH (e.g. the previous release), and each workload that runs on those stacks
// measured again on them right after itself in every round, as `<workload> @v<version>`.
import { execFileSync } from "node:child_process";
import type { Environment } from "./environment.ts";
import { UsageError } from "./options.ts";
import type { ServiceGroup } from "./environment.ts";
import type { Workload } from "./workloads.ts";

/** The stacks the compared environment runs too: not the bare baseline, not the auth-off one. */
const compared = new Set<ServiceGroup>(["service", "always", "r3", "r3Always"]);

/** The environment on the other nats-server, and its version as the rows name it (`v2.10.27`). */
export interface ComparedServer {
  readonly label: string;
  readonly env: Environment;
}

/** `v2.10.27` from `PATH --version`; a usage error when PATH does not answer like nats-server. */
export function natsServerLabel(path: string): string {
  let output = "";
  try {
    output = execFileSync(path, ["--version"], { encoding: "utf8", timeout: 10_000 });
  } catch (err) {
    throw new UsageError(`--nats-compare ${path} does not run: ${(err as Error).message.split("\n")[0]}`);
  }
  const version = /nats-server: (v\d+\.\d+\.\d+)/.exec(output)?.[1];
  if (!version)
    throw new UsageError(`--nats-compare ${path} is not a nats-server (it answered "${output.trim().split("\n")[0]}")`);
  return version;
}

/** Each workload followed by its twin on the compared server, where it has one. */
export function withCompared(selected: readonly Workload[], label: string | undefined): Workload[] {
  if (!label) return [...selected];
  return selected.flatMap((workload) =>
    compared.has(workload.serviceGroup)
      ? [
          workload,
          {
            name: `${workload.name} @${label}`,
            summary: `${workload.summary}, every nats-server ${label}`,
            serviceGroup: workload.serviceGroup,
            onCompared: true,
            prepare: async (ctx) => {
              if (!ctx.compared) throw new Error("the --nats-compare stacks were not started");
              return workload.prepare(ctx.compared);
            },
          },
        ]
      : [workload],
  );
}
