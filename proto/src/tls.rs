//! Certificates and QUIC endpoint configuration.
//!
//! A cluster has one CA (`corral certs init`). ctld's certificate names
//! `corral-ctld`; an agent's names its node, and ctld lets an agent
//! register only under a name its certificate carries. Both sides demand a
//! certificate from the cluster CA (mutual TLS 1.3); a peer without one is
//! refused during the handshake.
//!
//! srun's step endpoint is the exception: it makes a throwaway self-signed
//! certificate, and agents dialing back pin its SHA-256, which travels in
//! the launch.

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

/// The name in ctld's certificate that agents and clients check.
pub const CTLD_NAME: &str = "corral-ctld";

const ALPN: &[u8] = b"corral/1";

/// Why certificates or endpoints could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a PEM certificate or key")]
    Pem {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{path} already exists; refusing to overwrite a cluster CA")]
    Exists { path: PathBuf },
    #[error("certificate generation")]
    Rcgen(#[from] rcgen::Error),
    #[error("tls configuration")]
    Rustls(#[from] rustls::Error),
    #[error("quic configuration")]
    Quic(#[from] quinn::crypto::rustls::NoInitialCipherSuite),
    #[error("cannot bind udp {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// ring's suites with AES-128-GCM-SHA256 first. The default puts
/// AES-256-GCM-SHA384 first, whose key schedule runs SHA-512 in software
/// on machines without its instructions (SHA-256 has them): every step
/// connection's handshake paid for it on both ends.
/// Made once: every agent's dial back to an srun asks for it.
fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: std::sync::OnceLock<Arc<CryptoProvider>> = std::sync::OnceLock::new();
    PROVIDER
        .get_or_init(|| {
            use rustls::crypto::ring::cipher_suite;
            let mut p = rustls::crypto::ring::default_provider();
            p.cipher_suites = vec![
                cipher_suite::TLS13_AES_128_GCM_SHA256,
                cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
                cipher_suite::TLS13_AES_256_GCM_SHA384,
            ];
            Arc::new(p)
        })
        .clone()
}

fn read(path: &Path) -> Result<String, TlsError> {
    fs::read_to_string(path).map_err(|source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn write(path: &Path, text: &str, private: bool) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(path)
        .map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)
}

/// The files of one certificate: `NAME.pem` and `NAME.key` in a directory.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertFiles {
    /// `DIR/ca.pem`, `DIR/NAME.pem`, `DIR/NAME.key`.
    pub fn in_dir(dir: &Path, name: &str) -> Self {
        CertFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}.key")),
        }
    }
}

fn ca_params() -> Result<CertificateParams, TlsError> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "corral cluster CA");
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(p)
}

/// Creates a cluster CA (`ca.pem`, `ca.key`) in `dir`.
pub fn init_ca(dir: &Path) -> Result<(), TlsError> {
    fs::create_dir_all(dir).map_err(|source| TlsError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let (cert_path, key_path) = (dir.join("ca.pem"), dir.join("ca.key"));
    if cert_path.exists() {
        return Err(TlsError::Exists { path: cert_path });
    }
    let key = KeyPair::generate()?;
    let cert = ca_params()?.self_signed(&key)?;
    write(&key_path, &key.serialize_pem(), true)?;
    write(&cert_path, &cert.pem(), false)
}

/// What a certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// ctld: named [`CTLD_NAME`] (and the given name).
    Controller,
    /// An agent (or a trusted tool): named after its node.
    Agent,
}

/// Signs a certificate for `name` with the CA in `dir`; writes
/// `DIR/NAME.pem` and `DIR/NAME.key`.
pub fn issue(dir: &Path, name: &str, role: Role) -> Result<CertFiles, TlsError> {
    let ca_key = KeyPair::from_pem(&read(&dir.join("ca.key"))?)?;
    let ca_pem = read(&dir.join("ca.pem"))?;
    // rcgen signs with an issuer certificate object: rebuild it from the
    // stored one (same name, same key).
    let ca = CertificateParams::from_ca_cert_pem(&ca_pem)?.self_signed(&ca_key)?;
    let mut names = vec![name.to_string()];
    if role == Role::Controller && name != CTLD_NAME {
        names.push(CTLD_NAME.to_string());
    }
    let mut p = CertificateParams::new(names)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    p.distinguished_name = dn;
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = KeyPair::generate()?;
    let cert = p.signed_by(&key, &ca, &ca_key)?;
    let files = CertFiles::in_dir(dir, name);
    write(&files.key, &key.serialize_pem(), true)?;
    write(&files.cert, &cert.pem(), false)?;
    Ok(files)
}

