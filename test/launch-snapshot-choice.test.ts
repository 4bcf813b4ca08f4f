// Which path a start takes when its image has a launch snapshot and a wall booted ahead is up:
// the wall for an image whose starts on one are quick, the snapshot for one whose import is slow.
import assert from "node:assert/strict";
import { test } from "node:test";
import { launchSnapshots, type LaunchSnapshotDeps } from "../vm-runtime/host/launch-snapshots.ts";

/** Walls that never boot: a snapshot this host would take fails (and is logged), which the choice does not need. */
function noWalls(logged: string[]): LaunchSnapshotDeps {
  const none = () => Promise.reject(new Error("no walls in this test"));
  return {
    boot: none,
    assign: none,
    answering: none,
    forceStop: none,
    workDir: none,
    startTimeoutMs: 1_000,
    log: (message: string) => logged.push(message),
  } as unknown as LaunchSnapshotDeps;
}

test("launch snapshots - a start that finds a wall up takes it for a quick image, the snapshot for a slow one", async () => {
  const logged: string[] = [];
  const launches = launchSnapshots(noWalls(logged), { minColdMs: 1_000 });
  const module = Buffer.from("export default 1");
  assert.equal(launches.wallFirst("unknown"), true, "an image never started: the wall");
  // Quick on a wall, though its first start (and one beside a snapshot being taken) was slow.
  launches.noteCold("quick", module, 256, 1_262, true);
  launches.noteCold("quick", module, 256, 133, true);
  launches.noteCold("quick", module, 256, 951, true);
  assert.equal(launches.wallFirst("quick"), true);
  // Slow even on a wall: its import is the cost a snapshot saves.
  launches.noteCold("slow", module, 256, 3_100, true);
  assert.equal(launches.wallFirst("slow"), true, "one start says little: a first start pays for more");
  launches.noteCold("slow", module, 256, 2_900, true);
  assert.equal(launches.wallFirst("slow"), false);
  // Starts that booted a wall of their own say nothing of the path on a wall booted ahead.
  launches.noteCold("cold", module, 256, 1_400);
  assert.equal(launches.wallFirst("cold"), true);
  await launches.close();
});
