// `GET /openapi.json` (derived from the contracts) and an API reference page at `/docs`,
// rendered by Swagger UI from the installed `swagger-ui-dist` package: no CDN, works offline,
// and its online validator (an image from validator.swagger.io in the standalone layout) is off.
import { readFileSync } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { openApiDocument, type OpenApiInfo, type Operation } from "../schemas/index.ts";
import { sendJson } from "./respond.ts";

const assetsDir = dirname(createRequire(import.meta.url).resolve("swagger-ui-dist/package.json"));
const assetTypes: Record<string, string> = {
  "swagger-ui.css": "text/css; charset=utf-8",
  "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
  "favicon-32x32.png": "image/png",
};
const assets = new Map<string, Buffer>();

function asset(name: string): Buffer {
  let data = assets.get(name);
  if (!data) assets.set(name, (data = readFileSync(join(assetsDir, name))));
  return data;
}

function page(title: string): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${title}</title>
<link rel="stylesheet" href="/docs/swagger-ui.css"><link rel="icon" href="/docs/favicon-32x32.png"></head>
<body><div id="swagger-ui"></div><script src="/docs/swagger-ui-bundle.js"></script>
<script>window.ui = SwaggerUIBundle({ url: "/openapi.json", dom_id: "#swagger-ui", persistAuthorization: true, validatorUrl: null });</script>
</body></html>`;
}

/** A request listener step for the docs paths (returns true when it answered). */
export function docsResponder(operations: readonly Operation[], info: OpenApiInfo, { apiKeys = false } = {}) {
  const document = JSON.stringify(openApiDocument(operations, info, { apiKeys }));
  const html = page(info.title.replace(/[<>&"]/g, ""));
  return function answerDocs(req: IncomingMessage, res: ServerResponse): boolean {
    if (req.method !== "GET") return false;
    const path = req.url?.split("?", 1)[0] ?? "";
    if (path === "/openapi.json") {
      sendJson(res, 200, document);
      return true;
    }
    if (path === "/docs" || path === "/docs/") {
      res.writeHead(200, { "content-type": "text/html; charset=utf-8" }).end(html);
      return true;
    }
    const name = path.startsWith("/docs/") ? path.slice("/docs/".length) : "";
    if (!Object.hasOwn(assetTypes, name)) return false;
    res.writeHead(200, { "content-type": assetTypes[name]!, "cache-control": "public, max-age=3600" }).end(asset(name));
    return true;
  };
}
