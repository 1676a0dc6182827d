// Starts another Node program as a child process (heap.js, with the given
// arguments), passing its output through, and exits with its status.
// Usage: node children.js [ARGS FOR heap.js...]
'use strict';
const { spawnSync } = require('child_process');
const path = require('path');
const child = spawnSync(process.execPath, [path.join(__dirname, 'heap.js'), ...process.argv.slice(2)], { stdio: 'inherit' });
process.exitCode = child.status === null ? 1 : child.status;
