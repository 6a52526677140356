// A browser for the client module without a browser: a manual clock, sockets
// and event streams the test drives, a window and a document to fire events on.

export function fakeEnv({ random = Math.random } = {}) {
  const env = { sockets: [], streams: [], timers: [], clock: 0 };
  let nextId = 1;
  env.now = () => env.clock;
  env.random = random;
  env.setTimeout = (f, ms) => {
    const t = { id: nextId++, at: env.clock + Math.max(0, ms || 0), f };
    env.timers.push(t);
    return t.id;
  };
  env.clearTimeout = (id) => { env.timers = env.timers.filter((t) => t.id !== id); };
  // Runs every timer due within `ms` from now, in time order.
  env.advance = async (ms) => {
    const end = env.clock + ms;
    for (;;) {
      await flush();
      const due = env.timers.filter((t) => t.at <= end).sort((a, b) => a.at - b.at || a.id - b.id)[0];
      if (!due) break;
      env.timers = env.timers.filter((t) => t !== due);
      env.clock = Math.max(env.clock, due.at);
      due.f();
    }
    env.clock = end;
    await flush();
  };
  // The delay of the one pending timer that is not a zero-delay one.
  env.pendingDelays = () => env.timers.map((t) => t.at - env.clock);
  env.window = new EventTarget();
  env.document = new EventTarget();
  env.document.visibilityState = 'visible';

  class FakeWebSocket {
    constructor(url) {
      this.url = url;
      this.readyState = 0;
      this.sent = [];
      env.sockets.push(this);
    }
    send(m) { this.sent.push(JSON.parse(m)); }
    close(code) { this.readyState = 3; this.closedByClient = true; this.closeCode = code; }
    // Test side: the server opens, says hello, sends a message, closes.
    open(hello = { type: 'hello', user: 'u1', role: 'student', tick_ms: 200, node: 'n1' }) {
      this.readyState = 1;
      if (this.onopen) this.onopen({});
      if (hello) this.message(hello);
    }
    message(obj) { if (this.onmessage) this.onmessage({ data: JSON.stringify(obj) }); }
    serverClose(code = 1006) { this.readyState = 3; if (this.onclose) this.onclose({ code }); }
    // Courses named in the upgrade, then those sent in watch messages.
    watched() { return [...this.named(), ...this.sent.filter((m) => m.op === 'watch').map((m) => m.course)]; }
    named() { return new URL(this.url).searchParams.getAll('course'); }
  }

  class FakeEventSource extends EventTarget {
    constructor(url) {
      super();
      this.url = url;
      this.closed = false;
      env.streams.push(this);
    }
    close() { this.closed = true; }
    emit(type, obj) { this.dispatchEvent(Object.assign(new Event(type), { data: JSON.stringify(obj) })); }
    fail() { if (this.onerror) this.onerror(new Event('error')); }
  }

  env.WebSocket = FakeWebSocket;
  env.EventSource = FakeEventSource;
  return env;
}

// Lets promise callbacks (an awaited token) run.
export async function flush() {
  for (let i = 0; i < 5; i++) await Promise.resolve();
}

export function frame(course, sections, full = false) {
  return { type: 'frame', course, full, sections };
}

export function sec(section, total, taken, version) {
  const s = { section, total_seats: total, seats_taken: taken };
  if (version !== undefined) s.version = version;
  return s;
}

export function record(client, type) {
  const seen = [];
  client.addEventListener(type, (ev) => seen.push(ev.detail));
  return seen;
}
