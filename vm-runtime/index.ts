// Public entry of vm-runtime (host side): image definition, the runtime, providers, auth tokens,
// the proxy, the lifecycle machine, the managed instance and the client stub. Image modules
// import `image.ts` instead, so their bundle carries no host code.
import type { ImageShape } from "./image.ts";
import type sandboxImage from "./images/sandbox.ts";

export { defineImage, method, isImage, argumentsSchema, IMAGE_KIND } from "./image.ts";
export type { Image, ImageDefinition, ImageShape, MethodDefinition, MethodMap, FetchHandler, JsonSchema, RemoteResult } from "./image.ts";

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
} from "./rpc-wire.ts";
export type { RpcErrorBody, RpcErrorEnvelope, RpcStreamErrorLine } from "./rpc-wire.ts";
export type { RpcIssue, RuntimeLog } from "./rpc-handler.ts";

export { createRuntimeServer, DEFAULT_RPC_BODY_LIMIT } from "./runtime.ts";
export type { RuntimeOptions } from "./runtime.ts";
export { bootRuntime, parseReadyLine, READY_KEY } from "./runtime-boot.ts";
export type { BootOptions } from "./runtime-boot.ts";
export { bundleImage } from "./bundle.ts";

export { RUNTIME_PORT, MicrovmProviderError, realPort } from "./provider.ts";
export type { MicrovmProvider, MicrovmHandle, MicrovmSpec } from "./provider.ts";
export { createProcessProvider, INSTANCE_MARKER } from "./process-provider.ts";
export type { ProcessProvider, ProcessProviderOptions } from "./process-provider.ts";
export type { OutputSink } from "./process-io.ts";
export { readProcStat, isProcessAlive, residentBytes, childProcessesWith } from "./proc.ts";
export type { ProcStat } from "./proc.ts";

export { PROXY_AUTH_HEADER, PROXY_PORT_HEADER } from "./proxy-headers.ts";
export { createAuthToken, verifyAuthToken, portAllowed, isAllowedPort, InvalidTokenRequest } from "./token.ts";
export type { AllowedPort, TokenClaims, TokenKey, TokenRejection, TokenRequest, TokenVerdict } from "./token.ts";
export { createInstanceProxy } from "./proxy.ts";
export type { InstanceProxy, InstanceProxyOptions, ProxyHooks } from "./proxy.ts";
export { proxyAnswers } from "./proxy-errors.ts";
export type { ProxyAnswer, BadGatewayReason } from "./proxy-errors.ts";

export { MICROVM_STATES } from "./states.ts";
export type { MicrovmState, IdlePolicy } from "./states.ts";
export { lifecycleMachine } from "./lifecycle.ts";
export { DEFAULT_TIMEOUTS, remainingMs } from "./lifecycle-types.ts";
export type { LifecycleContext, LifecycleEvent, LifecycleInput, LifecycleTimeouts, StartInput, HandleInput, TerminateInput } from "./lifecycle-types.ts";
export { microvmState, isResuming, canAccept, restoreLifecycle } from "./lifecycle-snapshot.ts";
export type { LifecycleActor, LifecycleMachine, LifecycleSnapshot } from "./lifecycle-snapshot.ts";
export { launchMicrovmInstance } from "./instance.ts";
export type { MicrovmInstance, MicrovmInstanceOptions, MicrovmDescription } from "./instance.ts";

export { connectMicrovm, connectImage, microvmConnection } from "./client.ts";
export type { ConnectOptions, MicrovmStub, MicrovmConnection, AnyShape } from "./client.ts";
export { MicrovmRpcError, isRpcError } from "./rpc-error.ts";
export type { RpcFailureSource } from "./rpc-error.ts";

export { builtinImages } from "./images/paths.ts";

/** The client shape of the example `sandbox` image. */
export type SandboxShape = ImageShape<typeof sandboxImage>;
export type { Unlucky, CountInterrupted } from "./images/sandbox.ts";
