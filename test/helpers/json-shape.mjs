// node json-shape.mjs <sample, base64> <where>: passes stdin through, and exits 1 unless it is JSON
// of the sample's shape: objects with the same keys, values of the same types, each array
// element shaped as the sample array's first. Strings' and numbers' values are not compared.
import { readFileSync } from "node:fs";

const [sampleBase64, where] = process.argv.slice(2);
const sample = JSON.parse(Buffer.from(sampleBase64, "base64").toString("utf8"));
const text = readFileSync(0, "utf8");
process.stdout.write(text);

const kind = (value) => (value === null ? "null" : Array.isArray(value) ? "array" : typeof value);

/** Where `value` leaves the shape of `shape`, or undefined. */
function mismatch(shape, value, path) {
  if (kind(shape) !== kind(value)) return `${path} is ${kind(value)} (${JSON.stringify(value)}), not ${kind(shape)}`;
  if (kind(shape) === "array") {
    if (shape.length === 0) return undefined;
    for (const [i, element] of value.entries()) {
      const found = mismatch(shape[0], element, `${path}[${i}]`);
      if (found) return found;
    }
  }
  if (kind(shape) === "object") {
    const keys = (object) => Object.keys(object).sort().join(", ");
    if (keys(shape) !== keys(value)) return `${path} has the keys ${keys(value)}, not ${keys(shape)}`;
    for (const key of Object.keys(shape)) {
      const found = mismatch(shape[key], value[key], `${path}.${key}`);
      if (found) return found;
    }
  }
  return undefined;
}

let value;
try {
  value = JSON.parse(text);
} catch {
  console.error(`${where}: the output is not the JSON its comment shows: ${JSON.stringify(text.slice(0, 500))}`);
  process.exit(1);
}
const found = mismatch(sample, value, "output");
if (found) {
  console.error(`${where}: the output is not of the shape its comment shows: ${found}`);
  process.exit(1);
}
