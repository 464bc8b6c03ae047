//! accel-nri-plugin against a stand-in runtime: a unix socket served as containerd serves NRI's
//! (its multiplexed connections and ttrpc framed here by hand, byte by byte, not with the
//! plugin's code), which accepts the real built plugin's connection, answers RegisterPlugin,
//! calls Configure, Synchronize and CreateContainer, over a simulated NVIDIA host. The
//! adjustments are compared with what the shim itself writes into a bundle for the same
//! request: the same decision, from the same code.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use accel_container_runtime::nri::proto::api::{
    self, ConfigureRequest, ConfigureResponse, Container, ContainerAdjustment,
    CreateContainerRequest, CreateContainerResponse, LinuxContainer, LinuxDevice, PodSandbox,
    RegisterPluginRequest, SynchronizeRequest, SynchronizeResponse,
};
use accel_container_runtime::nri::proto::ttrpc::{Request, Response, Status};
use common::{binary, Bundle, Runc, SimRoot};
use prost::Message;
use serde_json::Value;

/// NRI's connection ids: the plugin's service, the runtime's service.
const PLUGIN_CONN: u32 = 1;
const RUNTIME_CONN: u32 = 2;
const TIMEOUT: Duration = Duration::from_secs(20);

/// The plugin under test, its stderr in a file.
struct Plugin {
    child: Child,
    log: PathBuf,
}

