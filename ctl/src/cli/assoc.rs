//! `sacctmgr show` and `sshare`: the accounts `[accounts]` of
//! `corral.toml` declares, read-only, in Slurm's layouts, with the
//! fair-share usage the scheduler charged. Launchers guess a user's
//! account through them (snakemake's Slurm executor runs
//! `sacctmgr -n -s list user NAME format=account%256`, then
//! `sshare -U --format Account%256 --noheader`). Changing them
//! (`sacctmgr add`, `modify`, `delete`) is refused: the file is where
//! they are kept.

use std::ffi::OsString;

use corral_proto::msg::{Association, Associations, Request, Response};

use super::sacct::{cell, split_width, write_header, Layout};
use super::{block_on, fail, user_name};
use crate::client::Client;

/// One association line as both commands see it: an account's own
/// (`user` empty) or a user's.
#[derive(Clone, Debug)]
struct Row<'a> {
    cluster: &'a str,
    account: &'a str,
    user: &'a str,
    /// The user's default account (user lines).
    default_account: &'a str,
    /// How deep the account is below `root` (sshare's indent).
    depth: usize,
    a: Option<&'a Association>,
    /// Accounts beside this one (sshare's NormShares: 1 / siblings).
    siblings: usize,
    total: f64,
}

/// A field: names it answers to, its header, its width (negative: left
/// aligned).
struct Field {
    names: &'static [&'static str],
    header: &'static str,
    width: i32,
    value: fn(&Row<'_>) -> String,
}

fn empty(_: &Row<'_>) -> String {
    String::new()
}

fn fixed(f: f64) -> String {
    format!("{f:.6}")
}

const FIELDS: &[Field] = &[
    Field {
        names: &["user", "users"],
        header: "User",
        width: 10,
        value: |r| r.user.into(),
    },
    Field {
        names: &["defaultaccount", "defaccount", "defacct"],
        header: "Def Acct",
        width: 10,
        value: |r| r.default_account.into(),
    },
    Field {
        names: &["admin", "adminlevel"],
        header: "Admin",
        width: 9,
        value: |r| {
            if r.user == "root" {
                "Administrator".into()
            } else {
                "None".into()
            }
        },
    },
    Field {
        names: &["cluster", "clusters"],
        header: "Cluster",
        width: 10,
        value: |r| r.cluster.into(),
    },
    Field {
        names: &["account", "accounts", "acct"],
        header: "Account",
        width: 10,
        value: |r| r.account.into(),
    },
    Field {
        names: &["descr", "description"],
        header: "Descr",
        width: 20,
        value: |r| r.account.into(),
    },
    Field {
        names: &["org", "organization"],
        header: "Org",
        width: 20,
        value: |r| r.account.into(),
    },
    Field {
        names: &["parentname", "parent"],
        header: "ParentName",
        width: 10,
        value: |r| {
            if r.user.is_empty() && r.account != "root" {
                "root".into()
            } else {
                String::new()
            }
        },
    },
    Field {
        names: &["partition"],
        header: "Partition",
        width: 10,
        value: empty,
    },
    Field {
        names: &["share", "shares", "fairshare"],
        header: "Share",
        width: 9,
        value: |_| "1".into(),
    },
    Field {
        names: &["priority"],
        header: "Priority",
        width: 10,
        value: empty,
    },
    Field {
        names: &["grpjobs"],
        header: "GrpJobs",
        width: 7,
        value: empty,
    },
    Field {
        names: &["grptres"],
        header: "GrpTRES",
        width: 13,
        value: empty,
    },
    Field {
        names: &["grpsubmit", "grpsubmitjobs"],
        header: "GrpSubmit",
        width: 9,
        value: empty,
    },
    Field {
        names: &["grpwall"],
        header: "GrpWall",
        width: 11,
        value: empty,
    },
    Field {
        names: &["grptresmins"],
        header: "GrpTRESMins",
        width: 13,
        value: empty,
    },
    Field {
        names: &["maxjobs"],
        header: "MaxJobs",
        width: 7,
        value: empty,
    },
    Field {
        names: &["maxtres"],
        header: "MaxTRES",
        width: 13,
        value: empty,
    },
    Field {
        names: &["maxtrespernode"],
        header: "MaxTRESPerNode",
        width: 14,
        value: empty,
    },
    Field {
        names: &["maxsubmit", "maxsubmitjobs"],
        header: "MaxSubmit",
        width: 9,
        value: empty,
    },
    Field {
        names: &["maxwall", "maxwalldurationperjob"],
        header: "MaxWall",
        width: 11,
        value: empty,
    },
    Field {
        names: &["maxtresmins"],
        header: "MaxTRESMins",
        width: 13,
        value: empty,
    },
    Field {
        names: &["qos"],
        header: "QOS",
        width: 20,
        value: |_| "normal".into(),
    },
    Field {
        names: &["defaultqos", "defqos"],
        header: "Def QOS",
        width: 9,
        value: empty,
    },
    Field {
        names: &["grptresrunmin", "grptresrunmins"],
        header: "GrpTRESRunMin",
        width: 13,
        value: empty,
    },
    // sshare's.
    Field {
        names: &["rawshares"],
        header: "RawShares",
        width: 10,
        value: |r| {
            if r.account == "root" && r.user.is_empty() {
                String::new()
            } else {
                "1".into()
            }
        },
    },
    Field {
        names: &["normshares"],
        header: "NormShares",
        width: 11,
        value: |r| {
            if r.account == "root" && r.user.is_empty() {
                String::new()
            } else {
                fixed(1.0 / r.siblings.max(1) as f64)
            }
        },
    },
    Field {
        names: &["rawusage"],
        header: "RawUsage",
        width: 11,
        value: |r| format!("{:.0}", usage(r)),
    },
    Field {
        names: &["normusage"],
        header: "NormUsage",
        width: 11,
        value: |r| share_of_total(r).map_or_else(String::new, fixed),
    },
    Field {
        names: &["effectvusage", "effectiveusage"],
        header: "EffectvUsage",
        width: 13,
        value: |r| fixed(share_of_total(r).unwrap_or(0.0)),
    },
    Field {
        names: &["fairshare", "fs"],
        header: "FairShare",
        width: 10,
        value: |r| match (r.user.is_empty(), r.a) {
            (false, Some(a)) => fixed(a.fairshare),
            _ => String::new(),
        },
    },
];

