//! `sinfo`: partitions and nodes through one format engine, as Slurm's:
//! each layout (default, `-N`, `-l`, `-s`, `-R`, `-o`, `-O`) is a format,
//! and nodes of a partition share a line when every field the format
//! prints (but the counting ones: node list, counts) is the same for them.

use std::collections::HashMap;
use std::ffi::OsString;

use clap::Parser;
use corral_proto::msg::{NodeState, NodeView, PartitionView, Request, Response};
use scheduler_core::hostlist;

use super::format::Token;
use super::squeue::fit;
use super::{block_on, fail, parse, user_name, words};
use crate::client::Client;
use crate::ctld::server::now;
use crate::timefmt::{elapsed, strftime, timestamp};

const CMD: &str = "sinfo";

/// Slurm's layouts.
pub const DEFAULT_FORMAT: &str = "%#P %.5a %.10l %.6D %.6t %N";
pub const NODE_FORMAT: &str = "%#N %.6D %.#P %6t";
pub const LONG_FORMAT: &str = "%#P %.5a %.10l %.10s %.4r %.8h %.10g %.6D %.11T %N";
pub const NODE_LONG_FORMAT: &str = "%#N %.6D %.#P %.11T %.4c %.8z %.6m %.8d %.6w %.8f %20E";
pub const SUMMARY_FORMAT: &str = "%#P %.5a %.10l %.16F %N";
pub const REASON_FORMAT: &str = "%20E %9u %19H %N";
pub const REASON_LONG_FORMAT: &str = "%20E %12U %19H %6t %N";
/// The width of a `-O` field that names none.
const FORMAT2_WIDTH: usize = 20;

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
    /// More fields.
    #[arg(short = 'l', long = "long")]
    pub long: bool,
    /// One line per partition, nodes counted by state.
    #[arg(short = 's', long = "summarize")]
    pub summarize: bool,
    /// Only these partitions.
    #[arg(short = 'p', long = "partition")]
    pub partition: Option<String>,
    /// Only these nodes (a hostlist).
    #[arg(short = 'n', long = "nodes")]
    pub nodes: Option<String>,
    /// Only nodes in these states (idle, mix, alloc, drain, drng, down, …).
    #[arg(short = 't', long = "states")]
    pub states: Option<String>,
    /// Only responding nodes.
    #[arg(short = 'r', long = "responding")]
    pub responding: bool,
    /// Only nodes not responding.
    #[arg(short = 'd', long = "dead")]
    pub dead: bool,
    /// Group only nodes whose CPUs, memory and disk are the same.
    #[arg(short = 'e', long = "exact")]
    pub exact: bool,
    /// Output format: `%` codes with optional `.` (right-justify) and width.
    #[arg(short = 'o', long = "format")]
    pub format: Option<String>,
    /// Output format: field names, each `name[:[.]width]`, comma separated.
    #[arg(short = 'O', long = "Format")]
    pub format2: Option<String>,
    /// Print again every so many seconds.
    #[arg(short = 'i', long = "iterate")]
    pub iterate: Option<u64>,
    /// Every partition, hidden ones too (none is hidden).
    #[arg(short = 'a', long = "all")]
    pub all: bool,
}

/// The state names `-t` takes, as Slurm's list has them.
const STATE_NAMES: &str = "unknown,down,idle,allocated,?,mixed,future,drain,drained,draining,no_respond,reserved,perfctrs,cloud,completing,powering_down,powered_down,power_down,powering_up,fail,maint,reboot,reboot^,unknown";

