// The failures of object storage and alarms, each with a stable `_tag` and the HTTP status an
// operation will answer it with.

/** A refused storage or alarm call: what was wrong, said to the object's code. */
export class ObjectError extends Error {
  constructor(
    readonly _tag: string,
    readonly status: number,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = _tag;
  }
}

/** A storage key that is empty or longer than `MAX_STORAGE_KEY_BYTES`. */
export const invalidKey = (message: string) => new ObjectError("StorageKeyInvalid", 400, message);

/** A value that is not JSON or whose JSON is longer than `MAX_STORAGE_VALUE_BYTES`. */
export const invalidValue = (message: string) => new ObjectError("StorageValueInvalid", 400, message);

/** The principal's objects hold its storage quota already. */
export const quotaExceeded = (principal: string, usedBytes: number, quotaBytes: number, wantedBytes: number) =>
  new ObjectError(
    "StorageQuotaExceeded",
    507,
    `the objects of "${principal}" store ${usedBytes} of ${quotaBytes} bytes: ${wantedBytes} more do not fit`,
  );

/** The activation that wrote was superseded (another took the object over): nothing was written. */
export const superseded = (object: string, options?: { cause?: unknown }) =>
  new ObjectError(
    "ActivationSuperseded",
    409,
    `this activation of ${object} was superseded by another: its write was refused`,
    options,
  );

/** An alarm at a time that is not a finite epoch-ms number. */
export const invalidAlarm = (message: string) => new ObjectError("AlarmInvalid", 400, message);

/** The principal has as many alarms set as it may. */
export const tooManyAlarms = (principal: string, limit: number) =>
  new ObjectError("TooManyAlarms", 429, `the objects of "${principal}" have ${limit} alarms set, their most`);
