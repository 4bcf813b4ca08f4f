// A checkpoint image directory as one byte stream and back, never whole in memory: a magic
// line, then each regular file as a `<name>\t<size>\n` line and its bytes. Uncompressed: what
// is stored is what was checkpointed (runsc's pages compress by about 1%). Unpacking is
// bounded (total size, file count, names) and writes only fresh files into a directory of the
// host's own, each with backpressure: at most one read chunk is held at a time.
import { createReadStream } from "node:fs";
import { lstat, open, readdir, type FileHandle } from "node:fs/promises";
import { join } from "node:path";

const MAGIC = Buffer.from("microvm-snapshot 2\n");
const MAX_FILES = 16;
const NAME = /^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$/;
const HEADER_LIMIT = 128;
/** Bytes read from a file at a time while packing. */
const READ_CHUNK = 256 * 1024;

/** A snapshot that cannot be unpacked: damaged, or not one of ours. */
export class SnapshotArchiveError extends Error {
  override readonly name = "SnapshotArchiveError";
}

/** A packed image directory: its size, known before a byte is read, and its bytes as a stream. */
export interface PackedSnapshot {
  readonly bytes: number;
  /** The archive's bytes, read from the files as they are pulled. */
  readonly chunks: AsyncIterable<Uint8Array>;
}

/** The regular files of `dir` (no subdirectories, no links), packed as they are read. */
export async function packSnapshot(dir: string): Promise<PackedSnapshot> {
  const names = (await readdir(dir)).sort();
  if (names.length > MAX_FILES) throw new SnapshotArchiveError(`the image has ${names.length} files`);
  const files: { name: string; size: number; header: Buffer }[] = [];
  for (const name of names) {
    const info = await lstat(join(dir, name));
    if (!info.isFile() || !NAME.test(name)) throw new SnapshotArchiveError(`unexpected entry ${name} in the image`);
    files.push({ name, size: info.size, header: Buffer.from(`${name}\t${info.size}\n`) });
  }
  const bytes = files.reduce((sum, file) => sum + file.header.length + file.size, MAGIC.length);
  async function* chunks(): AsyncGenerator<Uint8Array> {
    yield MAGIC;
    for (const { name, size, header } of files) {
      yield header;
      // `end: -1` would read the whole file: an empty one has nothing to read.
      if (size === 0) continue;
      let read = 0;
      for await (const chunk of createReadStream(join(dir, name), { highWaterMark: READ_CHUNK, end: size - 1 })) {
        read += (chunk as Buffer).length;
        yield chunk as Buffer;
      }
      if (read !== size) throw new SnapshotArchiveError(`${name} changed while it was packed`);
    }
  }
  return { bytes, chunks: chunks() };
}

/**
 * Unpacks the archive `source` yields into `dir` (existing, empty, the host's): at most
 * `maxBytes` in all. Throws `SnapshotArchiveError` for anything but a well-formed archive; the
 * files written before are left for the caller to remove with the directory.
 */
export async function unpackSnapshot(source: AsyncIterable<Uint8Array>, dir: string, maxBytes: number): Promise<void> {
  const names = new Set<string>();
  /** Bytes of the current header line (or of the magic) seen so far. */
  let pending = Buffer.alloc(0);
  let magicSeen = false;
  let file: FileHandle | undefined;
  let left = 0;
  let total = 0;
  try {
    for await (const received of source) {
      total += received.byteLength;
      if (total > maxBytes) throw new SnapshotArchiveError(`the snapshot is larger than ${maxBytes} bytes`);
      let chunk = Buffer.from(received.buffer, received.byteOffset, received.byteLength);
      while (chunk.length > 0) {
        if (file) {
          const part = chunk.subarray(0, left);
          await file.write(part);
          left -= part.length;
          chunk = chunk.subarray(part.length);
          if (left === 0) {
            await file.close();
            file = undefined;
          }
          continue;
        }
        if (!magicSeen) {
          const need = MAGIC.length - pending.length;
          pending = Buffer.concat([pending, chunk.subarray(0, need)]);
          chunk = chunk.subarray(need);
          if (pending.length < MAGIC.length) continue;
          if (!pending.equals(MAGIC)) throw new SnapshotArchiveError("the snapshot is not an instance snapshot");
          magicSeen = true;
          pending = Buffer.alloc(0);
          continue;
        }
        const newline = chunk.indexOf(10);
        const line = Buffer.concat([pending, chunk.subarray(0, newline === -1 ? chunk.length : newline)]);
        if (line.length > HEADER_LIMIT) throw new SnapshotArchiveError("a file header is malformed");
        if (newline === -1) {
          pending = line;
          break;
        }
        pending = Buffer.alloc(0);
        chunk = chunk.subarray(newline + 1);
        const { name, size } = parseHeader(line.toString("utf8"), names);
        // `wx`: a fresh file, never through a link.
        const opened = await open(join(dir, name), "wx", 0o600);
        if (size === 0) await opened.close();
        else [file, left] = [opened, size];
      }
    }
    if (!magicSeen || file || pending.length > 0) throw new SnapshotArchiveError("the snapshot ends early");
  } finally {
    await file?.close();
  }
}

function parseHeader(line: string, names: Set<string>): { name: string; size: number } {
  const [name, sizeText, extra] = line.split("\t");
  if (
    name === undefined ||
    extra !== undefined ||
    !NAME.test(name) ||
    names.has(name) ||
    !/^\d{1,12}$/.test(sizeText ?? "")
  )
    throw new SnapshotArchiveError("a file header is malformed");
  names.add(name);
  if (names.size > MAX_FILES) throw new SnapshotArchiveError("the snapshot has too many files");
  return { name, size: Number(sizeText) };
}