/// A loaded certificate, its key and the CA to trust.
#[derive(Debug)]
pub struct Identity {
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Identity {
            roots: self.roots.clone(),
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl Identity {
    pub fn load(files: &CertFiles) -> Result<Identity, TlsError> {
        let pem = |path: &Path| {
            let p = path.to_path_buf();
            move |source| TlsError::Pem { path: p, source }
        };
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(&files.ca).map_err(pem(&files.ca))? {
            roots.add(c.map_err(pem(&files.ca))?)?;
        }
        let chain = CertificateDer::pem_file_iter(&files.cert)
            .map_err(pem(&files.cert))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(pem(&files.cert))?;
        let key = PrivateKeyDer::from_pem_file(&files.key).map_err(pem(&files.key))?;
        Ok(Identity {
            roots: Arc::new(roots),
            chain,
            key,
        })
    }
}

/// A connection's transport. `streams` is how many bidirectional streams
/// the peer may have open at once: quinn sets up the state of every one
/// of them when the connection opens (about 100 bytes each), which at a
/// thousand nodes is what ctld's memory goes to. `keep_alive`: whether
/// this side pings an idle connection (one side suffices).
fn transport(idle: Duration, streams: u32, keep_alive: bool) -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_bidi_streams(streams.into());
    // No one opens unidirectional streams.
    t.max_concurrent_uni_streams(0u32.into());
    t.keep_alive_interval(keep_alive.then_some(KEEP_ALIVE));
    t.max_idle_timeout(quinn::IdleTimeout::try_from(idle).ok());
    Arc::new(t)
}

/// How often an agent pings its idle connection to ctld: a controller
/// started again answers the next ping with a reset, so this bounds how
/// long its nodes take to notice.
pub const KEEP_ALIVE: Duration = Duration::from_secs(2);

/// Requests one agent may have in flight to ctld at first (its CLIs'
/// requests beyond these wait for a stream to free; ctld allows a node
/// that uses them more). quinn keeps about 120 bytes for each from the
/// start: 128 cost 15 KiB per node, 4,096 cost 420 KiB.
pub const AGENT_STREAMS: u32 = 128;

/// Streams an agent may open to srun on a step connection: it opens one,
/// for its tasks' hello, output, input and exits. (quinn sets up the
/// state of every allowed stream as the connection opens: with 4,096,
/// that was about 6% of srun's CPU in a profile of `srun -N1 true`, and
/// the agent paid it too.)
const STEP_STREAMS: u32 = 1;

/// ctld's server side: demands a client certificate from the cluster CA.
pub fn server_config(id: &Identity) -> Result<quinn::ServerConfig, TlsError> {
    let verifier = WebPkiClientVerifier::builder_with_provider(id.roots.clone(), provider())
        .build()
        .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(id.chain.clone(), id.key.clone_key())?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(tls)?));
    cfg.transport_config(transport(Duration::from_secs(30), AGENT_STREAMS, false));
    Ok(cfg)
}

/// A client of ctld: presents its certificate, checks ctld's.
pub fn client_config(id: &Identity) -> Result<quinn::ClientConfig, TlsError> {
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(id.roots.clone())
        .with_client_auth_cert(id.chain.clone(), id.key.clone_key())?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let mut cfg = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls)?));
    // ctld opens no stream to an agent.
    cfg.transport_config(transport(Duration::from_secs(30), 0, true));
    Ok(cfg)
}

/// The DNS names the peer's (already verified) certificate carries, among
/// `candidates`: whether it may act as `name`.
pub fn peer_is(conn: &quinn::Connection, name: &str) -> bool {
    let Some(any) = conn.peer_identity() else {
        return false;
    };
    let Ok(chain) = any.downcast::<Vec<CertificateDer<'static>>>() else {
        return false;
    };
    let Some(leaf) = chain.first() else {
        return false;
    };
    let Ok(cert) = webpki::EndEntityCert::try_from(leaf) else {
        return false;
    };
    let Ok(server_name) = ServerName::try_from(name.to_string()) else {
        return false;
    };
    cert.verify_is_valid_for_subject_name(&server_name).is_ok()
}

