//! The tex2pdf client: submit and poll, over the HTTP contract of the [crate docs](crate).

use std::time::Duration;

use base64::Engine;
use reqwest::{StatusCode, Url};
use serde::Deserialize;

/// The informational header naming the submitter (`<tenant>/<project>`), for the service's statistics.
pub const LABEL_HEADER: &str = "x-tex2pdf-label";

/// How much of an unexpected response body an error quotes.
const QUOTED_BODY_CHARS: usize = 500;

/// The state of a submitted job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    /// Still compiling.
    Running,
    /// Finished: the PDF.
    Done(Vec<u8>),
    /// The compiler failed: its log.
    Failed(String),
}

/// Why a call to the tex2pdf service did not give an answer of the contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The service answered 429: it is overloaded and did not take the job.
    #[error("the tex2pdf service is overloaded (429)")]
    Overloaded {
        /// The service's `Retry-After`, when it sent one in seconds.
        retry_after: Option<Duration>,
    },
    /// The service does not know the job (404): it expired or was never submitted.
    #[error("the tex2pdf service does not know job {job_id:?} (expired or never submitted)")]
    UnknownJob {
        /// The job id asked for.
        job_id: String,
    },
    /// The service answered with a status the contract does not have for this call.
    #[error("the tex2pdf service answered {status} to {operation}: {body}")]
    Status {
        /// `submit` or `poll`.
        operation: &'static str,
        /// The HTTP status.
        status: u16,
        /// The start of the response body.
        body: String,
    },
    /// The request did not complete: connection refused, reset, timed out.
    #[error("tex2pdf {operation} failed: {message}")]
    Transport {
        /// `submit`, `poll` or `connect`.
        operation: &'static str,
        /// What happened.
        message: String,
    },
    /// The response did not match the contract (bad JSON, an unknown state, invalid base64).
    #[error("tex2pdf {operation}: unexpected answer: {message}")]
    Protocol {
        /// `submit` or `poll`.
        operation: &'static str,
        /// What did not match.
        message: String,
    },
}

/// A client of one tex2pdf service. Cheap to clone (the connection pool is shared).
#[derive(Debug, Clone)]
pub struct Tex2PdfClient {
    base: Url,
    http: reqwest::Client,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Submitted {
    job_id: String,
}

#[derive(Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
enum Polled {
    Running,
    Done {
        #[serde(rename = "pdfBase64")]
        pdf_base64: String,
    },
    Failed {
        log: String,
    },
}

impl Tex2PdfClient {
    /// The default per-request timeout: a submit or a poll is one short call, never the whole compile.
    pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

    /// A client of the service at `base_url` (`http://` or `https://`), with [`Self::DEFAULT_REQUEST_TIMEOUT`].
    pub fn new(base_url: &str) -> Result<Self, ClientError> {
        Self::with_timeout(base_url, Self::DEFAULT_REQUEST_TIMEOUT)
    }

    /// A client of the service at `base_url` whose requests time out after `request_timeout`.
    pub fn with_timeout(base_url: &str, request_timeout: Duration) -> Result<Self, ClientError> {
        let connect = |message: String| ClientError::Transport { operation: "connect", message };
        let base = Url::parse(base_url).map_err(|e| connect(format!("{base_url:?} is not a URL: {e}")))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(connect(format!("{base_url:?} is not an http:// or https:// base URL")));
        }
        let http = reqwest::Client::builder()
            .timeout(request_timeout)
            .connect_timeout(request_timeout.min(Duration::from_secs(5)))
            .build()
            .map_err(|e| connect(e.to_string()))?;
        Ok(Tex2PdfClient { base, http })
    }

    /// The service's base URL.
    pub fn base_url(&self) -> &str {
        self.base.as_str()
    }

