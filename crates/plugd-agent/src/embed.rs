//! Embedders behind one trait: text in, dense vectors out, for semantic
//! recall (`memory.embedder` in `plugd.yaml`, see [`crate::recall`]).
//!
//! Two kinds:
//! * [`OpenAiEmbedder`]: `POST {base_url}/embeddings` of any
//!   OpenAI-compatible server (`{model, input: [texts], encoding_format:
//!   "float"}` → `{data: [{embedding, index}]}`), with the HTTP client,
//!   API-key variable, bounded bodies and error mapping of the chat provider
//!   (`llm::openai`).
//! * [`PluginEmbedder`]: a native plugin answering **`embed.texts`**, a plugd
//!   extension (nexo has no embedding method): request `{texts: [..],
//!   model?}`, result `{embeddings: [[..], ..]}`, one vector per text in
//!   order. A plugin that does not implement it answers `-32601`.
//!
//! Every reply goes through [`check_embeddings`]: one vector per text, every
//! element a finite number, 1..=[`MAX_EMBED_DIMENSION`] elements, all of one
//! length (and of `dimensions` when the configuration sets it). A reply that
//! fails any of these is refused with an error naming the embedder and the
//! first bad element; nothing is stored from it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use plugd_host::extensions::{self, MEMORY_TIMEOUT_ENV};
use plugd_host::peer::CallError;
use plugd_wire::codes;
use serde_json::{Value, json};

use plugd_runtime::Runtime;

use crate::llm::openai::{self, BodyError};

pub use plugd_runtime::memory_config::{EmbedderConfig, MAX_EMBED_DIMENSION};

/// The plugd extension method a plugin embedder answers.
pub const EMBED_METHOD: &str = "embed.texts";
/// Default deadline of one embedding request (HTTP or plugin;
/// `NEXO_PLUGIN_MEMORY_TIMEOUT_MS` overrides it for plugins).
pub const DEFAULT_EMBED_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest embeddings response body read (8 MiB).
pub const MAX_EMBED_RESPONSE_BYTES: usize = 8 << 20;

/// Why texts could not be embedded.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum EmbedError {
    /// The embedder is not set up (bad URL, missing key variable, unknown plugin).
    #[error("embedder not configured: {0}")]
    NotConfigured(String),
    /// The server or plugin could not be reached or did not answer in time.
    #[error("embedder {embedder:?}: connection failed: {message}")]
    Connection {
        /// The embedder (`openai:<model>` or `plugin:<id>`).
        embedder: String,
        /// Detail.
        message: String,
    },
    /// The server refused the credentials (HTTP 401/403).
    #[error("embedder {embedder:?}: authentication failed: {message}")]
    Authentication {
        /// The embedder.
        embedder: String,
        /// Detail.
        message: String,
    },
    /// The server or plugin answered with an error.
    #[error("embedder {embedder:?}: {message}")]
    Failed {
        /// The embedder.
        embedder: String,
        /// Detail.
        message: String,
    },
    /// The reply is not embeddings of the expected shape.
    #[error("embedder {embedder:?}: malformed reply: {message}")]
    Malformed {
        /// The embedder.
        embedder: String,
        /// What is wrong, naming the first bad element.
        message: String,
    },
    /// The vectors do not have the configured dimension.
    #[error(
        "embedder {embedder:?}: dimension mismatch: expected {expected}, got {got}; fix memory.embedder.dimensions or the model"
    )]
    Dimension {
        /// The embedder.
        embedder: String,
        /// `memory.embedder.dimensions`.
        expected: usize,
        /// What the embedder answered.
        got: usize,
    },
}

/// What an embedder returns: one vector per text, in order.
pub type EmbedFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Vec<f32>>, EmbedError>> + Send + 'a>>;

/// Something that turns texts into vectors.
pub trait Embedder: Send + Sync {
    /// Its name in errors (`openai:<model>`, `plugin:<id>`).
    fn name(&self) -> &str;
    /// One vector per text, in order, checked by [`check_embeddings`].
    fn embed<'a>(&'a self, texts: &'a [String]) -> EmbedFuture<'a>;
}

