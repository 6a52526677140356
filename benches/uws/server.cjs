// The connect_cost scenario's reference: uWebSockets.js upgrading
// /sub/<channel> (or any path with ?course=<channel>) and subscribing the
// socket to that topic, on N worker threads sharing one port.
//   node server.cjs <port> <threads>
// Prints "listening" once every thread listens. The native binary is loaded
// directly: the package's index falls back to a pure-JS server when the
// binary does not load, which would measure something else.
'use strict';
const { Worker, isMainThread, workerData, parentPort } = require('node:worker_threads');
const path = require('node:path');

const ABI = process.versions.modules;
const BIN = path.join(__dirname, 'node_modules/@trufflesuite/uws-js-unofficial/dist', `uws_${process.platform}_${process.arch}_${ABI}.node`);

function load() {
  try {
    return require(BIN);
  } catch (e) {
    console.error(`uWebSockets.js did not load from ${BIN}: ${e.message}`);
    process.exit(3);
  }
}

if (isMainThread) {
  const port = Number(process.argv[2]);
  const threads = Number(process.argv[3] || 2);
  load();
  let up = 0;
  for (let i = 0; i < threads; i++) {
    const w = new Worker(__filename, { workerData: { port } });
    w.on('message', (m) => {
      if (m === 'listening' && ++up === threads) console.log('listening');
      if (m === 'failed') { console.error(`uWebSockets.js could not listen on ${port}`); process.exit(4); }
    });
    w.on('error', (e) => { console.error(`worker: ${e.message}`); process.exit(5); });
  }
} else {
  const uWS = load();
  const app = uWS.App();
  app.ws('/*', {
    compression: uWS.DISABLED,
    idleTimeout: 0,
    upgrade: (res, req, context) => {
      const url = req.getUrl();
      const q = new URLSearchParams(req.getQuery() || '');
      const topic = url.startsWith('/sub/') ? url.slice(5) : (q.get('course') || 'all');
      res.upgrade({ topic }, req.getHeader('sec-websocket-key'), req.getHeader('sec-websocket-protocol'),
        req.getHeader('sec-websocket-extensions'), context);
    },
    open: (ws) => { ws.subscribe(ws.getUserData().topic); },
    message: () => {},
  });
  app.listen('127.0.0.1', workerData.port, (token) => parentPort.postMessage(token ? 'listening' : 'failed'));
}
