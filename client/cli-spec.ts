// The shape of a `taskctl` command (cli-commands.ts, cli-images.ts): its arguments, options and
// the typed client call it makes. Types only.
import type { jobApi, microvmApi, taskApi } from "../schemas/index.ts";
import type { Client } from "./typed-client.ts";

export type Apis = { task: typeof taskApi; job: typeof jobApi; microvm: typeof microvmApi };
export type ApiName = keyof Apis;

export interface OptionSpec {
  readonly type: "string" | "boolean";
  /** Placeholder in the help (string options). */
  readonly value?: string;
  readonly description: string;
  readonly multiple?: boolean;
  /** One letter that works as `-<letter>` too. */
  readonly short?: string;
}

/** What a command answered: the raw JSON (`--json`) and the friendly text. */
export interface Outcome {
  readonly json: unknown;
  readonly text: string;
}

export type OptionValues = Record<string, string | boolean | (string | boolean)[] | undefined>;

export interface CommandSpec<A extends ApiName = ApiName> {
  readonly group: "tasks" | "objects" | "jobs" | "microvm" | "image";
  readonly name: string;
  /** Positional arguments, all required (placeholders for the help). */
  readonly args: readonly string[];
  readonly api: A;
  readonly summary: string;
  readonly options?: Readonly<Record<string, OptionSpec>>;
  /** `out` prints a line at once: what a command that follows (`microvm logs -f`) writes as it comes. */
  run(
    client: Client<Apis[A]>,
    args: readonly string[],
    options: OptionValues,
    out: (text: string) => void,
  ): Promise<Outcome>;
}
