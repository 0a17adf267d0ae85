//! How a CLI reaches the cluster: its node's agent, over a Unix socket.
//! The agent adds the caller's credential and relays to ctld.

use std::path::PathBuf;
use std::time::Duration;

use corral_proto::msg::{
    read_answer_each, read_answer_views, read_response, AcctJob, AcctQuery, Answer, JobFilter,
    JobView, LocalRequest, Request, Response,
};
use corral_proto::{write_frame, WireError};
use tokio::net::UnixStream;

/// Where the local agent listens: `$CORRAL_AGENT_SOCKET`, or the default.
pub fn socket_path() -> PathBuf {
    std::env::var_os("CORRAL_AGENT_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/corral/agent.sock"))
}

/// Why a call did not get an answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("Unable to contact slurm controller (cannot reach the local corral-agent at {path}: {source})")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Unable to contact slurm controller ({0})")]
    Wire(#[from] WireError),
    #[error("Unable to contact slurm controller (the local corral-agent closed the connection)")]
    Closed,
    #[error("Unable to contact slurm controller (no answer from the local corral-agent in {0} s)")]
    Timeout(u64),
}

/// How long one call may wait for its answer: longer than the agent's own
/// wait on the controller, so the agent's message wins when it has one.
/// `CORRAL_TIMEOUT` (seconds) overrides it.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(20);

fn call_timeout() -> Duration {
    std::env::var("CORRAL_TIMEOUT")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|&s| s > 0)
        .map_or(CALL_TIMEOUT, Duration::from_secs)
}

/// How long connecting to the local agent may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Replaces control characters and the others [`corral_proto::unsafe_char`]
/// names with visible escapes (`\n`, `\x1b`, `\u{202e}`).
/// Names, paths and reasons come from other users and must not reach a
/// terminal raw or forge lines in key=value output.
pub fn escape_controls(s: &mut String) {
    if printable(s) {
        return;
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if corral_proto::unsafe_char(c) => out.push_str(&format!("\\u{{{:04x}}}", c as u32)),
            c => out.push(c),
        }
    }
    *s = out;
}

/// Whether a text has no control character to escape.
fn printable(s: &str) -> bool {
    // Printable ASCII, nearly every text: a byte scan says so.
    s.bytes().all(|b| (0x20..0x7f).contains(&b)) || !s.chars().any(corral_proto::unsafe_char)
}

/// Every text of a view that [`escape_view`] escapes.
fn texts<S: std::ops::Deref<Target = str>>(j: &JobView<S>) -> impl Iterator<Item = &str> {
    let ask = j.ask.as_deref();
    [&j.name, &j.partition, &j.work_dir, &j.command]
        .into_iter()
        .map(|s| &**s)
        .chain(
            [&j.stdout, &j.stderr, &j.failure, &j.comment, &j.mail_user]
                .into_iter()
                .flatten()
                .map(|s| &**s),
        )
        .chain(
            ask.into_iter()
                .flat_map(|a| [&a.account, &a.features, &a.qos])
                .flatten()
                .map(String::as_str),
        )
        .chain(j.steps.iter().map(|st| st.name.as_str()))
}

/// A view with every text that another user may have written escaped
/// (those [`texts`] lists).
fn escape_view(j: &mut JobView) {
    for s in [
        &mut j.name,
        &mut j.partition,
        &mut j.work_dir,
        &mut j.command,
    ] {
        escape_controls(s);
    }
    for s in [
        &mut j.stdout,
        &mut j.stderr,
        &mut j.failure,
        &mut j.comment,
        &mut j.mail_user,
    ]
    .into_iter()
    .flatten()
    {
        escape_controls(s);
    }
    if let Some(a) = j.ask.as_deref_mut() {
        for s in [&mut a.account, &mut a.features, &mut a.qos]
            .into_iter()
            .flatten()
        {
            escape_controls(s);
        }
    }
    for st in &mut j.steps {
        escape_controls(&mut st.name);
    }
}

