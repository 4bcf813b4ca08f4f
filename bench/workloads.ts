// The workloads: the bare node:http baseline, each HTTP operation of both APIs (updates,
// deletes and lists in crud-workloads.ts), the direct-NATS create and get, and the no-hop
// anchor's. `prepare` seeds what a workload reads and returns its runner.
import { createTask, getTask, requestSubject } from "../schemas/index.ts";
import { crudWorkloads } from "./crud-workloads.ts";
import { listWorkloads } from "./list-workloads.ts";
import { runNatsLoad } from "./nats-load.ts";
import { cycle, http, httpFixed, type Runner } from "./runners.ts";
import type { AlwaysStack, ServiceGroup } from "./environment.ts";
import type { Workload, WorkloadContext } from "./workload.ts";

export type { Runner, Workload, WorkloadContext };

const taskBody = JSON.stringify({ title: "bench" });
const jobBody = JSON.stringify({ content: "bench" });

function alwaysStack(ctx: WorkloadContext): AlwaysStack {
  if (!ctx.always) throw new Error("the NATS_SYNC=always stack was not started");
  return ctx.always;
}

function r3Stack(ctx: WorkloadContext, sync: "1s" | "always"): AlwaysStack {
  if (!ctx.r3) throw new Error("the R3 stacks were not started");
  return ctx.r3[sync];
}

/** createTask and createJob named `<op><suffix>`, on the stack `stackOf` picks (described as `on`). */
function creates(
  suffix: string,
  serviceGroup: ServiceGroup,
  on: string,
  stackOf: (ctx: WorkloadContext) => AlwaysStack,
): Workload[] {
  const post = (body: string, url: (stack: AlwaysStack) => string) => async (ctx: WorkloadContext) =>
    httpFixed(url(stackOf(ctx)), { method: "POST", path: "/", body });
  return [
    {
      name: `createTask${suffix}`,
      summary: `POST / {title} on the Task API of ${on}`,
      serviceGroup,
      prepare: post(taskBody, (s) => s.taskUrl),
    },
    {
      name: `createJob${suffix}`,
      summary: `POST / {content} on the Job API of ${on}`,
      serviceGroup,
      prepare: post(jobBody, (s) => s.jobUrl),
    },
  ];
}

const r3On = (sync: "1s" | "always") => `the service on a 3-node cluster (R3 buckets) with NATS_SYNC=${sync}`;

export const baseline: Workload = {
  name: "bare node:http",
  summary: "GET / on a bare node:http server answering a fixed task JSON (the baseline)",
  serviceGroup: "bare",
  prepare: async (ctx) => httpFixed(ctx.bareUrl, { method: "GET", path: "/" }),
};

