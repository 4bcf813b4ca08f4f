// What a taskctl command loads when it runs (never for help or a usage error): the API
// contracts and the HTTP client. Only these names are imported, so the CLI's bundle leaves out
// the rest of the contracts (the validators, OpenAPI).
export { DEFAULT_IDLE_POLICY, DEFAULT_RUN_WAIT_SECONDS, jobApi, microvmApi, taskApi } from "../schemas/index.ts";
export { httpClient } from "./http-client.ts";
export { nodeHttpSend } from "./cli-http.ts";
