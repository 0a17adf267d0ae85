//! The accounting database, through sqlx: SQLite (a file beside the
//! controller's state, the default), PostgreSQL or MariaDB/MySQL. One
//! schema for all three, created and upgraded by numbered migrations
//! recorded in `corral_schema`. A run is written by deleting, then
//! inserting its rows in one transaction, so writing the same record twice
//! (a controller that died between the database's commit and forgetting
//! the record) leaves one copy.

use std::fmt::Write as _;
use std::time::Duration;

use corral_proto::msg::{
    AcctJob, AcctQuery, AcctStep, ExitStatus, Ident, JobId, JobReason, JobState, JobUsage, StepId,
    ACCT_PER_PAGE,
};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};

/// Which SQL dialect the URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    MySql,
}

impl Backend {
    pub fn of(url: &str) -> Option<Backend> {
        let scheme = url.split(':').next()?;
        match scheme {
            "sqlite" => Some(Backend::Sqlite),
            "postgres" | "postgresql" => Some(Backend::Postgres),
            "mysql" | "mariadb" => Some(Backend::MySql),
            _ => None,
        }
    }
}

/// Why the database could not be used.
#[derive(Debug, thiserror::Error)]
pub enum AcctDbError {
    #[error("unsupported accounting url (sqlite:, postgres: or mysql:)")]
    Url,
    #[error("{0}")]
    Sql(#[from] sqlx::Error),
    #[error("the accounting database has schema {found}; this corral-ctld knows up to {known}")]
    Newer { found: i64, known: i64 },
}

/// The schema's versions, oldest first: each a list of statements every
/// backend accepts.
const MIGRATIONS: &[(i64, &[&str])] = &[
    (
        1,
        &[
            "CREATE TABLE IF NOT EXISTS acct_jobs (
            cluster VARCHAR(64) NOT NULL,
            job_id BIGINT NOT NULL,
            run BIGINT NOT NULL,
            name TEXT NOT NULL,
            uid BIGINT NOT NULL,
            gid BIGINT NOT NULL,
            account VARCHAR(255) NOT NULL,
            partition_name VARCHAR(255) NOT NULL,
            nodelist TEXT NOT NULL,
            alloc_nodes BIGINT NOT NULL,
            alloc_cpus BIGINT NOT NULL,
            alloc_mem_mb BIGINT NOT NULL,
            alloc_gpus BIGINT NOT NULL,
            req_nodes BIGINT NOT NULL,
            req_cpus BIGINT NOT NULL,
            req_mem_mb BIGINT NOT NULL,
            req_gpus BIGINT NOT NULL,
            submit_time BIGINT NOT NULL,
            eligible_time BIGINT NOT NULL,
            start_time BIGINT,
            end_time BIGINT,
            time_limit BIGINT,
            state VARCHAR(32) NOT NULL,
            reason VARCHAR(64) NOT NULL,
            exit_code BIGINT NOT NULL,
            exit_signal BIGINT,
            cancelled_by BIGINT,
            cpu_ms BIGINT,
            max_rss_kb BIGINT,
            work_dir TEXT NOT NULL,
            comment TEXT NOT NULL,
            PRIMARY KEY (cluster, job_id, run)
        )",
            "CREATE INDEX IF NOT EXISTS acct_jobs_end ON acct_jobs (cluster, end_time)",
            "CREATE INDEX IF NOT EXISTS acct_jobs_uid ON acct_jobs (cluster, uid, job_id)",
            "CREATE TABLE IF NOT EXISTS acct_steps (
            cluster VARCHAR(64) NOT NULL,
            job_id BIGINT NOT NULL,
            run BIGINT NOT NULL,
            step_id BIGINT NOT NULL,
            name TEXT NOT NULL,
            nodelist TEXT NOT NULL,
            nodes BIGINT NOT NULL,
            tasks BIGINT NOT NULL,
            cpus BIGINT NOT NULL,
            start_time BIGINT NOT NULL,
            end_time BIGINT,
            state VARCHAR(32) NOT NULL,
            exit_code BIGINT NOT NULL,
            exit_signal BIGINT,
            PRIMARY KEY (cluster, job_id, run, step_id)
        )",
        ],
    ),
    (
        2,
        &[
            "ALTER TABLE acct_jobs ADD COLUMN array_job BIGINT",
            "ALTER TABLE acct_jobs ADD COLUMN array_task BIGINT",
            "CREATE INDEX IF NOT EXISTS acct_jobs_array ON acct_jobs (cluster, array_job)",
        ],
    ),
    (
        3,
        &["ALTER TABLE acct_jobs ADD COLUMN wckey TEXT NOT NULL DEFAULT ''"],
    ),
];