/// Whether a node is in one of the `-t` states (checked by [`states_ok`]).
fn state_matches(n: &NodeView, states: &[String]) -> bool {
    if states.is_empty() {
        return true;
    }
    // A FAIL is a drain in the state, not in Slurm's flags.
    let drain = !n.fail;
    states.iter().any(|s| match s.as_str() {
        "idle" => n.state == NodeState::Idle,
        "mix" | "mixed" => n.state == NodeState::Mixed,
        "alloc" | "allocated" => n.state == NodeState::Allocated,
        "drain" => drain && matches!(n.state, NodeState::Draining | NodeState::Drained),
        "drained" => drain && n.state == NodeState::Drained,
        "draining" | "drng" => drain && n.state == NodeState::Draining,
        "down" => n.state == NodeState::Down,
        "no_respond" => n.not_responding,
        "completing" | "comp" => n.completing,
        "fail" => n.fail,
        _ => false,
    })
}

/// The `-t` list, lowercased and checked against Slurm's names.
fn states_ok(list: &Option<String>) -> Result<Vec<String>, String> {
    let Some(list) = list else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for s in list.split(',').filter(|s| !s.is_empty()) {
        let l = s.to_ascii_lowercase();
        let known = STATE_NAMES.split(',').any(|k| k == l)
            || ["mix", "alloc", "drng", "comp", "all"].contains(&l.as_str());
        if !known {
            return Err(format!(
                "Bad state string: \"{s}\"\nvalid states: {STATE_NAMES}"
            ));
        }
        if l == "all" {
            return Ok(Vec::new());
        }
        out.push(l);
    }
    Ok(out)
}

/// One column of a layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    /// `%[.][width]c`; `#` as the width: as wide as the widest value (and
    /// its header).
    Field {
        right: bool,
        width: Option<usize>,
        widest: bool,
        code: char,
    },
}

/// The `-O` names and the `%` code each prints.
const NAMES: &[(&str, char)] = &[
    ("allocnodes", 'S'),
    ("available", 'a'),
    ("cluster", 'V'),
    ("cores", 'Y'),
    ("cpus", 'c'),
    ("cpusload", 'O'),
    ("cpusstate", 'C'),
    ("defaulttime", 'L'),
    ("disk", 'd'),
    ("features", 'f'),
    ("featuresact", 'b'),
    ("freemem", 'e'),
    ("gres", 'G'),
    ("groups", 'g'),
    ("maxcpuspernode", 'B'),
    ("memory", 'm'),
    ("nodeaddr", 'o'),
    ("nodeai", 'A'),
    ("nodeaiot", 'F'),
    ("nodehost", 'n'),
    ("nodelist", 'N'),
    ("nodes", 'D'),
    ("oversubscribe", 'h'),
    ("partition", 'P'),
    ("partitionname", 'R'),
    ("prioritytier", 'p'),
    ("reason", 'E'),
    ("reasontimestamp", 'H'),
    ("reasonuser", 'u'),
    ("root", 'r'),
    ("size", 's'),
    ("socketcorethread", 'z'),
    ("sockets", 'X'),
    ("statecompact", 't'),
    ("statelong", 'T'),
    ("threads", 'Z'),
    ("time", 'l'),
    ("tmpdisk", 'd'),
    ("version", 'v'),
    ("weight", 'w'),
];

fn header(code: char) -> &'static str {
    match code {
        'a' => "AVAIL",
        'A' => "NODES(A/I)",
        'b' => "ACTIVE_FEATURES",
        'B' => "MAX_CPUS_PER_NODE",
        'c' => "CPUS",
        'C' => "CPUS(A/I/O/T)",
        'd' => "TMP_DISK",
        'D' => "NODES",
        'e' => "FREE_MEM",
        'E' => "REASON",
        'f' => "AVAIL_FEATURES",
        'F' => "NODES(A/I/O/T)",
        'g' => "GROUPS",
        'G' => "GRES",
        'h' => "OVERSUBSCRIBE",
        'H' => "TIMESTAMP",
        'l' => "TIMELIMIT",
        'L' => "DEFAULTTIME",
        'm' => "MEMORY",
        'n' => "HOSTNAMES",
        'N' => "NODELIST",
        'o' => "NODE_ADDR",
        'O' => "CPU_LOAD",
        'p' => "PRIO_TIER",
        'P' | 'R' => "PARTITION",
        'r' => "ROOT",
        's' => "JOB_SIZE",
        'S' => "ALLOCNODES",
        't' | 'T' => "STATE",
        'u' => "USER",
        'U' => "USER",
        'v' => "VERSION",
        'V' => "CLUSTER",
        'w' => "WEIGHT",
        'X' => "SOCKETS",
        'Y' => "CORES",
        'Z' => "THREADS",
        'z' => "S:C:T",
        _ => "?",
    }
}

