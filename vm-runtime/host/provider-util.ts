// Small pieces both providers share: the per-provider instance files (one runtime bundle for
// every image; an image source bundled once into a module, an `.mjs` module used as it is),
// waiting helpers and instance-id naming.
import { mkdir, mkdtemp } from "node:fs/promises";
import { createHash } from "node:crypto";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { bundleRuntime, writeImageModule } from "./bundle.ts";
import { MicrovmProviderError } from "./provider.ts";

/** What an instance runs: the runtime bundle, which imports the image module. */
export interface InstanceFiles {
  readonly runtime: string;
  readonly module: string;
}

export interface BundleCache {
  /** The provider's work directory (made on first call). */
  workDir(): Promise<string>;
  /**
   * The files of `image`: an `.mjs` path is a self-contained module (what `createImage`
   * stores) used as it is; any other source is bundled once. A failed build is tried again.
   */
  bundle(image: string): Promise<InstanceFiles>;
  /** The runtime bundle alone (the same for every image). */
  runtime(): Promise<string>;
  /** Bundles the runtime and these now, one at a time; rejects with the first failure after trying each. */
  prepare(images: readonly string[]): Promise<void>;
  /** No more bundles; resolves once those being written are done. */
  close(): Promise<void>;
  /** The work directory when one was made. */
  readonly madeDir: Promise<string> | undefined;
}

/** A cache whose work directory is `<parent>/<prefix>XXXXXX` (parent default: the OS tmpdir). */
export function bundleCache(parent: string | undefined, prefix: string): BundleCache {
  const modules = new Map<string, Promise<string>>();
  let runtime: Promise<string> | undefined;
  let closed = false;
  let dir: Promise<string> | undefined;
  const workDir = () =>
    (dir ??= parent
      ? mkdir(parent, { recursive: true }).then(() => mkdtemp(join(parent, prefix)))
      : mkdtemp(join(tmpdir(), prefix)));
  const inWorkDir = <T>(make: (dir: string) => Promise<T>) =>
    workDir().then((made) => {
      if (closed) throw new MicrovmProviderError("provider is closed");
      return make(join(made, "images"));
    });
  const retried = <T>(promise: Promise<T>, drop: () => void) => {
    promise.catch(drop);
    return promise;
  };
  const runtimeFile = () => (runtime ??= retried(inWorkDir(bundleRuntime), () => (runtime = undefined)));
  const moduleFile = (image: string): Promise<string> => {
    if (image.endsWith(".mjs")) return Promise.resolve(resolve(image));
    let made = modules.get(image);
    if (!made) {
      const name = createHash("sha256").update(resolve(image)).digest("hex").slice(0, 16);
      made = retried(
        inWorkDir(async (out) => {
          await mkdir(out, { recursive: true });
          return writeImageModule(image, join(out, `module-${name}.mjs`));
        }),
        () => modules.delete(image),
      );
      modules.set(image, made);
    }
    return made;
  };
  const bundle = async (image: string): Promise<InstanceFiles> => {
    const [runtimePath, module] = await Promise.all([runtimeFile(), moduleFile(image)]);
    return { runtime: runtimePath, module };
  };
  return {
    workDir,
    bundle,
    runtime: runtimeFile,
    async prepare(images) {
      let failure: unknown;
      await runtimeFile().catch((error: unknown) => (failure ??= error));
      for (const image of images) {
        if (closed) return;
        await bundle(image).catch((error: unknown) => (failure ??= error));
      }
      if (failure !== undefined) throw failure;
    },
    async close() {
      closed = true;
      // A bundle still being written would recreate the work directory after its removal.
      await Promise.allSettled([runtime, ...modules.values()]);
    },
    get madeDir() {
      return dir;
    },
  };
}
export async function pollUntil(condition: () => boolean, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) return false;
    await new Promise((resolve) => setTimeout(resolve, 2));
  }
  return true;
}

/** True when `promise` settles within `timeoutMs`. */
export async function within(promise: Promise<unknown>, timeoutMs: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), timeoutMs)));
  try {
    return await Promise.race([promise.then(() => true as const), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** The id itself when it is a safe file or cgroup name, else "instance". */
export function safeName(id: string): string {
  return /^[A-Za-z0-9._-]{1,64}$/.test(id) ? id : "instance";
}
