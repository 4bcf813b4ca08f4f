// `npm run bench:fsync`: what NATS_SYNC does on disk. For each mode, a private nats-server runs
// under `strace -f -ttt -y -e trace=fsync,fdatasync,write,pwrite64` while one client makes
// acknowledged KV creates (R1 file storage, one every 20 ms for 3 s); then each acknowledged
// write is matched with the writes to the stream's message blocks (`*.blk`: in the kernel's
// page cache, safe from a crash of nats-server) and the fsyncs (on disk, safe from power loss)
// around it. Needs strace (Debian: apt-get install strace).
import { execFileSync } from "node:child_process";
import { chmod, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Kvm } from "@nats-io/kv";
import { connect } from "@nats-io/transport-node";
import { natsServerPath, startNatsServer } from "../platform/index.ts";

const modes = process.argv.slice(2).length ? process.argv.slice(2) : ["1s", "always"];
const WRITES = 150;
const SPACING_MS = 20;

/** Wall-clock seconds with sub-millisecond resolution (strace's -ttt clock). */
const now = () => (performance.timeOrigin + performance.now()) / 1000;

interface Write {
  sent: number;
  acked: number;
}

async function trace(sync: string) {
  const dir = await mkdtemp(join(tmpdir(), `fsync-${sync}-`));
  try {
    const log = join(dir, "strace.log");
    const wrapper = join(dir, "nats-server");
    await writeFile(
      wrapper,
      `#!/bin/sh\nexec strace -f -ttt -y -e trace=fsync,fdatasync,write,pwrite64 -o ${JSON.stringify(log)} ` +
        `${JSON.stringify(natsServerPath())} "$@"\n`,
    );
    await chmod(wrapper, 0o755);
    const server = await startNatsServer({ storeDir: join(dir, "store"), binary: wrapper, sync });
    const nc = await connect({ servers: server.url });
    const kv = await new Kvm(nc).create("fsync-trace", { history: 1 });
    await new Promise((r) => setTimeout(r, 1_500)); // let the bucket's creation settle on disk
    const writes: Write[] = [];
    for (let i = 0; i < WRITES; i++) {
      const sent = now();
      await kv.create(`k${i}`, `value ${i}`);
      writes.push({ sent, acked: now() });
      await new Promise((r) => setTimeout(r, SPACING_MS));
    }
    await new Promise((r) => setTimeout(r, 2_500)); // the last interval's sync
    await nc.close();
    await server.stop();
    const lines = (await readFile(log, "utf8")).split("\n");
    const times = (pattern: RegExp) =>
      lines
        .filter((line) => pattern.test(line))
        .map((line) => Number(/^\d+\s+(\d+\.\d+)\s/.exec(line)?.[1]))
        .filter((t) => !Number.isNaN(t));
    const block = "\\(\\d+<[^>]*KV_fsync-trace/msgs/\\d+\\.blk>";
    const fsyncs = times(new RegExp(`\\sf(?:data)?sync${block}`));
    const blockWrites = times(new RegExp(`\\s(?:write|pwrite64)${block}`));
    const first = writes[0].sent;
    const last = writes.at(-1)!.acked;
    const during = fsyncs.filter((t) => t >= first && t <= last + 2.5);
    // Per acknowledged write: is an fsync between send and ack (on disk when acknowledged)?
    // Otherwise: how long after the ack until the next fsync (the write's exposure window).
    const synced = (w: Write) => fsyncs.some((t) => t >= w.sent && t <= w.acked);
    const beforeAck = writes.filter(synced).length;
    const cached = writes.filter((w) => blockWrites.some((t) => t >= w.sent && t <= w.acked)).length;
    const exposure = writes
      .filter((w) => !synced(w))
      .map((w) => (fsyncs.find((t) => t >= w.acked) ?? Infinity) - w.acked);
    const sorted = [...exposure].sort((a, b) => a - b);
    const ms = (s: number) => (Number.isFinite(s) ? `${Math.round(s * 1000)} ms` : "never");
    const window = sorted.length
      ? `median ${ms(sorted[sorted.length >> 1])}, max ${ms(sorted.at(-1)!)}`
      : "none (every write was on disk when acknowledged)";
    const latency = writes.map((w) => (w.acked - w.sent) * 1000).sort((a, b) => a - b);
    console.log(
      `NATS_SYNC=${sync}: ${WRITES} acknowledged creates over ${(last - first).toFixed(1)} s; ` +
        `${during.length} fsyncs of the block file meanwhile; ${cached}/${WRITES} writes had a write() to the ` +
        `stream's block file ` +
        `between send and ack, ${beforeAck}/${WRITES} an fsync; ` +
        `the others' ack -> next fsync: ${window}; ` +
        `create latency median ${latency[latency.length >> 1].toFixed(2)} ms`,
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

try {
  execFileSync("strace", ["-V"], { stdio: "ignore" });
} catch {
  console.error("error: strace is not installed (Debian: apt-get install strace)");
  process.exit(1);
}
console.log(`nats-server: ${execFileSync(natsServerPath(), ["--version"], { encoding: "utf8" }).trim()}`);
for (const mode of modes) await trace(mode);