const KNOWN: &str = "aAbBcCdDeEfFgGhHlLmnNoOpPrRsStTuUvVwXYZz";

/// Parses a `-o` format.
pub fn parse_format(s: &str) -> Result<Vec<Piece>, String> {
    super::format::tokens(s)
        .into_iter()
        .map(|t| match t {
            Token::Text(t) => Ok(Piece::Text(t)),
            Token::Code { code, .. } if !KNOWN.contains(code) => {
                Err(format!("Invalid node format specification: {code}"))
            }
            Token::Code {
                right,
                widest,
                width,
                code,
            } => Ok(Piece::Field {
                right,
                width,
                widest,
                code,
            }),
        })
        .collect()
}

/// Parses a `-O` format: `name[:[.][width][suffix]]`, comma separated; 20
/// wide unless a width is given, `:0` as wide as the value.
pub fn parse_format2(s: &str) -> Result<Vec<Piece>, String> {
    let mut out = Vec::new();
    for item in super::format::items(s, FORMAT2_WIDTH) {
        let lower = item.name.to_ascii_lowercase();
        let code = NAMES
            .iter()
            .find(|(n, _)| *n == lower)
            .map(|(_, c)| *c)
            .ok_or_else(|| format!("Invalid node format specification: {}", item.name))?;
        out.push(Piece::Field {
            right: item.right,
            width: item.width,
            widest: false,
            code,
        });
        if !item.suffix.is_empty() {
            out.push(Piece::Text(item.suffix.to_string()));
        }
    }
    Ok(out)
}

/// Whether a node counts as out of service (sinfo's "other").
fn other(n: &NodeView) -> bool {
    n.not_responding
        || matches!(
            n.state,
            NodeState::Draining | NodeState::Drained | NodeState::Down
        )
}

/// Slurm's long state word, `*` when not responding.
fn state_long(n: &NodeView) -> String {
    format!(
        "{}{}",
        words::node_state_long(n),
        if n.not_responding { "*" } else { "" }
    )
}

/// The order Slurm lists states in: its state's number, with the drain and
/// not-responding flags above every base state, largest first.
fn state_rank(n: &NodeView) -> u32 {
    let base = match n.state {
        NodeState::Down => 1,
        NodeState::Idle | NodeState::Drained => 2,
        NodeState::Allocated => 3,
        NodeState::Mixed | NodeState::Draining => 5,
    };
    // A FAIL is a drain here, but Slurm's flag is its own.
    let drained = matches!(n.state, NodeState::Draining | NodeState::Drained);
    let flag = |on: bool, bit: u32| if on { bit } else { 0 };
    base + flag(drained && !n.fail, 0x200)
        + flag(n.completing, 0x400)
        + flag(n.not_responding, 0x800)
        + flag(n.fail, 0x2000)
}

