// The runtime's unix socket, reached without following anything an instance can write: the
// provider makes the instance's socket directory on the host (mounted at /run/microvm inside),
// and the host opens `runtime.sock` in it with O_PATH|O_NOFOLLOW, checks that it is a socket,
// and connects through `/proc/self/fd/<fd>`: a symlink or a swapped path leads nowhere.
import { chmodSync, chownSync, closeSync, fstatSync, mkdirSync, openSync } from "node:fs";
import { join } from "node:path";

/** The socket's name in the directory (inside: `/run/microvm/runtime.sock`). */
export const RUNTIME_SOCKET_NAME = "runtime.sock";

// Linux x86_64 and arm64 values (node's fs.constants lacks O_PATH).
const O_PATH = 0o10000000;
const O_NOFOLLOW = 0o400000;

/**
 * Makes `<parent>/<name>`, owned by `uid` (the instance's host uid) with mode 0700: only the
 * instance may create its socket there. `parent` must be the host's own (root-owned) directory.
 */
export function makeSocketDir(parent: string, name: string, uid: number | undefined): string {
  mkdirSync(parent, { recursive: true, mode: 0o711 });
  chmodSync(parent, 0o711);
  const dir = join(parent, name);
  mkdirSync(dir, { mode: 0o700 });
  if (uid !== undefined) chownSync(dir, uid, uid);
  return dir;
}

/** The instance's socket, held open by the host while it is used. */
export interface RuntimeSocket {
  /** What to connect to: `/proc/self/fd/<fd>`, the very socket that was checked. */
  readonly path: string;
  close(): void;
}

/**
 * Opens the socket in `dir` without following a symlink; undefined while it is absent, and a
 * thrown error when something other than a socket is there (a planted file or link).
 */
export function openRuntimeSocket(dir: string): RuntimeSocket | undefined {
  let fd: number;
  try {
    fd = openSync(join(dir, RUNTIME_SOCKET_NAME), O_PATH | O_NOFOLLOW);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw error;
  }
  if (!fstatSync(fd).isSocket()) {
    closeSync(fd);
    throw new Error(`the instance's ${RUNTIME_SOCKET_NAME} is not a socket`);
  }
  let open = true;
  return {
    path: `/proc/self/fd/${fd}`,
    close() {
      if (open) closeSync(fd);
      open = false;
    },
  };
}
