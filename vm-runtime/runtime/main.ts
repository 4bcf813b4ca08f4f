// Command-line entry for running an image directly (development, no sandbox):
//   node --import tsx vm-runtime/runtime/main.ts <image-module> [port]   (port also from $PORT)
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { isImage } from "../image.ts";
import { bootRuntime } from "./boot.ts";

const [modulePath, portArgument] = process.argv.slice(2);
if (!modulePath) {
  process.stderr.write("usage: runtime/main.ts <image-module> [port]\n");
  process.exit(2);
}
const loaded = (await import(pathToFileURL(resolve(modulePath)).href)) as { default?: unknown };
if (!isImage(loaded.default)) {
  process.stderr.write(`${modulePath}: the default export is not an image (use defineImage)\n`);
  process.exit(2);
}
await bootRuntime(loaded.default, { port: Number(portArgument ?? process.env.PORT ?? 0) });
