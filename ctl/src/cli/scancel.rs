//! `scancel`: cancel or signal jobs by id, user, name, state, partition.

use std::ffi::OsString;
use std::str::FromStr;

use clap::Parser;
use corral_proto::msg::{JobFilter, JobState, Request, Response, SendSignal, SignalTo, StepId};
use nix::sys::signal::Signal;

use super::{block_on, fail, parse, parse_user};
use crate::client::Client;

const CMD: &str = "scancel";

/// Cancel jobs.
#[derive(Debug, Parser)]
#[command(name = "scancel", version)]
pub struct ScancelArgs {
    /// Jobs to cancel.
    pub ids: Vec<String>,
    /// Only this user's jobs.
    #[arg(short = 'u', long = "user")]
    pub user: Option<String>,
    /// Only jobs with this name.
    #[arg(short = 'n', long = "name", alias = "jobname")]
    pub name: Option<String>,
    /// Only jobs in these states (comma separated).
    #[arg(short = 't', long = "state", alias = "states")]
    pub state: Option<String>,
    /// Only your own jobs.
    #[arg(long)]
    pub me: bool,
    /// Only jobs of these accounts.
    #[arg(short = 'A', long = "account")]
    pub account: Option<String>,
    /// Only jobs of these QOS.
    #[arg(short = 'q', long = "qos")]
    pub qos: Option<String>,
    /// Only jobs on these nodes (a hostlist).
    #[arg(short = 'w', long = "nodelist")]
    pub nodelist: Option<String>,
    /// Ask before each job.
    #[arg(short = 'i', long = "interactive")]
    pub interactive: bool,
    /// Say what is done.
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,
    /// Say nothing of jobs that could not be reached.
    #[arg(short = 'Q', long = "quiet")]
    pub quiet: bool,
    /// Only jobs in this partition.
    #[arg(short = 'p', long = "partition")]
    pub partition: Option<String>,
    /// Send this signal instead of cancelling.
    #[arg(short = 's', long = "signal")]
    pub signal: Option<String>,
    /// With a signal: to the batch shell only, not the job's steps.
    #[arg(short = 'b', long)]
    pub batch: bool,
    /// With a signal: to the batch shell and every step.
    #[arg(short = 'f', long)]
    pub full: bool,
}

/// A signal by name (`KILL`, `SIGUSR1`) or number.
pub fn parse_signal(s: &str) -> Result<i32, String> {
    if let Ok(n) = s.parse::<i32>() {
        return Signal::try_from(n)
            .map(|sig| sig as i32)
            .map_err(|_| format!("Invalid signal: {s}"));
    }
    let up = s.to_ascii_uppercase();
    let name = if up.starts_with("SIG") {
        up
    } else {
        format!("SIG{up}")
    };
    Signal::from_str(&name)
        .map(|sig| sig as i32)
        .map_err(|_| format!("Invalid signal: {s}"))
}

/// The request the arguments make.
pub fn request(a: &ScancelArgs) -> Result<Request, String> {
    let mut f = JobFilter::default();
    for id in &a.ids {
        let (ids, tasks) = super::opts::parse_job_list(id)?;
        f.ids.extend(ids);
        f.tasks.extend(tasks);
    }
    let list = |s: &str| -> Vec<String> {
        s.split(',')
            .filter(|x| !x.is_empty())
            .map(String::from)
            .collect()
    };
    if let Some(u) = &a.user {
        f.users = list(u)
            .iter()
            .map(|u| parse_user(u))
            .collect::<Result<_, _>>()?;
    }
    if a.me {
        f.users.push(nix::unistd::getuid().as_raw());
    }
    if let Some(n) = &a.name {
        f.names = list(n);
    }
    if let Some(s) = &a.state {
        f.states = list(s)
            .iter()
            .map(|s| JobState::parse(s).ok_or_else(|| format!("Invalid job state specified: {s}")))
            .collect::<Result<_, _>>()?;
    }
    if let Some(p) = &a.partition {
        f.partitions = list(p);
    }
    if f.ids.is_empty()
        && f.tasks.is_empty()
        && f.users.is_empty()
        && f.names.is_empty()
        && f.states.is_empty()
        && f.partitions.is_empty()
        && a.account.is_none()
        && a.qos.is_none()
        && a.nodelist.is_none()
    {
        return Err("No job identification provided".into());
    }
    // As Slurm's: a signal goes to the job's steps; the batch shell only
    // with --batch (alone) or --full (with the steps).
    let to = if a.full {
        SignalTo::All
    } else if a.batch {
        SignalTo::Step(StepId::BATCH)
    } else {
        SignalTo::Steps
    };
    let signal = a
        .signal
        .as_deref()
        .map(parse_signal)
        .transpose()?
        .map(|signal| SendSignal { signal, to });
    Ok(Request::Cancel { filter: f, signal })
}

