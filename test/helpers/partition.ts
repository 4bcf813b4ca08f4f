// Network partitions of a loopback NATS cluster with iptables. Each node runs in a cgroup v2
// group of its own (a wrapper joins it, then execs nats-server), so the packets a node sends
// can be told apart although every node is on 127.0.0.1. Cutting a node marks each route
// connection it sends on, and each one to its route port, and drops every packet of a marked
// connection, both ways. Every rule carries this run's comment; `heal` removes those only.
import { execFileSync } from "node:child_process";
import { chmodSync, mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { natsServerPath } from "../../platform/index.ts";
import { rmdirOnceEmpty } from "./cgroup-dirs.ts";

export interface Partitions {
  /** Runs each node in its own cgroup (pass to `startCluster` as `natsBinary`). */
  readonly binary: string;
  /** Cuts the routes between node `name` (route port `routePort`) and every other node. */
  cut(name: string, routePort: number, allRoutePorts: readonly number[]): void;
  /** Removes every rule this run added. */
  heal(): void;
  /** Heals and removes the cgroups once their processes are gone; rejects if one stays past a bound. */
  close(): Promise<void>;
}

const iptables = (args: string[]) => execFileSync("iptables", ["-w", ...args], { stdio: ["ignore", "ignore", "pipe"] });

/** The cgroup v2 mount point (`/sys/fs/cgroup` or, on hybrid systems, `/sys/fs/cgroup/unified`). */
function cgroup2Root(): string | undefined {
  const mounts = readFileSync("/proc/self/mounts", "utf8").split("\n");
  return mounts.map((line) => line.split(" ")).find((fields) => fields[2] === "cgroup2")?.[1];
}

/** Removes this run's rules (those whose comment is `tag`) from the OUTPUT chain. */
function removeRules(tag: string): void {
  const rules = execFileSync("iptables", ["-w", "-S", "OUTPUT"], { encoding: "utf8" }).split("\n");
  for (const rule of rules.filter((r) => r.startsWith("-A OUTPUT ") && r.includes(`--comment ${tag} `))) {
    // `-S` prints a rule as the arguments that added it: delete by the same arguments.
    iptables(["-D", ...splitRule(rule).slice(1)]);
  }
}

function splitRule(rule: string): string[] {
  return [...rule.matchAll(/"([^"]*)"|(\S+)/g)].map((m) => m[1] ?? m[2]!);
}

/**
 * Partitions for one test run in `dir`, or the reason they cannot run here (not root, no
 * iptables, no cgroup v2, no cgroup or connmark match in the kernel).
 */
export function partitions(dir: string): Partitions | string {
  if (process.getuid?.() !== 0) return "needs root for iptables";
  const root = cgroup2Root();
  if (!root) return "needs a cgroup v2 mount";
  const group = `typed-service-partition-${process.pid}`;
  const tag = group;
  try {
    mkdirSync(join(root, group), { recursive: true });
  } catch (err) {
    return `cannot create a cgroup under ${root}: ${(err as Error).message}`;
  }
  const probe = [
    "OUTPUT",
    "-p",
    "tcp",
    "--dport",
    "1",
    "-m",
    "cgroup",
    "--path",
    group,
    "-m",
    "connmark",
    "--mark",
    "0x1",
    "-m",
    "comment",
    "--comment",
    tag,
    "-j",
    "DROP",
  ];
  try {
    iptables(["-I", ...probe]);
    iptables(["-D", ...probe]);
  } catch (err) {
    rmdirSync(join(root, group));
    return (
      `iptables cannot match by cgroup and connmark here: ` +
      `${String((err as { stderr?: Buffer }).stderr ?? err).trim()}`
    );
  }
  let nodeBinary: string;
  try {
    nodeBinary = natsServerPath();
  } catch (err) {
    rmdirSync(join(root, group));
    return (err as Error).message;
  }
  // nats-server is started as `<binary> -c <storeDir>/nats-server.conf`; storeDir ends in the node's name.
  const binary = join(dir, "nats-server-in-cgroup");
  writeFileSync(
    binary,
    [
      "#!/bin/sh",
      'node=$(basename "$(dirname "$2")")',
      `cg=${JSON.stringify(join(root, group))}/"$node"`,
      'mkdir -p "$cg" && echo $$ > "$cg/cgroup.procs" || { echo "cannot join cgroup $cg" >&2; exit 1; }',
      `exec ${JSON.stringify(nodeBinary)} "$@"`,
      "",
    ].join("\n"),
  );
  chmodSync(binary, 0o755);
  // A fresh connection mark per cut: connections marked by an earlier cut keep their mark.
  let mark = 0x7e57_0000;
  const heal = () => removeRules(tag);
  const exitHandler = () => heal();
  // Killed by a signal (a runner's timeout, Ctrl-C): remove the rules, then die of the signal.
  const signalHandler = (signal: NodeJS.Signals) => {
    heal();
    process.off("SIGINT", signalHandler).off("SIGTERM", signalHandler);
    process.kill(process.pid, signal);
  };
  process.once("exit", exitHandler).once("SIGINT", signalHandler).once("SIGTERM", signalHandler);
  return {
    binary,
    cut(name, routePort, allRoutePorts) {
      mark++;
      const rule = (...args: string[]) =>
        iptables(["-A", "OUTPUT", "-p", "tcp", ...args, "-m", "comment", "--comment", tag]);
      const setMark = ["-j", "CONNMARK", "--set-mark", `0x${mark.toString(16)}`];
      // Route connections the node sends on (it listens on one route port, dials the others).
      rule(
        "-m",
        "multiport",
        "--ports",
        allRoutePorts.join(","),
        "-m",
        "cgroup",
        "--path",
        `${group}/${name}`,
        ...setMark,
      );
      // Connections to its route port, from any peer.
      rule("--dport", String(routePort), ...setMark);
      rule("-m", "connmark", "--mark", `0x${mark.toString(16)}`, "-j", "DROP");
    },
    heal,
    async close() {
      heal();
      process.off("exit", exitHandler).off("SIGINT", signalHandler).off("SIGTERM", signalHandler);
      // Called once the nodes are stopped: a node's group still busy past the bound fails the test.
      for (const entry of readdirSync(join(root, group), { withFileTypes: true })) {
        if (entry.isDirectory()) await rmdirOnceEmpty(join(root, group, entry.name));
      }
      await rmdirOnceEmpty(join(root, group));
    },
  };
}

/** The node (by client port) the process `pid` is connected to now, from `ss`. */
export function connectedPort(pid: number, clientPorts: readonly number[]): number | undefined {
  const lines = execFileSync("ss", ["-tnpH", "state", "established"], { encoding: "utf8" }).split("\n");
  for (const line of lines) {
    if (!line.includes(`pid=${pid},`)) continue;
    const peer = Number(line.trim().split(/\s+/)[3]?.split(":").pop());
    if (clientPorts.includes(peer)) return peer;
  }
  return undefined;
}
