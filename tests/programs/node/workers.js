// The main thread and N worker threads each hold objects in their own V8
// isolate; once every isolate has collected garbage fully, the main thread
// prints one JSON line: each isolate's process.memoryUsage() (heapTotal,
// heapUsed, external, arrayBuffers) and V8's total_physical_size, and their sums; then all idle so that
// memgap snapshots them as printed, and the workers are ended.
// Usage: node workers.js [WORKERS] [MIB_EACH] [IDLE_MS]
'use strict';
const v8 = require('v8');
const vm = require('vm');
const { Worker, isMainThread, parentPort, workerData } = require('worker_threads');
v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc');

function hold(mib) {
  const kept = [];
  for (let i = 0; i < mib * 13000; i++) kept.push({ id: i, name: 'w' + i, pair: [i, -i] });
  return kept;
}
const usage = () => {
  const u = process.memoryUsage();
  return { heapTotal: u.heapTotal, heapUsed: u.heapUsed, external: u.external, arrayBuffers: u.arrayBuffers, physical: v8.getHeapStatistics().total_physical_size };
};

if (isMainThread) {
  const count = Number(process.argv[2] || 2);
  const mib = Number(process.argv[3] || 16);
  const idle = Number(process.argv[4] || 1600);
  const kept = hold(mib);
  const workers = [];
  const reports = [];
  for (let i = 0; i < count; i++) {
    const w = new Worker(__filename, { workerData: { mib: mib * (i + 2) / 2 } });
    w.on('message', (m) => {
      reports.push(m);
      if (reports.length < count) return;
      // The first console.log sets up the console and its stream: before the figures.
      console.log('figures follow');
      gc();
      const isolates = [usage(), ...reports];
      const sum = {};
      for (const key of ['heapTotal', 'heapUsed', 'external', 'arrayBuffers', 'physical']) sum[key] = isolates.reduce((a, u) => a + u[key], 0);
      console.log(JSON.stringify({ isolates, sum }));
      setTimeout(() => { for (const x of workers) x.postMessage('stop'); console.log('held', kept.length); }, idle);
    });
    workers.push(w);
  }
} else {
  const kept = hold(workerData.mib);
  gc();
  parentPort.postMessage(usage());
  parentPort.on('message', () => { parentPort.close(); kept.length = 0; });
}
