//! The node's local service for CLIs: a Unix socket where the kernel tells
//! us who is calling (SO_PEERCRED). Requests are relayed to ctld with a
//! credential for that uid; nothing the caller says about itself is
//! believed.

use std::path::Path;
use std::sync::Arc;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::agent::Relayed;
use corral_proto::frame::{read_body, read_len};
use corral_proto::msg::{Ident, LocalRequest, Response};
use corral_proto::ratelimit::LogLimiter;
use corral_proto::{now_ms, warn_limited, write_frame};
use parking_lot::Mutex;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::agent::{error_chain, Agent, AgentError};

/// Binds the socket (replacing a stale one), open to every local user.
pub fn bind(path: &Path) -> Result<UnixListener, AgentError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |source| AgentError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        crate::spool::create_private_dir(dir)?;
    }
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path).map_err(io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(io)?;
    Ok(l)
}

/// What the local socket lets one user, and all users together, hold in
/// the agent: connections (each a descriptor) and bytes of requests not
/// yet answered. Past a limit a connection is closed or waits; the agent
/// keeps descriptors in reserve for launches whatever users do.
#[derive(Clone, Copy, Debug)]
pub struct LocalLimits {
    pub conns_per_user: usize,
    pub conns_total: usize,
    pub bytes_per_user: usize,
    pub bytes_total: usize,
    /// Once a frame has begun, all of it must arrive within this.
    pub frame_timeout: Duration,
    /// Requests of one connection relayed at once (a client may pipeline).
    pub pipeline: usize,
    /// Requests of one user (other than root) relayed or answered but
    /// not yet read, over all their connections: a flood queues behind
    /// itself, and unread answers cannot pile up.
    pub relays_per_user: usize,
}

impl LocalLimits {
    /// Limits for an agent that may have `fd_limit` descriptors open: at
    /// most half of them for local clients.
    pub fn for_fd_limit(fd_limit: u64) -> LocalLimits {
        let total = (fd_limit / 2).clamp(16, 4096) as usize;
        LocalLimits {
            conns_per_user: (total / 8).clamp(4, 256),
            conns_total: total,
            bytes_per_user: 32 << 20,
            bytes_total: 256 << 20,
            frame_timeout: Duration::from_secs(10),
            pipeline: 256,
            relays_per_user: 4,
        }
    }
}

/// The shares of the local socket in use.
#[derive(Debug)]
struct Shares {
    limits: LocalLimits,
    users: Mutex<HashMap<u32, UserShare>>,
    conns: AtomicUsize,
    bytes: Arc<Semaphore>,
}

#[derive(Debug)]
struct UserShare {
    conns: usize,
    bytes: Arc<Semaphore>,
    relays: Arc<Semaphore>,
}

impl UserShare {
    /// Whether requests of this user still hold bytes or turns (their
    /// connection may be gone while the relay runs on).
    fn in_use(&self) -> bool {
        Arc::strong_count(&self.bytes) > 1 || Arc::strong_count(&self.relays) > 1
    }
}

/// One connection's place; gives it back when dropped.
#[derive(Debug)]
struct Seat {
    shares: Arc<Shares>,
    uid: u32,
    bytes: Arc<Semaphore>,
    relays: Arc<Semaphore>,
}

impl Shares {
    fn new(limits: LocalLimits) -> Shares {
        Shares {
            limits,
            users: Mutex::new(HashMap::new()),
            conns: AtomicUsize::new(0),
            bytes: Arc::new(Semaphore::new(limits.bytes_total)),
        }
    }

