//! Metrics over HTTP: the endpoint `accel-exporter` and both daemons' `--metrics-address`
//! serve, and the device plugin's and the DRA driver's own metric families.
//!
//! A scrape gets the Prometheus text format (0.0.4) unless its `Accept` asks for OpenMetrics
//! (Prometheus 2.5+ asks for it first), both encoded by `prometheus-client`. The endpoint only
//! renders what is already in memory: nothing a scrape does opens a device, a socket or a
//! file, so a scrape storm costs CPU for the encoding and nothing else.
//!
//! The endpoint faces any pod of the node, so no client can hold it: each connection answers
//! one request and lives at most [`CONNECTION_DEADLINE`] in all (reading the request and
//! writing the answer: a client that stops reading is cut off there); at most
//! `MAX_CONNECTIONS` are open, and a new one closes the oldest, so connections left open
//! never keep a scrape waiting; and a page being sent to slow clients is one page shared by
//! them, not one each (`Pages`).
//!
//! Names follow Prometheus' rules (docs/exporter.md): `accel_` first, base units (seconds),
//! `_total` on counters (added by the encoder), labels of few values (`resource`, `driver`,
//! `result`, `reason`), never an ID or a message.
//!
//! Ref: prometheus/docs `instrumenting/exposition_formats.md`, `practices/naming.md`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
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

/// At most this many connections are open at once; one more closes the oldest.
const MAX_CONNECTIONS: usize = 64;

/// A connection's whole life: its request read and its answer written, or it is closed.
/// Prometheus' default scrape timeout.
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);

/// How long a page still being sent to a client is given to the next requests of the same
/// format instead of a fresh one.
const SHARE_FOR: Duration = Duration::from_secs(1);

/// Renders pages, sharing one with the requests that come while an earlier client is still
/// being sent it (within [`SHARE_FOR`]): clients that read slowly, or never, pin one page
/// between them rather than one each. A page nobody holds any more is never reused, so
/// requests one after the other each see the state of their moment.
struct Pages {
    render: Render,
    /// By format: when the last page was rendered, and the page.
    last: Mutex<[Option<(Instant, Bytes)>; 2]>,
}

impl Pages {
    fn page(&self, format: Format) -> Bytes {
        let i = match format {
            Format::Text => 0,
            Format::OpenMetrics => 1,
        };
        // Renders one at a time, too: a burst of scrapes costs one page of memory at a time.
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, page)) = &last[i] {
            if !page.is_unique() && at.elapsed() < SHARE_FOR {
                return page.clone();
            }
        }
        let page = Bytes::from((self.render)(format));
        last[i] = Some((Instant::now(), page.clone()));
        page
    }
}

/// Serves `render` at `http://<addr>/metrics` until `stop` turns true. Returns the address
/// bound (port 0 picks one) once listening.
pub async fn serve(
    addr: SocketAddr,
    render: Render,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let pages = Arc::new(Pages {
        render,
        last: Mutex::new([None, None]),
    });
    tokio::spawn(async move {
        let mut open: VecDeque<tokio::task::JoinHandle<()>> = VecDeque::new();
        let mut said = false;
        loop {
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
            open.retain(|c| !c.is_finished());
            if open.len() >= MAX_CONNECTIONS {
                // The oldest has had the longest to send its request and read its answer; a
                // scrape takes milliseconds, so it is the one least likely to be one.
                if let Some(c) = open.pop_front() {
                    c.abort();
                }
                if !said {
                    log::warn!(
                        "metrics endpoint: {MAX_CONNECTIONS} connections open; each new one closes the oldest (said once)"
                    );
                    said = true;
                }
            }
            open.push_back(tokio::spawn(connection(stream, Arc::clone(&pages))));
        }
    });
    Ok(bound)
}

/// Serves one request on `stream` within [`CONNECTION_DEADLINE`], then closes it.
async fn connection(stream: tokio::net::TcpStream, pages: Arc<Pages>) {
    let svc = hyper::service::service_fn(move |req| {
        let pages = Arc::clone(&pages);
        async move { Ok::<_, Infallible>(answer(&req, &pages)) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
    // Past the deadline the connection is dropped: the socket closed, the page let go.
    let _ = tokio::time::timeout(CONNECTION_DEADLINE, conn).await;
}

/// Resolves once `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

fn answer(req: &Request<Incoming>, pages: &Pages) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, ctype: &str, body: Bytes| {
        let mut r = Response::new(Full::new(body));
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
            Bytes::from_static(b"GET /metrics\n"),
        );
    }
    match req.uri().path() {
        "/metrics" => {
            let accept = req
                .headers()
                .get(hyper::header::ACCEPT)
                .and_then(|v| v.to_str().ok());
            let format = Format::from_accept(accept);
            reply(StatusCode::OK, format.content_type(), pages.page(format))
        }
        "/" => reply(
            StatusCode::OK,
            "text/plain",
            Bytes::from_static(b"metrics at /metrics\n"),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            Bytes::from_static(b"not found\n"),
        ),
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

    /// Issue 42 item 7: clients still being sent a page share it; a page nobody holds is
    /// rendered afresh.
    #[test]
    fn a_page_held_by_slow_clients_is_shared_not_rendered_per_client() {
        let renders = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let n = Arc::clone(&renders);
        let pages = Pages {
            render: Arc::new(move |_| {
                let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                format!("page {i}\n").repeat(1000)
            }),
            last: Mutex::new([None, None]),
        };
        let held: Vec<Bytes> = (0..64).map(|_| pages.page(Format::Text)).collect();
        assert_eq!(renders.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(held.iter().all(|p| p.as_ptr() == held[0].as_ptr()));
        // Another format is its own page.
        assert!(pages.page(Format::OpenMetrics).starts_with(b"page 1\n"));
        drop(held);
        // Nobody holds the text page: the next request sees the state of its moment.
        assert!(pages.page(Format::Text).starts_with(b"page 2\n"));
        assert!(pages.page(Format::Text).starts_with(b"page 3\n"));
    }

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
