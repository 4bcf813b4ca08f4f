// Slow and abusive clients: slowloris headers, a body trickled byte by byte and 1,000 idle
// keep-alive connections are cut off by the server's timeouts while normal requests go on.
// The service runs with short timeouts (headers 1 s, request 2 s, keep-alive 2 s) to keep
// the test quick; the defaults are 10 s, 30 s and 5 s.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { connect } from "node:net";
import { lifo } from "../helpers/defer.ts";
import { getJson, postJson, startService, type TestService } from "../helpers/service.ts";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A raw socket to `url` that records when the server closes it and what it answered. */
function rawSocket(url: string) {
  const { hostname, port } = new URL(url);
  const socket = connect(Number(port), hostname);
  const state = { socket, closedAt: 0, answer: "" };
  socket.on("data", (d) => (state.answer += d.toString()));
  socket.on("close", () => (state.closedAt = Date.now()));
  socket.on("error", () => {});
  return state;
}

/** Normal requests still answered quickly while the abuse goes on. */
async function normalRequests(svc: TestService) {
  const started = Date.now();
  const created = await postJson(`${svc.taskUrl}/`, { title: "normal" });
  assert.equal(created.status, 200);
  assert.equal((await getJson(`${svc.taskUrl}/${(created.body as { id: string }).id}`)).status, 200);
  return Date.now() - started;
}

describe("faults: slow clients", () => {
  const defer = lifo(after);
  let svc: TestService;
  before(async () => {
    svc = await startService(defer, { timeouts: { headersMs: 1_000, requestMs: 2_000, keepAliveMs: 2_000 } });
  });

  it("slow clients - slowloris headers are cut off after the headers timeout", async () => {
    const sockets = Array.from({ length: 200 }, () => rawSocket(svc.taskUrl));
    const drip = setInterval(() => {
      for (const s of sockets) if (!s.closedAt) s.socket.write("X-Slow: 1\r\n");
    }, 250);
    for (const s of sockets) s.socket.write("GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    const started = Date.now();
    try {
      const normalMs = await normalRequests(svc);
      assert.ok(normalMs < 1_000, `normal requests served meanwhile (${normalMs} ms)`);
      while (sockets.some((s) => !s.closedAt) && Date.now() - started < 5_000) await sleep(50);
    } finally {
      clearInterval(drip);
      for (const s of sockets) s.socket.destroy();
    }
    const open = sockets.filter((s) => !s.closedAt).length;
    assert.equal(open, 0, `${open} slowloris sockets still open after 5 s`);
    const latest = Math.max(...sockets.map((s) => s.closedAt)) - started;
    assert.ok(latest < 3_500, `all closed ${latest} ms after they started`);
    assert.ok(
      sockets.every((s) => !s.answer.includes("200 OK")),
      "none got an answer",
    );
  });

  it("slow clients - a body trickled byte by byte is cut off after the request timeout", async () => {
    const s = rawSocket(svc.taskUrl);
    const body = `{"title":"${"x".repeat(80)}"}`;
    s.socket.write(
      `POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`,
    );
    const started = Date.now();
    let sent = 0;
    const drip = setInterval(() => {
      if (!s.closedAt && sent < body.length) s.socket.write(body[sent++]!);
    }, 100);
    try {
      const normalMs = await normalRequests(svc);
      assert.ok(normalMs < 1_000, `normal requests served meanwhile (${normalMs} ms)`);
      while (!s.closedAt && Date.now() - started < 6_000) await sleep(50);
    } finally {
      clearInterval(drip);
      s.socket.destroy();
    }
    assert.ok(s.closedAt > 0, "closed by the server");
    assert.ok(s.closedAt - started < 4_000, `closed after ${s.closedAt - started} ms`);
    assert.ok(sent < body.length, "cut off before the body was complete");
    assert.ok(!s.answer.includes("200 OK"), "the trickled create was not accepted");
  });

  it("slow clients - 1,000 idle keep-alive connections are closed and cost nothing meanwhile", async () => {
    const sockets = Array.from({ length: 1_000 }, () => rawSocket(svc.jobUrl));
    for (const s of sockets) s.socket.write("GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n\r\n");
    const started = Date.now();
    while (sockets.some((s) => !s.answer.includes("200 OK")) && Date.now() - started < 10_000) await sleep(50);
    assert.equal(sockets.filter((s) => s.answer.includes("200 OK")).length, 1_000, "all 1,000 were served");
    const idleSince = Date.now();
    try {
      const normalMs = await normalRequests(svc);
      assert.ok(normalMs < 1_000, `normal requests served with 1,000 idle sockets (${normalMs} ms)`);
      while (sockets.some((s) => !s.closedAt) && Date.now() - idleSince < 8_000) await sleep(100);
    } finally {
      for (const s of sockets) s.socket.destroy();
    }
    const open = sockets.filter((s) => !s.closedAt).length;
    assert.equal(open, 0, `${open} idle sockets still open`);
    const latest = Math.max(...sockets.map((s) => s.closedAt)) - idleSince;
    assert.ok(latest < 4_000, `idle sockets closed within ${latest} ms`);
  });
});
