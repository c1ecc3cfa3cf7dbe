//! The RGB [`Canvas`] every chart draws on: filled rectangles, lines,
//! text in the built-in bitmap font, and PNG encoding.

use std::path::Path;

use crate::PlotError;
use crate::font::{GLYPH_HEIGHT, GLYPH_WIDTH, glyph};

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
