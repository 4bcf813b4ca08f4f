// The job actor: jobs in the `jobs` KV bucket. Every create is a KV write, so other
// services observe new jobs with a KV watch (see the README).
import type { RecordStore } from "../platform/index.ts";
import type { Static } from "@sinclair/typebox";
import { v4 as uuidv4 } from "uuid";
import { JobNotFound, type Job, type jobApi } from "../schemas/index.ts";
import { createRecord, isObjectRecord, ownKey, readRecord } from "./records.ts";
import type { ApiHandlers } from "./serve.ts";

export type JobRecord = Static<typeof Job>;

export function jobHandlers(store: RecordStore): ApiHandlers<typeof jobApi> {
  return {
    async getJob({ jobId }, context) {
      const key = ownKey(context, jobId);
      // Items written by other services may lack fields (answered with the requested id and
      // ""), but one that is no JSON object at all is corrupt.
      const item =
        key === undefined ? undefined : await readRecord<Record<string, unknown>>(store, key, isObjectRecord);
      if (!item) throw JobNotFound.make({ id: jobId });
      const { id, content } = item;
      return {
        id: typeof id === "string" ? id : jobId,
        content: typeof content === "string" ? content : content == null ? "" : JSON.stringify(content),
      };
    },
    async createJob({ content }, context) {
      const job: JobRecord = { id: context.idempotencyKey ?? uuidv4(), content };
      const key = ownKey(context, job.id)!;
      const stored = await createRecord(store, key, job, isObjectRecord, (s) => s.content === content);
      return stored.value.id;
    },
  };
}
