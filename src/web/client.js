// seatboard browser client (contract §5b): live seats on any page, one
// connection per page and host, and the <seat-count> / <seat-board> elements.
// An ES module with no dependencies; served by seatboard at /client.js.

const BASE_MS = 500;
const CAP_MS = 30000;
const SEND_BUDGET = 16;        // client messages per second (the server closes past 20)
const MAX_COURSES = 32;        // per connection (contract §5)
const WS_TRIES_BEFORE_SSE = 2;
// Live on SSE after a fallback, WebSocket is tried again in the background
// after 5-10 s, then at doubling intervals up to 5-10 min: a node that was
// down when two WebSocket attempts failed does not pin the page to SSE.
const PROBE_MS = 10000;
const PROBE_CAP_MS = 600000;
const COURSE_RE = /^[A-Za-z0-9_.-]{1,64}$/;

/** Reconnect delay for the given attempt (0 = the first after live): full jitter. */
export function backoffDelay(attempt, random = Math.random) {
  return random() * Math.min(CAP_MS, BASE_MS * 2 ** Math.max(0, attempt));
}

const count = (v) => {
  const n = Number(v);
  return Number.isFinite(n) ? Math.max(0, Math.trunc(n)) : 0;
};

/** Seats left in one section as received. */
export function seatsLeft(s) {
  return Math.max(0, count(s.total_seats) - count(s.seats_taken));
}

/**
 * Applies a frame to what is held for its course (a Map by section id, or null
 * before the first frame). Returns the new Map and the sections that were seen
 * full and now have a free seat (never on a first frame).
 */
export function applyFrame(held, frame) {
  const next = frame.full || !held ? new Map() : new Map(held);
  for (const s of Array.isArray(frame.sections) ? frame.sections : []) {
    if (!s || typeof s.section !== "number") continue;
    const had = next.get(s.section);
    if (!frame.full && had && typeof had.version === "number" && typeof s.version === "number" && s.version < had.version) continue;
    next.set(s.section, s);
  }
  return { sections: next, opened: seatOpenings(held, next) };
}

/** Sections full in `before` that have a free seat in `after` (none when `before` is null). */
export function seatOpenings(before, after) {
  const out = [];
  if (!before) return out;
  for (const [id, s] of after) {
    const was = before.get(id);
    if (was && seatsLeft(was) === 0 && seatsLeft(s) > 0) out.push({ section: id, seats_left: seatsLeft(s) });
  }
  return out;
}

/** The `ws:`/`wss:` or `http(s):` URL of an endpoint of a seatboard base URL. */
export function endpoint(base, path, params, ws) {
  const u = new URL(path, base);
  if (ws) u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
  for (const [k, v] of params) u.searchParams.append(k, v);
  return u.href;
}

// A WebSocket as the client sees a transport.
function wsTransport(env, url, on) {
  const sock = new env.WebSocket(url);
  sock.onmessage = (ev) => { if (typeof ev.data === "string") on.message(ev.data); };
  sock.onclose = (ev) => on.close(ev.code);
  sock.onerror = () => {};
  return {
    send: (m) => { if (sock.readyState === 1) sock.send(m); },
    close: () => { sock.onclose = sock.onmessage = null; try { sock.close(1000); } catch (_) { /* closed */ } },
    courses: true,
  };
}

// An EventSource (contract §4c) as the client sees a transport; the module
// reconnects by itself (with a fresh token), so a broken stream is closed.
function sseTransport(env, url, on) {
  const es = new env.EventSource(url);
  let done = false;
  const fire = (type) => (ev) => { if (!done) on.message(ev.data, type); };
  for (const t of ["hello", "frame", "presence", "reconnect"]) es.addEventListener(t, fire(t));
  es.onerror = () => {
    if (done) return;
    done = true;
    es.close();
    on.close(0);
  };
  return { send() {}, close: () => { done = true; es.close(); }, courses: false };
}

