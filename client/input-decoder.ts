// The contracts' input validator, imported by the typed client only when it first checks an
// input: a client that leaves checking to the service (taskctl) never loads Ajv.
export { compileDecoder, inputSchema } from "../schemas/index.ts";
