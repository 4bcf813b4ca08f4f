// Test-only object image: a tally in its storage (`inc`, `read`), an alarm that counts its runs
// (`alarmIn` sets it), and a call that never answers (`hang`). Idle for 60 s before eviction.
import { defineObject } from "../../vm-runtime/index.ts";
import { tallyMethods, tallyAlarm } from "./object-tally-methods.ts";

export default defineObject({ methods: tallyMethods, alarm: tallyAlarm, idleSeconds: 60 });
