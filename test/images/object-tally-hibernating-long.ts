// Test-only object image: the tally of object-tally.ts with `hibernate: "snapshot"`, idle for
// 60 s before eviction (evicted sooner only to make room for another object).
import { defineObject } from "../../vm-runtime/index.ts";
import { tallyMethods, tallyAlarm } from "./object-tally-methods.ts";

export default defineObject({ methods: tallyMethods, alarm: tallyAlarm, idleSeconds: 60, hibernate: "snapshot" });
