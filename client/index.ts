// Typed clients derived from the contracts, over HTTP or straight over NATS. A method
// resolves to the success value or rejects with a `ClientError` whose `error._tag` says why.
export { httpClient, type HttpClientOptions } from "./http-client.ts";
export { natsClient, type NatsClientOptions } from "./nats-client.ts";
export type { CallOptions, Client, ClientOptions } from "./typed-client.ts";
export { watchJobs, type JobCreated } from "./watch.ts";
export { connectToService, serviceNats, type ServiceConnectOptions } from "./connect.ts";
export {
  launchMicrovm,
  MicrovmLaunchError,
  type LaunchOptions,
  type LaunchWork,
  type LaunchedMicrovm,
  type MicrovmApiClient,
} from "./launch.ts";

export { ClientError, type ClientErrorBody, type TransportErrorTag } from "./client-error.ts";