/** The client; `env` carries what it needs from the browser (tests pass fakes). */
export class SeatClient extends EventTarget {
  constructor(opts, env) {
    super();
    this.url = opts.url;
    this.token = opts.token;
    this.query = opts.query || null;
    this.transport = opts.transport || "auto";
    this.status = "connecting";
    this.hello = null;
    this.retryAt = null;
    this._env = env;
    this._wanted = new Map();      // course -> holders (watch() minus unwatch())
    this._courses = new Map();     // course -> { sections: Map|null, viewers: number|null }
    this._onWire = new Set();
    this._sent = [];               // times of recent client messages
    this._attempt = 0;
    this._wsFails = 0;
    this._useSse = this.transport === "sse";
    this._probes = 0;              // WebSocket probes that failed while live on SSE
    this._probe = null;            // { conn, timer } of the one in flight or scheduled
    this._conn = null;
    this._live = false;
    this._hint = null;
    this._timer = null;
    this._syncTimer = null;
    this._gen = 0;
    this._wake = () => { if (!this._conn && !this._hidden && this.status !== "closed") this._open(); };
    this._visible = () => { if (env.document && env.document.visibilityState === "visible") this._wake(); };
    // In the back/forward cache: closed with 1000, no retry, values kept.
    this._hidden = false;
    this._pagehide = () => {
      if (this.status === "closed") return;
      this._hidden = true;
      this._env.clearTimeout(this._timer);
      this._timer = null;
      this.retryAt = null;
      this._drop();
      this._setStatus("reconnecting", { reason: "pagehide" });
    };
    this._pageshow = (ev) => {
      if (!this._hidden && !(ev && ev.persisted)) return;
      this._hidden = false;
      if (!this._conn) this._open();
    };
    if (env.window) {
      env.window.addEventListener("online", this._wake);
      env.window.addEventListener("pagehide", this._pagehide);
      env.window.addEventListener("pageshow", this._pageshow);
    }
    if (env.document) env.document.addEventListener("visibilitychange", this._visible);
    this._timer = env.setTimeout(() => this._open(), 0);
  }

  /** Starts receiving a course (counted: each watch() is undone by one unwatch()). */
  watch(course) {
    if (!COURSE_RE.test(course) || this.status === "closed") return;
    this._wanted.set(course, (this._wanted.get(course) || 0) + 1);
    if (!this._courses.has(course)) this._courses.set(course, { sections: null, viewers: null });
    this._syncSoon();
  }

  /** Stops one watch() of a course; the course leaves the wire when none is left. */
  unwatch(course) {
    const n = (this._wanted.get(course) || 0) - 1;
    if (n > 0) { this._wanted.set(course, n); return; }
    this._wanted.delete(course);
    if (!this._onWire.has(course)) this._courses.delete(course);
    this._syncSoon();
  }

  /** Sections of a course by id, as last received (null before its first frame). */
  state(course) {
    const c = this._wanted.has(course) && this._courses.get(course);
    return c && c.sections ? new Map(c.sections) : null;
  }

  /** The course's viewer count as last received (null before any). */
  viewers(course) {
    const c = this._courses.get(course);
    return c ? c.viewers : null;
  }

  /** Courses watched now. */
  courses() { return [...this._wanted.keys()]; }

  /** Closes the connection for good. */
  close() {
    this._drop();
    this._env.clearTimeout(this._timer);
    this._env.clearTimeout(this._syncTimer);
    if (this._env.window) {
      for (const [t, f] of [["online", this._wake], ["pagehide", this._pagehide], ["pageshow", this._pageshow]]) {
        this._env.window.removeEventListener(t, f);
      }
    }
    if (this._env.document) this._env.document.removeEventListener("visibilitychange", this._visible);
    if (this._onClose) this._onClose();
    this._setStatus("closed", {});
  }

  _emit(type, detail) { this.dispatchEvent(new CustomEvent(type, { detail })); }

  _setStatus(status, extra) {
    this.status = status;
    this._emit("status", { status, ...extra });
  }

  _drop() {
    this._gen++;
    this._stopProbe();
    if (this._conn) this._conn.close();
    this._conn = null;
    this._live = false;
    this._offWire();
  }

  // Nothing is watched on the wire any more: forget courses nobody wants.
  _offWire() {
    this._onWire.clear();
    for (const c of this._courses.keys()) if (!this._wanted.has(c)) this._courses.delete(c);
  }

