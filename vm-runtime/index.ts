// Public entry of vm-runtime: the image definition, wire/ (RPC and proxy formats, tokens),
// runtime/ (what runs inside an instance), host/ (providers, sandbox, proxy, processes),
// lifecycle/ (the machine and the managed instance) and client/ (the typed stub). Image modules
// import `image.ts` instead, so their bundle carries no host code.
import type { ImageShape } from "./image.ts";
import type sandboxImage from "./images/sandbox.ts";

export { defineImage, method, isImage, argumentsSchema, IMAGE_KIND } from "./image.ts";
export type {
  Image,
  ImageDefinition,
  ImageShape,
  MethodDefinition,
  MethodMap,
  FetchHandler,
  JsonSchema,
  RemoteResult,
} from "./image.ts";

export {
  RPC_PREFIX,
  RPC_HEALTH_PATH,
  RPC_ERROR_TAG,
  RPC_STREAM_ERROR_TAG,
  RPC_STREAM_HEADER,
  INSTANCE_SECRET_HEADER,
  rpcPath,
  encodeThrown,
  declaredStatus,
} from "./wire/rpc.ts";
export type { RpcErrorBody, RpcErrorEnvelope, RpcStreamErrorLine } from "./wire/rpc.ts";
export type { RpcIssue, RuntimeLog } from "./runtime/rpc-handler.ts";

export { createRuntimeServer, DEFAULT_RPC_BODY_LIMIT, describeMethods } from "./runtime/server.ts";
export type { MethodDescription, RuntimeOptions } from "./runtime/server.ts";
export { bootRuntime, parseReadyLine, READY_KEY } from "./runtime/boot.ts";
export type { BootOptions } from "./runtime/boot.ts";
export { bundleImage, bundleImageModule, IMAGE_MODULE_ENV } from "./host/bundle.ts";

export {
  RUNTIME_PORT,
  MicrovmProviderError,
  MicrovmHostError,
  MicrovmImageTimeout,
  MicrovmStartFailed,
  hostFailureOf,
  imageTimedOut,
  startFailureOf,
  realPort,
  upstreamOf,
} from "./host/provider.ts";
export type {
  InstanceExit,
  MicrovmProvider,
  MicrovmHandle,
  MicrovmSpec,
  ReclaimedInstance,
  RestoreSpec,
  Upstream,
} from "./host/provider.ts";
export { errorLineOf, exitText, withoutPaths } from "./host/start-failure.ts";
export { createSandboxProvider } from "./host/sandbox-provider.ts";
export { createGvisorProvider, checkGvisor, findRunsc, GVISOR_MARKER } from "./host/gvisor-provider.ts";
export type { GvisorProvider, GvisorProviderOptions } from "./host/gvisor-provider.ts";
export { WARM_PREFIX } from "./host/isolated-boot.ts";
export type { IsolatedProvider, IsolatedProviderOptions } from "./host/isolated-provider.ts";
export { permissionFlag, permissionGrants } from "./host/node-args.ts";
export type { InstanceNode } from "./host/node-args.ts";
export { SANDBOX_MARKER } from "./host/sandbox-command.ts";
export type { SandboxProvider, SandboxProviderOptions } from "./host/sandbox-provider.ts";
export { checkSandbox } from "./host/sandbox-check.ts";
export { cgroupVersion, V1_CONTROLLERS, v1Hierarchies } from "./host/cgroups.ts";
export { instanceProcessesUnder } from "./host/process-reclaim.ts";
export { boundedLines } from "./host/output-lines.ts";
export { createProcessProvider, dataLimitMiB, INSTANCE_MARKER } from "./host/process-provider.ts";
export type { ProcessProvider, ProcessProviderOptions } from "./host/process-provider.ts";
export type { OutputSink } from "./host/process-io.ts";
export { readProcStat, isProcessAlive, residentBytes, childProcessesWith } from "./host/proc.ts";
export type { ProcStat } from "./host/proc.ts";

export { PROXY_AUTH_HEADER, PROXY_PORT_HEADER } from "./wire/proxy-headers.ts";
export {
  createAuthToken,
  verifyAuthToken,
  portAllowed,
  isAllowedPort,
  InvalidTokenRequest,
  MAX_TOKEN_CLOCK_SKEW_MS,
  MAX_TOKEN_LIFETIME_MS,
  tokenKeyId,
} from "./wire/token.ts";
export type {
  SecretKey,
  TokenClaims,
  TokenKey,
  TokenKeyring,
  TokenRejection,
  TokenRequest,
  TokenVerdict,
} from "./wire/token.ts";
export { createInstanceProxy } from "./host/proxy.ts";
export type { InstanceProxy, InstanceProxyOptions, ProxyHooks } from "./host/proxy.ts";
export type { RevokedCheck } from "./host/token-cache.ts";
export { proxyAnswers } from "./wire/proxy-answers.ts";
export type { ProxyAnswer, BadGatewayReason } from "./wire/proxy-answers.ts";

/** The contract types vm-runtime's signatures use, defined once in schemas/. */
export type { AllowedPort, IdlePolicy, MicrovmState } from "../schemas/index.ts";
export { lifecycleMachine } from "./lifecycle/machine.ts";
export { DEFAULT_TIMEOUTS, SuspendRefused } from "./lifecycle/types.ts";
export type {
  LifecycleContext,
  LifecycleEvent,
  LifecycleInput,
  LifecycleTimeouts,
  StartInput,
  HandleInput,
  TerminateInput,
  RestoreInput,
  SavedSnapshot,
} from "./lifecycle/types.ts";
export { microvmState, canAccept } from "./lifecycle/snapshot.ts";
export type { LifecycleActor, LifecycleMachine, LifecycleSnapshot } from "./lifecycle/snapshot.ts";
export { launchMicrovmInstance } from "./lifecycle/instance.ts";
export type { InstanceSnapshots, MicrovmInstance, MicrovmInstanceOptions } from "./lifecycle/instance.ts";

export { connectMicrovm, connectImage, microvmConnection } from "./client/stub.ts";
export type { ConnectOptions, MicrovmStub, MicrovmConnection, AnyShape } from "./client/stub.ts";
export { MicrovmRpcError, isRpcError } from "./wire/rpc-error.ts";
export type { RpcFailureSource } from "./wire/rpc-error.ts";

export { builtinImages } from "./images/paths.ts";

/** The client shape of the example `sandbox` image. */
export type SandboxShape = ImageShape<typeof sandboxImage>;
export type { Unlucky, CountInterrupted } from "./images/sandbox.ts";
