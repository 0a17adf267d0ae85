//! `corral-proto`: what travels between Corral's processes and how.
//!
//! - [`ids`]: who and what messages name (users, jobs, runs, steps).
//! - [`msg`]: the messages (plain serde types).
//! - [`frame`]: length-prefixed bincode 2 frames with a protocol version
//!   and a size cap; a bad frame is an error for one stream, never a panic.
//! - [`tls`]: the cluster CA, certificates (rcgen), and QUIC endpoint
//!   configuration (quinn + rustls, TLS 1.3, mutual authentication).
//! - [`cred`]: short-lived credentials that carry a uid from an agent to
//!   ctld.
//! - [`pattern`]: output file patterns (`slurm-%j.out`), expanded by the
//!   agent and shown by the CLI.
//!
//! It owns no sockets and spawns no tasks: the controller, the agent and
//! the CLI each drive their own.

pub mod cred;
pub mod frame;
pub mod ids;
pub mod msg;
pub mod pattern;
pub mod tls;

pub use frame::{read_frame, read_raw_frame, write_frame, WireError, MAX_FRAME, PROTOCOL_VERSION};
pub mod ratelimit;

/// Milliseconds since the Unix epoch, from the system clock.
/// Whether `c` must not reach another user's terminal raw: a control
/// character, a bidirectional override or isolate (U+202A to U+202E,
/// U+2066 to U+2069: they reorder what follows them on the line, so a
/// name could show as another), or a line or paragraph separator
/// (U+2028, U+2029: a line break to some terminals and parsers).
pub fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}')
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// An error and its sources on one line: "outer: inner: innermost".
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
