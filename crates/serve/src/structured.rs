//! The rule a chat answer must follow, enforced by constrained decoding
//! (`arbor-grammar`): `response_format` (`json_object`, or `json_schema`
//! with its schema; `text` is no rule), or the call a `tool_choice` forces
//! (`required`: a call of one of the tools with arguments fitting its
//! schema; a named function: arguments fitting its schema). Every token
//! the target chooses is chosen among what the rule allows, with any
//! strategy, so a constrained speculative answer equals the constrained
//! target-only one.

use std::sync::Arc;

use arbor_grammar::{Grammar, Grammars};
use serde_json::Value;

use crate::error::ApiError;
use crate::status::Facts;
use crate::tools::{Force, ToolRequest};

/// The request's rule, if it has one.
pub(crate) fn constraint(
    facts: &Facts,
    response_format: Option<&Value>,
    tools: &ToolRequest,
) -> Result<Option<Arc<Grammar>>, ApiError> {
    let make = |f: &dyn Fn(&Grammars) -> Result<Grammar, arbor_grammar::GrammarError>,
                param: &str| {
        let grammars = grammars(facts)?;
        f(&grammars)
            .map(|g| Some(Arc::new(g)))
            .map_err(|e| ApiError::invalid_param(param, format!("`{param}`: {e}")))
    };
    if let Some(force) = &tools.force {
        return match force {
            Force::Any(schema) => make(&|g| g.json_schema(schema), "tools"),
            Force::Named(params) => make(&|g| g.tool_arguments(params.as_ref()), "tools"),
        };
    }
    let Some(format) = response_format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format["type"].as_str() {
        Some("text") => Ok(None),
        Some("json_object") => make(&|g| g.json_object(), "response_format"),
        Some("json_schema") => {
            let schema = &format["json_schema"]["schema"];
            if !(schema.is_object() || schema.is_boolean()) {
                return Err(ApiError::invalid_param(
                    "response_format",
                    "`response_format.json_schema.schema` must hold the JSON schema",
                ));
            }
            make(&|g| g.json_schema(schema), "response_format")
        }
        _ => Err(ApiError::invalid_param(
            "response_format",
            "`response_format.type` is \"text\", \"json_object\" or \"json_schema\"",
        )),
    }
}

/// The model's vocabulary for grammars, built on first use (a trie of
/// every token: tens of milliseconds to a second for 150k tokens).
fn grammars(facts: &Facts) -> Result<Arc<Grammars>, ApiError> {
    let built = facts.grammars.get_or_init(|| {
        Grammars::new(&facts.tokenizer, facts.vocab)
            .map(Arc::new)
            .map_err(|e| e.to_string())
    });
    built
        .clone()
        .map_err(|e| ApiError::server(format!("structured output is unavailable: {e}")))
}
