// The `taskctl image` commands: push (bundles the image file and its npm dependencies with
// esbuild on this machine, then registers the one module), ls, get and rm.
import type { Static } from "@sinclair/typebox";
import type { ImageInfo } from "../schemas/index.ts";
import type { CommandSpec, OptionValues } from "./cli-spec.ts";
import { fields } from "./cli-output.ts";

type Image = Static<typeof ImageInfo>;

const define = (spec: CommandSpec<"microvm">) => spec as unknown as CommandSpec;

function imageText(image: Image): string {
  const methods = image.methods.map((m) => (m.args === undefined ? m.name : `${m.name}(${JSON.stringify(m.args)})`));
  return fields([
    ["name", image.name],
    ["digest", image.digest],
    ["created", image.createdAt],
    ["methods", methods.join(", ") || "(none)"],
  ]);
}

function imageTable(items: readonly Image[]): string {
  if (items.length === 0) return "no images";
  const rows = [
    ["NAME", "DIGEST", "METHODS", "CREATED"],
    ...items.map((i) => [i.name, i.digest.slice(0, 19), String(i.methods.length), i.createdAt]),
  ];
  const widths = rows[0]!.map((_, col) => Math.max(...rows.map((row) => row[col]!.length)));
  return rows
    .map((row) =>
      row
        .map((cell, col) => cell.padEnd(widths[col]!))
        .join("  ")
        .trimEnd(),
    )
    .join("\n");
}

export const imageCommands: CommandSpec[] = [
  define({
    group: "image",
    name: "push",
    args: ["FILE"],
    api: "microvm",
    summary: "Bundle an image file (and the npm packages it imports) here, then register it",
    options: {
      name: {
        type: "string",
        value: "NAME",
        description: "the image name, 1-64 of [a-z0-9-] (default: the file name)",
      },
    },
    async run(client, [file], options: OptionValues) {
      const { basename, extname } = await import("node:path");
      const { bundleImageModule } = await import("../vm-runtime/client/image-module.ts");
      const name = (options.name as string | undefined) ?? basename(file!, extname(file!)).toLowerCase();
      const module = await bundleImageModule(file!);
      const image = await client.createImage({ name, module });
      return { json: image, text: `pushed ${image.name}@${image.digest}\n${imageText(image)}` };
    },
  }),
  define({
    group: "image",
    name: "ls",
    args: [],
    api: "microvm",
    summary: "List your images and the built-in ones",
    async run(client) {
      const answer = await client.listImages({});
      return { json: answer, text: imageTable(answer.items) };
    },
  }),
  define({
    group: "image",
    name: "get",
    args: ["NAME"],
    api: "microvm",
    summary: "Describe an image: its latest digest and its methods",
    async run(client, [name]) {
      const image = await client.getImage({ name: name! });
      return { json: image, text: imageText(image) };
    },
  }),
  define({
    group: "image",
    name: "rm",
    args: ["NAME"],
    api: "microvm",
    summary: "Delete an image and its versions (refused while an instance runs it)",
    async run(client, [name]) {
      const answer = await client.deleteImage({ name: name! });
      return { json: answer, text: `deleted image ${answer.name}` };
    },
  }),
];