/// The embedder `config` describes; a plugin embedder belongs to `runtime`
/// (it starts on first use and must be approved).
pub fn build_embedder(
    config: &EmbedderConfig,
    runtime: &Runtime,
) -> Result<Arc<dyn Embedder>, EmbedError> {
    match config {
        EmbedderConfig::Openai {
            base_url,
            model,
            api_key_env,
            dimensions,
            timeout_ms,
        } => {
            let api_key =
                crate::llm::api_key("memory.embedder.api_key_env", api_key_env.as_deref())
                    .map_err(EmbedError::NotConfigured)?;
            Ok(Arc::new(OpenAiEmbedder::new(
                base_url,
                model,
                api_key,
                *dimensions,
                timeout_ms.map_or(DEFAULT_EMBED_TIMEOUT, Duration::from_millis),
            )?))
        }
        EmbedderConfig::Plugin {
            plugin,
            model,
            dimensions,
        } => Ok(Arc::new(PluginEmbedder::new(
            runtime,
            plugin,
            model.clone(),
            *dimensions,
        )?)),
    }
}

/// Checks an embedder's reply: `rows` must be `count` arrays of finite
/// numbers, 1..=[`MAX_EMBED_DIMENSION`] long, all of one length, and of
/// `dimensions` when set.
pub fn check_embeddings(
    embedder: &str,
    count: usize,
    dimensions: Option<usize>,
    rows: &[Value],
) -> Result<Vec<Vec<f32>>, EmbedError> {
    let malformed = |message: String| EmbedError::Malformed {
        embedder: embedder.to_owned(),
        message,
    };
    if rows.len() != count {
        return Err(malformed(format!(
            "{} embeddings for {count} text{}; an embedder answers one vector per text",
            rows.len(),
            if count == 1 { "" } else { "s" }
        )));
    }
    let mut out = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        let Some(items) = row.as_array() else {
            return Err(malformed(format!(
                "embedding {i} is not an array of numbers: {}",
                openai::excerpt(&row.to_string())
            )));
        };
        if items.is_empty() {
            return Err(malformed(format!("embedding {i} is empty")));
        }
        if items.len() > MAX_EMBED_DIMENSION {
            return Err(malformed(format!(
                "embedding {i} has {} elements, over the {MAX_EMBED_DIMENSION} limit",
                items.len()
            )));
        }
        let mut vector = Vec::with_capacity(items.len());
        for (j, x) in items.iter().enumerate() {
            let Some(n) = x.as_f64() else {
                return Err(malformed(format!(
                    "embedding {i}[{j}] is not a number: {}",
                    openai::excerpt(&x.to_string())
                )));
            };
            let f = n as f32;
            if !f.is_finite() {
                return Err(malformed(format!(
                    "embedding {i}[{j}] is not a finite 32-bit number: {n}"
                )));
            }
            vector.push(f);
        }
        if let Some(first) = out.first().map(Vec::len)
            && first != vector.len()
        {
            return Err(malformed(format!(
                "embedding {i} has {} elements, embedding 0 has {first}",
                vector.len()
            )));
        }
        out.push(vector);
    }
    if let (Some(expected), Some(got)) = (dimensions, out.first().map(Vec::len))
        && expected != got
    {
        return Err(EmbedError::Dimension {
            embedder: embedder.to_owned(),
            expected,
            got,
        });
    }
    Ok(out)
}

/// An OpenAI-compatible `/embeddings` client.
#[derive(Debug)]
pub struct OpenAiEmbedder {
    label: String,
    url: String,
    model: String,
    api_key: Option<String>,
    dimensions: Option<usize>,
    timeout: Duration,
    client: reqwest::Client,
}

