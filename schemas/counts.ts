// Bounded positive counts (limits, seconds to wait): a number over NATS, digits in an HTTP query
// string. Both forms take the same bound, the digits' by a pattern derived from it here.
import { Type } from "@sinclair/typebox";

/** An integer from 1 to `maximum`: a JSON number, or its decimal digits (no sign, no leading zero). */
export const Count = (maximum: number, description: string) =>
  Type.Union([Type.Integer({ minimum: 1, maximum }), Type.String({ pattern: digitsUpTo(maximum) })], {
    description,
  });

/**
 * A pattern matching the decimal numbers 1 to `maximum` exactly: the shorter numbers, then for
 * each digit of `maximum` the numbers that share its digits before it and are smaller at it
 * (`30` → `^(?:[1-9]|[1-2][0-9]|30)$`).
 */
export function digitsUpTo(maximum: number): string {
  if (!Number.isSafeInteger(maximum) || maximum < 1) throw new RangeError(`not a positive integer: ${maximum}`);
  const max = String(maximum);
  const branches: string[] = [];
  if (max.length > 1) branches.push(max.length === 2 ? "[1-9]" : `[1-9][0-9]{0,${max.length - 2}}`);
  for (let i = 0; i < max.length; i++) {
    const low = i === 0 ? 1 : 0;
    const high = Number(max[i]) - 1;
    if (high < low) continue;
    const rest = max.length - i - 1;
    branches.push(`${max.slice(0, i)}[${low}-${high}]${rest === 0 ? "" : rest === 1 ? "[0-9]" : `[0-9]{${rest}}`}`);
  }
  branches.push(max);
  return `^(?:${branches.join("|")})$`;
}
