//! `sinfo`: partitions and nodes, in Slurm's default, `-N` and `-R`
//! layouts.

use std::ffi::OsString;

use clap::Parser;
use corral_proto::msg::{NodeView, PartitionView, Request, Response};
use scheduler_core::hostlist;

use super::squeue::fit;
use super::{block_on, fail, parse, user_name, words};
use crate::client::Client;
use crate::timefmt::{limit, timestamp};

const CMD: &str = "sinfo";

/// View partitions and nodes.
#[derive(Debug, Parser)]
#[command(name = "sinfo", version, disable_help_flag = true)]
pub struct SinfoArgs {
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
    /// No header line.
    #[arg(short = 'h', long = "noheader")]
    pub noheader: bool,
    /// One line per node.
    #[arg(short = 'N', long = "Node")]
    pub node: bool,
    /// Why nodes are down or drained.
    #[arg(short = 'R', long = "list-reasons")]
    pub reasons: bool,
    /// Only these partitions.
    #[arg(short = 'p', long = "partition")]
    pub partition: Option<String>,
    /// Only nodes in these states (idle, mix, alloc, drain, drng, down).
    #[arg(short = 't', long = "states")]
    pub states: Option<String>,
}

fn state_matches(n: &NodeView, states: &Option<String>) -> bool {
    let Some(states) = states else { return true };
    let short = words::node_state(n);
    let base = short.trim_end_matches('*');
    states.split(',').any(|s| {
        let s = s.to_ascii_lowercase();
        s == base
            || (s == "drain" && (base == "drng" || base == "drain"))
            || (s == "allocated" && base == "alloc")
            || (s == "mixed" && base == "mix")
    })
}

/// The default layout: one row per partition and node state.
pub fn render_summary(parts: &[PartitionView], nodes: &[NodeView], a: &SinfoArgs) -> String {
    let mut rows: Vec<[String; 6]> = Vec::new();
    for p in parts {
        if a.partition
            .as_ref()
            .is_some_and(|f| !f.split(',').any(|x| x == p.name))
        {
            continue;
        }
        let name = format!("{}{}", p.name, if p.is_default { "*" } else { "" });
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for n in nodes
            .iter()
            .filter(|n| p.nodes.contains(&n.name) && state_matches(n, &a.states))
        {
            let st = words::node_state(n);
            match groups.iter_mut().find(|(s, _)| *s == st) {
                Some((_, names)) => names.push(n.name.clone()),
                None => groups.push((st, vec![n.name.clone()])),
            }
        }
        if groups.is_empty() && a.states.is_none() {
            groups.push(("n/a".into(), vec![]));
        }
        for (st, names) in groups {
            rows.push([
                name.clone(),
                "up".into(),
                limit(p.max_time, "infinite"),
                names.len().to_string(),
                st,
                hostlist::compress_sorted(&names),
            ]);
        }
    }
    let pw = rows
        .iter()
        .map(|r| r[0].len())
        .max()
        .unwrap_or(0)
        .max("PARTITION".len());
    let mut out = String::new();
    let mut line = |cols: [&str; 6]| {
        let l = format!(
            "{} {} {} {} {} {}",
            fit(cols[0], Some(pw), false),
            fit(cols[1], Some(5), true),
            fit(cols[2], Some(10), true),
            fit(cols[3], Some(6), true),
            fit(cols[4], Some(6), true),
            cols[5]
        );
        out.push_str(l.trim_end());
        out.push('\n');
    };
    if !a.noheader {
        line([
            "PARTITION",
            "AVAIL",
            "TIMELIMIT",
            "NODES",
            "STATE",
            "NODELIST",
        ]);
    }
    for r in &rows {
        line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]]);
    }
    out
}

/// `-N`: one row per node and partition.
pub fn render_nodes(parts: &[PartitionView], nodes: &[NodeView], a: &SinfoArgs) -> String {
    let mut rows = Vec::new();
    for n in nodes.iter().filter(|n| state_matches(n, &a.states)) {
        for p in parts.iter().filter(|p| p.nodes.contains(&n.name)) {
            if a.partition
                .as_ref()
                .is_some_and(|f| !f.split(',').any(|x| x == p.name))
            {
                continue;
            }
            let pname = format!("{}{}", p.name, if p.is_default { "*" } else { "" });
            rows.push((n.name.clone(), pname, words::node_state(n)));
        }
    }
    let nw = rows
        .iter()
        .map(|r| r.0.len())
        .max()
        .unwrap_or(0)
        .max("NODELIST".len());
    let pw = rows
        .iter()
        .map(|r| r.1.len())
        .max()
        .unwrap_or(0)
        .max("PARTITION".len());
    let mut out = String::new();
    let mut line = |a: &str, b: &str, c: &str, d: &str| {
        let l = format!(
            "{} {} {} {}",
            fit(a, Some(nw), false),
            fit(b, Some(6), true),
            fit(c, Some(pw), false),
            fit(d, Some(6), false)
        );
        out.push_str(l.trim_end());
        out.push('\n');
    };
    if !a.noheader {
        line("NODELIST", "NODES", "PARTITION", "STATE");
    }
    for (n, p, s) in &rows {
        line(n, "1", p, s);
    }
    out
}