pub fn main(args: &[OsString]) -> i32 {
    let a: ScancelArgs = match parse(CMD, args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let req = match request(&a) {
        Ok(r) => r,
        Err(e) => return fail(CMD, e),
    };
    // What the controller's filter cannot say (accounts, QOS, nodes) and
    // -i's question need the jobs first; they are then cancelled by id.
    let local = a.account.is_some() || a.qos.is_some() || a.nodelist.is_some();
    let extra = if local {
        let q = super::squeue::SqueueArgs {
            account: a.account.clone(),
            qos: a.qos.clone(),
            nodelist: a.nodelist.clone(),
            ..super::squeue::SqueueArgs::parse_from(["squeue"])
        };
        match super::squeue::Extra::of(&q) {
            Ok(e) => Some(e),
            Err(e) => return fail(CMD, e),
        }
    } else {
        None
    };
    block_on(CMD, async move {
        let mut c = match Client::connect().await {
            Ok(c) => c,
            Err(e) => return fail(CMD, e),
        };
        let Request::Cancel { filter, signal } = req else {
            return fail(CMD, "not a cancel");
        };
        let filter = if extra.is_some() || a.interactive {
            let query = JobFilter {
                detail: true,
                ..filter.clone()
            };
            let jobs = match c.jobs(query).await {
                Ok(j) => j,
                Err(e) => return fail(CMD, e),
            };
            let mut ids = Vec::new();
            for j in jobs.iter().filter(|j| !j.state.is_final()) {
                if extra.as_ref().is_some_and(|e| !e.keeps(j)) {
                    continue;
                }
                if a.interactive && !confirm(j) {
                    continue;
                }
                ids.push(j.id);
            }
            if ids.is_empty() {
                return 0;
            }
            JobFilter {
                ids,
                ..JobFilter::default()
            }
        } else {
            filter
        };
        if a.verbose {
            for id in &filter.ids {
                let word = if signal.is_some() {
                    "Signal"
                } else {
                    "Terminating"
                };
                eprintln!("{CMD}: {word} job {id}");
            }
        }
        match c.ok(Request::Cancel { filter, signal }).await {
            Ok(Response::Affected { .. }) => 0,
            Ok(other) => fail(CMD, format!("unexpected answer {other:?}")),
            Err(e) => {
                let code = exit_code(&e);
                if !a.quiet {
                    fail(CMD, e);
                }
                code
            }
        }
    })
}

/// The exit status of a refused cancel: Slurm 22.05's scancel exits with
/// its error's number cut to 8 bits, so another user's job gives 210
/// (`ESLURM_ACCESS_DENIED`, 2002; measured); anything else 1.
fn exit_code(err: &str) -> i32 {
    if err.contains("Access/permission denied") {
        210
    } else {
        1
    }
}

/// `-i`: asks on standard error, reads the answer from standard input.
fn confirm(j: &corral_proto::msg::JobView) -> bool {
    use std::io::{BufRead, Write};
    let id = super::squeue::job_id(j);
    let _ = write!(
        std::io::stderr(),
        "Cancel job_id={id} name={} partition={} [y/n]? ",
        j.name,
        j.partition
    );
    let mut answer = String::new();
    let _ = std::io::stdin().lock().read_line(&mut answer);
    matches!(answer.trim(), "y" | "Y" | "yes" | "YES")
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_proto::msg::JobId;

    #[test]
    fn signals_by_name_or_number() {
        assert_eq!(parse_signal("KILL"), Ok(9));
        assert_eq!(parse_signal("SIGUSR1"), Ok(Signal::SIGUSR1 as i32));
        assert_eq!(parse_signal("15"), Ok(15));
        assert!(parse_signal("BOGUS").is_err());
        assert!(parse_signal("999").is_err());
    }

    #[test]
    fn needs_something_to_cancel() {
        let a = ScancelArgs::try_parse_from(["scancel"]).unwrap();
        assert!(request(&a).unwrap_err().contains("No job identification"));
        let a = ScancelArgs::try_parse_from(["scancel", "3,4", "5"]).unwrap();
        match request(&a).unwrap() {
            Request::Cancel { filter, signal } => {
                assert_eq!(filter.ids, vec![JobId(3), JobId(4), JobId(5)]);
                assert_eq!(signal, None);
            }
            other => panic!("{other:?}"),
        }
        let a = ScancelArgs::try_parse_from(["scancel", "x"]).unwrap();
        assert!(request(&a).is_err());
        // A signal goes to the steps; the batch shell only when asked.
        for (flags, to) in [
            (&[][..], SignalTo::Steps),
            (&["-b"][..], SignalTo::Step(StepId::BATCH)),
            (&["--full"][..], SignalTo::All),
        ] {
            let mut argv = vec!["scancel", "-s", "USR1", "7"];
            argv.extend_from_slice(flags);
            let a = ScancelArgs::try_parse_from(argv).unwrap();
            match request(&a).unwrap() {
                Request::Cancel { signal, .. } => {
                    assert_eq!(signal, Some(SendSignal { signal: 10, to }));
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
