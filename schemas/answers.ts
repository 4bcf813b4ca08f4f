// What a handler answers: its success value, or that value as a stored record (which, and at
// what revision). The adapter that serves the handler writes the record's headers of it.

/** A stored record's place and revision (the stream sequence of its last write). */
export interface StoredAt {
  readonly bucket: string;
  readonly key: string;
  readonly revision: number;
}

/**
 * An answer that is a stored record (or its deletion): the value, and where and at what revision
 * it is stored; over NATS the `Revision` and `Record` headers, over HTTP the `ETag`.
 */
export class StoredAnswer<T> {
  readonly stored: StoredAt;
  constructor(
    readonly value: T,
    at: StoredAt,
  ) {
    this.stored = { bucket: at.bucket, key: at.key, revision: at.revision };
  }
}

/** A handler's answer: its success value, or that value as a stored record. */
export type Answer<T> = T | StoredAnswer<T>;

/** `record` answered as the stored record it is (a read or a write of it). */
export const answerStored = <T>(record: StoredAt & { readonly value: T }): StoredAnswer<T> =>
  new StoredAnswer(record.value, record);

/** The value of an answer, stored or not. */
export const answerValue = <T>(answer: Answer<T>): T => (answer instanceof StoredAnswer ? answer.value : answer);

/**
 * An answer made elsewhere and relayed as it is: its status and its JSON bytes (an object's RPC
 * answer). Over NATS a status that is not 2xx goes with the error headers, `tag` their `_tag`.
 */
export class RelayedAnswer {
  constructor(
    readonly status: number,
    readonly body: Uint8Array,
    readonly tag: string,
  ) {}
}
