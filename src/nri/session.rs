//! The plugin's life with the runtime: dial the NRI socket, register (`Runtime.RegisterPlugin`
//! with the name and index), answer `Configure` (subscribing to CreateContainer alone),
//! `Synchronize` (no updates), `CreateContainer` (the create path's decision, as an
//! adjustment) and `Shutdown`; any other method gets ttrpc's Unimplemented status, never
//! silence, which the runtime would wait out. When the socket is missing or the runtime
//! closes the connection (a containerd restart), dial again with a backoff capped at
//! [`MAX_BACKOFF`], logging once per change, and register anew.
//!
//! The decision reads the runtime's config.toml on every CreateContainer, as each of the
//! shim's creates does: an edit of the config applies to the next container without a restart.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use prost::Message as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::watch;

use super::adjust;
use super::mux::{self, Demux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use super::proto::api::{
    self, ContainerAdjustment, CreateContainerRequest, CreateContainerResponse,
};
use super::proto::ttrpc::{self as envelope, Request, Response, Status};
use super::ttrpc::{self, Reader, REQUEST, RESPONSE};
use crate::kubelet::host_root::HostRoot;

/// The longest wait between two dials.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// The stream id of our one call, RegisterPlugin (a ttrpc client's first).
const REGISTER_STREAM: u32 = 1;
/// What the plugin's answers name it by, so an operator reading the runtime's error sees
/// where a refusal came from.
pub const PREFIX: &str = "accel-nri-plugin";

#[derive(Debug, Clone)]
pub struct Options {
    /// The runtime's NRI socket.
    pub socket: PathBuf,
    pub name: String,
    /// Two digits: the plugin's place among the runtime's plugins.
    pub index: String,
    /// The runtime's config.toml.
    pub config: PathBuf,
    /// The host's `/` as this process sees it (`--host-root`, `/host` in the DaemonSet):
    /// profiles and the node's files are read under it, and the engine is answered with the
    /// host's own paths.
    pub host_root: HostRoot,
}

/// Why a session ended.
#[derive(Debug)]
enum End {
    Stopped,
    Closed(String),
}

/// Runs until `stop` turns true: dial, register, serve; again after every disconnect.
pub async fn run(opts: Options, mut stop: watch::Receiver<bool>) -> anyhow::Result<()> {
    let mut backoff = FIRST_BACKOFF;
    let mut last_error: Option<String> = None;
    let mut state = State::default();
    loop {
        if *stop.borrow() {
            return Ok(());
        }
        match UnixStream::connect(&opts.socket).await {
            Ok(stream) => {
                backoff = FIRST_BACKOFF;
                last_error = None;
                log::info!("nri: connected to {}", opts.socket.display());
                match session(stream, &opts, &mut state, &mut stop).await {
                    End::Stopped => return Ok(()),
                    End::Closed(why) => log::warn!("nri: {why}; dialing again"),
                }
            }
            Err(e) => {
                let msg = format!("cannot connect to {}: {e}", opts.socket.display());
                if last_error.as_deref() != Some(msg.as_str()) {
                    log::warn!(
                        "nri: {msg} (retrying every {}s at most)",
                        MAX_BACKOFF.as_secs()
                    );
                    last_error = Some(msg);
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return Ok(()),
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// What lasts across sessions: the config's warnings already logged.
#[derive(Debug, Default)]
struct State {
    warned: HashSet<String>,
}

/// What the runtime told us in Configure.
#[derive(Debug, Default)]
struct Runtime {
    name: String,
    version: String,
    /// How long the runtime waits for an answer (0: not said); an answer later than that is
    /// dropped and the container starts without it.
    request_timeout: Duration,
    registered: bool,
}

async fn session(
    stream: UnixStream,
    opts: &Options,
    state: &mut State,
    stop: &mut watch::Receiver<bool>,
) -> End {
    let (mut rd, mut wr) = stream.into_split();
    let register = api::RegisterPluginRequest {
        plugin_name: opts.name.clone(),
        plugin_idx: opts.index.clone(),
        nri_version: String::new(),
    };
    let call = Request {
        service: api::RUNTIME_SERVICE.into(),
        method: "RegisterPlugin".into(),
        payload: register.encode_to_vec(),
        ..Request::default()
    };
    if let Err(e) = send(
        &mut wr,
        RUNTIME_SERVICE_CONN,
        REGISTER_STREAM,
        REQUEST,
        &call.encode_to_vec(),
    )
    .await
    {
        return End::Closed(e);
    }
    let mut demux = Demux::default();
    let mut served = Reader::default();
    let mut calls = Reader::default();
    let mut runtime = Runtime::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            r = rd.read(&mut buf) => match r {
                Ok(0) => {
                    return End::Closed(match demux.finish() {
                        Ok(()) => "the runtime closed the connection".into(),
                        Err(e) => e.to_string(),
                    })
                }
                Ok(n) => n,
                Err(e) => return End::Closed(format!("reading from the runtime: {e}")),
            },
            _ = stop.changed() => return End::Stopped,
        };
        demux.push(&buf[..n]);
        loop {
            let frame = match demux.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => return End::Closed(e.to_string()),
            };
            match frame {
                (PLUGIN_SERVICE_CONN, bytes) => served.push(&bytes),
                (RUNTIME_SERVICE_CONN, bytes) => calls.push(&bytes),
                // NRI's own reader drops frames of connections nobody opened.
                (conn, _) => log::debug!("nri: dropped a frame for connection {conn}"),
            }
        }
        loop {
            let msg = match calls.next_message() {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => return End::Closed(e.to_string()),
            };
            if msg.kind != RESPONSE || msg.stream != REGISTER_STREAM {
                log::debug!(
                    "nri: ignored message type {} on stream {} of the runtime's connection",
                    msg.kind,
                    msg.stream
                );
                continue;
            }
            let status = Response::decode(&msg.payload[..]).map(|r| r.status);
            match status {
                Ok(None) => {}
                Ok(Some(s)) if s.code == envelope::OK => {}
                Ok(Some(s)) => {
                    return End::Closed(format!(
                        "the runtime refused to register {}-{}: {}",
                        opts.index,
                        opts.name,
                        crate::quote::quote(&s.message)
                    ))
                }
                Err(e) => return End::Closed(format!("undecodable RegisterPlugin answer: {e}")),
            }
        }
        loop {
            let msg = match served.next_message() {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => return End::Closed(e.to_string()),
            };
            if msg.kind != REQUEST {
                continue;
            }
            let answer = match Request::decode(&msg.payload[..]) {
                Ok(req) => serve(&req, opts, state, &mut runtime),
                Err(e) => failure(
                    envelope::INVALID_ARGUMENT,
                    format!("undecodable ttrpc request: {e}"),
                ),
            };
            if let Err(e) = send(
                &mut wr,
                PLUGIN_SERVICE_CONN,
                msg.stream,
                RESPONSE,
                &answer.encode_to_vec(),
            )
            .await
            {
                return End::Closed(e);
            }
        }
    }
}

/// One ttrpc message on a logical connection, as mux frames.
async fn send(
    wr: &mut OwnedWriteHalf,
    conn: u32,
    stream: u32,
    kind: u8,
    payload: &[u8],
) -> Result<(), String> {
    let message = ttrpc::encode(stream, kind, payload).map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(message.len() + mux::HEADER_LEN);
    mux::encode(conn, &message, &mut out);
    wr.write_all(&out)
        .await
        .map_err(|e| format!("writing to the runtime: {e}"))
}

fn success(payload: Vec<u8>) -> Response {
    Response {
        status: Some(Status {
            code: envelope::OK,
            message: String::new(),
        }),
        payload,
    }
}

fn failure(code: i32, message: String) -> Response {
    Response {
        status: Some(Status { code, message }),
        payload: Vec::new(),
    }
}

/// The answer to one call of the plugin's service.
fn serve(req: &Request, opts: &Options, state: &mut State, runtime: &mut Runtime) -> Response {
    if req.service != api::PLUGIN_SERVICE {
        return failure(
            envelope::UNIMPLEMENTED,
            format!(
                "{PREFIX}: unknown service {}",
                crate::quote::quote(&req.service)
            ),
        );
    }
    let payload = &req.payload[..];
    let bad = |e: prost::DecodeError| {
        failure(
            envelope::INVALID_ARGUMENT,
            format!("{PREFIX}: undecodable {}: {e}", req.method),
        )
    };
    match req.method.as_str() {
        "Configure" => {
            let c = match api::ConfigureRequest::decode(payload) {
                Ok(c) => c,
                Err(e) => return bad(e),
            };
            runtime.name = c.runtime_name;
            runtime.version = c.runtime_version;
            runtime.request_timeout =
                Duration::from_millis(u64::try_from(c.request_timeout).unwrap_or(0));
            log::debug!(
                "nri: configured by {} {} (request timeout {} ms)",
                runtime.name,
                runtime.version,
                c.request_timeout
            );
            success(
                api::ConfigureResponse {
                    events: api::event_mask(&[api::CREATE_CONTAINER_EVENT]),
                }
                .encode_to_vec(),
            )
        }
        "Synchronize" => {
            let s = match api::SynchronizeRequest::decode(payload) {
                Ok(s) => s,
                Err(e) => return bad(e),
            };
            if !s.more && !runtime.registered {
                runtime.registered = true;
                log::info!(
                    "nri: registered as {}-{} with {} {}",
                    opts.index,
                    opts.name,
                    runtime.name,
                    runtime.version
                );
            }
            success(
                api::SynchronizeResponse {
                    update: Vec::new(),
                    more: s.more,
                }
                .encode_to_vec(),
            )
        }
        "Shutdown" => {
            log::info!("nri: the runtime shuts the plugin down");
            success(api::Empty::default().encode_to_vec())
        }
        "CreateContainer" => match CreateContainerRequest::decode(payload) {
            Ok(c) => {
                let started = std::time::Instant::now();
                let answer = create(&c, opts, state);
                let took = started.elapsed();
                if !runtime.request_timeout.is_zero() && took > runtime.request_timeout {
                    log::warn!(
                        "nri: {}: answered in {} ms, past the runtime's request timeout of {} ms",
                        who(&c),
                        took.as_millis(),
                        runtime.request_timeout.as_millis()
                    );
                }
                match answer {
                    Ok(r) => success(r.encode_to_vec()),
                    Err(msg) => {
                        log::error!("nri: {}: {msg}", who(&c));
                        failure(envelope::UNKNOWN, format!("{PREFIX}: {msg}"))
                    }
                }
            }
            Err(e) => bad(e),
        },
        other => failure(
            envelope::UNIMPLEMENTED,
            format!(
                "{PREFIX}: method {} is not served",
                crate::quote::quote(other)
            ),
        ),
    }
}

/// `<pod namespace>/<pod name>/<container>`, quoted where the names need it.
fn who(c: &CreateContainerRequest) -> String {
    let pod = c.pod.clone().unwrap_or_default();
    let name = c.container.as_ref().map_or("", |c| c.name.as_str());
    format!(
        "{}/{}/{}",
        shown(&pod.namespace),
        shown(&pod.name),
        shown(name)
    )
}

/// Container input for a log line: as is when plain, else quoted and escaped.
fn shown(s: &str) -> String {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b"-._=,:/".contains(&b);
    if !s.is_empty() && s.len() <= 128 && s.bytes().all(plain) {
        s.to_string()
    } else {
        crate::quote::quote(s)
    }
}

/// The create path's decision for the container, as the runtime's answer. Errors are the
/// shim's one line.
fn create(
    req: &CreateContainerRequest,
    opts: &Options,
    state: &mut State,
) -> Result<CreateContainerResponse, String> {
    let container = req.container.clone().unwrap_or_default();
    let view = adjust::view(&container);
    let cfg = crate::config::Quick::read(&opts.config)
        .and_then(|q| q.into_create_config(None))
        .map_err(|e| e.to_string())?;
    let cfg = under_host(cfg, &opts.host_root);
    for w in &cfg.warnings {
        if state.warned.insert(w.clone()) {
            log::warn!("{w}");
        }
    }
    let decision = crate::create::decide(&cfg, &view, None).map_err(|e| e.to_string())?;
    let Some(out) = decision.outcome(&cfg, false).map_err(|e| e.to_string())? else {
        // A share's container asks by no variable: DRA's CDI devices brought its node, and
        // its kernel limit is all there is to add.
        let mut adjust = ContainerAdjustment::default();
        if let Some(shown) = dmem_max(req, &cfg, &mut adjust) {
            log::info!("nri: {}: {shown}", who(req));
            return Ok(CreateContainerResponse {
                adjust: Some(adjust),
                update: Vec::new(),
            });
        }
        log::debug!("nri: {}: no device requested", who(req));
        return Ok(CreateContainerResponse::default());
    };
    let out = to_host(out, &opts.host_root);
    let (mut adjust, added) = adjust::adjustment(&out, &container)?;
    let limit = dmem_max(req, &cfg, &mut adjust);
    // As the shim's create: the host's /dev/char links systemd's DeviceAllow= needs. Not
    // from a pod: a link made there would name the pod's path of the node, and the host's
    // /dev is read-only in it; the packages' udev rule and `accel-ctk system
    // create-dev-char-symlinks` make them on the host.
    if opts.host_root.path() == std::path::Path::new("/") {
        crate::devchar::ensure_logged(
            &cfg.host_dev_dir,
            out.plan
                .nodes
                .iter()
                .chain(out.cdi.nodes.iter().map(|n| &n.node)),
        );
    }
    log::info!(
        "nri: {}: {} nodes, {} mounts for {}{}",
        who(req),
        added.nodes,
        added.mounts,
        if out.requests.is_empty() {
            "CDI annotations".to_string()
        } else {
            out.requests
                .iter()
                .map(|r| shown(r))
                .collect::<Vec<_>>()
                .join(" ")
        },
        limit.map(|l| format!("; {l}")).unwrap_or_default()
    );
    if !added.dropped_gids.is_empty() {
        log::debug!(
            "nri: {}: groups {:?} not added (NRI cannot adjust a container's groups)",
            who(req),
            added.dropped_gids
        );
    }
    Ok(CreateContainerResponse {
        adjust: Some(adjust),
        update: Vec::new(),
    })
}

/// The create config as read from inside the pod: every profile's driver and dev root, the
/// host's /dev, cgroup root and the DRA driver's grants under the host's root.
fn under_host(mut cfg: crate::config::Config, root: &HostRoot) -> crate::config::Config {
    if root.path() == std::path::Path::new("/") {
        return cfg;
    }
    cfg.profiles = cfg.profiles.into_iter().map(|p| root.rebase(p)).collect();
    for dir in [
        &mut cfg.host_dev_dir,
        &mut cfg.cgroup_root,
        &mut cfg.dmem_grants_dir,
    ] {
        *dir = crate::profile::Profile::under(root.path(), dir);
    }
    cfg
}

/// The plan's host paths as the engine names them (the CDI edits' are the host's already:
/// the specs are written on the host). A path that is not UTF-8 is left for the
/// adjustment's own check to name.
fn to_host(mut out: crate::create::Outcome, root: &HostRoot) -> crate::create::Outcome {
    let host = |p: &mut PathBuf| {
        if let Some(s) = p.to_str() {
            *p = PathBuf::from(root.to_host(s));
        }
    };
    for n in &mut out.plan.nodes {
        host(&mut n.host_path);
    }
    for m in &mut out.plan.mounts {
        host(&mut m.source);
    }
    out
}

/// A share's kernel limit (src/dmem.rs) into `adjust`'s `unified` resources: the grants the
/// DRA driver recorded for the pod (its UID as the runtime gave it, not an annotation the
/// pod wrote) whose device the container holds, already or by this adjustment. Returns the
/// entries as the log shows them.
fn dmem_max(
    req: &CreateContainerRequest,
    cfg: &crate::config::Config,
    adjust: &mut ContainerAdjustment,
) -> Option<String> {
    let uid = req.pod.as_ref().map(|p| p.uid.as_str())?;
    let present = req
        .container
        .as_ref()
        .and_then(|c| c.linux.as_ref())
        .map_or(&[][..], |l| &l.devices[..]);
    let added = adjust.linux.as_ref().map_or(&[][..], |l| &l.devices[..]);
    let rdevs: Vec<String> = present
        .iter()
        .chain(added)
        .filter(|d| d.r#type == "c")
        .map(|d| format!("{}:{}", d.major, d.minor))
        .collect();
    if rdevs.is_empty() {
        return None;
    }
    let (entries, said) =
        crate::dmem::unified_on_node(&cfg.dmem_grants_dir, &cfg.cgroup_root, uid, &rdevs);
    for s in said {
        log::warn!("nri: {s}");
    }
    let entries = entries?;
    let shown = crate::dmem::shown(&entries);
    let linux = adjust.linux.get_or_insert_with(Default::default);
    let resources = linux.resources.get_or_insert_with(Default::default);
    resources.unified.extend(entries);
    Some(shown)
}
