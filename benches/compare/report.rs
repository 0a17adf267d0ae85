//! `compare-report`: turns the samples `benches/compare.sh` measured (one
//! JSON object per line: `figure`, `system` (`slurm`, `slurm-htc` or
//! `corral`),
//! `value`, `unit`, `better` (`higher` or `lower`)) into the comparison:
//! a Markdown table on standard output, a JSON summary and a PNG chart of
//! Corral's advantage per figure. Where Slurm was measured with both its
//! defaults (`slurm`) and its high-throughput settings (`slurm-htc`),
//! each figure compares Corral with the better of the two medians.
//!
//! `compare-report SAMPLES.jsonl [--json OUT.json] [--png OUT.png]`

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize)]
struct Sample {
    figure: String,
    system: String,
    value: f64,
    unit: String,
    better: Better,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
enum Better {
    Higher,
    Lower,
}

/// One system's samples of one figure.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
    n: usize,
}

/// One row of the comparison.
#[derive(Debug, Clone, Serialize)]
struct Row {
    figure: String,
    unit: String,
    better: Better,
    /// The better of Slurm's settings for this figure.
    slurm: Option<Spread>,
    /// Slurm with its defaults and with the HTC settings, when both ran.
    slurm_defaults: Option<Spread>,
    slurm_htc: Option<Spread>,
    /// Which of them `slurm` is (`defaults` or `htc`), when both ran.
    slurm_setting: Option<&'static str>,
    corral: Option<Spread>,
    /// How many times better Corral's median is (above 1: Corral ahead).
    advantage: Option<f64>,
}

fn spread(values: &[f64]) -> Option<Spread> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let median = if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    };
    Some(Spread {
        median,
        min: v[0],
        max: v[v.len() - 1],
        n: v.len(),
    })
}

/// Rows in the order figures first appear.
fn rows(samples: &[Sample]) -> Vec<Row> {
    let mut order: Vec<String> = Vec::new();
    let mut by: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    let mut meta: BTreeMap<String, (String, Better)> = BTreeMap::new();
    for s in samples {
        if !order.contains(&s.figure) {
            order.push(s.figure.clone());
            meta.insert(s.figure.clone(), (s.unit.clone(), s.better));
        }
        by.entry((s.figure.clone(), s.system.clone()))
            .or_default()
            .push(s.value);
    }
    order
        .into_iter()
        .map(|f| {
            let get = |sys: &str| {
                by.get(&(f.clone(), sys.to_string()))
                    .and_then(|v| spread(v))
            };
            let (defaults, htc, corral) = (get("slurm"), get("slurm-htc"), get("corral"));
            let (unit, better) = meta
                .get(&f)
                .cloned()
                .unwrap_or((String::new(), Better::Lower));
            let (slurm, slurm_setting) = match (defaults, htc) {
                (Some(d), Some(h)) => {
                    let htc_better = match better {
                        Better::Higher => h.median > d.median,
                        Better::Lower => h.median < d.median,
                    };
                    match htc_better {
                        true => (Some(h), Some("htc")),
                        false => (Some(d), Some("defaults")),
                    }
                }
                (d, h) => (d.or(h), None),
            };
            let advantage = match (slurm, corral) {
                // Context, not a race: each column is what the other
                // system's idle daemons did.
                _ if f == IDLE_CPU => None,
                (Some(s), Some(c)) if s.median > 0.0 && c.median > 0.0 => Some(match better {
                    Better::Higher => c.median / s.median,
                    Better::Lower => s.median / c.median,
                }),
                _ => None,
            };
            Row {
                figure: f,
                unit,
                better,
                slurm,
                slurm_defaults: defaults.filter(|_| htc.is_some()),
                slurm_htc: htc.filter(|_| defaults.is_some()),
                slurm_setting,
                corral,
                advantage,
            }
        })
        .collect()
}

