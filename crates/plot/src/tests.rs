use super::*;
use crate::axis::Axis;

use std::path::{Path, PathBuf};

const RED: [u8; 3] = [255, 0, 0];

/// A temp file path unique to this process and test.
fn temp_png(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("arbor-plot-{}-{name}.png", std::process::id()))
}

/// Decodes an RGB PNG into (width, height, pixels).
fn decode(path: &Path) -> (u32, u32, Vec<u8>) {
    let file = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    let mut reader = png::Decoder::new(file).read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

/// Saves through `save`, decodes the file, removes it, and checks it
/// matches `canvas`.
fn round_trip(name: &str, canvas: &Canvas, save: impl FnOnce(&Path) -> Result<(), PlotError>) {
    let path = temp_png(name);
    save(&path).unwrap();
    let (w, h, pixels) = decode(&path);
    std::fs::remove_file(&path).unwrap();
    assert_eq!((w, h), (canvas.width(), canvas.height()));
    assert_eq!(pixels, canvas.pixels());
}

fn count(canvas: &Canvas, color: [u8; 3]) -> usize {
    canvas
        .pixels()
        .chunks_exact(3)
        .filter(|p| *p == color)
        .count()
}

/// The topmost row holding `color` in columns `x0..x1`.
fn top_row(canvas: &Canvas, color: [u8; 3], x0: u32, x1: u32) -> Option<u32> {
    (0..canvas.height()).find(|&y| (x0..x1).any(|x| canvas.pixel(x, y) == color))
}

fn two_series_chart() -> BarChart {
    BarChart {
        title: "Speedup".into(),
        y_label: "x faster".into(),
        groups: vec!["tiny".into()],
        series: vec![
            Series {
                name: "short".into(),
                values: vec![1.0],
            },
            Series {
                name: "tall".into(),
                values: vec![3.0],
            },
        ],
        reference: Some((1.0, "baseline".into())),
    }
}

#[test]
fn text_width_counts_glyphs_and_gaps() {
    assert_eq!(Canvas::text_width("", 1), 0);
    assert_eq!(Canvas::text_width("A", 1), 5);
    assert_eq!(Canvas::text_width("AB", 1), 11);
    assert_eq!(Canvas::text_width("abc", 2), 34);
    // Non-ASCII characters still take one glyph each.
    assert_eq!(Canvas::text_width("é€", 3), 33);
    assert_eq!(Canvas::text_width("x", 0), 0);
}

#[test]
fn new_canvas_is_white() {
    let c = Canvas::new(3, 2);
    assert_eq!(c.pixels().len(), 18);
    assert!(c.pixels().iter().all(|&b| b == 255));
}

#[test]
fn rect_fills_inclusive_corners_in_any_order() {
    let mut c = Canvas::new(10, 10);
    c.rect(5, 6, 2, 3, RED);
    assert_eq!(count(&c, RED), 4 * 4);
    assert_eq!(c.pixel(2, 3), RED);
    assert_eq!(c.pixel(5, 6), RED);
    assert_eq!(c.pixel(6, 6), WHITE);
    assert_eq!(c.pixel(2, 2), WHITE);
}

#[test]
fn rect_is_clipped_to_the_canvas() {
    let mut c = Canvas::new(10, 10);
    c.rect(-5, -5, 1, 1, RED);
    assert_eq!(count(&c, RED), 4);
    c.rect(i32::MIN, 8, i32::MAX, i32::MAX, RED);
    assert_eq!(count(&c, RED), 4 + 20);
    // Entirely outside: nothing changes.
    let before = c.clone();
    c.rect(20, 20, 30, 30, RED);
    c.rect(-30, 0, -1, 9, RED);
    assert_eq!(c, before);
}

#[test]
fn line_draws_every_pixel_in_any_direction() {
    let mut c = Canvas::new(10, 10);
    c.line(0, 0, 9, 9, RED);
    assert_eq!(count(&c, RED), 10);
    assert!((0..10).all(|i| c.pixel(i, i) == RED));

    let mut up = Canvas::new(10, 10);
    up.line(9, 9, 0, 0, RED);
    assert_eq!(up, c);

    // A shallow line covers one pixel per column and keeps its ends.
    let mut shallow = Canvas::new(10, 10);
    shallow.line(0, 2, 9, 5, RED);
    assert_eq!(count(&shallow, RED), 10);
    assert_eq!(shallow.pixel(0, 2), RED);
    assert_eq!(shallow.pixel(9, 5), RED);
    for x in 0..10 {
        assert_eq!((0..10).filter(|&y| shallow.pixel(x, y) == RED).count(), 1);
    }

    let mut flat = Canvas::new(10, 10);
    flat.line(7, 4, 2, 4, RED);
    assert_eq!(count(&flat, RED), 6);
    assert!((2..=7).all(|x| flat.pixel(x, 4) == RED));
}

#[test]
fn line_is_clipped_to_the_canvas() {
    let mut c = Canvas::new(10, 10);
    c.line(-5, -5, 14, 14, RED);
    assert_eq!(count(&c, RED), 10);
    assert_eq!(c.pixel(0, 0), RED);
    assert_eq!(c.pixel(9, 9), RED);

    let mut far = Canvas::new(10, 10);
    far.line(i32::MIN, 5, i32::MAX, 5, RED);
    assert_eq!(count(&far, RED), 10);
    far.line(-100, -100, -1, 50, RED);
    far.line(20, 0, 40, 9, RED);
    assert_eq!(count(&far, RED), 10);
}

#[test]
fn text_draws_the_glyph_bitmap() {
    let mut c = Canvas::new(20, 10);
    c.text(1, 1, "|", 1, RED);
    // '|' is the middle column, all seven rows.
    assert_eq!(count(&c, RED), 7);
    assert!((1..8).all(|y| c.pixel(3, y) == RED));

    let mut big = Canvas::new(20, 20);
    big.text(0, 0, "|", 2, RED);
    assert_eq!(count(&big, RED), 7 * 4);
    assert_eq!(big.pixel(4, 0), RED);
    assert_eq!(big.pixel(5, 13), RED);
    assert_eq!(big.pixel(6, 13), WHITE);

    // The second character starts 6 pixels along.
    let mut two = Canvas::new(20, 10);
    two.text(0, 0, "||", 1, RED);
    assert_eq!(count(&two, RED), 14);
    assert_eq!(two.pixel(8, 0), RED);
}

#[test]
fn unknown_characters_are_drawn_as_question_marks() {
    let mut odd = Canvas::new(20, 10);
    odd.text(0, 0, "é\n", 1, RED);
    let mut question = Canvas::new(20, 10);
    question.text(0, 0, "??", 1, RED);
    assert_eq!(odd, question);
    assert!(count(&odd, RED) > 0);
}

#[test]
fn text_off_canvas_does_not_panic() {
    let mut c = Canvas::new(10, 10);
    c.text(-8, -3, "Hello, world", 3, RED);
    c.text(i32::MAX, i32::MAX, "x", u32::MAX, RED);
    c.text(i32::MIN, 0, "abc", 1, RED);
    c.text_vertical(-2, i32::MIN, "abc", 2, RED);
    assert!(count(&c, RED) > 0);
}

#[test]
fn vertical_text_is_the_rotated_horizontal_text() {
    let s = "Ab1";
    let w = Canvas::text_width(s, 1) as u32;
    let mut flat = Canvas::new(w, 7);
    flat.text(0, 0, s, 1, RED);
    let mut up = Canvas::new(7, w);
    up.text_vertical(0, 0, s, 1, RED);
    for x in 0..w {
        for y in 0..7 {
            assert_eq!(flat.pixel(x, y), up.pixel(y, w - 1 - x), "at ({x}, {y})");
        }
    }
}

#[test]
fn png_round_trip_keeps_pixels() {
    let mut c = Canvas::new(7, 5);
    c.rect(1, 1, 3, 2, RED);
    c.line(0, 4, 6, 0, PALETTE[0]);
    round_trip("canvas", &c, |p| c.save_png(p));
}

#[test]
fn empty_canvas_cannot_be_saved() {
    let err = Canvas::new(0, 4).to_png().unwrap_err();
    assert!(matches!(err, PlotError::Png(_)), "{err}");
}

#[test]
fn saving_to_a_missing_directory_is_an_io_error() {
    let path = std::env::temp_dir()
        .join("arbor-plot-no-such-dir-9f3c")
        .join("x.png");
    let err = Canvas::new(2, 2).save_png(&path).unwrap_err();
    assert!(matches!(err, PlotError::Io(_)), "{err}");
    assert!(err.to_string().contains("could not write"));
}

#[test]
fn nice_axis_uses_round_steps() {
    let a = Axis::nice(0.0, 3.0, 5).unwrap();
    assert_eq!((a.lo, a.hi), (0.0, 3.0));
    assert!((a.step - 0.5).abs() < 1e-12);
    assert_eq!(a.ticks().len(), 7);

    let b = Axis::nice(0.0, 87.0, 5).unwrap();
    assert_eq!((b.lo, b.hi, b.step), (0.0, 100.0, 20.0));
    let labels: Vec<String> = b.labels().into_iter().map(|(_, l)| l).collect();
    assert_eq!(labels, ["0", "20", "40", "60", "80", "100"]);

    let c = Axis::nice(0.0, 0.0, 5).unwrap();
    assert!(c.hi > c.lo);
    assert!(Axis::nice(-f64::MAX, f64::MAX, 5).is_err());
}

#[test]
fn bar_chart_taller_bar_has_more_colour_and_a_higher_top() {
    let chart = two_series_chart();
    let canvas = render_bar_chart(&chart).unwrap();
    assert_eq!((canvas.width(), canvas.height()), (WIDTH, HEIGHT));
    let short = count(&canvas, PALETTE[0]);
    let tall = count(&canvas, PALETTE[1]);
    assert!(tall > 2 * short, "tall {tall} vs short {short}");

    let (w, h) = (canvas.width(), canvas.height());
    // Only bars reach below the legend, which sits above y = 60.
    let short_top = (60..h).find(|&y| (0..w).any(|x| canvas.pixel(x, y) == PALETTE[0]));
    let tall_top = (60..h).find(|&y| (0..w).any(|x| canvas.pixel(x, y) == PALETTE[1]));
    assert!(tall_top.unwrap() < short_top.unwrap());
}

#[test]
fn bar_chart_saves_a_png_of_the_right_size() {
    let chart = two_series_chart();
    let canvas = render_bar_chart(&chart).unwrap();
    let path = temp_png("bars");
    bar_chart(&chart, &path).unwrap();
    let (w, h, pixels) = decode(&path);
    std::fs::remove_file(&path).unwrap();
    assert_eq!((w, h), (WIDTH, HEIGHT));
    assert_eq!(pixels, canvas.pixels());
    let tall = pixels.chunks_exact(3).filter(|p| *p == PALETTE[1]).count();
    let short = pixels.chunks_exact(3).filter(|p| *p == PALETTE[0]).count();
    assert!(tall > short);
}

#[test]
fn bar_chart_handles_many_groups_and_negative_values() {
    let chart = BarChart {
        title: "Mixed".into(),
        groups: (0..12)
            .map(|i| format!("a rather long group name {i}"))
            .collect(),
        series: (0..10)
            .map(|s| Series {
                name: format!("s{s}"),
                values: (0..12)
                    .map(|g| (g as f64 - 5.0) * (s as f64 + 0.5))
                    .collect(),
            })
            .collect(),
        ..Default::default()
    };
    let canvas = render_bar_chart(&chart).unwrap();
    // Colours wrap round the palette, so the ninth series reuses the first.
    assert!(count(&canvas, PALETTE[0]) > 0);
}

#[test]
fn line_chart_saves_and_draws_each_series() {
    let chart = LineChart {
        title: "KV cache memory".into(),
        x_label: "context length".into(),
        y_label: "MiB".into(),
        series: vec![
            LineSeries {
                name: "f16".into(),
                points: vec![(512.0, 64.0), (1024.0, 128.0), (4096.0, 512.0)],
            },
            LineSeries {
                name: "q8".into(),
                points: vec![(512.0, 34.0), (4096.0, 272.0)],
            },
            LineSeries {
                name: "one point".into(),
                points: vec![(2048.0, 5.0)],
            },
        ],
    };
    let canvas = render_line_chart(&chart).unwrap();
    for c in &PALETTE[..3] {
        assert!(count(&canvas, *c) > 25, "colour {c:?} missing");
    }
    // The f16 line ends higher than the q8 line.
    let f16_top = top_row(&canvas, PALETTE[0], 0, WIDTH).unwrap();
    let q8_top = top_row(&canvas, PALETTE[1], 0, WIDTH).unwrap();
    assert!(f16_top <= q8_top);
    round_trip("lines", &canvas, |p| line_chart(&chart, p));
}

#[test]
fn line_chart_with_a_single_point_still_draws() {
    let chart = LineChart {
        series: vec![LineSeries {
            name: "only".into(),
            points: vec![(3.0, 0.0)],
        }],
        ..Default::default()
    };
    let canvas = render_line_chart(&chart).unwrap();
    assert!(count(&canvas, PALETTE[0]) >= 25);
}

#[test]
fn timeline_saves_and_colours_each_label() {
    let t = Timeline {
        title: "decode step".into(),
        lanes: vec!["cpu".into(), "gpu stream 0".into(), "copy".into()],
        segments: vec![
            Segment {
                lane: 0,
                start: 0.0,
                end: 1.5,
                label: "P".into(),
            },
            Segment {
                lane: 1,
                start: 1.5,
                end: 7.0,
                label: "G".into(),
            },
            Segment {
                lane: 2,
                start: 7.0,
                end: 8.0,
                label: "V".into(),
            },
            Segment {
                lane: 1,
                start: 8.0,
                end: 8.0,
                label: "G".into(),
            },
        ],
        x_label: "ms".into(),
    };
    let canvas = render_timeline(&t).unwrap();
    assert_eq!(canvas.width(), TIMELINE_WIDTH);
    let (p, g, v) = (
        count(&canvas, PALETTE[0]),
        count(&canvas, PALETTE[1]),
        count(&canvas, PALETTE[2]),
    );
    assert!(g > p && p > v && v > 0, "P {p}, G {g}, V {v}");
    assert_eq!(count(&canvas, PALETTE[3]), 0);
    round_trip("timeline", &canvas, |path| timeline(&t, path));
}

#[test]
fn timeline_with_many_lanes_stays_a_sane_size() {
    let t = Timeline {
        lanes: (0..500).map(|i| format!("lane {i}")).collect(),
        segments: (0..500)
            .map(|i| Segment {
                lane: i,
                start: i as f64,
                end: i as f64 + 2.0,
                label: format!("k{}", i % 11),
            })
            .collect(),
        ..Default::default()
    };
    let canvas = render_timeline(&t).unwrap();
    assert!(canvas.height() < 2000);
}

fn assert_empty<T: std::fmt::Debug>(result: Result<T, PlotError>, needle: &str) {
    match result {
        Err(PlotError::Empty(message)) => {
            assert!(
                message.contains(needle),
                "message {message:?} lacks {needle:?}"
            )
        }
        other => panic!("expected PlotError::Empty, got {other:?}"),
    }
}

#[test]
fn bad_bar_charts_are_rejected() {
    let good = two_series_chart();
    assert_empty(
        render_bar_chart(&BarChart {
            groups: vec![],
            ..good.clone()
        }),
        "no groups",
    );
    assert_empty(
        render_bar_chart(&BarChart {
            series: vec![],
            ..good.clone()
        }),
        "no series",
    );

    let mut mismatched = good.clone();
    mismatched.series[1].values.push(2.0);
    assert_empty(
        render_bar_chart(&mismatched),
        "'tall' has 2 values but there are 1 groups",
    );

    let mut nan = good.clone();
    nan.series[0].values[0] = f64::NAN;
    assert_empty(render_bar_chart(&nan), "non-finite");

    let bad_reference = BarChart {
        reference: Some((f64::INFINITY, "x".into())),
        ..good.clone()
    };
    assert_empty(render_bar_chart(&bad_reference), "reference");

    let huge = BarChart {
        series: vec![
            Series {
                name: "a".into(),
                values: vec![-f64::MAX],
            },
            Series {
                name: "b".into(),
                values: vec![f64::MAX],
            },
        ],
        ..good.clone()
    };
    assert_empty(render_bar_chart(&huge), "axis");

    // The saving wrapper reports the same error and writes nothing.
    let path = temp_png("never-written");
    assert_empty(bar_chart(&BarChart::default(), &path), "no groups");
    assert!(!path.exists());
}

#[test]
fn bad_line_charts_are_rejected() {
    assert_empty(render_line_chart(&LineChart::default()), "no series");
    let no_points = LineChart {
        series: vec![LineSeries {
            name: "a".into(),
            points: vec![],
        }],
        ..Default::default()
    };
    assert_empty(render_line_chart(&no_points), "'a' has no points");
    let inf = LineChart {
        series: vec![LineSeries {
            name: "a".into(),
            points: vec![(1.0, 2.0), (f64::INFINITY, 1.0)],
        }],
        ..Default::default()
    };
    assert_empty(render_line_chart(&inf), "non-finite");
    assert_empty(
        line_chart(&LineChart::default(), &temp_png("never-written-line")),
        "no series",
    );
}

#[test]
fn bad_timelines_are_rejected() {
    let segment = Segment {
        lane: 0,
        start: 0.0,
        end: 1.0,
        label: "G".into(),
    };
    let good = Timeline {
        lanes: vec!["a".into()],
        segments: vec![segment.clone()],
        ..Default::default()
    };
    assert!(render_timeline(&good).is_ok());

    assert_empty(
        render_timeline(&Timeline {
            lanes: vec![],
            ..good.clone()
        }),
        "no lanes",
    );
    assert_empty(
        render_timeline(&Timeline {
            segments: vec![],
            ..good.clone()
        }),
        "no segments",
    );
    let wrong_lane = Timeline {
        segments: vec![Segment {
            lane: 1,
            ..segment.clone()
        }],
        ..good.clone()
    };
    assert_empty(render_timeline(&wrong_lane), "lane 1 but there are 1 lanes");
    let nan = Timeline {
        segments: vec![Segment {
            end: f64::NAN,
            ..segment.clone()
        }],
        ..good.clone()
    };
    assert_empty(render_timeline(&nan), "non-finite");
    let backwards = Timeline {
        segments: vec![Segment {
            start: 2.0,
            ..segment.clone()
        }],
        ..good.clone()
    };
    assert_empty(render_timeline(&backwards), "before it starts");
    assert_empty(
        timeline(&Timeline::default(), &temp_png("never-written-timeline")),
        "no lanes",
    );
}

#[test]
fn errors_read_clearly() {
    let e = PlotError::Empty("the bar chart has no groups".into());
    assert_eq!(
        e.to_string(),
        "nothing sensible to plot: the bar chart has no groups"
    );
    let e = PlotError::Png("bad".into());
    assert_eq!(e.to_string(), "could not encode the PNG image: bad");
}
