#!/usr/bin/env node
// `taskctl` (package.json "bin"): runs the TypeScript CLI in client/cli.ts through tsx, so
// `npx taskctl ...` works in this repository without a build step.
import { register } from "tsx/esm/api";

register();
const { main } = await import("./cli.ts");
await main(process.argv.slice(2));
