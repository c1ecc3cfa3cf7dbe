//! Chart titles and legends, and shortening text to fit.

use crate::{Canvas, TEXT};

/// `s`, cut short with ".." if it would be wider than `max_width`.
pub(crate) fn fit_text(s: &str, max_width: i32, scale: u32) -> String {
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

pub(crate) fn draw_title(canvas: &mut Canvas, title: &str) {
    let w = Canvas::text_width(title, 2);
    let x = (canvas.width() as i32 - w) / 2;
    canvas.text(x.max(4), 12, title, 2, TEXT);
}

/// Where each legend item goes: a swatch and its name, left to right,
/// wrapping onto new rows. Returns the item positions and the y just
/// below the legend.
pub(crate) fn legend_layout(
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

pub(crate) fn draw_legend(
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
