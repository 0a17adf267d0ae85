//! The node's local service for CLIs: a Unix socket where the kernel tells
//! us who is calling (SO_PEERCRED). Requests are relayed to ctld with a
//! credential for that uid; nothing the caller says about itself is
//! believed.

use std::path::Path;
use std::sync::Arc;

use corral_proto::msg::{Ident, LocalRequest, Response};
use corral_proto::{now_ms, read_frame, write_frame};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

use crate::agent::{error_chain, Agent, AgentError};

/// Binds the socket (replacing a stale one), open to every local user.
pub fn bind(path: &Path) -> Result<UnixListener, AgentError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |source| AgentError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        crate::agent::create_private_dir(dir)?;
    }
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path).map_err(io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(io)?;
    Ok(l)
}

/// Serves CLIs until the listener fails.
pub async fn serve(agent: Arc<Agent>, listener: UnixListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let agent = agent.clone();
                tokio::spawn(async move { client(agent, stream).await });
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept on agent socket");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

async fn client(agent: Arc<Agent>, stream: UnixStream) {
    let who = match stream.peer_cred() {
        Ok(c) => Ident {
            uid: c.uid(),
            gid: c.gid(),
        },
        Err(e) => {
            tracing::warn!(error = %e, "no peer credentials");
            return;
        }
    };
    let (mut r, mut w) = stream.into_split();
    // Requests on one connection are relayed concurrently and answered in
    // order: a client may pipeline.
    let (tx, mut rx) = mpsc::channel::<tokio::task::JoinHandle<Response>>(256);
    let writer = tokio::spawn(async move {
        while let Some(h) = rx.recv().await {
            let resp = h
                .await
                .unwrap_or_else(|e| Response::Error(format!("agent: {e}")));
            if write_frame(&mut w, &resp).await.is_err() {
                return;
            }
        }
    });
    loop {
        let req = match read_frame::<_, LocalRequest>(&mut r).await {
            Ok(Some(req)) => req,
            Ok(None) => break,
            Err(e) => {
                tracing::info!(uid = who.uid, error = %error_chain(&e), "bad frame from local client; closing");
                break;
            }
        };
        let agent = agent.clone();
        let h = tokio::spawn(async move {
            match req {
                LocalRequest::Relay(request) => agent.relay(who, request).await,
                LocalRequest::Credential => match agent.minter.mint(who, now_ms()) {
                    Ok(t) => Response::Credential(t),
                    Err(e) => Response::Error(e.to_string()),
                },
                LocalRequest::NodeAddress => match agent.address() {
                    Some(ip) => Response::Address(ip),
                    None => Response::Error(
                        "Unable to contact slurm controller (connect failure)".into(),
                    ),
                },
            }
        });
        if tx.send(h).await.is_err() {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}
