// Loaded into a skiff process by the benchmarks (`node --import`): the bytes
// its main thread allocates on the JS heap between two SIGUSR2, written as
// JSON to SKIFF_BENCH_ALLOC_FILE at the second. Allocated bytes are the heap's
// growth over the window plus what each garbage collection in it freed
// (v8.GCProfiler's heap sizes before and after each one). Buffers' bytes
// outside the heap are not counted; their small objects on the heap are.
import { writeFileSync } from "node:fs";
import v8 from "node:v8";

const file = process.env.SKIFF_BENCH_ALLOC_FILE;
let profiler;
let startUsed = 0;
if (file)
  process.on("SIGUSR2", () => {
    if (!profiler) {
      profiler = new v8.GCProfiler();
      startUsed = v8.getHeapStatistics().used_heap_size;
      profiler.start();
      return;
    }
    const { statistics } = profiler.stop();
    const endUsed = v8.getHeapStatistics().used_heap_size;
    profiler = undefined;
    let freed = 0;
    for (const gc of statistics)
      freed += gc.beforeGC.heapStatistics.usedHeapSize - gc.afterGC.heapStatistics.usedHeapSize;
    writeFileSync(file, JSON.stringify({ bytes: endUsed - startUsed + freed, collections: statistics.length }));
  });
