//! `sbatch`: submit a batch script. `#SBATCH` lines in the script take the
//! same options as the command line; the command line wins.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Parser;
use corral_proto::msg::{JobKind, Request, Response};

use super::opts::JobOpts;
use super::{block_on, fail, parse};
use crate::client::Client;

const CMD: &str = "sbatch";

/// Submit a batch script to Corral.
#[derive(Debug, Parser)]
#[command(name = "sbatch", version, args_override_self = true)]
pub struct SbatchArgs {
    #[command(flatten)]
    pub job: JobOpts,
    /// File for the script's standard output (patterns: %j %x %N %u %A %a).
    #[arg(short = 'o', long)]
    pub output: Option<String>,
    /// File for standard error (default: with standard output).
    #[arg(short = 'e', long)]
    pub error: Option<String>,
    /// Output files: truncate (the default) or append (a requeued job's
    /// log keeps its earlier runs).
    #[arg(long = "open-mode", value_parser = ["append", "truncate"])]
    pub open_mode: Option<String>,
    /// Print only the job id.
    #[arg(long)]
    pub parsable: bool,
    /// Say when and where the job would start; submit nothing.
    #[arg(long = "test-only")]
    pub test_only: bool,
    /// A job array: task indices (`0-99`, `1,3,5-7`, `0-15:4`), and
    /// `%N` for how many run at once.
    #[arg(short = 'a', long)]
    pub array: Option<String>,
    /// Wrap this command line in a sh script.
    #[arg(long)]
    pub wrap: Option<String>,
    /// Do not exit until the job ends; exit with its exit code (1 if a
    /// signal ended it).
    #[arg(short = 'W', long)]
    pub wait: bool,
    /// The script (default: read from standard input) and its arguments.
    #[arg(trailing_var_arg = true)]
    pub script: Vec<String>,
}

/// Reads a batch script, stopping past the most one submission can carry
/// (a frame): `sbatch /dev/zero` ends at once instead of reading for ever.
fn read_script(r: impl std::io::Read) -> std::io::Result<Vec<u8>> {
    let most = u64::from(corral_proto::MAX_FRAME);
    let mut text = Vec::new();
    std::io::Read::read_to_end(&mut r.take(most + 1), &mut text)?;
    if text.len() as u64 > most {
        return Err(std::io::Error::other(format!(
            "the script is larger than {most} bytes"
        )));
    }
    Ok(text)
}

/// Splits an `#SBATCH` line's options like a shell would (quotes, escapes);
/// stops at an unquoted `#`.
pub fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => cur.push(c),
                        None => return Err(format!("unterminated quote in: {line}")),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c) => cur.push(c),
                            None => return Err(format!("unterminated quote in: {line}")),
                        },
                        Some(c) => cur.push(c),
                        None => return Err(format!("unterminated quote in: {line}")),
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(c) = chars.next() {
                    cur.push(c);
                }
            }
            '#' if !in_word => break,
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

/// The options of a script's `#SBATCH` lines: those before the first
/// command (blank lines and other comments do not end them).
pub fn directives(script: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for line in script.lines().skip(1) {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("#SBATCH") {
            if rest.starts_with(char::is_whitespace) {
                out.extend(split_words(rest)?);
            }
        } else if !(t.is_empty() || t.starts_with('#')) {
            break;
        }
    }
    Ok(out)
}

/// The final arguments, the script's bytes and its arguments.
pub type Prepared = (SbatchArgs, Vec<u8>, Vec<String>);

/// Parses the command line, reads the script and merges its directives
/// and the input environment variables. Returns the final arguments and
/// the script text.
pub fn prepare(args: &[OsString]) -> Result<Prepared, Result<String, i32>> {
    prepare_with(args, |v| std::env::var(v).ok())
}

