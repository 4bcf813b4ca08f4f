// Public entry of the cluster tooling: the scale-out topology as local processes
// (`npm run cluster`), its NATS nodes and service roles, the node child processes they run as,
// for scripts, tests and the bench.
export {
  defaultTopology,
  gatewayPorts,
  startCluster,
  topologyFromEnv,
  type GatewaySpec,
  type RunningCluster,
  type StartClusterOptions,
  type Topology,
} from "./topology.ts";
export {
  bucketLeader,
  clusterConfig,
  leadersBack,
  replicasCurrent,
  startNatsCluster,
  waitForJetStream,
  type NatsCluster,
  type NatsClusterOptions,
  type NatsNode,
} from "./nats-cluster.ts";
export { composeAuthorization, passwordVariable, writeComposeAuthorization } from "./compose-auth.ts";
export {
  belongsTo,
  recordPids,
  RUN_MARKER,
  signal,
  startRole,
  stopLeftovers,
  type GatewayPorts,
  type Role,
  type RoleProcess,
  type RoleProcessOptions,
  type RoleSet,
} from "./roles.ts";
export { startNodeProcess, type NodeProcess, type NodeProcessOptions } from "./process.ts";
