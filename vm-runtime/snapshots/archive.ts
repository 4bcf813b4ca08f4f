// A checkpoint image directory as one compressed byte string and back: each regular file as a
// `<name>\t<size>\n` line and its bytes, the whole gzip-compressed. Unpacking is bounded (total
// size, file count, names) and writes only fresh files into a directory of the host's own.
import { lstat, open, readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { gunzip, gzip } from "node:zlib";

const gzipAsync = promisify(gzip);
const gunzipAsync = promisify(gunzip);

const MAGIC = "microvm-snapshot 1\n";
const MAX_FILES = 16;
const NAME = /^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$/;
const HEADER_LIMIT = 128;

/** A snapshot that cannot be unpacked: damaged, or not one of ours. */
export class SnapshotArchiveError extends Error {
  override readonly name = "SnapshotArchiveError";
}

/** The regular files of `dir` (no subdirectories, no links), packed and compressed. */
export async function packSnapshot(dir: string): Promise<Buffer> {
  const parts: Buffer[] = [Buffer.from(MAGIC)];
  const names = (await readdir(dir)).sort();
  if (names.length > MAX_FILES) throw new SnapshotArchiveError(`the image has ${names.length} files`);
  for (const name of names) {
    const info = await lstat(join(dir, name));
    if (!info.isFile() || !NAME.test(name)) throw new SnapshotArchiveError(`unexpected entry ${name} in the image`);
    const bytes = await readFile(join(dir, name));
    parts.push(Buffer.from(`${name}\t${bytes.length}\n`), bytes);
  }
  return gzipAsync(Buffer.concat(parts), { level: 1 });
}

/**
 * Unpacks `packed` into `dir` (existing, empty, the host's): at most `maxBytes` once
 * uncompressed. Throws `SnapshotArchiveError` for anything but a well-formed archive.
 */
export async function unpackSnapshot(packed: Uint8Array, dir: string, maxBytes: number): Promise<void> {
  let raw: Buffer;
  try {
    raw = await gunzipAsync(packed, { maxOutputLength: maxBytes });
  } catch (cause) {
    throw new SnapshotArchiveError("the snapshot does not decompress", { cause });
  }
  // Every header is checked before the first file is written.
  for (const [name, bytes] of parseArchive(raw)) {
    // `wx`: a fresh file, never through a link.
    const file = await open(join(dir, name), "wx", 0o600);
    try {
      await file.writeFile(bytes);
    } finally {
      await file.close();
    }
  }
}

function parseArchive(raw: Buffer): [string, Buffer][] {
  if (!raw.subarray(0, MAGIC.length).equals(Buffer.from(MAGIC)))
    throw new SnapshotArchiveError("the snapshot is not an instance snapshot");
  const files = new Map<string, Buffer>();
  let at = MAGIC.length;
  while (at < raw.length) {
    const newline = raw.indexOf(10, at);
    if (newline === -1 || newline - at > HEADER_LIMIT) throw new SnapshotArchiveError("a file header is malformed");
    const [name, sizeText, extra] = raw.subarray(at, newline).toString("utf8").split("\t");
    const size = Number(sizeText);
    if (
      name === undefined ||
      extra !== undefined ||
      !NAME.test(name) ||
      files.has(name) ||
      !/^\d{1,12}$/.test(sizeText ?? "") ||
      newline + 1 + size > raw.length
    )
      throw new SnapshotArchiveError("a file header is malformed");
    files.set(name, raw.subarray(newline + 1, newline + 1 + size));
    if (files.size > MAX_FILES) throw new SnapshotArchiveError("the snapshot has too many files");
    at = newline + 1 + size;
  }
  return [...files];
}