/// `-R`: nodes grouped by the reason they are out of service.
pub fn render_reasons(nodes: &[NodeView], a: &SinfoArgs) -> String {
    let mut groups: Vec<(String, String, String, Vec<String>)> = Vec::new();
    for n in nodes {
        let Some(reason) = &n.reason else { continue };
        let user = n
            .reason_user
            .map(user_name)
            .unwrap_or_else(|| "root".into());
        let at = n
            .reason_time
            .map(timestamp)
            .unwrap_or_else(|| "Unknown".into());
        match groups
            .iter_mut()
            .find(|g| g.0 == *reason && g.1 == user && g.2 == at)
        {
            Some(g) => g.3.push(n.name.clone()),
            None => groups.push((reason.clone(), user, at, vec![n.name.clone()])),
        }
    }
    let mut out = String::new();
    let mut line = |a: &str, b: &str, c: &str, d: &str| {
        let l = format!(
            "{} {} {} {}",
            fit(a, Some(20), false),
            fit(b, Some(9), false),
            fit(c, Some(19), false),
            d
        );
        out.push_str(l.trim_end());
        out.push('\n');
    };
    if !a.noheader {
        line("REASON", "USER", "TIMESTAMP", "NODELIST");
    }
    for (r, u, t, names) in &groups {
        line(r, u, t, &hostlist::compress_sorted(names));
    }
    out
}

pub fn main(args: &[OsString]) -> i32 {
    let a: SinfoArgs = match parse(CMD, args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    block_on(CMD, async move {
        let mut c = match Client::connect().await {
            Ok(c) => c,
            Err(e) => return fail(CMD, e),
        };
        let nodes = match c.ok(Request::Nodes).await {
            Ok(Response::Nodes(n)) => n,
            Ok(other) => return fail(CMD, format!("unexpected answer {other:?}")),
            Err(e) => return fail(CMD, e),
        };
        let parts = match c.ok(Request::Partitions).await {
            Ok(Response::Partitions(p)) => p,
            Ok(other) => return fail(CMD, format!("unexpected answer {other:?}")),
            Err(e) => return fail(CMD, e),
        };
        let out = if a.reasons {
            render_reasons(&nodes, &a)
        } else if a.node {
            render_nodes(&parts, &nodes, &a)
        } else {
            render_summary(&parts, &nodes, &a)
        };
        super::emit(CMD, &out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_proto::msg::NodeState;

    fn node(name: &str, state: NodeState) -> NodeView {
        NodeView {
            name: name.into(),
            state,
            not_responding: false,
            cpus: 4,
            alloc_cpus: 0,
            memory_mb: 1000,
            alloc_memory_mb: 0,
            gpus: 8,
            alloc_gpus: 0,
            gpu_model: None,
            features: vec![],
            partitions: vec!["gpu".into()],
            reason: (state == NodeState::Drained).then(|| "bad gpu".to_string()),
            reason_user: Some(0),
            reason_time: Some(0),
            boot_time: 0,
            last_seen: 0,
            jobs: vec![],
        }
    }

    fn part() -> PartitionView {
        PartitionView {
            name: "gpu".into(),
            is_default: true,
            nodes_expr: "worker-[0-3]".into(),
            nodes: (0..4).map(|i| format!("worker-{i}")).collect(),
            max_time: None,
            default_time: None,
            priority_tier: 1,
            total_cpus: 16,
            total_gpus: 32,
        }
    }

    fn args(extra: &[&str]) -> SinfoArgs {
        SinfoArgs::try_parse_from(std::iter::once("sinfo").chain(extra.iter().copied())).unwrap()
    }

    #[test]
    fn summary_groups_by_state() {
        let nodes = vec![
            node("worker-0", NodeState::Idle),
            node("worker-1", NodeState::Idle),
            node("worker-2", NodeState::Mixed),
            node("worker-3", NodeState::Drained),
        ];
        let out = render_summary(&[part()], &nodes, &args(&[]));
        assert_eq!(
            out,
            "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST\n\
             gpu*         up   infinite      2   idle worker-[0-1]\n\
             gpu*         up   infinite      1    mix worker-2\n\
             gpu*         up   infinite      1  drain worker-3\n"
        );
        let out = render_summary(&[part()], &nodes, &args(&["-h", "-t", "idle"]));
        assert_eq!(
            out,
            "gpu*         up   infinite      2   idle worker-[0-1]\n"
        );
    }

    #[test]
    fn node_and_reason_layouts() {
        let nodes = vec![
            node("worker-0", NodeState::Idle),
            node("worker-3", NodeState::Drained),
        ];
        let out = render_nodes(&[part()], &nodes, &args(&["-N"]));
        assert_eq!(
            out,
            "NODELIST  NODES PARTITION STATE\nworker-0      1 gpu*      idle\nworker-3      1 gpu*      drain\n"
        );
        let out = render_reasons(&nodes, &args(&["-R"]));
        assert_eq!(
            out,
            "REASON               USER      TIMESTAMP           NODELIST\nbad gpu              root      1970-01-01T00:00:00 worker-3\n"
        );
    }
}
