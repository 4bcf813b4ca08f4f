// NATS micro discovery: each serving role of a process (actors, microvms) is an instance of a NATS
// service and answers `$SRV.PING|INFO|STATS[.<name>[.<id>]]` with the `io.nats.micro.v1` documents,
// so `nats micro ls|info|stats` list every operation with its subject, schemas and counts.
import { hostname } from "node:os";
import { nuid, type Msg, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import { inputSchema, SERVICE_API_PREFIX, subscriptionSubject, withPrefix, type Operation } from "../schemas/index.ts";
import { log, packageVersion } from "../platform/index.ts";

const VERBS = ["PING", "INFO", "STATS"] as const;
type Verb = (typeof VERBS)[number];

export interface ServiceConfig {
  /** `[-\w]+`: the `<name>` of the control subjects. */
  readonly name: string;
  readonly description: string;
  /** Semantic version (default: the package's). */
  readonly version?: string;
  /** Strings shown by PING, INFO and STATS (host, pid, subject prefix, owner id...). */
  readonly metadata?: Readonly<Record<string, string>>;
}

/** One endpoint of INFO: an operation on one subscription subject. */
export interface EndpointInfo {
  readonly name: string;
  readonly subject: string;
  readonly queue_group: string;
  readonly metadata: Readonly<Record<string, string>>;
}

/** An endpoint's counters as STATS reports them; times in nanoseconds. */
export class EndpointStats {
  num_requests = 0;
  num_errors = 0;
  processing_time = 0;
  last_error = "";

  constructor(readonly info: EndpointInfo) {}

  /** One answered request; `error` (`<status>:<_tag>`) when its reply was an error. */
  record(seconds: number, error?: string): void {
    this.num_requests++;
    this.processing_time += Math.round(seconds * 1e9);
    if (error === undefined) return;
    this.num_errors++;
    this.last_error = error;
  }

  toJSON() {
    const { name, subject, queue_group } = this.info;
    const { num_requests, num_errors, processing_time, last_error } = this;
    const average_processing_time = num_requests === 0 ? 0 : Math.round(processing_time / num_requests);
    return {
      name,
      subject,
      queue_group,
      num_requests,
      num_errors,
      last_error,
      processing_time,
      average_processing_time,
    };
  }
}

/** A registered service instance: answers the control subjects until `close()`. */
export class MicroService {
  readonly id = nuid.next();
  readonly started = new Date().toISOString();
  readonly name: string;
  readonly #config: Required<ServiceConfig>;
  readonly #endpoints: EndpointStats[] = [];
  readonly #subscriptions: Subscription[];

  constructor(nc: NatsConnection, config: ServiceConfig) {
    if (!/^[-\w]+$/.test(config.name)) throw new Error(`invalid service name "${config.name}"`);
    this.name = config.name;
    this.#config = { version: serviceVersion(), metadata: {}, ...config };
    this.#subscriptions = VERBS.flatMap((verb) =>
      controlSubjects(verb, this.name, this.id).map((subject) =>
        nc.subscribe(subject, {
          callback: (err, msg) =>
            err ? log.warn({ err, subject }, "service control subscription failed") : this.#answer(verb, msg),
        }),
      ),
    );
  }

  /** Lists `op` (served on `subject` in `queue`) and returns the counters its adapter updates. */
  addEndpoint(op: Operation, options: { name?: string; prefix: string; queue: string }): EndpointStats {
    const stats = new EndpointStats({
      name: options.name ?? op.name,
      subject: subscriptionSubject(op, options.prefix),
      queue_group: options.queue,
      metadata: endpointMetadata(op, options.prefix),
    });
    this.#endpoints.push(stats);
    return stats;
  }

  ping() {
    const { version, metadata } = this.#config;
    return { type: "io.nats.micro.v1.ping_response", name: this.name, id: this.id, version, metadata };
  }

  info() {
    const endpoints = this.#endpoints.map((e) => e.info);
    return { ...this.ping(), type: "io.nats.micro.v1.info_response", description: this.#config.description, endpoints };
  }

  stats() {
    const endpoints = this.#endpoints.map((e) => e.toJSON());
    return { ...this.ping(), type: "io.nats.micro.v1.stats_response", started: this.started, endpoints };
  }

  /** Stops answering discovery requests (lets those received finish). */
  async close(): Promise<void> {
    await Promise.allSettled(this.#subscriptions.map((s) => s.drain()));
  }

  #answer(verb: Verb, msg: Msg): void {
    const body = verb === "PING" ? this.ping() : verb === "INFO" ? this.info() : this.stats();
    msg.respond(JSON.stringify(body));
  }
}

/** `$SRV.<verb>`, `$SRV.<verb>.<name>`, `$SRV.<verb>.<name>.<id>`: all services, this kind, this instance. */
export function controlSubjects(verb: Verb, name: string, id: string): string[] {
  const all = `${SERVICE_API_PREFIX}.${verb}`;
  return [all, `${all}.${name}`, `${all}.${name}.${id}`];
}

/**
 * What INFO says of an operation, all strings as micro metadata must be: the JSON Schemas of its
 * request and success reply, its declared errors, its HTTP route, and its subject with the
 * `{field}` tokens (base64url, no padding) where the subscription has `*`.
 */
export function endpointMetadata(op: Operation, prefix: string): Record<string, string> {
  const metadata: Record<string, string> = {
    operation: op.name,
    request_schema: JSON.stringify(inputSchema(op)),
    response_schema: JSON.stringify(op.success),
    errors: JSON.stringify(op.errors.map((e) => ({ _tag: e.tag, status: e.status }))),
    http: `${op.http.method} ${op.http.path}`,
    http_api: op.api,
  };
  if (op.subject.includes("{")) metadata.subject_template = withPrefix(prefix, op.subject);
  return metadata;
}

/** Metadata every service of this process carries. */
export function processMetadata(prefix: string, extra: Record<string, string> = {}): Record<string, string> {
  return { host: hostname(), pid: String(process.pid), subject_prefix: prefix, ...extra };
}

let version: string | undefined;
function serviceVersion(): string {
  return (version ??= packageVersion().split(" ").pop()!);
}
