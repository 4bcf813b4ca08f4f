// The escapes of sandbox-escapes.test.ts, per isolating provider with Node's permission model
// off: each wall alone.
process.env.ESCAPE_WALL_ALONE = "1";
await import("./sandbox-escapes.test.ts");
