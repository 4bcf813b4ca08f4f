// Public entry of placement: which process runs an owned operation's request, both sides of the
// owner protocol. The owner side: leases and activations (leases.ts), the strategies that run a
// request where its key lives (owners.ts; the microVM host's by-host strategy implements the
// same `OwnerStrategy`). The caller side: `dispatch`, straight to the owner when known, hedged
// when it is silent (caller.ts). One sender carries every request (send.ts).
export type { HandlerContext, OwnedKind, OwnedKindsOf, OwnerStates, OwnerStrategies, OwnerStrategy } from "./types.ts";
export { BUDGET_HEADER, FORWARDED_HEADER, SUSPECT_HEADER } from "./headers.ts";
export {
  natsSender,
  noAnswer,
  nobodyThere,
  send,
  answerOf,
  type Requests,
  type Sender,
  type SendOptions,
} from "./send.ts";
export {
  Placement,
  LeaseLost,
  leaseOwner,
  parseLease,
  type Activation,
  type ActivationEvent,
  type PlacementMetrics,
  type PlacementOptions,
} from "./leases.ts";
export { Mailboxes } from "./mailbox.ts";
export { leasedOwners, type LeasedOwnersOptions } from "./owners.ts";
export { ownerRouting, type OwnerLookup, type OwnerRouting, type RoutingPolicy } from "./caller.ts";
export { dispatcher, withInProcess, type Budget, type Dispatch, type InProcessRoute } from "./dispatch.ts";
