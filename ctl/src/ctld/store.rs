//! The controller's durable state: an embedded redb database in the
//! configured state directory, with a write-ahead journal beside it
//! ([`super::journal`]). Every change a call on the controller made
//! ([`Changes`]: job records, operators' node states, the next job id) is
//! appended to the journal and flushed before what it acknowledges goes
//! out; changes that arrive while a commit is running share the next one
//! (group commit, in the server). The database then takes the same
//! changes in one transaction without a flush of its own, and is flushed
//! at checkpoints (every [`CHECKPOINT_BYTES`] of journal); at start, and
//! when it is opened again after a failed write, it takes what the
//! journal holds past its last checkpoint.
//!
//! Why: a held submission's commit, flushed by redb (ten or so pages and
//! an `fdatasync`), took 0.76 ms at the median inside ctld; appended to
//! the journal it is on disk in 0.39 ms, and redb's write (0.18 ms) comes
//! after the answer.
//!
//! The layout holds no host-local path: a standby controller on another
//! host could take over from the same directory on shared storage.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use super::journal::Journal;

/// The journal's size when made (records fit without growing the file,
/// so a flush writes no metadata). One larger record grows it.
const JOURNAL_BYTES: u64 = 4 << 20;
/// Journal written since the last checkpoint that makes the next commit
/// one: 256 one-page records, or fewer larger ones.
pub const CHECKPOINT_BYTES: u64 = 1 << 20;

/// Job id → the job's record (bincode).
const JOBS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("jobs");
/// Node name → an operator's drain or down (bincode).
const NODES: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("nodes");
/// `next_job`, `layout`, `acct_seq`, `journal_seq` (the last journal
/// record the database holds).
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
/// Job id → the job's script and the key of its environment in `envs`,
/// kept here rather than in the controller's memory until the job ends.
const PAYLOADS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("payloads");
/// Environments (encoded), each stored once however many jobs carry the
/// same one byte for byte: a user's loop of submissions from one shell
/// writes its environment once, not once per job. The key is a hash of
/// the bytes, moved on past any entry holding other bytes; only the key
/// a payload names is ever used to read one back.
const ENVS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("envs");
/// Environment key → how many stored payloads name it; the environment
/// goes when the last does.
const ENV_REFS: TableDefinition<'_, u64, u64> = TableDefinition::new("env_refs");
/// Accounting records not yet in the accounting database, in the order
/// they were made (bincode).
const ACCT: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("acct");

/// The layout this code writes; a store of another is refused. 2: job
/// records carry their steps; accounting records wait in `acct`. 3: a
/// run's allocation names the agent it started on, and its open steps
/// what builds their launches again. 4: what only a run has is one
/// optional part of the record. 5: environments are stored once each
/// (`envs`), payloads name theirs. 6: jobs carry a comment and mail
/// options. 7: `--signal`, and whether a run was sent it. 8: where a job
/// was submitted from. 9: any-of dependencies, `--kill-on-invalid-dep`.
/// 10: `--open-mode`. 11: `--constraint`. 12: open steps hold their own
/// GPUs. 13: memory per CPU, per GPU, or the whole node. 14: the account.
/// 15: job arrays (an array's record, its tasks' records). 16: a GPU
/// model asked for. 17: open steps name their nodes, and overlap. 18:
/// srun's files for its tasks. 19: accounting records name a task's
/// array. 22: the journal beside the database (`journal_seq`); a store
/// of 21 is taken as it is and marked 22, so that an older controller,
/// which would not read the journal, refuses it. 23: `--wckey`.
const LAYOUT: u64 = 23;

/// The bulky part of a job: its batch script and environment. Read when
/// the job (or a step of it) is launched.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Payload {
    pub env: Vec<(String, String)>,
    pub script: Option<Vec<u8>>,
}

/// A new job's payload as the controller hands it over: its environment
/// encoded (the store keeps each distinct one once) and its script.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NewPayload {
    pub env: Vec<u8>,
    pub script: Option<Vec<u8>>,
}

impl NewPayload {
    pub fn new(env: &[(String, String)], script: Option<Vec<u8>>) -> NewPayload {
        NewPayload {
            env: bincode::serde::encode_to_vec(env, bincode::config::standard())
                .unwrap_or_default(),
            script,
        }
    }
}

/// A payload as stored: the script, and the key of the environment.
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredPayload {
    env: u64,
    script: Option<Vec<u8>>,
}