impl OpenAiEmbedder {
    /// A client of `{base_url}/embeddings` for `model`; fails on a base URL
    /// that is not `http(s)://`.
    pub fn new(
        base_url: &str,
        model: &str,
        api_key: Option<String>,
        dimensions: Option<usize>,
        timeout: Duration,
    ) -> Result<Self, EmbedError> {
        let base = base_url.trim_end_matches('/');
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(EmbedError::NotConfigured(format!(
                "memory.embedder.base_url {base_url:?} must start with http:// or https:// (e.g. \"https://api.openai.com/v1\")"
            )));
        }
        let client = openai::http_client().map_err(EmbedError::NotConfigured)?;
        Ok(OpenAiEmbedder {
            label: format!("openai:{model}"),
            url: format!("{base}/embeddings"),
            model: model.to_owned(),
            api_key,
            dimensions,
            timeout,
            client,
        })
    }

    fn connection(&self, message: String) -> EmbedError {
        EmbedError::Connection {
            embedder: self.label.clone(),
            message,
        }
    }

    async fn exchange(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let body = json!({"model": self.model, "input": texts, "encoding_format": "float"});
        let mut builder = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::ACCEPT, "application/json")
            .body(body.to_string());
        if let Some(key) = &self.api_key {
            builder = builder.bearer_auth(key);
        }
        let transport = |e: reqwest::Error| {
            self.connection(format!(
                "{}; is the server at {} running?",
                openai::error_chain(&e),
                self.url
            ))
        };
        let mut response = builder.send().await.map_err(transport)?;
        let status = response.status();
        let limit = if status.is_success() {
            MAX_EMBED_RESPONSE_BYTES
        } else {
            64 << 10
        };
        let body = openai::read_capped(&mut response, limit)
            .await
            .map_err(|e| match e {
                BodyError::Transport(e) => transport(e),
                BodyError::TooLarge(limit) => EmbedError::Failed {
                    embedder: self.label.clone(),
                    message: format!("the response is larger than {limit} bytes; it was refused"),
                },
            })?;
        if !status.is_success() {
            let (message, _) = openai::error_detail(&body);
            let detail = format!("HTTP {}: {message}", status.as_u16());
            let embedder = self.label.clone();
            return Err(match status.as_u16() {
                401 | 403 => EmbedError::Authentication {
                    embedder,
                    message: format!(
                        "{detail}; check the API key variable (memory.embedder.api_key_env)"
                    ),
                },
                404 => EmbedError::Failed {
                    embedder,
                    message: format!(
                        "{detail}; check memory.embedder.model and memory.embedder.base_url"
                    ),
                },
                _ => EmbedError::Failed {
                    embedder,
                    message: detail,
                },
            });
        }
        self.parse(texts.len(), &body)
    }

    /// Parses an `/embeddings` body for `count` texts.
    fn parse(&self, count: usize, body: &[u8]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let malformed = |message: String| EmbedError::Malformed {
            embedder: self.label.clone(),
            message,
        };
        let v: Value = serde_json::from_slice(body).map_err(|e| {
            malformed(format!(
                "not JSON ({e}): {}",
                openai::excerpt(&String::from_utf8_lossy(body))
            ))
        })?;
        let data = v.get("data").and_then(Value::as_array).ok_or_else(|| {
            malformed(format!(
                "no data array in {}",
                openai::excerpt(&v.to_string())
            ))
        })?;
        // Order by `index` when every item has one (the API's contract);
        // otherwise the array order.
        let mut slots: Vec<Option<Value>> = vec![None; data.len()];
        let indexed = data.iter().all(|d| d.get("index").is_some());
        for (pos, item) in data.iter().enumerate() {
            let at = if indexed {
                let index = item.get("index").and_then(Value::as_u64);
                match index.and_then(|i| usize::try_from(i).ok()) {
                    Some(i) if i < slots.len() && slots[i].is_none() => i,
                    _ => {
                        return Err(malformed(format!(
                            "data[{pos}].index {} is out of range or repeated",
                            item.get("index").cloned().unwrap_or(Value::Null)
                        )));
                    }
                }
            } else {
                pos
            };
            let embedding = item
                .get("embedding")
                .ok_or_else(|| malformed(format!("data[{pos}] has no embedding")))?;
            slots[at] = Some(embedding.clone());
        }
        let rows: Vec<Value> = slots.into_iter().flatten().collect();
        check_embeddings(&self.label, count, self.dimensions, &rows)
    }
}

impl Embedder for OpenAiEmbedder {
    fn name(&self) -> &str {
        &self.label
    }

    fn embed<'a>(&'a self, texts: &'a [String]) -> EmbedFuture<'a> {
        Box::pin(async move {
            match tokio::time::timeout(self.timeout, self.exchange(texts)).await {
                Ok(r) => r,
                Err(_) => Err(self.connection(format!(
                    "{} did not answer within {:?}; raise memory.embedder.timeout_ms or check the server",
                    self.url, self.timeout
                ))),
            }
        })
    }
}

/// A native plugin answering `embed.texts`.
#[derive(Debug, Clone)]
pub struct PluginEmbedder {
    runtime: Runtime,
    plugin: String,
    label: String,
    model: Option<String>,
    dimensions: Option<usize>,
    timeout: Duration,
}

