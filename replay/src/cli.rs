//! The command line of the trace replay, shared by `corral-sim` and
//! `corral sim`: parse [`Args`], then [`run`].

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};

use crate::replay::{replay, Options};
use crate::trace::{read_alibaba, read_swf, MachineOverride, Workload};
use scheduler_core::{BackfillPolicy, Packing};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Policy {
    Fcfs,
    Easy,
    Conservative,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum OverrunArg {
    Extend,
    Kill,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PackingArg {
    BestFit,
    FirstFit,
}

/// Replay a workload trace (SWF, plain or gzip; or the Alibaba GPU trace)
/// through Corral's scheduler.
#[derive(Debug, Parser)]
#[command(name = "corral-sim", version)]
pub struct Args {
    /// An SWF file (.swf or .swf.gz), a directory holding the Alibaba GPU
    /// trace (openb_node_list_*.csv and openb_pod_list_*.csv), or
    /// `ml-mix:JOBS` for a synthetic ML cluster workload (with --nodes).
    pub trace: PathBuf,
    /// Backfill policy.
    #[arg(long, value_enum, default_value = "easy")]
    pub policy: Policy,
    /// How nodes and GPUs are chosen among those that fit.
    #[arg(long, value_enum, default_value = "best-fit")]
    pub packing: PackingArg,
    /// Number of nodes (default: from the trace).
    #[arg(long)]
    pub nodes: Option<u32>,
    /// CPUs per node (default: MaxProcs / MaxNodes of the trace).
    #[arg(long)]
    pub cpus_per_node: Option<u32>,
    /// GPUs per node for SWF traces (default 0).
    #[arg(long)]
    pub gpus_per_node: Option<u32>,
    /// Alibaba trace: the pod list to use, inside the trace directory.
    #[arg(long, default_value = "openb_pod_list_default.csv")]
    pub pods: String,
    /// Alibaba trace: GPUs per topology group (0: one group per node).
    #[arg(long, default_value_t = 0)]
    pub gpu_group: u32,
    /// Compress arrivals by this factor (submit times divided by it) to
    /// replay the same jobs under more load; run times are unchanged.
    #[arg(long, default_value_t = 1.0)]
    pub load: f64,
    /// A job that ran past its requested time: `extend` runs its recorded
    /// time with its estimate raised to it (the published results'
    /// convention), `kill` cuts it at its limit (what a live cluster does).
    #[arg(long, value_enum, default_value = "extend")]
    pub overrun: OverrunArg,
    /// Jobs never end: fill the machine in arrival order and measure what
    /// is left stranded (the Alibaba paper's experiment).
    #[arg(long)]
    pub fill: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write a chart of utilisation and queue length (.png or .svg).
    #[arg(long)]
    pub chart: Option<PathBuf>,
    /// Do not show a progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

fn load(args: &Args) -> anyhow::Result<Workload> {
    if let Some(n) = args.trace.to_str().and_then(|s| s.strip_prefix("ml-mix:")) {
        let jobs: usize = n
            .parse()
            .context("corral-sim: ml-mix:JOBS needs a job count")?;
        let nodes = args.nodes.unwrap_or(128) as usize;
        // --load is the offered load here: 1.0 keeps the machine as busy
        // as it can serve on average.
        return Ok(crate::synthetic::ml_mix_workload(nodes, jobs, args.load, 7));
    }
    if args.trace.is_dir() {
        let nodes = args.trace.join("openb_node_list_all_node.csv");
        let pods = args.trace.join(&args.pods);
        return read_alibaba(&nodes, &pods, args.gpu_group)
            .context("corral-sim: reading the Alibaba trace");
    }
    if !args.trace.exists() {
        bail!("corral-sim: no such trace: {}", args.trace.display());
    }
    let machine = MachineOverride {
        nodes: args.nodes,
        cpus_per_node: args.cpus_per_node,
        gpus_per_node: args.gpus_per_node,
    };
    read_swf(&args.trace, &machine).context("corral-sim: reading the SWF trace")
}

/// Loads the trace, replays it and prints the report.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let mut w = load(args)?;
    if !(args.load.is_finite() && args.load > 0.0) {
        bail!("corral-sim: --load must be a positive number");
    }
    if args.load != 1.0 && !args.trace.to_string_lossy().starts_with("ml-mix:") {
        for j in &mut w.jobs {
            j.submit = (j.submit as f64 / args.load) as u64;
        }
    }
    let mode = match args.overrun {
        OverrunArg::Extend => crate::trace::Overrun::Extend,
        OverrunArg::Kill => crate::trace::Overrun::Kill,
    };
    let overran = w.apply_overrun(mode);
    let opts = Options {
        policy: match args.policy {
            Policy::Fcfs => BackfillPolicy::Fcfs,
            Policy::Easy => BackfillPolicy::Easy,
            Policy::Conservative => BackfillPolicy::Conservative,
        },
        packing: match args.packing {
            PackingArg::BestFit => Packing::BestFit,
            PackingArg::FirstFit => Packing::FirstFit,
        },
        fill: args.fill,
        overrun: (mode, overran),
    };
    let bar = if args.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        let bar = indicatif::ProgressBar::new(w.jobs.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} replay [{bar:40}] {pos}/{len} jobs ({eta})",
            )
            .map_err(|e| anyhow::anyhow!("corral-sim: progress template: {e}"))?,
        );
        bar
    };
    let (report, samples) = replay(&w, opts, |n| bar.set_position(n as u64));
    bar.finish_and_clear();
    if let Some(path) = &args.chart {
        crate::chart::draw(path, &w.name, &samples).context("corral-sim")?;
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).context("corral-sim: encoding the report")?
        );
    } else {
        print!("{report}");
    }
    Ok(())
}
