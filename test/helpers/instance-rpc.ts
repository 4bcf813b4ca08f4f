// Calls an instance's RPC methods straight at its upstream (TCP port or unix socket), with the
// headers the proxy would add: for provider tests that run no proxy.
import { request } from "node:http";
import { upstreamOf, type MicrovmHandle } from "../../vm-runtime/service/index.ts";

export interface RpcAnswer {
  readonly status: number;
  readonly body: unknown;
}

export function callInstance(
  handle: MicrovmHandle,
  method: string,
  args: unknown[] = [],
  timeoutMs = 10_000,
): Promise<RpcAnswer> {
  const upstream = upstreamOf(handle, 8080);
  if (!upstream) return Promise.reject(new Error("the handle has no runtime upstream"));
  return new Promise((resolve, reject) => {
    const target =
      "socketPath" in upstream ? { socketPath: upstream.socketPath } : { host: upstream.host, port: upstream.port };
    const req = request(
      {
        ...target,
        method: "POST",
        path: `/__rpc__/${encodeURIComponent(method)}`,
        headers: { "content-type": "application/json", ...handle.upstreamHeaders },
        agent: false,
        timeout: timeoutMs,
      },
      (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (chunk: string) => (text += chunk));
        res.on("end", () =>
          resolve({ status: res.statusCode ?? 0, body: text ? (JSON.parse(text) as unknown) : undefined }),
        );
        res.on("error", reject);
      },
    );
    req.on("timeout", () => req.destroy(new Error(`rpc ${method} timed out`)));
    req.on("error", reject);
    req.end(JSON.stringify(args));
  });
}

/** The RPC's result; fails on a non-200 answer. */
export async function rpc<T = unknown>(
  handle: MicrovmHandle,
  method: string,
  args: unknown[] = [],
  timeoutMs?: number,
): Promise<T> {
  const answer = await callInstance(handle, method, args, timeoutMs);
  if (answer.status !== 200) throw new Error(`rpc ${method} answered ${answer.status}: ${JSON.stringify(answer.body)}`);
  return answer.body as T;
}