/// What one call on the controller changed.
#[derive(Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Changes {
    /// Records to write, or `None` to delete.
    pub jobs: Vec<(u64, Option<Vec<u8>>)>,
    pub nodes: Vec<(String, Option<Vec<u8>>)>,
    /// Accounting records of runs that ended (encoded).
    pub acct: Vec<Vec<u8>>,
    /// Jobs' payloads to write, or `None` to delete.
    pub payloads: Vec<(u64, Option<NewPayload>)>,
    pub next_job: u64,
}

impl Changes {
    /// One batch with the effect of writing `batches` in order: the last
    /// change to each record and payload, every accounting record. A
    /// batch that waits for space (a full disk) stays as large as the
    /// state it changes: a submission refused meanwhile leaves only the
    /// deletion of a record that was never written, not its script.
    pub fn coalesce(batches: impl IntoIterator<Item = Changes>) -> Changes {
        let mut jobs = std::collections::BTreeMap::new();
        let mut nodes = std::collections::BTreeMap::new();
        let mut payloads = std::collections::BTreeMap::new();
        let mut out = Changes::default();
        for c in batches {
            jobs.extend(c.jobs);
            nodes.extend(c.nodes);
            payloads.extend(c.payloads);
            out.acct.extend(c.acct);
            out.next_job = out.next_job.max(c.next_job);
        }
        out.jobs = jobs.into_iter().collect();
        out.nodes = nodes.into_iter().collect();
        out.payloads = payloads.into_iter().collect();
        out
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
            && self.nodes.is_empty()
            && self.acct.is_empty()
            && self.payloads.is_empty()
    }
}

/// What a store holds, read at start.
#[derive(Debug, Default)]
pub struct Loaded {
    pub jobs: Vec<Vec<u8>>,
    pub nodes: Vec<(String, Vec<u8>)>,
    pub next_job: u64,
}

/// Why the state could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state directory {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("state directory {0} is writable by others: it must be the controller's alone")]
    Unsafe(PathBuf),
    #[error("state {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: redb::DatabaseError,
    },
    #[error("state {path} has layout {found}; this corral-ctld writes {LAYOUT}")]
    Layout { path: PathBuf, found: u64 },
    #[error("state: {0}")]
    Db(String),
}

fn db<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Db(e.to_string())
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, StoreError> {
    bincode::serde::decode_from_slice(bytes, bincode::config::standard())
        .map(|(v, _)| v)
        .map_err(db)
}

/// Where an environment's entry is looked for first. Nothing relies on
/// this hash staying the same across builds: a payload names its key.
fn env_hash(env: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    env.hash(&mut h);
    h.finish()
}

/// The stored environments within one write: the ones this write already
/// looked up, and how each one's count of payloads changes, applied once
/// at the end.
struct Envs<'t> {
    table: redb::Table<'t, u64, &'static [u8]>,
    refs: redb::Table<'t, u64, u64>,
    known: HashMap<Vec<u8>, u64>,
    delta: HashMap<u64, i64>,
}

impl Envs<'_> {
    /// The key of these bytes, stored now if no entry holds them; one
    /// more payload names it.
    fn take(&mut self, env: &[u8]) -> Result<u64, StoreError> {
        let key = match self.known.get(env) {
            Some(k) => *k,
            None => {
                let mut key = env_hash(env);
                loop {
                    let found = self.table.get(key).map_err(db)?.map(|v| v.value() == env);
                    match found {
                        Some(true) => break,
                        // Another environment with the same hash: the
                        // next key (an attacker gains nothing but a
                        // longer walk).
                        Some(false) => key = key.wrapping_add(1),
                        None => {
                            self.table.insert(key, env).map_err(db)?;
                            break;
                        }
                    }
                }
                self.known.insert(env.to_vec(), key);
                key
            }
        };
        *self.delta.entry(key).or_default() += 1;
        Ok(key)
    }

    /// A stored payload no longer names its environment.
    fn release(&mut self, stored: &[u8]) -> Result<(), StoreError> {
        let p: StoredPayload = decode(stored)?;
        *self.delta.entry(p.env).or_default() -= 1;
        Ok(())
    }

    /// Writes the counts; an environment no payload names goes.
    fn settle(&mut self) -> Result<(), StoreError> {
        // A zero change still counts: an environment first stored by this
        // write for a payload it also deleted is named by none.
        for (key, d) in std::mem::take(&mut self.delta) {
            let now = self.refs.get(key).map_err(db)?.map_or(0, |v| v.value());
            let next = now.saturating_add_signed(d);
            if next == 0 {
                self.refs.remove(key).map_err(db)?;
                self.table.remove(key).map_err(db)?;
            } else {
                self.refs.insert(key, next).map_err(db)?;
            }
        }
        Ok(())
    }
}