impl PluginEmbedder {
    /// The embedder served by plugin `plugin` of `runtime`, which must exist
    /// and speak the native dialect. The deadline is 30 s,
    /// `NEXO_PLUGIN_MEMORY_TIMEOUT_MS` overrides it.
    pub fn new(
        runtime: &Runtime,
        plugin: &str,
        model: Option<String>,
        dimensions: Option<usize>,
    ) -> Result<Self, EmbedError> {
        let sup = runtime
            .supervised(plugin)
            .map_err(|e| EmbedError::NotConfigured(format!("memory.embedder.plugin: {e}")))?;
        let spec = sup.spec();
        if !plugd_dialects::of(spec.dialect)
            .capabilities()
            .nexo_providers
        {
            return Err(EmbedError::NotConfigured(format!(
                "plugin {plugin:?} speaks the {} dialect; only native (nexo-plugin.toml) plugins serve {EMBED_METHOD}",
                spec.dialect
            )));
        }
        let timeout = extensions::deadline(MEMORY_TIMEOUT_ENV, DEFAULT_EMBED_TIMEOUT)
            .map_err(EmbedError::NotConfigured)?;
        Ok(PluginEmbedder {
            runtime: runtime.clone(),
            plugin: plugin.to_owned(),
            label: format!("plugin:{plugin}"),
            model,
            dimensions,
            timeout,
        })
    }

    fn failed(&self, message: String) -> EmbedError {
        EmbedError::Failed {
            embedder: self.label.clone(),
            message,
        }
    }

    async fn run(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let deadline = Instant::now() + self.timeout;
        let sup = self
            .runtime
            .supervised(&self.plugin)
            .map_err(|e| EmbedError::NotConfigured(e.to_string()))?;
        let conn = sup
            .connection(deadline)
            .await
            .map_err(|e| EmbedError::Connection {
                embedder: self.label.clone(),
                message: e.to_string(),
            })?;
        let mut params = json!({ "texts": texts });
        if let Some(model) = &self.model {
            params["model"] = json!(model);
        }
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let reply = conn
            .peer
            .call(EMBED_METHOD, Some(params), left)
            .await
            .map_err(|e| match e {
                CallError::Remote { error, .. } if error.code == codes::METHOD_NOT_FOUND => self
                    .failed(format!(
                        "the plugin does not implement {EMBED_METHOD} (a plugd extension: {{texts}} -> {{embeddings}}); pick a plugin that does, or another memory.embedder"
                    )),
                CallError::Remote { error, .. } => self.failed(format!(
                    "the plugin answered {EMBED_METHOD} with error {}: {}",
                    error.code, error.message
                )),
                CallError::Timeout { after, .. } => EmbedError::Connection {
                    embedder: self.label.clone(),
                    message: format!(
                        "no answer to {EMBED_METHOD} within {after:?} (set {MEMORY_TIMEOUT_ENV} to wait longer)"
                    ),
                },
                other => self.failed(other.to_string()),
            })?;
        let rows = reply
            .get("embeddings")
            .and_then(Value::as_array)
            .ok_or_else(|| EmbedError::Malformed {
                embedder: self.label.clone(),
                message: format!(
                    "{EMBED_METHOD} answered {}, not {{embeddings: [[...], ...]}}",
                    openai::excerpt(&reply.to_string())
                ),
            })?;
        check_embeddings(&self.label, texts.len(), self.dimensions, rows)
    }
}

impl Embedder for PluginEmbedder {
    fn name(&self) -> &str {
        &self.label
    }

