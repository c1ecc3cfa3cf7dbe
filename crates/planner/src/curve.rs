//! Shaping a measured curve: a pass of more rows never costs less.

/// The non-decreasing curve nearest `points` in squared error (adjacent
/// points that fall are pooled into their mean): a pass of more rows never
/// costs less.
pub fn monotone(points: &[(usize, f64)]) -> Vec<(usize, f64)> {
    // (mean, points pooled), non-decreasing.
    let mut pools: Vec<(f64, usize)> = Vec::new();
    for &(_, v) in points {
        let mut pool = (v, 1usize);
        while let Some(&(m, c)) = pools.last() {
            if m <= pool.0 {
                break;
            }
            pools.pop();
            let total = c + pool.1;
            pool = (
                (m * c as f64 + pool.0 * pool.1 as f64) / total as f64,
                total,
            );
        }
        pools.push(pool);
    }
    let values = pools.iter().flat_map(|&(m, c)| std::iter::repeat_n(m, c));
    points
        .iter()
        .zip(values)
        .map(|(&(n, _), v)| (n, v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sampled_curve_is_made_non_decreasing() {
        // As sampled for the 1.5B (ms): noise made 3 rows cheaper than 1.
        let noisy = [
            (1, 63.2),
            (2, 59.9),
            (3, 19.3),
            (4, 18.4),
            (5, 60.0),
            (6, 174.1),
        ];
        let m = monotone(&noisy);
        assert!(m.windows(2).all(|w| w[0].1 <= w[1].1), "{m:?}");
        assert_eq!(
            m.iter().map(|p| p.0).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5, 6]
        );
        // The first four pool into their mean; the rest rise already.
        assert!((m[0].1 - (63.2 + 59.9 + 19.3 + 18.4) / 4.0).abs() < 1e-9);
        assert_eq!(m[3].1, m[0].1);
        assert_eq!(m[4].1, 60.0);
        // Pooling keeps the total.
        let sum = |p: &[(usize, f64)]| p.iter().map(|x| x.1).sum::<f64>();
        assert!((sum(&m) - sum(&noisy)).abs() < 1e-9);
        // A rising curve stays as it is.
        let rising = [(1, 1.0), (8, 2.0), (64, 9.0)];
        assert_eq!(monotone(&rising), rising);
    }
}
