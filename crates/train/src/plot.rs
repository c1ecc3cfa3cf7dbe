//! The loss chart every training run draws beside its output.

use std::path::Path;

use arbor_plot::{LineChart, LineSeries, line_chart};

use crate::Result;

/// Each point's `y` replaced by the mean of the last `window` points' (the
/// loss curves' smoothed line).
pub fn running_mean(points: &[(f64, f64)], window: usize) -> Vec<(f64, f64)> {
    (0..points.len())
        .map(|i| {
            let w = &points[i.saturating_sub(window.max(1) - 1)..=i];
            (
                points[i].0,
                w.iter().map(|p| p.1).sum::<f64>() / w.len() as f64,
            )
        })
        .collect()
}

/// A PNG at `path` of each step's loss (`(seconds, loss)`) and its running
/// mean over `window` steps, against minutes of training.
pub fn loss_chart(
    losses: &[(f64, f64)],
    title: &str,
    y_label: &str,
    window: usize,
    path: &Path,
) -> Result<()> {
    let raw: Vec<(f64, f64)> = losses.iter().map(|&(s, l)| (s / 60.0, l)).collect();
    let mean = running_mean(&raw, window);
    line_chart(
        &LineChart {
            title: title.into(),
            x_label: "minutes of training".into(),
            y_label: y_label.into(),
            series: vec![
                LineSeries {
                    name: "step".into(),
                    points: raw,
                },
                LineSeries {
                    name: format!("mean of {window}"),
                    points: mean,
                },
            ],
        },
        path,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_running_mean_averages_the_last_points() {
        let points: Vec<(f64, f64)> = (0..5).map(|i| (i as f64, (i * i) as f64)).collect();
        let mean = running_mean(&points, 2);
        assert_eq!(
            mean,
            vec![(0.0, 0.0), (1.0, 0.5), (2.0, 2.5), (3.0, 6.5), (4.0, 12.5)]
        );
        assert_eq!(running_mean(&points, 0), points);
        assert_eq!(running_mean(&points, 100)[4], (4.0, 6.0));
    }
}
