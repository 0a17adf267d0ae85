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
    /// Only jobs in this state.
    #[arg(short = 't', long = "state")]
    pub state: Option<String>,
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
    if let Some(u) = &a.user {
        f.users = vec![parse_user(u)?];
    }
    if let Some(n) = &a.name {
        f.names = vec![n.clone()];
    }
    if let Some(s) = &a.state {
        f.states =
            vec![JobState::parse(s).ok_or_else(|| format!("Invalid job state specified: {s}"))?];
    }
    if let Some(p) = &a.partition {
        f.partitions = vec![p.clone()];
    }
    if f.ids.is_empty()
        && f.tasks.is_empty()
        && f.users.is_empty()
        && f.names.is_empty()
        && f.states.is_empty()
        && f.partitions.is_empty()
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
    block_on(CMD, async move {
        let mut c = match Client::connect().await {
            Ok(c) => c,
            Err(e) => return fail(CMD, e),
        };
        match c.ok(req).await {
            Ok(Response::Affected { .. }) => 0,
            Ok(other) => fail(CMD, format!("unexpected answer {other:?}")),
            Err(e) => fail(CMD, e),
        }
    })
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
