// OpenAPI documents and the reference page: derived from the contracts, valid OpenAPI 3.1,
// every operation present, and the page renders offline in headless Chromium.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { validate } from "@readme/openapi-parser";
import { createGateways } from "../gateway/index.ts";
import { jobApi, microvmApi, openApiPath, taskApi, type Operation } from "../schemas/index.ts";
import { lifo } from "./helpers/defer.ts";
import { startService, type TestService } from "./helpers/service.ts";

const CHROMIUM = "/usr/bin/chromium";

describe("openapi", () => {
  const defer = lifo(after);
  let svc: TestService;
  let microvmUrl: string;
  before(async () => {
    svc = await startService(defer);
    const { microvm } = createGateways({ nats: svc.handle });
    microvmUrl = `http://127.0.0.1:${await microvm.listen(0, "127.0.0.1")}`;
    defer(() => microvm.close());
  });

  const apis = (): [string, string, Record<string, Operation>][] => [
    ["task", svc.taskUrl, taskApi],
    ["job", svc.jobUrl, jobApi],
    ["microvm", microvmUrl, microvmApi],
  ];

  it("openapi - each API serves a valid OpenAPI 3.1 document with every operation", async () => {
    for (const [name, url, api] of apis()) {
      const res = await fetch(`${url}/openapi.json`);
      assert.equal(res.status, 200);
      const doc = (await res.json()) as {
        openapi: string;
        paths: Record<string, Record<string, { operationId: string; responses: Record<string, unknown> }>>;
      };
      assert.equal(doc.openapi, "3.1.0");
      const result = await validate(structuredClone(doc) as never);
      assert.equal(result.valid, true, `${name}: ${JSON.stringify(result)}`);
      for (const op of Object.values(api)) {
        const entry = doc.paths[openApiPath(op.http.path)]?.[op.http.method.toLowerCase()];
        assert.equal(entry?.operationId, op.name, `${name} lists ${op.name}`);
        for (const error of op.errors)
          assert.ok(entry!.responses[String(error.status)], `${op.name} documents ${error.tag}`);
        assert.ok(entry!.responses["400"] && entry!.responses["503"]);
      }
      if (name === "task") {
        const patch = doc.paths["/{id}"]!.patch as unknown as { parameters: { name: string; in: string }[] };
        assert.ok(
          patch.parameters.some((p) => p.name === "If-Match" && p.in === "header"),
          "PATCH takes If-Match",
        );
        const read = doc.paths["/{id}"]!.get!.responses["200"] as { headers?: Record<string, unknown> };
        assert.ok(read.headers?.ETag, "a Task answer documents its ETag");
        assert.ok(doc.paths["/{id}"]!.delete!.responses["204"], "DELETE answers 204");
      }
      const operationCount = Object.values(doc.paths).flatMap((p) => Object.keys(p)).length;
      assert.equal(operationCount, Object.keys(api).length, `${name}: nothing extra`);
    }
  });

  it("openapi - the reference page lists the operations in headless Chromium, with no request leaving the service", async (t) => {
    if (!existsSync(CHROMIUM)) {
      t.skip(`${CHROMIUM} is absent (apt-get install chromium to run this test)`);
      console.log(`# skipped: ${CHROMIUM} is absent`);
      return;
    }
    const { chromium } = await import("playwright-core");
    const browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        // A name, not loopback: Swagger UI skips its online validator badge on localhost only.
        "--host-resolver-rules=MAP docs.test 127.0.0.1",
      ],
    });
    t.after(() => browser.close());
    const { task } = createGateways({ nats: svc.handle, hostNames: ["docs.test"] });
    const base = `http://docs.test:${await task.listen(0, "127.0.0.1")}`;
    t.after(() => task.close());
    const page = await browser.newPage();
    const outside: string[] = [];
    page.on("request", (r) => {
      if (!r.url().startsWith(base)) outside.push(r.url());
    });
    await page.goto(`${base}/docs`);
    await page.waitForSelector(".opblock-summary-path", { timeout: 20_000 });
    const listed = await page.$$eval(".opblock-summary-path", (els) => els.map((e) => e.textContent?.trim()));
    for (const op of Object.values(taskApi))
      assert.ok(listed.includes(openApiPath(op.http.path)), `lists ${op.http.path}`);
    assert.deepEqual(outside, [], "no request leaves the service (works offline)");
  });
});
