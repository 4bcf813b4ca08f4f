// Job API contracts.
import { Type } from "@sinclair/typebox";
import { JobNotFound } from "./errors.ts";
import { stateless } from "./placement.ts";
import type { Operation } from "./types.ts";

/** A job as answered; a stored item lacking `id` or `content` answers the requested id / "". */
export const Job = Type.Object({ id: Type.String(), content: Type.String() });

export const getJob = {
  name: "getJob",
  api: "job",
  http: { method: "GET", path: "/" },
  subject: "jobs.get",
  placement: stateless,
  /** Other services may write the jobs bucket too (the job actor reads what they stored). */
  reads: "mutable",
  query: Type.Object({ jobId: Type.String() }, { additionalProperties: false }),
  success: Job,
  errors: [JobNotFound],
  summary: "Read a job",
} as const satisfies Operation;

export const createJob = {
  name: "createJob",
  api: "job",
  http: { method: "POST", path: "/" },
  subject: "jobs.create",
  placement: stateless,
  payload: Type.Object({ content: Type.String() }, { additionalProperties: false }),
  success: Type.String({ description: "the new job id" }),
  errors: [],
  idempotent: true,
  summary: "Create a job; answers its id as a JSON string",
} as const satisfies Operation;

export const jobApi = { getJob, createJob } as const;