/// An answer with every text that another user may have written escaped.
fn escaped(mut resp: Response) -> Response {
    match &mut resp {
        Response::Jobs(jobs) => jobs.iter_mut().for_each(escape_view),
        Response::Accounting { jobs, .. } => {
            for j in jobs {
                for s in [
                    &mut j.name,
                    &mut j.partition,
                    &mut j.account,
                    &mut j.work_dir,
                    &mut j.comment,
                ] {
                    escape_controls(s);
                }
                for st in &mut j.steps {
                    escape_controls(&mut st.name);
                }
            }
        }
        Response::Nodes(nodes) => {
            for n in nodes {
                n.reason.iter_mut().for_each(escape_controls);
                n.features.iter_mut().for_each(escape_controls);
            }
        }
        // Lines of a refusal stay lines (scancel reports one per job).
        Response::Error(e) => {
            let mut lines: Vec<String> = e.split('\n').map(str::to_string).collect();
            lines.iter_mut().for_each(escape_controls);
            *e = lines.join("\n");
        }
        _ => {}
    }
    resp
}

/// An exchange with the agent, given [`call_timeout`] to end in.
async fn bounded<T>(
    exchange: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    let limit = call_timeout();
    tokio::time::timeout(limit, exchange)
        .await
        .map_err(|_| ClientError::Timeout(limit.as_secs()))?
}

/// A connection to the local agent; calls go one after another.
#[derive(Debug)]
pub struct Client {
    stream: UnixStream,
}

impl Client {
    pub async fn connect() -> Result<Client, ClientError> {
        Client::connect_to(&socket_path()).await
    }

