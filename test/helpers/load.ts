// A steady create load over HTTP for fault tests: workers POST in a loop and record every
// answer, so a test can check that each create answered 200 is still readable afterwards.
export interface LoadTarget {
  url: string;
  body: () => unknown;
  /** The id in a 200 answer (a Task's `id`, or the JSON string createJob answers). */
  idOf: (answer: unknown) => string;
}

export interface Answer {
  target: number;
  status: number;
  ms: number;
  at: number;
  id?: string;
  retryAfter?: string | null;
}

export interface Load {
  readonly answers: Answer[];
  stop(): Promise<void>;
}

/** Starts `concurrency` workers spread over `targets`; each request times out after 10 s. */
export function startLoad(targets: LoadTarget[], concurrency: number): Load {
  const answers: Answer[] = [];
  let running = true;
  const worker = async (w: number) => {
    const index = w % targets.length;
    const target = targets[index]!;
    while (running) {
      const started = Date.now();
      try {
        const res = await fetch(target.url, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify(target.body()),
          signal: AbortSignal.timeout(10_000),
        });
        const text = await res.text();
        const answer: Answer = { target: index, status: res.status, ms: Date.now() - started, at: started };
        if (res.status === 200) answer.id = target.idOf(JSON.parse(text));
        if (res.status === 503) answer.retryAfter = res.headers.get("retry-after");
        answers.push(answer);
        if (res.status !== 200) await new Promise((r) => setTimeout(r, 20));
      } catch {
        answers.push({ target: index, status: 0, ms: Date.now() - started, at: started });
        await new Promise((r) => setTimeout(r, 20));
      }
    }
  };
  const workers = Array.from({ length: concurrency }, (_, w) => worker(w));
  return {
    answers,
    async stop() {
      running = false;
      await Promise.all(workers);
    },
  };
}

/** How many answers had each status (0: no answer). */
export function statusCounts(answers: readonly Answer[]): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const a of answers) counts[a.status] = (counts[a.status] ?? 0) + 1;
  return counts;
}

/** The Task API (target 0) and the Job API (the others) of a service. */
export interface ServiceApi {
  taskUrl: string;
  jobUrl: string;
}

/** The status each create answered 200 reads back with now (0: no answer). */
export async function readBackStatuses(
  answers: readonly Answer[],
  api: ServiceApi,
): Promise<{ answer: Answer; status: number }[]> {
  const read = [];
  for (const answer of answers.filter((a) => a.status === 200)) {
    const url =
      answer.target === 0 ? `${api.taskUrl}/${answer.id}` : `${api.jobUrl}/?jobId=${encodeURIComponent(answer.id!)}`;
    const status = await fetch(url).then(
      async (res) => {
        await res.arrayBuffer();
        return res.status;
      },
      () => 0,
    );
    read.push({ answer, status });
  }
  return read;
}

/** Creates answered 200 whose record does not read back 200 from the Task and Job APIs. */
export async function lostCreates(answers: readonly Answer[], api: ServiceApi): Promise<number> {
  return (await readBackStatuses(answers, api)).filter((r) => r.status !== 200).length;
}

/**
 * Waits for the first create sent at or after `since` to answer 200; resolves to when that
 * answer arrived. Rejects with `what` once `limitMs` passes without one.
 */
export async function firstOkAfter(load: Load, since: number, limitMs: number, what: string): Promise<number> {
  const oks = () => load.answers.filter((a) => a.at >= since && a.status === 200);
  while (oks().length === 0) {
    if (Date.now() - since >= limitMs) throw new Error(`${what}: no create answered 200 within ${limitMs} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
  return Math.min(...oks().map((a) => a.at + a.ms));
}
