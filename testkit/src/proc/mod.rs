//! The processes a test or bench owns, one wrapper per kind, each killed on
//! drop: `redis-server` ([`RedisServer`]), `seatboard` ([`Seatboard`]), HAProxy
//! ([`Haproxy`]), PostgreSQL ([`Postgres`]) and MariaDB ([`Mariadb`]), all on ports from the one [`free_port`].

mod haproxy;
mod mariadb;
mod port;
mod postgres;
mod redis;
mod seatboard;

pub use haproxy::Haproxy;
pub use mariadb::{mariadb_installed, Mariadb};
pub use port::{cluster_port, free_port, listens_on, loopback_tcp, TcpRow};
pub use postgres::{pg_bin, Postgres};
pub use redis::RedisServer;
pub use seatboard::{bin, built_bin, command_for, seatboard_command, Seatboard};
