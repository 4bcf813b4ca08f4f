// Test-only object image: the tally of object-tally.ts, evicted after 1 s without calls into a
// snapshot (`hibernate: "snapshot"`): its memory (`visits`) is kept to its next call.
import { defineObject } from "../../vm-runtime/index.ts";
import { tallyMethods, tallyAlarm } from "./object-tally-methods.ts";

export default defineObject({ methods: tallyMethods, alarm: tallyAlarm, idleSeconds: 1, hibernate: "snapshot" });
