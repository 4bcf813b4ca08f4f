// No input kills a process: a real service process (gateway, actors and a microVM host) gets
// malformed NATS payloads on every subject it serves and KV records of the wrong shape in
// every bucket, then must still be running and answer, a bad record failing only its own read.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { headers as natsHeaders, type MsgHdrs } from "@nats-io/transport-node";
import { serveOperation } from "../actors/index.ts";
import { httpClient } from "../client/index.ts";
import { connectNats, openBuckets, type BatchPublisher, type NatsHandle } from "../platform/index.ts";
import {
  getTask,
  idKey,
  imageApi,
  jobApi,
  microvmApi,
  nameToken,
  requestSubject,
  taskApi,
  taskObjectKey,
  viaGateway,
  type Operation,
} from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { testNats, type TestNats } from "./helpers/nats.ts";
import { startServiceProcess, type ServiceProcess } from "./helpers/process.ts";

const defer = lifo(after);
const hostId = "malformed-host";
let nats: TestNats;
let admin: NatsHandle;
let svc: ServiceProcess;

before(async () => {
  nats = await testNats(defer);
  admin = await connectNats({ ...nats.login("admin"), name: "test:malformed" });
  defer(() => admin.close());
  await openBuckets(admin.nc);
  const dataDir = await mkdtemp(join(tmpdir(), "malformed-input-"));
  defer(() => rm(dataDir, { recursive: true, force: true }));
  svc = await startServiceProcess({
    ...nats.env(),
    DATA_DIR: dataDir,
    MICROVM_HOST_ID: hostId,
    MICROVM_PROVIDER: "process",
    LOG_FORMAT: "json",
  });
  defer(() => svc.stop());
});

/** Bodies no client of the contract sends. */
const payloads: (string | Uint8Array)[] = [
  "",
  "not json",
  "null",
  "[]",
  '"a string"',
  "12345678901234567890",
  '{"__proto__":{"polluted":true},"constructor":{"prototype":{"x":1}}}',
  '{"id":{"nested":[1,2,3]},"title":[],"content":{},"jobId":null,"name":7,"microvmIdentifier":{}}',
  `${"[".repeat(20_000)}${"]".repeat(20_000)}`,
  new Uint8Array([0xff, 0xfe, 0x00, 0xc3, 0x28, 0xa0, 0xa1]),
  `{"title":"${"x".repeat(200_000)}"}`,
];

/** Headers no client of the contract sends. */
function oddHeaders() {
  const h = natsHeaders();
  h.set("Idempotency-Key", "not-a-uuid");
  h.set("Microvm-Principal", "x".repeat(5_000));
  h.set("traceparent", "00-zz-yy-01");
  h.set("X-Request-Id", "\u0001");
  h.set("Task-Object-Budget-Ms", "-1e309");
  h.set("Task-Object-Forwarded", "garbage");
  return h;
}

/** Every subject the service serves, each with made-up values in its `{field}` tokens. */
function servedSubjects(): string[] {
  const ops = [
    ...Object.values(taskApi),
    ...Object.values(jobApi),
    ...Object.values(microvmApi),
    ...Object.values(imageApi),
  ];
  const fields = { id: "x", name: "bad", microvmIdentifier: "x", jobId: "x" };
  const subjects = ops.flatMap((op: Operation) => {
    const plain = requestSubject(op, fields);
    const gateway = op.api === "microvm" ? [requestSubject(viaGateway(op), fields)] : [];
    return [plain, ...gateway];
  });
  // Owners' and hosts' own subjects, and discovery.
  return [
    ...new Set([
      ...subjects,
      ...subjects
        .filter((s) => s.startsWith("microvms."))
        .map((s) => s.replace(/^microvms\.(gateway\.)?/, `microvms.host.${hostId}.`)),
      "taskobjects.owner.x.bad.get",
      "taskobjects.owner.x.bad.create",
      "$SRV.PING",
      "$SRV.INFO.actors",
      "$SRV.STATS.microvms",
    ]),
  ];
}

