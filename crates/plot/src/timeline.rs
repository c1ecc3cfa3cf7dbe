//! Lane timelines of execution traces: [`Timeline`], [`timeline`] and
//! [`render_timeline`].

use std::path::Path;

use crate::axis::{Axis, draw_x_grid, draw_x_label};
use crate::labels::{draw_legend, draw_title, fit_text, legend_layout};
use crate::{AXIS, Canvas, LANE_SHADE, PlotError, TEXT, TIMELINE_WIDTH, WHITE, color, empty};

/// An execution trace: coloured segments on horizontal lanes over time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    pub title: String,
    pub lanes: Vec<String>,
    pub segments: Vec<Segment>,
    pub x_label: String,
}

/// A span of time on one lane. `label` is a short kind such as `"G"` or
/// `"P"`; segments with the same label share a colour.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Segment {
    /// Index into [`Timeline::lanes`].
    pub lane: usize,
    pub start: f64,
    pub end: f64,
    pub label: String,
}

/// Draws `t` and saves it as a PNG at `path`.
///
/// One row per lane with its name on the left, segments as coloured boxes
/// along a time axis, and a legend of the segment labels.
pub fn timeline(t: &Timeline, path: &Path) -> Result<(), PlotError> {
    render_timeline(t)?.save_png(path)
}

/// Draws `t` on a new canvas (see [`timeline`]).
pub fn render_timeline(t: &Timeline) -> Result<Canvas, PlotError> {
    if t.lanes.is_empty() {
        return empty("the timeline has no lanes");
    }
    if t.segments.is_empty() {
        return empty("the timeline has no segments");
    }
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    let mut labels: Vec<&str> = Vec::new();
    for (i, s) in t.segments.iter().enumerate() {
        if s.lane >= t.lanes.len() {
            return empty(format!(
                "segment {i} is on lane {} but there are {} lanes",
                s.lane,
                t.lanes.len()
            ));
        }
        if !s.start.is_finite() || !s.end.is_finite() {
            return empty(format!(
                "segment {i} has a non-finite time ({}..{})",
                s.start, s.end
            ));
        }
        if s.end < s.start {
            return empty(format!(
                "segment {i} ends ({}) before it starts ({})",
                s.end, s.start
            ));
        }
        lo = lo.min(s.start);
        hi = hi.max(s.end);
        if !labels.contains(&s.label.as_str()) {
            labels.push(&s.label);
        }
    }
    let x_axis = Axis::nice(lo, hi, 8)?;

    let width = TIMELINE_WIDTH as i32;
    let lanes = t.lanes.len();
    // Rows shrink when there are many lanes so the image stays a sane size.
    let row = if lanes <= 30 {
        24
    } else {
        (720 / lanes as i32).max(2)
    };
    let lane_names: Vec<String> = t
        .lanes
        .iter()
        .map(|name| fit_text(name, width / 4, 1))
        .collect();
    let left = lane_names
        .iter()
        .map(|n| Canvas::text_width(n, 1))
        .max()
        .unwrap_or(0)
        + 20;
    let right = width - 30;
    let legend: Vec<(&str, [u8; 3])> = labels
        .iter()
        .enumerate()
        .map(|(i, l)| (*l, color(i)))
        .collect();
    let legend_bottom = legend_layout(&legend, left, right, 36).1;
    let top = legend_bottom + 10;
    let bottom = top.saturating_add(row.saturating_mul(lanes as i32));
    let height = bottom.saturating_add(50);

    let mut canvas = Canvas::new(TIMELINE_WIDTH, height as u32);
    draw_title(&mut canvas, &t.title);
    draw_legend(&mut canvas, &legend, left, right, 36);

    for (i, name) in lane_names.iter().enumerate() {
        let y = top + row * i as i32;
        if i % 2 == 1 {
            canvas.rect(left, y, right, y + row - 1, LANE_SHADE);
        }
        if row >= 9 {
            let text_y = y + (row - Canvas::text_height(1)) / 2;
            canvas.text(
                left - 10 - Canvas::text_width(name, 1),
                text_y,
                name,
                1,
                TEXT,
            );
        }
    }
    draw_x_grid(&mut canvas, &x_axis, left, right, top, bottom);
    draw_x_label(&mut canvas, &t.x_label, left, right, bottom + 26);

    let pad = if row >= 8 { 3 } else { 0 };
    for s in &t.segments {
        let c = color(labels.iter().position(|l| *l == s.label).unwrap_or(0));
        let x0 = x_axis.map(s.start, left, right);
        let x1 = (x_axis.map(s.end, left, right) - 1).max(x0);
        let y0 = top + row * s.lane as i32 + pad;
        let y1 = y0 + row - 1 - 2 * pad;
        canvas.rect(x0, y0, x1, y1, c);
        let w = Canvas::text_width(&s.label, 1);
        if row >= 14 && w + 4 <= x1 - x0 {
            let text_y = y0 + (y1 - y0 + 1 - Canvas::text_height(1)) / 2;
            canvas.text((x0 + x1) / 2 - w / 2, text_y, &s.label, 1, WHITE);
        }
    }
    canvas.line(left, top, left, bottom, AXIS);
    canvas.line(left, bottom, right, bottom, AXIS);
    Ok(canvas)
}