/// srun's step endpoint: a fresh self-signed certificate, no client
/// certificates (agents prove themselves with the step's secret).
pub fn step_server_config() -> Result<(quinn::ServerConfig, [u8; 32]), TlsError> {
    let (tls, fp) = step_server_tls()?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(tls)?));
    cfg.transport_config(transport(Duration::from_secs(30), STEP_STREAMS, true));
    Ok((cfg, fp))
}

fn step_server_tls() -> Result<(rustls::ServerConfig, [u8; 32]), TlsError> {
    let key = KeyPair::generate()?;
    let cert = CertificateParams::new(vec!["srun".to_string()])?.self_signed(&key)?;
    let der = cert.der().clone();
    let fp = sha256(der.as_ref());
    let key = PrivateKeyDer::try_from(key.serialize_der())
        .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(vec![der], key)?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    Ok((tls, fp))
}

/// An agent dialing srun: trusts exactly the certificate with this hash.
pub fn pinned_client_config(cert_sha256: [u8; 32]) -> Result<quinn::ClientConfig, TlsError> {
    let tls = pinned_client_tls(cert_sha256)?;
    let mut cfg = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls)?));
    // srun opens no stream to an agent.
    cfg.transport_config(transport(Duration::from_secs(30), 0, true));
    Ok(cfg)
}

fn pinned_client_tls(cert_sha256: [u8; 32]) -> Result<rustls::ClientConfig, TlsError> {
    let verifier = Arc::new(Pinned {
        sha256: cert_sha256,
        provider: provider(),
    });
    let mut tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    Ok(tls)
}

pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

