// Task-object requests straight to the process holding the name's lease: one hop instead of
// two (shared subject → any actor → owner). The owner is read from the lease bucket once per
// name and forgotten as soon as it does not serve a request; the shared subject is the fallback.
import { headers as natsHeaders } from "@nats-io/transport-node";
import { LRUCache } from "lru-cache";
import { leaseOwner, onOwner } from "../actors/index.ts";
import type { NatsHandle, VersionedStore } from "../platform/index.ts";
import { ERROR_CODE_HEADER, ERROR_TAG_HEADER, nameToken, NotOwner, requestSubject, type Operation } from "../schemas/index.ts";
import type { ActorReply } from "./transport.ts";

export interface OwnerRouting {
  /**
   * Sends the request to the name's owner when one is known. Undefined when none is, or when
   * it did not serve the request (moved, gone or silent): then use the shared subject.
   */
  tryOwner(op: Operation, input: Record<string, unknown>, body: string, headers: Record<string, string>, timeoutMs: number): Promise<ActorReply | undefined>;
}

/** Operations placed by name (their subject names a task object). */
export const isPlaced = (op: Operation) => op.subject.startsWith("taskobjects.{name}.");

export function ownerRouting(nats: NatsHandle, leases: VersionedStore, prefix: string, maxNames = 100_000): OwnerRouting {
  const owners = new LRUCache<string, string>({ max: maxNames });
  const lookups = new Map<string, Promise<string | undefined>>();
  const ownerOps = new Map<string, Operation>();

  const ownerOf = (name: string): string | undefined | Promise<string | undefined> => {
    const known = owners.get(name);
    if (known) return known;
    let lookup = lookups.get(name);
    if (!lookup) {
      lookup = leases
        .get(nameToken(name))
        .then((entry) => {
          const owner = leaseOwner(entry.value);
          if (owner) owners.set(name, owner);
          return owner;
        })
        .catch(() => undefined) // no hint: the shared subject still works
        .finally(() => lookups.delete(name));
      lookups.set(name, lookup);
    }
    return lookup;
  };

  return {
    async tryOwner(op, input, body, headers, timeoutMs) {
      const name = String(input.name ?? "default");
      const owner = await ownerOf(name);
      if (!owner) return undefined;
      let opOnOwner = ownerOps.get(`${owner}\0${op.name}`);
      if (!opOnOwner) ownerOps.set(`${owner}\0${op.name}`, (opOnOwner = onOwner(op, owner)));
      const h = natsHeaders();
      for (const [k, v] of Object.entries(headers)) h.set(k, v);
      try {
        const msg = await nats.requester.request(requestSubject(opOnOwner, input, prefix), body, timeoutMs, h);
        const code = msg.headers?.get(ERROR_CODE_HEADER);
        if (msg.headers?.get(ERROR_TAG_HEADER) !== NotOwner.tag) return { status: code ? Number(code) : 200, data: msg.data };
      } catch {
        // No responders (the owner is gone), a timeout (paused) or a lost connection.
      }
      if (owners.get(name) === owner) owners.delete(name);
      return undefined;
    },
  };
}
