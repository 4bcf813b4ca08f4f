// The gateway's query parsing (gateway/query.ts) answers what polka's, `querystring.parse`,
// answers: the same keys in the same order with the same values, for every query, including
// those it hands to querystring (escapes, `+`, repeated keys, `__proto__`).
import assert from "node:assert/strict";
import type { IncomingMessage } from "node:http";
import { parse as parseQueryString } from "node:querystring";
import { describe, it } from "node:test";
import { parse as polkaParse } from "@polka/url";
import { parseQuery, parseUrl } from "../gateway/query.ts";

/** A plain copy, keys in order: querystring's object has a null prototype. */
const plain = (query: object | undefined) => (query === undefined ? undefined : Object.entries(query));

function randomQuery(random: () => number): string {
  const alphabet = ["a", "b", "z", "0", "_", "-", ".", "~", "=", "&", "&", "=", "%", "%41", "%zz", "+", " ", "#", "é"];
  const parts = ["__proto__", "constructor", "name", "limit"];
  let query = "";
  const length = Math.floor(random() * 24);
  for (let i = 0; i < length; i++) {
    query +=
      random() < 0.1 ? parts[Math.floor(random() * parts.length)] : alphabet[Math.floor(random() * alphabet.length)];
  }
  return query;
}

/** A seeded generator, so a failure names a query that fails again. */
function mulberry32(seed: number) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

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

  it("answers querystring.parse's pairs for 20,000 random queries", () => {
    const random = mulberry32(28);
    for (let i = 0; i < 20_000; i++) {
      const query = randomQuery(random);
      assert.deepEqual(plain(parseQuery(query)), plain(parseQueryString(query)), JSON.stringify(query));
    }
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
