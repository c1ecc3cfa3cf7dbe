//! Which request fields arbor serves, field by field. A field it honours is
//! parsed and checked ([`crate::api`]); a field that does not change what is
//! generated (`user`, `metadata`…) is accepted; a field of OpenAI's API
//! that arbor does not serve (`echo`, `best_of`, audio…, and tools or
//! `response_format` on `/v1/completions`) is a 400 naming it unless it
//! holds its neutral value (what a client sends when it does not use the
//! feature); any other field is a 400 naming it. Nothing a client asks for
//! is silently dropped.

use serde_json::Value;

use crate::error::ApiError;

/// Which endpoint a body is for: their fields differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// Fields both endpoints honour.
const HONOURED: &[&str] = &[
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "logprobs",
    "top_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "arbor",
];

/// Fields that leave the generation as it is: accepted, not used.
const INERT: &[&str] = &[
    "user",
    "metadata",
    "store",
    "service_tier",
    "parallel_tool_calls",
];

/// Whether `v` is the value a client sends for `field` when it does not
/// use that feature; `None`: not a field of the API arbor knows.
fn neutral(field: &str, v: &Value) -> Option<bool> {
    let empty = |v: &Value| match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::String(s) => s.is_empty(),
        _ => false,
    };
    Some(match field {
        "tools" | "functions" => empty(v),
        // Without tools, "auto" cannot call one either.
        "tool_choice" | "function_call" => {
            v.is_null() || matches!(v.as_str(), Some("none" | "auto"))
        }
        "response_format" => v.is_null() || v["type"] == "text",
        "echo" => v.is_null() || v == &Value::Bool(false),
        "repetition_penalty" => v.is_null() || v.as_f64() == Some(1.0),
        "suffix" => empty(v),
        "best_of" => v.is_null() || v.as_f64() == Some(1.0),
        "modalities" | "audio" | "prediction" | "web_search_options" | "reasoning_effort" => {
            v.is_null()
        }
        _ => return None,
    })
}

/// A 400 for the first field of `body` arbor does not serve as asked.
pub fn check(body: &Value, endpoint: Endpoint) -> Result<(), ApiError> {
    let Value::Object(fields) = body else {
        return Err(ApiError::invalid("the body must be a JSON object"));
    };
    let own: &[&str] = match endpoint {
        Endpoint::Chat => &["messages", "tools", "tool_choice", "response_format"],
        Endpoint::Completion => &["prompt", "suffix"],
    };
    for (name, v) in fields {
        let name_ = name.as_str();
        if own.contains(&name_) || HONOURED.contains(&name_) || INERT.contains(&name_) {
            continue;
        }
        let fine = neutral(name, v).ok_or_else(|| {
            ApiError::invalid_param(
                name,
                format!("unknown field `{name}`: arbor does not serve it"),
            )
        })?;
        if !fine {
            return Err(ApiError::invalid_param(
                name,
                format!(
                    "`{name}` is not supported by this server yet ({})",
                    why(name)
                ),
            ));
        }
    }
    if let Some(Value::Array(messages)) = fields.get("messages") {
        for (i, m) in messages.iter().enumerate() {
            check_message(i, m)?;
        }
    }
    Ok(())
}

fn why(field: &str) -> &'static str {
    match field {
        "tools" | "tool_choice" | "functions" | "function_call" => "no tool calling",
        "response_format" => "no structured output; only `{\"type\": \"text\"}`",
        "repetition_penalty" => {
            "OpenAI's `presence_penalty` and `frequency_penalty` are served instead"
        }
        "suffix" => "a suffix (fill-in-the-middle) belongs to /v1/completions and /infill",
        "echo" | "best_of" => "one continuation per request, without its prompt",
        _ => "text in, text out only",
    }
}

/// A message's fields: `role`, `content`, `tool_calls` and
/// `tool_call_id` are read, a `name` is accepted and not rendered; other
/// parts of the API (audio, a legacy `function_call`) are refused.
fn check_message(i: usize, m: &Value) -> Result<(), ApiError> {
    let Value::Object(fields) = m else {
        return Ok(()); // serde names the type error
    };
    for (name, v) in fields {
        let ok = matches!(
            name.as_str(),
            "role" | "content" | "name" | "tool_calls" | "tool_call_id"
        ) || (matches!(name.as_str(), "function_call" | "refusal" | "audio")
            && v.is_null());
        if !ok {
            let param = format!("messages[{i}].{name}");
            return Err(ApiError::invalid_param(
                &param,
                format!("`{param}` is not supported by this server"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param(body: Value, endpoint: Endpoint) -> Option<String> {
        check(&body, endpoint).err().and_then(|e| e.param)
    }

    #[test]
    fn unserved_fields_are_named_and_neutral_values_pass() {
        let chat = |k: &str, v: Value| {
            let mut b = json!({"model": "m", "messages": []});
            b[k] = v;
            param(b, Endpoint::Chat)
        };
        for (k, v) in [
            ("repetition_penalty", json!(1.1)),
            ("best_of", json!(2)),
            ("audio", json!({"voice": "x"})),
            ("frobnicate", json!(1)),
        ] {
            assert_eq!(chat(k, v).as_deref(), Some(k));
        }
        for (k, v) in [
            ("tools", json!([])),
            ("tool_choice", json!("none")),
            ("response_format", json!({"type": "text"})),
            ("logprobs", json!(true)),
            ("top_logprobs", json!(3)),
            ("presence_penalty", json!(0.5)),
            ("logit_bias", json!({"42": 5})),
            ("user", json!("u-1")),
            ("top_k", json!(40)),
        ] {
            assert_eq!(chat(k, v), None, "{k}");
        }
        let m = json!({"model": "m", "messages": [{"role": "assistant", "function_call": {}}]});
        assert_eq!(
            param(m, Endpoint::Chat).as_deref(),
            Some("messages[0].function_call")
        );
        let c = json!({"model": "m", "prompt": "x", "tools": [{}]});
        assert_eq!(param(c, Endpoint::Completion).as_deref(), Some("tools"));
        let c = json!({"model": "m", "prompt": "x", "echo": true});
        assert_eq!(param(c, Endpoint::Completion).as_deref(), Some("echo"));
        let c = json!({"model": "m", "prompt": "x", "messages": []});
        assert_eq!(param(c, Endpoint::Completion).as_deref(), Some("messages"));
    }
}