/// A line's decayed usage: the cluster's for `root`, the account's for
/// an account's line, the user's for a user's.
fn usage(r: &Row<'_>) -> f64 {
    match r.a {
        None => r.total,
        Some(a) if r.user.is_empty() => a.account_usage,
        Some(a) => a.user_usage,
    }
}

fn share_of_total(r: &Row<'_>) -> Option<f64> {
    (r.total > 0.0).then(|| usage(r) / r.total)
}

/// A column: its field and width.
struct Column {
    field: &'static Field,
    width: i32,
}

/// `a,b%20,c%-5`: sshare's and sacctmgr's `format=`.
fn columns(spec: &str, sshare: bool) -> Result<Vec<Column>, String> {
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, width) =
            split_width(part).ok_or_else(|| format!("Invalid field width in '{part}'"))?;
        let lower = name.to_ascii_lowercase();
        // `fairshare` is sacctmgr's Share, sshare's factor.
        let field = FIELDS
            .iter()
            .filter(|f| !(sshare && f.header == "Share"))
            .find(|f| f.names.contains(&lower.as_str()))
            .ok_or_else(|| format!("Unknown field '{name}'"))?;
        out.push(Column {
            field,
            width: width.unwrap_or(field.width),
        });
    }
    if out.is_empty() {
        return Err("No fields requested".into());
    }
    Ok(out)
}

fn default_columns(names: &[&str], sshare: bool) -> Vec<Column> {
    columns(&names.join(","), sshare).expect("the default fields are known")
}

