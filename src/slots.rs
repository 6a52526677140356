//! Redis Cluster key slots: CRC16 (XMODEM) of the key, or of its `{hash tag}`,
//! mod 16384, and the slot map read from `CLUSTER SLOTS`.

use redis::Value;

/// Slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// A cluster node's address.
pub type Addr = (String, u16);

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The slot of `key`: only the part inside the first non-empty `{...}` counts.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS
}

/// Which primary serves each slot (and the replicas, as fallback seeds).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotMap {
    /// `(first slot, last slot, primary)`, sorted by first slot.
    ranges: Vec<(u16, u16, Addr)>,
    /// Every node named, primaries first.
    nodes: Vec<Addr>,
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

fn node(v: &Value, seed_host: &str) -> Option<Addr> {
    let Value::Array(f) = v else { return None };
    let host = f.first().and_then(text)?;
    let port = u16::try_from(f.get(1).and_then(int)?).ok()?;
    // An empty or `?` host means "the address you reached me on".
    let host = if host.is_empty() || host == "?" {
        seed_host.to_owned()
    } else {
        host
    };
    Some((host, port))
}

impl SlotMap {
    /// Parses a `CLUSTER SLOTS` reply (read from a node reached at `seed_host`).
    pub fn parse(reply: &Value, seed_host: &str) -> Option<SlotMap> {
        let Value::Array(rows) = reply else {
            return None;
        };
        let mut map = SlotMap::default();
        let mut replicas = Vec::new();
        for row in rows {
            let Value::Array(f) = row else { return None };
            let first = u16::try_from(f.first().and_then(int)?).ok()?;
            let last = u16::try_from(f.get(1).and_then(int)?).ok()?;
            let primary = node(f.get(2)?, seed_host)?;
            if !map.nodes.contains(&primary) {
                map.nodes.push(primary.clone());
            }
            replicas.extend(f.iter().skip(3).filter_map(|r| node(r, seed_host)));
            map.ranges.push((first, last, primary));
        }
        for r in replicas {
            if !map.nodes.contains(&r) {
                map.nodes.push(r);
            }
        }
        map.ranges.sort_by_key(|r| r.0);
        (!map.ranges.is_empty()).then_some(map)
    }

    /// The primary serving `slot`, if any.
    pub fn owner(&self, slot: u16) -> Option<&Addr> {
        let i = self.ranges.partition_point(|r| r.0 <= slot);
        let (first, last, addr) = self.ranges.get(i.checked_sub(1)?)?;
        (*first <= slot && slot <= *last).then_some(addr)
    }

    /// The primary serving `key`.
    pub fn owner_of(&self, key: &[u8]) -> Option<&Addr> {
        self.owner(key_slot(key))
    }

    /// Every distinct primary.
    pub fn primaries(&self) -> Vec<Addr> {
        let mut p: Vec<Addr> = self.ranges.iter().map(|r| r.2.clone()).collect();
        p.sort();
        p.dedup();
        p
    }

    /// Every node named (primaries and replicas).
    pub fn nodes(&self) -> &[Addr] {
        &self.nodes
    }

    /// Whether every slot has the same primary in `other` (replicas aside):
    /// a failover or a migration changed nothing a client routes by.
    pub fn same_owners(&self, other: &SlotMap) -> bool {
        self.ranges == other.ranges
    }

    /// The slots that the primaries in `down` serve, as ranges.
    pub fn slots_of(&self, down: &[Addr]) -> Vec<(u16, u16)> {
        self.ranges
            .iter()
            .filter(|r| down.contains(&r.2))
            .map(|r| (r.0, r.1))
            .collect()
    }
}

/// Slots no reachable primary serves, with the key prefix whose keys a
/// course needs there: what makes a node `degraded` for a watched course.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlindSlots {
    /// The key prefix (`--state-prefix`): a course needs `<prefix><course>`.
    pub prefix: String,
    /// The slots, as ranges.
    pub ranges: Vec<(u16, u16)>,
}

impl BlindSlots {
    /// Whether `course`'s key lives on a slot without a reachable primary.
    pub fn covers(&self, course: &str) -> bool {
        if self.ranges.is_empty() {
            return false;
        }
        let mut key = Vec::with_capacity(self.prefix.len() + course.len());
        key.extend_from_slice(self.prefix.as_bytes());
        key.extend_from_slice(course.as_bytes());
        let slot = key_slot(&key);
        self.ranges.iter().any(|(a, b)| *a <= slot && slot <= *b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // Values from `CLUSTER KEYSLOT`.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    }

    #[test]
    fn slot_map_routes_by_range() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let n = |h: &str, p: i64| Value::Array(vec![b(h), Value::Int(p), b("id")]);
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(10922),
                n("10.0.0.2", 7001),
                n("10.0.0.5", 7004),
            ]),
            Value::Array(vec![Value::Int(0), Value::Int(5460), n("", 7000)]),
            Value::Array(vec![
                Value::Int(10923),
                Value::Int(16383),
                n("10.0.0.3", 7002),
            ]),
        ]);
        let m = SlotMap::parse(&reply, "seed").expect("map");
        assert_eq!(m.owner(0), Some(&("seed".to_owned(), 7000)));
        assert_eq!(m.owner(5461), Some(&("10.0.0.2".to_owned(), 7001)));
        assert_eq!(m.owner(16383), Some(&("10.0.0.3".to_owned(), 7002)));
        assert_eq!(m.primaries().len(), 3);
        assert_eq!(m.nodes().len(), 4);
    }

    /// A `CLUSTER SLOTS` reply of two halves, each `(primary, replica)`.
    fn halves(a: (i64, i64), b: (i64, i64)) -> SlotMap {
        let n = |p: i64| Value::Array(vec![Value::BulkString(b"10.0.0.1".to_vec()), Value::Int(p)]);
        let row = |first: i64, last: i64, (p, r): (i64, i64)| {
            Value::Array(vec![Value::Int(first), Value::Int(last), n(p), n(r)])
        };
        let reply = Value::Array(vec![row(0, 8191, a), row(8192, 16383, b)]);
        SlotMap::parse(&reply, "seed").expect("map")
    }

    #[test]
    fn a_failover_changes_owners_and_a_silent_primary_blinds_its_slots() {
        let before = halves((7000, 7003), (7001, 7004));
        // Replicas listed otherwise: the same owners.
        assert!(before.same_owners(&halves((7000, 7005), (7001, 7004))));
        // 7001's replica promoted.
        let after = halves((7000, 7003), (7004, 7001));
        assert!(!before.same_owners(&after));
        let down = [("10.0.0.1".to_owned(), 7001)];
        assert_eq!(before.slots_of(&down), [(8192, 16383)]);
        assert!(after.slots_of(&down).is_empty());
        let blind = BlindSlots {
            prefix: "seatstate:".into(),
            ranges: before.slots_of(&down),
        };
        // Exactly the courses whose state key hashes into the silent half.
        let courses = (0..40).map(|i| format!("CQ{i}"));
        let covered: Vec<bool> = courses.clone().map(|c| blind.covers(&c)).collect();
        for (c, covered) in courses.zip(&covered) {
            let slot = key_slot(format!("seatstate:{c}").as_bytes());
            assert_eq!(*covered, slot >= 8192, "{c} on {slot}");
        }
        assert!(covered.contains(&true) && covered.contains(&false));
        assert!(!BlindSlots::default().covers("CQ0"));
    }
}
