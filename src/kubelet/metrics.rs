//! Metrics over HTTP: the endpoint `accel-exporter` and both daemons' `--metrics-address`
//! serve, and the device plugin's and the DRA driver's own metric families.
//!
//! A scrape gets the Prometheus text format (0.0.4) unless its `Accept` asks for OpenMetrics
//! (Prometheus 2.5+ asks for it first), both encoded by `prometheus-client`. The endpoint only
//! renders what is already in memory: nothing a scrape does opens a device, a socket or a
//! file, so a scrape storm costs CPU for the encoding and nothing else. Connections are
//! bounded in number and in the time their request headers may take.
//!
//! Names follow Prometheus' rules (docs/exporter.md): `accel_` first, base units (seconds),
//! `_total` on counters (added by the encoder), labels of few values (`resource`, `driver`,
//! `result`, `reason`), never an ID or a message.
//!
//! Ref: prometheus/docs `instrumenting/exposition_formats.md`, `practices/naming.md`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

/// The exposition a scrape asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `text/plain; version=0.0.4`.
    Text,
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
}

impl Format {
    /// From a request's `Accept`: OpenMetrics where it is named (Prometheus' own scrapes name
    /// it with a higher weight than text), the text format otherwise.
    pub fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// `registry` in `format`.
pub fn encode(registry: &Registry, format: Format) -> String {
    let mut out = String::with_capacity(8 << 10);
    // Writing into a String cannot fail.
    let _ = match format {
        Format::Text => prometheus_client::encoding::prometheus_text::encode(&mut out, registry),
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, registry),
    };
    out
}

/// What the endpoint answers `/metrics` with: the page in the format asked for.
pub type Render = Arc<dyn Fn(Format) -> String + Send + Sync>;

/// At most this many connections are served at once; more wait in the listen queue.
const MAX_CONNECTIONS: usize = 64;

/// Serves `render` at `http://<addr>/metrics` until `stop` turns true. Returns the address
/// bound (port 0 picks one) once listening.
pub async fn serve(
    addr: SocketAddr,
    render: Render,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let permit = tokio::select! {
                p = Arc::clone(&slots).acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
                _ = stopped(&mut stop) => return,
            };
            let (stream, _) = tokio::select! {
                a = listener.accept() => match a {
                    Ok(a) => a,
                    Err(e) => {
                        log::warn!("metrics endpoint: accept: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = stopped(&mut stop) => return,
            };
            let render = Arc::clone(&render);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let render = Arc::clone(&render);
                    async move { Ok::<_, Infallible>(answer(&req, &render)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(10))
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
                drop(permit);
            });
        }
    });
    Ok(bound)
}

/// Resolves once `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

fn answer(req: &Request<Incoming>, render: &Render) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, ctype: &str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        if let Ok(v) = hyper::header::HeaderValue::from_str(ctype) {
            r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        r
    };
    if req.method() != hyper::Method::GET && req.method() != hyper::Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET /metrics\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => {
            let accept = req
                .headers()
                .get(hyper::header::ACCEPT)
                .and_then(|v| v.to_str().ok());
            let format = Format::from_accept(accept);
            reply(StatusCode::OK, format.content_type(), render(format))
        }
        "/" => reply(StatusCode::OK, "text/plain", "metrics at /metrics\n".into()),
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

/// Latency buckets of the daemons' calls: 1 ms to about 16 s.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

