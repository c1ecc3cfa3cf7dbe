//! Grouped bar charts: [`BarChart`], [`bar_chart`] and [`render_bar_chart`].

use std::path::Path;

use crate::axis::{Axis, draw_y_axis, draw_y_label, y_axis_margin};
use crate::labels::{draw_legend, draw_title, fit_text};
use crate::{AXIS, Canvas, HEIGHT, PlotError, TEXT, WHITE, WIDTH, color, empty};

/// A grouped bar chart, e.g. speedup per model (groups) for each backend
/// (series).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BarChart {
    pub title: String,
    pub y_label: String,
    pub groups: Vec<String>,
    pub series: Vec<Series>,
    /// An optional dashed horizontal line, e.g. `(1.0, "baseline")`.
    pub reference: Option<(f64, String)>,
}

/// One set of bars; `values[i]` belongs to `groups[i]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    pub name: String,
    pub values: Vec<f64>,
}

/// Draws `chart` and saves it as a PNG at `path`.
///
/// One cluster per group with one bar per series, the value printed above
/// each bar, a legend, and a y axis that starts at 0.
pub fn bar_chart(chart: &BarChart, path: &Path) -> Result<(), PlotError> {
    render_bar_chart(chart)?.save_png(path)
}

/// Draws `chart` on a new canvas (see [`bar_chart`]).
pub fn render_bar_chart(chart: &BarChart) -> Result<Canvas, PlotError> {
    if chart.groups.is_empty() {
        return empty("the bar chart has no groups");
    }
    if chart.series.is_empty() {
        return empty("the bar chart has no series");
    }
    for s in &chart.series {
        if s.values.len() != chart.groups.len() {
            return empty(format!(
                "series '{}' has {} values but there are {} groups",
                s.name,
                s.values.len(),
                chart.groups.len()
            ));
        }
        if let Some(v) = s.values.iter().find(|v| !v.is_finite()) {
            return empty(format!("series '{}' has a non-finite value ({v})", s.name));
        }
    }
    let mut lo = 0.0f64;
    let mut hi = 0.0f64;
    for &v in chart.series.iter().flat_map(|s| &s.values) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if let Some((r, _)) = &chart.reference {
        if !r.is_finite() {
            return empty(format!("the reference value is not finite ({r})"));
        }
        lo = lo.min(*r);
        hi = hi.max(*r);
    }
    let y_axis = Axis::nice(lo, hi, 5)?;

    let mut canvas = Canvas::new(WIDTH, HEIGHT);
    let width = WIDTH as i32;
    let height = HEIGHT as i32;
    draw_title(&mut canvas, &chart.title);

    let y_labels = y_axis.labels();
    let left = (y_axis_margin(&y_labels, &chart.y_label)).min(width / 3);
    let right = width - 20;
    let legend: Vec<(&str, [u8; 3])> = chart
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), color(i)))
        .collect();
    let legend_bottom = draw_legend(&mut canvas, &legend, left, right, 36);
    let bottom = height - 40;
    // Room above the tallest bar for its value.
    let top = (legend_bottom + 18).min(bottom - 60);

    draw_y_axis(&mut canvas, &y_axis, &y_labels, left, right, top, bottom);
    draw_y_label(&mut canvas, &chart.y_label, top, bottom);

    let groups = chart.groups.len();
    let n_series = chart.series.len();
    let cluster = f64::from(right - left) / groups as f64;
    let bar = cluster * 0.8 / n_series as f64;
    // A 1-pixel gap between neighbouring bars when they are wide enough.
    let gap = if bar >= 4.0 { 1 } else { 0 };
    let zero = y_axis.map(0.0, bottom, top);
    // Values are drawn last, so the reference line cannot cross them.
    let mut values = Vec::new();
    for (g, group) in chart.groups.iter().enumerate() {
        let cluster_left = f64::from(left) + g as f64 * cluster;
        for (s, series) in chart.series.iter().enumerate() {
            let v = series.values[g];
            let x0 = (cluster_left + cluster * 0.1 + s as f64 * bar).round() as i32;
            let x1 =
                ((cluster_left + cluster * 0.1 + (s + 1) as f64 * bar).round() as i32 - 1 - gap)
                    .max(x0);
            let y = y_axis.map(v, bottom, top);
            canvas.rect(x0, zero, x1, y, color(s));
            let label = format_value(v);
            let label_x = (x0 + x1) / 2 - Canvas::text_width(&label, 1) / 2;
            let label_y = if v >= 0.0 { y - 10 } else { y + 4 };
            values.push((label_x, label_y, label));
        }
        let name = fit_text(group, (cluster as i32 - 4).max(0), 1);
        let center = (cluster_left + cluster / 2.0).round() as i32;
        canvas.text(
            center - Canvas::text_width(&name, 1) / 2,
            bottom + 10,
            &name,
            1,
            TEXT,
        );
    }

    canvas.line(left, top, left, bottom, AXIS);
    canvas.line(left, zero, right, zero, AXIS);

    if let Some((r, label)) = &chart.reference {
        let y = y_axis.map(*r, bottom, top);
        let mut x = left;
        while x <= right {
            canvas.line(x, y, (x + 5).min(right), y, TEXT);
            x += 10;
        }
        let w = Canvas::text_width(label, 1);
        canvas.text(right - w - 2, y - 10, label, 1, TEXT);
    }
    for (x, y, label) in values {
        let w = Canvas::text_width(&label, 1);
        canvas.rect(x - 1, y - 1, x + w, y + Canvas::text_height(1), WHITE);
        canvas.text(x, y, &label, 1, TEXT);
    }
    Ok(canvas)
}

/// A bar's value label: two decimals, fewer for large numbers.
fn format_value(v: f64) -> String {
    if v.abs() >= 1e6 {
        format!("{v:.2e}")
    } else if v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}
