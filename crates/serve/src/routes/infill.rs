//! Fill-in-the-middle for code models: `POST /infill` in llama-server's
//! shape (`input_prefix`, `input_suffix`, `input_extra` files, an optional
//! `prompt` the middle starts with; `content` and `stop` back, streamed as
//! events until one with `stop: true`), and OpenAI's `suffix` on
//! `/v1/completions`. The prompt is the model's FIM tokens around the code
//! encoded as text ([`arbor_engine::Tokenizer::encode_infill`]); the middle
//! ends at an end token or any FIM token, and is generated with the
//! server's strategy like every other answer. Without `temperature` an
//! infill is greedy: an editor asks for the likeliest code.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State as Axum;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use serde_json::Value;

use super::{Checked, Shared, authorize, body, check_model, fault, generate, ready};
use crate::api;
use crate::error::ApiError;
use crate::fields::Endpoint;
use crate::respond::Kind;
use crate::status::Facts;

/// Fields of an infill body beside the sampling ones `/v1/completions`
/// has.
const OWN: &[&str] = &[
    "input_prefix",
    "input_suffix",
    "input_extra",
    "prompt",
    "n_predict",
    "filename",
    "cache_prompt",
];

#[derive(Debug, Clone, Deserialize)]
struct Extra {
    filename: String,
    text: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct InfillFields {
    #[serde(default)]
    input_prefix: String,
    #[serde(default)]
    input_suffix: String,
    #[serde(default)]
    input_extra: Vec<Extra>,
    #[serde(default)]
    prompt: String,
    #[serde(default)]
    n_predict: Option<i64>,
    #[serde(default)]
    filename: Option<String>,
}

/// The prompt of a middle and the tokens that end it.
pub(super) fn encode(
    facts: &Facts,
    prefix: &str,
    suffix: &str,
    filename: Option<&str>,
    extra: &[(String, String)],
    middle: &str,
) -> Result<(Vec<u32>, Vec<u32>), ApiError> {
    let tokenizer = &facts.tokenizer;
    let infill = arbor_engine::Infill {
        prefix,
        suffix,
        filename,
        extra,
        middle,
    };
    let ids = tokenizer.encode_infill(&infill).map_err(|e| match e {
        arbor_engine::TokenizerError::NoInfillTokens => ApiError::invalid(e.to_string()),
        e => ApiError::invalid(format!("the code could not be tokenized: {e}")),
    })?;
    Ok((ids, tokenizer.infill_stop_ids()))
}

pub(super) async fn infill(
    Axum(state): Axum<Shared>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    authorize(&state, &headers)?;
    let raw = body(&headers, raw)?;
    let mut value: Value = api::parse(&raw)?;
    let Value::Object(fields) = &mut value else {
        return Err(ApiError::invalid("the body must be a JSON object"));
    };
    // The fields of the infill itself, then the shared ones checked as a
    // completion's.
    let mut own = serde_json::Map::new();
    for name in OWN {
        if let Some(v) = fields.remove(*name) {
            own.insert((*name).into(), v);
        }
    }
    let facts = ready(&state)?;
    match fields.get("model") {
        Some(Value::String(id)) => check_model(facts, id)?,
        _ => {
            fields.insert("model".into(), facts.model_id.clone().into());
        }
    }
    if !fields.contains_key("temperature") {
        fields.insert("temperature".into(), 0.into());
    }
    crate::fields::check(&value, Endpoint::Completion)?;
    let own: InfillFields = serde_json::from_value(Value::Object(own))
        .map_err(|e| ApiError::invalid(format!("the request does not fit the API: {e}")))?;
    let mut common: api::Common = serde_json::from_value(value)
        .map_err(|e| ApiError::invalid(format!("the request does not fit the API: {e}")))?;
    if let Some(n) = own.n_predict {
        // llama-server's -1: as long as the context allows.
        common.max_tokens = common.max_tokens.or((n >= 0).then_some(n));
    }
    let settings = common.settings(Endpoint::Completion)?;
    if settings.slo.is_some() {
        return Err(ApiError::invalid_param(
            "arbor.slo",
            "latency objectives choose prompt levels for chats and completions, not infills",
        ));
    }
    let extra: Vec<(String, String)> = (own.input_extra.into_iter())
        .map(|e| (e.filename, e.text))
        .collect();
    let (prompt, stops) = encode(
        facts,
        &own.input_prefix,
        &own.input_suffix,
        own.filename.as_deref(),
        &extra,
        &own.prompt,
    )?;
    let checked = Checked {
        kind: Kind::Infill,
        prompt,
        protected: None,
        fault: fault(&state, &raw),
        settings,
        arrived,
        tools: None,
        constraint: None,
        stop_tokens: Some(stops),
    };
    generate(state.clone(), checked).await
}
