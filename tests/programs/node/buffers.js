// Buffer churn: Buffers of 8 to 64 KiB (ArrayBuffer backing stores, from
// malloc) come and go, one in KEEP_EVERY survives each round; after the
// last round the program collects garbage fully, prints its own
// process.memoryUsage() as one JSON line, idles, and prints it again.
// Usage: node buffers.js [ROUNDS] [IDLE_MS] [KEEP_EVERY]
'use strict';
const v8 = require('v8');
const vm = require('vm');
v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc');
const rounds = Number(process.argv[2] || 6);
const idle = Number(process.argv[3] || 2500);
const keepEvery = Number(process.argv[4] || 16);
const survivors = [];
let seed = 12345;
const random = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
for (let round = 0; round < rounds; round++) {
  let batch = [];
  for (let i = 0; i < 1600; i++) batch.push(Buffer.alloc(8192 + Math.floor(random() * 57344), round));
  for (let i = 0; i < batch.length; i += keepEvery) survivors.push(batch[i]);
  batch = null;
  gc();
}
// The first console.log sets up the console and its stream: before the figures.
console.log('figures follow');
gc();
console.log(JSON.stringify(process.memoryUsage()));
setTimeout(() => {
  console.log(JSON.stringify(process.memoryUsage()));
  console.log('survivors', survivors.length);
}, idle);