const JOB_COLUMNS: &str = "job_id, run, name, uid, gid, account, partition_name, nodelist, \
    alloc_nodes, alloc_cpus, alloc_mem_mb, alloc_gpus, req_nodes, req_cpus, req_mem_mb, req_gpus, \
    submit_time, eligible_time, start_time, end_time, time_limit, state, reason, exit_code, \
    exit_signal, cancelled_by, cpu_ms, max_rss_kb, work_dir, comment, array_job, array_task, wckey";

const STEP_COLUMNS: &str = "job_id, run, step_id, name, nodelist, nodes, tasks, cpus, \
    start_time, end_time, state, exit_code, exit_signal";

/// A connection pool to the accounting database of one cluster.
#[derive(Debug, Clone)]
pub struct AcctDb {
    pool: AnyPool,
    backend: Backend,
    cluster: String,
}

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn uint(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn state_parse(s: &str) -> JobState {
    JobState::parse(s).unwrap_or(JobState::Failed)
}

/// Every reason accounting stores, with its stored name.
const REASONS: &[(JobReason, &str)] = &[
    (JobReason::None, "None"),
    (JobReason::Priority, "Priority"),
    (JobReason::Resources, "Resources"),
    (JobReason::Dependency, "Dependency"),
    (
        JobReason::DependencyNeverSatisfied,
        "DependencyNeverSatisfied",
    ),
    (JobReason::BeginTime, "BeginTime"),
    (JobReason::JobHeldUser, "JobHeldUser"),
    (JobReason::JobHeldAdmin, "JobHeldAdmin"),
    (JobReason::ReqNodeNotAvail, "ReqNodeNotAvail"),
    (JobReason::PartitionTimeLimit, "PartitionTimeLimit"),
    (JobReason::JobArrayTaskLimit, "JobArrayTaskLimit"),
    (JobReason::JobLaunchFailure, "JobLaunchFailure"),
    (JobReason::NonZeroExitCode, "NonZeroExitCode"),
    (JobReason::NodeDown, "NodeDown"),
    (JobReason::TimeLimit, "TimeLimit"),
];

fn reason_name(r: JobReason) -> &'static str {
    REASONS
        .iter()
        .find(|(x, _)| *x == r)
        .map_or("None", |(_, n)| n)
}

fn reason_parse(s: &str) -> JobReason {
    REASONS
        .iter()
        .find(|(_, n)| *n == s)
        .map_or(JobReason::None, |(r, _)| *r)
}

/// SQL text with `?` placeholders numbered for PostgreSQL (`$1`…).
struct Sql {
    text: String,
    backend: Backend,
    next: usize,
}

impl Sql {
    fn new(backend: Backend, text: &str) -> Sql {
        Sql {
            text: text.to_string(),
            backend,
            next: 1,
        }
    }

    fn push(&mut self, s: &str) -> &mut Sql {
        self.text.push_str(s);
        self
    }

    /// One placeholder.
    fn arg(&mut self) -> &mut Sql {
        match self.backend {
            Backend::Postgres => {
                let _ = write!(self.text, "${}", self.next);
            }
            _ => self.text.push('?'),
        }
        self.next += 1;
        self
    }

