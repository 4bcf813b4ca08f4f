// The baseline: a bare node:http server answering one fixed small task JSON to any request,
// after reading the body in full. Runs as its own process on BENCH_PORT (default: a free one)
// and says `{"msg":"ready","port":N}` once it listens, as the service says "ready".
import { once } from "node:events";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";

const body = JSON.stringify({ id: "00000000-0000-4000-8000-000000000000", title: "bench", completed: false });
const headers = { "content-type": "application/json", "content-length": Buffer.byteLength(body) };
const port = Number(process.env.BENCH_PORT ?? 0);

const server = createServer({ keepAliveTimeout: 5_000 }, (req, res) => {
  req.on("data", () => {});
  req.on("end", () => {
    res.writeHead(200, headers);
    res.end(body);
  });
});

server.listen(port, "127.0.0.1");
await once(server, "listening");
console.log(JSON.stringify({ msg: "ready", port: (server.address() as AddressInfo).port }));
process.on("SIGTERM", () => server.close(() => process.exit(0)));
process.on("SIGINT", () => server.close(() => process.exit(0)));