/// A field's value for one node of a partition (`None` for `-R` lines).
fn value(code: char, p: Option<&PartitionView>, n: &NodeView) -> String {
    let reason = || n.reason.clone();
    match code {
        'a' => "up".into(),
        'b' | 'f' => {
            if n.features.is_empty() {
                "(null)".into()
            } else {
                n.features.join(",")
            }
        }
        'B' => "UNLIMITED".into(),
        'c' => n.cpus.to_string(),
        'd' => "0".into(),
        'e' | 'O' => "N/A".into(),
        'E' => reason().unwrap_or_else(|| "none".into()),
        'g' => "all".into(),
        'G' => match (n.gpus, &n.gpu_model) {
            (0, _) => "(null)".into(),
            (g, Some(m)) => format!("gpu:{m}:{g}"),
            (g, None) => format!("gpu:{g}"),
        },
        'h' => "NO".into(),
        'H' => match (&n.reason, n.reason_time) {
            (Some(_), Some(t)) => timestamp(t),
            _ => "Unknown".into(),
        },
        'l' => p.map_or("n/a".into(), |p| {
            p.max_time.map_or("infinite".into(), elapsed)
        }),
        'L' => p.map_or("n/a".into(), |p| {
            p.default_time.map_or("n/a".into(), elapsed)
        }),
        'm' => n.memory_mb.to_string(),
        'P' => p.map_or(String::new(), |p| {
            format!("{}{}", p.name, if p.is_default { "*" } else { "" })
        }),
        'R' => p.map_or(String::new(), |p| p.name.clone()),
        'p' => p.map_or("0".into(), |p| p.priority_tier.to_string()),
        'r' => "no".into(),
        's' => "1-infinite".into(),
        'S' => "all".into(),
        't' => words::node_state(n),
        'T' => state_long(n),
        'u' => match &n.reason {
            Some(_) => n.reason_user.map_or("root".into(), user_name),
            None => "Unknown".into(),
        },
        'U' => match &n.reason {
            Some(_) => {
                let uid = n.reason_user.unwrap_or(0);
                format!("{}({uid})", user_name(uid))
            }
            None => "Unknown".into(),
        },
        'v' => "22.05.8".into(),
        'V' => "N/A".into(),
        'w' => "1".into(),
        'X' => n.cpus.to_string(),
        'Y' | 'Z' => "1".into(),
        'z' => format!("{}:1:1", n.cpus),
        _ => String::new(),
    }
}

/// Fields that count or list over a line's nodes rather than split lines.
fn counting(code: char, exact: bool) -> bool {
    matches!(code, 'N' | 'n' | 'o' | 'D' | 'F' | 'A' | 'C')
        || (!exact && matches!(code, 'c' | 'm' | 'd'))
}

/// A field's value over a line's nodes.
fn total(code: char, p: Option<&PartitionView>, nodes: &[&NodeView]) -> String {
    let names = || nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>();
    match code {
        'N' | 'n' | 'o' => hostlist::compress_sorted(&names()),
        'D' => nodes.len().to_string(),
        'F' | 'A' => {
            let mut c = [0usize; 4];
            for n in nodes {
                let i = if other(n) {
                    2
                } else if n.state == NodeState::Idle {
                    1
                } else {
                    0
                };
                c[i] += 1;
                c[3] += 1;
            }
            if code == 'A' {
                format!("{}/{}", c[0], c[1])
            } else {
                format!("{}/{}/{}/{}", c[0], c[1], c[2], c[3])
            }
        }
        'C' => {
            let mut c = [0u64; 4];
            for n in nodes {
                let (cpus, alloc) = (u64::from(n.cpus), u64::from(n.alloc_cpus.min(n.cpus)));
                c[0] += alloc;
                if other(n) {
                    c[2] += cpus - alloc;
                } else {
                    c[1] += cpus - alloc;
                }
                c[3] += cpus;
            }
            format!("{}/{}/{}/{}", c[0], c[1], c[2], c[3])
        }
        // Without -e: the smallest, with `+` when the nodes differ.
        'c' | 'm' | 'd' => {
            let vals: Vec<u64> = nodes
                .iter()
                .map(|n| match code {
                    'c' => u64::from(n.cpus),
                    'm' => n.memory_mb,
                    _ => 0,
                })
                .collect();
            let min = vals.iter().copied().min().unwrap_or(0);
            let plus = if vals.iter().any(|&v| v != min) {
                "+"
            } else {
                ""
            };
            format!("{min}{plus}")
        }
        other => nodes.first().map_or(String::new(), |n| value(other, p, n)),
    }
}

