//! Latency CDFs (SVG): one row per worker count, ADD left, DEL right, one
//! line per variant and implementation, log-scale milliseconds.

use crate::churn::Run;
use crate::setup::{Impl, Variant};
use plotters::prelude::*;
use std::path::Path;

pub fn write_svg(path: &Path, runs: &[Run], workers: &[usize]) -> Result<(), String> {
    let rows = workers.len().max(1);
    let root = SVGBackend::new(path, (1200, 360 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((rows, 2));
    for (i, area) in panels.iter().enumerate() {
        let w = workers.get(i / 2).copied().unwrap_or(0);
        let of_w: Vec<&Run> = runs.iter().filter(|r| r.workers == w).collect();
        panel(area, &of_w, w, i % 2 == 0)?;
    }
    root.present().map_err(|e| e.to_string())
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn panel(area: &Area, runs: &[&Run], w: usize, add: bool) -> Result<(), String> {
    let values = |r: &Run| {
        if add {
            r.add_ms.clone()
        } else {
            r.del_ms.clone()
        }
    };
    let all: Vec<f64> = runs
        .iter()
        .flat_map(|r| values(r))
        .filter(|v| *v > 0.0)
        .collect();
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min).min(1.0) * 0.8;
    let hi = all.iter().copied().fold(1.0, f64::max) * 1.25;
    let what = if add { "ADD" } else { "DEL" };
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{what} latency CDF, W = {w}"), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(38)
        .y_label_area_size(48)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..1f64)
        .map_err(text)?;
    chart
        .configure_mesh()
        .x_desc("ms (log scale)")
        .y_desc("fraction of pods")
        .draw()
        .map_err(text)?;
    for run in runs {
        let pts = cdf(values(run));
        if pts.is_empty() {
            continue;
        }
        let color = color(run.imp, run.variant);
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(text)?
            .label(format!("{} {}", run.imp.name(), run.variant.name()))
            .legend(legend_line(color));
    }
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight)
}

/// A legend entry's sample: a short line in the series' colour.
pub fn legend_line(color: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
}

/// The legend box, on a light background where it covers lines.
pub fn draw_legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    at: SeriesLabelPosition,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(at)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(text)
}

/// plotters' errors borrow the backend; keep only their text.
fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Sorted values as (value, fraction ≤ value) steps.
fn cdf(mut v: Vec<f64>) -> Vec<(f64, f64)> {
    v.retain(|x| *x > 0.0);
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    v.into_iter()
        .enumerate()
        .map(|(i, x)| (x, (i + 1) as f64 / n))
        .collect()
}

fn color(imp: Impl, variant: Variant) -> RGBColor {
    match (imp, variant) {
        (Impl::Reference, Variant::Full) => RGBColor(200, 30, 30),
        (Impl::Reference, Variant::Bare) => RGBColor(240, 140, 40),
        (Impl::Cnikit, Variant::Full) => RGBColor(30, 60, 200),
        (Impl::Cnikit, Variant::Bare) => RGBColor(40, 170, 220),
        (Impl::CnikitDaemon, Variant::Full) => RGBColor(120, 40, 180),
        (Impl::CnikitDaemon, Variant::Bare) => RGBColor(190, 110, 230),
        (Impl::Floor, _) => RGBColor(30, 150, 60),
        (Impl::Upstream, Variant::Full) => RGBColor(120, 80, 30),
        (Impl::Upstream, Variant::Bare) => RGBColor(180, 140, 80),
    }
}
