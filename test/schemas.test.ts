// Pure contract helpers: escaping, subjects and decode issues.
import { describe, it } from "node:test";
import assert from "node:assert/strict";
import {
  compileDecoder,
  getTaskDO,
  idKey,
  inputSchema,
  MAX_KEY_LENGTH,
  nameFromToken,
  nameToken,
  requestSubject,
  subjectValues,
  subscriptionSubject,
  taskObjectKey,
  taskObjectLeaseKey,
  taskObjectName,
  ANONYMOUS,
  keyOwner,
  ownedKey,
  ownerPrefix,
  createTask,
  allOperations,
  ownerSubjects,
  viaGateway,
  digitsUpTo,
  getMicrovmLogs,
  listTasks,
  updateTask,
  ApiError,
  imageApi,
  jobApi,
  microvmApi,
  requestBody,
  taskApi,
  type Operation,
} from "../schemas/index.ts";

describe("schemas", () => {
  it("escape - name tokens round trip any string and are single subject tokens", () => {
    for (const name of ["default", "a.b", "*", ">", "with space", "ü/✓", "_", "-", "x".repeat(256)]) {
      const token = nameToken(name);
      assert.match(token, /^[A-Za-z0-9_-]+$/);
      assert.equal(nameFromToken(token), name);
    }
  });

  it("escape - non-canonical tokens are refused", () => {
    for (const token of ["", "YQ==", "a.b", "*", "YR"]) assert.equal(nameFromToken(token), undefined, token);
  });

  it("escape - plain ids are their own keys; others are escaped without collisions", () => {
    assert.equal(idKey("6f1c1f9e-5d0a-4b5e-9c1a-2b3c4d5e6f70"), "6f1c1f9e-5d0a-4b5e-9c1a-2b3c4d5e6f70");
    const ids = ["a.b", "a_b", "_YS5i", "YS5i", "*", ">", " ", "a/b", "é"];
    const keys = ids.map((id) => idKey(id)!);
    for (const key of keys) assert.match(key, /^[-/_=.a-zA-Z0-9]+$/);
    assert.equal(new Set(keys).size, ids.length);
    assert.equal(idKey("x".repeat(MAX_KEY_LENGTH + 1)), undefined);
    assert.notEqual(taskObjectKey("a", "b"), taskObjectKey("b", "a"));
  });

  it("escape - the anonymous principal's keys are the keys without owners", () => {
    assert.equal(ownerPrefix(ANONYMOUS), "");
    assert.equal(ownedKey(ANONYMOUS, "abc"), "abc");
    assert.equal(taskObjectKey("default", "x"), `${nameToken("default")}.x`);
    assert.equal(taskObjectKey("default", "x", ANONYMOUS), taskObjectKey("default", "x"));
    assert.equal(taskObjectLeaseKey("default"), nameToken("default"));
    assert.deepEqual(keyOwner("abc"), { principal: ANONYMOUS, key: "abc" });
  });

  it("escape - a named principal's keys start with its own token, which no key without owners can", () => {
    const alice = ownerPrefix("alice");
    assert.equal(alice, `=${nameToken("alice")}.`);
    assert.equal(ownedKey("alice", "abc"), `${alice}abc`);
    assert.notEqual(ownerPrefix("bob"), alice);
    assert.equal(taskObjectKey("default", "x", "alice"), `${alice}${nameToken("default")}.x`);
    assert.equal(taskObjectLeaseKey("default", "alice"), `${alice}${nameToken("default")}`);
    for (const principal of ["alice", "nats:internal", "a.b", "*"]) {
      const key = ownedKey(principal, idKey("id.1"))!;
      assert.match(key, /^[-/_=.a-zA-Z0-9]+$/, "a valid KV key");
      assert.deepEqual(keyOwner(key), { principal, key: idKey("id.1") });
    }
    // Keys without owners (plain or escaped ids, name tokens) never start with the owner mark.
    for (const id of ["a", "_x", "a.b", "="]) assert.doesNotMatch(idKey(id)!, /^=/);
    assert.doesNotMatch(nameToken("=x"), /^=/);
    // An owner token that is not canonical, or names the anonymous principal, is no key of ours.
    assert.equal(keyOwner("=YR.x"), undefined);
    assert.equal(keyOwner(`=${nameToken(ANONYMOUS)}.x`), undefined);
    assert.equal(ownedKey("alice", "x".repeat(MAX_KEY_LENGTH)), undefined);
    assert.equal(ownedKey("alice", undefined), undefined);
  });

  it("escape - a task object's name is read back from its lease key", () => {
    assert.equal(taskObjectName(taskObjectLeaseKey("a.b")!), "a.b");
    assert.equal(taskObjectName(taskObjectLeaseKey("a.b", "alice")!), "a.b");
    assert.equal(taskObjectName("!"), "!");
  });

  it("subjects - no subject a caller may publish reaches a gateway's copy", () => {
    // Two subject patterns that one subject can match both.
    const overlap = (a: string, b: string): boolean => {
      const x = a.split(".");
      const y = b.split(".");
      for (let i = 0; i < Math.max(x.length, y.length); i++) {
        if (x[i] === ">" || y[i] === ">") return x[i] !== undefined && y[i] !== undefined;
        if (x[i] === undefined || y[i] === undefined) return false;
        if (x[i] !== "*" && y[i] !== "*" && x[i] !== y[i]) return false;
      }
      return true;
    };
    assert.ok(overlap("taskobjects.*.list", "taskobjects.gateway.list"), "the check sees an overlap");
    const ops = allOperations;
    for (const copy of ops.map((op) => subscriptionSubject(viaGateway(op)))) {
      for (const op of ops) {
        assert.ok(!overlap(copy, subscriptionSubject(op)), `${copy} and ${subscriptionSubject(op)}`);
        if (op.placement.kind !== "stateless")
          assert.ok(!overlap(copy, ownerSubjects(op)), `${copy} and ${ownerSubjects(op)}`);
      }
    }
  });

  it("subjects - fields are filled, wildcarded and read back", () => {
    assert.equal(requestSubject(getTaskDO, { name: "a.b", id: "x" }), `taskobjects.${nameToken("a.b")}.get`);
    assert.equal(subscriptionSubject(getTaskDO, "pre"), "pre.taskobjects.*.get");
    const subject = requestSubject(getTaskDO, { name: "n/ü" }, "pre");
    assert.deepEqual(subjectValues(getTaskDO, subject, "pre"), { name: "n/ü" });
    assert.equal(subjectValues(getTaskDO, "pre.taskobjects.!.get", "pre"), undefined);
  });

  it("subjects - in every operation each field is a whole token, filled and read back under any prefix", () => {
    const operations: Operation[] = [taskApi, jobApi, imageApi, microvmApi].flatMap((api) => Object.values(api));
    for (const op of operations) {
      const fields = [...op.subject.matchAll(/\{(\w+)\}/g)].map((m) => m[1]!);
      for (const field of fields) assert.ok(op.subject.split(".").includes(`{${field}}`), `${op.name}: {${field}}`);
      const input = Object.fromEntries(fields.map((field, i) => [field, `${field}.${i} ü`]));
      for (const prefix of ["", "one", "one.two"]) {
        const subject = requestSubject(op, { ...input, other: 1 }, prefix);
        assert.deepEqual(subjectValues(op, subject, prefix), input, `${op.name} under ${JSON.stringify(prefix)}`);
      }
      assert.deepEqual(JSON.parse(requestBody(op, { ...input, other: 1, more: "x" })), { other: 1, more: "x" });
    }
  });

  it("validate - defaults apply and unknown fields are dropped", () => {
    const decode = compileDecoder(inputSchema(getTaskDO));
    assert.deepEqual(decode({ id: "x", extra: 1 }), { id: "x", name: "default" });
  });

  it("validate - issues come in the HttpApiDecodeError shape", () => {
    const decode = compileDecoder(inputSchema(createTask));
    try {
      decode({ title: ["x"] });
      assert.fail("should throw");
    } catch (err) {
      assert.ok(err instanceof ApiError);
      assert.equal(err.status, 400);
      assert.deepEqual(err.body.issues, [
        { _tag: "Type", path: ["title"], message: "Expected string, actual an array" },
      ]);
    }
  });

  /** The 400 body `decode(input)` throws. */
  const refusal = (op: Operation, input: Record<string, unknown>) => {
    try {
      compileDecoder(inputSchema(op))(input);
    } catch (err) {
      assert.ok(err instanceof ApiError);
      return err.body as unknown as { issues: { _tag: string; path: unknown[]; message: string }[]; message: string };
    }
    return assert.fail(`accepted ${JSON.stringify(input)}`);
  };

  it("validate - one issue per field: a union's failed branches are one message saying what it takes", () => {
    for (const limit of ["0", 0, "1001", 1001, "ten", "01"]) {
      const body = refusal(listTasks, { limit });
      assert.deepEqual(
        body.issues,
        [
          {
            _tag: "Type",
            path: ["limit"],
            message: `Expected an integer from 1 to 1000, actual ${JSON.stringify(limit)}`,
          },
        ],
        String(limit),
      );
      assert.equal(body.message, `["limit"]: ${body.issues[0]!.message}`);
    }
    const logs = refusal(getMicrovmLogs, { microvmIdentifier: "vm", waitSeconds: "31", follow: "yes" });
    assert.deepEqual(
      logs.issues.map((i) => i.message),
      ['Expected an integer from 1 to 30, actual "31"', 'Expected "1" or "true", actual "yes"'],
    );
  });

  it("validate - a payload that needs one of its fields names them, and never echoes the input", () => {
    const body = refusal(updateTask, { id: "6f1c1f9e-stored-id" });
    assert.deepEqual(body, {
      _tag: "HttpApiDecodeError",
      issues: [{ _tag: "Missing", path: [], message: "send title or completed" }],
      message: "send title or completed",
    });
    // An object or array is described by its kind, whatever the field: no record is quoted back.
    const nested = refusal(createTask, { title: { id: "x", title: "secret" } });
    assert.equal(nested.issues[0]!.message, "Expected string, actual an object");
  });

  it("counts - the query form of a count takes exactly 1 to its maximum", () => {
    for (const maximum of [1, 9, 10, 30, 60, 99, 100, 999, 1000, 1001, 86_400]) {
      const digits = new RegExp(digitsUpTo(maximum));
      for (let n = 0; n <= maximum + 20; n++)
        assert.equal(digits.test(String(n)), n >= 1 && n <= maximum, `${n} of ${maximum}`);
      for (const odd of ["", "01", "+1", "-1", "1.0", "1e1", " 1", "1 "])
        assert.ok(!digits.test(odd), `${odd} of ${maximum}`);
    }
  });
});

describe("error catalogue", () => {
  it("errors - every declared error's body has _tag and a message, also when the thrower gives none", async () => {
    type Declared = {
      tag: string;
      schema: { required?: string[] };
      make(values: object): { body: Record<string, unknown> };
    };
    const catalogue = (Object.values(await import("../schemas/errors.ts")) as unknown[]).filter(
      (v): v is Declared => typeof v === "object" && v !== null && "tag" in v && "make" in v,
    );
    assert.ok(catalogue.length > 20, `${catalogue.length} errors found`);
    for (const error of catalogue) {
      assert.deepEqual(
        ["_tag", "message"].filter((field) => !error.schema.required?.includes(field)),
        [],
        `${error.tag}: _tag and message are required fields`,
      );
      const body = error.make({}).body;
      assert.equal(body._tag, error.tag);
      assert.equal(typeof body.message, "string", error.tag);
    }
  });
});