/// Everything one run prints with, settled from the arguments.
#[derive(Debug)]
pub struct Layout {
    pieces: Vec<Piece>,
    per_node: bool,
    reasons: bool,
    summarize: bool,
    exact: bool,
    header: bool,
    dated: bool,
    partitions: Vec<String>,
    nodes: Option<Vec<String>>,
    states: Vec<String>,
    responding: bool,
    dead: bool,
}

impl Layout {
    pub fn of(a: &SinfoArgs) -> Result<Layout, String> {
        let env_format = std::env::var("SINFO_FORMAT").ok().filter(|f| !f.is_empty());
        for f in [&a.format, &a.format2, &env_format].into_iter().flatten() {
            super::format::check(f)?;
        }
        let pieces = match (&a.format, &a.format2) {
            (Some(_), Some(_)) => {
                return Err("-O (--Format) is incompatible with -o (--format)".into())
            }
            (Some(f), None) => parse_format(f)?,
            (None, Some(f)) => parse_format2(f)?,
            (None, None) => match env_format {
                Some(f) if !a.reasons && !a.summarize => parse_format(&f)?,
                _ => parse_format(match (a.reasons, a.summarize, a.node, a.long) {
                    (true, _, _, false) => REASON_FORMAT,
                    (true, _, _, true) => REASON_LONG_FORMAT,
                    (false, true, _, _) => SUMMARY_FORMAT,
                    (false, false, true, true) => NODE_LONG_FORMAT,
                    (false, false, true, false) => NODE_FORMAT,
                    (false, false, false, true) => LONG_FORMAT,
                    (false, false, false, false) => DEFAULT_FORMAT,
                })?,
            },
        };
        let nodes = match &a.nodes {
            Some(w) => {
                Some(hostlist::expand(w).map_err(|e| format!("Invalid node name specified: {e}"))?)
            }
            None => None,
        };
        Ok(Layout {
            pieces,
            per_node: a.node && !a.summarize,
            reasons: a.reasons,
            summarize: a.summarize,
            exact: a.exact,
            header: !a.noheader,
            dated: a.long && !a.noheader,
            partitions: a
                .partition
                .as_deref()
                .map(|p| {
                    p.split(',')
                        .filter(|x| !x.is_empty())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default(),
            nodes,
            states: states_ok(&a.states)?,
            responding: a.responding,
            dead: a.dead,
        })
    }

    fn keeps(&self, n: &NodeView) -> bool {
        self.nodes.as_ref().is_none_or(|w| w.contains(&n.name))
            && state_matches(n, &self.states)
            && !(self.responding && n.not_responding)
            && (!self.dead || n.not_responding)
    }

    /// The whole output.
    pub fn print(&self, parts: &[PartitionView], nodes: &[NodeView], now: u64) -> String {
        let by_name: HashMap<&str, &NodeView> =
            nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let codes: Vec<char> = self
            .pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Field { code, .. } => Some(*code),
                Piece::Text(_) => None,
            })
            .collect();
        // Lines: a partition (none for -R), the field values that split
        // lines, and the nodes sharing them.
        type Line<'a> = (Option<usize>, Vec<String>, Vec<&'a NodeView>);
        let mut lines: Vec<Line<'_>> = Vec::new();
        let key_of = |pi: Option<usize>, p: Option<&PartitionView>, n: &NodeView| -> Vec<String> {
            let mut k: Vec<String> = codes
                .iter()
                .filter(|&&c| {
                    !counting(c, self.exact)
                        && (!self.summarize || matches!(c, 'P' | 'R' | 'a' | 'l'))
                })
                .map(|c| value(*c, p, n))
                .collect();
            if self.per_node {
                k.push(n.name.clone());
            }
            k.push(pi.map_or(String::new(), |i| i.to_string()));
            k
        };
        if self.reasons {
            let mut sorted: Vec<&NodeView> = nodes
                .iter()
                .filter(|n| n.reason.is_some() && self.keeps(n))
                .collect();
            sorted.sort_by(|a, b| crate::ctld::natural(&a.name, &b.name));
            for n in sorted {
                let k = key_of(None, None, n);
                match lines.iter_mut().find(|l| l.1 == k) {
                    Some(l) => l.2.push(n),
                    None => lines.push((None, k, vec![n])),
                }
            }
        } else {
            for (pi, p) in parts.iter().enumerate() {
                if !self.partitions.is_empty() && !self.partitions.contains(&p.name) {
                    continue;
                }
                let members: Vec<&NodeView> = p
                    .nodes
                    .iter()
                    .filter_map(|name| by_name.get(name.as_str()).copied())
                    .filter(|n| self.keeps(n))
                    .collect();
                let before = lines.len();
                for n in members {
                    let k = key_of(Some(pi), Some(p), n);
                    match lines[before..].iter_mut().find(|l| l.1 == k) {
                        Some(l) => l.2.push(n),
                        None => lines.push((Some(pi), k, vec![n])),
                    }
                }
                // A partition none of whose nodes are shown still has its
                // line (`0 n/a`), unless nodes were asked for by state or
                // name, as Slurm's.
                if lines.len() == before
                    && !self.per_node
                    && self.states.is_empty()
                    && self.nodes.is_none()
                {
                    lines.push((Some(pi), Vec::new(), Vec::new()));
                }
            }
            if self.per_node {
                lines.sort_by(|a, b| {
                    crate::ctld::natural(&a.2[0].name, &b.2[0].name).then(a.0.cmp(&b.0))
                });
            } else {
                lines.sort_by(|a, b| {
                    let rank = |l: &Line<'_>| l.2.first().map_or(0, |n| state_rank(n));
                    a.0.cmp(&b.0).then(rank(b).cmp(&rank(a)))
                });
            }
        }
        // The rows' cells, then `#` widths from the widest cell.
        let rows: Vec<Vec<String>> = lines
            .iter()
            .map(|(pi, _, ns)| {
                let p = pi.map(|i| &parts[i]);
                codes
                    .iter()
                    .map(|&c| {
                        if ns.is_empty() {
                            return match c {
                                'D' => "0".into(),
                                't' | 'T' => "n/a".into(),
                                'N' => String::new(),
                                _ => p.map_or(String::new(), |p| {
                                    value(c, Some(p), &NodeView::placeholder())
                                }),
                            };
                        }
                        if counting(c, self.exact) {
                            total(c, p, ns)
                        } else {
                            value(c, p, ns[0])
                        }
                    })
                    .collect()
            })
            .collect();
        let mut out = String::new();
        if self.dated {
            out.push_str(&strftime("%a %b %d %H:%M:%S %Y\n", now));
        }
        let widths: Vec<Option<usize>> = {
            let mut i = 0;
            self.pieces
                .iter()
                .filter_map(|p| match p {
                    Piece::Field {
                        width,
                        widest,
                        code,
                        ..
                    } => {
                        let w = if *widest {
                            let widest_cell =
                                rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0);
                            let floor = if *code == 'N' { 9 } else { header(*code).len() };
                            Some(widest_cell.max(floor))
                        } else {
                            *width
                        };
                        i += 1;
                        Some(w)
                    }
                    Piece::Text(_) => None,
                })
                .collect()
        };
        let mut line = |cells: &dyn Fn(usize, char) -> String| {
            let mut i = 0;
            for p in &self.pieces {
                match p {
                    Piece::Text(t) => out.push_str(t),
                    Piece::Field { right, code, .. } => {
                        out.push_str(&fit(&cells(i, *code), widths[i], *right));
                        i += 1;
                    }
                }
            }
            out.push('\n');
        };
        if self.header {
            line(&|_, c| header(c).to_string());
        }
        for r in &rows {
            line(&|i, _| r[i].clone());
        }
        out
    }
}

