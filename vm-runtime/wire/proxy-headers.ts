// Request headers the instance proxy reads (contract) and never forwards to the instance.

/** The signed token opening an instance. */
export const PROXY_AUTH_HEADER = "X-aws-proxy-auth";
/** The instance port to reach; 8080 (the runtime) when absent. */
export const PROXY_PORT_HEADER = "X-aws-proxy-port";
