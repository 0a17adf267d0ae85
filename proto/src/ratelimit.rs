//! Log lines that a user can cause (a half frame, a refused handshake, a
//! connection over its limit) are rate-limited, so no one can grow a
//! daemon's log without bound: at most a few lines per kind and window,
//! then one line saying how many were left out.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Lines of one kind let through per window.
pub const LINES_PER_WINDOW: u32 = 10;
/// The window.
pub const WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Window {
    start: Instant,
    lines: u32,
    suppressed: u64,
}

/// Counts lines per kind.
#[derive(Debug, Default)]
pub struct LogLimiter {
    kinds: Mutex<HashMap<&'static str, Window>>,
}

/// Whether to log a line now.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Log it; `suppressed` lines of this kind were left out before it.
    Log { suppressed: u64 },
    /// Leave it out.
    Quiet,
}

impl LogLimiter {
    pub fn check(&self, kind: &'static str) -> Verdict {
        self.check_at(kind, Instant::now())
    }

    pub fn check_at(&self, kind: &'static str, now: Instant) -> Verdict {
        let mut kinds = self.kinds.lock();
        let w = kinds.entry(kind).or_insert(Window {
            start: now,
            lines: 0,
            suppressed: 0,
        });
        if now.duration_since(w.start) >= WINDOW {
            let suppressed = std::mem::take(&mut w.suppressed);
            w.start = now;
            w.lines = 1;
            return Verdict::Log { suppressed };
        }
        if w.lines < LINES_PER_WINDOW {
            w.lines += 1;
            return Verdict::Log { suppressed: 0 };
        }
        w.suppressed += 1;
        Verdict::Quiet
    }
}

/// Logs a warning through `limiter` under `kind`, noting how many lines
/// of the kind were left out since the last one.
#[macro_export]
macro_rules! warn_limited {
    ($limiter:expr, $kind:expr, $($arg:tt)+) => {
        if let $crate::ratelimit::Verdict::Log { suppressed } = $limiter.check($kind) {
            if suppressed > 0 {
                tracing::warn!(suppressed, kind = $kind, "repeated lines left out");
            }
            tracing::warn!($($arg)+);
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_logs_a_few_lines_then_a_count() {
        let l = LogLimiter::default();
        let t0 = Instant::now();
        let logged = (0..10_000)
            .filter(|_| l.check_at("half frame", t0) != Verdict::Quiet)
            .count();
        assert_eq!(logged as u32, LINES_PER_WINDOW);
        // Another kind has its own budget.
        assert_eq!(l.check_at("handshake", t0), Verdict::Log { suppressed: 0 });
        // The next window says what was left out.
        assert_eq!(
            l.check_at("half frame", t0 + WINDOW),
            Verdict::Log {
                suppressed: 10_000 - u64::from(LINES_PER_WINDOW)
            }
        );
    }
}
