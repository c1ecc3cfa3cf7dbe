//! Line charts: [`LineChart`], [`line_chart`] and [`render_line_chart`].

use std::path::Path;

use crate::axis::{Axis, draw_x_grid, draw_x_label, draw_y_axis, draw_y_label, y_axis_margin};
use crate::labels::{draw_legend, draw_title};
use crate::{AXIS, Canvas, HEIGHT, PlotError, WIDTH, color, empty};

/// A chart of one or more lines, e.g. memory use against context length.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<LineSeries>,
}

/// One line: `(x, y)` points, joined in the order given.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LineSeries {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Draws `chart` and saves it as a PNG at `path`.
///
/// The x axis spans the data; the y axis starts at 0 (or lower, for
/// negative data). Each point gets a small square marker.
pub fn line_chart(chart: &LineChart, path: &Path) -> Result<(), PlotError> {
    render_line_chart(chart)?.save_png(path)
}

/// Draws `chart` on a new canvas (see [`line_chart`]).
pub fn render_line_chart(chart: &LineChart) -> Result<Canvas, PlotError> {
    if chart.series.is_empty() {
        return empty("the line chart has no series");
    }
    let (mut x_lo, mut x_hi) = (f64::INFINITY, f64::NEG_INFINITY);
    let (mut y_lo, mut y_hi) = (0.0f64, 0.0f64);
    for s in &chart.series {
        if s.points.is_empty() {
            return empty(format!("series '{}' has no points", s.name));
        }
        for &(x, y) in &s.points {
            if !x.is_finite() || !y.is_finite() {
                return empty(format!(
                    "series '{}' has a non-finite point ({x}, {y})",
                    s.name
                ));
            }
            x_lo = x_lo.min(x);
            x_hi = x_hi.max(x);
            y_lo = y_lo.min(y);
            y_hi = y_hi.max(y);
        }
    }
    let x_axis = Axis::nice(x_lo, x_hi, 6)?;
    let y_axis = Axis::nice(y_lo, y_hi, 5)?;

    let mut canvas = Canvas::new(WIDTH, HEIGHT);
    let width = WIDTH as i32;
    let height = HEIGHT as i32;
    draw_title(&mut canvas, &chart.title);

    let y_labels = y_axis.labels();
    let left = y_axis_margin(&y_labels, &chart.y_label).min(width / 3);
    let right = width - 30;
    let legend: Vec<(&str, [u8; 3])> = chart
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), color(i)))
        .collect();
    let legend_bottom = draw_legend(&mut canvas, &legend, left, right, 36);
    let bottom = height - 50;
    let top = (legend_bottom + 12).min(bottom - 60);

    draw_x_grid(&mut canvas, &x_axis, left, right, top, bottom);
    draw_y_axis(&mut canvas, &y_axis, &y_labels, left, right, top, bottom);
    draw_y_label(&mut canvas, &chart.y_label, top, bottom);
    draw_x_label(&mut canvas, &chart.x_label, left, right, bottom + 26);
    canvas.line(left, top, left, bottom, AXIS);
    canvas.line(left, bottom, right, bottom, AXIS);

    for (i, s) in chart.series.iter().enumerate() {
        let c = color(i);
        let pixels: Vec<(i32, i32)> = s
            .points
            .iter()
            .map(|&(x, y)| (x_axis.map(x, left, right), y_axis.map(y, bottom, top)))
            .collect();
        for pair in pixels.windows(2) {
            let ((x0, y0), (x1, y1)) = (pair[0], pair[1]);
            // Two pixels thick so the colour reads clearly.
            canvas.line(x0, y0, x1, y1, c);
            canvas.line(x0, y0 + 1, x1, y1 + 1, c);
        }
        for &(x, y) in &pixels {
            canvas.rect(x - 2, y - 2, x + 2, y + 2, c);
        }
    }
    Ok(canvas)
}