  async _open() {
    if (this.status === "closed" || this._hidden) return;
    this._env.clearTimeout(this._timer);
    this._timer = null;
    this.retryAt = null;
    this._hint = null;
    this._drop();
    const gen = this._gen;
    if (this.status !== "connecting") this._setStatus("reconnecting", { reason: "connecting" });
    const params = await this._params();
    if (!params) {
      if (gen === this._gen) this._retry();
      return;
    }
    if (gen !== this._gen || this.status === "closed") return;
    const sse = this._useSse;
    const on = {
      message: (data, type) => { if (gen === this._gen) this._message(data, type); },
      close: () => { if (gen === this._gen) this._closed(sse); },
    };
    try {
      // The courses ride in the request (a WebSocket's first 32: its first
      // boards come with the hello, no watch message and no round trip).
      const named = [...this._wanted.keys()];
      if (!sse) named.length = Math.min(named.length, MAX_COURSES);
      for (const c of named) params.push(["course", c]);
      this._conn = sse
        ? sseTransport(this._env, endpoint(this.url, "/sse", params, false), on)
        : wsTransport(this._env, endpoint(this.url, "/ws", params, true), on);
      for (const c of named) this._onWire.add(c);
    } catch (_) {
      this._conn = null;
      this._closed(sse);
    }
  }

  // The token and query parameters of an attempt (null when the token function fails).
  async _params() {
    let token = this.token;
    try {
      if (typeof token === "function") token = await token();
    } catch (_) {
      return null;
    }
    const params = [];
    if (token) params.push(["token", String(token)]);
    if (this.query) for (const [k, v] of Object.entries(this.query)) params.push([k, String(v)]);
    return params;
  }

  // Live on SSE in auto mode: a WebSocket is tried again later, in the background.
  _probeLater() {
    if (this.transport !== "auto" || !this._useSse || this._probe) return;
    const span = Math.min(PROBE_CAP_MS, PROBE_MS * 2 ** this._probes);
    const delay = span * (0.5 + this._env.random() / 2);
    const gen = this._gen;
    this._probe = { conn: null, timer: this._env.setTimeout(() => this._probeNow(gen), delay) };
  }

  _stopProbe() {
    const p = this._probe;
    this._probe = null;
    if (!p) return;
    this._env.clearTimeout(p.timer);
    if (p.conn) p.conn.close();
  }

  // Opens a WebSocket beside the live stream. Its hello makes it the
  // connection (the stream closes, the courses are watched on it); a failure
  // before hello leaves the stream alone and tries again later.
  async _probeNow(gen) {
    const p = this._probe;
    if (!p || gen !== this._gen) return;
    const params = await this._params();
    if (this._probe !== p || gen !== this._gen) return;
    const fail = () => {
      if (this._probe !== p) return;
      this._probe = null;
      this._probes = Math.min(this._probes + 1, 30);
      if (p.conn) p.conn.close();
      if (gen === this._gen && this._live) this._probeLater();
    };
    if (!params) return fail();
    let adopted = null;
    const on = {
      message: (data, type) => {
        if (adopted !== null) {
          if (adopted === this._gen) this._message(data, type);
          return;
        }
        let m = null;
        try { m = JSON.parse(data); } catch (_) { /* not a hello */ }
        if (!m || m.type !== "hello" || this._probe !== p || gen !== this._gen) return fail();
        this._probe = null;
        this._probes = 0;
        this._useSse = false;
        this._wsFails = 0;
        const stream = this._conn;
        this._gen++;
        adopted = this._gen;
        if (stream) stream.close();
        this._conn = p.conn;
        this._offWire();
        this._message(data, "hello");
      },
      close: () => {
        if (adopted === null) fail();
        else if (adopted === this._gen) this._closed(false);
      },
    };
    try {
      p.conn = wsTransport(this._env, endpoint(this.url, "/ws", params, true), on);
    } catch (_) {
      fail();
    }
  }

  _closed(sse) {
    const hadHello = this._live;
    this._stopProbe();
    this._conn = null;
    this._live = false;
    this._offWire();
    if (this.status === "closed") return;
    // auto: SSE after two WebSocket attempts in a row fail before hello; a
    // stream that fails before hello too sends it back to WebSocket (a node
    // that is down fails both, and must not pin the page to SSE).
    if (!hadHello && this.transport === "auto") {
      if (sse) this._useSse = false;
      else if (++this._wsFails >= WS_TRIES_BEFORE_SSE) { this._useSse = true; this._wsFails = 0; }
    }
    this._retry();
  }

