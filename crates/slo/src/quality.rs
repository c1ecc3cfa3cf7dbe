//! How close each (model level, prompt level) pair stays to the full
//! model, measured offline on calibration prompts: the share of the full
//! model's greedy answer tokens the pair's greedy choice agrees with,
//! teacher-forced along that answer after the pair's compressed prompt.

use serde::{Deserialize, Serialize};

use crate::{Result, SloError, check_ascending};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QualityTable {
    /// The elastic model file's name.
    pub model: String,
    /// What scored the prompt tokens (`bigram`, `random`, …).
    pub scorer: String,
    /// Ascending, ending at 1.
    pub model_levels: Vec<f64>,
    /// Ascending, ending at 1.
    pub prompt_levels: Vec<f64>,
    /// `quality[m][p]` in [0, 1]; `quality[last][last]` is 1 by definition.
    pub quality: Vec<Vec<f64>>,
    /// Calibration prompts and answer tokens per prompt behind each cell.
    pub prompts: usize,
    pub answer_tokens: usize,
    pub measured: String,
}

impl QualityTable {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| SloError::Quality(format!("{}: {m}", self.model));
        check_ascending("model levels", &self.model_levels).map_err(bad)?;
        check_ascending("prompt levels", &self.prompt_levels).map_err(bad)?;
        let shape_ok = self.quality.len() == self.model_levels.len()
            && (self.quality.iter()).all(|row| row.len() == self.prompt_levels.len());
        if !shape_ok {
            return Err(bad(format!(
                "{} rows for {} model levels, each must hold {} prompt levels",
                self.quality.len(),
                self.model_levels.len(),
                self.prompt_levels.len()
            )));
        }
        if let Some(q) = (self.quality.iter().flatten()).find(|&&q| !(0.0..=1.0).contains(&q)) {
            return Err(bad(format!("quality {q} outside [0, 1]")));
        }
        Ok(())
    }

    /// The quality of the built levels `model` and `prompt` run at (each
    /// rounded down to a listed level).
    pub fn get(&self, model: f64, prompt: f64) -> f64 {
        let at = |levels: &[f64], x: f64| levels.iter().rposition(|&l| l <= x + 1e-9).unwrap_or(0);
        self.quality[at(&self.model_levels, model)][at(&self.prompt_levels, prompt)]
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Quality `model × prompt` (both levels matter, the full pair is 1).
    pub(crate) fn product_table(model_levels: &[f64], prompt_levels: &[f64]) -> QualityTable {
        QualityTable {
            model: "m.elastic.gguf".into(),
            scorer: "test".into(),
            model_levels: model_levels.to_vec(),
            prompt_levels: prompt_levels.to_vec(),
            quality: (model_levels.iter())
                .map(|m| prompt_levels.iter().map(|p| m * p).collect())
                .collect(),
            prompts: 1,
            answer_tokens: 1,
            measured: "now".into(),
        }
    }

    #[test]
    fn cells_are_read_at_the_level_below() {
        let t = product_table(&[0.5, 1.0], &[0.2, 0.6, 1.0]);
        t.validate().unwrap();
        assert_eq!(t.get(1.0, 1.0), 1.0);
        assert_eq!(t.get(0.9, 0.7), 0.5 * 0.6);
        assert_eq!(t.get(0.1, 0.1), 0.5 * 0.2);
    }

    #[test]
    fn bad_tables_are_refused() {
        let mut t = product_table(&[0.5, 1.0], &[0.5, 1.0]);
        t.quality[0].pop();
        assert!(t.validate().unwrap_err().to_string().contains("rows"));
        let mut t = product_table(&[0.5, 1.0], &[0.5, 1.0]);
        t.quality[0][0] = 1.5;
        assert!(t.validate().is_err());
        let t = product_table(&[1.0, 0.5], &[0.5, 1.0]);
        assert!(t.validate().is_err());
    }
}
