// Node's options for the skiff server, as `npm start` runs it (package.json's
// `start` writes them out; docs/deploy.md's units and manifests too; the
// benchmarks and `npm run cluster` take them from here). A young generation
// of 64 MiB a semi-space: a sync call allocates about 45 KB, so at 12,000
// calls a second the default (16 MiB) collects it about 35 times a second;
// with 64 MiB, measured in four interleaved pairs (`bench/profile.ts custom`):
// 4-5 % more calls a second (one pair 23 %), 3 µs less of the main thread and
// 4 µs less of V8's helper threads a call, and about 37 MB more resident
// memory under that load (bench/README.md).
export const SERVER_NODE_FLAGS = ["--max-semi-space-size=64"];
