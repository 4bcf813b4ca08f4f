// An object's activation as placement holds it, as the fence its storage writes carry: the token
// is the lease revision the activation holds once no renewal of it is in flight, and a refused
// write renews the lease (a renewal had moved it) or ends in `LeaseLost` (another took it over).
import type { Activation, Placement } from "../../placement/index.ts";
import type { ActivationFence, FencingToken } from "./storage.ts";

/**
 * The fence of `activation`, held by `placement` over the objects bucket (its lease key an
 * `objectKey`). The write a token is taken for must be sent in the same turn (storage does so):
 * a renewal asked for later then leaves after it, on the same connection.
 */
export function activationFence(placement: Placement, activation: Activation): ActivationFence {
  return {
    async token(): Promise<FencingToken> {
      const carried = await placement.carryingFence(activation, async (revision) => revision);
      // Lease writes kept coming: renew now, and carry the revision that renewal left.
      if (carried === "busy") await placement.fence(activation);
      return { leaseKey: activation.key, revision: carried === "busy" ? activation.revision : carried };
    },
    renew: () => placement.fence(activation),
  };
}