    /// `n` placeholders separated by commas.
    fn args(&mut self, n: usize) -> &mut Sql {
        for i in 0..n {
            if i > 0 {
                self.text.push_str(", ");
            }
            self.arg();
        }
        self
    }
}

impl AcctDb {
    /// Connects (retrying for up to `patience`) and brings the schema up
    /// to date.
    pub async fn connect(
        url: &str,
        cluster: &str,
        patience: Duration,
    ) -> Result<AcctDb, AcctDbError> {
        sqlx::any::install_default_drivers();
        let backend = Backend::of(url).ok_or(AcctDbError::Url)?;
        let url = match backend {
            // The file is made on first use.
            Backend::Sqlite if !url.contains("mode=") => {
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}mode=rwc")
            }
            _ => url.to_string(),
        };
        let pool = AnyPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(patience.max(Duration::from_millis(100)))
            .connect(&url)
            .await?;
        if backend == Backend::Sqlite {
            // Write-ahead logging (kept in the file once set): a record's
            // transaction costs one fsync of the log, where the default
            // rollback journal took three and rewrote the pages in place;
            // each of them competed with the store's commits for the disk.
            sqlx::query("PRAGMA journal_mode = WAL")
                .execute(&pool)
                .await?;
        }
        let db = AcctDb {
            pool,
            backend,
            cluster: cluster.to_string(),
        };
        db.migrate().await?;
        Ok(db)
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    fn sql(&self, text: &str) -> Sql {
        Sql::new(self.backend, text)
    }

    /// Applies the migrations this database has not seen.
    async fn migrate(&self) -> Result<(), AcctDbError> {
        sqlx::query("CREATE TABLE IF NOT EXISTS corral_schema (version BIGINT NOT NULL)")
            .execute(&self.pool)
            .await?;
        let row = sqlx::query("SELECT MAX(version) FROM corral_schema")
            .fetch_one(&self.pool)
            .await?;
        let current: i64 = row.try_get::<Option<i64>, _>(0)?.unwrap_or(0);
        let known = MIGRATIONS.last().map_or(0, |m| m.0);
        if current > known {
            return Err(AcctDbError::Newer {
                found: current,
                known,
            });
        }
        for (version, statements) in MIGRATIONS.iter().filter(|m| m.0 > current) {
            let mut tx = self.pool.begin().await?;
            for s in *statements {
                sqlx::query(s).execute(&mut *tx).await?;
            }
            let mut ins = self.sql("INSERT INTO corral_schema (version) VALUES (");
            ins.arg().push(")");
            sqlx::query(&ins.text)
                .bind(*version)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            tracing::info!(version, "accounting schema migrated");
        }
        Ok(())
    }

