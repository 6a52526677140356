// Type declarations of seatboard's browser client, served at /client.d.ts.
// Use: `import { connect } from "https://seats.example.edu/client.js";`

/** One section's whole current state, as published by the selection API. */
export interface Section {
  section: number;
  total_seats: number;
  seats_taken: number;
  seat_info?: Record<string, unknown>;
  version?: number;
}

/** Connection status of a client. */
export type Status = "connecting" | "live" | "reconnecting" | "closed";

/** A token, or a function asked for one before every connection attempt. */
export type TokenSource = string | (() => string | Promise<string>);

export interface ConnectOptions {
  /** seatboard's base URL; default: the origin /client.js was loaded from. */
  url?: string;
  /** Sent as `?token=`; a function is called again on every reconnect. */
  token?: TokenSource;
  /** `"auto"` (default: WebSocket, SSE after two WebSocket attempts in a row fail before hello), `"websocket"` or `"sse"`. */
  transport?: "auto" | "websocket" | "sse";
  /** Extra query parameters on the connection URL (e.g. `user` for a server run with `--auth none`). */
  query?: Record<string, string>;
}

export interface StatusDetail {
  status: Status;
  /** Why the client is reconnecting: the server's drain hint, a backoff after a failure, or an attempt under way. */
  reason?: "drain" | "backoff" | "connecting" | "pagehide";
  /** How long until the next attempt. */
  delay_ms?: number;
}

export interface FrameDetail {
  course: string;
  /** True when the frame replaced everything held for the course. */
  full: boolean;
  /** The course's sections by id after this frame. */
  sections: Map<number, Section>;
}

export interface PresenceDetail {
  course: string;
  viewers: number;
}

export interface SeatOpenDetail {
  course: string;
  section: number;
  seats_left: number;
}

export interface HelloDetail {
  type: "hello";
  user: string;
  role: "student" | "admin";
  tick_ms: number;
  node: string;
}

export interface ServerErrorDetail {
  code: string;
  message: string;
}

export interface SeatClientEventMap {
  status: CustomEvent<StatusDetail>;
  frame: CustomEvent<FrameDetail>;
  presence: CustomEvent<PresenceDetail>;
  /** A section seen full now has a free seat (never on a course's first frame). */
  seatopen: CustomEvent<SeatOpenDetail>;
  hello: CustomEvent<HelloDetail>;
  /** A recoverable refusal from the server (bad_course, too_many_courses, ...). */
  error: CustomEvent<ServerErrorDetail>;
}

/** The page's client for one seatboard host. */
export interface SeatClient extends EventTarget {
  readonly url: string;
  readonly status: Status;
  /** The server's hello on the current connection (null before the first). */
  readonly hello: HelloDetail | null;
  /** When the next connection attempt is due (ms since the epoch), while reconnecting. */
  readonly retryAt: number | null;
  /**
   * Starts receiving a course; counted: each watch() is undone by one unwatch().
   * Courses watched before the connection opens (and on every reconnect) are
   * named in its request, so their boards arrive with the server's hello.
   */
  watch(course: string): void;
  /** Undoes one watch(); the course is unwatched when no watch() is left. */
  unwatch(course: string): void;
  /** Sections of a course by id, as last received; null before its first frame. */
  state(course: string): Map<number, Section> | null;
  /** The course's viewer count as last received; null before any. */
  viewers(course: string): number | null;
  /** Courses watched now. */
  courses(): string[];
  /** Closes the connection for good (a later connect() makes a new client). */
  close(): void;
  addEventListener<K extends keyof SeatClientEventMap>(type: K, listener: (ev: SeatClientEventMap[K]) => void, options?: boolean | AddEventListenerOptions): void;
  addEventListener(type: string, listener: EventListenerOrEventListenerObject | null, options?: boolean | AddEventListenerOptions): void;
  removeEventListener<K extends keyof SeatClientEventMap>(type: K, listener: (ev: SeatClientEventMap[K]) => void, options?: boolean | EventListenerOptions): void;
  removeEventListener(type: string, listener: EventListenerOrEventListenerObject | null, options?: boolean | EventListenerOptions): void;
}

/** The page's one client for a seatboard host: the same object for every call with the same host. */
export function connect(options?: ConnectOptions): SeatClient;

/** `<seat-count course="CS101" section="3" [src] [token]>`: "12 seats left", "Full"; carries `data-seats-left`. */
export interface SeatCountElement extends HTMLElement {}

/** `<seat-board course="CS101 MATH101" [src] [token] [heading-level]>`: live boards with seat-opening alerts. */
export interface SeatBoardElement extends HTMLElement {}

declare global {
  interface HTMLElementTagNameMap {
    "seat-count": SeatCountElement;
    "seat-board": SeatBoardElement;
  }
}
