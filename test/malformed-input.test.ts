// No input kills a process: a real service process (gateway, actors and a microVM host) gets
// malformed NATS payloads on every subject it serves and KV records of the wrong shape in
// every bucket, then must still be running and answer, a bad record failing only its own read:
// a corrupt task or job record is a bare 500, logged once per read without its content.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { headers as natsHeaders, type MsgHdrs } from "@nats-io/transport-node";
import { serveOperation } from "../actors/index.ts";
import { httpClient } from "../client/index.ts";
import { connectNats, provisionBuckets, type BatchPublisher, type NatsHandle } from "../platform/index.ts";
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
  await provisionBuckets(admin.nc);
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
    const kvm = await provisionBuckets(admin.nc);
    for (const [i, value] of bad.entries()) {
      await kvm.tasks.put(idKey(`bad-task-${i}`)!, value);
      await kvm.jobs.put(idKey(`bad-job-${i}`)!, value);
      await kvm.taskObjects.put(taskObjectKey("badname", `bad-${i}`)!, value);
      await kvm.taskObjects.put(nameToken(`bad-lease-${i}`), value);
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
      // Its own read fails (a bare 500, no stack) and nothing else does. Job records are read
      // leniently (fields may be missing or of another type) but must be JSON objects.
      assert.equal(await statusOf(tasks.getTask({ id: `bad-task-${i}` })), 500, `getTask of ${bad[i]}`);
      const jobStatus = bad[i]!.startsWith("{") ? 200 : 500;
      assert.equal(await statusOf(jobs.getJob({ jobId: `bad-job-${i}` })), jobStatus, `getJob of ${bad[i]}`);
      const taskDO = await statusOf(tasks.getTaskDO({ id: `bad-${i}`, name: "badname" }));
      assert.equal(taskDO, 500, `getTaskDO of ${bad[i]}`);
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

  it("malformed input - a corrupt task or job record is a bare 500, logged once per read without its content", {
    timeout: 60_000,
  }, async () => {
    const secret = "sk-live-CORRUPT-RECORD-MARKER";
    // Each could hold anything a writer put there, a secret included.
    const corrupt = [
      "null",
      "[]",
      `["${secret}"]`,
      `"${secret}"`,
      `not json ${secret}`,
      `{"id":"x","title":"${secret}","completed":"${secret}"}`,
      `{"id":"x","completed":false,"note":"${secret}"}`,
    ];
    const kvm = await provisionBuckets(admin.nc);
    const reads: { key: string; http: string; subject: string; body: string }[] = [];
    for (const [i, value] of corrupt.entries()) {
      const id = `corrupt-${i}`;
      await kvm.tasks.put(idKey(id)!, value);
      await kvm.taskObjects.put(taskObjectKey("corrupt", id)!, value);
      reads.push(
        { key: idKey(id)!, http: `${svc.taskUrl}/${id}`, subject: "tasks.get", body: JSON.stringify({ id }) },
        {
          key: taskObjectKey("corrupt", id)!,
          http: `${svc.taskUrl}/do/${id}?name=corrupt`,
          subject: `taskobjects.${nameToken("corrupt")}.get`,
          body: JSON.stringify({ id }),
        },
      );
      // Job records may lack fields or hold other types (the contract reads them leniently): only non-objects are
      // corrupt.
      if (!value.startsWith("{")) {
        await kvm.jobs.put(idKey(`corrupt-job-${i}`)!, value);
        const jobId = `corrupt-job-${i}`;
        reads.push({
          key: idKey(jobId)!,
          http: `${svc.jobUrl}/?jobId=${jobId}`,
          subject: "jobs.get",
          body: JSON.stringify({ jobId }),
        });
      }
    }
    for (const read of reads) {
      // Over HTTP (the gateway reads storage itself) and over NATS (the actors answer).
      const res = await fetch(read.http);
      assert.equal(res.status, 500, read.http);
      assert.deepEqual(
        await res.json(),
        {
          _tag: "InternalServerError",
          message: "internal error: the service's log has the cause (look for this response's X-Request-Id)",
        },
        read.http,
      );
      const msg = await admin.nc.request(read.subject, read.body, { timeout: 5_000 });
      assert.equal(msg.headers?.get("Nats-Service-Error-Code"), "500", read.subject);
      assert.deepEqual(
        msg.json(),
        {
          _tag: "InternalServerError",
          message: "internal error: the service's log has the cause (look for this response's X-Request-Id)",
        },
        read.subject,
      );
    }
    const linesOf = (key: string) =>
      svc.logs.filter(
        (line) => (line.err as { key?: string } | undefined)?.key === key && line.msg === "undeclared failure",
      );
    const deadline = Date.now() + 5_000;
    while (Date.now() < deadline && reads.some((read) => linesOf(read.key).length < 2)) await sleep(50);
    await sleep(200); // lines that should not be there have had their time too
    for (const read of reads) {
      const lines = linesOf(read.key);
      assert.equal(lines.length, 2, `one line per read of ${read.key}: ${JSON.stringify(lines)}`);
      assert.match(String((lines[0]!.err as { message?: unknown }).message), /^corrupt record in bucket \S+ at key /);
    }
    const leaked = svc.logs.filter((line) => JSON.stringify(line).includes(secret));
    assert.deepEqual(leaked, [], "no log line carries a corrupt record's content");
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
    // A publisher whose first send throws (as on a closing connection): the first request's
    // answer is lost (logged), and the subscription goes on serving the next.
    const publisher = {
      publish({ subject, data, headers }: { subject: string; data: string; headers?: MsgHdrs }) {
        if (sends++ < 1) throw new Error("connection closed");
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
