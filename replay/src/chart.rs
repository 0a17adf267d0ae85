//! Draws a replay's utilisation and queue length over time, as PNG or SVG
//! (by the file's extension).

use std::path::Path;

use plotters::prelude::*;

use crate::replay::Sample;

/// Why a chart could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("cannot draw chart {path}: {msg}")]
pub struct ChartError {
    path: String,
    msg: String,
}

/// At most this many points per series; more are thinned evenly.
const MAX_POINTS: usize = 4000;

/// Where Debian and most distributions keep a sans-serif TrueType font;
/// plotters lays out chart text with it.
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

pub fn register_font() -> Result<(), String> {
    for p in FONT_PATHS {
        if let Ok(bytes) = std::fs::read(p) {
            // plotters keeps fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            return plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                .map_err(|_| format!("{p} is not a usable font"));
        }
    }
    Err("no TrueType font found for chart text (install fonts-dejavu-core)".into())
}

pub fn draw(path: &Path, title: &str, samples: &[Sample]) -> Result<(), ChartError> {
    let err = |e: &dyn std::fmt::Display| ChartError {
        path: path.display().to_string(),
        msg: e.to_string(),
    };
    let svg = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    register_font().map_err(|e| err(&e))?;
    if svg {
        let root = SVGBackend::new(path, (1200, 700)).into_drawing_area();
        plot(&root, title, samples).map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))
    } else {
        let root = BitMapBackend::new(path, (1200, 700)).into_drawing_area();
        plot(&root, title, samples).map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))
    }
}

fn plot<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    samples: &[Sample],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let step = samples.len().div_ceil(MAX_POINTS).max(1);
    let pts: Vec<&Sample> = samples.iter().step_by(step).collect();
    let t0 = pts.first().map_or(0, |s| s.t);
    let days = |t: u64| (t - t0) as f64 / 86_400.0;
    let span = pts.last().map_or(1.0, |s| days(s.t)).max(1e-6);
    let most_queued = pts.iter().map(|s| s.queued).max().unwrap_or(0).max(1) as f64;
    let (top, bottom) = root.split_vertically(350);

    let mut c = ChartBuilder::on(&top)
        .caption(format!("{title}: utilisation"), ("sans-serif", 22))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..span, 0.0..1.0)?;
    c.configure_mesh().x_desc("days").y_desc("busy").draw()?;
    c.draw_series(LineSeries::new(
        pts.iter().map(|s| (days(s.t), s.busy)),
        &BLUE,
    ))?;

    let mut c = ChartBuilder::on(&bottom)
        .caption("queue length", ("sans-serif", 22))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..span, 0.0..most_queued)?;
    c.configure_mesh().x_desc("days").y_desc("jobs").draw()?;
    c.draw_series(LineSeries::new(
        pts.iter().map(|s| (days(s.t), s.queued as f64)),
        &RED,
    ))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_chart_has_both_series() {
        let samples: Vec<Sample> = (0..100)
            .map(|i| Sample {
                t: i * 3600,
                busy: (i % 10) as f64 / 10.0,
                queued: (i % 7) as usize,
            })
            .collect();
        let path = std::env::temp_dir().join(format!("corral-chart-{}.svg", std::process::id()));
        draw(&path, "test", &samples).expect("drawn");
        let svg = std::fs::read_to_string(&path).expect("written");
        let _ = std::fs::remove_file(&path);
        assert!(svg.contains("test: utilisation"));
        assert!(svg.contains("queue length"));
        assert!(svg.matches("<polyline").count() >= 2, "two line series");
    }
}
