//! Tracing: one OpenTelemetry span per request, exported over OTLP/HTTP (`[tracing]`,
//! docs/design.md "Tracing"). Off unless configured: the request path then checks one `Option`.
//!
//! A request's span starts where the request is first seen ([`Spans::begin`]), as a child of
//! the trace context its `traceparent` carries (W3C Trace Context), sampled parent-based (a
//! sampled parent is followed, an unsampled one too; a request without one is sampled at the
//! configured ratio by its trace id). A sampled request's `traceparent` is rewritten to name
//! larder's span, so that what it sends upstream joins the trace under it. The span ends when
//! the response's head is ready, with the route, status, cache decision and body size as
//! attributes ([`Traced::finish`]); ending it queues it for the SDK's batching processor, which
//! exports from a thread of its own (a full queue drops spans, never holds a request up).
//!
//! The exporter's HTTP client is the upstream client (plain or TLS, as a pool's `tls` says),
//! run on a one-thread runtime of the exporter's own, so exports never run on the workers.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Request, Response};
use http_body_util::BodyExt;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::{HeaderExtractor, HeaderInjector, HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;

use crate::body::Body;
use crate::config::{BackendConfig, PoolConfig, TracingConfig};

/// The span exporter of a server: the SDK's provider and tracer, and how traces are joined.
pub struct Spans {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
}

impl std::fmt::Debug for Spans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Spans")
    }
}

/// A request's span, from its start to its response's head.
pub struct Traced {
    span: opentelemetry_sdk::trace::Span,
    method: http::Method,
}

impl Spans {
    /// Starts the exporter `cfg` describes; an unusable CA or client certificate, or an
    /// exporter the SDK refuses, is an error.
    pub fn start(cfg: &TracingConfig) -> Result<Arc<Spans>, String> {
        let client = Exporter::new(cfg)?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_endpoint(cfg.otlp_endpoint.0.to_string())
            .with_protocol(Protocol::HttpBinary)
            .with_timeout(cfg.timeout.0)
            .with_headers(cfg.headers.clone().into_iter().collect())
            .build()
            .map_err(|e| format!("tracing: {e}"))?;
        let batching = BatchConfigBuilder::default()
            .with_max_queue_size(cfg.queue.get() as usize)
            .with_scheduled_delay(cfg.flush_interval.0)
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batching)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                cfg.sample.0,
            ))))
            .with_resource(
                Resource::builder()
                    .with_service_name(cfg.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = opentelemetry::trace::TracerProvider::tracer(&provider, "larder");
        Ok(Arc::new(Spans {
            provider,
            tracer,
            propagator: TraceContextPropagator::new(),
        }))
    }

    /// Starts the span of `req` if it is sampled, and names the span in its `traceparent`.
    pub fn begin<B>(&self, req: &mut Request<B>, peer: SocketAddr) -> Option<Box<Traced>> {
        let parent = self.propagator.extract(&HeaderExtractor(req.headers()));
        let text = |v: Option<&http::HeaderValue>| {
            v.and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
        };
        let mut attributes = vec![
            KeyValue::new("http.request.method", req.method().as_str().to_string()),
            KeyValue::new("url.path", req.uri().path().to_string()),
            KeyValue::new("client.address", peer.ip().to_string()),
            KeyValue::new(
                "network.protocol.version",
                match req.version() {
                    http::Version::HTTP_10 => "1.0",
                    http::Version::HTTP_2 => "2",
                    http::Version::HTTP_3 => "3",
                    _ => "1.1",
                },
            ),
        ];
        let host = (req.uri().authority().map(|a| a.as_str().to_string()))
            .unwrap_or_else(|| text(req.headers().get(header::HOST)));
        if !host.is_empty() {
            attributes.push(KeyValue::new("server.address", host));
        }
        if let Some(ua) = req.headers().get(header::USER_AGENT) {
            attributes.push(KeyValue::new("user_agent.original", text(Some(ua))));
        }
        let span = self
            .tracer
            .span_builder(req.method().as_str().to_string())
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        if !span.is_recording() {
            return None;
        }
        let cx = Context::new().with_remote_span_context(span.span_context().clone());
        self.propagator
            .inject_context(&cx, &mut HeaderInjector(req.headers_mut()));
        Some(Box::new(Traced {
            span,
            method: req.method().clone(),
        }))
    }

    /// Sends what is queued and stops the exporter (at shutdown; blocks until sent or timed
    /// out).
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::debug!(error = %e, "tracing: exporter shutdown");
        }
    }
}

