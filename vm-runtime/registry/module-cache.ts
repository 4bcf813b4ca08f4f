// This host's cache of image modules on disk (`<dir>/<hex>.mjs`, one per digest), bounded in
// bytes: modules no live instance uses are evicted least recently used first; a module in use
// (pinned by a launch, an instance or an image check) stays until its last user lets go.
import { rmSync } from "node:fs";
import { readdir, stat } from "node:fs/promises";
import { join } from "node:path";

/** Default bound of the cache (`MICROVM_IMAGE_CACHE_MIB`): 64 modules of the 4 MiB maximum. */
export const DEFAULT_IMAGE_CACHE_MIB = 256;

const hexOf = (digest: string) => digest.slice("sha256:".length);

export class ModuleCache {
  /** Unpinned modules, least recently used first (a Map keeps insertion order). */
  readonly #idle = new Map<string, number>();
  /** Modules in use: their size and how many users hold them. */
  readonly #pinned = new Map<string, { size: number; users: number }>();
  #bytes = 0;

  private constructor(
    readonly dir: string,
    readonly maxBytes: number,
  ) {}

  /** Binds to `dir`, counting the modules an earlier run left there (oldest first). */
  static async open(dir: string, maxBytes: number): Promise<ModuleCache> {
    const cache = new ModuleCache(dir, maxBytes);
    const files = (await readdir(dir)).filter((file) => /^[0-9a-f]{64}\.mjs$/.test(file));
    const found = await Promise.all(
      files.map(async (file) => ({ file, info: await stat(join(dir, file)).catch(() => undefined) })),
    );
    for (const { file, info } of found.sort((a, b) => (a.info?.mtimeMs ?? 0) - (b.info?.mtimeMs ?? 0))) {
      if (!info) continue;
      cache.#idle.set(`sha256:${file.slice(0, -4)}`, info.size);
      cache.#bytes += info.size;
    }
    cache.#evict();
    return cache;
  }

  path(digest: string): string {
    return join(this.dir, `${hexOf(digest)}.mjs`);
  }

  /** Bytes held on disk, pinned ones included. */
  get bytes(): number {
    return this.#bytes;
  }

  /** Digests held, least recently used first, pinned ones last. */
  digests(): string[] {
    return [...this.#idle.keys(), ...this.#pinned.keys()];
  }

  has(digest: string): boolean {
    return this.#idle.has(digest) || this.#pinned.has(digest);
  }

  /**
   * Holds `digest` in the cache until the returned release is called (once is enough):
   * a module being fetched, launched, run or checked is never evicted.
   */
  pin(digest: string): () => void {
    const pinned = this.#pinned.get(digest);
    if (pinned) pinned.users += 1;
    else {
      const size = this.#idle.get(digest);
      this.#idle.delete(digest);
      this.#pinned.set(digest, { size: size ?? 0, users: 1 });
    }
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.#unpin(digest);
    };
  }

  /** Records the module of a pinned `digest` as written, `size` bytes; evicts to stay in bound. */
  added(digest: string, size: number): void {
    const pinned = this.#pinned.get(digest);
    if (!pinned) throw new Error(`module ${digest} was written without being pinned`);
    this.#bytes += size - pinned.size;
    pinned.size = size;
    this.#evict();
  }

  /** Marks `digest` as just used (a cache hit). */
  touch(digest: string): void {
    const size = this.#idle.get(digest);
    if (size === undefined) return;
    this.#idle.delete(digest);
    this.#idle.set(digest, size);
  }

  /** Removes the module of `digest` now (a module that failed its check); pinned ones are kept. */
  drop(digest: string): void {
    if (this.#pinned.has(digest)) return;
    this.#remove(digest);
  }

  #unpin(digest: string): void {
    const pinned = this.#pinned.get(digest);
    if (!pinned) return;
    if (--pinned.users > 0) return;
    this.#pinned.delete(digest);
    // A module never written (its fetch failed) is not cached.
    if (pinned.size > 0) this.#idle.set(digest, pinned.size);
    this.#evict();
  }

  /**
   * Least recently used idle modules go until the cache fits (pinned ones may exceed it
   * alone). Synchronous, so no pin can come between the choice and the unlink.
   */
  #evict(): void {
    for (const digest of this.#idle.keys()) {
      if (this.#bytes <= this.maxBytes) return;
      this.#remove(digest);
    }
  }

  #remove(digest: string): void {
    const size = this.#idle.get(digest);
    if (size === undefined) return;
    this.#idle.delete(digest);
    this.#bytes -= size;
    rmSync(this.path(digest), { force: true });
  }
}
