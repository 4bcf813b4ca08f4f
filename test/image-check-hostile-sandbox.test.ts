// The hostile image pushes of image-check-hostile.test.ts, checked in the bubblewrap sandbox.
process.env.IMAGE_CHECK_PROVIDER = "sandbox";
await import("./image-check-hostile.test.ts");