fn num(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn cell(s: Option<Spread>) -> String {
    match s {
        None => "–".into(),
        Some(s) if s.n == 1 => num(s.median),
        Some(s) => format!("{} ({}–{})", num(s.median), num(s.min), num(s.max)),
    }
}

fn markdown(rows: &[Row]) -> String {
    // Both Slurm settings ran: a column for each, the better one marked.
    let both = rows.iter().any(|r| r.slurm_setting.is_some());
    let mut out = String::from(match both {
        false => "| figure | unit | Slurm | Corral | Corral's advantage |\n|---|---|---|---|---|\n",
        true => "| figure | unit | Slurm, defaults | Slurm, HTC settings | Corral | Corral's advantage over the better Slurm |\n|---|---|---|---|---|---|\n",
    });
    for r in rows.iter().filter(|r| r.figure != CORES) {
        let better = match r.better {
            Better::Higher => "higher is better",
            Better::Lower => "lower is better",
        };
        let slurm = match (both, r.slurm_setting) {
            (false, _) => cell(r.slurm),
            (true, None) => format!("{} | –", cell(r.slurm)),
            (true, Some(which)) => {
                let mark = |s: Option<Spread>, me: &str| match which == me {
                    true => format!("**{}**", cell(s)),
                    false => cell(s),
                };
                format!(
                    "{} | {}",
                    mark(r.slurm_defaults, "defaults"),
                    mark(r.slurm_htc, "htc")
                )
            }
        };
        out.push_str(&format!(
            "| {} | {} ({better}) | {slurm} | {} | {} |\n",
            r.figure,
            r.unit,
            cell(r.corral),
            r.advantage.map_or("–".into(), |a| format!("{}×", num(a)))
        ));
    }
    out
}

/// The figures of a process start and of a round trip, measured in the
/// same run, that one-shot commands cannot go below.
const PROCESS_FLOOR: &str = "sbatch --version (process floor)";
const ROUND_TRIP_FLOOR: &str = "scontrol ping (process floor and a controller round trip)";
const FLUSH: &str = "4 KiB write and flush to disk, one at a time (the price of a durable answer)";

/// Rates bound by one client's sequence of one-shot `sbatch` processes.
const CLI_BOUND: [&str; 3] = [
    "sbatch --hold, 1 client(s)",
    "sbatch (jobs that run), 1 client(s)",
    "tiny jobs end to end, 1 submitter(s)",
];

/// A CLI-bound figure of one system as a multiple of its floors: the time
/// a job took (from the rate's median) over the process start, over the
/// round trip and, for Corral, which answers only once a submission is
/// on disk, over the round trip and one flush.
#[derive(Debug, Clone, PartialEq)]
struct Floored {
    figure: &'static str,
    system: &'static str,
    ms: f64,
    over_process: Option<f64>,
    over_round_trip: Option<f64>,
    over_durable: Option<f64>,
}

/// One side's median of `figure` (Corral's, or the better Slurm's), where
/// it was measured and is above zero.
fn positive_median(rows: &[Row], figure: &str, corral: bool) -> Option<f64> {
    rows.iter()
        .find(|r| r.figure == figure)
        .and_then(|r| if corral { r.corral } else { r.slurm })
        .map(|s| s.median)
        .filter(|m| *m > 0.0)
}

fn floored(rows: &[Row]) -> Vec<Floored> {
    let median = |f: &str, corral: bool| positive_median(rows, f, corral);
    let mut out = Vec::new();
    for figure in CLI_BOUND {
        for (system, corral) in [("Slurm", false), ("Corral", true)] {
            let Some(rate) = median(figure, corral) else {
                continue;
            };
            let ms = 1000.0 / rate;
            let over = |floor: Option<f64>| floor.map(|f| ms / f);
            let round_trip = median(ROUND_TRIP_FLOOR, corral);
            let durable = match (corral, round_trip, median(FLUSH, corral)) {
                (true, Some(r), Some(f)) => Some(r + f),
                _ => None,
            };
            out.push(Floored {
                figure,
                system,
                ms,
                over_process: over(median(PROCESS_FLOOR, corral)),
                over_round_trip: over(round_trip),
                over_durable: over(durable),
            });
        }
    }
    out
}

fn floors_markdown(rows: &[Floored]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let times = |x: Option<f64>| x.map_or("–".into(), |x| format!("{}×", num(x)));
    let mut out = String::from(
        "\nOne client's one-shot commands against their floors, measured in the same run \
         (the time a job took over the floor's time):\n\n\
         | figure | system | ms a job | × process start | × round trip | × round trip and flush |\n\
         |---|---|---|---|---|---|\n",
    );
    for f in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            f.figure,
            f.system,
            num(f.ms),
            times(f.over_process),
            times(f.over_round_trip),
            times(f.over_durable)
        ));
    }
    out
}