fn render(cols: &[Column], rows: &[Row<'_>], layout: &Layout, header: bool) -> String {
    let mut out = String::new();
    let last = cols.len().saturating_sub(1);
    if header {
        let heads: Vec<(&str, i32)> = cols.iter().map(|c| (c.field.header, c.width)).collect();
        write_header(&mut out, &heads, layout);
    }
    for r in rows {
        for (i, c) in cols.iter().enumerate() {
            let mut v = (c.field.value)(r);
            // sshare indents an account by its depth.
            if c.field.header == "Account" && c.width < 0 {
                v = format!("{}{v}", " ".repeat(r.depth));
            }
            cell(&mut out, &v, c.width, layout, i == last);
        }
        out.push('\n');
    }
    out
}

/// The accounts named anywhere, `root` first, then by name.
fn accounts(a: &Associations) -> Vec<&str> {
    let mut names: Vec<&str> = a.list.iter().map(|r| r.account.as_str()).collect();
    names.extend(a.default.as_deref());
    names.sort_unstable();
    names.dedup();
    names.retain(|&n| n != "root");
    names.insert(0, "root");
    names
}

/// A line with nothing charged to it yet.
fn base_row<'a>(a: &'a Associations, account: &'a str, user: &'a str) -> Row<'a> {
    Row {
        cluster: &a.cluster,
        account,
        user,
        default_account: "",
        depth: 0,
        a: None,
        siblings: 1,
        total: a.list.first().map_or(0.0, |r| r.total_usage),
    }
}

fn default_of<'a>(a: &'a Associations, user: &str) -> &'a str {
    a.list
        .iter()
        .find(|r| r.user == user && r.default)
        .map_or("", |r| r.account.as_str())
}

async fn fetch(cmd: &str) -> Result<Associations, i32> {
    let mut c = Client::connect().await.map_err(|e| fail(cmd, e))?;
    match c.ok(Request::Associations).await {
        Ok(Response::Associations(a)) => Ok(a),
        Ok(other) => Err(fail(cmd, format!("unexpected answer {other:?}"))),
        Err(e) => Err(fail(cmd, e)),
    }
}

/// What `sacctmgr` was asked.
#[derive(Debug, Default, PartialEq)]
struct Show {
    entity: Entity,
    header: bool,
    layout: LayoutKind,
    with_assoc: bool,
    /// Names after the entity, or `names=`/`users=`/`accounts=` (by
    /// entity), and `user=`, `account=`, `cluster=` filters.
    names: Vec<String>,
    users: Vec<String>,
    accounts: Vec<String>,
    clusters: Vec<String>,
    format: Option<String>,
}

#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
enum Entity {
    #[default]
    User,
    Account,
    Association,
    Cluster,
}

#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
enum LayoutKind {
    #[default]
    Columns,
    Parsable,
    Parsable2,
}

impl LayoutKind {
    fn layout(self) -> Layout {
        match self {
            LayoutKind::Columns => Layout::Columns,
            LayoutKind::Parsable => Layout::Parsable("|".into()),
            LayoutKind::Parsable2 => Layout::Parsable2("|".into()),
        }
    }
}

