// Which NATS role serves each API's operations, and whether its callers' principal travels with
// the request: the one source of the roles' NATS permissions, the subjects the gateway sends
// on and the operations each serving role answers.
import { jobApi } from "./jobs.ts";
import { microvmApi } from "./microvms.ts";
import { serviceNames } from "./subjects.ts";
import { taskApi } from "./tasks.ts";
import type { ApiName, Operation } from "./types.ts";

/** A NATS role whose processes serve operations (one NATS micro service each). */
export type ServingRole = keyof typeof serviceNames;

/**
 * Per HTTP API: the role that serves its operations, and whether the gateway sends the HTTP
 * caller's principal. With a principal, the gateway requests the gateway-only copy of each
 * subject (`viaGateway`), which no other user may publish, so the header can be believed.
 */
export const apiServices = {
  task: { role: "actors", principal: true },
  job: { role: "actors", principal: true },
  microvm: { role: "microvms", principal: true },
} as const satisfies Record<ApiName, { readonly role: ServingRole; readonly principal: boolean }>;

/** Every declared operation, of every API. */
export const allOperations: readonly Operation[] = [
  ...Object.values(taskApi),
  ...Object.values(jobApi),
  ...Object.values(microvmApi),
];

/** The role whose processes answer `op`. */
export const servingRole = (op: Operation): ServingRole => apiServices[op.api].role;

/** True when the gateway sends `op` on its gateway-only copy, with the caller's principal. */
export const sendsPrincipal = (op: Operation): boolean => apiServices[op.api].principal;