/// The CPU a tiny job's own processes take (an sbatch's process start and
/// a shell running `true`), and the machine's cores: how fast tiny jobs
/// could go were the daemons free.
const CPU_FLOOR: &str = "CPU of a tiny job's own processes (an sbatch process start and a shell)";
const CORES: &str = "CPU cores of this machine";

/// The CPU the clusters not in use spent while a system's sruns ran (all
/// clusters are up at once): shown, never compared.
const IDLE_CPU: &str = "CPU of the idle clusters' daemons during the sruns";

/// End-to-end tiny-job rates, set against the CPU bound.
const CPU_BOUND: [&str; 2] = [
    "tiny jobs end to end, 1 submitter(s)",
    "tiny jobs end to end, 2 submitter(s)",
];

/// A tiny-job rate of one system against the rate its cores could reach
/// running nothing but each job's own processes.
#[derive(Debug, Clone, PartialEq)]
struct CpuBound {
    figure: &'static str,
    system: &'static str,
    rate: f64,
    floor_ms: f64,
    bound: f64,
}

fn cpu_bound(rows: &[Row]) -> Vec<CpuBound> {
    let median = |f: &str, corral: bool| positive_median(rows, f, corral);
    let mut out = Vec::new();
    for figure in CPU_BOUND {
        for (system, corral) in [("Slurm", false), ("Corral", true)] {
            let (Some(rate), Some(floor_ms), Some(cores)) = (
                median(figure, corral),
                median(CPU_FLOOR, corral),
                median(CORES, corral),
            ) else {
                continue;
            };
            out.push(CpuBound {
                figure,
                system,
                rate,
                floor_ms,
                bound: cores * 1000.0 / floor_ms,
            });
        }
    }
    out
}

fn cpu_bound_markdown(rows: &[CpuBound], cores: Option<f64>) -> String {
    let (false, Some(cores)) = (rows.is_empty(), cores) else {
        return String::new();
    };
    let mut out = format!(
        "\nTiny jobs against the machine's CPU: the rate its {cores} cores would reach running \
         nothing but each job's own processes (an sbatch's process start and a shell running \
         `true`, their CPU measured in the same run), were the daemons free:\n\n\
         | figure | system | jobs/s | CPU floor a job (ms) | that rate (jobs/s) | share of it |\n\
         |---|---|---|---|---|---|\n"
    );
    for b in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {}% |\n",
            b.figure,
            b.system,
            num(b.rate),
            num(b.floor_ms),
            num(b.bound),
            num(100.0 * b.rate / b.bound)
        ));
    }
    out
}