fn list(v: &str) -> impl Iterator<Item = String> + '_ {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// `sacctmgr [options] show|list ENTITY [NAMES] [where] [key=value…]`.
fn parse_sacctmgr(args: &[String]) -> Result<Show, String> {
    let mut show = Show {
        header: true,
        ..Show::default()
    };
    let mut words = Vec::new();
    for a in args {
        match a.as_str() {
            "-n" | "--noheader" => show.header = false,
            "-p" | "--parsable" => show.layout = LayoutKind::Parsable,
            "-P" | "--parsable2" => show.layout = LayoutKind::Parsable2,
            "-s" | "--associations" => show.with_assoc = true,
            // Answering yes, staying quiet, saying more: nothing to do
            // for a command that only reads.
            "-i" | "--immediate" | "-Q" | "--quiet" | "-v" | "--verbose" | "-r" | "--readonly" => {}
            s if s.starts_with('-') && s.len() > 1 => {
                // Bundled short flags: `-nP`.
                if s[1..].chars().all(|c| "npPsiQvr".contains(c)) && !s.starts_with("--") {
                    for c in s[1..].chars() {
                        match c {
                            'n' => show.header = false,
                            'p' => show.layout = LayoutKind::Parsable,
                            'P' => show.layout = LayoutKind::Parsable2,
                            's' => show.with_assoc = true,
                            _ => {}
                        }
                    }
                } else {
                    return Err(format!("unrecognized option '{s}'"));
                }
            }
            _ => words.push(a.as_str()),
        }
    }
    let mut words = words.into_iter();
    match words.next().map(str::to_ascii_lowercase).as_deref() {
        Some("show" | "list") => {}
        Some(
            "add" | "create" | "modify" | "update" | "delete" | "remove" | "archive" | "load"
            | "dump" | "reconfigure" | "shutdown",
        ) => {
            return Err("Corral's accounts are read-only here: edit [accounts] in corral.toml, then run scontrol reconfigure".into())
        }
        Some(other) => return Err(format!("Invalid input: {other}")),
        None => return Err("No command given (Corral's sacctmgr answers show and list)".into()),
    }
    show.entity = match words.next().map(str::to_ascii_lowercase).as_deref() {
        Some("user" | "users") => Entity::User,
        Some("account" | "accounts" | "acct") => Entity::Account,
        Some("association" | "associations" | "assoc") => Entity::Association,
        Some("cluster" | "clusters") => Entity::Cluster,
        Some(other) => {
            return Err(format!(
            "Corral keeps no {other} records: it shows users, accounts, associations and clusters"
        ))
        }
        None => return Err("No valid entity in list command".into()),
    };
    for w in words {
        let lower = w.to_ascii_lowercase();
        if matches!(lower.as_str(), "where" | "set") {
            continue;
        }
        if matches!(lower.as_str(), "withassoc" | "withassocs") {
            show.with_assoc = true;
            continue;
        }
        let Some((k, v)) = w.split_once('=') else {
            show.names.extend(list(w));
            continue;
        };
        match k.to_ascii_lowercase().as_str() {
            "format" => show.format = Some(v.to_string()),
            "name" | "names" => show.names.extend(list(v)),
            "user" | "users" => show.users.extend(list(v)),
            "account" | "accounts" | "acct" | "defaultaccount" => show.accounts.extend(list(v)),
            "cluster" | "clusters" => show.clusters.extend(list(v)),
            other => return Err(format!("Unknown condition: {other}")),
        }
    }
    match show.entity {
        Entity::User => show.users.append(&mut show.names),
        Entity::Account => show.accounts.append(&mut show.names),
        Entity::Cluster => show.clusters.append(&mut show.names),
        Entity::Association => {
            if !show.names.is_empty() {
                return Err(format!("Unknown condition: {}", show.names.join(",")));
            }
        }
    }
    Ok(show)
}

fn keep(filter: &[String], value: &str) -> bool {
    filter.is_empty() || filter.iter().any(|f| f.eq_ignore_ascii_case(value))
}