  // Schedules the next attempt: at the drain hint's time, else after a backoff.
  _retry() {
    if (this._hidden) return;
    const now = this._env.now();
    let delay, reason;
    if (this._hint !== null) {
      delay = Math.max(0, this._hint - now);
      reason = "drain";
    } else {
      delay = backoffDelay(this._attempt, this._env.random);
      this._attempt = Math.min(this._attempt + 1, 30);
      reason = "backoff";
    }
    this._hint = null;
    this.retryAt = now + delay;
    this._env.clearTimeout(this._timer);
    this._timer = this._env.setTimeout(() => this._open(), delay);
    // A drain hint already said when: its close is no news.
    if (reason === "drain" && this.status === "reconnecting") return;
    this._setStatus("reconnecting", { reason, delay_ms: delay });
  }

  _message(data, type) {
    let m;
    try { m = JSON.parse(data); } catch (_) { return; }
    if (!m || typeof m !== "object") return;
    switch (type || m.type) {
      case "hello":
        this.hello = m;
        this._live = true;
        this._attempt = 0;
        if (!this._useSse) this._wsFails = 0;
        else this._probeLater();
        if (this.status !== "live") this._setStatus("live", {});
        this._emit("hello", m);
        this._sync();
        break;
      case "frame": this._frame(m); break;
      case "presence": {
        const c = this._courses.get(m.course);
        if (!c || typeof m.viewers !== "number") return;
        c.viewers = count(m.viewers);
        this._emit("presence", { course: m.course, viewers: c.viewers });
        break;
      }
      case "reconnect": this._drainHint(count(m.after_ms)); break;
      case "error": this._emit("error", { code: m.code, message: m.message }); break;
      default: break;
    }
  }

  _frame(m) {
    const c = this._courses.get(m.course);
    if (!c) return;
    const { sections, opened } = applyFrame(c.sections, m);
    c.sections = sections;
    if (!this._wanted.has(m.course)) return;
    this._emit("frame", { course: m.course, full: !!m.full, sections: new Map(sections) });
    for (const o of opened) this._emit("seatopen", { course: m.course, ...o });
  }

  // The server drains: it closes right after; come back at the hinted time.
  _drainHint(after) {
    const now = this._env.now();
    this._hint = now + after;
    this.retryAt = this._hint;
    this._setStatus("reconnecting", { reason: "drain", delay_ms: after });
    const gen = this._gen;
    this._env.clearTimeout(this._timer);
    this._timer = this._env.setTimeout(() => { if (gen === this._gen) this._open(); }, after);
  }

  _syncSoon() {
    if (this._syncTimer !== null) return;
    this._syncTimer = this._env.setTimeout(() => { this._syncTimer = null; this._sync(); }, 0);
  }

  // Brings the connection's courses in line with what is wanted, within the
  // server's message rate; an SSE stream is opened again with the new list.
  _sync() {
    if (!this._conn || !this._live) return;
    if (!this._conn.courses) {
      const same = this._onWire.size === this._wanted.size && [...this._wanted.keys()].every((c) => this._onWire.has(c));
      if (!same) this._open();
      return;
    }
    const now = this._env.now();
    this._sent = this._sent.filter((t) => now - t < 1000);
    const send = (op, course) => {
      if (this._sent.length >= SEND_BUDGET) return false;
      this._sent.push(now);
      this._conn.send(JSON.stringify({ op, course }));
      return true;
    };
    let more = false;
    for (const c of this._onWire) {
      if (this._wanted.has(c)) continue;
      if (!send("unwatch", c)) { more = true; break; }
      this._onWire.delete(c);
      this._courses.delete(c);
    }
    for (const c of this._wanted.keys()) {
      if (more || this._onWire.has(c) || this._onWire.size >= MAX_COURSES) continue;
      if (!send("watch", c)) { more = true; break; }
      this._onWire.add(c);
    }
    if (more && this._syncTimer === null) {
      const wait = Math.max(1, 1000 - (now - this._sent[0]));
      this._syncTimer = this._env.setTimeout(() => { this._syncTimer = null; this._sync(); }, wait);
    }
  }
}

