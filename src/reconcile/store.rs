//! The reconciler's Redis side, through the node's command client (one
//! pipeline per primary in a cluster): the fields of the sections to look
//! up (`HGET`, pipelined), repairs written the section 2 way (the
//! compare-and-set script, then the channel), and the replacement of a
//! section held ahead of the database (`HSET` of the row, then the row
//! published, each with `"replace": true`); a `PING` when the database failed, or
//! when Redis has gone 5 s unasked (a quiet database), so `/healthz` says
//! what Redis does.

use super::decide::{Candidate, Field};
use crate::publisher::write;
use crate::redis::commands::Commands;
use crate::redis::{Error, Mode, PubSubMode};
use shards::Snapshot;

/// Sections looked up or written per pipeline.
pub const BATCH: usize = 1000;

/// Where the reconciler reads and writes.
pub struct Store {
    /// The command client.
    pub link: Commands,
    /// `--channel-prefix`.
    pub channel_prefix: String,
    /// `--state-prefix`.
    pub state_prefix: String,
    /// Redis commands sent (for the bench and `/metrics`).
    pub commands: u64,
}

impl Store {
    /// What Redis holds for each candidate, in order; `None` for one whose
    /// state key refused the read (it is no hash: `WRONGTYPE`), which can
    /// be neither compared nor written, while the others are.
    pub fn read(&mut self, cands: &[Candidate]) -> Result<Vec<Option<Field>>, Error> {
        let mut out = Vec::with_capacity(cands.len());
        for chunk in cands.chunks(BATCH) {
            let cmds: Vec<::redis::Cmd> = chunk
                .iter()
                .map(|c| {
                    let mut cmd = ::redis::cmd("HGET");
                    cmd.arg(format!("{}{}", self.state_prefix, c.snap.course))
                        .arg(c.snap.section);
                    cmd
                })
                .collect();
            self.commands += cmds.len() as u64;
            for reply in self.link.pipeline_each(&cmds)? {
                out.push(match reply {
                    ::redis::Value::ServerError(_) => None,
                    reply => {
                        let field: Option<Vec<u8>> =
                            ::redis::FromRedisValue::from_redis_value(reply).unwrap_or_default();
                        Some(Field::read(field.as_deref()))
                    }
                });
            }
        }
        Ok(out)
    }

    /// Whether Redis answers (`PING`; every primary in a cluster), bounded
    /// by the command client's timeouts.
    pub fn ping(&mut self) -> Result<(), Error> {
        self.commands += 1;
        self.link.query::<::redis::Value>(&::redis::cmd("PING"))?;
        Ok(())
    }

    /// Missing or behind sections written with the compare-and-set script and published.
    pub fn write(&mut self, snaps: &[Snapshot]) -> Result<(), Error> {
        for chunk in snaps.chunks(BATCH) {
            self.commands += 2 * chunk.len() as u64;
            write(
                &mut self.link,
                &self.channel_prefix,
                &self.state_prefix,
                chunk,
            )?;
        }
        Ok(())
    }

    /// Sections ahead of the database set to its row (`HSET`: the script
    /// would keep the higher version) and published, both with
    /// `"replace": true`.
    pub fn replace(&mut self, snaps: &[Snapshot]) -> Result<(), Error> {
        let sharded = self.link.redis().pubsub == PubSubMode::Sharded;
        let single = self.link.mode()? == Mode::Standalone;
        let publish = if sharded && !single {
            "SPUBLISH"
        } else {
            "PUBLISH"
        };
        let mut sets = Vec::with_capacity(snaps.len());
        let mut pubs = Vec::with_capacity(snaps.len());
        for s in snaps {
            let mut loud = s.clone();
            loud.replace = true;
            // The field holds what is published, flag and all: a node whose
            // connection was down when this went out takes it at its reread.
            let payload = loud.to_payload();
            let mut set = ::redis::cmd("HSET");
            set.arg(format!("{}{}", self.state_prefix, s.course))
                .arg(s.section)
                .arg(&payload);
            sets.push(set);
            let mut p = ::redis::cmd(publish);
            p.arg(format!("{}{}", self.channel_prefix, s.course))
                .arg(payload);
            pubs.push(p);
        }
        self.commands += 2 * snaps.len() as u64;
        // The hash before the channel, as every publisher does.
        self.link.pipeline::<()>(&sets)?;
        if single || sharded {
            self.link.pipeline::<()>(&pubs)
        } else {
            pubs.iter().try_for_each(|c| self.link.query::<()>(c))
        }
    }
}