type Labels = Vec<(&'static str, String)>;

/// The device plugin's families, one set per process.
#[derive(Debug)]
pub struct PluginMetrics {
    registry: Registry,
    registrations: Family<Labels, Counter>,
    allocations: Family<Labels, Counter>,
    allocation_failures: Family<Labels, Counter>,
    allocation_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    health_transitions: Family<Labels, Counter>,
}

impl PluginMetrics {
    fn new() -> PluginMetrics {
        let mut registry = Registry::default();
        let m = PluginMetrics {
            registrations: Family::default(),
            allocations: Family::default(),
            allocation_failures: Family::default(),
            allocation_seconds: Family::new_with_constructor(latency),
            health_transitions: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "accel_plugin_registrations",
            "Registrations with kubelet, by resource and result (ok, failed)",
            m.registrations.clone(),
        );
        registry.register(
            "accel_plugin_allocations",
            "Allocate requests answered, by resource",
            m.allocations.clone(),
        );
        registry.register(
            "accel_plugin_allocation_failures",
            "Allocate requests refused, by resource and reason (the gRPC code)",
            m.allocation_failures.clone(),
        );
        registry.register_with_unit(
            "accel_plugin_allocation_duration",
            "Time to answer an Allocate request, by resource",
            Unit::Seconds,
            m.allocation_seconds.clone(),
        );
        registry.register(
            "accel_plugin_health_transitions",
            "Devices that turned healthy or unhealthy, by resource and the state reached",
            m.health_transitions.clone(),
        );
        PluginMetrics { registry, ..m }
    }

    pub fn registration(&self, resource: &str, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.registrations
            .get_or_create(&vec![
                ("resource", resource.to_string()),
                ("result", result.to_string()),
            ])
            .inc();
    }

    /// One Allocate answered (`Ok`) or refused (`Err`, with the gRPC code as reason).
    pub fn allocation<T>(
        &self,
        resource: &str,
        started: Instant,
        result: &Result<T, tonic::Status>,
    ) {
        let by = vec![("resource", resource.to_string())];
        self.allocation_seconds
            .get_or_create(&by)
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok(_) => {
                self.allocations.get_or_create(&by).inc();
            }
            Err(s) => {
                let reason = format!("{:?}", s.code()).to_ascii_lowercase();
                self.allocation_failures
                    .get_or_create(&vec![
                        ("resource", resource.to_string()),
                        ("reason", reason),
                    ])
                    .inc();
            }
        }
    }

    pub fn health_transition(&self, resource: &str, healthy: bool) {
        let to = if healthy { "healthy" } else { "unhealthy" };
        self.health_transitions
            .get_or_create(&vec![
                ("resource", resource.to_string()),
                ("to", to.to_string()),
            ])
            .inc();
    }
}

/// The DRA driver's families, one set per process.
#[derive(Debug)]
pub struct DraMetrics {
    registry: Registry,
    registrations: Family<Labels, Counter>,
    calls: Family<Labels, Counter>,
    failures: Family<Labels, Counter>,
    seconds: Family<Labels, Histogram, fn() -> Histogram>,
    publishes: Family<Labels, Counter>,
}

impl DraMetrics {
    fn new() -> DraMetrics {
        let mut registry = Registry::default();
        let m = DraMetrics {
            registrations: Family::default(),
            calls: Family::default(),
            failures: Family::default(),
            seconds: Family::new_with_constructor(latency),
            publishes: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "accel_dra_registrations",
            "kubelet's answers to the driver's registration, by driver and result (ok, refused)",
            m.registrations.clone(),
        );
        registry.register(
            "accel_dra_claims",
            "Claims prepared or unprepared, by driver and call (prepare, unprepare)",
            m.calls.clone(),
        );
        registry.register(
            "accel_dra_claim_failures",
            "Claims whose prepare or unprepare failed, by driver, call and reason",
            m.failures.clone(),
        );
        registry.register_with_unit(
            "accel_dra_claim_duration",
            "Time to prepare or unprepare one claim, by driver and call",
            Unit::Seconds,
            m.seconds.clone(),
        );
        registry.register(
            "accel_dra_slice_publishes",
            "ResourceSlice publishes of the driver's pool, by driver and result (written, unchanged, failed)",
            m.publishes.clone(),
        );
        DraMetrics { registry, ..m }
    }

    pub fn registration(&self, driver: &str, ok: bool) {
        let result = if ok { "ok" } else { "refused" };
        self.registrations
            .get_or_create(&vec![
                ("driver", driver.to_string()),
                ("result", result.to_string()),
            ])
            .inc();
    }

    /// One claim's `call` (`prepare`, `unprepare`) done, with its error message if it failed.
    pub fn claim(&self, driver: &str, call: &'static str, started: Instant, error: Option<&str>) {
        let by = vec![("driver", driver.to_string()), ("call", call.to_string())];
        self.seconds
            .get_or_create(&by)
            .observe(started.elapsed().as_secs_f64());
        match error {
            None => {
                self.calls.get_or_create(&by).inc();
            }
            Some(e) => {
                let mut by = by;
                by.push(("reason", failure_reason(e).to_string()));
                self.failures.get_or_create(&by).inc();
            }
        }
    }