/** What the client takes from the browser. */
export function browserEnv() {
  const g = globalThis;
  return {
    WebSocket: g.WebSocket,
    EventSource: g.EventSource,
    setTimeout: (f, ms) => g.setTimeout(f, ms),
    clearTimeout: (t) => g.clearTimeout(t),
    random: Math.random,
    now: () => Date.now(),
    window: typeof g.addEventListener === "function" ? g : null,
    document: g.document || null,
  };
}

const DEFAULT_URL = (() => {
  try { return new URL(import.meta.url).origin; } catch (_) { return ""; }
})();

/** Shared clients by seatboard origin. */
export function clientRegistry(makeEnv) {
  const clients = new Map();
  return function connect(opts = {}) {
    const url = new URL(opts.url || DEFAULT_URL).origin;
    let c = clients.get(url);
    if (c) {
      if (opts.token !== undefined && c.token === undefined) c.token = opts.token;
      return c;
    }
    c = new SeatClient({ ...opts, url }, makeEnv());
    c._onClose = () => { if (clients.get(url) === c) clients.delete(url); };
    clients.set(url, c);
    return c;
  };
}

/** The page's one client for a seatboard host (created on first use). */
export const connect = clientRegistry(browserEnv);

// ---------- elements ----------

const plural = (n, one) => n + " " + one + (n === 1 ? "" : "s");

/** The inline text of <seat-count> for a section (undefined: not known yet). */
export function countText(section, loaded) {
  if (!loaded) return "\u2026";
  if (!section) return "\u2014";
  const left = seatsLeft(section);
  return left === 0 ? "Full" : plural(left, "seat") + " left";
}

/** The courses named in a `course` attribute (space separated, up to 8). */
export function courseList(attr) {
  return [...new Set(String(attr || "").split(/\s+/).filter((c) => COURSE_RE.test(c)))].slice(0, 8);
}

const COUNT_CSS = ":host{font-variant-numeric:tabular-nums}:host([data-seats-left=\"0\"]) [part~=count]{color:var(--seat-full,#b3262e);font-weight:600}";
const BOARD_CSS = `:host{display:block;color:var(--seat-text,inherit);font:var(--seat-font,inherit)}
*{box-sizing:border-box}
.courses{display:grid;grid-template-columns:repeat(auto-fit,minmax(var(--seat-min-width,220px),1fr));gap:var(--seat-gap,16px)}
h2{margin:0;font-size:1.25em}
.head{display:flex;align-items:baseline;gap:4px 12px;flex-wrap:wrap;margin-bottom:6px}
.viewers,.stat,.count,.room{color:var(--seat-muted,#545d68);font-size:.875em}
.stat{margin:0 0 8px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(150px,1fr));gap:8px}
.section{background:var(--seat-bg,#fff);border:1px solid var(--seat-border,#d5d9df);border-radius:var(--seat-radius,8px);padding:8px 10px;display:flex;flex-direction:column;gap:5px}
.section .no{font-weight:700}
.seats-left{font-weight:600}
.bar{height:6px;border-radius:999px;background:var(--seat-track,#e9ecf0);overflow:hidden}
.fill{height:100%;width:0;background:var(--seat-ok,#2e9b6a)}
.section[data-full] .fill{background:var(--seat-full,#b3262e)}
.section[data-full] .seats-left{color:var(--seat-full,#b3262e)}
.section.opened{border:2px solid var(--seat-open,#1d6b48)}
.alerts{display:grid;gap:6px;margin:0 0 8px}.alerts:empty{display:none}
.alert{margin:0;padding:6px 10px;border-radius:6px;border:2px solid var(--seat-open,#1d6b48);background:var(--seat-open-bg,#ecf8f1);color:var(--seat-open-text,#0f3d29);font-weight:600}
.empty{color:var(--seat-muted,#545d68);margin:0}`;

