// Placement values for contracts (which process answers an operation), and the parts of an
// API that placement and `reads` select: the owned operations and the storage-alone reads.
import type { OwnedOperations, Operation, Placement, ReadOperations } from "./types.ts";

/** Any actor answers. */
export const stateless = { kind: "stateless" } as const satisfies Placement;
/** The holder of the lease of the name in input field `key` answers. */
export const ownedByName = <K extends string>(key: K) => ({ kind: "byName", key }) as const satisfies Placement;
/** The host that launched the record named by input field `key` answers. */
export const ownedByHost = <K extends string>(key: K) => ({ kind: "byHost", key }) as const satisfies Placement;

/** True when `op` has an owner (placed by name or by host). */
export function isOwned(op: Operation): boolean {
  return op.placement.kind !== "stateless";
}

function pick<Api extends Record<string, Operation>>(api: Api, keep: (op: Operation) => boolean) {
  return Object.fromEntries(Object.entries(api).filter(([, op]) => keep(op)));
}

/** The operations of `api` that have owners: each owner serves them on its own subjects too. */
export function ownedOperations<Api extends Record<string, Operation>>(api: Api): OwnedOperations<Api> {
  return pick(api, isOwned) as OwnedOperations<Api>;
}

/** The operations of `api` that declare `reads`: storage alone answers them. */
export function readOperations<Api extends Record<string, Operation>>(api: Api): ReadOperations<Api> {
  return pick(api, (op) => op.reads !== undefined) as ReadOperations<Api>;
}

/**
 * The value of the input field that names an owned operation's owner (`placement.key`); its
 * schema's default when the input lacks it (`?name=` → `default`).
 */
export function ownerKey(op: Operation, input: Record<string, unknown>): string {
  if (op.placement.kind === "stateless") throw new TypeError(`${op.name} has no owner: it is stateless`);
  const key = op.placement.key;
  const value =
    input[key] ?? [op.params, op.query, op.payload].find((part) => part?.properties[key])?.properties[key]?.default;
  return String(value);
}