/// What `sacctmgr show` prints.
fn sacctmgr_output(show: &Show, a: &Associations) -> Result<String, String> {
    let cluster_ok = keep(&show.clusters, &a.cluster);
    let mut rows: Vec<Row<'_>> = Vec::new();
    let names = accounts(a);
    let user_line = |r: &'_ Association| -> bool {
        keep(&show.users, &r.user) && keep(&show.accounts, &r.account)
    };
    let default_names: &[&str] = match (show.entity, show.with_assoc) {
        (Entity::User, false) => &["User", "DefaultAccount", "Admin"],
        (Entity::User, true) => &[
            "User",
            "DefaultAccount",
            "Admin",
            "Cluster",
            "Account",
            "Partition",
            "Share",
            "Priority",
            "MaxJobs",
            "MaxSubmit",
            "MaxWall",
            "QOS",
            "DefaultQOS",
        ],
        (Entity::Account, false) => &["Account", "Descr", "Org"],
        (Entity::Account, true) => &[
            "Account",
            "Descr",
            "Org",
            "Cluster",
            "ParentName",
            "User",
            "Share",
            "Priority",
            "GrpJobs",
            "GrpSubmit",
            "GrpWall",
            "MaxJobs",
            "MaxSubmit",
            "MaxWall",
            "QOS",
            "DefaultQOS",
        ],
        (Entity::Association, _) => &[
            "Cluster",
            "Account",
            "User",
            "Partition",
            "Share",
            "Priority",
            "GrpJobs",
            "GrpTRES",
            "GrpSubmit",
            "GrpWall",
            "GrpTRESMins",
            "MaxJobs",
            "MaxTRES",
            "MaxTRESPerNode",
            "MaxSubmit",
            "MaxWall",
            "MaxTRESMins",
            "QOS",
            "DefaultQOS",
            "GrpTRESRunMin",
        ],
        (Entity::Cluster, _) => &["Cluster"],
    };
    let cols = match &show.format {
        Some(f) => columns(f, false)?,
        None => default_columns(default_names, false),
    };
    let base = |account, user| base_row(a, account, user);
    if cluster_ok {
        match (show.entity, show.with_assoc) {
            (Entity::Cluster, _) => rows.push(base("", "")),
            (Entity::User, false) => {
                let mut users: Vec<&str> = a.list.iter().map(|r| r.user.as_str()).collect();
                users.dedup();
                for u in users.into_iter().filter(|u| keep(&show.users, u)) {
                    let d = default_of(a, u);
                    if keep(&show.accounts, d) {
                        rows.push(Row {
                            default_account: d,
                            ..base(d, u)
                        });
                    }
                }
            }
            (Entity::User, true) => {
                for r in a.list.iter().filter(|r| user_line(r)) {
                    rows.push(Row {
                        default_account: default_of(a, &r.user),
                        a: Some(r),
                        ..base(&r.account, &r.user)
                    });
                }
            }
            (Entity::Account, false) => {
                for n in names.iter().filter(|n| keep(&show.accounts, n)) {
                    rows.push(base(n, ""));
                }
            }
            (Entity::Account, true) | (Entity::Association, _) => {
                for n in names.iter().filter(|n| keep(&show.accounts, n)) {
                    if show.users.is_empty() {
                        rows.push(base(n, ""));
                    }
                    for r in a.list.iter().filter(|r| r.account == *n && user_line(r)) {
                        rows.push(Row {
                            default_account: default_of(a, &r.user),
                            a: Some(r),
                            ..base(n, &r.user)
                        });
                    }
                }
            }
        }
    }
    Ok(render(&cols, &rows, &show.layout.layout(), show.header))
}

pub fn sacctmgr_main(args: &[OsString]) -> i32 {
    const CMD: &str = "sacctmgr";
    let args: Vec<String> = args
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        return super::emit(
            CMD,
            "Usage: sacctmgr [-n] [-p|-P] [-s] show|list user|account|association|cluster [NAMES] [where KEY=VALUE…] [format=FIELD[%WIDTH],…]\n\
             Corral's accounts are [accounts] of corral.toml; sacctmgr reads them.\n",
        );
    }
    if args.iter().any(|a| a == "-V" || a == "--version") {
        return super::emit(CMD, &format!("corral {}\n", env!("CARGO_PKG_VERSION")));
    }
    let show = match parse_sacctmgr(&args) {
        Ok(s) => s,
        Err(e) => return fail(CMD, e),
    };
    block_on(CMD, async move {
        let a = match fetch(CMD).await {
            Ok(a) => a,
            Err(code) => return code,
        };
        match sacctmgr_output(&show, &a) {
            Ok(text) => super::emit(CMD, &text),
            Err(e) => fail(CMD, e),
        }
    })
}

/// What `sshare` was asked.
#[derive(Debug, clap::Parser)]
#[command(name = "sshare", version, disable_help_flag = true)]
struct SshareArgs {
    #[arg(long, action = clap::ArgAction::Help)]
    help: Option<bool>,
    /// Every user's lines, not only the caller's.
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// Users' lines only.
    #[arg(short = 'U', long = "Users")]
    users_only: bool,
    /// Only these users.
    #[arg(short = 'u', long = "users")]
    users: Option<String>,
    /// Only these accounts.
    #[arg(short = 'A', long = "accounts")]
    accounts: Option<String>,
    #[arg(short = 'n', long = "noheader")]
    noheader: bool,
    #[arg(short = 'p', long = "parsable")]
    parsable: bool,
    #[arg(short = 'P', long = "parsable2")]
    parsable2: bool,
    /// NormUsage too.
    #[arg(short = 'l', long = "long")]
    long: bool,
    #[arg(short = 'o', long = "format")]
    format: Option<String>,
    /// Accepted: one cluster.
    #[arg(short = 'M', long = "clusters")]
    clusters: Option<String>,
}

