// memgap's Node.js sampler, loaded with NODE_OPTIONS=--require <this file>
// by `memgap run`, in every isolate (the main thread and each worker).
// It records what V8 and Node know of their memory (process.memoryUsage(),
// v8.getHeapStatistics(), v8.getHeapSpaceStatistics()) into
// $MEMGAP_NODE_OUT (%p: the pid, %t: the worker's threadId), a line per sample:
//   <monotonic ns> <kind> <key>=<value> ...
// It starts no thread (only synchronous file calls: asynchronous ones would
// start libuv's thread pool), keeps no handle open (the event loop ends as
// it would), and prints nothing. A PerformanceObserver on `gc` entries
// samples after garbage collections, at most every $MEMGAP_NODE_INTERVAL_MS
// unless a major GC ran; the process's `exit` event takes the last sample.
// Nothing here may throw into the program.
'use strict';
(function memgapNodeSampler() {
  try {
    const out = process.env.MEMGAP_NODE_OUT;
    if (!out || globalThis.__memgapNodeSampler) return;
    if (parseInt(process.versions.node, 10) < 18) return;
    Object.defineProperty(globalThis, '__memgapNodeSampler', { value: true, enumerable: false });
    // Everything the sampler calls is taken now, before the program can
    // replace any of it.
    const fs = require('fs');
    const v8 = require('v8');
    const { PerformanceObserver, constants } = require('perf_hooks');
    const { threadId } = require('worker_threads');
    const { openSync, writeSync, closeSync, fchmodSync } = fs;
    const { O_WRONLY, O_APPEND, O_CREAT, O_EXCL, O_NOFOLLOW } = fs.constants;
    const hrtime = process.hrtime.bigint;
    const memoryUsage = process.memoryUsage;
    const heapStatistics = v8.getHeapStatistics;
    const spaceStatistics = v8.getHeapSpaceStatistics;
    const MAJOR = constants.NODE_PERFORMANCE_GC_MAJOR;
    const MINOR = constants.NODE_PERFORMANCE_GC_MINOR;
    const INCREMENTAL = constants.NODE_PERFORMANCE_GC_INCREMENTAL;
    const WEAKCB = constants.NODE_PERFORMANCE_GC_WEAKCB;
    const interval = (parseInt(process.env.MEMGAP_NODE_INTERVAL_MS, 10) || 1000) * 1e6;
    const path = out.replace('%p', String(process.pid)).replace('%t', String(threadId));
    let created = false;
    let broken = false;
    let exiting = false;
    let lastNs = 0;
    const gcs = { minor: 0, major: 0, incremental: 0, weak_callbacks: 0, ms: 0 };

    const write = (line) => {
      if (broken) return;
      let fd = -1;
      try {
        // The first write creates the file (never an existing one, never
        // through a symlink); later ones append to it.
        fd = openSync(path, O_WRONLY | O_APPEND | O_NOFOLLOW | (created ? 0 : O_CREAT | O_EXCL), 0o600);
        if (!created) fchmodSync(fd, 0o600);
        created = true;
        writeSync(fd, line);
      } catch (_) {
        broken = true;
      } finally {
        if (fd >= 0) try { closeSync(fd); } catch (_) { /* nothing to do */ }
      }
    };

    const sample = (kind) => {
      const now = hrtime();
      const usage = memoryUsage();
      const heap = heapStatistics();
      let line = `${now} ${kind} thread=${threadId} rss=${usage.rss} heap_total=${usage.heapTotal} heap_used=${usage.heapUsed}` +
        ` external=${usage.external} array_buffers=${usage.arrayBuffers}` +
        ` total_physical_size=${heap.total_physical_size} total_available_size=${heap.total_available_size}` +
        ` heap_size_limit=${heap.heap_size_limit} malloced_memory=${heap.malloced_memory}` +
        ` gc_minor=${gcs.minor} gc_major=${gcs.major} gc_incremental=${gcs.incremental} gc_weak_callbacks=${gcs.weak_callbacks} gc_ms=${gcs.ms.toFixed(3)}`;
      for (const s of spaceStatistics()) {
        const name = s.space_name;
        line += ` ${name}.size=${s.space_size} ${name}.used=${s.space_used_size} ${name}.available=${s.space_available_size} ${name}.physical=${s.physical_space_size}`;
      }
      write(line + '\n');
      lastNs = Number(now);
    };

    const afterGc = (list) => {
      if (exiting) return;
      try {
        let major = false;
        for (const entry of list.getEntries()) {
          const kind = entry.detail ? entry.detail.kind : entry.kind;
          if (kind === MAJOR) { gcs.major++; major = true; }
          else if (kind === MINOR) gcs.minor++;
          else if (kind === INCREMENTAL) gcs.incremental++;
          else if (kind === WEAKCB) gcs.weak_callbacks++;
          gcs.ms += entry.duration;
        }
        if (major || Number(hrtime()) - lastNs >= interval) sample(major ? 'major_gc' : 'gc');
      } catch (_) { /* never into the program */ }
    };

    write(`${hrtime()} meta thread=${threadId} version=${process.versions.node} v8=${process.versions.v8}\n`);
    sample('start');
    new PerformanceObserver(afterGc).observe({ entryTypes: ['gc'] });
    process.on('exit', () => {
      try {
        exiting = true;
        sample('exit');
      } catch (_) { /* never into the program */ }
    });
  } catch (_) { /* never into the program */ }
})();