    fn seat(self: &Arc<Self>, uid: u32) -> Result<Seat, &'static str> {
        let mut users = self.users.lock();
        // Shares of users with no connection left whose last requests
        // have finished too.
        if users.len() > self.limits.conns_total {
            users.retain(|_, u| u.conns > 0 || !u.in_use());
        }
        if self.conns.load(Ordering::Relaxed) >= self.limits.conns_total {
            return Err("too many local connections");
        }
        let u = users.entry(uid).or_insert_with(|| UserShare {
            conns: 0,
            bytes: Arc::new(Semaphore::new(self.limits.bytes_per_user)),
            relays: Arc::new(Semaphore::new(if uid == 0 {
                Semaphore::MAX_PERMITS
            } else {
                self.limits.relays_per_user
            })),
        });
        if u.conns >= self.limits.conns_per_user {
            return Err("too many local connections from one user");
        }
        u.conns += 1;
        self.conns.fetch_add(1, Ordering::Relaxed);
        Ok(Seat {
            shares: self.clone(),
            uid,
            bytes: u.bytes.clone(),
            relays: u.relays.clone(),
        })
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut users = self.shares.users.lock();
        if let Some(u) = users.get_mut(&self.uid) {
            u.conns -= 1;
            // Forgotten only when nothing of it is in flight: a user who
            // closes and reconnects must not get a fresh budget while the
            // old requests still hold theirs.
            // (Two holders when nothing is: the table and this seat.)
            let idle = Arc::strong_count(&u.bytes) <= 2 && Arc::strong_count(&u.relays) <= 2;
            if u.conns == 0 && idle {
                users.remove(&self.uid);
            }
        }
        self.shares.conns.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An answer to write, with the user's relay turn it holds until it is
/// written.
type Answer = (Relayed, Option<OwnedSemaphorePermit>);

/// Bytes of one request, held from before its body is read until its
/// answer is ready.
#[derive(Debug)]
struct Held {
    _user: OwnedSemaphorePermit,
    _all: OwnedSemaphorePermit,
}

static LOGS: std::sync::LazyLock<LogLimiter> = std::sync::LazyLock::new(LogLimiter::default);

/// Serves CLIs until the listener fails.
pub async fn serve(agent: Arc<Agent>, listener: UnixListener, limits: LocalLimits) {
    let shares = Arc::new(Shares::new(limits));
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let agent = agent.clone();
                let shares = shares.clone();
                tokio::spawn(async move { client(agent, stream, shares).await });
            }
            Err(e) => {
                warn_limited!(LOGS, "accept", error = %e, "accept on agent socket");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// Reads one request within the budgets: the length first, then the
/// user's and everyone's share of bytes, then the body, all within the
/// frame timeout once the frame has begun.
async fn read_request<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
    seat: &Seat,
) -> Result<Option<(LocalRequest, Held)>, String> {
    let limits = seat.shares.limits;
    let Some(len) = read_len(r).await.map_err(|e| error_chain(&e))? else {
        return Ok(None);
    };
    let within = async {
        let n = len;
        let user = seat
            .bytes
            .clone()
            .acquire_many_owned(n.min(limits.bytes_per_user as u32))
            .await
            .map_err(|e| e.to_string())?;
        let all = seat
            .shares
            .bytes
            .clone()
            .acquire_many_owned(n.min(limits.bytes_total as u32))
            .await
            .map_err(|e| e.to_string())?;
        let req = read_body::<_, LocalRequest>(r, len)
            .await
            .map_err(|e| error_chain(&e))?;
        Ok::<_, String>((
            req,
            Held {
                _user: user,
                _all: all,
            },
        ))
    };
    match tokio::time::timeout(limits.frame_timeout, within).await {
        Ok(r) => r.map(Some),
        Err(_) => Err(format!(
            "frame of {len} bytes not complete in {} s",
            limits.frame_timeout.as_secs()
        )),
    }
}

async fn client(agent: Arc<Agent>, stream: UnixStream, shares: Arc<Shares>) {
    let who = match stream.peer_cred() {
        Ok(c) => Ident {
            uid: c.uid(),
            gid: c.gid(),
        },
        Err(e) => {
            warn_limited!(LOGS, "peer credentials", error = %e, "no peer credentials");
            return;
        }
    };
    let seat = match shares.seat(who.uid) {
        Ok(s) => s,
        Err(why) => {
            warn_limited!(LOGS, "over limit", uid = who.uid, "{why}; closing");
            let mut stream = stream;
            let _ = write_frame(
                &mut stream,
                &Response::Error(format!("corral-agent: {why} (uid {})", who.uid)),
            )
            .await;
            return;
        }
    };
    let (mut r, mut w) = stream.into_split();
    // Requests on one connection are relayed concurrently and answered in
    // order: a client may pipeline, up to a bound.
    let (tx, mut rx) =
        mpsc::channel::<tokio::task::JoinHandle<Answer>>(shares.limits.pipeline.max(1));
    let writer = tokio::spawn(async move {
        while let Some(h) = rx.recv().await {
            // The user's turn is given back once the answer is written, so
            // answers a client does not read count against its share.
            let (answer, _turn) = h.await.unwrap_or_else(|e| {
                let error = Response::Error(format!("agent: {e}"));
                (Relayed::frame(crate::agent::frame_of(&error)), None)
            });
            if answer.write_to(&mut w).await.is_err() {
                return;
            }
        }
    });
    loop {
        let (req, held) = match read_request(&mut r, &seat).await {
            Ok(Some(x)) => x,
            Ok(None) => break,
            Err(e) => {
                warn_limited!(LOGS, "bad local frame", uid = who.uid, error = %e, "bad frame from local client; closing");
                break;
            }
        };
        let agent = agent.clone();
        let relays = seat.relays.clone();
        let h = tokio::spawn(async move {
            let turn = relays.acquire_owned().await.ok();
            let resp = match req {
                LocalRequest::Relay(request) => agent.relay(who, request).await,
                LocalRequest::Credential => Relayed::frame(crate::agent::frame_of(&match agent
                    .minter
                    .mint(who, now_ms())
                {
                    Ok(t) => Response::Credential(t),
                    Err(e) => Response::Error(e.to_string()),
                })),
                LocalRequest::NodeAddress => {
                    Relayed::frame(crate::agent::frame_of(&match agent.address() {
                        Some(ip) => Response::Address(ip),
                        None => Response::Error(
                            "Unable to contact slurm controller (connect failure)".into(),
                        ),
                    }))
                }
            };
            drop(held);
            (resp, turn)
        });
        if tx.send(h).await.is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
    drop(seat);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> LocalLimits {
        LocalLimits {
            conns_per_user: 2,
            conns_total: 3,
            ..LocalLimits::for_fd_limit(1024)
        }
    }

    #[test]
    fn connections_are_capped_per_user_and_in_all() {
        let shares = Arc::new(Shares::new(limits()));
        let a1 = shares.seat(1000).unwrap();
        let _a2 = shares.seat(1000).unwrap();
        assert_eq!(
            shares.seat(1000).unwrap_err(),
            "too many local connections from one user"
        );
        let _b = shares.seat(1001).unwrap();
        assert_eq!(shares.seat(1002).unwrap_err(), "too many local connections");
        drop(a1);
        shares.seat(1002).unwrap();
    }

    #[test]
    fn reconnecting_does_not_renew_a_budget_still_in_use() {
        let shares = Arc::new(Shares::new(limits()));
        let seat = shares.seat(1000).unwrap();
        let held = seat.bytes.clone().try_acquire_many_owned(30 << 20).unwrap();
        drop(seat);
        // The request goes on after its connection closed: a new
        // connection of the same user sees what it still holds.
        let seat = shares.seat(1000).unwrap();
        assert_eq!(seat.bytes.available_permits(), 2 << 20);
        drop(held);
        drop(seat);
        assert!(
            shares.users.lock().is_empty(),
            "an idle user's share is forgotten"
        );
    }
}
