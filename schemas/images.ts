// Image operation contracts: images users register (one self-contained ES module whose
// default export is a `defineImage` result), served over NATS (`microvms.images.<op>`) and as
// REST under `/2025-09-09/images` on the microVM API.
import { Type } from "@sinclair/typebox";
import {
  ImageInUse,
  ImageNotFound,
  ImageQuotaExceeded,
  InvalidImage,
  MicrovmLimitExceeded,
  MicrovmQuotaExceeded,
} from "./errors.ts";
import { stateless } from "./placement.ts";
import type { Operation } from "./types.ts";

/**
 * Largest module accepted, in UTF-8 bytes: 4 MiB, so the request carrying it as a JSON string
 * (escapes grow it) stays below the 8 MiB NATS max_payload of the private server.
 */
export const MAX_IMAGE_MODULE_BYTES = 4 * 1024 * 1024;

/** An image name: 1-64 of `[a-z0-9-]`. */
export const ImageName = Type.String({ pattern: "^[a-z0-9-]{1,64}$", minLength: 1, maxLength: 64 });

/** One RPC method of an image: its name and, when declared, its argument schema. */
export const ImageMethod = Type.Object({
  name: Type.String(),
  args: Type.Optional(Type.Unknown({ description: "JSON Schema of the positional argument array" })),
});

/** An image as the image operations answer it. */
export const ImageInfo = Type.Object({
  name: Type.String(),
  digest: Type.String({ description: "sha256:<hex> of the module; `name@digest` pins this version" }),
  methods: Type.Array(ImageMethod),
  createdAt: Type.String({ format: "date-time" }),
});

const ImageParams = Type.Object({ name: ImageName }, { additionalProperties: false });

const base = "/2025-09-09/images";

export const createImage = {
  name: "createImage",
  api: "microvm",
  http: { method: "POST", path: base },
  subject: "microvms.images.create",
  placement: stateless,
  payload: Type.Object(
    {
      name: ImageName,
      module: Type.String({
        minLength: 1,
        description: "one self-contained ES module; default export: defineImage(...)",
      }),
    },
    { additionalProperties: false },
  ),
  success: ImageInfo,
  /** 429s: checking the module takes one live-instance slot of the host and of the caller's quota. */
  errors: [InvalidImage, MicrovmLimitExceeded, MicrovmQuotaExceeded, ImageQuotaExceeded],
  /** The module may be up to `MAX_IMAGE_MODULE_BYTES`; the body as large as NATS carries. */
  maxBodyBytes: Number.MAX_SAFE_INTEGER,
  /** The host starts the module in a sandboxed instance to check it. */
  timeoutMs: 30_000,
  summary: "Register an image (a new digest when the module changed)",
} as const satisfies Operation;

export const getImage = {
  name: "getImage",
  api: "microvm",
  http: { method: "GET", path: `${base}/:name` },
  subject: "microvms.images.get",
  placement: stateless,
  params: ImageParams,
  success: ImageInfo,
  errors: [ImageNotFound],
  summary: "Describe an image: its latest digest and methods",
} as const satisfies Operation;

export const listImages = {
  name: "listImages",
  api: "microvm",
  http: { method: "GET", path: base },
  subject: "microvms.images.list",
  placement: stateless,
  success: Type.Object({ items: Type.Array(ImageInfo) }),
  errors: [],
  summary: "List your images and the built-in ones",
} as const satisfies Operation;

export const deleteImage = {
  name: "deleteImage",
  api: "microvm",
  http: { method: "DELETE", path: `${base}/:name` },
  subject: "microvms.images.delete",
  placement: stateless,
  params: ImageParams,
  success: Type.Object({ name: Type.String() }),
  errors: [ImageNotFound, ImageInUse],
  summary: "Delete an image and its versions (409 while a live instance runs it)",
} as const satisfies Operation;

export const imageApi = { createImage, getImage, listImages, deleteImage } as const;