impl Plugin {
    fn start(socket: &Path, config: &Path, dir: &Path) -> Plugin {
        let log = dir.join("plugin.log");
        let child = Command::new(binary(env!("CARGO_BIN_EXE_accel-nri-plugin")))
            .args(["--socket".as_ref(), socket.as_os_str()])
            .args(["--name", "accel", "--index", "10"])
            .env("ACCEL_CONTAINER_RUNTIME_CONFIG", config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Plugin { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log holds `n` lines containing `what`.
    fn wait_log(&self, what: &str, n: usize) {
        let end = Instant::now() + TIMEOUT;
        while self.log().matches(what).count() < n {
            assert!(
                Instant::now() < end,
                "no {n} lines with {what:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn terminate(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid; no memory is shared.
        let rc = unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
        let end = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < end,
                "no exit after SIGTERM; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One accepted plugin connection, as the runtime's end of NRI's multiplexer: what it read
/// per logical connection, and the stream ids of its calls (1, 3, 5, ...).
struct Conn {
    sock: UnixStream,
    pending: Vec<u8>,
    conns: [Vec<u8>; 3],
    next_stream: u32,
}

/// A ttrpc message: stream id, type, payload.
type Msg = (u32, u8, Vec<u8>);

impl Conn {
    fn accept(listener: &UnixListener) -> Conn {
        listener.set_nonblocking(false).unwrap();
        let (sock, _) = listener.accept().unwrap();
        sock.set_read_timeout(Some(TIMEOUT)).unwrap();
        Conn {
            sock,
            pending: Vec::new(),
            conns: Default::default(),
            next_stream: 1,
        }
    }

    /// Writes a ttrpc message on logical connection `conn`, as two mux frames (split inside
    /// the ttrpc header) followed by an empty-connection frame for an id nobody opened.
    fn send(&mut self, conn: u32, stream: u32, kind: u8, payload: &[u8]) {
        let mut msg = Vec::new();
        msg.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        msg.extend_from_slice(&stream.to_be_bytes());
        msg.extend_from_slice(&[kind, 0]);
        msg.extend_from_slice(payload);
        let mut wire = Vec::new();
        for part in [&msg[..5], &msg[5..]] {
            wire.extend_from_slice(&conn.to_be_bytes());
            wire.extend_from_slice(&(part.len() as u32).to_be_bytes());
            wire.extend_from_slice(part);
        }
        // A frame for connection 9, which the plugin must drop.
        wire.extend_from_slice(&9u32.to_be_bytes());
        wire.extend_from_slice(&3u32.to_be_bytes());
        wire.extend_from_slice(b"???");
        self.sock.write_all(&wire).unwrap();
    }

    /// The next whole ttrpc message on logical connection `conn`.
    fn recv(&mut self, conn: u32) -> Msg {
        loop {
            let buf = &mut self.conns[conn as usize];
            if buf.len() >= 10 {
                let len = u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
                if buf.len() >= 10 + len {
                    let stream = u32::from_be_bytes(buf[4..8].try_into().unwrap());
                    let kind = buf[8];
                    let payload = buf[10..10 + len].to_vec();
                    buf.drain(..10 + len);
                    return (stream, kind, payload);
                }
            }
            self.read_frame();
        }
    }

    fn read_frame(&mut self) {
        loop {
            if self.pending.len() >= 8 {
                let id = u32::from_be_bytes(self.pending[..4].try_into().unwrap());
                let len = u32::from_be_bytes(self.pending[4..8].try_into().unwrap()) as usize;
                if self.pending.len() >= 8 + len {
                    let payload: Vec<u8> = self.pending.drain(..8 + len).skip(8).collect();
                    assert!(
                        id == PLUGIN_CONN || id == RUNTIME_CONN,
                        "the plugin wrote on connection {id}"
                    );
                    self.conns[id as usize].extend_from_slice(&payload);
                    return;
                }
            }
            let mut chunk = [0u8; 4096];
            let n = self
                .sock
                .read(&mut chunk)
                .expect("the plugin answers in time");
            assert!(n > 0, "the plugin closed the connection");
            self.pending.extend_from_slice(&chunk[..n]);
        }
    }

    /// The plugin's RegisterPlugin call, answered with success.
    fn registration(&mut self) -> RegisterPluginRequest {
        let (stream, kind, payload) = self.recv(RUNTIME_CONN);
        assert_eq!(
            (stream, kind),
            (1, 1),
            "the plugin's first call is a request on stream 1"
        );
        let req = Request::decode(&payload[..]).unwrap();
        assert_eq!(req.service, "nri.pkg.api.v1alpha1.Runtime");
        assert_eq!(req.method, "RegisterPlugin");
        let ok = Response {
            status: Some(Status::default()),
            payload: api::Empty::default().encode_to_vec(),
        };
        self.send(RUNTIME_CONN, 1, 2, &ok.encode_to_vec());
        RegisterPluginRequest::decode(&req.payload[..]).unwrap()
    }

    /// Calls `method` of the plugin's service; the response.
    fn call(&mut self, method: &str, payload: Vec<u8>) -> Response {
        let stream = self.next_stream;
        self.next_stream += 2;
        let req = Request {
            service: "nri.pkg.api.v1alpha1.Plugin".into(),
            method: method.into(),
            payload,
            timeout_nano: 2_000_000_000,
            metadata: Vec::new(),
        };
        self.send(PLUGIN_CONN, stream, 1, &req.encode_to_vec());
        let (got, kind, payload) = self.recv(PLUGIN_CONN);
        assert_eq!(
            (got, kind),
            (stream, 2),
            "{method}: a response on its stream"
        );
        Response::decode(&payload[..]).unwrap()
    }

    /// Register, Configure, Synchronize: the runtime's start of every plugin.
    fn handshake(&mut self) {
        let reg = self.registration();
        assert_eq!(
            (reg.plugin_name.as_str(), reg.plugin_idx.as_str()),
            ("accel", "10")
        );
        let r = self.call(
            "Configure",
            ConfigureRequest {
                runtime_name: "stand-in".into(),
                runtime_version: "2.1.9".into(),
                registration_timeout: 5000,
                request_timeout: 2000,
                ..ConfigureRequest::default()
            }
            .encode_to_vec(),
        );
        assert_eq!(code(&r), 0);
        let c = ConfigureResponse::decode(&r.payload[..]).unwrap();
        assert_eq!(
            c.events,
            1 << 3,
            "subscribed to CreateContainer (event 4) alone"
        );
        for more in [true, false] {
            let r = self.call(
                "Synchronize",
                SynchronizeRequest {
                    more,
                    ..SynchronizeRequest::default()
                }
                .encode_to_vec(),
            );
            assert_eq!(code(&r), 0);
            let s = SynchronizeResponse::decode(&r.payload[..]).unwrap();
            assert!(s.update.is_empty());
            assert_eq!(s.more, more);
        }
    }

    fn create(&mut self, container: Container) -> Result<ContainerAdjustment, String> {
        let r = self.call(
            "CreateContainer",
            CreateContainerRequest {
                pod: Some(PodSandbox {
                    name: "pod".into(),
                    namespace: "ns".into(),
                    uid: "u1".into(),
                    ..PodSandbox::default()
                }),
                container: Some(container),
            }
            .encode_to_vec(),
        );
        match r.status {
            Some(s) if s.code != 0 => Err(s.message),
            _ => Ok(CreateContainerResponse::decode(&r.payload[..])
                .unwrap()
                .adjust
                .unwrap_or_default()),
        }
    }
}

fn code(r: &Response) -> i32 {
    r.status.as_ref().map_or(0, |s| s.code)
}

fn container(name: &str, env: &[&str]) -> Container {
    Container {
        id: format!("id-{name}"),
        name: name.into(),
        env: env.iter().map(|e| e.to_string()).collect(),
        linux: Some(LinuxContainer::default()),
        ..Container::default()
    }
}

fn device_paths(a: &ContainerAdjustment) -> BTreeSet<String> {
    a.linux
        .iter()
        .flat_map(|l| &l.devices)
        .map(|d| d.path.clone())
        .collect()
}

/// Mounts as compared: destination, source, options.
type Mounts = BTreeSet<(String, String, Vec<String>)>;

/// What the shim writes for `env` into a busybox bundle: device paths, and the mounts it
/// added (destination, source, options).
fn shim_edits(runc: &Runc, env: &str) -> (BTreeSet<String>, Mounts) {
    let mut bundle = Bundle::busybox();
    let before: BTreeSet<String> = dests(&bundle.read_spec());
    bundle.env(env);
    let id = runc.id("nri-shim");
    let out = runc.create(&bundle, &id);
    assert_eq!(out.code, 0, "the shim's create: {}", out.stderr);
    let spec = bundle.read_spec();
    let devices = spec["linux"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap().to_string())
        .collect();
    let mounts = spec["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| !before.contains(m["destination"].as_str().unwrap()))
        .map(|m| {
            (
                m["destination"].as_str().unwrap().to_string(),
                m["source"].as_str().unwrap().to_string(),
                serde_json::from_value(m["options"].clone()).unwrap(),
            )
        })
        .collect();
    (devices, mounts)
}

fn dests(spec: &Value) -> BTreeSet<String> {
    spec["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["destination"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn stand_in_runtime_gets_the_shims_edits_through_nri() {
    let sim = SimRoot::standard();
    let runc = Runc::new(&sim);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let plugin = Plugin::start(&socket, &runc.config_path(), dir.path());
    let mut rt = Conn::accept(&listener);
    rt.handshake();
    plugin.wait_log("nri: registered as 10-accel with stand-in 2.1.9", 1);

    // NVIDIA_VISIBLE_DEVICES=1: the second GPU in bus order, the control nodes, the driver.
    let adj = rt
        .create(container("gpu", &["NVIDIA_VISIBLE_DEVICES=1"]))
        .unwrap();
    let gpu = format!("/dev/nvidia{}", sim.gpus()[1].minor);
    let want: BTreeSet<String> = [gpu.as_str(), "/dev/nvidiactl", "/dev/nvidia-uvm"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(device_paths(&adj), want);
    let linux = adj.linux.clone().unwrap();
    let node = linux.devices.iter().find(|d| d.path == gpu).unwrap();
    assert_eq!((node.r#type.as_str(), node.major), ("c", 195));
    assert_eq!(i64::from(sim.gpus()[1].minor), node.minor);
    let rules = linux.resources.unwrap().devices;
    assert_eq!(rules.len(), 3, "one allow rule per node: {rules:?}");
    assert!(rules.iter().all(|r| r.allow && r.access == "rwm"));
    // The same edits as the shim's create of a bundle asking the same.
    let (shim_devices, shim_mounts) = shim_edits(&runc, "NVIDIA_VISIBLE_DEVICES=1");
    assert_eq!(device_paths(&adj), shim_devices);
    let mounts: Mounts = adj
        .mounts
        .iter()
        .map(|m| (m.destination.clone(), m.source.clone(), m.options.clone()))
        .collect();
    assert!(!mounts.is_empty(), "the driver's files are mounted");
    assert_eq!(mounts, shim_mounts);
    assert!(adj
        .mounts
        .iter()
        .all(|m| m.options[0] == "ro" && m.r#type == "bind"));
    assert!(
        adj.mounts
            .iter()
            .any(|m| m.destination == "/usr/bin/nvidia-smi"),
        "{:?}",
        adj.mounts
    );
    plugin.wait_log(
        &format!(
            "nri: ns/pod/gpu: 3 nodes, {} mounts for NVIDIA_VISIBLE_DEVICES=1",
            mounts.len()
        ),
        1,
    );

    // No variable: nothing.
    let none = rt.create(container("plain", &["PATH=/bin"])).unwrap();
    assert_eq!(none, ContainerAdjustment::default());

    // /dev/nvidia<minor> already there, as CDI injects it (another path, same numbers):
    // no second copy, the rest still added.
    let mut cdi = container("cdi", &["NVIDIA_VISIBLE_DEVICES=1"]);
    cdi.linux = Some(LinuxContainer {
        devices: vec![LinuxDevice {
            path: "/dev/gpu-from-cdi".into(),
            r#type: "c".into(),
            major: 195,
            minor: i64::from(sim.gpus()[1].minor),
            ..LinuxDevice::default()
        }],
    });
    let adj = rt.create(cdi).unwrap();
    let got = device_paths(&adj);
    assert!(!got.contains(&gpu), "{got:?}");
    assert!(got.contains("/dev/nvidiactl"), "{got:?}");

    // A bad value fails the create, with the shim's message prefixed by the plugin's name.
    let err = rt
        .create(container("bad", &["NVIDIA_VISIBLE_DEVICES=7"]))
        .unwrap_err();
    assert!(err.starts_with("accel-nri-plugin: "), "{err}");
    assert!(err.contains("NVIDIA_VISIBLE_DEVICES"), "{err}");
    assert!(err.contains("\"7\""), "names the value: {err}");
    let mut bundle = Bundle::busybox();
    bundle.env("NVIDIA_VISIBLE_DEVICES=7");
    let id = runc.id("nri-bad");
    let shim = runc.create(&bundle, &id);
    assert_ne!(shim.code, 0);
    let message = err.strip_prefix("accel-nri-plugin: ").unwrap();
    assert!(
        shim.stderr.contains(message),
        "the shim says the same: {:?} vs {:?}",
        shim.stderr,
        message
    );

    // A method the plugin does not serve gets an error status, not silence.
    let r = rt.call("StopContainer", Vec::new());
    assert_eq!(code(&r), 12, "Unimplemented");

    assert_eq!(plugin.terminate().code(), Some(0), "SIGTERM: exit 0");
}

#[test]
fn plugin_registers_again_after_the_runtime_restarts() {
    let sim = SimRoot::standard();
    let runc = Runc::new(&sim);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    // No socket yet: the plugin waits for the runtime.
    let plugin = Plugin::start(&socket, &runc.config_path(), dir.path());
    plugin.wait_log("cannot connect to", 1);
    for round in 1..=2 {
        let listener = UnixListener::bind(&socket).unwrap();
        let mut rt = Conn::accept(&listener);
        rt.handshake();
        plugin.wait_log("nri: registered as 10-accel", round);
        let adj = rt
            .create(container("gpu", &["NVIDIA_VISIBLE_DEVICES=0"]))
            .unwrap();
        assert_eq!(
            device_paths(&adj).len(),
            3,
            "round {round}: {:?}",
            device_paths(&adj)
        );
        // The runtime goes away: connection and socket.
        drop(rt);
        drop(listener);
        std::fs::remove_file(&socket).unwrap();
        plugin.wait_log("dialing again", round);
    }
    // Logged once while the socket stayed missing, not at every try.
    std::thread::sleep(Duration::from_millis(1500));
    let log = plugin.log();
    assert!(
        log.matches("cannot connect to").count() <= 3,
        "one line per change:\n{log}"
    );
    assert_eq!(
        plugin.terminate().code(),
        Some(0),
        "SIGTERM while disconnected: exit 0"
    );
}
