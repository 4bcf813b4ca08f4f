// What the host sends an instance's runtime on stdin before any image code runs: the access
// secret (one line), then, for a wall started before its image (a warm instance), the
// assignment: one JSON line `{"microvmId","moduleBytes"}` and the module's bytes. Bounded.
// A launch snapshot's template gets `LAUNCH_TEMPLATE_LINE` instead of a secret and an
// assignment without an id; each instance restored from it gets its identity line afterwards.
import type { Readable } from "node:stream";

/** Longest secret or header line accepted. */
const LINE_LIMIT = 1024;
/** Largest module accepted (the image API's limit is 4 MiB). */
export const MODULE_BYTES_LIMIT = 8 * 1024 * 1024;

/** First line to a wall that will become a launch snapshot: no secret, no identity yet. */
export const LAUNCH_TEMPLATE_LINE = JSON.stringify({ launchSnapshot: true });

/** What an instance restored from a launch snapshot is told after the restore. */
export interface Identity {
  readonly microvmId: string;
  readonly secret: string;
}

export interface Assignment {
  readonly microvmId: string;
  readonly module: Buffer;
}

/** Reads lines and byte runs from the start of a stream, keeping what a chunk held beyond them. */
export class StartupInput {
  #buffered = Buffer.alloc(0);
  #ended = false;
  #waiting: (() => void) | undefined;
  readonly #stream: Readable;
  readonly #onData = (chunk: Buffer) => {
    this.#buffered = Buffer.concat([this.#buffered, chunk]);
    this.#wake();
  };
  readonly #onEnd = () => {
    this.#ended = true;
    this.#wake();
  };

  constructor(stream: Readable = process.stdin) {
    this.#stream = stream;
    stream.on("data", this.#onData);
    stream.once("end", this.#onEnd);
    stream.once("error", this.#onEnd);
  }

  /** The next line (without its newline); "" when the stream ends first. */
  async line(): Promise<string> {
    for (;;) {
      const newline = this.#buffered.indexOf(10);
      if (newline !== -1) {
        const line = this.#buffered.subarray(0, newline).toString("utf8");
        this.#buffered = this.#buffered.subarray(newline + 1);
        return line.trim();
      }
      if (this.#buffered.length > LINE_LIMIT) throw new Error("startup line too long");
      if (this.#ended) return this.#buffered.toString("utf8").trim();
      await this.#more();
    }
  }

  /** Exactly `count` bytes; fails when the stream ends first. */
  async bytes(count: number): Promise<Buffer> {
    while (this.#buffered.length < count) {
      if (this.#ended) throw new Error(`stdin ended after ${this.#buffered.length} of ${count} bytes`);
      await this.#more();
    }
    const bytes = this.#buffered.subarray(0, count);
    this.#buffered = this.#buffered.subarray(count);
    return bytes;
  }

  /** The assignment of a warm instance. */
  async assignment(): Promise<Assignment> {
    const header = JSON.parse(await this.line()) as { microvmId?: unknown; moduleBytes?: unknown };
    const { microvmId, moduleBytes } = header;
    if (typeof microvmId !== "string" || !Number.isInteger(moduleBytes))
      throw new Error("malformed instance assignment");
    if ((moduleBytes as number) < 0 || (moduleBytes as number) > MODULE_BYTES_LIMIT)
      throw new Error("module too large");
    return { microvmId, module: await this.bytes(moduleBytes as number) };
  }

  /** The identity line of an instance restored from a launch snapshot. */
  async identity(): Promise<Identity> {
    const { microvmId, secret } = JSON.parse(await this.line()) as { microvmId?: unknown; secret?: unknown };
    if (typeof microvmId !== "string" || microvmId === "" || typeof secret !== "string" || secret.length < 16)
      throw new Error("malformed instance identity");
    return { microvmId, secret };
  }

  /** Stops reading: stdin stays open (its end means the host died) and unread. */
  release(): void {
    this.#stream.off("data", this.#onData);
    this.#stream.off("end", this.#onEnd);
    this.#stream.off("error", this.#onEnd);
    this.#stream.pause();
  }

  #more(): Promise<void> {
    return new Promise((resolve) => (this.#waiting = resolve));
  }

  #wake(): void {
    const waiting = this.#waiting;
    this.#waiting = undefined;
    waiting?.();
  }
}
