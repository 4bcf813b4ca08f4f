// Test-only image: `hog()` allocates memory without bound, to prove the provider's memory
// cap stops the instance and leaves the host alone.
import { defineImage } from "../../vm-runtime/image.ts";

const retained: unknown[] = [];

export default defineImage({
  methods: {
    ping: { handler: () => "pong" },
    /** Never returns: keeps allocating small objects on the JS heap until the cap kills it. */
    hog: {
      handler: (): number => {
        for (;;) retained.push({ payload: new Array(1024).fill(retained.length) });
      },
    },
    /** Allocates off-heap Buffers (not bounded by the heap cap, only by the data limit). */
    hogBuffers: {
      handler: (): number => {
        for (;;) retained.push(Buffer.alloc(1024 * 1024, 1));
      },
    },
  },
});
