// The docs' tables of operations against the contracts: each table names exactly the
// operations of its API, each with the contract's HTTP method and path and NATS subject. A new
// operation, or a changed route or subject, fails here until the docs say it.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { jobApi, microvmApi, taskApi, type Operation } from "../schemas/index.ts";
import { code, markdownTables } from "./helpers/doc-tables.ts";

type Row = Record<string, string>;

/** The rows of every markdown table in `markdown` whose first column is `operation`. */
const operationTables = (markdown: string): Row[][] =>
  markdownTables(markdown)
    .filter((table) => table.header[0] === "operation")
    .map((table) => table.rows);

/** `GET /do/:id?name=` → `GET /do/:id` (the query and anything after the path dropped). */
function route(cell: string): string {
  const [method, path = ""] = code(cell).split(" ");
  return `${method} ${path.replace(/[?[].*$/, "")}`;
}

/** A subject with its `{field}` or `<token>` parts as `*`. */
const subjectPattern = (subject: string) => subject.replace(/\{\w+\}|<[^>]+>/g, "*");

const pages = {
  api: await readFile(new URL("../docs/api.md", import.meta.url), "utf8"),
  nats: await readFile(new URL("../docs/nats.md", import.meta.url), "utf8"),
  microvms: await readFile(new URL("../docs/microvms.md", import.meta.url), "utf8"),
  objects: await readFile(new URL("../docs/objects.md", import.meta.url), "utf8"),
};

/** The table rows of `page` by operation name; a name listed twice fails. */
function rowsByOperation(rows: Row[]): Map<string, Row> {
  const byName = new Map<string, Row>();
  for (const row of rows) {
    assert.ok(!byName.has(row.operation!), `${row.operation} is listed twice`);
    byName.set(row.operation!, row);
  }
  return byName;
}

function sameOperations(rows: Map<string, Row>, api: readonly Operation[], page: string) {
  assert.deepEqual(
    [...rows.keys()].sort(),
    api.map((op) => op.name).sort(),
    `the operations of docs/${page}.md's table against the contracts`,
  );
}

describe("docs operations - the tables of operations match the contracts", () => {
  it("docs operations - docs/api.md: every Task and Job API operation with its method, path and subject", () => {
    const rows = rowsByOperation(operationTables(pages.api).flat());
    const api = [...Object.values(taskApi), ...Object.values(jobApi)];
    sameOperations(rows, api, "api");
    for (const op of api) {
      const row = rows.get(op.name)!;
      assert.equal(route(row.request!), `${op.http.method} ${op.http.path}`, op.name);
      assert.equal(subjectPattern(code(row.subject!)), subjectPattern(op.subject), op.name);
    }
  });

  it("docs operations - docs/nats.md names no operation table of its own (api.md's has the subjects)", () => {
    assert.deepEqual(operationTables(pages.nats), []);
  });

  it("docs operations - docs/microvms.md and objects.md: every microVM, image and object operation with its route and subject", () => {
    const rows = rowsByOperation([...operationTables(pages.microvms), ...operationTables(pages.objects)].flat());
    const api = Object.values(microvmApi);
    sameOperations(rows, api, "microvms and docs/objects");
    for (const op of api) {
      const row = rows.get(op.name)!;
      assert.equal(route(row.REST!), `${op.http.method} ${op.http.path.replace(":microvmIdentifier", ":id")}`, op.name);
      assert.equal(code(row["NATS subject"]!), op.subject, op.name);
    }
  });
});
