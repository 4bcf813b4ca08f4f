// taskctl's requests, sent with node:http(s) rather than `fetch`: node loads fetch's
// implementation on its first call, which cost more than the rest of a command (see
// docs/performance.md#taskctl-start-up). One request per connection, the whole answer read.
import type { HttpSend } from "./http-client.ts";

export const nodeHttpSend: HttpSend = async (url, { method, headers, body, signal }) => {
  const { request } = url.protocol === "https:" ? await import("node:https") : await import("node:http");
  return new Promise((resolve, reject) => {
    const req = request(url, { method, headers, signal, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (chunk: Buffer) => chunks.push(chunk));
      res.on("error", reject);
      res.on("end", () => {
        const status = res.statusCode ?? 0;
        const text = Buffer.concat(chunks).toString("utf8");
        const headers = { get: (name: string) => res.headers[name.toLowerCase()]?.toString() ?? null };
        resolve({ status, ok: status >= 200 && status < 300, headers, text: async () => text });
      });
    });
    // As fetch does: a timeout rejects with the signal's reason (a TimeoutError).
    req.on("error", (err) => reject(signal?.aborted ? signal.reason : err));
    req.end(body);
  });
};