export const workloads: Workload[] = [
  {
    name: "createTask",
    summary: "POST / {title} on the Task API",
    serviceGroup: "service",
    prepare: async (ctx) => httpFixed(ctx.taskUrl, { method: "POST", path: "/", body: taskBody }),
  },
  {
    name: "getTask",
    summary: "GET /<id> over the seeded tasks",
    serviceGroup: "service",
    async prepare(ctx) {
      const next = cycle(await ctx.seeds.taskIds());
      return http(ctx.taskUrl, () => ({ method: "GET", path: `/${next()}` }));
    },
  },
  {
    name: "createTask:noauth",
    summary: "createTask on the same service with NATS auth off (compare with createTask)",
    serviceGroup: "noAuth",
    prepare: async (ctx) => httpFixed(ctx.noAuthTaskUrl, { method: "POST", path: "/", body: taskBody }),
  },
  {
    name: "getTask:noauth",
    summary: "getTask on the same service with NATS auth off (compare with getTask)",
    serviceGroup: "noAuth",
    async prepare(ctx) {
      const next = cycle(await ctx.noAuthSeeds.taskIds());
      return http(ctx.noAuthTaskUrl, () => ({ method: "GET", path: `/${next()}` }));
    },
  },
  {
    name: "createTask:traced",
    summary:
      "createTask on the same service with tracing on, every span exported over OTLP/HTTP (compare with createTask)",
    serviceGroup: "traced",
    prepare: async (ctx) => httpFixed(tracedOf(ctx).taskUrl, { method: "POST", path: "/", body: taskBody }),
  },
  {
    name: "getTask:traced",
    summary: "getTask on the same service with tracing on, every span exported over OTLP/HTTP (compare with getTask)",
    serviceGroup: "traced",
    async prepare(ctx) {
      const next = cycle(await ctx.tracedSeeds!.taskIds());
      return http(tracedOf(ctx).taskUrl, () => ({ method: "GET", path: `/${next()}` }));
    },
  },
  {
    name: "getTaskMissing",
    summary: "GET /<random uuid v4 never created>; 404 is the expected answer",
    serviceGroup: "service",
    prepare: async (ctx) => http(ctx.taskUrl, () => ({ method: "GET", path: `/${crypto.randomUUID()}` }), 404),
  },
  {
    name: "createTaskDO",
    summary: "POST /do?name=bench-<k> {title} over the task objects",
    serviceGroup: "service",
    async prepare(ctx) {
      const name = cycle(ctx.objectNames);
      return http(ctx.taskUrl, () => ({ method: "POST", path: `/do?name=${name()}`, body: taskBody }));
    },
  },
  {
    name: "createTaskDO:hot",
    summary: "POST /do?name=bench-hot {title}: every create on one task object (its owner's fences group)",
    serviceGroup: "service",
    prepare: async (ctx) => httpFixed(ctx.taskUrl, { method: "POST", path: "/do?name=bench-hot", body: taskBody }),
  },
  {
    name: "getTaskDO",
    summary: "GET /do/<id>?name=bench-<k> over the seeded task-object tasks",
    serviceGroup: "service",
    async prepare(ctx) {
      const next = cycle(await ctx.seeds.doTasks());
      return http(ctx.taskUrl, () => {
        const { name, id } = next();
        return { method: "GET", path: `/do/${id}?name=${name}` };
      });
    },
  },
  ...crudWorkloads,
  ...listWorkloads,
  {
    name: "createJob",
    summary: "POST / {content} on the Job API",
    serviceGroup: "service",
    prepare: async (ctx) => httpFixed(ctx.jobUrl, { method: "POST", path: "/", body: jobBody }),
  },
  ...creates(":always", "always", "the service whose nats-server has NATS_SYNC=always", alwaysStack),
  ...creates(":r3", "r3", r3On("1s"), (ctx) => r3Stack(ctx, "1s")),
  ...creates(":r3:always", "r3Always", r3On("always"), (ctx) => r3Stack(ctx, "always")),
  {
    name: "getJob",
    summary: "GET /?jobId=<id> over the seeded jobs",
    serviceGroup: "service",
    async prepare(ctx) {
      const next = cycle(await ctx.seeds.jobIds());
      return http(ctx.jobUrl, () => ({ method: "GET", path: `/?jobId=${next()}` }));
    },
  },
  {
    name: "nats:createTask",
    summary: "tasks.create straight over NATS from the bench process (no HTTP)",
    serviceGroup: "service",
    async prepare(ctx) {
      const subject = requestSubject(createTask, {});
      return (settings) => runNatsLoad(ctx.nc, { subject, next: () => taskBody }, settings);
    },
  },
  {
    name: "nats:getTask",
    summary: "tasks.get straight over NATS over the seeded tasks (no HTTP)",
    serviceGroup: "service",
    async prepare(ctx) {
      const subject = requestSubject(getTask, {});
      const next = cycle((await ctx.seeds.taskIds()).map((id) => JSON.stringify({ id })));
      return (settings) => runNatsLoad(ctx.nc, { subject, next }, settings);
    },
  },
  {
    name: "anchor:createTask",
    summary: "POST / {title} on the no-hop anchor: polka validating the title and kv.create (compare with createTask)",
    serviceGroup: "anchor",
    prepare: async (ctx) => httpFixed(anchorUrlOf(ctx), { method: "POST", path: "/", body: taskBody }),
  },
  {
    name: "anchor:getTask",
    summary: "GET /<id> on the no-hop anchor over its seeded tasks: kv.get, no cache (compare with getTask)",
    serviceGroup: "anchor",
    async prepare(ctx) {
      const url = anchorUrlOf(ctx);
      const next = cycle(await ctx.anchorSeeds!.taskIds());
      return http(url, () => ({ method: "GET", path: `/${next()}` }));
    },
  },
  {
    name: "anchor:getTaskMissing",
    summary: "GET /<random uuid v4> on the no-hop anchor; 404 is the expected answer (compare with getTaskMissing)",
    serviceGroup: "anchor",
    prepare: async (ctx) => http(anchorUrlOf(ctx), () => ({ method: "GET", path: `/${crypto.randomUUID()}` }), 404),
  },
];

function anchorUrlOf(ctx: WorkloadContext): string {
  if (!ctx.anchorUrl) throw new Error("the anchor: rows need the no-hop anchor (started when one of them runs)");
  return ctx.anchorUrl;
}

function tracedOf(ctx: WorkloadContext): NonNullable<WorkloadContext["traced"]> {
  if (!ctx.traced) throw new Error("the :traced rows need the traced stack (started when one of them runs)");
  return ctx.traced;
}