/// [`prepare`] with the environment read through `lookup`.
pub fn prepare_with(
    args: &[OsString],
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Prepared, Result<String, i32>> {
    let first: SbatchArgs = parse(CMD, args).map_err(Err)?;
    // A script is bytes: Slurm runs scripts that are not UTF-8.
    let (script, script_args, name) = if let Some(cmd) = &first.wrap {
        (
            format!("#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{cmd}\n")
                .into_bytes(),
            Vec::new(),
            "wrap".to_string(),
        )
    } else if let Some((path, rest)) = first.script.split_first() {
        let text = std::fs::File::open(path)
            .and_then(read_script)
            .map_err(|e| Ok(format!("Unable to open file {path}: {e}")))?;
        let name = PathBuf::from(path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "sbatch".into());
        (text, rest.to_vec(), name)
    } else {
        let text = read_script(std::io::stdin())
            .map_err(|e| Ok(format!("reading the script from standard input: {e}")))?;
        (text, Vec::new(), "sbatch".to_string())
    };
    if !script.starts_with(b"#!") {
        return Err(Ok("This does not look like a batch script.  The first line must start with #! followed by the path to an interpreter.".into()));
    }
    // Directives first, then the environment's options, the command line
    // last: the later value wins.
    // Directives are read as text; bytes that are not UTF-8 cannot be
    // part of an option Corral knows.
    let dirs = directives(&String::from_utf8_lossy(&script)).map_err(Ok)?;
    let env = super::opts::input_options(super::opts::SBATCH_INPUT, lookup);
    // Nothing to add to the command line (a `--wrap`, a script without
    // directives): its parse stands, and sbatch spares a second one.
    let mut full = if dirs.is_empty() && env.is_empty() {
        first
    } else {
        let mut merged: Vec<OsString> = vec![args[0].clone()];
        merged.extend(dirs.into_iter().map(OsString::from));
        merged.extend(env);
        merged.extend(args[1..].iter().cloned());
        parse(CMD, &merged).map_err(Err)?
    };
    if full.job.job_name.is_none() {
        full.job.job_name = Some(name);
    }
    Ok((full, script, script_args))
}

pub fn main(args: &[OsString]) -> i32 {
    let (a, script, script_args) = match prepare(args) {
        Ok(p) => p,
        Err(Ok(msg)) => return fail(CMD, msg),
        Err(Err(code)) => return code,
    };
    let mut spec = match a.job.to_spec() {
        Ok(s) => s,
        Err(e) => return fail(CMD, e),
    };
    let cwd = match &a.job.chdir {
        Some(d) => std::env::current_dir().map(|c| c.join(d)),
        None => std::env::current_dir(),
    };
    spec.work_dir = match cwd {
        Ok(d) => d.to_string_lossy().into_owned(),
        Err(e) => return fail(CMD, format!("current directory: {e}")),
    };
    spec.open_append = a.open_mode.as_deref() == Some("append");
    spec.array = match a.array.as_deref().map(super::opts::parse_array).transpose() {
        Ok(arr) => arr,
        Err(e) => return fail(CMD, e),
    };
    // scontrol's Command: the script as named, from where sbatch ran.
    spec.script_path = match (&a.wrap, a.script.first()) {
        (None, Some(p)) => std::env::current_dir()
            .map(|d| d.join(p).to_string_lossy().into_owned())
            .ok(),
        _ => None,
    };
    spec.kind = JobKind::Batch {
        script,
        args: script_args,
        stdout: a.output.clone(),
        stderr: a.error.clone(),
    };
    block_on(CMD, async move {
        let mut c = match Client::connect().await {
            Ok(c) => c,
            Err(e) => return fail(CMD, format!("Batch job submission failed: {e}")),
        };
        if a.test_only {
            return match c.ok(Request::TestOnly(spec)).await {
                Ok(Response::WouldStart {
                    job,
                    start,
                    nodes,
                    cpus,
                    partition,
                }) => {
                    // Slurm says it on standard error.
                    eprintln!(
                        "{CMD}: Job {job} to start at {} using {cpus} processors on nodes {} in partition {partition}",
                        crate::timefmt::timestamp(start),
                        scheduler_core::hostlist::compress_sorted(&nodes)
                    );
                    0
                }
                Ok(other) => fail(CMD, format!("unexpected answer {other:?}")),
                Err(e) => fail(CMD, e),
            };
        }
        match c.ok(Request::Submit(spec)).await {
            Ok(Response::Submitted { job }) => {
                let said = if a.job.quiet {
                    0
                } else if a.parsable {
                    super::emit(CMD, &format!("{job}\n"))
                } else {
                    super::emit(CMD, &format!("Submitted batch job {job}\n"))
                };
                if a.wait && said == 0 {
                    wait_for(&mut c, job).await
                } else {
                    said
                }
            }
            Ok(other) => fail(CMD, format!("unexpected answer {other:?}")),
            Err(e) => fail(CMD, format!("Batch job submission failed: {e}")),
        }
    })
}

/// `--wait`: asks after the job, less often as it runs longer (every
/// half second at first, at most every 5 s), until it ended; its exit
/// code is sbatch's, or 1 when a signal ended it, as Slurm's (an array:
/// once every task ended, the highest of theirs).
async fn wait_for(c: &mut Client, job: corral_proto::msg::JobId) -> i32 {
    use corral_proto::msg::JobFilter;
    let mut pause = std::time::Duration::from_millis(500);
    let mut failures = 0;
    loop {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_secs(5));
        let filter = JobFilter {
            ids: vec![job],
            ..JobFilter::default()
        };
        match c.jobs(filter).await {
            Ok(views) => {
                failures = 0;
                // An array's id shows its tasks (and, while some wait, the
                // array itself): done once all are, with the highest code.
                if views.is_empty() {
                    return fail(
                        CMD,
                        format!("Job {job} is no longer known to the controller"),
                    );
                }
                if views.iter().all(|v| v.state.is_final()) {
                    return views
                        .iter()
                        .map(|v| match v.exit.signal {
                            Some(_) => 1,
                            None => v.exit.code,
                        })
                        .max()
                        .unwrap_or(0);
                }
            }
            // The controller may be restarting: the client already waited
            // its bounded time; a few such in a row end the wait.
            Err(e) => {
                failures += 1;
                if failures >= 5 {
                    return fail(CMD, e);
                }
                if let Ok(fresh) = Client::connect().await {
                    *c = fresh;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endless_script_is_refused_after_a_frame() {
        let e = read_script(std::io::repeat(b'#')).unwrap_err();
        assert_eq!(e.to_string(), "the script is larger than 8388608 bytes");
        assert_eq!(read_script(&b"#!/bin/sh\n"[..]).unwrap(), b"#!/bin/sh\n");
    }

    #[test]
    fn words_split_like_a_shell() {
        assert_eq!(
            split_words(r#" -J "my job" --output='a b.out' -n 4 # a comment"#).unwrap(),
            vec!["-J", "my job", "--output=a b.out", "-n", "4"]
        );
        assert!(split_words("-J \"open").is_err());
    }

    #[test]
    fn directives_stop_at_the_first_command() {
        let s =
            "#!/bin/bash\n#SBATCH -N 2\n\n# comment\n#SBATCH --gres=gpu:1\necho hi\n#SBATCH -n 9\n";
        assert_eq!(directives(s).unwrap(), vec!["-N", "2", "--gres=gpu:1"]);
        // `#SBATCHX` is not a directive.
        assert!(directives("#!/bin/sh\n#SBATCHX -N 2\n").unwrap().is_empty());
    }

    /// submitit's script header parses as it is.
    #[test]
    fn submitits_directives_are_taken() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("submission_file.sh");
        std::fs::write(
            &p,
            "#!/bin/bash\n#SBATCH --job-name=submitit\n#SBATCH --open-mode=append\n\
             #SBATCH --output=/x/%j_0_log.out\n#SBATCH --error=/x/%j_0_log.err\n\
             #SBATCH --signal=USR2@90\n#SBATCH --time=60\n#SBATCH --wckey=submitit\n\
             #SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --cpus-per-task=1\n\
             srun --unbuffered --output /x/%j_%t_log.out --error /x/%j_%t_log.err python -u -m submitit.core._submit /x\n",
        )
        .unwrap();
        let argv: Vec<OsString> = ["sbatch", "--parsable", p.to_str().unwrap()]
            .iter()
            .map(OsString::from)
            .collect();
        let (a, _, _) = prepare_with(&argv, |_| None).unwrap();
        assert_eq!(a.job.wckey.as_deref(), Some("submitit"));
        assert_eq!(a.open_mode.as_deref(), Some("append"));
        // SBATCH_WCKEY is read too, and wins over the script's.
        let (a, _, _) =
            prepare_with(&argv, |v| (v == "SBATCH_WCKEY").then(|| "fromenv".into())).unwrap();
        assert_eq!(a.job.wckey.as_deref(), Some("fromenv"));
    }

    #[test]
    fn command_line_wins_over_directives() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("job.sh");
        std::fs::write(&p, "#!/bin/sh\n#SBATCH -N 2\n#SBATCH -J fromscript\ntrue\n").unwrap();
        let argv: Vec<OsString> = ["sbatch", "-N", "3", p.to_str().unwrap(), "x"]
            .iter()
            .map(OsString::from)
            .collect();
        let (a, _, rest) = prepare_with(&argv, |_| None).unwrap();
        assert_eq!(a.job.nodes.as_deref(), Some("3"));
        assert_eq!(a.job.job_name.as_deref(), Some("fromscript"));
        assert_eq!(rest, vec!["x"]);
    }

    #[test]
    fn the_environment_wins_over_directives_and_loses_to_the_command_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("job.sh");
        std::fs::write(
            &p,
            "#!/bin/sh\n#SBATCH -t 10\n#SBATCH -J fromscript\n#SBATCH -p script\ntrue\n",
        )
        .unwrap();
        let env = |v: &str| match v {
            "SBATCH_TIMELIMIT" => Some("20".to_string()),
            "SBATCH_JOB_NAME" => Some("fromenv".to_string()),
            "SBATCH_PARTITION" => Some(String::new()),
            "SBATCH_REQUEUE" => Some("1".to_string()),
            "SBATCH_GRES" => Some("gpu:2".to_string()),
            _ => None,
        };
        let argv = |extra: &[&str]| -> Vec<OsString> {
            let mut v: Vec<OsString> = vec!["sbatch".into()];
            v.extend(extra.iter().map(OsString::from));
            v.push(p.clone().into());
            v
        };
        let (a, _, _) = prepare_with(&argv(&[]), env).unwrap();
        let spec = a.job.to_spec().unwrap();
        assert_eq!(spec.time_limit, Some(20 * 60), "environment over #SBATCH");
        assert_eq!(spec.name, "fromenv");
        assert_eq!(
            spec.partition.as_deref(),
            Some("script"),
            "an empty variable is unset"
        );
        assert!(spec.requeue);
        assert_eq!(spec.gpus, corral_proto::msg::GpuAsk::PerNode(2));
        let (a, _, _) = prepare_with(&argv(&["-t", "30", "-J", "cli"]), env).unwrap();
        let spec = a.job.to_spec().unwrap();
        assert_eq!(
            spec.time_limit,
            Some(30 * 60),
            "command line over environment"
        );
        assert_eq!(spec.name, "cli");
        // An invalid value is refused as the flag would be.
        let bad = |v: &str| (v == "SBATCH_TIMELIMIT").then(|| "soon".to_string());
        let (a, _, _) = prepare_with(&argv(&[]), bad).unwrap();
        assert!(a.job.to_spec().unwrap_err().contains("invalid time limit"));
        let bad = |v: &str| (v == "SBATCH_GPUS").then(|| "gpu:x".to_string());
        let (a, _, _) = prepare_with(&argv(&[]), bad).unwrap();
        assert!(a.job.to_spec().is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// For a name, a partition and a time limit each given by any of
        /// `#SBATCH`, its input variable and the command line, the job
        /// gets the command line's, else the variable's, else the
        /// script's (an empty variable counts as unset).
        #[test]
        fn the_command_line_beats_the_environment_which_beats_the_script(
            given in proptest::collection::vec(
                (proptest::option::of(1u32..10_000),
                 proptest::option::of(0u32..10_000),
                 proptest::option::of(1u32..10_000)),
                3,
            ),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("job.sh");
            // Each field: its flag and its input variable.
            let fields = [("-J", "SBATCH_JOB_NAME"), ("-p", "SBATCH_PARTITION"), ("-t", "SBATCH_TIMELIMIT")];
            let mut script = String::from("#!/bin/sh\n");
            let mut args: Vec<OsString> = vec!["sbatch".into()];
            let mut env: Vec<(String, String)> = Vec::new();
            for ((flag, var), (dir_v, env_v, cli_v)) in fields.iter().zip(&given) {
                if let Some(v) = dir_v {
                    script.push_str(&format!("#SBATCH {flag} {v}\n"));
                }
                if let Some(v) = env_v {
                    // 0 stands for an empty variable.
                    let text = if *v == 0 { String::new() } else { v.to_string() };
                    env.push((var.to_string(), text));
                }
                if let Some(v) = cli_v {
                    args.push(flag.into());
                    args.push(v.to_string().into());
                }
            }
            script.push_str("true\n");
            std::fs::write(&p, script).unwrap();
            args.push(p.clone().into());
            let (a, _, _) = prepare_with(&args, |v| {
                env.iter().find(|(k, _)| k == v).map(|(_, x)| x.clone())
            })
            .unwrap();
            let spec = a.job.to_spec().unwrap();
            let want: Vec<Option<u32>> = given
                .iter()
                .map(|(d, e, c)| c.or(e.filter(|&v| v > 0)).or(*d))
                .collect();
            proptest::prop_assert_eq!(
                spec.name,
                want[0].map_or("job.sh".to_string(), |v| v.to_string())
            );
            proptest::prop_assert_eq!(spec.partition, want[1].map(|v| v.to_string()));
            proptest::prop_assert_eq!(spec.time_limit, want[2].map(|m| u64::from(m) * 60));
        }
    }

    #[test]
    fn batch_jobs_are_requeueable_unless_told_and_the_last_word_wins() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("job.sh");
        std::fs::write(&p, "#!/bin/sh\n#SBATCH --no-requeue\ntrue\n").unwrap();
        let plain = dir.path().join("plain.sh");
        std::fs::write(&plain, "#!/bin/sh\ntrue\n").unwrap();
        let requeue = |args: &[&str], script: &std::path::Path, env: Option<&str>| {
            let mut argv: Vec<OsString> = vec!["sbatch".into()];
            argv.extend(args.iter().map(OsString::from));
            argv.push(script.into());
            let (a, _, _) =
                prepare_with(&argv, |v| env.filter(|e| *e == v).map(|_| "1".to_string())).unwrap();
            a.job.to_spec().unwrap().requeue
        };
        assert!(requeue(&[], &plain, None), "Slurm's default");
        assert!(!requeue(&[], &p, None));
        assert!(
            requeue(&["--requeue"], &p, None),
            "command line over #SBATCH"
        );
        assert!(!requeue(&["--requeue", "--no-requeue"], &plain, None));
        assert!(!requeue(&[], &plain, Some("SBATCH_NO_REQUEUE")));
        assert!(requeue(&["--requeue"], &plain, Some("SBATCH_NO_REQUEUE")));
        assert!(
            requeue(&[], &p, Some("SBATCH_REQUEUE")),
            "environment over #SBATCH"
        );
    }

    #[test]
    fn a_script_without_interpreter_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("job.sh");
        std::fs::write(&p, "echo hi\n").unwrap();
        let argv: Vec<OsString> = ["sbatch", p.to_str().unwrap()]
            .iter()
            .map(OsString::from)
            .collect();
        assert!(matches!(prepare(&argv), Err(Ok(m)) if m.contains("#!")));
        let argv: Vec<OsString> = ["sbatch", "--bogus"].iter().map(OsString::from).collect();
        assert!(matches!(prepare(&argv), Err(Err(1))));
    }
}
