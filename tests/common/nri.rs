//! A stand-in runtime for accel-nri-plugin (tests/nri.rs, benches/nri.rs): a unix socket
//! served as containerd serves NRI's, its multiplexed connections (frame: connection id,
//! length, both u32 big-endian; 1 the plugin's service, 2 the runtime's) and ttrpc messages
//! (header: length, stream id, type, flags) framed here by hand, byte by byte, not with the
//! plugin's code; and the real plugin binary started against it, its stderr in a file.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use accel_container_runtime::nri::proto::api::{
    self, ConfigureRequest, ConfigureResponse, Container, ContainerAdjustment,
    CreateContainerRequest, CreateContainerResponse, LinuxContainer, PodSandbox,
    RegisterPluginRequest, SynchronizeRequest, SynchronizeResponse,
};
use accel_container_runtime::nri::proto::ttrpc::{Request, Response, Status};
use prost::Message;

use super::binary;

/// NRI's connection ids: the plugin's service, the runtime's service.
pub const PLUGIN_CONN: u32 = 1;
pub const RUNTIME_CONN: u32 = 2;
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// The plugin under test, its stderr in a file.
pub struct Plugin {
    child: Child,
    log: PathBuf,
}

impl Plugin {
    pub fn start(socket: &Path, config: &Path, dir: &Path) -> Plugin {
        Plugin::start_with(socket, config, dir, &[])
    }

    /// [`Plugin::start`] with `extra` flags.
    pub fn start_with(socket: &Path, config: &Path, dir: &Path, extra: &[&str]) -> Plugin {
        let log = dir.join("plugin.log");
        let child = Command::new(binary(env!("CARGO_BIN_EXE_accel-nri-plugin")))
            .args(["--socket".as_ref(), socket.as_os_str()])
            .args(["--name", "accel", "--index", "10"])
            .args(extra)
            .env("ACCEL_CONTAINER_RUNTIME_CONFIG", config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Plugin { child, log }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log holds `n` lines containing `what`.
    pub fn wait_log(&self, what: &str, n: usize) {
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

    /// Waits for the plugin to exit on its own.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.wait_for("still running")
    }

    /// The exit status, within [`TIMEOUT`]; else a failure saying `what` with the log.
    fn wait_for(&mut self, what: &str) -> std::process::ExitStatus {
        let end = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < end, "{what}; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn terminate(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid; no memory is shared.
        let rc = unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
        self.wait_for("no exit after SIGTERM")
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
pub struct Conn {
    sock: UnixStream,
    pending: Vec<u8>,
    conns: [Vec<u8>; 3],
    next_stream: u32,
}

/// A ttrpc message: stream id, type, payload.
pub type Msg = (u32, u8, Vec<u8>);

impl Conn {
    pub fn accept(listener: &UnixListener) -> Conn {
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
    pub fn send(&mut self, conn: u32, stream: u32, kind: u8, payload: &[u8]) {
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
    pub fn recv(&mut self, conn: u32) -> Msg {
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

    pub fn read_frame(&mut self) {
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
    pub fn registration(&mut self) -> RegisterPluginRequest {
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
    pub fn call(&mut self, method: &str, payload: Vec<u8>) -> Response {
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
    pub fn handshake(&mut self) {
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

    pub fn create(&mut self, container: Container) -> Result<ContainerAdjustment, String> {
        self.create_in(container, "u1")
    }

    /// [`Conn::create`] in the pod of UID `uid`, as the runtime gives it.
    pub fn create_in(
        &mut self,
        container: Container,
        uid: &str,
    ) -> Result<ContainerAdjustment, String> {
        let r = self.call(
            "CreateContainer",
            CreateContainerRequest {
                pod: Some(PodSandbox {
                    name: "pod".into(),
                    namespace: "ns".into(),
                    uid: uid.into(),
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

pub fn code(r: &Response) -> i32 {
    r.status.as_ref().map_or(0, |s| s.code)
}

pub fn container(name: &str, env: &[&str]) -> Container {
    Container {
        id: format!("id-{name}"),
        name: name.into(),
        env: env.iter().map(|e| e.to_string()).collect(),
        linux: Some(LinuxContainer::default()),
        ..Container::default()
    }
}

pub fn device_paths(a: &ContainerAdjustment) -> BTreeSet<String> {
    a.linux
        .iter()
        .flat_map(|l| &l.devices)
        .map(|d| d.path.clone())
        .collect()
}