    fn embed<'a>(&'a self, texts: &'a [String]) -> EmbedFuture<'a> {
        Box::pin(self.run(texts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(count: usize, dims: Option<usize>, rows: Value) -> Result<Vec<Vec<f32>>, String> {
        let rows = rows.as_array().cloned().unwrap_or_default();
        check_embeddings("e", count, dims, &rows).map_err(|e| e.to_string())
    }

    #[test]
    fn well_formed_replies_pass() {
        assert_eq!(
            check(2, Some(2), json!([[1, 0.5], [0, -1e-3]])).unwrap(),
            vec![vec![1.0, 0.5], vec![0.0, -0.001]]
        );
    }

    #[test]
    fn hostile_replies_name_the_first_bad_element() {
        let e = check(2, None, json!([[1, 2]])).unwrap_err();
        assert_eq!(
            e,
            "embedder \"e\": malformed reply: 1 embeddings for 2 texts; an embedder answers one vector per text"
        );
        let e = check(1, None, json!([[1, "x"]])).unwrap_err();
        assert!(e.contains("embedding 0[1] is not a number: \"x\""), "{e}");
        let e = check(1, None, json!([[1, null]])).unwrap_err();
        assert!(e.contains("embedding 0[1] is not a number: null"), "{e}");
        let e = check(1, None, json!(["abc"])).unwrap_err();
        assert!(e.contains("embedding 0 is not an array of numbers"), "{e}");
        // Too large for f32: infinity after conversion, refused like NaN.
        let e = check(1, None, json!([[1e300]])).unwrap_err();
        assert!(
            e.contains("embedding 0[0] is not a finite 32-bit number"),
            "{e}"
        );
        let e = check(1, None, json!([[]])).unwrap_err();
        assert!(e.contains("embedding 0 is empty"), "{e}");
        let big = vec![0.5; MAX_EMBED_DIMENSION + 1];
        let e = check(1, None, json!([big])).unwrap_err();
        assert!(e.contains("8193 elements, over the 8192 limit"), "{e}");
        let e = check(2, None, json!([[1, 2], [1, 2, 3]])).unwrap_err();
        assert!(
            e.contains("embedding 1 has 3 elements, embedding 0 has 2"),
            "{e}"
        );
        let e = check(1, Some(4), json!([[1, 2, 3]])).unwrap_err();
        assert_eq!(
            e,
            "embedder \"e\": dimension mismatch: expected 4, got 3; fix memory.embedder.dimensions or the model"
        );
    }

    fn parse(body: &str) -> Result<Vec<Vec<f32>>, String> {
        let e = OpenAiEmbedder::new(
            "http://127.0.0.1:1/v1",
            "m",
            None,
            None,
            DEFAULT_EMBED_TIMEOUT,
        )
        .unwrap();
        e.parse(2, body.as_bytes()).map_err(|e| e.to_string())
    }

    #[test]
    fn openai_bodies_are_ordered_by_index_and_checked() {
        let v =
            parse(r#"{"data":[{"index":1,"embedding":[2]},{"index":0,"embedding":[1]}]}"#).unwrap();
        assert_eq!(v, vec![vec![1.0], vec![2.0]]);
        let e = parse("NaN").unwrap_err();
        assert!(
            e.contains("embedder \"openai:m\": malformed reply: not JSON"),
            "{e}"
        );
        let e = parse(r#"{"data":[{"index":0,"embedding":[1]},{"index":0,"embedding":[1]}]}"#)
            .unwrap_err();
        assert!(
            e.contains("data[1].index 0 is out of range or repeated"),
            "{e}"
        );
        let e = parse(r#"{"object":"list"}"#).unwrap_err();
        assert!(e.contains("no data array"), "{e}");
        let e = parse(r#"{"data":[{"index":0}]}"#).unwrap_err();
        assert!(e.contains("data[0] has no embedding"), "{e}");
    }

    proptest::proptest! {
        #[test]
        fn parsing_never_panics_on_arbitrary_bodies(body in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let e = OpenAiEmbedder::new("http://127.0.0.1:1/v1", "m", None, Some(2), DEFAULT_EMBED_TIMEOUT)
                .unwrap();
            let _ = e.parse(1, &body);
        }

        #[test]
        fn checking_never_panics_on_arbitrary_json(text in "[\\[\\]0-9eE.,\"a-z -]{0,64}", count in 0usize..4) {
            if let Ok(v) = serde_json::from_str::<Value>(&text) {
                let rows = v.as_array().cloned().unwrap_or_else(|| vec![v]);
                if let Ok(out) = check_embeddings("e", count, None, &rows) {
                    proptest::prop_assert_eq!(out.len(), count);
                    proptest::prop_assert!(out.iter().flatten().all(|x| x.is_finite()));
                }
            }
        }
    }

    #[test]
    fn a_base_url_without_scheme_is_refused() {
        let e = OpenAiEmbedder::new("localhost:8080", "m", None, None, DEFAULT_EMBED_TIMEOUT)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("memory.embedder.base_url \"localhost:8080\" must start with http://"),
            "{e}"
        );
    }
}
