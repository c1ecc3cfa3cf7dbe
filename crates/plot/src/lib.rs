//! Simple charts drawn straight to PNG files.
//!
//! `arbor bench` uses this crate to turn its numbers into pictures:
//! speedup tables become grouped bar charts ([`bar_chart`]), memory
//! sweeps become line charts ([`line_chart`]), and execution traces
//! become lane timelines ([`timeline`]).
//!
//! Everything is drawn on a plain RGB [`Canvas`] with a built-in 5x7
//! bitmap font, so there are no fonts or system libraries to install;
//! the only dependency is the `png` encoder.
//!
//! The chart functions check their input before drawing: missing data,
//! mismatched lengths or non-finite numbers give [`PlotError::Empty`]
//! instead of a panic or a blank picture. Each chart also has a
//! `render_*` twin that returns the [`Canvas`] without saving it.

mod font;

use std::path::Path;

use font::{GLYPH_HEIGHT, GLYPH_WIDTH, glyph};

/// Why a chart could not be drawn or saved.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("could not write the PNG file: {0}")]
    Io(#[from] std::io::Error),
    #[error("could not encode the PNG image: {0}")]
    Png(String),
    #[error("nothing sensible to plot: {0}")]
    Empty(String),
}

/// Eight colours that are easy to tell apart (from the Tableau palette).
/// Series, lines and timeline labels take them in order and wrap around
/// after the eighth.
pub const PALETTE: [[u8; 3]; 8] = [
    [31, 119, 180],  // blue
    [255, 127, 14],  // orange
    [44, 160, 44],   // green
    [214, 39, 40],   // red
    [148, 103, 189], // purple
    [140, 86, 75],   // brown
    [227, 119, 194], // pink
    [23, 190, 207],  // cyan
];

const WHITE: [u8; 3] = [255, 255, 255];
const TEXT: [u8; 3] = [30, 30, 30];
const AXIS: [u8; 3] = [70, 70, 70];
const GRID: [u8; 3] = [225, 225, 225];
const LANE_SHADE: [u8; 3] = [246, 246, 246];

/// Default size of bar and line charts.
const WIDTH: u32 = 900;
const HEIGHT: u32 = 500;
/// Timelines are wider; their height follows the number of lanes.
const TIMELINE_WIDTH: u32 = 1200;

/// An RGB image with a white background and a few drawing primitives.
///
/// Coordinates are signed so that shapes may hang off the edges; whatever
/// falls outside the canvas is clipped away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canvas {
    width: u32,
    height: u32,
    /// Row-major RGB, three bytes per pixel.
    pixels: Vec<u8>,
}

impl Canvas {
    /// A `width` x `height` canvas filled with white.
    pub fn new(width: u32, height: u32) -> Self {
        Canvas {
            width,
            height,
            pixels: vec![255; width as usize * height as usize * 3],
        }
    }

    pub fn width(&self) -> u32 {
        self.width
    }

    pub fn height(&self) -> u32 {
        self.height
    }

    /// The raw pixels: row-major RGB, three bytes per pixel.
    pub fn pixels(&self) -> &[u8] {
        &self.pixels
    }

    /// Fills the rectangle with corners `(x0, y0)` and `(x1, y1)`, both
    /// included, in any order.
    pub fn rect(&mut self, x0: i32, y0: i32, x1: i32, y1: i32, color: [u8; 3]) {
        self.fill(x0.into(), y0.into(), x1.into(), y1.into(), color);
    }

