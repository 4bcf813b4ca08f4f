// What taskctl takes from the platform layer, loaded on use: the package version (--version)
// and NATS credentials (--nats). Only these names, so the CLI's bundle leaves out the rest.
export { authOptions, clientCredentials, packageVersion } from "../platform/index.ts";
