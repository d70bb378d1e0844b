//! The soak over time (SVG, and PNG when `rsvg-convert` is installed: the
//! bench's plotters has only the SVG backend, and a bitmap one would pull a
//! font stack in). Three panels on one time axis: daemon RSS, its open fds,
//! the journal and snapshot sizes. Each daemon instance is its own line, so
//! restarts show as gaps; restart times are vertical lines, SIGTERM blue and
//! SIGKILL red.

use super::sample::Sample;
use super::Restart;
use crate::plot::{draw_legend, legend_line};
use plotters::prelude::*;
use std::path::Path;

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

const TERM: RGBColor = RGBColor(40, 90, 220);
const KILL: RGBColor = RGBColor(220, 40, 40);
const LINE: RGBColor = RGBColor(30, 30, 30);
const SNAPSHOT: RGBColor = RGBColor(30, 150, 60);

/// One plotted quantity: its name and value in a sample.
struct Series {
    name: &'static str,
    color: RGBColor,
    value: fn(&Sample) -> Option<f64>,
    /// A quantity of the daemon process (a line per instance), not of the
    /// store files, which outlive it.
    per_daemon: bool,
}

pub fn write(svg: &Path, samples: &[Sample], restarts: &[Restart]) -> Result<(), String> {
    let root = SVGBackend::new(svg, (1200, 960)).into_drawing_area();
    root.fill(&WHITE).map_err(text)?;
    let panels = root.split_evenly((3, 1));
    let rss = [Series {
        name: "RSS",
        color: LINE,
        value: |s| kib(s.daemon.as_ref()?.rss_kib),
        per_daemon: true,
    }];
    let fds = [Series {
        name: "open fds",
        color: LINE,
        value: |s| s.daemon.as_ref()?.fds.map(|v| v as f64),
        per_daemon: true,
    }];
    let files = [
        Series {
            name: "journal",
            color: LINE,
            value: |s| kib(s.journal_bytes),
            per_daemon: false,
        },
        Series {
            name: "snapshot",
            color: SNAPSHOT,
            value: |s| kib(s.snapshot_bytes),
            per_daemon: false,
        },
    ];
    let t_max = samples.last().map_or(1.0, |s| s.t_s).max(1.0);
    let ctx = Ctx {
        samples,
        restarts,
        t_max,
    };
    ctx.panel(&panels[0], "daemon RSS", "MiB", &rss, true)?;
    ctx.panel(
        &panels[1],
        "daemon open file descriptors",
        "fds",
        &fds,
        false,
    )?;
    ctx.panel(&panels[2], "store files", "KiB", &files, false)?;
    root.present().map_err(text)
}

struct Ctx<'a> {
    samples: &'a [Sample],
    restarts: &'a [Restart],
    t_max: f64,
}

impl Ctx<'_> {
    fn panel(
        &self,
        area: &Area,
        title: &str,
        unit: &str,
        series: &[Series],
        restart_legend: bool,
    ) -> Result<(), String> {
        let y_max = series
            .iter()
            .flat_map(|s| self.samples.iter().filter_map(s.value))
            .fold(0.0, f64::max)
            .max(1.0)
            * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(34)
            .y_label_area_size(56)
            .build_cartesian_2d(0f64..self.t_max, 0f64..y_max)
            .map_err(text)?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .y_desc(unit)
            .draw()
            .map_err(text)?;
        for s in series {
            let color = s.color;
            let mut labelled = false;
            for run in self.runs(s) {
                let drawn = chart
                    .draw_series(LineSeries::new(run, color.stroke_width(2)))
                    .map_err(text)?;
                // One legend entry per quantity, not per daemon instance.
                if !labelled && series.len() > 1 {
                    drawn.label(s.name).legend(legend_line(color));
                    labelled = true;
                }
            }
        }
        let (mut term_labelled, mut kill_labelled) = (false, false);
        for r in self.restarts {
            let kill = r.signal == "SIGKILL";
            let color = if kill { KILL } else { TERM };
            let line = vec![(r.t_s, 0.0), (r.t_s, y_max)];
            let drawn = chart
                .draw_series(LineSeries::new(line, color.stroke_width(1)))
                .map_err(text)?;
            let first = if kill {
                !std::mem::replace(&mut kill_labelled, true)
            } else {
                !std::mem::replace(&mut term_labelled, true)
            };
            if restart_legend && first {
                drawn
                    .label(format!("restart, {}", r.signal))
                    .legend(legend_line(color));
            }
        }
        if (restart_legend && !self.restarts.is_empty()) || series.len() > 1 {
            draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
        }
        Ok(())
    }

    /// The samples as lines of (t, value) points: one per daemon pid for a
    /// quantity of the daemon (a restart starts a new line), else one.
    fn runs(&self, series: &Series) -> Vec<Vec<(f64, f64)>> {
        let mut runs: Vec<Vec<(f64, f64)>> = Vec::new();
        let mut last = None;
        for s in self.samples {
            let Some(v) = (series.value)(s) else {
                continue;
            };
            let owner = if series.per_daemon {
                match &s.daemon {
                    Some(d) => Some(d.pid),
                    None => continue,
                }
            } else {
                None
            };
            if runs.is_empty() || last != owner {
                runs.push(Vec::new());
                last = owner;
            }
            if let Some(run) = runs.last_mut() {
                run.push((s.t_s, v));
            }
        }
        runs
    }
}

/// KiB → MiB, bytes → KiB.
fn kib(v: Option<u64>) -> Option<f64> {
    v.map(|v| v as f64 / 1024.0)
}

/// plotters' errors borrow the backend; keep only their text.
fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The SVG as PNG next to it, by `rsvg-convert` (Debian: librsvg2-bin).
/// Returns why not when it cannot.
pub fn to_png(svg: &Path, png: &Path) -> Result<(), String> {
    let out = std::process::Command::new("rsvg-convert")
        .args(["--background-color", "white", "-o"])
        .arg(png)
        .arg(svg)
        .output()
        .map_err(|e| format!("rsvg-convert (apt-get install librsvg2-bin): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "rsvg-convert: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