const sheets = new Map();
// Constructed sheets (one per element kind, shared): no inline <style>, so a
// host page's CSP needs no style-src for them.
function sheet(css) {
  if (typeof CSSStyleSheet !== "function") return null;
  if (!sheets.has(css)) {
    try { const s = new CSSStyleSheet(); s.replaceSync(css); sheets.set(css, s); } catch (_) { sheets.set(css, null); }
  }
  return sheets.get(css);
}

function h(tag, cls, text, part) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (part) e.setAttribute("part", part);
  if (text !== undefined) e.textContent = text;
  return e;
}

// Outside a browser (unit tests) the element classes exist but are never defined.
const ElementBase = typeof HTMLElement === "undefined" ? class {} : HTMLElement;

// Shared by both elements: find the page's client one task after connecting,
// hold the element's courses, let go of them when it leaves the page.
class SeatElement extends ElementBase {
  static get observedAttributes() { return ["course", "section", "src", "token"]; }
  constructor(css) {
    super();
    this._root = this.attachShadow({ mode: "open" });
    const styles = sheet(css);
    if (styles) this._root.adoptedStyleSheets = [styles];
    this._client = null;
    this._held = [];
    this._on = (ev) => { if (!ev.detail.course || this._held.includes(ev.detail.course)) this.render(); };
    this._pending = false;
  }
  connectedCallback() {
    this.render();
    if (this._pending) return;
    this._pending = true;
    setTimeout(() => { this._pending = false; if (this.isConnected) this._attach(); }, 0);
  }
  disconnectedCallback() { this._detach(); }
  attributeChangedCallback() { if (this._client) { this._detach(); this._attach(); } else this.render(); }
  _attach() {
    if (this._client) return;
    const opts = {};
    if (this.getAttribute("src")) opts.url = this.getAttribute("src");
    if (this.hasAttribute("token")) opts.token = this.getAttribute("token");
    try { this._client = connect(opts); } catch (_) { return; }
    for (const t of ["frame", "presence", "status"]) this._client.addEventListener(t, this._on);
    this._held = courseList(this.getAttribute("course"));
    if (this.localName === "seat-count") this._held = this._held.slice(0, 1);
    for (const c of this._held) this._client.watch(c);
    this.render();
  }
  _detach() {
    const c = this._client;
    if (!c) return;
    for (const t of ["frame", "presence", "status"]) c.removeEventListener(t, this._on);
    for (const course of this._held) c.unwatch(course);
    this._held = [];
    this._client = null;
  }
}

class SeatCount extends SeatElement {
  constructor() {
    super(COUNT_CSS);
    this._text = h("span", "", "\u2026", "count");
    this._root.append(this._text);
  }
  render() {
    const course = courseList(this.getAttribute("course"))[0];
    const sections = this._client && course ? this._client.state(course) : null;
    const s = sections ? sections.get(Number(this.getAttribute("section"))) : null;
    const text = countText(s, !!sections);
    if (this._text.textContent !== text) this._text.textContent = text;
    if (s) this.dataset.seatsLeft = String(seatsLeft(s));
    else delete this.dataset.seatsLeft;
  }
}

