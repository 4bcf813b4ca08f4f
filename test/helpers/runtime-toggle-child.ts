// The runtime serving the sandbox image on a Unix socket (argv[2]), as in a wall: it takes the
// host's control lines on stdin and prints its runtime lines on stdout.
import { bootRuntime } from "../../vm-runtime/runtime/boot.ts";
import image from "../../vm-runtime/images/sandbox.ts";

await bootRuntime(image, { socketPath: process.argv[2]! });
process.stdout.write("serving\n");