/// What `sshare` prints; `me` is the caller's name.
fn sshare_output(s: &SshareArgs, a: &Associations, me: &str) -> Result<String, String> {
    let users: Vec<String> = s
        .users
        .as_deref()
        .map(|u| list(u).collect())
        .unwrap_or_default();
    let accts: Vec<String> = s
        .accounts
        .as_deref()
        .map(|u| list(u).collect())
        .unwrap_or_default();
    let names = accounts(a);
    let siblings = names.len().saturating_sub(1).max(1);
    let mut rows = Vec::new();
    let base = |account, user, depth, siblings| Row {
        depth,
        siblings,
        ..base_row(a, account, user)
    };
    let user_ok = |u: &str| {
        if !users.is_empty() {
            keep(&users, u)
        } else {
            s.all || u == me
        }
    };
    if !s.users_only && accts.is_empty() {
        rows.push(base("root", "", 0, 1));
    }
    for n in names.iter().filter(|&&n| n != "root" && keep(&accts, n)) {
        let members: Vec<&Association> = a.list.iter().filter(|r| r.account == *n).collect();
        if !s.users_only {
            rows.push(Row {
                a: members.first().copied(),
                ..base(n, "", 1, siblings)
            });
        }
        let count = members.len();
        for r in members.into_iter().filter(|r| user_ok(&r.user)) {
            rows.push(Row {
                a: Some(r),
                ..base(n, &r.user, 2, count)
            });
        }
    }
    let fields: &[&str] = if s.long {
        &[
            "Account%-20",
            "User",
            "RawShares",
            "NormShares",
            "RawUsage",
            "NormUsage",
            "EffectvUsage",
            "FairShare",
        ]
    } else {
        &[
            "Account%-20",
            "User",
            "RawShares",
            "NormShares",
            "RawUsage",
            "EffectvUsage",
            "FairShare",
        ]
    };
    let mut cols = match &s.format {
        Some(f) => columns(f, true)?,
        None => default_columns(fields, true),
    };
    // sshare's Account is left aligned (and indented) unless a width says.
    for c in &mut cols {
        if c.field.header == "Account" && c.width == c.field.width {
            c.width = -20;
        }
    }
    let layout = if s.parsable2 {
        LayoutKind::Parsable2
    } else if s.parsable {
        LayoutKind::Parsable
    } else {
        LayoutKind::Columns
    };
    Ok(render(&cols, &rows, &layout.layout(), !s.noheader))
}

