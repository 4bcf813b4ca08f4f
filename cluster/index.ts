// Public entry of the cluster tooling: the scale-out topology as local processes
// (`npm run cluster`), its NATS nodes and service roles, for scripts and tests.
export { defaultTopology, gatewayPorts, startCluster, topologyFromEnv, type GatewaySpec, type RunningCluster, type StartClusterOptions, type Topology } from "./topology.ts";
export { bucketLeader, clusterConfig, startNatsCluster, waitForJetStream, type NatsCluster, type NatsClusterOptions, type NatsNode } from "./nats-cluster.ts";
export { recordPids, RUN_MARKER, startRole, stopLeftovers, type GatewayPorts, type Role, type RoleProcess, type RoleProcessOptions } from "./roles.ts";
