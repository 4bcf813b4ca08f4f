// Test-only image whose state lives in memory and in a scratch file: what a checkpoint must
// keep. `increment` adds one to both; `read` reports both; `writeAt` tries a path outside.
import { appendFileSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { defineImage } from "../../vm-runtime/image.ts";

const file = () => join(process.env.HOME ?? "/scratch", "counter.txt");
let count = 0;
/** Set once at load: a restore keeps it, a fresh start makes another. */
const bornAt = `${Date.now()}-${Math.random()}`;

function fileCount(): number {
  try {
    return readFileSync(file(), "utf8").split("\n").filter(Boolean).length;
  } catch {
    return 0;
  }
}

export default defineImage({
  methods: {
    increment: {
      handler: () => {
        count += 1;
        appendFileSync(file(), `${count}\n`);
        return count;
      },
    },
    read: { handler: () => ({ memory: count, file: fileCount(), bornAt }) },
  },
});
