//! Linear axes with round-number ticks ([`Axis`]), and the grid lines,
//! tick labels and axis titles drawn from them.

use crate::{AXIS, Canvas, GRID, PlotError, TEXT, empty};

/// A linear axis from `lo` to `hi` with a tick every `step`, all round
/// numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Axis {
    pub(crate) lo: f64,
    pub(crate) hi: f64,
    pub(crate) step: f64,
}

impl Axis {
    /// Round numbers covering `min..=max` in about `ticks` steps, each
    /// step 1, 2 or 5 times a power of ten.
    pub(crate) fn nice(min: f64, max: f64, ticks: usize) -> Result<Axis, PlotError> {
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
    pub(crate) fn ticks(&self) -> Vec<f64> {
        let count = ((self.hi - self.lo) / self.step).round() as usize;
        (0..=count.min(100))
            .map(|i| self.lo + i as f64 * self.step)
            .collect()
    }

    /// `(tick value, label)` pairs.
    pub(crate) fn labels(&self) -> Vec<(f64, String)> {
        self.ticks()
            .into_iter()
            .map(|v| (v, format_tick(v, self.step)))
            .collect()
    }

    /// The pixel for `v` when `lo` maps to `from` and `hi` to `to`.
    pub(crate) fn map(&self, v: f64, from: i32, to: i32) -> i32 {
        let t = (v - self.lo) / (self.hi - self.lo);
        (f64::from(from) + t * f64::from(to - from)).round() as i32
    }
}

/// A tick label with just enough decimals for the step.
pub(crate) fn format_tick(v: f64, step: f64) -> String {
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

/// Left margin needed for the y tick labels and the y axis title.
pub(crate) fn y_axis_margin(labels: &[(f64, String)], y_label: &str) -> i32 {
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
pub(crate) fn draw_y_axis(
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
pub(crate) fn draw_x_grid(
    canvas: &mut Canvas,
    axis: &Axis,
    left: i32,
    right: i32,
    top: i32,
    bottom: i32,
) {
    for (v, label) in axis.labels() {
        let x = axis.map(v, left, right);
        canvas.line(x, top, x, bottom, GRID);
        canvas.line(x, bottom, x, bottom + 4, AXIS);
        let w = Canvas::text_width(&label, 1);
        canvas.text(x - w / 2, bottom + 8, &label, 1, TEXT);
    }
}

pub(crate) fn draw_y_label(canvas: &mut Canvas, label: &str, top: i32, bottom: i32) {
    let h = Canvas::text_width(label, 1);
    canvas.text_vertical(10, (top + bottom) / 2 - h / 2, label, 1, TEXT);
}

pub(crate) fn draw_x_label(canvas: &mut Canvas, label: &str, left: i32, right: i32, y: i32) {
    let w = Canvas::text_width(label, 1);
    canvas.text((left + right) / 2 - w / 2, y, label, 1, TEXT);
}
