//! The shard's clock: feeds inbox messages and time into the renderer, then
//! sleeps until the renderer's next deadline or the next message.

use super::ShardCtx;
use crate::channels::Control;
use crate::clock;
use shards::ws_codec::close;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Instant;

/// Runs the shard's feed-render-sleep loop forever.
pub async fn drive(ctx: Rc<ShardCtx>) {
    loop {
        let deadline = step(&ctx);
        Wait {
            ctx: &ctx,
            sleep: deadline
                .map(|ms| Box::pin(monoio::time::sleep_until(clock::instant_at(ms).into()))),
        }
        .await;
    }
}

/// One turn of the loop, without the sleep: feeds the inbox and the time into
/// the renderer, flushes, publishes metrics, and returns the next deadline (ms).
pub(super) fn step(ctx: &Rc<ShardCtx>) -> Option<u64> {
    let drain_ms = ctx.node.args.drain_ms;
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
                Control::Presence(counts) => {
                    for (course, n) in counts.iter() {
                        shard.handle_presence(course, *n);
                    }
                }
                Control::Roster { conn, frame } => shard.deliver(conn, frame),
                Control::Admin(frame) => shard.handle_admin_frame(&frame),
                Control::Drain => shard.start_drain(now, drain_ms),
                Control::CloseAll => shard.close_all(close::GOING_AWAY),
                Control::Probe => {}
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
    ctx.publish_metrics();
    ctx.metrics()
        .heartbeat_ms
        .store(now, std::sync::atomic::Ordering::Relaxed);
    let deadline = ctx.shard.borrow().poll_timeout();
    ctx.kick.take();
    deadline
}

/// Ready when the inbox has mail, the shard was kicked, or the deadline passed
/// (`S`: the runtime's sleep future).
pub(super) struct Wait<'a, S> {
    pub(super) ctx: &'a Rc<ShardCtx>,
    pub(super) sleep: Option<Pin<Box<S>>>,
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
