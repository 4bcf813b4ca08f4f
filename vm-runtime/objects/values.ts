// What a storage key and value may be, checked where they are written: by the host's storage,
// and inside the instance before a write goes on the channel (so its line stays bounded).
// Pure: the runtime bundles it.
import { invalidKey, invalidValue } from "./errors.ts";

/** Longest storage key, in UTF-8 bytes. */
export const MAX_STORAGE_KEY_BYTES = 512;
/** Longest value, as JSON in UTF-8 bytes. */
export const MAX_STORAGE_VALUE_BYTES = 128 * 1024;

/** `key` when it is a storage key; else throws StorageKeyInvalid. */
export function checkedKey(key: unknown): string {
  if (typeof key !== "string" || key.length === 0) throw invalidKey("a storage key is a non-empty string");
  const bytes = Buffer.byteLength(key, "utf8");
  if (bytes > MAX_STORAGE_KEY_BYTES)
    throw invalidKey(`a storage key is at most ${MAX_STORAGE_KEY_BYTES} bytes (UTF-8); this one has ${bytes}`);
  return key;
}

/** The JSON of a value that may be stored; else throws StorageValueInvalid. */
export function valueJson(value: unknown): string {
  let json: string | undefined;
  try {
    json = JSON.stringify(value);
  } catch (err) {
    throw invalidValue(`a stored value must be JSON: ${(err as Error).message}`);
  }
  if (json === undefined) throw invalidValue("a stored value must be JSON (undefined, a function or a symbol is not)");
  const bytes = Buffer.byteLength(json, "utf8");
  if (bytes > MAX_STORAGE_VALUE_BYTES)
    throw invalidValue(`a stored value is at most ${MAX_STORAGE_VALUE_BYTES} bytes as JSON; this one has ${bytes}`);
  return json;
}
