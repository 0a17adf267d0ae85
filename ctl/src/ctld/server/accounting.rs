//! The server's side of accounting: the writer that moves records from
//! the state store (or, without one, from memory) into the accounting
//! database, and `sacct`'s queries.
//!
//! A record is made in the same store transaction as the final state of
//! its job, so a crash cannot lose it; the writer deletes it from the
//! store only after the database committed it, and writing it again
//! replaces the database's copy, so a crash in between cannot double it.
//! While the database is down or slow the records wait in the store and
//! the controller schedules on.

use std::collections::VecDeque;
use std::time::Duration;

use corral_proto::error_chain as chain;
use corral_proto::msg::{AcctJob, AcctQuery, Ident, Response};
use corral_proto::warn_limited;
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::{now, Server, LOGS};
use crate::ctld::acct::{last_runs, matches};
use crate::ctld::acctdb::AcctDb;
use crate::ctld::config::AcctConfig;

/// Records written per database transaction.
const WRITE_BATCH: usize = 500;

/// The most ids, users and states one query may name: each is a bound
/// value in its SQL, and databases cap those (SQLite at 32,766).
pub const ACCT_MAX_ENTRIES: usize = 10_000;

/// How long the writer gathers records after the first one is made
/// before it writes them: a sequence of short jobs then costs the
/// database one transaction (and the store one commit) per gathering
/// rather than one per job (each was about a fifth of the controller's
/// CPU for tiny jobs). `sacct` shows records still on their way, so
/// nobody sees the wait.
const GATHER: Duration = Duration::from_millis(200);

/// How long a query or a connection attempt waits for the database.
const DB_PATIENCE: Duration = Duration::from_secs(5);

/// The accounting database and the records on their way to it.
#[derive(Debug)]
pub(super) struct Accounting {
    cfg: AcctConfig,
    cluster: String,
    db: tokio::sync::Mutex<Option<AcctDb>>,
    /// Without a state store: records waiting in memory.
    memory: Mutex<VecDeque<(u64, Vec<u8>)>>,
    next_key: Mutex<u64>,
    pub(super) kick: Notify,
}

fn decode(bytes: &[u8]) -> Option<AcctJob> {
    bincode::serde::decode_from_slice(bytes, bincode::config::standard())
        .map(|(v, _)| v)
        .ok()
}

impl Accounting {
    pub(super) fn new(cfg: AcctConfig, cluster: String) -> Accounting {
        Accounting {
            cfg,
            cluster,
            db: tokio::sync::Mutex::new(None),
            memory: Mutex::new(VecDeque::new()),
            next_key: Mutex::new(0),
            kick: Notify::new(),
        }
    }

    /// Records of a controller without a store: kept in memory until
    /// written (lost with the process, like everything else it holds).
    pub(super) fn keep_in_memory(&self, records: Vec<Vec<u8>>) {
        if records.is_empty() {
            return;
        }
        let mut key = self.next_key.lock();
        let mut q = self.memory.lock();
        for r in records {
            *key += 1;
            q.push_back((*key, r));
        }
        drop(q);
        self.kick.notify_one();
    }

    /// The database, connected (and migrated) on first use.
    async fn db(&self) -> Result<AcctDb, String> {
        let mut guard = self.db.lock().await;
        if let Some(db) = guard.as_ref() {
            return Ok(db.clone());
        }
        let db = AcctDb::connect(&self.cfg.url, &self.cluster, DB_PATIENCE)
            .await
            .map_err(|e| chain(&e))?;
        tracing::info!(backend = ?db.backend(), "accounting database connected");
        *guard = Some(db.clone());
        Ok(db)
    }

    /// Forgets the connection after an error, so the next use reconnects.
    async fn reset(&self) {
        if let Some(db) = self.db.lock().await.take() {
            db.close().await;
        }
    }
}

impl Server {
    /// Records waiting for the database, oldest first, with their keys.
    fn acct_waiting(&self, acct: &Accounting, limit: usize) -> Result<Vec<(u64, Vec<u8>)>, String> {
        match &self.store {
            Some(s) => s.acct_pending(limit).map_err(|e| chain(&e)),
            None => Ok(acct.memory.lock().iter().take(limit).cloned().collect()),
        }
    }

