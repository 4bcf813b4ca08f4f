// What taskctl takes from the platform layer, loaded on use: the package version (--version),
// a NATS connection with its credentials (--nats) and new API keys (apikey create). Only these
// names, so the CLI's bundle leaves out the rest. `connect` is re-exported here, not imported
// where it is used: in a chunk of its own, a CommonJS package's dynamic import has only a
// default export.
export { connect } from "@nats-io/transport-node";
export { authOptions, findClientCredentials, newApiKey, packageVersion } from "../platform/index.ts";