    /// One publish: `Ok(written)` or failed.
    pub fn publish<E>(&self, driver: &str, result: &Result<bool, E>) {
        let r = match result {
            Ok(true) => "written",
            Ok(false) => "unchanged",
            Err(_) => "failed",
        };
        self.publishes
            .get_or_create(&vec![
                ("driver", driver.to_string()),
                ("result", r.to_string()),
            ])
            .inc();
    }
}

/// A failure message as one of a few reasons (a label never carries the message itself).
pub fn failure_reason(message: &str) -> &'static str {
    let m = message.to_ascii_lowercase();
    if m.contains("api server") {
        "api-server"
    } else if m.contains("already") || m.contains("in use") || m.contains("held by") {
        "in-use"
    } else if m.contains("not found") || m.contains("no device") || m.contains("unknown") {
        "unknown-device"
    } else if m.contains("cdi") || m.contains("record") || m.contains("write") {
        "io"
    } else {
        "other"
    }
}

static PLUGIN: OnceLock<PluginMetrics> = OnceLock::new();
static DRA: OnceLock<DraMetrics> = OnceLock::new();

/// The device plugin's metrics (created at the first call).
pub fn plugin() -> &'static PluginMetrics {
    PLUGIN.get_or_init(PluginMetrics::new)
}

/// The DRA driver's metrics (created at the first call).
pub fn dra() -> &'static DraMetrics {
    DRA.get_or_init(DraMetrics::new)
}

/// What a daemon's `--metrics-address` serves: the families of whichever daemon this is.
pub fn daemon_render() -> Render {
    Arc::new(|format| {
        let mut out = String::new();
        for r in [
            PLUGIN.get().map(|m| &m.registry),
            DRA.get().map(|m| &m.registry),
        ]
        .into_iter()
        .flatten()
        {
            let page = encode(r, format);
            // One OpenMetrics page ends with one `# EOF`.
            out.push_str(page.strip_suffix("# EOF\n").unwrap_or(&page));
        }
        if format == Format::OpenMetrics {
            out.push_str("# EOF\n");
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render_in_both_formats() {
        let p = plugin();
        p.registration("example.com/gpu", true);
        p.allocation::<()>("example.com/gpu", Instant::now(), &Ok(()));
        p.allocation::<()>(
            "example.com/gpu",
            Instant::now(),
            &Err(tonic::Status::invalid_argument("x")),
        );
        p.health_transition("example.com/gpu", false);
        dra().publish::<()>("gpu.example.com", &Ok(true));
        dra().claim(
            "gpu.example.com",
            "prepare",
            Instant::now(),
            Some("cannot read it from the API server"),
        );
        let text = daemon_render()(Format::Text);
        for want in [
            "accel_plugin_registrations_total{resource=\"example.com/gpu\",result=\"ok\"} 1",
            "accel_plugin_allocations_total{resource=\"example.com/gpu\"} 1",
            "accel_plugin_allocation_failures_total{resource=\"example.com/gpu\",reason=\"invalidargument\"} 1",
            "accel_plugin_allocation_duration_seconds_count{resource=\"example.com/gpu\"} 2",
            "accel_plugin_health_transitions_total{resource=\"example.com/gpu\",to=\"unhealthy\"} 1",
            "accel_dra_slice_publishes_total{driver=\"gpu.example.com\",result=\"written\"} 1",
            "accel_dra_claim_failures_total{driver=\"gpu.example.com\",call=\"prepare\",reason=\"api-server\"} 1",
        ] {
            assert!(text.contains(want), "{want}\n{text}");
        }
        assert!(!text.contains("# EOF"));
        let om = daemon_render()(Format::OpenMetrics);
        assert!(
            om.ends_with("# EOF\n") && om.matches("# EOF").count() == 1,
            "{om}"
        );
        assert_eq!(
            Format::from_accept(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
            )),
            Format::OpenMetrics
        );
        assert_eq!(Format::from_accept(Some("*/*")), Format::Text);
    }
}
