// `npm start`: builds the bundles, then runs the service in this same process, so the pid npm
// starts (package.json execs this script) is the service's: SIGTERM or SIGINT to `npm start`
// reaches main's handlers, which stop everything it started (no shell in between to orphan it).
import { buildAll } from "./build.mjs";

await buildAll();
await import("../dist/main.mjs");