    /// The URL of `segments` below the base URL, each segment percent-encoded (a job id is the service's text).
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// Submits `source` and returns the job id. `label` (`<tenant>/<project>`) goes into [`LABEL_HEADER`].
    ///
    /// Errors: [`ClientError::Overloaded`] on 429; `Status`, `Transport` or `Protocol` otherwise.
    pub async fn submit(&self, source: &str, label: Option<&str>) -> Result<String, ClientError> {
        const OP: &str = "submit";
        let mut request = self.http.post(self.url(&["jobs"])).json(&serde_json::json!({ "source": source }));
        if let Some(label) = label {
            request = request.header(LABEL_HEADER, label);
        }
        let response = request.send().await.map_err(|e| transport(OP, &e))?;
        let status = response.status();
        if status == StatusCode::TOO_MANY_REQUESTS {
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            return Err(ClientError::Overloaded { retry_after });
        }
        let body = response.bytes().await.map_err(|e| transport(OP, &e))?;
        if !status.is_success() {
            return Err(unexpected_status(OP, status, &body));
        }
        let submitted: Submitted = serde_json::from_slice(&body)
            .map_err(|e| ClientError::Protocol { operation: OP, message: format!("{e}: {}", quote(&body)) })?;
        if submitted.job_id.is_empty() {
            return Err(ClientError::Protocol { operation: OP, message: "empty jobId".to_owned() });
        }
        Ok(submitted.job_id)
    }

    /// The state of job `job_id`.
    ///
    /// Errors: [`ClientError::UnknownJob`] on 404; `Status`, `Transport` or `Protocol` otherwise.
    pub async fn poll(&self, job_id: &str) -> Result<JobState, ClientError> {
        const OP: &str = "poll";
        let response = self.http.get(self.url(&["jobs", job_id])).send().await.map_err(|e| transport(OP, &e))?;
        let status = response.status();
        if status == StatusCode::NOT_FOUND {
            return Err(ClientError::UnknownJob { job_id: job_id.to_owned() });
        }
        let body = response.bytes().await.map_err(|e| transport(OP, &e))?;
        if !status.is_success() {
            return Err(unexpected_status(OP, status, &body));
        }
        let polled: Polled = serde_json::from_slice(&body)
            .map_err(|e| ClientError::Protocol { operation: OP, message: format!("{e}: {}", quote(&body)) })?;
        Ok(match polled {
            Polled::Running => JobState::Running,
            Polled::Failed { log } => JobState::Failed(log),
            Polled::Done { pdf_base64 } => {
                let pdf = base64::engine::general_purpose::STANDARD.decode(pdf_base64.trim()).map_err(|e| {
                    ClientError::Protocol { operation: OP, message: format!("pdfBase64 is not base64: {e}") }
                })?;
                JobState::Done(pdf)
            }
        })
    }
}

fn transport(operation: &'static str, e: &reqwest::Error) -> ClientError {
    // The error's source chain says what actually happened (refused, reset, timed out).
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    ClientError::Transport { operation, message }
}

fn unexpected_status(operation: &'static str, status: StatusCode, body: &[u8]) -> ClientError {
    ClientError::Status { operation, status: status.as_u16(), body: quote(body) }
}

fn quote(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    match text.char_indices().nth(QUOTED_BODY_CHARS) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_checked_and_paths_appended_with_encoding() {
        assert!(matches!(Tex2PdfClient::new("ftp://x"), Err(ClientError::Transport { .. })));
        assert!(matches!(Tex2PdfClient::new("not a url"), Err(ClientError::Transport { .. })));
        let c = Tex2PdfClient::new("http://h:1/prefix/").unwrap();
        assert_eq!(c.url(&["jobs"]).as_str(), "http://h:1/prefix/jobs");
        assert_eq!(c.url(&["jobs", "a/b?c"]).as_str(), "http://h:1/prefix/jobs/a%2Fb%3Fc");
        let c = Tex2PdfClient::new("http://h:1").unwrap();
        assert_eq!(c.url(&["jobs", "j1"]).as_str(), "http://h:1/jobs/j1");
    }

    #[test]
    fn quoted_bodies_are_cut() {
        let long = "x".repeat(QUOTED_BODY_CHARS + 10);
        assert_eq!(quote(long.as_bytes()).chars().count(), QUOTED_BODY_CHARS + 1);
        assert_eq!(quote(b"short"), "short");
    }

    #[tokio::test]
    async fn an_unreachable_service_is_a_transport_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let c = Tex2PdfClient::new(&format!("http://127.0.0.1:{port}")).unwrap();
        assert!(matches!(c.submit("x", None).await, Err(ClientError::Transport { operation: "submit", .. })));
        assert!(matches!(c.poll("j").await, Err(ClientError::Transport { operation: "poll", .. })));
    }
}
