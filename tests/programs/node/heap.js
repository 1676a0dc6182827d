// Holds a graph of small objects in V8's old space (and a few Buffers in
// malloc), collects garbage fully, prints its own process.memoryUsage() and
// V8's total_physical_size as one JSON line, then idles so that memgap
// snapshots it as it printed.
// Usage: node heap.js [MIB_OF_OBJECTS] [IDLE_MS]
'use strict';
const v8 = require('v8');
const vm = require('vm');
v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc');
const mib = Number(process.argv[2] || 40);
const idle = Number(process.argv[3] || 1600);
const kept = [];
// About 80 bytes per entry: an object, its array and a short string.
for (let i = 0; i < mib * 13000; i++) kept.push({ id: i, name: 'n' + i, pair: [i, -i] });
const buffers = [];
for (let i = 0; i < 64; i++) buffers.push(Buffer.alloc(64 * 1024, i));
// The first console.log sets up the console and its stream: before the figures.
console.log('figures follow');
gc();
console.log(JSON.stringify({ ...process.memoryUsage(), physical: v8.getHeapStatistics().total_physical_size }));
setTimeout(() => console.log('held', kept.length, buffers.length), idle);