trait Placeholder {
    fn placeholder() -> Self;
}

impl Placeholder for NodeView {
    /// A node standing in for a partition's line with no nodes: only the
    /// partition's own fields are read from it.
    fn placeholder() -> NodeView {
        NodeView {
            name: String::new(),
            state: NodeState::Idle,
            not_responding: false,
            fail: false,
            completing: false,
            cpus: 0,
            alloc_cpus: 0,
            memory_mb: 0,
            alloc_memory_mb: 0,
            gpus: 0,
            alloc_gpus: 0,
            gpu_model: None,
            features: Vec::new(),
            partitions: Vec::new(),
            reason: None,
            reason_user: None,
            reason_time: None,
            boot_time: 0,
            last_seen: 0,
            jobs: Vec::new(),
            os: String::new(),
        }
    }
}

pub fn main(args: &[OsString]) -> i32 {
    let a: SinfoArgs = match parse(CMD, args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    crate::timefmt::use_env_format(now());
    let layout = match Layout::of(&a) {
        Ok(l) => l,
        Err(e) => return fail(CMD, e),
    };
    block_on(CMD, async move {
        let mut c = match Client::connect().await {
            Ok(c) => c,
            Err(e) => return fail(CMD, e),
        };
        loop {
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
            let code = super::emit(CMD, &layout.print(&parts, &nodes, now()));
            match a.iterate {
                Some(secs) if code == 0 => {
                    tokio::time::sleep(std::time::Duration::from_secs(secs.max(1))).await;
                    if super::emit(CMD, "\n") != 0 {
                        return 1;
                    }
                }
                _ => return code,
            }
        }
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use corral_proto::msg::NodeState;

    pub(crate) fn node(name: &str, state: NodeState) -> NodeView {
        NodeView {
            name: name.into(),
            state,
            not_responding: false,
            fail: false,
            completing: false,
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
            os: "Linux 6.1.0 #1 SMP".into(),
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

    fn print(parts: &[PartitionView], nodes: &[NodeView], extra: &[&str]) -> String {
        Layout::of(&args(extra)).unwrap().print(parts, nodes, 1_000)
    }

    #[test]
    fn summary_groups_by_state() {
        let nodes = vec![
            node("worker-0", NodeState::Idle),
            node("worker-1", NodeState::Idle),
            node("worker-2", NodeState::Mixed),
            node("worker-3", NodeState::Drained),
        ];
        assert_eq!(
            print(&[part()], &nodes, &[]),
            "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST\n\
             gpu*         up   infinite      1  drain worker-3\n\
             gpu*         up   infinite      1    mix worker-2\n\
             gpu*         up   infinite      2   idle worker-[0-1]\n"
        );
        assert_eq!(
            print(&[part()], &nodes, &["-h", "-t", "idle"]),
            "gpu*         up   infinite      2   idle worker-[0-1]\n"
        );
        assert_eq!(
            print(&[part()], &nodes, &["-h", "-t", "drain,mix"]),
            "gpu*         up   infinite      1  drain worker-3\n\
             gpu*         up   infinite      1    mix worker-2\n"
        );
        assert_eq!(
            print(&[part()], &nodes, &["-h", "-n", "worker-[1-2]"]),
            "gpu*         up   infinite      1    mix worker-2\n\
             gpu*         up   infinite      1   idle worker-1\n"
        );
        // Only nodes not responding: none, so the partition's empty line.
        assert_eq!(
            print(&[part()], &nodes, &["-h", "-d"]),
            "gpu*         up   infinite      0    n/a \n"
        );
        assert!(Layout::of(&args(&["-t", "bogus"]))
            .unwrap_err()
            .starts_with("Bad state string: \"bogus\"\nvalid states: unknown,down,idle"));
    }

    /// The two-node cluster Slurm 22.05 was run on (n1 idle, n2 drained
    /// for "fanfail"; 4 CPUs, 4000 MB and two GPUs each), and what its
    /// sinfo printed, layout by layout.
    #[test]
    fn layouts_print_as_slurm_does() {
        let mut n1 = node("n1", NodeState::Idle);
        let mut n2 = node("n2", NodeState::Drained);
        for n in [&mut n1, &mut n2] {
            n.memory_mb = 4000;
            n.gpus = 2;
            n.partitions = vec!["p".into()];
        }
        n2.reason = Some("fanfail".into());
        n2.reason_time = Some(1_000);
        let p = PartitionView {
            name: "p".into(),
            is_default: true,
            nodes_expr: "n[1-2]".into(),
            nodes: vec!["n1".into(), "n2".into()],
            max_time: None,
            default_time: None,
            priority_tier: 1,
            total_cpus: 8,
            total_gpus: 4,
        };
        let (parts, nodes) = (vec![p], vec![n1, n2]);
        let rows: &[(&[&str], &str)] = &[
            (
                &["-N"],
                "NODELIST   NODES PARTITION STATE \n\
                 n1             1        p* idle  \n\
                 n2             1        p* drain \n",
            ),
            (
                &["-s"],
                "PARTITION AVAIL  TIMELIMIT   NODES(A/I/O/T) NODELIST\n\
                 p*           up   infinite          0/1/1/2 n[1-2]\n",
            ),
            (
                &["-R"],
                "REASON               USER      TIMESTAMP           NODELIST\n\
                 fanfail              root      1970-01-01T00:16:40 n2\n",
            ),
            (
                &["-l"],
                "Thu Jan 01 00:16:40 1970\n\
                 PARTITION AVAIL  TIMELIMIT   JOB_SIZE ROOT OVERSUBS     GROUPS  NODES       STATE NODELIST\n\
                 p*           up   infinite 1-infinite   no       NO        all      1     drained n2\n\
                 p*           up   infinite 1-infinite   no       NO        all      1        idle n1\n",
            ),
            (
                &["-o", "%P %a %l %D %t %N %c %m %G %C %F %A %E %u %T %R %s %z %f %d %w %h %g %p %r %S %L %B %H"],
                "PARTITION AVAIL TIMELIMIT NODES STATE NODELIST CPUS MEMORY GRES CPUS(A/I/O/T) NODES(A/I/O/T) NODES(A/I) REASON USER STATE PARTITION JOB_SIZE S:C:T AVAIL_FEATURES TMP_DISK WEIGHT OVERSUBSCRIBE GROUPS PRIO_TIER ROOT ALLOCNODES DEFAULTTIME MAX_CPUS_PER_NODE TIMESTAMP\n\
                 p* up infinite 1 drain n2 4 4000 gpu:2 0/0/4/4 0/0/1/1 0/0 fanfail root drained p 1-infinite 4:1:1 (null) 0 1 NO all 1 no all n/a UNLIMITED 1970-01-01T00:16:40\n\
                 p* up infinite 1 idle n1 4 4000 gpu:2 0/4/0/4 0/1/0/1 0/1 none Unknown idle p 1-infinite 4:1:1 (null) 0 1 NO all 1 no all n/a UNLIMITED Unknown\n",
            ),
            (
                &["-O", "Partition,NodeList:.10,StateCompact:4,CPUs,Memory:0,Gres"],
                "PARTITION             NODELISTSTATCPUS                MEMORYGRES                \n\
                 p*                          n2drai4                   4000gpu:2               \n\
                 p*                          n1idle4                   4000gpu:2               \n",
            ),
        ];
        for (extra, want) in rows {
            assert_eq!(print(&parts, &nodes, extra), *want, "sinfo {extra:?}");
        }
        assert_eq!(
            Layout::of(&args(&["-o", "%Q"])).unwrap_err(),
            "Invalid node format specification: Q"
        );
    }
}
