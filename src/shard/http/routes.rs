//! Plain HTTP answers: pages, health, readiness, metrics, the course list, refusals.

use super::response::Response;
use crate::node::Node;
use crate::redis::Mode;
use std::borrow::Cow;
use std::sync::atomic::Ordering::Relaxed;

/// What a request path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// A plain HTTP page or endpoint.
    Page(&'static str),
    /// `/ws` (admin_feed false) or `/ws/admin` (true).
    Ws {
        /// True for `/ws/admin`.
        admin: bool,
    },
    /// `/sse`: a Server-Sent Events stream (contract section 4c).
    Sse,
    /// Unknown path.
    NotFound,
}

/// Maps a path to its route: the contract's paths only, any other is not found.
pub fn route(path: &str) -> Route {
    match path {
        "/" => Route::Page("/"),
        "/admin" => Route::Page("/admin"),
        "/client.js" => Route::Page("/client.js"),
        "/client.d.ts" => Route::Page("/client.d.ts"),
        "/healthz" => Route::Page("/healthz"),
        "/readyz" => Route::Page("/readyz"),
        "/metrics" => Route::Page("/metrics"),
        "/api/courses" => Route::Page("/api/courses"),
        "/api/history" => Route::Page("/api/history"),
        "/ws" => Route::Ws { admin: false },
        "/ws/admin" => Route::Ws { admin: true },
        "/sse" => Route::Sse,
        _ => Route::NotFound,
    }
}

/// The answer to a GET of a page, for pages that need the request (auth, query) too.
pub fn answer(node: &Node, p: &str, head: &shards::http_head::RequestHead<'_>) -> Response {
    match p {
        "/api/history" => history(node, head),
        "/" => super::pages::BOARD.respond(head),
        "/admin" => super::pages::ADMIN.respond(head),
        "/client.js" => super::pages::CLIENT_JS.respond(head),
        "/client.d.ts" => super::pages::CLIENT_DTS.respond(head),
        _ => page(node, p),
    }
}

/// `/api/history?session=S`: admin only, answered from the history cache.
fn history(node: &Node, head: &shards::http_head::RequestHead<'_>) -> Response {
    let admin = match node.auth.identify(head).ok() {
        Some(id) => id.role == shards::Role::Admin,
        // `--auth none`: `?role=admin` is enough for this read-only endpoint.
        None if matches!(node.auth, crate::auth::Auth::None)
            && head.query_param("role").as_deref() == Some("admin") =>
        {
            true
        }
        None => return Response::text(401, "missing or invalid token"),
    };
    if !admin {
        return Response::text(403, "admin token required");
    }
    let session = head
        .query_param("session")
        .map_or_else(|| node.config.session.clone(), Cow::into_owned);
    if !crate::history::valid_session(&session) {
        return Response::text(400, "bad session (1-128 of [A-Za-z0-9_.:-])");
    }
    Response::json(200, node.history.answer(&session))
}

/// The answer to a GET of a page.
pub fn page(node: &Node, page: &str) -> Response {
    match page {
        "/healthz" => {
            let up = node.metrics.redis_connected.load(Relaxed) != 0;
            // In cluster mode: Redis is up while any primary answers; the node
            // is degraded while a watched course's slot has no reachable primary.
            let (redis, extra) = match node.redis.get().map(|r| (r.mode(), r)) {
                Some((Some(Mode::Cluster), r)) => {
                    let n = r.nodes_up.load(Relaxed);
                    (
                        up || n > 0,
                        format!(",\"redis_mode\":\"cluster\",\"redis_nodes_up\":{n}"),
                    )
                }
                // `auto` before any seed answered: not (yet) a cluster; the
                // field is always there for a node that talks to Redis.
                Some((_, _)) => (up, ",\"redis_mode\":\"standalone\"".to_string()),
                None => (up, String::new()),
            };
            // A node whose long-lived thread panicked is failed, whatever else holds.
            let failed = crate::failure::failed();
            let (code, status) = match failed {
                Some(_) => (503, "failed"),
                None if up => (200, "ok"),
                None => (200, "degraded"),
            };
            let extra = match failed {
                Some(thread) => format!("{extra},\"failed_thread\":\"{thread}\""),
                None => extra,
            };
            Response::json(
                code,
                format!(
                    "{{\"status\":\"{status}\",\"redis\":{redis},\"shards\":{},\"connections\":{},\"draining\":{},\"auth\":\"{}\"{extra}}}",
                    node.config.shards,
                    node.metrics.connections(),
                    node.draining(),
                    if node.auth.healthy() { "ok" } else { "degraded" },
                ),
            )
        }
        "/readyz" if crate::failure::failed().is_some() => Response::text(503, "failed"),
        "/readyz" if node.draining() => {
            Response::text(503, "draining").header("Retry-After: 5".into())
        }
        "/readyz" => Response::text(200, "ready"),
        "/metrics" => Response {
            status: 200,
            headers: Vec::new(),
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            cache_control: "no-store",
            body: {
                let mut text = node.metrics.render();
                node.auth.render_metrics(&mut text);
                text.into_bytes()
            },
        },
        "/api/courses" => Response::json(
            200,
            node.courses_json
                .read()
                .map(|s| s.clone())
                .unwrap_or_else(|_| "[]".into()),
        ),
        _ => Response::text(404, "not found"),
    }
}