    /// The schema version in the database.
    pub async fn version(&self) -> Result<i64, AcctDbError> {
        let row = sqlx::query("SELECT MAX(version) FROM corral_schema")
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get::<Option<i64>, _>(0)?.unwrap_or(0))
    }

    /// Writes runs (each replacing any earlier copy of itself) in one
    /// transaction.
    pub async fn write(&self, jobs: &[AcctJob]) -> Result<(), AcctDbError> {
        let mut tx = self.pool.begin().await?;
        let mut del_steps = self.sql("DELETE FROM acct_steps WHERE cluster = ");
        del_steps
            .arg()
            .push(" AND job_id = ")
            .arg()
            .push(" AND run = ")
            .arg();
        let mut del_job = self.sql("DELETE FROM acct_jobs WHERE cluster = ");
        del_job
            .arg()
            .push(" AND job_id = ")
            .arg()
            .push(" AND run = ")
            .arg();
        let mut ins_job = self.sql(&format!(
            "INSERT INTO acct_jobs (cluster, {JOB_COLUMNS}) VALUES ("
        ));
        ins_job.args(34).push(")");
        let mut ins_step = self.sql(&format!(
            "INSERT INTO acct_steps (cluster, {STEP_COLUMNS}) VALUES ("
        ));
        ins_step.args(14).push(")");
        for j in jobs {
            let key = (int(j.id.0), i64::from(j.run));
            for d in [&del_steps, &del_job] {
                sqlx::query(&d.text)
                    .bind(self.cluster.as_str())
                    .bind(key.0)
                    .bind(key.1)
                    .execute(&mut *tx)
                    .await?;
            }
            sqlx::query(&ins_job.text)
                .bind(self.cluster.as_str())
                .bind(key.0)
                .bind(key.1)
                .bind(j.name.as_str())
                .bind(i64::from(j.user.uid))
                .bind(i64::from(j.user.gid))
                .bind(j.account.as_str())
                .bind(j.partition.as_str())
                .bind(j.nodelist.as_str())
                .bind(i64::from(j.alloc_nodes))
                .bind(i64::from(j.alloc_cpus))
                .bind(int(j.alloc_mem_mb))
                .bind(i64::from(j.alloc_gpus))
                .bind(i64::from(j.req_nodes))
                .bind(i64::from(j.req_cpus))
                .bind(int(j.req_mem_mb))
                .bind(i64::from(j.req_gpus))
                .bind(int(j.submit))
                .bind(int(j.eligible))
                .bind(j.start.map(int))
                .bind(j.end.map(int))
                .bind(j.time_limit.map(int))
                .bind(j.state.name())
                .bind(reason_name(j.reason))
                .bind(i64::from(j.exit.code))
                .bind(j.exit.signal.map(i64::from))
                .bind(j.cancelled_by.map(i64::from))
                .bind(j.usage.map(|u| int(u.cpu_ms)))
                .bind(j.usage.map(|u| int(u.max_rss_kb)))
                .bind(j.work_dir.as_str())
                .bind(j.comment.as_str())
                .bind(j.array.map(|(a, _)| int(a.0)))
                .bind(j.array.map(|(_, t)| i64::from(t)))
                .bind(j.wckey.as_str())
                .execute(&mut *tx)
                .await?;
            for s in &j.steps {
                sqlx::query(&ins_step.text)
                    .bind(self.cluster.as_str())
                    .bind(key.0)
                    .bind(key.1)
                    .bind(i64::from(s.step.0))
                    .bind(s.name.as_str())
                    .bind(s.nodelist.as_str())
                    .bind(i64::from(s.nodes))
                    .bind(i64::from(s.tasks))
                    .bind(i64::from(s.cpus))
                    .bind(int(s.start))
                    .bind(s.end.map(int))
                    .bind(s.state.name())
                    .bind(i64::from(s.exit.code))
                    .bind(s.exit.signal.map(i64::from))
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    /// The conditions of `q` on `acct_jobs` (aliased `j`), with their
    /// values bound in order by [`AcctDb::bind_where`].
    fn push_where(&self, sql: &mut Sql, q: &AcctQuery, users: &[u32]) {
        sql.push(" WHERE j.cluster = ").arg();
        sql.push(" AND j.job_id > ").arg();
        if !q.ids.is_empty() {
            // An array's id names its tasks too.
            sql.push(" AND (j.job_id IN (")
                .args(q.ids.len())
                .push(") OR j.array_job IN (")
                .args(q.ids.len())
                .push("))");
        }
        if !users.is_empty() {
            sql.push(" AND j.uid IN (").args(users.len()).push(")");
        }
        if !q.states.is_empty() {
            sql.push(" AND j.state IN (").args(q.states.len()).push(")");
        }
        if q.end.is_some() {
            sql.push(" AND j.eligible_time <= ").arg();
        }
        if q.start.is_some() {
            sql.push(" AND (j.end_time IS NULL OR j.end_time >= ")
                .arg()
                .push(")");
        }
    }

    fn bind_where<'q>(
        &'q self,
        mut query: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
        q: &'q AcctQuery,
        users: &[u32],
    ) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
        query = query.bind(self.cluster.as_str()).bind(int(q.after.0));
        for _ in 0..2 {
            for id in &q.ids {
                query = query.bind(int(id.0));
            }
        }
        for u in users {
            query = query.bind(i64::from(*u));
        }
        for s in &q.states {
            query = query.bind(s.name());
        }
        if let Some(e) = q.end {
            query = query.bind(int(e));
        }
        if let Some(s) = q.start {
            query = query.bind(int(s));
        }
        query
    }

    /// One page of runs answering `q` (users resolved: empty for
    /// anyone's), in job id order, with their steps unless `-X`; and the
    /// last job id the page covers completely when more may follow.
    pub async fn query(
        &self,
        q: &AcctQuery,
        users: &[u32],
    ) -> Result<(Vec<AcctJob>, Option<JobId>), AcctDbError> {
        let mut sql = self.sql(&format!("SELECT {JOB_COLUMNS} FROM acct_jobs j"));
        self.push_where(&mut sql, q, users);
        let _ = write!(
            sql.text,
            " ORDER BY j.job_id, j.run LIMIT {}",
            ACCT_PER_PAGE + 1
        );
        let rows = self
            .bind_where(sqlx::query(&sql.text), q, users)
            .fetch_all(&self.pool)
            .await?;
        let mut jobs = rows.iter().map(job_row).collect::<Result<Vec<_>, _>>()?;
        let mut next = None;
        if jobs.len() > ACCT_PER_PAGE {
            // The page ends with the last job it holds every run of (a
            // job requeued more times than a page holds shows its first
            // runs only).
            let last = jobs[ACCT_PER_PAGE].id;
            jobs.truncate(ACCT_PER_PAGE);
            if jobs[0].id == last {
                next = Some(last);
            } else {
                jobs.retain(|j| j.id < last);
                next = Some(JobId(last.0 - 1));
            }
        }
        if !q.allocations && !jobs.is_empty() {
            // The steps of the page's id range, by the primary key alone;
            // those of runs the page did not select are passed over.
            let (lo, hi) = (jobs[0].id, jobs[jobs.len() - 1].id);
            let mut sql = self.sql(&format!(
                "SELECT {STEP_COLUMNS} FROM acct_steps WHERE cluster = "
            ));
            sql.arg()
                .push(" AND job_id >= ")
                .arg()
                .push(" AND job_id <= ")
                .arg();
            sql.push(" ORDER BY job_id, run, step_id");
            let rows = sqlx::query(&sql.text)
                .bind(self.cluster.as_str())
                .bind(int(lo.0))
                .bind(int(hi.0))
                .fetch_all(&self.pool)
                .await?;
            let mut at = 0;
            for r in &rows {
                let (id, run, step) = step_row(r)?;
                while at < jobs.len() && (jobs[at].id, jobs[at].run) < (id, run) {
                    at += 1;
                }
                if at < jobs.len() && (jobs[at].id, jobs[at].run) == (id, run) {
                    jobs[at].steps.push(step);
                }
            }
        }
        Ok((jobs, next))
    }

    /// How many runs the database holds for this cluster (tests, benches).
    pub async fn count(&self) -> Result<u64, AcctDbError> {
        let mut sql = self.sql("SELECT COUNT(*) FROM acct_jobs WHERE cluster = ");
        sql.arg();
        let row = sqlx::query(&sql.text)
            .bind(self.cluster.as_str())
            .fetch_one(&self.pool)
            .await?;
        Ok(uint(row.try_get::<i64, _>(0)?))
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// A text column: MySQL's `TEXT` reaches the `Any` driver as bytes.
fn text(r: &AnyRow, col: &str) -> Result<String, sqlx::Error> {
    match r.try_get::<String, _>(col) {
        Ok(s) => Ok(s),
        Err(e) => match r.try_get::<Vec<u8>, _>(col) {
            Ok(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
            Err(_) => Err(e),
        },
    }
}

fn job_row(r: &AnyRow) -> Result<AcctJob, sqlx::Error> {
    let u = |c: &str| -> Result<u64, sqlx::Error> { Ok(uint(r.try_get::<i64, _>(c)?)) };
    let u32_ =
        |c: &str| -> Result<u32, sqlx::Error> { Ok(u32::try_from(u(c)?).unwrap_or(u32::MAX)) };
    let opt = |c: &str| -> Result<Option<u64>, sqlx::Error> {
        Ok(r.try_get::<Option<i64>, _>(c)?.map(uint))
    };
    let cpu = opt("cpu_ms")?;
    let rss = opt("max_rss_kb")?;
    Ok(AcctJob {
        id: JobId(u("job_id")?),
        run: u32_("run")?,
        name: text(r, "name")?,
        user: Ident {
            uid: u32_("uid")?,
            gid: u32_("gid")?,
        },
        account: text(r, "account")?,
        partition: text(r, "partition_name")?,
        nodelist: text(r, "nodelist")?,
        alloc_nodes: u32_("alloc_nodes")?,
        alloc_cpus: u32_("alloc_cpus")?,
        alloc_mem_mb: u("alloc_mem_mb")?,
        alloc_gpus: u32_("alloc_gpus")?,
        req_nodes: u32_("req_nodes")?,
        req_cpus: u32_("req_cpus")?,
        req_mem_mb: u("req_mem_mb")?,
        req_gpus: u32_("req_gpus")?,
        submit: u("submit_time")?,
        eligible: u("eligible_time")?,
        start: opt("start_time")?,
        end: opt("end_time")?,
        time_limit: opt("time_limit")?,
        state: state_parse(&text(r, "state")?),
        reason: reason_parse(&text(r, "reason")?),
        exit: ExitStatus {
            code: r.try_get::<i64, _>("exit_code")? as i32,
            signal: r
                .try_get::<Option<i64>, _>("exit_signal")?
                .map(|s| s as i32),
        },
        cancelled_by: opt("cancelled_by")?.map(|v| v as u32),
        usage: match (cpu, rss) {
            (None, None) => None,
            (c, m) => Some(JobUsage {
                cpu_ms: c.unwrap_or(0),
                max_rss_kb: m.unwrap_or(0),
            }),
        },
        work_dir: text(r, "work_dir")?,
        comment: text(r, "comment")?,
        wckey: text(r, "wckey")?,
        steps: Vec::new(),
        array: match (opt("array_job")?, opt("array_task")?) {
            (Some(a), Some(t)) => Some((JobId(a), u32::try_from(t).unwrap_or(u32::MAX))),
            _ => None,
        },
    })
}

fn step_row(r: &AnyRow) -> Result<(JobId, u32, AcctStep), sqlx::Error> {
    let u = |c: &str| -> Result<u64, sqlx::Error> { Ok(uint(r.try_get::<i64, _>(c)?)) };
    let u32_ =
        |c: &str| -> Result<u32, sqlx::Error> { Ok(u32::try_from(u(c)?).unwrap_or(u32::MAX)) };
    Ok((
        JobId(u("job_id")?),
        u32_("run")?,
        AcctStep {
            step: StepId(u32_("step_id")?),
            name: text(r, "name")?,
            nodelist: text(r, "nodelist")?,
            nodes: u32_("nodes")?,
            tasks: u32_("tasks")?,
            cpus: u32_("cpus")?,
            start: u("start_time")?,
            end: r.try_get::<Option<i64>, _>("end_time")?.map(uint),
            state: state_parse(&text(r, "state")?),
            exit: ExitStatus {
                code: r.try_get::<i64, _>("exit_code")? as i32,
                signal: r
                    .try_get::<Option<i64>, _>("exit_signal")?
                    .map(|s| s as i32),
            },
        },
    ))
}