fn chart(path: &Path, rows: &[Row]) -> Result<(), String> {
    corral_replay::chart::register_font()?;
    let shown: Vec<&Row> = rows
        .iter()
        .filter(|r| r.advantage.is_some() && r.figure != CORES)
        .collect();
    let height = 120 + 34 * shown.len().max(1) as u32;
    let e = |e: &dyn std::fmt::Display| e.to_string();
    // Room beside the axis for the widest name, whole.
    let font = ("sans-serif", 13).into_font();
    let mut widest = 100;
    for r in &shown {
        widest = widest.max(font.box_size(&r.figure).map_err(|x| e(&x))?.0);
    }
    let names = widest + 24;
    let root = BitMapBackend::new(path, (names + 700, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let most = shown
        .iter()
        .filter_map(|r| r.advantage)
        .fold(10.0f64, f64::max)
        * 2.0;
    let least = shown
        .iter()
        .filter_map(|r| r.advantage)
        .fold(0.5f64, f64::min)
        / 2.0;
    let n = shown.len().max(1);
    let top = n as f64;
    let mut c = ChartBuilder::on(&root)
        .caption(
            "Corral's advantage over Slurm (times better; log scale)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(names)
        .build_cartesian_2d((least..most).log_scale(), 0.0..top)
        .map_err(|x| e(&x))?;
    c.configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_desc("× (1 = even)")
        .draw()
        .map_err(|x| e(&x))?;
    // Row k from the top: its bar, and its name beside the axis.
    let label = TextStyle::from(font).pos(Pos::new(HPos::Right, VPos::Center));
    for (k, r) in shown.iter().enumerate() {
        let Some(a) = r.advantage else { continue };
        let y = top - 1.0 - k as f64;
        let color = if a >= 1.0 { BLUE } else { RED };
        c.draw_series(std::iter::once(Rectangle::new(
            [(least, y + 0.1), (a, y + 0.9)],
            color.mix(0.6).filled(),
        )))
        .map_err(|x| e(&x))?;
        let (px, py) = c.backend_coord(&(least, y + 0.5));
        root.draw(&Text::new(r.figure.clone(), (px - 8, py), label.clone()))
            .map_err(|x| e(&x))?;
    }
    c.draw_series(LineSeries::new([(1.0, 0.0), (1.0, top)], BLACK))
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))
}

fn run(args: &[String]) -> Result<(), String> {
    let input = args
        .first()
        .ok_or("usage: compare-report SAMPLES.jsonl [--json OUT] [--png OUT]")?;
    let text = std::fs::read_to_string(input).map_err(|e| format!("{input}: {e}"))?;
    let mut samples = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let s: Sample =
            serde_json::from_str(line).map_err(|e| format!("{input}:{}: {e}", i + 1))?;
        samples.push(s);
    }
    let rows = rows(&samples);
    print!("{}", markdown(&rows));
    print!("{}", floors_markdown(&floored(&rows)));
    let cores = rows
        .iter()
        .find(|r| r.figure == CORES)
        .and_then(|r| r.corral.or(r.slurm))
        .map(|s| s.median);
    print!("{}", cpu_bound_markdown(&cpu_bound(&rows), cores));
    let mut rest = args[1..].iter();
    while let Some(flag) = rest.next() {
        let path = rest.next().ok_or(format!("{flag} needs a file"))?;
        match flag.as_str() {
            "--json" => std::fs::write(
                path,
                serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?,
            )
            .map_err(|e| format!("{path}: {e}"))?,
            "--png" => chart(Path::new(path), &rows).map_err(|e| format!("{path}: {e}"))?,
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = run(&args) {
        eprintln!("compare-report: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(figure: &str, system: &str, value: f64, better: Better) -> Sample {
        Sample {
            figure: figure.into(),
            system: system.into(),
            value,
            unit: "x".into(),
            better,
        }
    }

    #[test]
    fn the_chart_is_wide_enough_for_its_longest_name() {
        let long = "a figure whose name is much longer than any of today's, with its \
                    unit and what it bounds spelled out";
        let samples = vec![
            s("short", "slurm", 2.0, Better::Lower),
            s("short", "corral", 1.0, Better::Lower),
            s(long, "slurm", 4.0, Better::Lower),
            s(long, "corral", 1.0, Better::Lower),
        ];
        let dir = tempfile::tempdir().unwrap();
        let png = dir.path().join("c.png");
        chart(&png, &rows(&samples)).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        // IHDR: the width, big-endian, after the signature and the chunk's
        // length and type.
        let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
        let name = ("sans-serif", 13).into_font().box_size(long).unwrap().0;
        assert!(width >= name + 700, "{width} px for a {name} px name");
    }

    #[test]
    fn medians_spreads_and_the_direction_of_an_advantage() {
        let samples = vec![
            s("sbatch/s", "slurm", 100.0, Better::Higher),
            s("sbatch/s", "slurm", 80.0, Better::Higher),
            s("sbatch/s", "slurm", 140.0, Better::Higher),
            s("sbatch/s", "corral", 400.0, Better::Higher),
            s("srun ms", "slurm", 40.0, Better::Lower),
            s("srun ms", "corral", 8.0, Better::Lower),
            s("srun ms", "corral", 12.0, Better::Lower),
            s("memory", "corral", 90.0, Better::Lower),
        ];
        let r = rows(&samples);
        assert_eq!(r.len(), 3, "figures in the order they came");
        assert_eq!(
            r[0].slurm,
            Some(Spread {
                median: 100.0,
                min: 80.0,
                max: 140.0,
                n: 3
            })
        );
        assert_eq!(
            r[0].advantage,
            Some(4.0),
            "higher is better: corral / slurm"
        );
        assert_eq!(
            r[1].corral.map(|c| c.median),
            Some(10.0),
            "even count: mean of the middle two"
        );
        assert_eq!(r[1].advantage, Some(4.0), "lower is better: slurm / corral");
        assert_eq!(r[2].advantage, None, "one side missing");
        let md = markdown(&r);
        assert!(
            md.contains("| sbatch/s | x (higher is better) | 100 (80.0–140) | 400 | 4.00× |"),
            "{md}"
        );
        assert!(
            md.contains("| memory | x (lower is better) | – | 90.0 | – |"),
            "{md}"
        );
    }

    #[test]
    fn the_better_slurm_setting_per_figure() {
        let samples = vec![
            s("sbatch/s", "slurm", 30.0, Better::Higher),
            s("sbatch/s", "slurm-htc", 100.0, Better::Higher),
            s("sbatch/s", "corral", 90.0, Better::Higher),
            s("tiny/s", "slurm", 25.0, Better::Higher),
            s("tiny/s", "slurm-htc", 5.0, Better::Higher),
            s("tiny/s", "corral", 100.0, Better::Higher),
            s("srun ms", "slurm", 60.0, Better::Lower),
            s("srun ms", "slurm-htc", 50.0, Better::Lower),
            s("srun ms", "corral", 25.0, Better::Lower),
        ];
        let r = rows(&samples);
        assert_eq!(r[0].slurm_setting, Some("htc"));
        assert_eq!(r[0].advantage, Some(0.9), "against the better: HTC's 100");
        assert_eq!(r[1].slurm_setting, Some("defaults"));
        assert_eq!(r[1].advantage, Some(4.0));
        assert_eq!(r[2].slurm_setting, Some("htc"), "lower is better: 50 ms");
        assert_eq!(r[2].advantage, Some(2.0));
        let md = markdown(&r);
        assert!(
            md.contains("| Slurm, defaults | Slurm, HTC settings |"),
            "{md}"
        );
        assert!(
            md.contains("| sbatch/s | x (higher is better) | 30.0 | **100** | 90.0 | 0.90× |"),
            "{md}"
        );
    }

    #[test]
    fn a_bad_line_is_named() {
        let dir = std::env::temp_dir().join(format!("compare-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("bad.jsonl");
        std::fs::write(&p, "{\"figure\":\"a\"}\n").unwrap();
        let e = run(&[p.display().to_string()]).unwrap_err();
        assert!(e.contains("bad.jsonl:1:"), "{e}");
    }

    #[test]
    fn one_shot_figures_are_set_against_their_floors() {
        let samples = vec![
            s(PROCESS_FLOOR, "slurm", 2.0, Better::Lower),
            s(PROCESS_FLOOR, "corral", 1.0, Better::Lower),
            s(ROUND_TRIP_FLOOR, "slurm", 5.0, Better::Lower),
            s(ROUND_TRIP_FLOOR, "corral", 2.0, Better::Lower),
            s(FLUSH, "slurm", 0.3, Better::Lower),
            s(FLUSH, "corral", 0.5, Better::Lower),
            s(CLI_BOUND[0], "slurm", 100.0, Better::Higher),
            s(CLI_BOUND[0], "corral", 400.0, Better::Higher),
            s(CLI_BOUND[2], "corral", 200.0, Better::Higher),
        ];
        let f = floored(&rows(&samples));
        assert_eq!(f.len(), 3, "{f:?}");
        // Slurm: 10 ms a job; it answers before its disk, so no flush.
        assert_eq!(
            (
                f[0].system,
                f[0].ms,
                f[0].over_process,
                f[0].over_round_trip,
                f[0].over_durable
            ),
            ("Slurm", 10.0, Some(5.0), Some(2.0), None)
        );
        // Corral: 2.5 ms a job over 1, 2 and 2 + 0.5 ms.
        assert_eq!(
            (
                f[1].ms,
                f[1].over_process,
                f[1].over_round_trip,
                f[1].over_durable
            ),
            (2.5, Some(2.5), Some(1.25), Some(1.0))
        );
        assert_eq!((f[2].figure, f[2].ms), (CLI_BOUND[2], 5.0));
        let md = floors_markdown(&f);
        assert!(
            md.contains("| sbatch --hold, 1 client(s) | Corral | 2.50 | 2.50× | 1.25× | 1.00× |"),
            "{md}"
        );
        assert!(md.contains("| Slurm | 10.0 | 5.00× | 2.00× | – |"), "{md}");
        assert_eq!(floors_markdown(&[]), "", "nothing measured, nothing said");
    }

    #[test]
    fn tiny_jobs_are_set_against_the_cpu_of_their_own_processes() {
        let samples = vec![
            s(CORES, "slurm", 2.0, Better::Higher),
            s(CORES, "corral", 2.0, Better::Higher),
            s(CPU_FLOOR, "slurm", 4.0, Better::Lower),
            s(CPU_FLOOR, "corral", 2.0, Better::Lower),
            s(CPU_BOUND[1], "slurm", 50.0, Better::Higher),
            s(CPU_BOUND[1], "corral", 250.0, Better::Higher),
        ];
        let rows = rows(&samples);
        let b = cpu_bound(&rows);
        // Two cores at 4 ms a job: 500 a second; at 2 ms: 1,000.
        assert_eq!(
            b.iter().map(|b| (b.system, b.bound)).collect::<Vec<_>>(),
            [("Slurm", 500.0), ("Corral", 1000.0)]
        );
        let md = cpu_bound_markdown(&b, Some(2.0));
        assert!(md.contains("its 2 cores"), "{md}");
        assert!(
            md.contains(
                "| tiny jobs end to end, 2 submitter(s) | Corral | 250 | 2.00 | 1000 | 25.0% |"
            ),
            "{md}"
        );
        assert!(md.contains("| Slurm | 50.0 | 4.00 | 500 | 10.0% |"), "{md}");
        // The cores are context, not a figure to compare.
        assert!(!markdown(&rows).contains(CORES), "{}", markdown(&rows));
        // Nor is what the idle cluster did during the other's sruns.
        let idle = super::rows(&[
            s(IDLE_CPU, "slurm", 2.0, Better::Lower),
            s(IDLE_CPU, "corral", 40.0, Better::Lower),
        ]);
        assert_eq!(idle[0].advantage, None);
        assert!(
            markdown(&idle).contains("| 2.00 | 40.0 | – |"),
            "{}",
            markdown(&idle)
        );
        assert_eq!(cpu_bound_markdown(&b, None), "", "no cores measured");
        assert_eq!(cpu_bound_markdown(&[], Some(2.0)), "");
    }
}