    fn acct_forget(&self, acct: &Accounting, keys: &[u64]) -> Result<(), String> {
        match &self.store {
            Some(s) => s.acct_done(keys).map_err(|e| chain(&e)),
            None => {
                let mut q = acct.memory.lock();
                q.retain(|(k, _)| !keys.contains(k));
                Ok(())
            }
        }
    }

    /// Moves records into the accounting database for as long as the
    /// controller runs: woken by each commit that made some (then it
    /// gathers for [`GATHER`]), and every few seconds; on a failure it
    /// retries with a growing pause.
    pub(super) async fn acct_writer(self: std::sync::Arc<Self>) {
        let Some(acct) = self.acct.clone() else {
            return;
        };
        let mut pause = Duration::from_millis(200);
        loop {
            let _ = tokio::time::timeout(Duration::from_secs(5), acct.kick.notified()).await;
            tokio::time::sleep(GATHER).await;
            loop {
                match self.acct_write_some(&acct).await {
                    Ok(0) => break,
                    Ok(_) => pause = Duration::from_millis(200),
                    Err(e) => {
                        warn_limited!(LOGS, "accounting", error = %e, "accounting records wait: the database cannot take them");
                        acct.reset().await;
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_secs(10));
                    }
                }
            }
        }
    }

    /// Writes one batch; how many records it held.
    async fn acct_write_some(&self, acct: &Accounting) -> Result<usize, String> {
        let waiting = self.acct_waiting(acct, WRITE_BATCH)?;
        if waiting.is_empty() {
            return Ok(0);
        }
        let keys: Vec<u64> = waiting.iter().map(|(k, _)| *k).collect();
        // A record this controller cannot read (none should exist) is
        // dropped rather than blocking the rest.
        let records: Vec<AcctJob> = waiting.iter().filter_map(|(_, b)| decode(b)).collect();
        let db = acct.db().await?;
        tokio::time::timeout(DB_PATIENCE * 4, db.write(&records))
            .await
            .map_err(|_| "writing took too long".to_string())?
            .map_err(|e| chain(&e))?;
        self.acct_forget(acct, &keys)?;
        Ok(keys.len())
    }

    /// `sacct`: a page of the database's records, merged with those still
    /// on their way to it and with the jobs the controller holds.
    pub(super) async fn accounting(&self, who: Ident, mut q: AcctQuery) -> Response {
        let Some(acct) = self.acct.clone() else {
            return Response::Error(
                "Slurm accounting storage is disabled (no state_dir or [accounting] in corral.toml)"
                    .into(),
            );
        };
        q.ids.sort_unstable();
        q.ids.dedup();
        q.users.sort_unstable();
        q.users.dedup();
        q.states.dedup();
        if q.ids.len() + q.users.len() + q.states.len() > ACCT_MAX_ENTRIES {
            return Response::Error(format!(
                "Too many jobs, users and states in one query (at most {ACCT_MAX_ENTRIES})"
            ));
        }
        let Some(users) = self.ctl.lock().acct_users(&q, who) else {
            return Response::Accounting {
                jobs: Vec::new(),
                next: None,
            };
        };
        let from_db = async {
            let db = acct.db().await?;
            tokio::time::timeout(DB_PATIENCE, db.query(&q, &users))
                .await
                .map_err(|_| "the database did not answer in time".to_string())?
                .map_err(|e| chain(&e))
        };
        let (mut jobs, db_next) = match from_db.await {
            Ok(page) => page,
            Err(e) => {
                acct.reset().await;
                return Response::Error(format!("Problem talking to the database: {e}"));
            }
        };
        let waiting = match self.acct_waiting(&acct, usize::MAX) {
            Ok(w) => w,
            Err(e) => return Response::Error(e),
        };
        jobs.extend(
            waiting
                .iter()
                .filter_map(|(_, b)| decode(b))
                .filter(|j| matches(&q, &users, j)),
        );
        jobs.extend(self.ctl.lock().acct_live(&q, &users, now()));
        let mut jobs = last_runs(jobs, q.duplicates);
        // The page covers what the database's page covered, and no more
        // than a page.
        if let Some(bound) = db_next {
            jobs.retain(|j| j.id <= bound);
        }
        if q.allocations {
            for j in &mut jobs {
                j.steps.clear();
            }
        }
        match crate::ctld::acct::page(jobs, db_next) {
            Ok((jobs, next)) => Response::Accounting { jobs, next },
            Err(e) => Response::Error(e),
        }
    }
}
