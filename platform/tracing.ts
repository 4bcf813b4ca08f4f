// Traces: a W3C `traceparent` on an HTTP request is continued (or a trace started), carried in
// NATS headers to the actor, the owner hop and the microVM host, with spans for the gateway
// request, each NATS request, each handler, each KV operation and lease. Exported over OTLP/HTTP
// with the OpenTelemetry SDK when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is
// set; off otherwise, and then nothing here does more than test a boolean (the SDK is not loaded).
import {
  context,
  propagation,
  SpanKind,
  SpanStatusCode,
  trace,
  type Attributes,
  type TextMapGetter,
} from "@opentelemetry/api";

export { SpanKind };

let enabled = false;

/** True while spans are recorded and exported. */
export const tracingOn = (): boolean => enabled;

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
 * Starts exporting when the environment names an OTLP endpoint (the exporter reads the
 * standard `OTEL_EXPORTER_OTLP_*` variables, `OTEL_SERVICE_NAME` names the service); resolves
 * with the function that flushes and stops it, or undefined when tracing stays off.
 */
export async function startTracing(
  serviceName: string,
  env: NodeJS.ProcessEnv = process.env,
): Promise<(() => Promise<void>) | undefined> {
  if (!env.OTEL_EXPORTER_OTLP_ENDPOINT && !env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) return undefined;
  const [{ NodeTracerProvider, BatchSpanProcessor }, { OTLPTraceExporter }, { resourceFromAttributes }] =
    await Promise.all([
      import("@opentelemetry/sdk-trace-node"),
      import("@opentelemetry/exporter-trace-otlp-http"),
      import("@opentelemetry/resources"),
    ]);
  const provider = new NodeTracerProvider({
    resource: resourceFromAttributes({ "service.name": env.OTEL_SERVICE_NAME || serviceName }),
    spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter({ url: tracesUrl(env) }))],
  });
  // The global tracer, the async context (AsyncLocalStorage) and the W3C propagator.
  provider.register();
  enabled = true;
  return async () => {
    enabled = false;
    await provider.shutdown();
  };
}

/** Where spans go: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`. */
function tracesUrl(env: NodeJS.ProcessEnv): string {
  if (env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) return env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT;
  return `${env.OTEL_EXPORTER_OTLP_ENDPOINT!.replace(/\/+$/, "")}/v1/traces`;
}

/**
 * Runs `fn` in a span named `name`: a child of the trace context in `carrier` when given (an
 * incoming request's headers), else of the active span. `fn` alone when tracing is off. A
 * failure that is not the caller's (`status` 5xx, or no status) marks the span as an error.
 */
export function traced<T>(
  name: string,
  kind: SpanKind,
  carrier: TraceCarrier | undefined,
  fn: () => Promise<T>,
  attributes?: Attributes,
): Promise<T> {
  if (!enabled) return fn();
  const parent = carrier ? propagation.extract(context.active(), carrier, getter) : context.active();
  return trace
    .getTracer("typed-service")
    .startActiveSpan(name, { kind, ...(attributes ? { attributes } : {}) }, parent, async (span) => {
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
    });
}

/** Sets an attribute on the active span (nothing when off). */
export function traceAttribute(key: string, value: string | number): void {
  if (enabled) trace.getActiveSpan()?.setAttribute(key, value);
}

/** Writes the active trace context (`traceparent`, `tracestate`) into outgoing headers. */
export function injectTrace(headers: Record<string, string> | { set(name: string, value: string): void }): void {
  if (!enabled) return;
  if (typeof headers.set === "function") {
    const h = headers as { set(name: string, value: string): void };
    propagation.inject(context.active(), h, { set: (carrier, key, value) => carrier.set(key, value) });
  } else propagation.inject(context.active(), headers);
}

/** The active trace id, for log lines (undefined when off or outside a span). */
export function activeTraceId(): string | undefined {
  if (!enabled) return undefined;
  const id = trace.getActiveSpan()?.spanContext().traceId;
  return id && id !== "00000000000000000000000000000000" ? id : undefined;
}

/**
 * `store` with each method call a span `<what> <method>` (e.g. `kv tasks create`), when tracing
 * is on as the store is made; `store` itself otherwise.
 */
export function tracedMethods<S extends object>(store: S, what: string): S {
  if (!enabled) return store;
  const wrapped: Record<string, unknown> = { ...(store as Record<string, unknown>) };
  for (const [name, value] of Object.entries(store)) {
    if (typeof value !== "function") continue;
    const method = value as (...args: unknown[]) => unknown;
    wrapped[name] = (...args: unknown[]) =>
      traced(`${what} ${name}`, SpanKind.CLIENT, undefined, async () => method.apply(store, args));
  }
  return wrapped as S;
}