/// The controller's state store.
#[derive(Debug)]
pub struct Store {
    /// `None` after a failed write until it opens again: redb refuses
    /// every use of a handle that saw an I/O error (a full disk).
    db: parking_lot::RwLock<Option<Database>>,
    path: PathBuf,
    journal: parking_lot::Mutex<Journal>,
}

fn open_db(path: &Path) -> Result<Database, StoreError> {
    // A small cache: the controller reads the store only at start, and
    // pages kept for nothing count in its memory. 16 MiB made 1.6 KiB of
    // each of 10,000 pending jobs; 2 MiB still filled, 180 B of each
    // (resident size on `corral up`: 1314 B a held job with 2 MiB, 1135 B
    // with 256 KiB, 1100 B with 64 KiB, submissions as fast; again in
    // December: 817-818 B with 256 KiB, 799-800 B with 64 KiB). redb
    // keeps at most half of it for a commit's pages and writes the rest
    // out early; the commit's fsync is the same.
    Database::builder()
        .set_cache_size(64 << 10)
        .create(path)
        .map_err(|source| StoreError::Open {
            path: path.to_path_buf(),
            source,
        })
}

impl Store {
    /// Opens (or creates) the store in `dir`, which is made private to
    /// the controller; a directory others can write is refused.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        let io = |source| StoreError::Dir {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io)?;
        let meta = std::fs::metadata(dir).map_err(io)?;
        if meta.mode() & 0o022 != 0 {
            return Err(StoreError::Unsafe(dir.to_path_buf()));
        }
        let path = dir.join("ctld.redb");
        let journal_path = dir.join("ctld.journal");
        let journal =
            Journal::open(&journal_path, JOURNAL_BYTES, 0).map_err(|source| StoreError::Dir {
                path: journal_path,
                source,
            })?;
        let store = Store {
            db: parking_lot::RwLock::new(Some(open_db(&path)?)),
            path: path.clone(),
            journal: parking_lot::Mutex::new(journal),
        };
        let found = {
            let tx = store.with(|d| d.begin_read().map_err(db))?;
            match tx.open_table(META) {
                Ok(t) => t.get("layout").map_err(db)?.map(|v| v.value()),
                Err(redb::TableError::TableDoesNotExist(_)) => None,
                Err(e) => return Err(db(e)),
            }
        };
        match found {
            Some(LAYOUT) => {}
            Some(21) => {
                let tx = store.with(|d| d.begin_write().map_err(db))?;
                tx.open_table(META)
                    .map_err(db)?
                    .insert("layout", LAYOUT)
                    .map_err(db)?;
                tx.commit().map_err(db)?;
            }
            Some(found) => return Err(StoreError::Layout { path, found }),
            None => {
                let tx = store.with(|d| d.begin_write().map_err(db))?;
                {
                    tx.open_table(META)
                        .map_err(db)?
                        .insert("layout", LAYOUT)
                        .map_err(db)?;
                    tx.open_table(JOBS).map_err(db)?;
                    tx.open_table(NODES).map_err(db)?;
                    tx.open_table(ACCT).map_err(db)?;
                    tx.open_table(PAYLOADS).map_err(db)?;
                    tx.open_table(ENVS).map_err(db)?;
                    tx.open_table(ENV_REFS).map_err(db)?;
                }
                tx.commit().map_err(db)?;
                store
                    .journal
                    .lock()
                    .forget()
                    .map_err(|e| StoreError::Db(format!("clearing the journal: {e}")))?;
            }
        }
        store.with(|d| store.catch_up(d))?;
        Ok(store)
    }

    /// Takes into the open database what the journal holds past its last
    /// checkpoint, in one flushed transaction: the next record goes at
    /// the journal's start.
    fn catch_up(&self, d: &Database) -> Result<(), StoreError> {
        let mut journal = self.journal.lock();
        let stored = {
            let tx = d.begin_read().map_err(db)?;
            match tx.open_table(META) {
                Ok(t) => t.get("journal_seq").map_err(db)?.map_or(0, |v| v.value()),
                Err(redb::TableError::TableDoesNotExist(_)) => 0,
                Err(e) => return Err(db(e)),
            }
        };
        let records = journal
            .replay(stored)
            .map_err(|e| StoreError::Db(format!("reading the journal: {e}")))?;
        let mut last = stored;
        if !records.is_empty() {
            let mut batch = Vec::new();
            for (seq, body) in &records {
                let part: Vec<Changes> = decode(body)?;
                batch.extend(part);
                last = *seq;
            }
            tracing::info!(records = records.len(), "state: journal replayed");
            write(d, &batch, last, redb::Durability::Immediate)?;
        }
        journal.checkpointed(last);
        Ok(())
    }

    /// Uses the open database, opening it again first if a failed write
    /// closed it.
    fn with<R>(&self, f: impl FnOnce(&Database) -> Result<R, StoreError>) -> Result<R, StoreError> {
        {
            let g = self.db.read();
            if let Some(d) = g.as_ref() {
                return f(d);
            }
        }
        let mut g = self.db.write();
        if g.is_none() {
            let d = open_db(&self.path)?;
            // What was written since its last checkpoint is in the journal.
            self.catch_up(&d)?;
            *g = Some(d);
        }
        match g.as_ref() {
            Some(d) => f(d),
            None => Err(StoreError::Db("the state store is closed".into())),
        }
    }

    /// Bytes free to the controller on the state's filesystem, and its
    /// size.
    pub fn room(&self) -> std::io::Result<(u64, u64)> {
        let dir = self.path.parent().unwrap_or(Path::new("/"));
        let st = nix::sys::statvfs::statvfs(dir)?;
        let unit = st.fragment_size() as u64;
        Ok((
            (st.blocks_available() as u64).saturating_mul(unit),
            (st.blocks() as u64).saturating_mul(unit),
        ))
    }

    /// After a failed write: the handle is dropped, and the next use
    /// opens the file again (redb recovers its last commit).
    fn close_after_error(&self) {
        *self.db.write() = None;
    }

    /// Everything stored.
    pub fn load(&self) -> Result<Loaded, StoreError> {
        let tx = self.with(|d| d.begin_read().map_err(db))?;
        let mut out = Loaded::default();
        let jobs = tx.open_table(JOBS).map_err(db)?;
        for entry in jobs.iter().map_err(db)? {
            let (_, v) = entry.map_err(db)?;
            out.jobs.push(v.value().to_vec());
        }
        let nodes = tx.open_table(NODES).map_err(db)?;
        for entry in nodes.iter().map_err(db)? {
            let (k, v) = entry.map_err(db)?;
            out.nodes.push((k.value().to_string(), v.value().to_vec()));
        }
        let meta = tx.open_table(META).map_err(db)?;
        out.next_job = meta.get("next_job").map_err(db)?.map_or(1, |v| v.value());
        Ok(out)
    }

    /// Writes a batch of changes, durable when this returns. Later
    /// changes to a record win. After a failure (a full disk) the next
    /// call opens the store again.
    pub fn commit(&self, batch: &[Changes]) -> Result<(), StoreError> {
        self.commit_then(batch, || {})
    }

    /// [`Store::commit`], calling `durable` as soon as the batch is on
    /// disk (in the journal), before the database takes it. An error
    /// means the batch is not stored and `durable` was not called; once
    /// it was, a failure of the database is mended from the journal when
    /// it is next used (opened again, it takes what it missed), and the
    /// next batch is refused until it is.
    pub fn commit_then(&self, batch: &[Changes], durable: impl FnOnce()) -> Result<(), StoreError> {
        // A database that missed a write must take it (opened again, from
        // the journal) before more is accepted: while it cannot (a full
        // disk), a launch could not read its job's script there.
        self.with(|_| Ok(()))?;
        let body = bincode::serde::encode_to_vec(batch, bincode::config::standard()).map_err(db)?;
        let (seq, checkpoint) = {
            let mut journal = self.journal.lock();
            let seq = journal
                .append(&body)
                .map_err(|e| StoreError::Db(format!("writing the journal: {e}")))?;
            (seq, journal.used() >= CHECKPOINT_BYTES)
        };
        durable();
        let durability = if checkpoint {
            redb::Durability::Immediate
        } else {
            redb::Durability::None
        };
        match self.with(|d| write(d, batch, seq, durability)) {
            Ok(true) if checkpoint => self.journal.lock().checkpointed(seq),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "state: the database missed a journalled write; it takes it when opened again");
                self.close_after_error();
            }
        }
        Ok(())
    }

    /// A job's script and environment, if stored.
    pub fn payload(&self, job: u64) -> Result<Option<Payload>, StoreError> {
        let tx = self.with(|d| d.begin_read().map_err(db))?;
        let t = tx.open_table(PAYLOADS).map_err(db)?;
        let Some(v) = t.get(job).map_err(db)? else {
            return Ok(None);
        };
        let stored: StoredPayload = decode(v.value())?;
        let envs = tx.open_table(ENVS).map_err(db)?;
        let env = match envs.get(stored.env).map_err(db)? {
            Some(e) => decode(e.value())?,
            None => {
                return Err(StoreError::Db(format!(
                    "job {job}'s environment is missing"
                )))
            }
        };
        Ok(Some(Payload {
            env,
            script: stored.script,
        }))
    }

    /// How many distinct environments are stored (for tests and benches).
    pub fn environments(&self) -> Result<u64, StoreError> {
        let tx = self.with(|d| d.begin_read().map_err(db))?;
        let t = tx.open_table(ENVS).map_err(db)?;
        t.len().map_err(db)
    }

    /// Up to `limit` accounting records waiting for the database, oldest
    /// first, with their keys.
    pub fn acct_pending(&self, limit: usize) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
        let tx = self.with(|d| d.begin_read().map_err(db))?;
        let t = tx.open_table(ACCT).map_err(db)?;
        let mut out = Vec::new();
        for entry in t.iter().map_err(db)?.take(limit) {
            let (k, v) = entry.map_err(db)?;
            out.push((k.value(), v.value().to_vec()));
        }
        Ok(out)
    }

    /// Forgets accounting records the database now holds.
    pub fn acct_done(&self, keys: &[u64]) -> Result<(), StoreError> {
        let r = self.try_acct_done(keys);
        if r.is_err() {
            self.close_after_error();
        }
        r
    }

    fn try_acct_done(&self, keys: &[u64]) -> Result<(), StoreError> {
        let mut tx = self.with(|d| d.begin_write().map_err(db))?;
        // No fsync of its own: the next checkpoint makes it durable, and
        // a crash before that only writes the same records again, which
        // the database takes as a repeat.
        tx.set_durability(redb::Durability::None).map_err(db)?;
        {
            let mut t = tx.open_table(ACCT).map_err(db)?;
            for k in keys {
                t.remove(k).map_err(db)?;
            }
        }
        tx.commit().map_err(db)
    }
}

