// Public entry of the contracts: operations, schemas, errors, validators and escaping.
export * from "./errors.ts";
export * from "./types.ts";
export * from "./placement.ts";
export * from "./tasks.ts";
export * from "./jobs.ts";
export * from "./microvms.ts";
export * from "./logs.ts";
export * from "./images.ts";
export * from "./objects.ts";
export * from "./services.ts";
export * from "./escape.ts";
export * from "./validate.ts";
export * from "./counts.ts";
export * from "./subjects.ts";
export * from "./replies.ts";
export * from "./answers.ts";
export * from "./openapi.ts";