pub fn sshare_main(args: &[OsString]) -> i32 {
    const CMD: &str = "sshare";
    let s: SshareArgs = match super::parse(CMD, args) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let me = user_name(nix::unistd::getuid().as_raw());
    block_on(CMD, async move {
        let a = match fetch(CMD).await {
            Ok(a) => a,
            Err(code) => return code,
        };
        match sshare_output(&s, &a, &me) {
            Ok(text) => super::emit(CMD, &text),
            Err(e) => fail(CMD, e),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn assocs() -> Associations {
        let row = |user: &str, account: &str, default: bool, u: f64| Association {
            user: user.into(),
            account: account.into(),
            default,
            user_usage: u,
            account_usage: 30.0,
            total_usage: 40.0,
            fairshare: 0.25,
        };
        Associations {
            cluster: "corral".into(),
            default: Some("default".into()),
            list: vec![
                row("alice", "ml", true, 30.0),
                row("alice", "vision", false, 30.0),
                row("bob", "default", true, 10.0),
            ],
        }
    }

    fn show(args: &[&str]) -> String {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        sacctmgr_output(&parse_sacctmgr(&args).unwrap(), &assocs()).unwrap()
    }

    #[test]
    fn snakemakes_account_guess_gets_each_account_of_the_user() {
        let out = show(&["-n", "-s", "list", "user", "alice", "format=account%256"]);
        let lines: Vec<&str> = out.lines().map(str::trim).collect();
        assert_eq!(lines, ["ml", "vision"]);
        assert_eq!(out.lines().next().unwrap().len(), 257);
        let s =
            SshareArgs::try_parse_from(["sshare", "-U", "--format", "Account%256", "--noheader"])
                .unwrap();
        let out = sshare_output(&s, &assocs(), "bob").unwrap();
        let lines: Vec<&str> = out.lines().map(str::trim).collect();
        assert_eq!(lines, ["default"]);
    }

    #[test]
    fn layouts_as_slurms() {
        // As Slurm 22.05's sacctmgr prints them (widths, right aligned,
        // `+` where cut).
        assert_eq!(
            show(&["show", "user"]),
            "      User   Def Acct     Admin \n\
             ---------- ---------- --------- \n\
             \x20    alice         ml      None \n\
             \x20      bob    default      None \n"
        );
        assert_eq!(
            show(&["show", "account"]),
            "   Account                Descr                  Org \n\
             ---------- -------------------- -------------------- \n\
             \x20     root                 root                 root \n\
             \x20  default              default              default \n\
             \x20       ml                   ml                   ml \n\
             \x20   vision               vision               vision \n"
        );
        assert_eq!(
            show(&["-P", "show", "assoc", "format=cluster,account,user,share,qos,defaultqos", "where", "account=ml"]),
            "Cluster|Account|User|Share|QOS|Def QOS\ncorral|ml||1|normal|\ncorral|ml|alice|1|normal|\n"
        );
        assert_eq!(
            show(&[
                "-p",
                "show",
                "user",
                "alice",
                "withassoc",
                "format=user,defaultaccount,account"
            ]),
            "User|Def Acct|Account|\nalice|ml|ml|\nalice|ml|vision|\n"
        );
        assert_eq!(
            show(&[
                "list",
                "users",
                "names=alice",
                "format=user%3,account%-4",
                "-s"
            ]),
            "Use Acco \n--- ---- \nal+ ml   \nal+ vis+ \n"
        );
        // A user it does not know: the header alone, as Slurm's.
        assert_eq!(show(&["-n", "show", "user", "nobody"]), "");
    }

    #[test]
    fn sshare_shows_the_tree_with_usage() {
        let s = SshareArgs::try_parse_from(["sshare", "-a", "-P"]).unwrap();
        let out = sshare_output(&s, &assocs(), "alice").unwrap();
        assert_eq!(
            out,
            "Account|User|RawShares|NormShares|RawUsage|EffectvUsage|FairShare\n\
             root||||40|1.000000|\n \
             default||1|0.333333|30|0.750000|\n  \
             default|bob|1|1.000000|10|0.250000|0.250000\n \
             ml||1|0.333333|30|0.750000|\n  \
             ml|alice|1|1.000000|30|0.750000|0.250000\n \
             vision||1|0.333333|30|0.750000|\n  \
             vision|alice|1|1.000000|30|0.750000|0.250000\n"
        );
        // Without -a: the caller's own lines, with every account's.
        let s = SshareArgs::try_parse_from(["sshare", "-n", "-P"]).unwrap();
        let out = sshare_output(&s, &assocs(), "bob").unwrap();
        assert_eq!(out.lines().filter(|l| l.contains("|bob|")).count(), 1);
        assert!(!out.contains("alice"));
        let s = SshareArgs::try_parse_from(["sshare", "-o", "Account,Bogus"]).unwrap();
        assert_eq!(
            sshare_output(&s, &assocs(), "bob").unwrap_err(),
            "Unknown field 'Bogus'"
        );
    }

    #[test]
    fn changes_and_unknown_entities_are_refused() {
        let p =
            |args: &[&str]| parse_sacctmgr(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(p(&["add", "account", "x"])
            .unwrap_err()
            .contains("read-only"));
        assert!(p(&["-i", "delete", "user", "bob"])
            .unwrap_err()
            .contains("read-only"));
        assert!(p(&["show", "qos"]).unwrap_err().contains("no qos records"));
        assert_eq!(p(&["show"]).unwrap_err(), "No valid entity in list command");
        assert!(p(&["--bogus", "show", "user"]).is_err());
        assert!(p(&["show", "user", "format=bogus"]).is_ok());
        let s = p(&["show", "user", "format=bogus"]).unwrap();
        assert_eq!(
            sacctmgr_output(&s, &assocs()).unwrap_err(),
            "Unknown field 'bogus'"
        );
        assert_eq!(
            p(&["show", "user", "frobs=3"]).unwrap_err(),
            "Unknown condition: frobs"
        );
    }
}
