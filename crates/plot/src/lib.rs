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
//!
//! Each chart kind lives in its own module (`bar`, `line`, `timeline`);
//! they share the canvas (`canvas`, `font`), the axes and grid (`axis`)
//! and the titles and legends (`labels`).

mod axis;
mod bar;
mod canvas;
mod font;
mod labels;
mod line;
mod timeline;

pub use bar::{BarChart, Series, bar_chart, render_bar_chart};
pub use canvas::Canvas;
pub use line::{LineChart, LineSeries, line_chart, render_line_chart};
pub use timeline::{Segment, Timeline, render_timeline, timeline};

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

fn empty<T>(message: impl Into<String>) -> Result<T, PlotError> {
    Err(PlotError::Empty(message.into()))
}

fn color(i: usize) -> [u8; 3] {
    PALETTE[i % PALETTE.len()]
}

#[cfg(test)]
mod tests;
