//! Where a connection is in its life. It moves only forward, and only by the
//! named transitions here: open, then closing once our close frame is queued,
//! then cut if its socket is still open when the close grace ends.

/// A connection's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Frames flow both ways.
    Open,
    /// Our close frame (with `code`) is queued and nothing else goes out; the
    /// socket is cut at `cut_at` (ms) if it is still open then.
    Closing { code: u16, cut_at: u64 },
    /// The close grace ended with the socket still open: the shell cuts it.
    Cut,
}

impl Phase {
    /// True while frames may still be queued.
    pub fn is_open(self) -> bool {
        self == Phase::Open
    }

    /// Open → closing with `code`, cut at `cut_at` unless gone by then; false
    /// (and no change) if the connection was not open.
    pub fn start_close(&mut self, code: u16, cut_at: u64) -> bool {
        if !self.is_open() {
            return false;
        }
        *self = Phase::Closing { code, cut_at };
        true
    }

    /// Closing → cut once `now_ms` reached the cut time; true when it moved.
    pub fn cut_if_due(&mut self, now_ms: u64) -> bool {
        match *self {
            Phase::Closing { cut_at, .. } if now_ms >= cut_at => {
                *self = Phase::Cut;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Phase;

    #[test]
    fn open_then_closing_then_cut_and_never_back() {
        let mut p = Phase::Open;
        assert!(!p.cut_if_due(10_000), "an open connection is never cut");
        assert!(p.start_close(1008, 3_000));
        assert_eq!(
            p,
            Phase::Closing {
                code: 1008,
                cut_at: 3_000
            }
        );
        assert!(!p.start_close(1000, 9_000), "the first close wins");
        assert!(!p.cut_if_due(2_999));
        assert!(p.cut_if_due(3_000));
        assert_eq!(p, Phase::Cut);
        assert!(!p.start_close(1000, 9_000) && !p.cut_if_due(9_000));
        assert!(!p.is_open());
    }
}
