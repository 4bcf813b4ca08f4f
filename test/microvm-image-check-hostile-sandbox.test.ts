// The hostile image pushes of microvm-image-check-hostile.test.ts, checked in the bubblewrap sandbox.
process.env.IMAGE_CHECK_PROVIDER = "sandbox";
await import("./microvm-image-check-hostile.test.ts");