impl Traced {
    /// The route that serves the request: its path prefix is `http.route` (and the span's
    /// name, after the method), its label (`{listener} {host}{prefix}`, as in the metrics)
    /// `larder.route`.
    pub fn routed(&mut self, prefix: &str, label: &str) {
        self.span
            .update_name(format!("{} {prefix}", self.method.as_str()));
        self.span.set_attributes([
            KeyValue::new("http.route", prefix.to_string()),
            KeyValue::new("larder.route", label.to_string()),
        ]);
    }

    /// The request's id (a `request_id` rule gave it): `larder.request_id`.
    pub fn request_id(&mut self, id: &str) {
        self.span
            .set_attribute(KeyValue::new("larder.request_id", id.to_string()));
    }

    /// Ends the span with what the response says: status (5xx: an error), the cache decision,
    /// the body's coding and, when known, its size.
    pub fn finish(mut self: Box<Self>, status: u16, cache: &'static str, sent: Option<u64>) {
        let mut attributes = vec![
            KeyValue::new("http.response.status_code", i64::from(status)),
            KeyValue::new("larder.cache", cache),
        ];
        if let Some(n) = sent {
            attributes.push(KeyValue::new("http.response.body.size", n as i64));
        }
        self.span.set_attributes(attributes);
        if status >= 500 {
            self.span.set_status(Status::error(""));
        }
        self.span.end();
    }
}

/// The exporter's HTTP client: the upstream client on a runtime of its own.
#[derive(Clone)]
struct Exporter {
    client: crate::upstream::connect::Client,
    runtime: Arc<OwnRuntime>,
    timeout: std::time::Duration,
}

/// A runtime that may be dropped anywhere (a runtime dropped within another's task would
/// panic): it is shut down in the background. (The option is taken only by `drop`.)
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl OwnRuntime {
    fn get(&self) -> &tokio::runtime::Runtime {
        self.0.as_ref().expect("taken only when dropped")
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("larder OTLP client")
    }
}

impl Exporter {
    fn new(cfg: &TracingConfig) -> Result<Exporter, String> {
        let uri = &cfg.otlp_endpoint.0;
        let origin = format!(
            "{}://{}",
            uri.scheme_str().unwrap_or("http"),
            uri.authority().map_or("", |a| a.as_str())
        );
        let mut pool = PoolConfig::of(vec![BackendConfig::new(
            origin.parse().map_err(|e| format!("tracing: {e}"))?,
        )]);
        pool.tls = cfg.tls.clone();
        pool.max_idle = 2;
        let client =
            crate::upstream::connect::Client::new(&pool).map_err(|e| format!("tracing: {e}"))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("larder-otlp")
            .enable_all()
            .build()
            .map_err(|e| format!("tracing: cannot start the exporter's thread: {e}"))?;
        Ok(Exporter {
            client,
            runtime: Arc::new(OwnRuntime(Some(runtime))),
            timeout: cfg.timeout.0,
        })
    }
}

/// The largest answer a collector's is read to (OTLP answers are small).
const MAX_ANSWER: usize = 1 << 20;

#[async_trait::async_trait]
impl HttpClient for Exporter {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (client, timeout) = (self.client.clone(), self.timeout);
        let exchange = async move {
            let answer = client.request(request.map(Body::full)).await?;
            // The connection goes back to the pool once the body is read.
            let (response, _conn) = answer.into_parts();
            let (parts, body) = response.into_parts();
            let body = http_body_util::Limited::new(body, MAX_ANSWER)
                .collect()
                .await?
                .to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        };
        let task = self
            .runtime
            .get()
            .spawn(async move { tokio::time::timeout(timeout, exchange).await });
        match task.await? {
            Ok(answer) => answer,
            Err(_) => Err(format!("no answer within {timeout:?}").into()),
        }
    }
}
