// The four image operations as handlers of one host: create checks the module in a sandboxed
// instance of this host, then stores it; get, list and delete read and write the image
// buckets. Every image belongs to its creator; the built-in ones are seen by everyone.
import { pathToFileURL } from "node:url";
import { ImageInUse, ImageNotFound, type imageApi } from "../../schemas/index.ts";
import { describeMethods } from "../runtime/server.ts";
import { isImage } from "../image.ts";
import { bundleImageModule } from "../client/image-module.ts";
import type { MicrovmProvider } from "../host/provider.ts";
import { log } from "../../platform/index.ts";
import type { Handler } from "../../actors/serve.ts";
import { checkImageModule, checkModuleSize } from "./check.ts";
import {
  BUILTIN_OWNER,
  imageView,
  parseImageIdentifier,
  type HeldModule,
  type ImageRecord,
  type ImageStore,
} from "./store.ts";
import { isTerminal, ownerOf, type MicrovmStore } from "../service/store.ts";

type Api = typeof imageApi;
export type ImageHandlers = { [K in keyof Api]: Handler<Api[K]> };

export interface ImageDeps {
  readonly images: ImageStore;
  readonly store: MicrovmStore;
  readonly provider: MicrovmProvider;
  /** Reserves the live-instance slot the check's instance takes (429 when the host or the principal has none left). */
  readonly reserveSlot: (principal: string) => Promise<() => void>;
}

export function imageHandlers(deps: ImageDeps): ImageHandlers {
  return {
    async createImage({ name, module }, context) {
      const principal = context.principal;
      const bytes = Buffer.from(module, "utf8");
      checkModuleSize(bytes);
      const staged = await checkStaged(deps, principal, bytes);
      try {
        const record: ImageRecord = {
          name,
          digest: staged.digest,
          methods: staged.methods,
          createdAt: new Date().toISOString(),
          owner: principal,
        };
        return imageView(await deps.images.register(record, bytes));
      } finally {
        staged.release();
      }
    },
    async getImage({ name }, context) {
      const record = await deps.images.latest(context.principal, name);
      if (!record) throw ImageNotFound.make({ imageIdentifier: name });
      return imageView(record);
    },
    async listImages(_input, context) {
      return { items: (await deps.images.list(context.principal)).map(imageView) };
    },
    async deleteImage({ name }, context) {
      const principal = context.principal;
      const record = await deps.images.latest(principal, name);
      if (!record) throw ImageNotFound.make({ imageIdentifier: name });
      if (record.owner === BUILTIN_OWNER)
        throw ImageInUse.make({ name, message: `${name} is a built-in image and cannot be deleted` });
      // Under the name's lock: a launch that wrote its record before sees the lock and gives way.
      await deps.images.delete(principal, name, async () => {
        const running = (await deps.store.list()).filter(
          ({ record: instance }) =>
            ownerOf(instance) === principal &&
            !isTerminal(instance.state) &&
            parseImageIdentifier(instance.imageIdentifier)?.name === name,
        );
        if (running.length === 0) return;
        const ids = running.map(({ record: instance }) => instance.microvmId);
        throw ImageInUse.make({
          name,
          message: `live instances run ${name}: ${ids.slice(0, 5).join(", ")}; terminate them first`,
        });
      });
      return { name };
    },
  };
}

/**
 * Stages the module in this host's cache and checks it in an instance that takes one of the
 * host's and the principal's live-instance slots while it runs; resolves with the module held
 * (release it once stored) and its methods. A module that fails is removed from the cache.
 */
async function checkStaged(deps: ImageDeps, principal: string, bytes: Uint8Array) {
  const releaseSlot = await deps.reserveSlot(principal);
  let staged: HeldModule | undefined;
  try {
    staged = await deps.images.stage(bytes);
    return { ...staged, methods: await checkImageModule(staged.path, deps.provider) };
  } catch (err) {
    staged?.release();
    if (staged) deps.images.modules.drop(staged.digest);
    throw err;
  } finally {
    releaseSlot();
  }
}

/**
 * Registers the built-in images (name → module path, our own code) as `BUILTIN_OWNER`'s:
 * bundled to one module each; their methods are read by importing that module here (trusted
 * code; the bundle, not the source, so the host runs it on plain node as `npm start` does).
 */
export async function registerBuiltinImages(
  images: ImageStore,
  modules: Readonly<Record<string, string>>,
): Promise<void> {
  for (const [name, path] of Object.entries(modules)) {
    const bytes = Buffer.from(await bundleImageModule(path), "utf8");
    const staged = await images.stage(bytes);
    try {
      const imported = (await import(pathToFileURL(staged.path).href)) as { default?: unknown };
      if (!isImage(imported.default)) throw new TypeError(`built-in image ${name} has no defineImage default export`);
      const record: ImageRecord = {
        name,
        digest: staged.digest,
        methods: describeMethods(imported.default),
        createdAt: new Date().toISOString(),
        owner: BUILTIN_OWNER,
      };
      const stored = await images.register(record, bytes);
      log.info({ image: name, digest: stored.digest }, "built-in image registered");
    } finally {
      staged.release();
    }
  }
}
