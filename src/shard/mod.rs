//! The shell of one shard thread: the sans-IO [`shards::Shard`] plus the
//! sockets, timers and channels around it, in four parts: the runtime the
//! loops run on (`runtime/`: monoio on io_uring or epoll, or tokio behind the
//! feature `tokio-shell`), the HTTP front door (`http/`), a connection's I/O
//! (`conn/`), and the context the shard's tasks share (`ctx.rs`) with its
//! clock (`tick.rs`). [`run`] picks the runtime; nothing is shared with other
//! shards but the node's atomics.

mod conn;
mod ctx;
mod http;
mod notify;
mod runtime;
mod tick;

use crate::channels::wake::IngestTx;
use crate::channels::{Inbox, PresenceCmd};
use crate::node::Node;
use conn::Sends;
use crossbeam_channel::Sender;
use ctx::ShardCtx;
pub use ctx::{COUNT_HOLD_MS, COUNT_PATIENCE_MS};
pub use http::front_door::DEFER_ACCEPT;
use runtime::monoio_runtime::{self, Built, Monoio};
use runtime::Runtime;
pub use runtime::StartError;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;

/// How a shard thread reports that it serves (its driver's name) or why not.
pub type Ready = crossbeam_channel::Sender<Result<&'static str, StartError>>;

/// Runs shard `index` on the calling thread until it ends: builds its context
/// and the runtime `--driver` names (monoio on io_uring, with the batched
/// send ring, or epoll; tokio with the feature `tokio-shell`), and serves on
/// `listener`. Whether it serves, or why not, goes to `ready`.
pub fn run(
    index: usize,
    node: Arc<Node>,
    inbox: Arc<Inbox>,
    ingest: IngestTx,
    presence: Sender<PresenceCmd>,
    listener: std::net::TcpListener,
    ready: Ready,
) {
    let driver = node.config.driver;
    let ctx = Rc::new(ShardCtx::new(index, node, inbox, ingest, presence));
    let report = ready.clone();
    #[cfg(feature = "tokio-shell")]
    if driver == crate::node::Driver::Tokio {
        let task = serve::<runtime::tokio_runtime::Tokio>(ctx, listener, "tokio", ready);
        if let Err(e) = runtime::tokio_runtime::block_on(task) {
            let _ = report.send(Err(e));
        }
        return;
    }
    let served = monoio_runtime::block_on(driver, index, |built| {
        if built == Built::IoUring {
            *ctx.sends.borrow_mut() = Sends::batched(index);
        }
        serve::<Monoio>(ctx, listener, built.name(), ready)
    });
    if let Err(e) = served {
        let _ = report.send(Err(e));
    }
}

/// The shard's life on a built runtime: reports that it serves (or why not),
/// then runs its clock and its accept loop.
async fn serve<R: Runtime>(
    ctx: Rc<ShardCtx>,
    listener: std::net::TcpListener,
    name: &'static str,
    ready: Ready,
) {
    let listener = match R::listener(listener) {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(StartError::Listener(e)));
            return;
        }
    };
    if ctx.index == 0 {
        tracing::info!("shards run on {name}");
    }
    let _ = ready.send(Ok(name));
    drop(ready);
    R::spawn(tick::tick_loop::<R>(Rc::clone(&ctx)));
    let stopper = Rc::clone(&ctx);
    let mut accept = std::pin::pin!(http::front_door::accept_loop::<R>(ctx, listener));
    // Told to stop, the shard leaves its tasks to its runtime's drop.
    std::future::poll_fn(|cx| {
        if stopper.stop.poll_take(cx) {
            return std::task::Poll::Ready(());
        }
        accept.as_mut().poll(cx)
    })
    .await
}
