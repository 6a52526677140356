//! The shard's clock: the loop that feeds the inbox and the time into the
//! core, flushes, publishes the metrics, returns freed memory to the OS, and
//! sleeps until the core's next deadline, new mail or a kick.

use super::ctx::ShardCtx;
use super::runtime::Runtime;
use crate::channels::Control;
use crate::clock;
use shards::ws_codec::close;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll};
use std::time::Instant;

/// The feed-render-sleep loop ([`step`]) on runtime `R`'s timer. A turn
/// whose deadline is the last turn's (most turns: a kick after a flush, not
/// a timer) sleeps on the same timer instead of arming a new one.
pub(super) async fn tick_loop<R: Runtime>(ctx: Rc<ShardCtx>) {
    let mut sleep = None;
    loop {
        let deadline = step(&ctx);
        match deadline {
            Some(ms) if matches!(&sleep, Some((at, _)) if *at == ms) => {}
            Some(ms) => sleep = Some((ms, Box::pin(R::sleep_until(clock::instant_at(ms))))),
            None => sleep = None,
        }
        Wait {
            ctx: &ctx,
            sleep: sleep.as_mut().map(|(_, s)| s.as_mut()),
        }
        .await;
    }
}

/// One turn of the loop, without the sleep: feeds the inbox and the time into
/// the renderer, flushes, submits the round's changes to the sends,
/// publishes metrics, and returns the next deadline (ms).
fn step(ctx: &Rc<ShardCtx>) -> Option<u64> {
    let drain_ms = ctx.node.config.drain_ms;
    let now = clock::now_ms();
    {
        let mut shard = ctx.shard.borrow_mut();
        while let Some(batch) = ctx.inbox.try_snapshots() {
            for s in &batch {
                shard.handle_snapshot(s);
            }
        }
        while let Some(msg) = ctx.inbox.try_control() {
            match msg {
                Control::Seed { course, sections } => shard.handle_seed(&course, &sections, now),
                Control::Presence { counts, applied } => shard.handle_counts(&counts, applied),
                Control::JoinCounts { counts, applied } => {
                    shard.handle_join_counts(&counts, applied)
                }
                Control::Roster { conn, frame } => shard.deliver(conn, frame),
                Control::Admin(msg) => shard.handle_admin(&msg),
                Control::Drain => shard.start_drain(now, drain_ms),
                Control::CloseAll => shard.close_all(close::GOING_AWAY),
                Control::Probe => {}
                Control::Stop => ctx.stop.notify(),
            }
        }
        let rendered = shard.stats().frames_rendered;
        let started = Instant::now();
        shard.handle_timeout(now);
        if shard.stats().frames_rendered != rendered {
            ctx.metrics()
                .tick
                .observe_us(started.elapsed().as_micros() as u64);
        }
    }
    ctx.flush();
    ctx.sends.borrow_mut().submit_changes();
    ctx.send_presence_round();
    ctx.publish_metrics();
    purge_freed_memory(ctx, now);
    ctx.metrics().heartbeat_ms.store(now, Relaxed);
    let deadline = ctx.shard.borrow().poll_timeout().map(clock::on_round_grid);
    ctx.inbox.set_wakes_at(deadline);
    ctx.kick.take();
    deadline
}

/// How often a shard asks the allocator to return freed pages.
const PURGE_EVERY_MS: u64 = 1_000;

/// Returns pages freed on this shard thread to the OS, at most every
/// [`PURGE_EVERY_MS`]. mimalloc purges only when it is called, so after a
/// burst (thousands of handshakes, each a few KiB freed at its upgrade) a
/// quiet shard would keep that memory resident for good. All free pages go
/// when no frame was rendered since the last call (a quiet shard); while
/// frames flow, only those past the delay (pages about to be reused stay).
fn purge_freed_memory(ctx: &ShardCtx, now: u64) {
    if now < ctx.next_purge_ms.get() {
        return;
    }
    ctx.next_purge_ms.set(now + PURGE_EVERY_MS);
    let rendered = ctx.shard.borrow().stats().frames_rendered;
    let quiet = ctx.rendered_at_purge.replace(rendered) == rendered;
    crate::allocator::collect(quiet);
}

/// Ready when the inbox has mail, the shard was kicked, or the deadline passed
/// (`S`: the runtime's sleep future).
struct Wait<'a, S> {
    ctx: &'a Rc<ShardCtx>,
    sleep: Option<Pin<&'a mut S>>,
}

impl<S: Future<Output = ()>> Future for Wait<'_, S> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.ctx.inbox.register(cx.waker()) || self.ctx.kick.poll_take(cx) {
            return Poll::Ready(());
        }
        match self.sleep.as_mut() {
            Some(s) => s.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }
}
