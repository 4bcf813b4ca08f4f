// The proxy's own answers, one catalogue: each a stable `_tag`, its HTTP status and a JSON
// body. Reasons explain a 403 without echoing anything secret (never the token).
import type { TokenRejection, TokenVerdict } from "./token.ts";
import type { AllowedPort, MicrovmState } from "../../schemas/index.ts";

/** A proxy answer: status, JSON body and extra headers. */
export interface ProxyAnswer {
  readonly status: number;
  readonly body: { readonly _tag: string; readonly message: string; readonly [field: string]: unknown };
  readonly headers?: Record<string, string>;
}

/** Why the proxy could not reach the app. */
export type BadGatewayReason = "no-listener" | "timeout" | "connection-failed";

/** A token the proxy refused, as its verifier says (for a port outside it, with the token's ports). */
export type TokenRefusal = Extract<TokenVerdict, { ok: false }>;

/** The port a request asked for: `X-aws-proxy-port`, or 8080 when it sent none. */
export interface AskedPort {
  readonly port: number;
  readonly fromHeader: boolean;
}

/** What is wrong, by name of the header (or port) to fix: `request refused: <reason>: <this>`. */
const refusals: Record<TokenRejection, string> = {
  missing: "no X-aws-proxy-auth header: send the one CreateAuthToken returns (`taskctl microvm token ID` prints it)",
  malformed: "the X-aws-proxy-auth header is not a token: send the value CreateAuthToken returned, unchanged",
  forged: "the X-aws-proxy-auth token was not signed by this host: ask CreateAuthToken for one",
  expired: "the X-aws-proxy-auth token has expired: ask CreateAuthToken for a new one",
  "too-long-lived": "the X-aws-proxy-auth token lives longer than 60 minutes",
  "issued-in-future": "the X-aws-proxy-auth token was issued in the future (is this host's clock right?)",
  "expiry-before-issue": "the X-aws-proxy-auth token expires before it was issued",
  "wrong-instance": "the X-aws-proxy-auth token is for another instance: ask CreateAuthToken for this one's",
  revoked:
    "the X-aws-proxy-auth token was issued under an API key that has since been removed: " +
    "ask CreateAuthToken for one with a current key",
  "port-not-allowed":
    "the port X-aws-proxy-port asks for (8080 when absent) is not among the X-aws-proxy-auth token's allowed ports",
};

const portsText = (ports: readonly AllowedPort[]) =>
  ports
    .map((p) => ("port" in p ? String(p.port) : "range" in p ? `${p.range.startPort}-${p.range.endPort}` : "all"))
    .join(", ");

/**
 * The port refusal names the port asked for and the token's ports. Only a token that passed
 * every other check gets here, and its ports are readable in it: nothing is told that the
 * caller does not hold already.
 */
function portRefusal(allowedPorts: readonly AllowedPort[], asked: AskedPort): ProxyAnswer["body"] {
  const which = asked.fromHeader ? "X-aws-proxy-port asks for" : "the request asks for (no X-aws-proxy-port: 8080)";
  return {
    _tag: "MicrovmProxyForbidden",
    reason: "port-not-allowed",
    port: asked.port,
    allowedPorts,
    message:
      `request refused: port-not-allowed: port ${asked.port}, which ${which}, is not among the ` +
      `X-aws-proxy-auth token's allowed ports (${portsText(allowedPorts)}): send X-aws-proxy-port with ` +
      `one of those, or ask CreateAuthToken for a token that opens port ${asked.port}`,
  };
}

export const proxyAnswers = {
  /**
   * 403: missing, malformed, forged, expired, revoked, other-instance token or a port outside it
   * (named, with the token's).
   */
  forbidden: (refusal: TokenRefusal, asked?: AskedPort): ProxyAnswer => ({
    status: 403,
    body:
      refusal.reason === "port-not-allowed" && asked
        ? portRefusal(refusal.allowedPorts, asked)
        : {
            _tag: "MicrovmProxyForbidden",
            reason: refusal.reason,
            message: `request refused: ${refusal.reason}: ${refusals[refusal.reason]}`,
          },
  }),
  /** 400: `X-aws-proxy-port` is not a port number. */
  invalidPort: (): ProxyAnswer => ({
    status: 400,
    body: { _tag: "InvalidProxyPort", message: "X-aws-proxy-port must be an integer from 1 to 65535" },
  }),
  /** 409: suspended and autoResumeEnabled is false: ResumeMicrovm first. */
  suspended: (microvmId: string): ProxyAnswer => ({
    status: 409,
    body: { _tag: "MicrovmSuspended", microvmId, message: "the instance is suspended and auto-resume is disabled" },
  }),
  /** 503: still starting. */
  notReady: (microvmId: string, state: MicrovmState): ProxyAnswer => ({
    status: 503,
    body: { _tag: "MicrovmNotReady", microvmId, state, message: "the instance is not running yet" },
    headers: { "retry-after": "1" },
  }),
  /** 410: terminating, terminated or failed. */
  gone: (microvmId: string, state: MicrovmState): ProxyAnswer => ({
    status: 410,
    body: { _tag: "MicrovmGone", microvmId, state, message: "the instance is no longer running" },
  }),
  /** 503: auto-resume was attempted and failed. */
  resumeFailed: (microvmId: string): ProxyAnswer => ({
    status: 503,
    body: { _tag: "MicrovmResumeFailed", microvmId, message: "the instance could not be resumed" },
  }),
  /** 502: the app does not answer on the chosen port. */
  badGateway: (reason: BadGatewayReason): ProxyAnswer => ({
    status: 502,
    body: { _tag: "BadGateway", reason, message: `the instance's app did not answer (${reason})` },
  }),
} as const;
