// Loaded into a skiff process by the benchmarks (`node --import`): the bytes
// its main thread allocates on the JS heap between two SIGUSR2, written as
// JSON to SKIFF_BENCH_ALLOC_FILE at the second. Allocated bytes are the heap's
// growth over the window plus what each garbage collection in it freed
// (v8.GCProfiler's heap sizes before and after each one). Buffers' bytes
// outside the heap are not counted; their small objects on the heap are.
// With SKIFF_BENCH_HEAP_PROFILE too, V8's sampling heap profiler runs over
// the same window, collected objects included, and its profile (where the
// bytes were allocated) is written there (Chrome's DevTools open it).
import { writeFileSync } from "node:fs";
import { Session } from "node:inspector";
import v8 from "node:v8";

const file = process.env.SKIFF_BENCH_ALLOC_FILE;
const heapProfile = process.env.SKIFF_BENCH_HEAP_PROFILE;
let session;
let profiler;
let startUsed = 0;
if (file)
  process.on("SIGUSR2", () => {
    if (!profiler) {
      profiler = new v8.GCProfiler();
      startUsed = v8.getHeapStatistics().used_heap_size;
      profiler.start();
      if (heapProfile) {
        session = new Session();
        session.connect();
        session.post("HeapProfiler.startSampling", {
          samplingInterval: 512,
          includeObjectsCollectedByMajorGC: true,
          includeObjectsCollectedByMinorGC: true,
        });
      }
      return;
    }
    const { statistics } = profiler.stop();
    const endUsed = v8.getHeapStatistics().used_heap_size;
    profiler = undefined;
    let freed = 0;
    for (const gc of statistics)
      freed += gc.beforeGC.heapStatistics.usedHeapSize - gc.afterGC.heapStatistics.usedHeapSize;
    // First: the heap profile below can take seconds to write, and the benchmark waits for this file.
    writeFileSync(file, JSON.stringify({ bytes: endUsed - startUsed + freed, collections: statistics.length }));
    if (session)
      session.post("HeapProfiler.stopSampling", (err, res) => {
        if (!err) writeFileSync(heapProfile, JSON.stringify(res.profile));
        session.disconnect();
        session = undefined;
      });
  });
