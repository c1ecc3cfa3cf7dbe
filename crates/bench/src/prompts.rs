//! Benchmark prompt sets: MT-Bench first turns, ShareGPT first human
//! turns, or a file of JSON strings; spread over categories when cut.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};

use crate::progress;

/// One benchmark prompt.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub text: String,
    pub category: String,
}

/// Prompts from `mt-bench` (first turns), `sharegpt` (first human turns)
/// or a file with one JSON string per line.
pub fn load_prompts(which: &str, limit: Option<usize>) -> Result<Vec<Prompt>> {
    let mut prompts = match which {
        "mt-bench" => {
            let path = arbor_fetch::fetch_dataset("mt-bench", &mut progress::fetch_bar())?;
            let text = std::fs::read_to_string(&path)?;
            let mut out = Vec::new();
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let v: serde_json::Value = serde_json::from_str(line)
                    .with_context(|| format!("bad MT-Bench line in {}", path.display()))?;
                let turn = v["turns"][0]
                    .as_str()
                    .context("MT-Bench question without turns")?;
                out.push(Prompt {
                    text: turn.to_string(),
                    category: v["category"].as_str().unwrap_or("?").to_string(),
                });
            }
            out
        }
        "sharegpt" => {
            let path = arbor_fetch::fetch_dataset("sharegpt", &mut progress::fetch_bar())?;
            let text = std::fs::read_to_string(&path)?;
            sharegpt_prompts(&text, limit.unwrap_or(usize::MAX))
        }
        file => {
            let text = std::fs::read_to_string(file).with_context(|| {
                format!("no prompt set or file `{file}` (mt-bench, sharegpt, or a path)")
            })?;
            let mut out = Vec::new();
            for (i, line) in text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
            {
                let s: String = serde_json::from_str(line).with_context(|| {
                    format!("{file}:{}: expected one JSON string per line", i + 1)
                })?;
                out.push(Prompt {
                    text: s,
                    category: "file".into(),
                });
            }
            out
        }
    };
    if let Some(n) = limit {
        prompts = spread(prompts, n);
    }
    if prompts.is_empty() {
        bail!("the prompt set `{which}` is empty");
    }
    Ok(prompts)
}

/// At most `n` prompts, taken round-robin over categories so a short run
/// still covers them all.
pub fn spread(prompts: Vec<Prompt>, n: usize) -> Vec<Prompt> {
    if prompts.len() <= n {
        return prompts;
    }
    let mut by_cat: BTreeMap<String, Vec<Prompt>> = BTreeMap::new();
    let mut order = Vec::new();
    for p in prompts {
        if !by_cat.contains_key(&p.category) {
            order.push(p.category.clone());
        }
        by_cat.entry(p.category.clone()).or_default().push(p);
    }
    let mut out = Vec::new();
    let mut round = 0;
    while out.len() < n {
        let mut any = false;
        for c in &order {
            if let Some(p) = by_cat[c].get(round)
                && out.len() < n
            {
                out.push(p.clone());
                any = true;
            }
        }
        if !any {
            break;
        }
        round += 1;
    }
    out
}

/// ShareGPT conversations one by one, so a file cut off mid-way still
/// yields everything before the cut; `f` returns false to stop.
fn sharegpt_conversations(text: &str, mut f: impl FnMut(&[serde_json::Value]) -> bool) {
    let mut rest = text.trim_start().strip_prefix('[').unwrap_or("");
    loop {
        rest = rest.trim_start().trim_start_matches(',').trim_start();
        let mut it = serde_json::Deserializer::from_str(rest).into_iter::<serde_json::Value>();
        let Some(Ok(v)) = it.next() else { break };
        rest = &rest[it.byte_offset()..];
        let turns = v["conversations"].as_array().map_or(&[][..], Vec::as_slice);
        if !f(turns) {
            break;
        }
    }
}

/// First human turns of a ShareGPT dump.
pub fn sharegpt_prompts(text: &str, limit: usize) -> Vec<Prompt> {
    let mut out = Vec::new();
    sharegpt_conversations(text, |turns| {
        let first = turns
            .iter()
            .find(|t| t["from"] == "human")
            .and_then(|t| t["value"].as_str());
        if let Some(s) = first.filter(|s| !s.trim().is_empty()) {
            out.push(Prompt {
                text: s.to_string(),
                category: "sharegpt".into(),
            });
        }
        out.len() < limit
    });
    out
}

/// The first exchange (a human turn and the reply right after it) of up to
/// `limit` ShareGPT conversations that have one, both non-empty.
pub fn sharegpt_exchanges(text: &str, limit: usize) -> Vec<(String, String)> {
    let mut out = Vec::new();
    sharegpt_conversations(text, |turns| {
        fn text(t: &serde_json::Value) -> Option<&str> {
            t["value"].as_str().filter(|s| !s.trim().is_empty())
        }
        if let Some(i) = turns.iter().position(|t| t["from"] == "human")
            && let Some(reply) = turns.get(i + 1).filter(|t| t["from"] == "gpt")
            && let (Some(q), Some(a)) = (text(&turns[i]), text(reply))
        {
            out.push((q.to_string(), a.to_string()));
        }
        out.len() < limit
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharegpt_survives_a_cut_off_file() {
        let text = r#"[{"id":"a","conversations":[{"from":"human","value":"hi"},{"from":"gpt","value":"yo"}]},
            {"id":"b","conversations":[{"from":"gpt","value":"x"},{"from":"human","value":"second"}]},
            {"id":"c","conversations":[{"from":"human","value":"cut of"#;
        let p = sharegpt_prompts(text, 10);
        let texts: Vec<&str> = p.iter().map(|p| p.text.as_str()).collect();
        assert_eq!(texts, ["hi", "second"]);
        assert_eq!(sharegpt_prompts(text, 1).len(), 1);
        assert!(sharegpt_prompts("garbage", 5).is_empty());
        let x = sharegpt_exchanges(text, 10);
        assert_eq!(x, [("hi".to_string(), "yo".to_string())]);
    }

    #[test]
    fn spread_covers_every_category() {
        let p: Vec<Prompt> = (0..9)
            .map(|i| Prompt {
                text: i.to_string(),
                category: ["a", "b", "c"][i / 3].into(),
            })
            .collect();
        let s = spread(p, 4);
        let cats: Vec<&str> = s.iter().map(|p| p.category.as_str()).collect();
        assert_eq!(cats, ["a", "b", "c", "a"]);
    }
}