describe("malformed input - the process keeps serving", () => {
  it("malformed input - payloads of the wrong shape on every served subject", { timeout: 120_000 }, async () => {
    const subjects = servedSubjects();
    assert.ok(subjects.length >= 20, `${subjects.length} subjects`);
    const answers: Promise<unknown>[] = [];
    for (const subject of subjects) {
      for (const payload of payloads) {
        admin.nc.publish(subject, payload); // no reply subject
        admin.nc.publish(subject, payload, { headers: oddHeaders() });
        answers.push(
          admin.nc.request(subject, payload, { timeout: 5_000, headers: oddHeaders() }).catch(() => undefined),
        );
      }
    }
    await Promise.all(answers);
    await admin.nc.flush();
    await assertServing();
  });

  it("malformed input - KV records of the wrong shape fail only their own reads", { timeout: 120_000 }, async () => {
    const bad = ["not json", "null", "[]", '{"id":5}', '{"microvmId":{},"state":7}', "\u0000\u00ff"];
    const kvm = await openBuckets(admin.nc);
    for (const [i, value] of bad.entries()) {
      await kvm.tasks.put(idKey(`bad-task-${i}`)!, value);
      await kvm.jobs.put(idKey(`bad-job-${i}`)!, value);
      await kvm.taskObjects.put(taskObjectKey("badname", `bad-${i}`)!, value);
      await kvm.taskObjectLeases.put(nameToken(`bad-lease-${i}`), value);
      await kvm.microvms.put(idKey(`bad-vm-${i}`)!, value);
      await kvm.images.put(`${nameToken("anonymous")}.latest.bad${i}`, value);
    }
    const tasks = httpClient(taskApi, svc.taskUrl);
    const jobs = httpClient(jobApi, svc.jobUrl);
    const vms = httpClient(microvmApi, svc.microvmUrl);
    const images = httpClient(imageApi, svc.microvmUrl);
    const statusOf = (p: Promise<unknown>) =>
      p.then(
        () => 200,
        (err: { status?: number }) => err.status ?? -1,
      );
    for (let i = 0; i < bad.length; i++) {
      // Its own read fails (a JSON error answer, no stack) or finds nothing; nothing else does.
      const task = await statusOf(tasks.getTask({ id: `bad-task-${i}` }));
      assert.ok([200, 404, 500].includes(task), `getTask of ${bad[i]}: ${task}`);
      const job = await statusOf(jobs.getJob({ jobId: `bad-job-${i}` }));
      assert.ok([200, 404, 500].includes(job), `getJob of ${bad[i]}: ${job}`);
      const taskDO = await statusOf(tasks.getTaskDO({ id: `bad-${i}`, name: "badname" }));
      assert.ok([200, 404, 500].includes(taskDO), `getTaskDO of ${bad[i]}: ${taskDO}`);
      assert.equal(
        await statusOf(tasks.createTaskDO({ title: "beside a bad lease", name: `bad-lease-${i}` })),
        200,
        "a name whose lease is garbage",
      );
      assert.equal(await statusOf(vms.getMicrovm({ microvmIdentifier: `bad-vm-${i}` })), 404, "getMicrovm");
      assert.equal(await statusOf(images.getImage({ name: `bad${i}` })), 404, "getImage");
    }
    assert.equal(await statusOf(vms.listMicrovms({})), 200, "listMicrovms skips bad records");
    assert.equal(await statusOf(images.listImages({})), 200, "listImages skips bad records");
    await assertServing();
  });
});

/** The process runs and every API answers a well-formed request. */
async function assertServing(): Promise<void> {
  assert.equal(svc.child.exitCode, null, "the process is running");
  assert.equal(svc.child.signalCode, null);
  const tasks = httpClient(taskApi, svc.taskUrl);
  const created = await tasks.createTask({ title: "still answering" });
  assert.equal((await tasks.getTask({ id: created.id })).title, "still answering");
  assert.equal(typeof (await httpClient(jobApi, svc.jobUrl).createJob({ content: "still answering" })), "string");
  const vms = httpClient(microvmApi, svc.microvmUrl);
  const vm = await vms.runMicrovm({
    idlePolicy: { maxIdleDurationSeconds: 60, suspendedDurationSeconds: 60, autoResumeEnabled: false },
  });
  await vms.terminateMicrovm({ microvmIdentifier: vm.microvmId });
  assert.ok(Array.isArray((await httpClient(imageApi, svc.microvmUrl).listImages({})).items));
}

describe("serve adapter - an answer that cannot be sent", () => {
  it("serve adapter - a reply whose send throws fails only that message", async () => {
    let sends = 0;
    // A publisher whose first two sends throw (as on a closing connection): the answer, then the
    // error answer the adapter sends for it, which no try around the handler catches any more.
    const publisher = {
      publish({ subject, data, headers }: { subject: string; data: string; headers?: MsgHdrs }) {
        if (sends++ < 2) throw new Error("connection closed");
        admin.nc.publish(subject, data, { headers });
      },
    } as unknown as BatchPublisher;
    const sub = serveOperation(admin.nc, getTask, async ({ id }) => ({ id, title: "t", completed: false }), {
      prefix: "throwing-reply",
      queue: "q",
      publisher,
    });
    defer(() => sub.unsubscribe());
    await admin.nc.flush();
    const subject = requestSubject(getTask, { id: "a" }, "throwing-reply");
    await assert.rejects(admin.nc.request(subject, '{"id":"a"}', { timeout: 1_000 }), "the first answer was lost");
    const answer = await admin.nc.request(subject, '{"id":"b"}', { timeout: 5_000 });
    assert.deepEqual(answer.json(), { id: "b", title: "t", completed: false });
  });
});