/// Writes `batch`, journal record `seq`, in one transaction of the
/// given durability, unless the database already holds that record (a
/// replay after it was opened again took it). True when it wrote.
fn write(
    d: &Database,
    batch: &[Changes],
    seq: u64,
    durability: redb::Durability,
) -> Result<bool, StoreError> {
    let mut tx = d.begin_write().map_err(db)?;
    tx.set_durability(durability).map_err(db)?;
    {
        let mut jobs = tx.open_table(JOBS).map_err(db)?;
        let mut nodes = tx.open_table(NODES).map_err(db)?;
        let mut meta = tx.open_table(META).map_err(db)?;
        if meta
            .get("journal_seq")
            .map_err(db)?
            .map_or(0, |v| v.value())
            >= seq
        {
            return Ok(false);
        }
        let mut acct = tx.open_table(ACCT).map_err(db)?;
        let mut payloads = tx.open_table(PAYLOADS).map_err(db)?;
        let mut envs = Envs {
            table: tx.open_table(ENVS).map_err(db)?,
            refs: tx.open_table(ENV_REFS).map_err(db)?,
            known: HashMap::new(),
            delta: HashMap::new(),
        };
        let mut acct_seq = meta.get("acct_seq").map_err(db)?.map_or(0, |v| v.value());
        let acct_before = acct_seq;
        let mut next = 0;
        for c in batch {
            for (id, rec) in &c.jobs {
                match rec {
                    Some(bytes) => {
                        jobs.insert(id, bytes.as_slice()).map_err(db)?;
                    }
                    None => {
                        jobs.remove(id).map_err(db)?;
                    }
                }
            }
            for (name, rec) in &c.nodes {
                match rec {
                    Some(bytes) => {
                        nodes.insert(name.as_str(), bytes.as_slice()).map_err(db)?;
                    }
                    None => {
                        nodes.remove(name.as_str()).map_err(db)?;
                    }
                }
            }
            for (id, p) in &c.payloads {
                let old = match p {
                    Some(p) => {
                        let env = envs.take(&p.env)?;
                        let stored = StoredPayload {
                            env,
                            script: p.script.clone(),
                        };
                        let bytes =
                            bincode::serde::encode_to_vec(&stored, bincode::config::standard())
                                .map_err(db)?;
                        let old = payloads.insert(id, bytes.as_slice()).map_err(db)?;
                        old.map(|v| v.value().to_vec())
                    }
                    None => {
                        let old = payloads.remove(id).map_err(db)?;
                        old.map(|v| v.value().to_vec())
                    }
                };
                if let Some(old) = old {
                    envs.release(&old)?;
                }
            }
            for rec in &c.acct {
                acct_seq += 1;
                acct.insert(acct_seq, rec.as_slice()).map_err(db)?;
            }
            next = next.max(c.next_job);
        }
        envs.settle()?;
        if next > 0 {
            meta.insert("next_job", next).map_err(db)?;
        }
        if acct_seq != acct_before {
            meta.insert("acct_seq", acct_seq).map_err(db)?;
        }
        meta.insert("journal_seq", seq).map_err(db)?;
    }
    tx.commit().map_err(db)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Batches waiting for space become one with the same effect: a
    /// submission withdrawn meanwhile leaves a deletion, not its script.
    #[test]
    fn coalesced_batches_store_what_the_batches_store_in_order() {
        let script = |b: &[u8]| {
            Some(NewPayload::new(
                &[("A".into(), "1".into())],
                Some(b.to_vec()),
            ))
        };
        let batches = || {
            vec![
                Changes {
                    jobs: vec![(1, Some(b"one".to_vec())), (2, Some(b"two".to_vec()))],
                    nodes: vec![("n1".into(), Some(b"drain".to_vec()))],
                    acct: vec![b"run 1".to_vec()],
                    payloads: vec![(1, script(&[7; 5000])), (2, script(b"x"))],
                    next_job: 3,
                },
                Changes {
                    jobs: vec![(1, None), (3, Some(b"three".to_vec()))],
                    nodes: vec![("n1".into(), None)],
                    acct: vec![b"run 2".to_vec()],
                    payloads: vec![(1, None), (3, script(b"y"))],
                    next_job: 4,
                },
            ]
        };
        let one = Changes::coalesce(batches());
        assert_eq!(one.payloads.len(), 3);
        assert!(
            one.payloads.iter().all(|(id, p)| *id != 1 || p.is_none()),
            "the withdrawn job's script is not kept"
        );
        assert_eq!(one.acct, [b"run 1".to_vec(), b"run 2".to_vec()]);
        assert_eq!(one.next_job, 4);
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let (sa, sb) = (Store::open(&a).unwrap(), Store::open(&b).unwrap());
        sa.commit(&batches()).unwrap();
        sb.commit(&[one]).unwrap();
        let (la, lb) = (sa.load().unwrap(), sb.load().unwrap());
        assert_eq!(
            (la.jobs, la.nodes, la.next_job),
            (lb.jobs, lb.nodes, lb.next_job)
        );
        for id in 1..=3 {
            let (pa, pb) = (sa.payload(id).unwrap(), sb.payload(id).unwrap());
            assert_eq!(pa.map(|p| (p.env, p.script)), pb.map(|p| (p.env, p.script)));
        }
        assert_eq!(sa.environments().unwrap(), sb.environments().unwrap());
        assert_eq!(sa.acct_pending(10).unwrap(), sb.acct_pending(10).unwrap());
    }

    #[test]
    fn changes_survive_a_reopen_and_deletes_delete() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        {
            let s = Store::open(&state).unwrap();
            s.commit(&[
                Changes {
                    jobs: vec![(1, Some(b"one".to_vec())), (2, Some(b"two".to_vec()))],
                    nodes: vec![("n1".into(), Some(b"drain".to_vec()))],
                    acct: vec![b"run 1".to_vec()],
                    payloads: vec![(2, Some(NewPayload::new(&[], Some(b"x".to_vec()))))],
                    next_job: 3,
                },
                Changes {
                    jobs: vec![(1, None), (2, Some(b"two again".to_vec()))],
                    nodes: vec![],
                    acct: vec![b"run 2".to_vec(), b"run 3".to_vec()],
                    payloads: vec![],
                    next_job: 3,
                },
            ])
            .unwrap();
        }
        let s = Store::open(&state).unwrap();
        let l = s.load().unwrap();
        assert_eq!(l.jobs, [b"two again".to_vec()]);
        assert_eq!(l.nodes, [("n1".to_string(), b"drain".to_vec())]);
        assert_eq!(l.next_job, 3);
        // Accounting records wait in order until the database has them;
        // keys keep growing after some are done.
        let waiting = s.acct_pending(10).unwrap();
        let keys: Vec<u64> = waiting.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, [1, 2, 3]);
        assert_eq!(waiting[2].1, b"run 3");
        s.acct_done(&keys[..2]).unwrap();
        s.commit(&[Changes {
            acct: vec![b"run 4".to_vec()],
            ..Changes::default()
        }])
        .unwrap();
        let keys: Vec<u64> = s
            .acct_pending(10)
            .unwrap()
            .iter()
            .map(|(k, _)| *k)
            .collect();
        assert_eq!(keys, [3, 4]);
        // A new store starts at job 1.
        let fresh = Store::open(&dir.path().join("fresh")).unwrap();
        assert_eq!(fresh.load().unwrap().next_job, 1);
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn put(s: &Store, job: u64, e: &[(String, String)]) {
        s.commit(&[Changes {
            payloads: vec![(
                job,
                Some(NewPayload::new(e, Some(format!("job {job}").into_bytes()))),
            )],
            ..Changes::default()
        }])
        .unwrap();
    }

    fn drop_payload(s: &Store, job: u64) {
        s.commit(&[Changes {
            payloads: vec![(job, None)],
            ..Changes::default()
        }])
        .unwrap();
    }

    #[test]
    fn an_environment_is_stored_once_and_goes_with_its_last_job() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let alice = env(&[("HOME", "/home/alice"), ("PATH", "/usr/bin")]);
        let bob = env(&[("HOME", "/home/bob")]);
        // Three jobs of one batch share alice's; bob's is another.
        s.commit(&[Changes {
            payloads: vec![
                (1, Some(NewPayload::new(&alice, Some(b"one".to_vec())))),
                (2, Some(NewPayload::new(&alice, None))),
                (3, Some(NewPayload::new(&bob, Some(b"three".to_vec())))),
            ],
            ..Changes::default()
        }])
        .unwrap();
        put(&s, 4, &alice);
        assert_eq!(s.environments().unwrap(), 2);
        let p = s.payload(2).unwrap().unwrap();
        assert_eq!((p.env, p.script), (alice.clone(), None));
        let p = s.payload(3).unwrap().unwrap();
        assert_eq!(
            (p.env, p.script.as_deref()),
            (bob.clone(), Some(&b"three"[..]))
        );
        drop_payload(&s, 3);
        assert_eq!(s.environments().unwrap(), 1, "bob's went with his job");
        assert!(s.payload(3).unwrap().is_none());
        for job in [1, 2] {
            drop_payload(&s, job);
        }
        assert_eq!(
            s.payload(4).unwrap().unwrap().env,
            alice,
            "one job still names it"
        );
        // Deleting what is not there changes nothing.
        drop_payload(&s, 99);
        drop_payload(&s, 4);
        assert_eq!(s.environments().unwrap(), 0);
        // A job written and deleted in one batch (a withdrawn
        // submission) leaves nothing behind.
        s.commit(&[
            Changes {
                payloads: vec![(5, Some(NewPayload::new(&bob, None)))],
                ..Changes::default()
            },
            Changes {
                payloads: vec![(5, None)],
                ..Changes::default()
            },
        ])
        .unwrap();
        assert_eq!(s.environments().unwrap(), 0);
    }

    #[test]
    fn another_environment_at_the_same_hash_is_neither_read_nor_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let alice = env(&[("SECRET", "alice's")]);
        let mallory = NewPayload::new(&env(&[("X", "crafted")]), None).env;
        // Mallory's bytes already sit where alice's hash points, as a
        // collision would put them.
        let at = env_hash(&NewPayload::new(&alice, None).env);
        s.with(|d| {
            let tx = d.begin_write().map_err(db)?;
            {
                tx.open_table(ENVS)
                    .map_err(db)?
                    .insert(at, mallory.as_slice())
                    .map_err(db)?;
                tx.open_table(ENV_REFS)
                    .map_err(db)?
                    .insert(at, 1)
                    .map_err(db)?;
            }
            tx.commit().map_err(db)
        })
        .unwrap();
        put(&s, 1, &alice);
        assert_eq!(s.payload(1).unwrap().unwrap().env, alice);
        drop_payload(&s, 1);
        let tx = s.with(|d| d.begin_read().map_err(db)).unwrap();
        let t = tx.open_table(ENVS).unwrap();
        assert_eq!(t.get(at).unwrap().unwrap().value(), mallory.as_slice());
        assert_eq!(t.len().unwrap(), 1, "alice's went, mallory's stayed");
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(Store::open(&open), Err(StoreError::Unsafe(_))));
    }

    /// The state directory as a crash would leave it while `s` is open:
    /// the files as the kernel has them (the database's unflushed
    /// commits are in its own buffer, not there), copied to `to`.
    fn crash_image(s: &Store, from: &Path, to: &Path) {
        let _held = s.journal.lock();
        std::fs::create_dir_all(to).unwrap();
        for name in ["ctld.redb", "ctld.journal"] {
            std::fs::copy(from.join(name), to.join(name)).unwrap();
        }
    }

    fn submission(id: u64) -> Changes {
        Changes {
            jobs: vec![(id, Some(format!("job {id}").into_bytes()))],
            acct: vec![format!("run of {id}").into_bytes()],
            payloads: vec![(
                id,
                Some(NewPayload::new(
                    &[("HOME".into(), "/home/a".into())],
                    Some(b"#!/bin/sh".to_vec()),
                )),
            )],
            next_job: id + 1,
            ..Changes::default()
        }
    }

    #[test]
    fn a_commit_the_database_never_flushed_comes_back_from_the_journal_once() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let s = Store::open(&state).unwrap();
        let mut heard = false;
        s.commit_then(&[submission(1)], || heard = true).unwrap();
        assert!(heard, "told once it is on disk");
        // Readable at once, though not flushed by the database.
        assert!(s.payload(1).unwrap().is_some());
        let crashed = dir.path().join("crashed");
        crash_image(&s, &state, &crashed);
        // The database alone lost it: the image is a real crash's.
        let bare = dir.path().join("bare");
        std::fs::create_dir(&bare).unwrap();
        std::fs::copy(crashed.join("ctld.redb"), bare.join("ctld.redb")).unwrap();
        assert!(Store::open(&bare).unwrap().load().unwrap().jobs.is_empty());
        // With its journal it has the job, its payload and one accounting
        // record, and again after a second restart (replayed once).
        for _ in 0..2 {
            let r = Store::open(&crashed).unwrap();
            let l = r.load().unwrap();
            assert_eq!(l.jobs, [b"job 1".to_vec()]);
            assert_eq!(l.next_job, 2);
            assert_eq!(r.payload(1).unwrap().unwrap().script.unwrap(), b"#!/bin/sh");
            assert_eq!(r.acct_pending(10).unwrap().len(), 1);
            assert_eq!(r.environments().unwrap(), 1);
        }
        // Later commits on the restarted store continue the journal.
        let r = Store::open(&crashed).unwrap();
        r.commit(&[submission(2)]).unwrap();
        let again = dir.path().join("again");
        crash_image(&r, &crashed, &again);
        let l = Store::open(&again).unwrap().load().unwrap();
        assert_eq!(l.jobs.len(), 2);
        assert_eq!(l.next_job, 3);
    }

    #[test]
    fn a_checkpoint_flushes_the_database_and_starts_the_journal_over() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let s = Store::open(&state).unwrap();
        // Each one-page record: a checkpoint after CHECKPOINT_BYTES of them.
        let per = CHECKPOINT_BYTES / super::super::journal::PAGE;
        for id in 1..=per + 3 {
            s.commit(&[submission(id)]).unwrap();
        }
        assert_eq!(s.journal.lock().used(), 3 * super::super::journal::PAGE);
        // Without the journal, the database alone has what was
        // checkpointed; with it, everything.
        let crashed = dir.path().join("crashed");
        crash_image(&s, &state, &crashed);
        let bare = dir.path().join("bare");
        std::fs::create_dir(&bare).unwrap();
        std::fs::copy(crashed.join("ctld.redb"), bare.join("ctld.redb")).unwrap();
        assert_eq!(
            Store::open(&bare).unwrap().load().unwrap().jobs.len() as u64,
            per
        );
        let r = Store::open(&crashed).unwrap();
        assert_eq!(r.load().unwrap().jobs.len() as u64, per + 3);
        assert_eq!(r.acct_pending(10_000).unwrap().len() as u64, per + 3);
    }

    #[test]
    fn a_store_of_the_layout_before_the_journal_is_taken_and_marked() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        {
            let s = Store::open(&state).unwrap();
            s.commit(&[submission(1)]).unwrap();
            let tx = s.with(|d| d.begin_write().map_err(db)).unwrap();
            tx.open_table(META).unwrap().insert("layout", 21).unwrap();
            tx.commit().unwrap();
        }
        let s = Store::open(&state).unwrap();
        assert_eq!(s.load().unwrap().jobs.len(), 1);
        let tx = s.with(|d| d.begin_read().map_err(db)).unwrap();
        let layout = tx
            .open_table(META)
            .unwrap()
            .get("layout")
            .unwrap()
            .unwrap()
            .value();
        assert_eq!(layout, LAYOUT);
    }

    #[test]
    fn a_journal_left_beside_a_removed_database_replays_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        {
            let s = Store::open(&state).unwrap();
            s.commit(&[submission(1)]).unwrap();
        }
        // The operator starts over by removing the database alone.
        std::fs::remove_file(state.join("ctld.redb")).unwrap();
        let s = Store::open(&state).unwrap();
        assert!(s.load().unwrap().jobs.is_empty(), "job 1 came back");
        // And the new store's own records still come back after a crash.
        s.commit(&[submission(7)]).unwrap();
        let crashed = dir.path().join("crashed");
        crash_image(&s, &state, &crashed);
        let l = Store::open(&crashed).unwrap().load().unwrap();
        assert_eq!(l.jobs, [b"job 7".to_vec()]);
    }
}
