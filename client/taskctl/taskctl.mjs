#!/usr/bin/env node
// `taskctl` as npm links it (node_modules/.bin/taskctl, from the root package's dependency on
// this folder): a bin in node_modules/.bin is one `npx taskctl` runs straight away, where a bin
// of the root package itself makes npx read the whole dependency tree first (about 0.3 s).
import "../cli-bin.mjs";
