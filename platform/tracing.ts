// Traces: a W3C `traceparent` on an HTTP request is continued (or a trace started), carried in
// NATS headers to the actor, the owner hop and the microVM host, with spans for the gateway
// request, each NATS request, each handler, each KV operation and lease. Exported over OTLP/HTTP
// with the OpenTelemetry SDK when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is
// set; off otherwise, and then nothing here does more than test a boolean (the SDK is not loaded).
// Which traces are kept is the SDK's sampler, from `OTEL_TRACES_SAMPLER` / `..._SAMPLER_ARG`.
// Only a request received starts a trace (a SERVER span); every other span is a child of one
// being recorded: background work (lease renewals, idle releases) is not traced, and an
// unsampled request costs one span per process it enters, not one per step.
import {
  context,
  diag,
  DiagLogLevel,
  propagation,
  SpanKind,
  SpanStatusCode,
  trace,
  type Attributes,
  type DiagLogFunction,
  type Span,
  type TextMapGetter,
  type TextMapSetter,
  type Tracer,
} from "@opentelemetry/api";
import { log } from "./log.ts";

export { SpanKind };

/** The tracer while tracing is on. */
let tracer: Tracer | undefined;

/** True while spans are recorded and exported. */
export const tracingOn = (): boolean => tracer !== undefined;

/** Headers a trace context is read from: HTTP's (lower-case names) or NATS's. */
export type TraceCarrier =
  | Readonly<Record<string, string | string[] | undefined>>
  | { get(name: string): string | undefined | null };

const getter: TextMapGetter<TraceCarrier> = {
  keys: (carrier) => (typeof carrier.get === "function" ? [] : Object.keys(carrier)),
  get(carrier, key) {
    if (typeof carrier.get === "function")
      return (carrier as { get(n: string): string | undefined | null }).get(key) ?? undefined;
    return (carrier as Record<string, string | string[] | undefined>)[key];
  },
};

/**
 * Starts exporting when the environment names an OTLP endpoint (the SDK reads the standard
 * `OTEL_*` variables from the process's environment: the exporter's, the sampler's, the span
 * limits; `OTEL_SERVICE_NAME` names the service); resolves with the function that flushes and
 * stops it, or undefined when tracing stays off. A variable the SDK refuses (it falls back to
 * its default) is logged as a warning.
 */
export async function startTracing(serviceName: string): Promise<(() => Promise<void>) | undefined> {
  const env = process.env;
  if (!env.OTEL_EXPORTER_OTLP_ENDPOINT && !env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) return undefined;
  const [{ NodeTracerProvider, BatchSpanProcessor }, { OTLPTraceExporter }, { resourceFromAttributes }] =
    await Promise.all([
      import("@opentelemetry/sdk-trace-node"),
      import("@opentelemetry/exporter-trace-otlp-http"),
      import("@opentelemetry/resources"),
    ]);
  const provider = reportingConfigProblems(
    () =>
      new NodeTracerProvider({
        resource: resourceFromAttributes({ "service.name": env.OTEL_SERVICE_NAME || serviceName }),
        spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter({ url: tracesUrl(env) }))],
      }),
  );
  // The global tracer, the async context (AsyncLocalStorage) and the W3C propagator.
  provider.register();
  tracer = provider.getTracer("typed-service");
  return async () => {
    tracer = undefined;
    await provider.shutdown();
    // Unregistered, so that tracing can start again in this process.
    trace.disable();
    context.disable();
    propagation.disable();
  };
}

/** Runs `make` with what the SDK says meanwhile (a sampler it does not know...) logged as warnings. */
function reportingConfigProblems<T>(make: () => T): T {
  const warn: DiagLogFunction = (message) => log.warn(`OpenTelemetry: ${message}`);
  const quiet: DiagLogFunction = () => {};
  diag.setLogger({ error: warn, warn, info: quiet, debug: quiet, verbose: quiet }, DiagLogLevel.WARN);
  try {
    return make();
  } finally {
    diag.disable();
  }
}

/** Where spans go: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`. */
function tracesUrl(env: NodeJS.ProcessEnv): string {
  if (env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) return env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT;
  return `${env.OTEL_EXPORTER_OTLP_ENDPOINT!.replace(/\/+$/, "")}/v1/traces`;
}

/**
 * Runs `fn` in a span named `name`. A SERVER span (a request received) continues the trace
 * context in `carrier` (its headers) or the active one, else starts a trace, as the sampler
 * decides; any other kind is made only as the child of a span being recorded, so background
 * work (no span active) starts no trace and an unsampled request's steps cost nothing. `fn`
 * alone when tracing is off. A failure that is not the caller's (`status` 5xx, or no status)
 * marks the span as an error.
 */
export function traced<T>(
  name: string,
  kind: SpanKind,
  carrier: TraceCarrier | undefined,
  fn: () => Promise<T>,
  attributes?: Attributes,
): Promise<T> {
  if (!tracer) return fn();
  let parent = context.active();
  if (kind === SpanKind.SERVER) {
    if (carrier) parent = propagation.extract(parent, carrier, getter);
  } else if (!trace.getSpan(parent)?.isRecording()) return fn();
  const span = tracer.startSpan(name, attributes ? { kind, attributes } : { kind }, parent);
  const active = trace.setSpan(parent, span);
  // Not sampled: still the active span, so the onward requests carry its `traceparent`.
  if (!span.isRecording()) return context.with(active, fn);
  return context.with(active, () => recording(span, fn));
}

/** `fn` in a recorded span, ended when `fn` settles. */
async function recording<T>(span: Span, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    const status = (err as { status?: unknown }).status;
    if (typeof status !== "number" || status >= 500) {
      span.setStatus({ code: SpanStatusCode.ERROR, message: (err as Error).name });
    }
    throw err;
  } finally {
    span.end();
  }
}

/** A span is being recorded in the active context (tracing on, the request sampled). */
function recordingNow(): boolean {
  return tracer !== undefined && trace.getActiveSpan()?.isRecording() === true;
}

/** Sets an attribute on the active span (nothing when off). */
export function traceAttribute(key: string, value: string | number): void {
  if (tracer) trace.getActiveSpan()?.setAttribute(key, value);
}

/** Writes the active trace context (`traceparent`, `tracestate`) into outgoing headers. */
export function injectTrace(headers: Record<string, string> | HeaderSetter): void {
  if (!tracer) return;
  if (typeof headers.set === "function") propagation.inject(context.active(), headers as HeaderSetter, setter);
  else propagation.inject(context.active(), headers);
}

type HeaderSetter = { set(name: string, value: string): void };
const setter: TextMapSetter<HeaderSetter> = { set: (carrier, key, value) => carrier.set(key, value) };

/**
 * `store` with each method call a span `<what> <method>` (e.g. `kv tasks create`) inside a
 * span being recorded, when tracing is on as the store is made; `store` itself otherwise.
 */
export function tracedMethods<S extends object>(store: S, what: string): S {
  if (!tracer) return store;
  const wrapped: Record<string, unknown> = { ...(store as Record<string, unknown>) };
  for (const [name, value] of Object.entries(store)) {
    if (typeof value !== "function") continue;
    const method = value as (...args: unknown[]) => unknown;
    const spanName = `${what} ${name}`;
    wrapped[name] = (...args: unknown[]) =>
      recordingNow()
        ? traced(spanName, SpanKind.CLIENT, undefined, async () => method.apply(store, args))
        : method.apply(store, args);
  }
  return wrapped as S;
}
