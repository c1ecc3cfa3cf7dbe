//! Errors as OpenAI's API gives them: a status code and a body
//! `{"error": {"message", "type", "param", "code"}}` that the official
//! clients turn into their typed exceptions.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// A request that cannot be served, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `rate_limit_error`,
    /// `server_error`, `timeout_error`.
    pub kind: &'static str,
    /// The request field at fault, where there is one.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds to wait before retrying (a full queue).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400: the request is malformed or out of range.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the field at fault.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_string()),
            ..Self::invalid(message)
        }
    }

    /// 401: a missing or wrong API key.
    pub fn unauthorized() -> Self {
        Self {
            code: Some("invalid_api_key"),
            ..Self::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "invalid API key: send `Authorization: Bearer <key>` with the key the server \
                 was started with",
            )
        }
    }

    /// 404: an unknown model or route.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            code: Some("model_not_found"),
            ..Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
        }
    }

    /// 429: the queue is full.
    pub fn busy(queue: usize) -> Self {
        Self {
            retry_after: Some(1),
            code: Some("queue_full"),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!("the server's queue of {queue} requests is full: retry later"),
            )
        }
    }

    /// 408: the request outlived its timeout (queue wait included).
    pub fn timeout(secs: f64) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "timeout_error",
            format!("the request took longer than the server's timeout of {secs:.0} s"),
        )
    }

    /// 500: the engine failed.
    pub fn server(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// 503: the server is shutting down.
    pub fn unavailable() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the server is shutting down",
        )
    }

    /// 503: no model to serve yet (`loading`), or its load failed.
    pub fn not_loaded(why: &str) -> Self {
        Self {
            retry_after: Some(5),
            code: Some("model_not_ready"),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                format!("the model is not ready: {why}"),
            )
        }
    }

    /// 415: a POST body that does not say it is JSON.
    pub fn not_json(content_type: Option<&str>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            format!(
                "the body must be sent as `Content-Type: application/json` (got {})",
                content_type.map_or("none".into(), |c| format!("`{c}`"))
            ),
        )
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
