// The gateway's query parsing (gateway/query.ts) answers what polka's, `querystring.parse`,
// answers: the same keys in the same order with the same values, for every query, including
// those it hands to querystring (escapes, `+`, repeated keys, `__proto__`).
import assert from "node:assert/strict";
import type { IncomingMessage } from "node:http";
import { parse as parseQueryString } from "node:querystring";
import { describe, it } from "node:test";
import fc from "fast-check";
import { parse as polkaParse } from "@polka/url";
import { parseQuery, parseUrl } from "../gateway/query.ts";

/** A plain copy, keys in order: querystring's object has a null prototype. */
const plain = (query: object | undefined) => (query === undefined ? undefined : Object.entries(query));

/** Queries of the characters and words where the two could part: escapes, `+`, `#`, delimiters, prototype keys. */
const queries = fc.string({
  unit: fc.constantFrom(..."abz0_-.~=&=&%+ #é".split(""), "%41", "%zz", "__proto__", "constructor", "name", "limit"),
  maxLength: 24,
});

describe("query parsing", () => {
  it("answers querystring.parse's pairs for chosen queries", () => {
    for (const query of [
      "name=bench-1",
      "name=a&limit=10",
      "name",
      "name=",
      "=x",
      "a=b=c",
      "&&a=1&&",
      "a=1&a=2",
      "__proto__=x",
      "constructor=x&toString=y",
      "name=%C3%A9",
      "name=a+b",
      "x".repeat(600),
    ]) {
      assert.deepEqual(plain(parseQuery(query)), plain(parseQueryString(query)), query);
    }
    // A plain object of its own keys only, whatever the query names.
    const parsed = parseQuery("constructor=x");
    assert.equal(parsed.constructor, "x");
    assert.equal(Object.getPrototypeOf(parseQuery("__proto__=x")), null);
  });

  it("answers querystring.parse's pairs for 20,000 generated queries", () => {
    fc.assert(
      fc.property(queries, (query) => {
        assert.deepEqual(plain(parseQuery(query)), plain(parseQueryString(query)), JSON.stringify(query));
      }),
      { numRuns: 20_000, seed: 28 },
    );
  });

  it("parses a URL as polka does", () => {
    for (const url of [
      "/",
      "/do?name=bench-1",
      "/do?",
      "/?a=1",
      "/x/y?a=1&a=2",
      "/x?a=%41#frag",
      "/x#a?b",
      "/do?name=a&limit=5",
    ]) {
      const ours = parseUrl({ url } as IncomingMessage);
      const polka = polkaParse({ url } as IncomingMessage)!;
      assert.deepEqual({ ...ours, query: plain(ours.query) }, { ...polka, query: plain(polka.query) }, url);
    }
  });
});