    pub async fn connect_to(path: &std::path::Path) -> Result<Client, ClientError> {
        let path = path.to_path_buf();
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(&path)).await {
            Ok(r) => r.map_err(|source| ClientError::Connect { path, source })?,
            Err(_) => return Err(ClientError::Timeout(CONNECT_TIMEOUT.as_secs())),
        };
        Ok(Client { stream })
    }

    /// Sends a request to ctld and returns its answer, refusals included.
    pub async fn call(&mut self, req: Request) -> Result<Response, ClientError> {
        self.local(LocalRequest::Relay(req)).await
    }

    /// One exchange with the agent, bounded in time: a stopped agent (or
    /// one whose controller is gone) must not hang the command.
    pub async fn local(&mut self, req: LocalRequest) -> Result<Response, ClientError> {
        let mut parts = Vec::new();
        let answer = match self
            .exchange(req, |p| parts.push(std::mem::take(p)))
            .await?
        {
            Answer::Listing(_) => Answer::Listing(parts),
            other => other,
        };
        Ok(escaped(answer.into_response()))
    }

    /// One exchange, bounded in time: a listing's parts handed to `part`
    /// as each arrives (not yet escaped), any other answer returned.
    async fn exchange(
        &mut self,
        req: LocalRequest,
        part: impl FnMut(&mut Vec<JobView>),
    ) -> Result<Answer, ClientError> {
        bounded(async {
            write_frame(&mut self.stream, &req).await?;
            read_answer_each(&mut self.stream, part)
                .await?
                .ok_or(ClientError::Closed)
        })
        .await
    }

    /// Every job the filter selects (a listing comes whole, in parts).
    pub async fn jobs(&mut self, f: JobFilter) -> Result<Vec<JobView>, String> {
        match self.ok(Request::Jobs(f)).await? {
            Response::Jobs(all) => Ok(all),
            other => Err(format!("unexpected answer {other:?}")),
        }
    }

    /// [`Client::jobs`] one view at a time, each handed to `view` as it
    /// is decoded (escaped, its texts borrowed from the frame it came
    /// in), so the caller works on the listing while the rest of it comes
    /// (squeue renders each job's line).
    pub async fn job_views_each(
        &mut self,
        f: JobFilter,
        view: impl FnMut(&JobView<&str>),
    ) -> Result<(), String> {
        bounded(async {
            write_frame(&mut self.stream, &LocalRequest::Relay(Request::Jobs(f))).await?;
            Ok(read_job_views(&mut self.stream, view).await)
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// Every accounting record the query selects, page by page.
    pub async fn accounting(&mut self, mut q: AcctQuery) -> Result<Vec<AcctJob>, String> {
        let mut all = Vec::new();
        loop {
            match self.ok(Request::Accounting(q.clone())).await? {
                Response::Accounting { jobs, next } => {
                    all.extend(jobs);
                    match next {
                        Some(after) if after > q.after => q.after = after,
                        _ => return Ok(all),
                    }
                }
                other => return Err(format!("unexpected answer {other:?}")),
            }
        }
    }

    /// Like [`Client::call`], with a refusal as `Err(message)`.
    pub async fn ok(&mut self, req: Request) -> Result<Response, String> {
        match self.call(req).await {
            Ok(Response::Error(e)) => Err(e),
            Ok(r) => Ok(r),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// [`Client::job_views_each`]'s reading of the answer, from any stream
/// (the `squeue` bench reads a listing from memory): each view handed to
/// `view` as it is decoded, its texts borrowed from the frame
/// ([`read_answer_views`]). A view with a text to escape is handed on
/// escaped, from texts of its own.
pub async fn read_job_views<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
    mut view: impl FnMut(&JobView<&str>),
) -> Result<(), String> {
    let answer = read_answer_views(r, |v| {
        if texts(v).all(printable) {
            return view(v);
        }
        let mut own = v.clone().into_owned();
        escape_view(&mut own);
        // The escaped texts held apart, the view borrowing them again.
        let mut held = Vec::new();
        let at = own.map_texts(|t| {
            held.push(t);
            held.len() - 1
        });
        view(&at.map_texts(|i| held[i].as_str()));
    })
    .await
    .map_err(|e| ClientError::from(e).to_string())?
    .ok_or_else(|| ClientError::Closed.to_string())?;
    listing_end(answer)
}

/// What ends a listing read part by part: nothing more, or the refusal
/// that broke it off.
fn listing_end(answer: Answer) -> Result<(), String> {
    match answer {
        Answer::Listing(_) => Ok(()),
        Answer::Other(r) => match escaped(r) {
            Response::Error(e) => Err(e),
            other => Err(format!("unexpected answer {other:?}")),
        },
    }
}

/// Sends many requests back to back on one connection to the agent at
/// `path` and collects the answers in order (for benches and bulk tools).
pub async fn pipeline_to(
    path: &std::path::Path,
    reqs: Vec<Request>,
) -> Result<Vec<Response>, ClientError> {
    let path = path.to_path_buf();
    let stream = UnixStream::connect(&path)
        .await
        .map_err(|source| ClientError::Connect { path, source })?;
    let (mut r, mut w) = stream.into_split();
    let n = reqs.len();
    let writer = tokio::spawn(async move {
        for req in reqs {
            write_frame(&mut w, &LocalRequest::Relay(req)).await?;
        }
        Ok::<_, WireError>(w)
    });
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(read_response(&mut r).await?.ok_or(ClientError::Closed)?);
    }
    let _ = writer.await;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every text `escape_view` escapes is one `texts` lists, so a view
    /// read borrowed is escaped where one read whole would be; and read
    /// borrowed, a hostile view comes out escaped.
    #[tokio::test]
    async fn borrowed_views_are_escaped_as_whole_ones() {
        let hostile = "x\u{1b}[2J";
        let base = crate::cli::squeue::tests::job(7, corral_proto::msg::JobState::Pending);
        let mut one_each: Vec<JobView> = Vec::new();
        let mut set = |f: &dyn Fn(&mut JobView)| {
            let mut v = base.clone();
            f(&mut v);
            one_each.push(v);
        };
        set(&|v| v.name = hostile.into());
        set(&|v| v.partition = hostile.into());
        set(&|v| v.work_dir = hostile.into());
        set(&|v| v.command = hostile.into());
        set(&|v| v.stdout = Some(hostile.into()));
        set(&|v| v.stderr = Some(hostile.into()));
        set(&|v| v.failure = Some(hostile.into()));
        set(&|v| v.comment = Some(hostile.into()));
        set(&|v| v.mail_user = Some(hostile.into()));
        for f in [0, 1, 2] {
            set(&|v| {
                let mut ask = corral_proto::msg::JobAsk::default();
                *[&mut ask.account, &mut ask.features, &mut ask.qos][f] = Some(hostile.into());
                v.ask = Some(Box::new(ask));
            });
        }
        set(&|v| {
            v.steps = vec![corral_proto::msg::StepView {
                id: corral_proto::msg::StepId(0),
                name: hostile.into(),
                nodes: Vec::new(),
                tasks: 1,
                cpus: 1,
                start: 0,
            }]
        });
        for v in &one_each {
            let mut escaped = v.clone();
            escape_view(&mut escaped);
            assert_ne!(&escaped, v, "escape_view leaves one alone");
            assert!(!texts(v).all(printable), "texts misses {v:?}");
            assert!(texts(&escaped).all(printable));
        }
        let mut body = Vec::new();
        for v in &one_each {
            corral_proto::msg::encode_view(v, &mut body).unwrap();
        }
        let frame = corral_proto::msg::listing_frame(true, false, one_each.len(), &body).unwrap();
        let mut got = Vec::new();
        read_job_views(&mut frame.as_slice(), |v| got.push(v.clone().into_owned()))
            .await
            .unwrap();
        let want: Vec<JobView> = one_each
            .into_iter()
            .map(|mut v| {
                escape_view(&mut v);
                v
            })
            .collect();
        assert_eq!(got, want);
        assert_eq!(got[0].name, "x\\x1b[2J");
    }

    #[test]
    fn control_characters_become_visible_escapes() {
        let mut s = "evil\u{1b}[2J\nJobId=1 UserId=root(0)\t\u{7}".to_string();
        escape_controls(&mut s);
        assert_eq!(s, "evil\\x1b[2J\\nJobId=1 UserId=root(0)\\t\\x07");
        let mut plain = "train-π".to_string();
        escape_controls(&mut plain);
        assert_eq!(plain, "train-π");
        // A right-to-left override would show `gpj.exe` as `exe.jpg`; a
        // line separator breaks the line on some terminals.
        let mut bidi = "job\u{202e}gpj.exe\u{2028}x\u{2067}".to_string();
        escape_controls(&mut bidi);
        assert_eq!(bidi, "job\\u{202e}gpj.exe\\u{2028}x\\u{2067}");
        // A refusal keeps its lines; each line is escaped.
        match escaped(Response::Error("a\u{1b}\nb".into())) {
            Response::Error(e) => assert_eq!(e, "a\\x1b\nb"),
            other => panic!("{other:?}"),
        }
    }
    /// A listing frame made of views encoded one by one, texts borrowed
    /// (as ctld makes it), is byte for byte the frame of the owned views'
    /// `Response`, and reads back as them; so is a compact one, its bare
    /// views sent bare and the rest whole.
    #[test]
    fn a_listing_of_borrowed_views_is_the_listing_of_owned_ones() {
        use crate::cli::squeue::tests::job;
        use corral_proto::frame::{decode_body, encode};
        use corral_proto::msg::{encode_in_listing, listing_frame, JobState, JobView, Listed};
        use std::borrow::Cow;
        let mut views: Vec<JobView> = (1..300).map(|id| job(id, JobState::Pending)).collect();
        views[3].stdout = Some("out-%j".into());
        views[4].comment = Some("note".into());
        views[5].nodes = vec!["n1".into(), "n2".into()];
        // Every other view bare, as ctld makes them for squeue's default
        // layout, the one at 5 with its nodes.
        for v in views.iter_mut().skip(5).step_by(2) {
            (v.num_tasks, v.cpus_per_task, v.num_cpus) = (0, 0, 0);
            (v.work_dir, v.command, v.batch) = (String::new(), String::new(), false);
            v.ask = None;
            v.restarts = 2;
        }
        assert!(views[5].is_bare() && !views[6].is_bare() && !views[4].is_bare());
        let listed: Vec<Listed> = views.iter().map(Listed::of).collect();
        // ctld's views borrow most texts and own some (a command made
        // of a path and arguments); a Cow writes as a str either way.
        let borrowed: Vec<JobView<Cow<'_, str>>> = views
            .iter()
            .map(|v| v.clone().map_texts(Cow::Owned))
            .collect();
        for (compact, last) in [(false, false), (false, true), (true, false), (true, true)] {
            let mut body = Vec::new();
            for v in &borrowed {
                encode_in_listing(compact, v, &mut body).unwrap();
            }
            let made = listing_frame(last, compact, borrowed.len(), &body).unwrap();
            let whole = match (compact, last) {
                (false, true) => Response::Jobs(views.clone()),
                (false, false) => Response::JobsPart(views.clone()),
                (true, true) => Response::CompactJobs(listed.clone()),
                (true, false) => Response::CompactJobsPart(listed.clone()),
            };
            assert_eq!(made, encode(&whole).unwrap(), "{compact} {last}");
            assert_eq!(Response::frame_is_part(&made), !last);
            let back = match decode_body::<Response>(&made[4..]).unwrap() {
                Response::Jobs(back) | Response::JobsPart(back) => back,
                Response::CompactJobs(back) | Response::CompactJobsPart(back) => {
                    back.into_iter().map(Listed::into_view).collect()
                }
                other => panic!("{other:?}"),
            };
            assert_eq!(back, views);
            // Read as squeue reads it: each view borrowed.
            let mut got = Vec::new();
            let framed = if last {
                made
            } else {
                let mut f = made;
                f.extend(listing_frame(true, compact, 0, &[]).unwrap());
                f
            };
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(read_job_views(&mut framed.as_slice(), |v| {
                got.push(v.clone().into_owned())
            }))
            .unwrap();
            assert_eq!(got, views, "{compact} {last}");
        }
        // A bare view is 17 bytes shorter (18 fields of a byte each left
        // out, a tag added), a whole one a byte longer.
        let size = |compact: bool| {
            let mut body = Vec::new();
            for v in &borrowed {
                encode_in_listing(compact, v, &mut body).unwrap();
            }
            body.len()
        };
        let bare = views.iter().filter(|v| v.is_bare()).count();
        assert_eq!(bare, 147);
        assert_eq!(size(true) + 17 * bare, size(false) + (views.len() - bare));
        let empty = listing_frame(true, false, 0, &[]).unwrap();
        assert_eq!(empty, encode(&Response::Jobs(Vec::new())).unwrap());
    }

    /// A listing comes in parts: the reader puts them together, a relay
    /// tells a part from the last frame without decoding it, and a
    /// listing that breaks off is an error, never a short listing.
    #[test]
    fn a_listing_in_parts_reads_as_one_answer() {
        use crate::cli::squeue::tests::job;
        use corral_proto::frame::encode;
        use corral_proto::msg::{JobState, Listed};
        use tokio::io::AsyncWriteExt;
        let view = |id| job(id, JobState::Pending);
        let part = |ids: std::ops::Range<u64>| Response::JobsPart(ids.map(view).collect());
        let frames = |msgs: &[Response]| -> Vec<u8> {
            msgs.iter().flat_map(|m| encode(m).unwrap()).collect()
        };
        assert!(Response::frame_is_part(&encode(&part(1..3)).unwrap()));
        assert!(Response::frame_is_part(&encode(&part(0..0)).unwrap()));
        let compact_part = Response::CompactJobsPart(vec![Listed::Whole(view(1))]);
        assert!(Response::frame_is_part(&encode(&compact_part).unwrap()));
        for whole in [
            Response::Jobs(vec![view(1)]),
            Response::Jobs(Vec::new()),
            Response::CompactJobs(vec![Listed::Whole(view(1))]),
            Response::CompactJobs(Vec::new()),
            Response::Error("x".into()),
            Response::Done,
            Response::Busy("y".into()),
        ] {
            assert!(
                !Response::frame_is_part(&encode(&whole).unwrap()),
                "{whole:?}"
            );
        }
        let read = |bytes: Vec<u8>| {
            tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap()
                .block_on(async move {
                    let (mut w, mut r) = tokio::io::duplex(1 << 16);
                    let writer = tokio::spawn(async move {
                        w.write_all(&bytes).await.unwrap();
                    });
                    let got = read_response(&mut r).await;
                    writer.await.unwrap();
                    got
                })
        };
        let ids = |r: Response| match r {
            Response::Jobs(v) => v.iter().map(|j| j.id.0).collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        let whole = read(frames(&[
            part(1..4),
            part(4..5),
            Response::Jobs(vec![view(5)]),
        ]));
        assert_eq!(ids(whole.unwrap().unwrap()), vec![1, 2, 3, 4, 5]);
        let alone = read(frames(&[Response::Jobs(vec![view(9)])]));
        assert_eq!(ids(alone.unwrap().unwrap()), vec![9]);
        let compact = read(frames(&[
            Response::CompactJobsPart(vec![Listed::Whole(view(1))]),
            Response::CompactJobs(vec![Listed::Whole(view(2))]),
        ]));
        assert_eq!(ids(compact.unwrap().unwrap()), vec![1, 2]);
        let empty_end = read(frames(&[part(1..3), Response::Jobs(Vec::new())]));
        assert_eq!(ids(empty_end.unwrap().unwrap()), vec![1, 2]);
        match read(frames(&[part(1..3), Response::Error("broke".into())])) {
            Ok(Some(Response::Error(e))) => assert_eq!(e, "broke"),
            other => panic!("{other:?}"),
        }
        assert!(read(frames(&[part(1..3)])).is_err(), "parts without an end");
        assert!(read(Vec::new()).unwrap().is_none());
    }
}