    /// Draws a 1-pixel line from `(x0, y0)` to `(x1, y1)`, both ends
    /// included (Bresenham).
    pub fn line(&mut self, x0: i32, y0: i32, x1: i32, y1: i32, color: [u8; 3]) {
        // Straight lines are thin rectangles, which clip without walking
        // every off-canvas pixel.
        if x0 == x1 || y0 == y1 {
            self.rect(x0, y0, x1, y1, color);
            return;
        }
        let (mut x, mut y) = (i64::from(x0), i64::from(y0));
        let (x1, y1) = (i64::from(x1), i64::from(y1));
        let (w, h) = (i64::from(self.width), i64::from(self.height));
        // Entirely beyond one edge: nothing to draw.
        if (x < 0 && x1 < 0) || (y < 0 && y1 < 0) || (x >= w && x1 >= w) || (y >= h && y1 >= h) {
            return;
        }
        let dx = (x1 - x).abs();
        let dy = -(y1 - y).abs();
        let sx = if x < x1 { 1 } else { -1 };
        let sy = if y < y1 { 1 } else { -1 };
        let mut err = dx + dy;
        loop {
            self.put(x, y, color);
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// Writes `s` with its top-left corner at `(x, y)` in the built-in
    /// 5x7 font, each font pixel drawn as a `scale` x `scale` block, with
    /// one (scaled) blank column between characters. Characters outside
    /// printable ASCII are drawn as `?`.
    pub fn text(&mut self, x: i32, y: i32, s: &str, scale: u32, color: [u8; 3]) {
        let scale = i64::from(scale);
        let advance = i64::from(GLYPH_WIDTH + 1) * scale;
        let mut left = i64::from(x);
        for c in s.chars() {
            if left >= i64::from(self.width) {
                break;
            }
            for (row, bits) in glyph(c).iter().enumerate() {
                for col in 0..GLYPH_WIDTH {
                    if bits & (1 << (GLYPH_WIDTH - 1 - col)) != 0 {
                        let px = left + i64::from(col) * scale;
                        let py = i64::from(y) + row as i64 * scale;
                        self.fill(px, py, px + scale - 1, py + scale - 1, color);
                    }
                }
            }
            left += advance;
        }
    }

    /// Like [`text`](Self::text) but turned a quarter turn
    /// anticlockwise, reading from bottom to top. `(x, y)` is the top-left
    /// corner of the result, which is `7 * scale` wide and
    /// `text_width(s, scale)` tall.
    pub fn text_vertical(&mut self, x: i32, y: i32, s: &str, scale: u32, color: [u8; 3]) {
        let scale = i64::from(scale);
        let bottom = i64::from(y) + i64::from(Self::text_width(s, scale as u32));
        for (i, c) in s.chars().enumerate() {
            for (row, bits) in glyph(c).iter().enumerate() {
                for col in 0..GLYPH_WIDTH {
                    if bits & (1 << (GLYPH_WIDTH - 1 - col)) != 0 {
                        // Column `along` of the unrotated text runs upwards
                        // from the bottom; glyph rows run left to right.
                        let along = i as i64 * i64::from(GLYPH_WIDTH + 1) + i64::from(col);
                        let px = i64::from(x) + row as i64 * scale;
                        let py = bottom - (along + 1) * scale;
                        self.fill(px, py, px + scale - 1, py + scale - 1, color);
                    }
                }
            }
        }
    }

    /// Width in pixels of `s` drawn by [`text`](Self::text): 5 pixels per
    /// character plus 1 between characters, times `scale`.
    pub fn text_width(s: &str, scale: u32) -> i32 {
        let n = s.chars().count() as i64;
        if n == 0 {
            return 0;
        }
        let width = (n * i64::from(GLYPH_WIDTH + 1) - 1) * i64::from(scale);
        width.min(i64::from(i32::MAX)) as i32
    }

    /// Height in pixels of one line of text at `scale`.
    pub fn text_height(scale: u32) -> i32 {
        (i64::from(GLYPH_HEIGHT) * i64::from(scale)).min(i64::from(i32::MAX)) as i32
    }

    /// The colour at `(x, y)`.
    ///
    /// # Panics
    /// If `(x, y)` is outside the canvas.
    pub fn pixel(&self, x: u32, y: u32) -> [u8; 3] {
        assert!(
            x < self.width && y < self.height,
            "pixel ({x}, {y}) is outside the {}x{} canvas",
            self.width,
            self.height
        );
        let i = (y as usize * self.width as usize + x as usize) * 3;
        [self.pixels[i], self.pixels[i + 1], self.pixels[i + 2]]
    }

    /// The image encoded as an 8-bit RGB PNG.
    pub fn to_png(&self) -> Result<Vec<u8>, PlotError> {
        if self.width == 0 || self.height == 0 {
            return Err(PlotError::Png(format!(
                "a {}x{} canvas has no pixels to save",
                self.width, self.height
            )));
        }
        let mut bytes = Vec::new();
        let mut encoder = png::Encoder::new(&mut bytes, self.width, self.height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().map_err(png_error)?;
        writer.write_image_data(&self.pixels).map_err(png_error)?;
        writer.finish().map_err(png_error)?;
        Ok(bytes)
    }

    /// Encodes the image as PNG and writes it to `path`.
    pub fn save_png(&self, path: &Path) -> Result<(), PlotError> {
        let bytes = self.to_png()?;
        std::fs::write(path, bytes)?;
        Ok(())
    }

    fn put(&mut self, x: i64, y: i64, color: [u8; 3]) {
        if (0..i64::from(self.width)).contains(&x) && (0..i64::from(self.height)).contains(&y) {
            let i = (y as usize * self.width as usize + x as usize) * 3;
            self.pixels[i..i + 3].copy_from_slice(&color);
        }
    }

    /// Fills a rectangle given by inclusive corners, clipped to the canvas.
    fn fill(&mut self, x0: i64, y0: i64, x1: i64, y1: i64, color: [u8; 3]) {
        let xa = x0.min(x1).max(0);
        let xb = x0.max(x1).min(i64::from(self.width) - 1);
        let ya = y0.min(y1).max(0);
        let yb = y0.max(y1).min(i64::from(self.height) - 1);
        if xa > xb || ya > yb {
            return;
        }
        let stride = self.width as usize * 3;
        for y in ya as usize..=yb as usize {
            let row =
                &mut self.pixels[y * stride + xa as usize * 3..y * stride + (xb as usize + 1) * 3];
            for pixel in row.chunks_exact_mut(3) {
                pixel.copy_from_slice(&color);
            }
        }
    }
}

fn png_error(e: png::EncodingError) -> PlotError {
    match e {
        png::EncodingError::IoError(e) => PlotError::Io(e),
        other => PlotError::Png(other.to_string()),
    }
}

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

fn empty<T>(message: impl Into<String>) -> Result<T, PlotError> {
    Err(PlotError::Empty(message.into()))
}

fn color(i: usize) -> [u8; 3] {
    PALETTE[i % PALETTE.len()]
}

/// A linear axis from `lo` to `hi` with a tick every `step`, all round
/// numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Axis {
    lo: f64,
    hi: f64,
    step: f64,
}

impl Axis {
    /// Round numbers covering `min..=max` in about `ticks` steps, each
    /// step 1, 2 or 5 times a power of ten.
    fn nice(min: f64, max: f64, ticks: usize) -> Result<Axis, PlotError> {
        let (mut min, mut max) = (min, max);
        if max <= min {
            // A single value: give it some room.
            let pad = if min == 0.0 { 1.0 } else { min.abs() * 0.1 };
            min -= pad;
            max += pad;
        }
        // Try steps of 1, 2 and 5 times the nearby powers of ten and keep
        // the one whose tick count is closest to the target (ties go to
        // the larger step).
        let target = ticks.max(1) as f64;
        let power = ((max - min) / target).log10().floor();
        let mut best: Option<(f64, f64, f64)> = None;
        for p in [power - 1.0, power, power + 1.0] {
            for m in [1.0, 2.0, 5.0] {
                let step = m * 10f64.powf(p);
                let lo = (min / step + 1e-9).floor() * step;
                let hi = (max / step - 1e-9).ceil() * step;
                let miss = ((hi - lo) / step - target).abs();
                let better = match best {
                    None => true,
                    Some((b_lo, b_hi, b_step)) => miss <= ((b_hi - b_lo) / b_step - target).abs(),
                };
                if better {
                    best = Some((lo, hi, step));
                }
            }
        }
        let (lo, hi, step) = best.unwrap_or((f64::NAN, f64::NAN, f64::NAN));
        if !(step.is_finite() && step > 0.0 && lo.is_finite() && hi.is_finite() && hi > lo) {
            return empty(format!("cannot make an axis for the range {min}..{max}"));
        }
        Ok(Axis { lo, hi, step })
    }

    /// The tick values, `lo` to `hi` inclusive.
    fn ticks(&self) -> Vec<f64> {
        let count = ((self.hi - self.lo) / self.step).round() as usize;
        (0..=count.min(100))
            .map(|i| self.lo + i as f64 * self.step)
            .collect()
    }

    /// `(tick value, label)` pairs.
    fn labels(&self) -> Vec<(f64, String)> {
        self.ticks()
            .into_iter()
            .map(|v| (v, format_tick(v, self.step)))
            .collect()
    }

    /// The pixel for `v` when `lo` maps to `from` and `hi` to `to`.
    fn map(&self, v: f64, from: i32, to: i32) -> i32 {
        let t = (v - self.lo) / (self.hi - self.lo);
        (f64::from(from) + t * f64::from(to - from)).round() as i32
    }
}

/// A tick label with just enough decimals for the step.
fn format_tick(v: f64, step: f64) -> String {
    if v.abs() < step * 1e-6 {
        return "0".to_string();
    }
    if v.abs() >= 1e6 || step < 1e-3 {
        return format!("{v:.1e}");
    }
    let decimals = if step >= 1.0 {
        0
    } else {
        (-(step.log10() + 1e-9).floor()) as usize
    };
    format!("{v:.decimals$}")
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

/// `s`, cut short with ".." if it would be wider than `max_width`.
fn fit_text(s: &str, max_width: i32, scale: u32) -> String {
    if Canvas::text_width(s, scale) <= max_width {
        return s.to_string();
    }
    let mut out = String::new();
    for c in s.chars() {
        out.push(c);
        if Canvas::text_width(&format!("{out}.."), scale) > max_width {
            out.pop();
            break;
        }
    }
    out + ".."
}

fn draw_title(canvas: &mut Canvas, title: &str) {
    let w = Canvas::text_width(title, 2);
    let x = (canvas.width() as i32 - w) / 2;
    canvas.text(x.max(4), 12, title, 2, TEXT);
}

/// Where each legend item goes: a swatch and its name, left to right,
/// wrapping onto new rows. Returns the item positions and the y just
/// below the legend.
fn legend_layout(
    items: &[(&str, [u8; 3])],
    left: i32,
    right: i32,
    top: i32,
) -> (Vec<(i32, i32)>, i32) {
    let mut positions = Vec::with_capacity(items.len());
    let (mut x, mut y) = (left, top);
    for (name, _) in items {
        let w = 14i32.saturating_add(Canvas::text_width(name, 1));
        if x > left && x.saturating_add(w) > right {
            x = left;
            y += 16;
        }
        positions.push((x, y));
        x = x.saturating_add(w).saturating_add(18);
    }
    (positions, y + 12)
}

fn draw_legend(
    canvas: &mut Canvas,
    items: &[(&str, [u8; 3])],
    left: i32,
    right: i32,
    top: i32,
) -> i32 {
    let (positions, bottom) = legend_layout(items, left, right, top);
    for ((name, c), (x, y)) in items.iter().zip(positions) {
        canvas.rect(x, y, x + 9, y + 9, *c);
        canvas.text(x + 14, y + 1, name, 1, TEXT);
    }
    bottom
}

/// Left margin needed for the y tick labels and the y axis title.
fn y_axis_margin(labels: &[(f64, String)], y_label: &str) -> i32 {
    let widest = labels
        .iter()
        .map(|(_, l)| Canvas::text_width(l, 1))
        .max()
        .unwrap_or(0);
    let title = if y_label.is_empty() {
        0
    } else {
        Canvas::text_height(1) + 8
    };
    10 + title + widest + 8
}

/// Horizontal grid lines and tick labels for a y axis.
fn draw_y_axis(
    canvas: &mut Canvas,
    axis: &Axis,
    labels: &[(f64, String)],
    left: i32,
    right: i32,
    top: i32,
    bottom: i32,
) {
    for (v, label) in labels {
        let y = axis.map(*v, bottom, top);
        canvas.line(left, y, right, y, GRID);
        canvas.line(left - 4, y, left, y, AXIS);
        let w = Canvas::text_width(label, 1);
        canvas.text(left - 7 - w, y - 3, label, 1, TEXT);
    }
}

/// Vertical grid lines and tick labels for an x axis along `bottom`.
fn draw_x_grid(canvas: &mut Canvas, axis: &Axis, left: i32, right: i32, top: i32, bottom: i32) {
    for (v, label) in axis.labels() {
        let x = axis.map(v, left, right);
        canvas.line(x, top, x, bottom, GRID);
        canvas.line(x, bottom, x, bottom + 4, AXIS);
        let w = Canvas::text_width(&label, 1);
        canvas.text(x - w / 2, bottom + 8, &label, 1, TEXT);
    }
}

fn draw_y_label(canvas: &mut Canvas, label: &str, top: i32, bottom: i32) {
    let h = Canvas::text_width(label, 1);
    canvas.text_vertical(10, (top + bottom) / 2 - h / 2, label, 1, TEXT);
}

fn draw_x_label(canvas: &mut Canvas, label: &str, left: i32, right: i32, y: i32) {
    let w = Canvas::text_width(label, 1);
    canvas.text((left + right) / 2 - w / 2, y, label, 1, TEXT);
}

#[cfg(test)]
mod tests;