class SeatBoard extends SeatElement {
  static get observedAttributes() { return [...super.observedAttributes, "heading-level"]; }
  constructor() {
    super(BOARD_CSS);
    this._box = h("div", "courses", undefined, "board");
    this._root.append(this._box);
    this._views = new Map();
    this._onOpen = (ev) => this._alert(ev.detail);
  }
  _attach() {
    super._attach();
    if (this._client) this._client.addEventListener("seatopen", this._onOpen);
  }
  _detach() {
    if (this._client) this._client.removeEventListener("seatopen", this._onOpen);
    super._detach();
  }
  attributeChangedCallback(name, ...rest) {
    if (name !== "heading-level") return super.attributeChangedCallback(name, ...rest);
    // Set or changed after the courses: every heading takes the new level.
    for (const v of this._views.values()) {
      const title = h("h" + this._level(), "", v.title.textContent, "title");
      v.title.replaceWith(title);
      v.title = title;
    }
  }
  _level() { return Math.min(6, Math.max(1, count(this.getAttribute("heading-level") || 2))); }
  _view(code) {
    let v = this._views.get(code);
    if (v) return v;
    v = { box: h("section", "course", undefined, "course"), cards: new Map(), raised: new Map() };
    v.box.dataset.course = code;
    const head = h("div", "head", undefined, "head");
    v.title = h("h" + this._level(), "", code, "title");
    v.viewers = h("span", "viewers", "", "viewers");
    head.append(v.title, v.viewers);
    v.alerts = h("div", "alerts", undefined, "alerts");
    v.stat = h("p", "stat", "", "summary");
    v.grid = h("div", "grid", undefined, "sections");
    v.box.append(head, v.alerts, v.stat, v.grid);
    v.box.setAttribute("aria-label", code);
    this._views.set(code, v);
    return v;
  }
  render() {
    const codes = courseList(this.getAttribute("course"));
    for (const [code, v] of this._views) if (!codes.includes(code)) { v.box.remove(); this._views.delete(code); }
    codes.forEach((code, i) => {
      const v = this._view(code);
      if (this._box.children[i] !== v.box) this._box.insertBefore(v.box, this._box.children[i] || null);
      this._renderCourse(code, v);
    });
  }
  _renderCourse(code, v) {
    const c = this._client;
    const sections = c ? c.state(code) : null;
    const viewers = c ? c.viewers(code) : null;
    v.viewers.textContent = viewers === null ? "" : viewers + " viewing";
    if (!sections) { v.stat.textContent = "Loading " + code + "\u2026"; return; }
    const ids = [...sections.keys()].sort((a, b) => a - b);
    let seats = 0, left = 0, full = 0;
    for (const [id, card] of v.cards) if (!sections.has(id)) { card.el.remove(); v.cards.delete(id); }
    ids.forEach((id, i) => {
      const s = sections.get(id);
      let card = v.cards.get(id);
      if (!card) { card = this._card(id); v.cards.set(id, card); }
      const total = count(s.total_seats), taken = Math.min(count(s.seats_taken), total), l = seatsLeft(s);
      seats += total; left += l; if (l === 0) full++;
      card.left.textContent = l === 0 ? "Full" : plural(l, "seat") + " left";
      card.taken.textContent = taken + " / " + total + " taken";
      card.fill.style.width = (total ? (taken / total) * 100 : 100).toFixed(1) + "%";
      card.el.toggleAttribute("data-full", l === 0);
      card.el.dataset.seatsLeft = String(l);
      if (l === 0) {
        card.el.classList.remove("opened");
        const alert = v.raised.get(id);
        if (alert) { alert.remove(); v.raised.delete(id); }
      }
      if (v.grid.children[i] !== card.el) v.grid.insertBefore(card.el, v.grid.children[i] || null);
    });
    v.stat.textContent = ids.length
      ? left + " of " + seats + " seats left \u00b7 " + full + "/" + ids.length + " sections full"
      : "No sections known yet for " + code + ".";
  }
  _card(id) {
    const el = h("article", "section", undefined, "section");
    el.dataset.section = String(id);
    const no = h("span", "no", "Section " + id, "section-name");
    const left = h("span", "seats-left", "", "seats-left");
    const taken = h("span", "count", "", "taken");
    const bar = h("div", "bar", undefined, "bar");
    const fill = h("div", "fill", undefined, "fill");
    bar.append(fill);
    el.append(no, left, taken, bar);
    return { el, left, taken, fill };
  }
  _alert({ course, section, seats_left }) {
    const v = this._views.get(course);
    if (!v) return;
    const text = course + " \u00b7 Section " + section + ": " + plural(seats_left, "seat") + " open";
    const p = h("p", "alert", text, "alert");
    p.setAttribute("role", "alert");
    const old = v.raised.get(section);
    if (old) old.remove();
    v.raised.set(section, p);
    v.alerts.prepend(p);
    while (v.alerts.children.length > 3) {
      const last = v.alerts.lastElementChild;
      for (const [id, a] of v.raised) if (a === last) v.raised.delete(id);
      last.remove();
    }
    const card = v.cards.get(section);
    if (card) card.el.classList.add("opened");
  }
}

if (typeof customElements !== "undefined" && typeof HTMLElement !== "undefined") {
  if (!customElements.get("seat-count")) customElements.define("seat-count", SeatCount);
  if (!customElements.get("seat-board")) customElements.define("seat-board", SeatBoard);
}
