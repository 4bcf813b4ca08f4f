// Test-only image importing an npm package (bundled into its module by the pusher's esbuild).
import { validate as isUuid, v4 as uuidv4 } from "uuid";
import { defineImage } from "../../vm-runtime/image.ts";

export default defineImage({
  methods: {
    newId: { handler: () => uuidv4() },
    isId: { handler: (text: string) => isUuid(text) },
  },
});
