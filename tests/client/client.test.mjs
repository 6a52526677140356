// The browser client's logic (src/web/client.js) in Node: node --test tests/client/
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  backoffDelay, applyFrame, seatOpenings, SeatClient, clientRegistry, countText, courseList, endpoint,
} from '../../src/web/client.js';
import { fakeEnv, frame, sec, record, flush } from './fakes.mjs';

// A seeded generator, so the spread checks are the same on every run.
function seeded(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function client(env, opts = {}) {
  return new SeatClient({ url: 'http://seats.test:8080', ...opts }, env);
}

// Starts a client and brings its first socket up (hello received).
async function live(env, opts) {
  const c = client(env, opts);
  await env.advance(0);
  env.sockets.at(-1).open();
  await env.advance(0);
  return c;
}

test('backoff stays within [0, min(30 s, 0.5 s x 2^attempt))', () => {
  const random = seeded(1);
  for (let attempt = 0; attempt < 12; attempt++) {
    const ceiling = Math.min(30000, 500 * 2 ** attempt);
    let max = 0;
    for (let i = 0; i < 2000; i++) {
      const d = backoffDelay(attempt, random);
      assert.ok(d >= 0 && d < ceiling, `attempt ${attempt}: ${d}`);
      max = Math.max(max, d);
    }
    assert.ok(max > ceiling * 0.99, `attempt ${attempt} reaches its ceiling (max ${max})`);
  }
  assert.equal(backoffDelay(3, () => 0), 0);
  assert.equal(backoffDelay(40, () => 0.5), 15000);
});

test('backoff is full jitter: uniform over the whole window, not bunched near the ceiling', () => {
  const random = seeded(7);
  const draws = 20000;
  const buckets = new Array(10).fill(0);
  for (let i = 0; i < draws; i++) buckets[Math.floor(backoffDelay(6, random) / 3000)]++;
  for (const [i, n] of buckets.entries()) {
    assert.ok(n > draws * 0.085 && n < draws * 0.115, `bucket ${i} holds ${n} of ${draws}: ${buckets}`);
  }
  // Two clients failing at the same moment almost never pick the same delay.
  const a = Array.from({ length: 1000 }, () => Math.round(backoffDelay(6, random)));
  assert.ok(new Set(a).size > 950, `distinct delays: ${new Set(a).size}`);
});

test('the client backs off with growing windows and starts over once live', async () => {
  const env = fakeEnv({ random: () => 0.999 });
  const c = await live(env, { transport: 'websocket' });
  assert.equal(c.status, 'live');
  const statuses = record(c, 'status');
  const delays = [];
  for (let i = 0; i < 8; i++) {
    env.sockets.at(-1).serverClose(1006);
    delays.push(Math.round(c.retryAt - env.clock));
    const before = env.sockets.length;
    await env.advance(delays.at(-1) - 1);
    assert.equal(env.sockets.length, before, 'no attempt before the delay is over');
    await env.advance(1);
    assert.equal(env.sockets.length, before + 1, 'an attempt once it is over');
  }
  assert.deepEqual(delays, [500, 999, 1998, 3996, 7992, 15984, 29970, 29970]);
  assert.ok(statuses.every((s) => s.status === 'reconnecting'), JSON.stringify(statuses));
  env.sockets.at(-1).open();
  assert.equal(c.status, 'live');
  env.sockets.at(-1).serverClose(1006);
  assert.equal(Math.round(c.retryAt - env.clock), 500, 'backoff reset once live');
});

test('a drain hint is honoured: the next attempt comes at after_ms, not before', async () => {
  const env = fakeEnv({ random: () => 0 });
  const c = await live(env);
  const statuses = record(c, 'status');
  const ws = env.sockets.at(-1);
  ws.message({ type: 'reconnect', after_ms: 1234 });
  assert.equal(statuses.at(-1).reason, 'drain');
  assert.equal(statuses.at(-1).delay_ms, 1234);
  await env.advance(10);
  ws.serverClose(1012);
  assert.equal(statuses.length, 1, 'the close after the hint is no second status event');
  assert.equal(c.status, 'reconnecting');
  await env.advance(1223);
  assert.equal(env.sockets.length, 1, 'not before the hinted time (backoff would have been 0)');
  await env.advance(1);
  assert.equal(env.sockets.length, 2);
  // A server that sends the hint and never closes: the client leaves at the hint itself.
  env.sockets.at(-1).open();
  env.sockets.at(-1).message({ type: 'reconnect', after_ms: 300 });
  await env.advance(299);
  assert.equal(env.sockets.length, 2);
  await env.advance(1);
  assert.equal(env.sockets.length, 3);
  assert.ok(env.sockets[1].closedByClient);
});

test('courses watched before a break are watched again, each once', async () => {
  const env = fakeEnv({ random: () => 0.5 });
  const c = client(env);
  c.watch('CS101');
  c.watch('MATH101');
  await env.advance(0);
  env.sockets[0].open();
  await env.advance(0);
  assert.deepEqual(env.sockets[0].watched(), ['CS101', 'MATH101']);
  c.unwatch('MATH101');
  c.watch('ART150');
  await env.advance(0);
  env.sockets[0].serverClose(1006);
  await env.advance(250);
  assert.equal(env.sockets.length, 2);
  assert.deepEqual(env.sockets[1].sent, [], 'nothing sent before hello');
  env.sockets[1].open();
  await env.advance(0);
  assert.deepEqual(env.sockets[1].watched().sort(), ['ART150', 'CS101']);
  assert.equal(env.sockets[1].sent.filter((m) => m.op === 'unwatch').length, 0);
});

test('a WebSocket names its courses in the upgrade (at most 32); later ones go as watch messages', async () => {
  const env = fakeEnv({ random: () => 0.5 });
  const c = client(env);
  const codes = Array.from({ length: 34 }, (_, i) => `C${i}`);
  for (const code of codes) c.watch(code);
  await env.advance(0);
  const ws = env.sockets[0];
  assert.equal(new URL(ws.url).pathname, '/ws');
  assert.deepEqual(ws.named(), codes.slice(0, 32));
  ws.open();
  await env.advance(0);
  assert.deepEqual(ws.sent, [], 'the named courses need no watch message');
  // The server's first boards come with the hello: they are taken as watch answers.
  const frames = record(c, 'frame');
  ws.message(frame('C0', [sec(1, 10, 4, 1)], true));
  assert.equal(frames.length, 1);
  assert.equal(c.state('C0').get(1).seats_taken, 4);
  c.unwatch('C1');
  c.watch('CS101');
  await env.advance(0);
  assert.deepEqual(ws.sent, [{ op: 'unwatch', course: 'C1' }, { op: 'watch', course: 'C32' }],
    'room made by an unwatch goes to the next wanted course, by message');
  await env.advance(0);
  assert.ok(!ws.sent.some((m) => m.course === 'CS101'), 'still 32 on the wire');
  // After a break the next upgrade names what is wanted now.
  ws.serverClose(1006);
  await env.advance(500);
  assert.equal(env.sockets.length, 2);
  assert.deepEqual(env.sockets[1].named(), [...codes.slice(0, 1), ...codes.slice(2), 'CS101'].slice(0, 32));
});

test('a token function is called on every attempt, and a failing one is retried', async () => {
  const env = fakeEnv({ random: () => 0.5 });
  let calls = 0;
  const c = client(env, {
    token: async () => {
      calls += 1;
      if (calls === 2) throw new Error('identity provider down');
      return `t${calls}`;
    },
  });
  await env.advance(0);
  assert.equal(calls, 1);
  assert.equal(new URL(env.sockets[0].url).searchParams.get('token'), 't1');
  assert.equal(new URL(env.sockets[0].url).protocol, 'ws:');
  env.sockets[0].serverClose(1006);
  await env.advance(249);
  assert.equal(calls, 1);
  await env.advance(1);
  assert.equal(calls, 2);
  assert.equal(env.sockets.length, 1, 'no socket without a token');
  assert.equal(c.status, 'reconnecting');
  await env.advance(500);
  assert.equal(calls, 3);
  assert.equal(new URL(env.sockets[1].url).searchParams.get('token'), 't3');
  const plain = client(fakeEnv(), { token: 'abc', url: 'https://seats.test' });
  await plain._env.advance(0);
  assert.equal(plain._env.sockets[0].url, 'wss://seats.test/ws?token=abc');
});

test('seatopen fires only when a section seen full frees a seat, never on a first frame', async () => {
  const env = fakeEnv({ random: () => 0 });
  const c = client(env);
  c.watch('CS101');
  const opened = record(c, 'seatopen');
  const frames = record(c, 'frame');
  await env.advance(0);
  const ws = env.sockets[0];
  ws.open();
  await env.advance(0);
  assert.equal(c.state('CS101'), null, 'nothing before the first frame');
  ws.message(frame('CS101', [sec(1, 10, 4, 1), sec(3, 2, 1, 1)], true));
  assert.deepEqual(opened, [], 'first frame: no alert even for free seats');
  assert.equal(frames.length, 1);
  ws.message(frame('CS101', [sec(3, 2, 2, 2)]));
  assert.deepEqual(opened, [], 'becoming full is no alert');
  ws.message(frame('CS101', [sec(1, 10, 5, 2)]));
  assert.deepEqual(opened, [], 'a section with seats that changes is no alert');
  ws.message(frame('CS101', [sec(3, 2, 1, 3)]));
  assert.deepEqual(opened, [{ course: 'CS101', section: 3, seats_left: 1 }]);
  ws.message(frame('CS101', [sec(3, 2, 0, 4)]));
  assert.equal(opened.length, 1, 'still free: no second alert');
  assert.equal(c.state('CS101').get(3).seats_taken, 0);
  assert.equal(c.state('CS101').get(1).seats_taken, 5, 'a delta keeps the other sections');
  // A course first watched while its section is full, across a break.
  ws.message(frame('CS101', [sec(3, 2, 2, 5)]));
  ws.serverClose(1006);
  await env.advance(0);
  env.sockets[1].open();
  await env.advance(0);
  env.sockets[1].message(frame('CS101', [sec(1, 10, 5, 2), sec(3, 2, 1, 6)], true));
  assert.deepEqual(opened.at(-1), { course: 'CS101', section: 3, seats_left: 1 }, 'freed during the break');
  assert.equal(opened.length, 2);
  // Unwatched and watched again: the next frame is a first frame again.
  c.unwatch('CS101');
  await env.advance(0);
  c.watch('CS101');
  await env.advance(0);
  env.sockets[1].message(frame('CS101', [sec(3, 2, 2, 7)], true));
  env.sockets[1].message(frame('CS101', [sec(3, 2, 1, 8)], true));
  assert.equal(opened.length, 3);
  assert.deepEqual(env.sockets[1].sent.slice(-2), [{ op: 'unwatch', course: 'CS101' }, { op: 'watch', course: 'CS101' }]);
});

test('applyFrame: full frames replace, deltas merge, older versions are ignored', () => {
  const a = applyFrame(null, frame('X', [sec(2, 5, 5, 3), sec(1, 5, 1, 3)], true));
  assert.deepEqual([...a.sections.keys()], [2, 1]);
  assert.deepEqual(a.opened, []);
  const b = applyFrame(a.sections, frame('X', [sec(2, 5, 4, 2)]));
  assert.equal(b.sections.get(2).seats_taken, 5, 'version 2 is older than 3');
  assert.deepEqual(b.opened, []);
  const c = applyFrame(a.sections, frame('X', [sec(2, 5, 4, 4)]));
  assert.deepEqual(c.opened, [{ section: 2, seats_left: 1 }]);
  assert.equal(a.sections.get(2).seats_taken, 5, 'the held map is not changed in place');
  const d = applyFrame(c.sections, frame('X', [sec(9, 1, 0)], true));
  assert.deepEqual([...d.sections.keys()], [9]);
  assert.deepEqual(seatOpenings(null, d.sections), []);
  assert.deepEqual(applyFrame(null, { type: 'frame', course: 'X', sections: 'junk' }).sections.size, 0);
});

test('watch and unwatch are counted, and quick changes collapse before anything is sent', async () => {
  const env = fakeEnv();
  const c = await live(env);
  const ws = env.sockets[0];
  c.watch('CS101');
  c.watch('CS101');
  c.watch('BIO101');
  c.unwatch('BIO101');
  await env.advance(0);
  assert.deepEqual(ws.sent, [{ op: 'watch', course: 'CS101' }]);
  c.unwatch('CS101');
  await env.advance(0);
  assert.equal(ws.sent.length, 1, 'one holder left: still watched');
  assert.deepEqual(c.courses(), ['CS101']);
  c.unwatch('CS101');
  await env.advance(0);
  assert.deepEqual(ws.sent.at(-1), { op: 'unwatch', course: 'CS101' });
  assert.deepEqual(c.courses(), []);
  c.watch('not a course!');
  await env.advance(0);
  assert.equal(ws.sent.length, 2, 'a malformed code is never sent');
});

test('watches stay under the server limits: 16 messages a second, 32 courses', async () => {
  const env = fakeEnv();
  const c = await live(env);
  const ws = env.sockets[0];
  const codes = Array.from({ length: 40 }, (_, i) => `C${i}`);
  for (const code of codes) c.watch(code);
  await env.advance(0);
  assert.equal(ws.sent.length, 16);
  await env.advance(999);
  assert.equal(ws.sent.length, 16);
  await env.advance(1);
  assert.equal(ws.sent.length, 32);
  await env.advance(5000);
  assert.equal(ws.sent.length, 32, 'at most 32 courses on one connection');
  assert.deepEqual(ws.watched(), codes.slice(0, 32));
});

test('one client per page and host, shared; a closed one is replaced', async () => {
  const connect = clientRegistry(() => fakeEnv());
  const a = connect({ url: 'https://seats.test/' });
  const b = connect({ url: 'https://seats.test', token: 'late' });
  assert.equal(a, b);
  assert.equal(a.token, 'late', 'an element token fills in a client without one');
  const first = connect({ url: 'https://seats.test', token: 'other' });
  assert.equal(first.token, 'late', 'the page configured it first');
  const other = connect({ url: 'https://other.test' });
  assert.notEqual(a, other);
  a.close();
  assert.equal(a.status, 'closed');
  const again = connect({ url: 'https://seats.test' });
  assert.notEqual(again, a);
  await a._env.advance(1000);
  assert.equal(a._env.sockets.length, 0, 'a client closed before its first attempt never connects');
});

test('elements share the connection: the course leaves the wire with the last element that needs it', async () => {
  // What <seat-count>/<seat-board> do on connect and removal: one watch() per course they show.
  const connect = clientRegistry(() => fakeEnv());
  const page = connect({ url: 'https://seats.test' });
  const env = page._env;
  const cells = [['CS101'], ['CS101'], ['CS101', 'MATH101']].map((courses) => ({ client: connect({ url: 'https://seats.test' }), courses }));
  for (const cell of cells) for (const course of cell.courses) cell.client.watch(course);
  await env.advance(0);
  assert.equal(env.sockets.length, 1, 'one WebSocket for all elements');
  env.sockets[0].open();
  await env.advance(0);
  assert.deepEqual(env.sockets[0].named(), ['CS101', 'MATH101'], 'named once each in the upgrade');
  assert.deepEqual(env.sockets[0].sent, [], 'no watch message');
  const drop = (cell) => { for (const course of cell.courses) cell.client.unwatch(course); };
  drop(cells[2]);
  await env.advance(0);
  assert.deepEqual(env.sockets[0].sent.at(-1), { op: 'unwatch', course: 'MATH101' });
  drop(cells[0]);
  await env.advance(0);
  assert.equal(env.sockets[0].sent.length, 1, 'CS101 is still needed');
  drop(cells[1]);
  await env.advance(0);
  assert.deepEqual(env.sockets[0].sent.at(-1), { op: 'unwatch', course: 'CS101' });
});

test('online and a page coming back into view reconnect at once while disconnected', async () => {
  const env = fakeEnv({ random: () => 0.999 });
  const c = await live(env, { transport: 'websocket' });
  for (let i = 0; i < 6; i++) {
    env.sockets.at(-1).serverClose(1006);
    await env.advance(c.retryAt - env.clock);
  }
  env.sockets.at(-1).serverClose(1006);
  assert.ok(c.retryAt - env.clock > 20000, 'a long wait is pending');
  const n = env.sockets.length;
  env.window.dispatchEvent(new Event('online'));
  await env.advance(0);
  assert.equal(env.sockets.length, n + 1, 'online: at once');
  env.sockets.at(-1).serverClose(1006);
  env.document.visibilityState = 'hidden';
  env.document.dispatchEvent(new Event('visibilitychange'));
  await env.advance(0);
  assert.equal(env.sockets.length, n + 1, 'hidden: nothing');
  env.document.visibilityState = 'visible';
  env.document.dispatchEvent(new Event('visibilitychange'));
  await env.advance(0);
  assert.equal(env.sockets.length, n + 2, 'visible again: at once');
  env.sockets.at(-1).open();
  env.window.dispatchEvent(new Event('online'));
  env.document.dispatchEvent(new Event('visibilitychange'));
  await env.advance(0);
  assert.equal(env.sockets.length, n + 2, 'while connected: nothing');
  c.close();
  env.window.dispatchEvent(new Event('online'));
  await env.advance(60000);
  assert.equal(env.sockets.length, n + 2, 'closed: never again');
});

test('transport auto: SSE after two WebSocket attempts in a row fail before hello, WebSocket again when SSE fails too', async () => {
  const env = fakeEnv({ random: () => 0 });
  const c = client(env, { token: () => 'tok' });
  c.watch('CS101');
  c.watch('MATH101');
  await env.advance(0);
  env.sockets[0].serverClose(1006);
  await env.advance(0);
  assert.equal(env.sockets.length, 2, 'one failure: WebSocket again');
  env.sockets[1].serverClose(1006);
  await env.advance(0);
  assert.equal(env.sockets.length, 2);
  assert.equal(env.streams.length, 1);
  const es = env.streams[0];
  const u = new URL(es.url);
  assert.equal(u.origin + u.pathname, 'http://seats.test:8080/sse');
  assert.deepEqual(u.searchParams.getAll('course'), ['CS101', 'MATH101']);
  assert.equal(u.searchParams.get('token'), 'tok');
  es.emit('hello', { type: 'hello', user: 'u1', role: 'student', tick_ms: 200, node: 'n1' });
  assert.equal(c.status, 'live');
  es.emit('frame', frame('CS101', [sec(1, 2, 2)], true));
  es.emit('presence', { type: 'presence', course: 'CS101', viewers: 4 });
  assert.equal(c.state('CS101').get(1).seats_taken, 2);
  assert.equal(c.viewers('CS101'), 4);
  // The course list of a stream is fixed: a change opens a new stream.
  c.unwatch('MATH101');
  await env.advance(0);
  assert.ok(es.closed);
  assert.deepEqual(new URL(env.streams[1].url).searchParams.getAll('course'), ['CS101']);
  // Drain over SSE: the hint, then the server ends the stream.
  const es2 = env.streams[1];
  es2.emit('hello', { type: 'hello', user: 'u1', role: 'student', tick_ms: 200, node: 'n1' });
  es2.emit('reconnect', { type: 'reconnect', after_ms: 700 });
  es2.fail();
  assert.ok(es2.closed, 'the browser does not reconnect it on its own');
  await env.advance(699);
  assert.equal(env.streams.length, 2);
  await env.advance(1);
  assert.equal(env.streams.length, 3, 'again at the hinted time');
  // A stream refused before hello (HTTP error, node down): WebSocket again,
  // then SSE again after two more WebSocket failures.
  env.streams[2].fail();
  await env.advance(0);
  assert.equal(env.streams.length, 3);
  assert.equal(env.sockets.length, 3, 'back to WebSocket');
  env.sockets[2].serverClose(1006);
  await env.advance(0);
  assert.equal(env.sockets.length, 4);
  env.sockets[3].serverClose(1006);
  await env.advance(0);
  assert.equal(env.streams.length, 4, 'SSE after two WebSocket failures in a row');
  assert.equal(env.sockets.length, 4);
});

test('transport websocket never falls back; sse never tries a WebSocket', async () => {
  const env = fakeEnv({ random: () => 0 });
  client(env, { transport: 'websocket' });
  for (let i = 0; i < 5; i++) {
    await env.advance(0);
    env.sockets.at(-1).serverClose(1006);
  }
  await env.advance(0);
  assert.equal(env.streams.length, 0);
  assert.equal(env.sockets.length, 6);
  const env2 = fakeEnv();
  client(env2, { transport: 'sse' });
  await env2.advance(0);
  assert.equal(env2.sockets.length, 0);
  assert.equal(env2.streams.length, 1);
});

test('a WebSocket failure after hello does not count toward the SSE fallback', async () => {
  const env = fakeEnv({ random: () => 0 });
  await live(env);
  env.sockets[0].serverClose(1006);
  await env.advance(0);
  env.sockets[1].serverClose(1006);
  await env.advance(0);
  assert.equal(env.streams.length, 0, 'only one failure before hello so far');
  assert.equal(env.sockets.length, 3);
});

test('the text of a seat count: an ellipsis before the first frame, Full at 0', () => {
  assert.equal(countText(null, false), '\u2026');
  assert.equal(countText(undefined, true), '\u2014');
  assert.equal(countText(sec(1, 42, 30), true), '12 seats left');
  assert.equal(countText(sec(1, 42, 41), true), '1 seat left');
  assert.equal(countText(sec(1, 42, 42), true), 'Full');
  assert.equal(countText(sec(1, 42, 50), true), 'Full');
  assert.deepEqual(courseList(' CS101  MATH101 CS101 bad/code '), ['CS101', 'MATH101']);
  assert.equal(courseList('A B C D E F G H I J').length, 8);
  assert.equal(endpoint('https://s.test', '/ws', [['token', 'a b']], true), 'wss://s.test/ws?token=a+b');
});

test('frames and presence of courses nobody watches are ignored; junk is dropped', async () => {
  const env = fakeEnv();
  const c = await live(env);
  const frames = record(c, 'frame');
  env.sockets[0].onmessage({ data: 'not json' });
  env.sockets[0].message(frame('OTHER', [sec(1, 1, 1)], true));
  env.sockets[0].message({ type: 'presence', course: 'OTHER', viewers: 3 });
  assert.equal(frames.length, 0);
  assert.equal(c.state('OTHER'), null);
  const errors = record(c, 'error');
  env.sockets[0].message({ type: 'error', code: 'bad_course', message: 'no' });
  assert.deepEqual(errors, [{ code: 'bad_course', message: 'no' }]);
  await flush();
});

test('an online event before the first attempt opens no second connection', async () => {
  const env = fakeEnv();
  client(env);
  env.window.dispatchEvent(new Event('online'));
  await env.advance(0);
  await env.advance(1000);
  assert.equal(env.sockets.length, 1);
  assert.ok(!env.sockets[0].closedByClient);
});

test('pagehide closes with 1000 and schedules nothing; pageshow persisted reconnects and watches again', async () => {
  const env = fakeEnv({ random: () => 0.5 });
  const c = await live(env, { transport: 'websocket' });
  c.watch('CS101');
  await env.advance(0);
  env.sockets[0].message(frame('CS101', [sec(1, 30, 10, 1)], true));
  const statuses = record(c, 'status');
  env.window.dispatchEvent(Object.assign(new Event('pagehide'), { persisted: true }));
  await env.advance(0);
  assert.equal(env.sockets[0].closeCode, 1000, 'closed with 1000');
  assert.equal(c.status, 'reconnecting', 'says it is reconnecting');
  assert.equal(statuses.at(-1).reason, 'pagehide');
  assert.equal(c.state('CS101').get(1).seats_taken, 10, 'keeps its last values');
  await env.advance(120000);
  assert.equal(env.sockets.length, 1, 'no reconnect while in the cache');
  env.window.dispatchEvent(new Event('online'));
  env.document.dispatchEvent(new Event('visibilitychange'));
  await env.advance(0);
  assert.equal(env.sockets.length, 1, 'online or visible: still nothing while hidden');
  env.window.dispatchEvent(Object.assign(new Event('pageshow'), { persisted: true }));
  await env.advance(0);
  assert.equal(env.sockets.length, 2, 'pageshow persisted: at once');
  env.sockets[1].open();
  await env.advance(0);
  assert.deepEqual(env.sockets[1].watched(), ['CS101'], 'watches again');
  assert.equal(c.status, 'live');
});

// A client in auto mode that fell back to SSE and is live on its stream.
async function liveOnFallback(env) {
  const c = client(env, { token: () => 'tok' });
  c.watch('CS101');
  await env.advance(0);
  env.sockets[0].serverClose(1006);
  await env.advance(0);
  env.sockets[1].serverClose(1006);
  await env.advance(0);
  const es = env.streams[0];
  es.emit('hello', { type: 'hello', user: 'u1', role: 'student', tick_ms: 200, node: 'n1' });
  es.emit('frame', frame('CS101', [sec(1, 2, 2)], true));
  return { c, es };
}

test('live on a fallback stream, a WebSocket beside it takes over once it has its hello', async () => {
  const env = fakeEnv({ random: () => 0 });
  const { c, es } = await liveOnFallback(env);
  const statuses = record(c, 'status');
  await env.advance(4999);
  assert.equal(env.sockets.length, 2, 'no probe before 5 s');
  await env.advance(1);
  assert.equal(env.sockets.length, 3, 'a WebSocket is tried beside the stream');
  const probe = env.sockets[2];
  assert.equal(new URL(probe.url).searchParams.get('token'), 'tok');
  assert.deepEqual(probe.named(), [], 'the probe names no course');
  assert.ok(!es.closed, 'the stream stays while the probe is out');
  probe.open();
  await env.advance(0);
  assert.ok(es.closed, 'the stream closes once the WebSocket has its hello');
  assert.deepEqual(probe.sent, [{ op: 'watch', course: 'CS101' }]);
  assert.deepEqual(statuses, [], 'live all along');
  assert.equal(c.state('CS101').get(1).seats_taken, 2, 'the board is kept meanwhile');
  probe.message(frame('CS101', [sec(1, 2, 1)], true));
  assert.equal(c.state('CS101').get(1).seats_taken, 1);
  es.emit('frame', frame('CS101', [sec(1, 2, 0)], true));
  assert.equal(c.state('CS101').get(1).seats_taken, 1, 'the old stream is not heard');
  // From now on it is a WebSocket client: a break reconnects over WebSocket.
  probe.serverClose(1006);
  await env.advance(0);
  assert.equal(env.sockets.length, 4);
  assert.equal(env.streams.length, 1);
});

test('a probe that fails leaves the stream alone; the next comes at a doubled interval', async () => {
  const env = fakeEnv({ random: () => 0 });
  const { c, es } = await liveOnFallback(env);
  await env.advance(5000);
  assert.equal(env.sockets.length, 3);
  env.sockets[2].serverClose(1006);
  await env.advance(0);
  assert.ok(!es.closed);
  assert.equal(c.status, 'live');
  assert.equal(env.streams.length, 1, 'no reconnect for a failed probe');
  await env.advance(9999);
  assert.equal(env.sockets.length, 3, 'the second probe waits 10 s');
  await env.advance(1);
  assert.equal(env.sockets.length, 4);
  env.sockets[3].serverClose(1006);
  await env.advance(20000);
  assert.equal(env.sockets.length, 5, 'then 20 s');
  // A probe whose first message is no hello is a failure too.
  env.sockets[4].open({ type: 'error', code: 'x' });
  await env.advance(0);
  assert.ok(env.sockets[4].closedByClient);
  assert.ok(!es.closed);
  // The intervals stop growing at 5-10 minutes.
  for (let i = 0; i < 12; i++) {
    await env.advance(600000);
    env.sockets.at(-1).serverClose(1006);
  }
  await env.advance(299999);
  const n = env.sockets.length;
  await env.advance(1);
  assert.equal(env.sockets.length, n + 1, 'capped at 5 min with no jitter');
});

test('probes stop with the stream: none while reconnecting, none for transport sse, none after close', async () => {
  const env = fakeEnv({ random: () => 0 });
  const { c, es } = await liveOnFallback(env);
  await env.advance(5000);
  const probe = env.sockets[2];
  es.fail();
  assert.ok(probe.closedByClient, 'the probe in flight is closed with its stream');
  await env.advance(0);
  assert.equal(env.streams.length, 2, 'a fallback stream that had its hello comes back as a stream');
  c.close();
  await env.advance(3600000);
  assert.equal(env.sockets.length, 3, 'no probe after close');
  const env2 = fakeEnv({ random: () => 0 });
  client(env2, { transport: 'sse' });
  await env2.advance(0);
  env2.streams[0].emit('hello', { type: 'hello', user: 'u1', role: 'student', tick_ms: 200, node: 'n1' });
  await env2.advance(3600000);
  assert.equal(env2.sockets.length, 0, 'transport sse never probes');
});