#[derive(Debug)]
struct Pinned {
    sha256: [u8; 32],
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // The hash of a certificate is no secret: plain comparison is fine.
        if sha256(end_entity.as_ref()) == self.sha256 {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls12NotOffered,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A server endpoint on `addr`.
pub fn server_endpoint(
    addr: SocketAddr,
    cfg: quinn::ServerConfig,
) -> Result<quinn::Endpoint, TlsError> {
    endpoint(addr, quinn::EndpointConfig::default(), Some(cfg))
}

/// The bytes of UDP datagrams an endpoint's socket may hold unread (and
/// unsent). A listing of 10,000 jobs is half a megabyte that ctld sends
/// its agent at once; in the kernel's default 208 KiB the agent's socket
/// dropped about one datagram per listing (`RcvbufErrors` in
/// `/proc/net/snmp`), and each loss stalled the stream for a
/// retransmission and cut ctld's congestion window.
pub const UDP_BUFFER: usize = 4 << 20;

/// A UDP socket bound to `addr` with [`UDP_BUFFER`]s: asked for with the
/// privilege to exceed the system's limit where the process has it, else
/// up to that limit (`net.core.rmem_max`, `wmem_max`).
fn udp_socket(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    use nix::sys::socket::{setsockopt, sockopt};
    let socket = std::net::UdpSocket::bind(addr)?;
    if setsockopt(&socket, sockopt::RcvBufForce, &UDP_BUFFER).is_err() {
        let _ = setsockopt(&socket, sockopt::RcvBuf, &UDP_BUFFER);
    }
    if setsockopt(&socket, sockopt::SndBufForce, &UDP_BUFFER).is_err() {
        let _ = setsockopt(&socket, sockopt::SndBuf, &UDP_BUFFER);
    }
    Ok(socket)
}

/// An endpoint on a [`udp_socket`].
fn endpoint(
    addr: SocketAddr,
    ep: quinn::EndpointConfig,
    server: Option<quinn::ServerConfig>,
) -> Result<quinn::Endpoint, TlsError> {
    let bind = |source| TlsError::Bind { addr, source };
    let socket = udp_socket(addr).map_err(bind)?;
    let runtime =
        quinn::default_runtime().ok_or_else(|| bind(std::io::Error::other("no async runtime")))?;
    quinn::Endpoint::new(ep, server, socket, runtime).map_err(bind)
}

/// Random 8-byte connection ids, any of which a server run accepts as its
/// own (see [`server_endpoint_for`]).
struct RandomIds;

impl quinn::ConnectionIdGenerator for RandomIds {
    fn generate_cid(&mut self) -> quinn::ConnectionId {
        use ring::rand::SecureRandom;
        let mut id = [0u8; 8];
        // The system's generator does not fail once the process runs; a
        // zero id would only be a poor one.
        let _ = ring::rand::SystemRandom::new().fill(&mut id);
        quinn::ConnectionId::new(&id)
    }

    fn cid_len(&self) -> usize {
        8
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// The least time between two stateless resets a server sends.
pub const RESET_INTERVAL: Duration = Duration::from_micros(50);

/// A server endpoint whose stateless-reset key comes from `id`'s private
/// key, so the same server started again (same certificate, same
/// address) resets the connections of the one before at their next
/// packet: its agents notice the restart within a keep-alive and
/// reconnect, instead of waiting out the idle timeout.
pub fn server_endpoint_for(
    addr: SocketAddr,
    cfg: quinn::ServerConfig,
    id: &Identity,
) -> Result<quinn::Endpoint, TlsError> {
    use ring::hmac;
    let master = hmac::Key::new(hmac::HMAC_SHA256, id.key.secret_der());
    let derived = hmac::sign(&master, b"corral stateless reset");
    let reset = hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref());

    let mut ep = quinn::EndpointConfig::new(Arc::new(reset));
    // quinn's default ids carry a signature keyed at random per run, and
    // a packet whose id this run could not have issued gets no reset:
    // plain random ids are recognised by the next run too.
    ep.cid_generator(|| Box::new(RandomIds));
    // quinn sends one reset per 20 ms by default: after a restart, every
    // node of a large cluster waits for its turn, one keep-alive at a
    // time (5,000 nodes: minutes). A reset is smaller than the packet
    // that caused it, so a faster rate amplifies nothing.
    ep.min_reset_interval(RESET_INTERVAL);
    endpoint(addr, ep, Some(cfg))
}

/// A client endpoint on an ephemeral port of the unspecified address of
/// `peer`'s family.
pub fn client_endpoint(peer: SocketAddr) -> Result<quinn::Endpoint, TlsError> {
    let addr: SocketAddr = if peer.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    endpoint(addr, quinn::EndpointConfig::default(), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An endpoint's socket holds a listing's worth of datagrams: as much
    /// as asked where the process may exceed the system's limit (root,
    /// as CI runs), else that limit. The kernel reports twice what it
    /// was asked, its own bookkeeping included.
    #[test]
    fn endpoint_sockets_get_large_buffers() {
        use nix::sys::socket::{getsockopt, sockopt};
        let socket = udp_socket("127.0.0.1:0".parse().unwrap()).unwrap();
        let limit = |f: &str| -> usize {
            std::fs::read_to_string(format!("/proc/sys/net/core/{f}"))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        };
        let root = nix::unistd::geteuid().is_root();
        for (got, max) in [
            (
                getsockopt(&socket, sockopt::RcvBuf).unwrap(),
                limit("rmem_max"),
            ),
            (
                getsockopt(&socket, sockopt::SndBuf).unwrap(),
                limit("wmem_max"),
            ),
        ] {
            let want = if root {
                UDP_BUFFER
            } else {
                UDP_BUFFER.min(max)
            };
            assert!(got >= 2 * want, "buffer {got}, asked {want}");
        }
    }

    #[test]
    fn ca_refuses_overwrite_and_issues_named_certs() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path()).unwrap();
        assert!(matches!(init_ca(dir.path()), Err(TlsError::Exists { .. })));
        let files = issue(dir.path(), "worker-0", Role::Agent).unwrap();
        let id = Identity::load(&files).unwrap();
        assert_eq!(id.chain.len(), 1);
        let leaf = webpki::EndEntityCert::try_from(&id.chain[0]).unwrap();
        let name = ServerName::try_from("worker-0").unwrap();
        assert!(leaf.verify_is_valid_for_subject_name(&name).is_ok());
        let other = ServerName::try_from("worker-1").unwrap();
        assert!(leaf.verify_is_valid_for_subject_name(&other).is_err());
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(&files.key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    async fn handshake(server_dir: &Path, client_dir: &Path, client: &str) -> bool {
        let sid = Identity::load(&issue(server_dir, CTLD_NAME, Role::Controller).unwrap()).unwrap();
        let cid = Identity::load(&issue(client_dir, client, Role::Agent).unwrap()).unwrap();
        let server =
            server_endpoint("127.0.0.1:0".parse().unwrap(), server_config(&sid).unwrap()).unwrap();
        let addr = server.local_addr().unwrap();
        let accept = tokio::spawn(async move {
            let inc = server.accept().await?;
            let conn = inc.await.ok()?;
            let (_, mut recv) = conn.accept_bi().await.ok()?;
            let mut b = [0u8; 2];
            tokio::io::AsyncReadExt::read_exact(&mut recv, &mut b)
                .await
                .ok()?;
            Some(())
        });
        let mut ep = client_endpoint(addr).unwrap();
        ep.set_default_client_config(client_config(&cid).unwrap());
        let ok = async {
            let conn = ep.connect(addr, CTLD_NAME).ok()?.await.ok()?;
            let (mut send, _) = conn.open_bi().await.ok()?;
            tokio::io::AsyncWriteExt::write_all(&mut send, b"hi")
                .await
                .ok()?;
            send.finish().ok()?;
            Some(conn)
        }
        .await;
        let served = tokio::time::timeout(Duration::from_secs(5), accept)
            .await
            .ok()
            .and_then(|r| r.ok())
            .flatten()
            .is_some();
        ok.is_some() && served
    }

    #[tokio::test]
    async fn a_client_without_a_certificate_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path()).unwrap();
        let sid = Identity::load(&issue(dir.path(), CTLD_NAME, Role::Controller).unwrap()).unwrap();
        let server =
            server_endpoint("127.0.0.1:0".parse().unwrap(), server_config(&sid).unwrap()).unwrap();
        let addr = server.local_addr().unwrap();
        let accept = tokio::spawn(async move { server.accept().await?.await.ok() });
        let mut tls = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(sid.roots.clone())
            .with_no_client_auth();
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let cfg = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls).unwrap()));
        let ep = client_endpoint(addr).unwrap();
        let conn = ep.connect_with(cfg, addr, CTLD_NAME).unwrap().await;
        let served = tokio::time::timeout(Duration::from_secs(5), accept)
            .await
            .ok()
            .and_then(|r| r.ok())
            .flatten();
        assert!(
            served.is_none(),
            "the server accepted a client without a certificate"
        );
        if let Ok(conn) = conn {
            // The client may think it connected; its first stream fails.
            let r = async {
                let (mut s, mut r) = conn.open_bi().await.ok()?;
                tokio::io::AsyncWriteExt::write_all(&mut s, b"x")
                    .await
                    .ok()?;
                let mut b = [0u8; 1];
                tokio::io::AsyncReadExt::read_exact(&mut r, &mut b)
                    .await
                    .ok()
            }
            .await;
            assert!(r.is_none());
        }
    }

    /// A TLS handshake in memory between an agent trusting `pin` and
    /// srun's step configuration: the suite they settle on, or `None`
    /// when the agent refuses srun's certificate.
    fn step_handshake(
        server: rustls::ServerConfig,
        pin: [u8; 32],
    ) -> Option<rustls::SupportedCipherSuite> {
        let name = ServerName::try_from("srun").unwrap();
        let mut c =
            rustls::ClientConnection::new(Arc::new(pinned_client_tls(pin).unwrap()), name).unwrap();
        let mut s = rustls::ServerConnection::new(Arc::new(server)).unwrap();
        for _ in 0..10 {
            let mut wire = Vec::new();
            c.write_tls(&mut wire).unwrap();
            s.read_tls(&mut &wire[..]).unwrap();
            s.process_new_packets().ok()?;
            wire.clear();
            s.write_tls(&mut wire).unwrap();
            c.read_tls(&mut &wire[..]).unwrap();
            c.process_new_packets().ok()?;
            if !c.is_handshaking() && !s.is_handshaking() {
                return s.negotiated_cipher_suite();
            }
        }
        None
    }

    #[test]
    fn a_step_connection_trusts_only_the_pinned_certificate_with_aes_128() {
        let (server, fp) = step_server_tls().unwrap();
        let suite = step_handshake(server, fp).expect("the pinned certificate is trusted");
        // Not AES-256-GCM-SHA384, whose SHA-512 runs without hardware
        // help: both ends of every srun pay for the key schedule.
        assert_eq!(suite.suite(), rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
        let (server, mut fp) = step_server_tls().unwrap();
        fp[0] ^= 1;
        assert!(step_handshake(server, fp).is_none());
        // Another srun's certificate is not this one's.
        let (server, _) = step_server_tls().unwrap();
        let (_, other) = step_server_tls().unwrap();
        assert!(step_handshake(server, other).is_none());
    }

    #[tokio::test]
    async fn mutual_tls_refuses_a_foreign_ca() {
        let ours = tempfile::tempdir().unwrap();
        init_ca(ours.path()).unwrap();
        assert!(handshake(ours.path(), ours.path(), "worker-0").await);
        let theirs = tempfile::tempdir().unwrap();
        init_ca(theirs.path()).unwrap();
        assert!(!handshake(ours.path(), theirs.path(), "worker-1").await);
    }
}
