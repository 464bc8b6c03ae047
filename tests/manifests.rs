//! Issue 22: every container of every manifest in `packaging/kubernetes/` started by real
//! runc the way kubelet and containerd's CRI would start it, from images made of what the
//! recipes in `packaging/` put in them. kubernetes-validate says a manifest is well formed;
//! only a start says whether runc accepts its mounts and whether the program finds what it
//! needs under its securityContext (the device plugin's `/proc/driver` mount, refused by runc,
//! and the checkpoint installer's `/usr/bin/accel-ctk`, absent from its image, both passed
//! validation).
//!
//! What kubelet + containerd give a container, and this file gives it too:
//! - `runc spec`'s mounts (/proc, a /dev tmpfs, /dev/pts, /dev/shm, /dev/mqueue, /sys, the
//!   cgroup tree); a pod mount at a path replaces the default there, one at /dev or /sys
//!   also the defaults below it (containerd's `WithMounts`);
//! - each volumeMount: hostPath as an rbind (`ro` when readOnly, `rslave` for
//!   HostToContainer), configMap as a read-only directory of the ConfigMap's data from the
//!   same manifest;
//! - kubelet's `/etc/hosts`, `/dev/termination-log` and the service-account token directory
//!   (unless `automountServiceAccountToken: false`), containerd's `/etc/hostname` and
//!   `/etc/resolv.conf` (read-only with a read-only root);
//! - all of them ordered as containerd orders them: by path depth, parents first;
//! - securityContext: readOnlyRootFilesystem, capabilities (containerd's default set, drop,
//!   add), allowPrivilegeEscalation (no_new_privs), privileged (every capability, /sys and
//!   the cgroup tree writable, no masked or read-only paths, every device allowed); hostPID.
//!
//! Host paths of hostPath volumes go to a scratch directory that stands for the node (never
//! this machine's /etc, /usr/local or /var/lib/kubelet), except where a test needs the real
//! thing: the device plugin's view of the host's `/` (read-only) and the stand-in kubelet's
//! device-plugin directory.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use accel_container_runtime::kubelet::proto::deviceplugin::{
    AllocateRequest, ContainerAllocateRequest,
};
use common::grpc;
use common::kubelet::{enflame_sysfs, Kubelet};
use common::{busybox_rootfs, require_root, sh_ok, unique, Bundle, SimRoot};
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

const PLUGIN: &str = "packaging/kubernetes/accel-device-plugin-daemonset.yaml";
const RUNTIME: &str = "packaging/kubernetes/accel-runtime-daemonset.yaml";
const CHECKPOINT: &str = "packaging/kubernetes/accel-checkpoint-daemonset.yaml";
const DRA: &str = "packaging/kubernetes/accel-dra-driver-daemonset.yaml";
const EXPORTER: &str = "packaging/kubernetes/accel-exporter-daemonset.yaml";

/// The node's name as kubelet gives it to `fieldRef: spec.nodeName` (and containerd's
/// `/etc/hostname` below).
const NODE_NAME: &str = "accel-node";

/// containerd's default when the image sets no PATH (`oci.WithDefaultPathEnv`); Debian's
/// images set the same.
const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// containerd's default capability set (`defaultUnixCaps()` in its `oci/spec.go`), what a
/// container with no capabilities section gets.
const DEFAULT_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// Every capability of Linux 5.9 and later, by number.
const ALL_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// What `privileged: true` gives: containerd's `WithAllCurrentCapabilities`, every
/// capability in this process's bounding set (a machine that runs these tests inside a
/// container may lack some, and runc refuses to grant one it does not have).
fn privileged_caps() -> Vec<&'static str> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .unwrap()
        .trim();
    let bits = u64::from_str_radix(hex, 16).unwrap();
    ALL_CAPS
        .iter()
        .enumerate()
        .filter(|(n, _)| bits & (1 << n) != 0)
        .map(|(_, c)| *c)
        .collect()
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn yaml_docs(rel: &str) -> Vec<Yaml> {
    serde_yaml_ng::Deserializer::from_str(&read(rel))
        .map(|d| {
            serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{rel}: bad YAML: {e}"))
        })
        .collect()
}

/// Shell text with `\`-continued lines joined (a Dockerfile's logical lines).
fn logical_lines(text: &str) -> Vec<String> {
    text.replace("\\\n", " ")
        .lines()
        .map(str::to_owned)
        .collect()
}

fn strings(v: &Yaml) -> Option<Vec<String>> {
    v.as_sequence().map(|s| {
        s.iter()
            .map(|x| x.as_str().expect("a list of strings").to_owned())
            .collect()
    })
}

fn yaml_str<'a>(v: &'a Yaml, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} is not a string in {v:?}"))
}

fn seq<'a>(v: &'a Yaml, key: &str) -> &'a [Yaml] {
    v[key].as_sequence().map_or(&[], Vec::as_slice)
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Images, from the recipes in packaging/
// ---------------------------------------------------------------------------------------------

/// A root filesystem and the image config's ENTRYPOINT and CMD.
struct Image {
    rootfs: PathBuf,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
}

/// The binary this test build made for a `[[bin]]` an image recipe copies out of its build
/// stage: the same code; `.ci/run` runs this file again against the shipped static build.
fn built_binary(name: &str) -> &'static str {
    match name {
        "accel-container-runtime" => env!("CARGO_BIN_EXE_accel-container-runtime"),
        "accel-ctk" => env!("CARGO_BIN_EXE_accel-ctk"),
        "accel-device-plugin" => env!("CARGO_BIN_EXE_accel-device-plugin"),
        #[cfg(feature = "dra")]
        "accel-dra-driver" => env!("CARGO_BIN_EXE_accel-dra-driver"),
        #[cfg(feature = "exporter")]
        "accel-exporter" => env!("CARGO_BIN_EXE_accel-exporter"),
        other => panic!("an image copies {other}, which this test cannot build"),
    }
}

/// The libraries `ldd` lists for `bin`, at their own paths under `rootfs`, so a dynamic test
/// build runs in an image made for the static one (a static one lists none).
fn copy_libraries(bin: &Path, rootfs: &Path) {
    let out = Command::new("ldd").arg(bin).output().unwrap();
    if !out.status.success() {
        return; // "not a dynamic executable"
    }
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file.
        let path = match line.split_once("=>") {
            Some((_, rhs)) => rhs.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        let Some(path) = path.filter(|p| p.starts_with('/')) else {
            continue;
        };
        let to = rootfs.join(&path[1..]);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(path, &to).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
}

/// The final stage of the Dockerfile `rel`, built into `rootfs`: its base, its COPY lines
/// (a build stage's binary is this test build's), its RUN lines run in the result.
fn dockerfile_image(rel: &str, rootfs: &Path) -> Image {
    let lines = logical_lines(&read(rel));
    let from = lines
        .iter()
        .rposition(|l| l.starts_with("FROM "))
        .unwrap_or_else(|| panic!("{rel}: no FROM"));
    match lines[from]["FROM ".len()..].trim() {
        "scratch" => std::fs::create_dir_all(rootfs).unwrap(),
        // busybox-static stands in for debian:bookworm-slim (no registry here): the
        // installer's entrypoint needs a POSIX shell and the coreutils, both of which it
        // has, and the binaries must need nothing from the base (they are static).
        base if base.starts_with("debian:") => {
            busybox_rootfs(rootfs);
        }
        base => panic!("{rel}: no stand-in for the base image {base}"),
    }
    let mut image = Image {
        rootfs: rootfs.to_path_buf(),
        entrypoint: Vec::new(),
        cmd: Vec::new(),
    };
    for line in &lines[from + 1..] {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("COPY ") {
            let mut words: Vec<&str> = rest.split_whitespace().collect();
            let stage = words[0].strip_prefix("--from=");
            if stage.is_some() {
                words.remove(0);
            }
            let dest = words.pop().unwrap();
            for src in words {
                let name = Path::new(src).file_name().unwrap();
                let to = if dest.ends_with('/') {
                    rootfs.join(&dest[1..]).join(name)
                } else {
                    rootfs.join(&dest[1..])
                };
                std::fs::create_dir_all(to.parent().unwrap()).unwrap();
                if stage.is_some() {
                    let bin = built_binary(name.to_str().unwrap());
                    std::fs::copy(bin, &to).unwrap();
                    copy_libraries(Path::new(bin), rootfs);
                } else if repo().join(src).is_dir() {
                    // Docker copies a directory's contents, not the directory.
                    let to = rootfs.join(&dest[1..]);
                    std::fs::create_dir_all(&to).unwrap();
                    sh_ok(
                        Command::new("cp")
                            .arg("-a")
                            .arg(repo().join(src).join("."))
                            .arg(&to),
                    );
                } else {
                    std::fs::copy(repo().join(src), &to).unwrap();
                }
            }
        } else if let Some(script) = line.strip_prefix("RUN ") {
            sh_ok(
                Command::new("chroot")
                    .arg(rootfs)
                    .args(["/bin/sh", "-c", script]),
            );
        } else if let Some(json) = line.strip_prefix("ENTRYPOINT ") {
            image.entrypoint = serde_json::from_str(json).unwrap();
        } else if let Some(json) = line.strip_prefix("CMD ") {
            image.cmd = serde_json::from_str(json).unwrap();
        }
    }
    image
}

/// The pause image: one static program that waits for a signal.
fn pause_image(rootfs: &Path) -> Image {
    std::fs::create_dir_all(rootfs).unwrap();
    let src = rootfs.with_extension("c");
    std::fs::write(
        &src,
        "#include <unistd.h>\nint main(void) { for (;;) pause(); }\n",
    )
    .unwrap();
    sh_ok(
        Command::new("gcc")
            .args(["-static", "-O2", "-o"])
            .arg(rootfs.join("pause"))
            .arg(&src),
    );
    Image {
        rootfs: rootfs.to_path_buf(),
        entrypoint: vec!["/pause".into()],
        cmd: Vec::new(),
    }
}

/// The image a manifest names, from the recipe that makes it.
fn image(name: &str, rootfs: &Path) -> Image {
    if name.contains("/accel-device-plugin:") {
        dockerfile_image("packaging/Dockerfile.device-plugin", rootfs)
    } else if name.contains("/accel-dra-driver:") {
        dockerfile_image("packaging/Dockerfile.dra-driver", rootfs)
    } else if name.contains("/accel-exporter:") {
        dockerfile_image("packaging/Dockerfile.exporter", rootfs)
    } else if name.contains("/accel-container-runtime:") {
        dockerfile_image("packaging/Dockerfile", rootfs)
    } else if name.starts_with("registry.k8s.io/pause:") {
        pause_image(rootfs)
    } else {
        panic!("no recipe for the image {name}: add one to this test")
    }
}

// ---------------------------------------------------------------------------------------------
// The node and the pod
// ---------------------------------------------------------------------------------------------

/// The node as hostPath volumes see it: a scratch directory, with a few host paths sent
/// elsewhere on purpose.
struct Node {
    dir: tempfile::TempDir,
    real: Vec<(String, PathBuf)>,
}

impl Node {
    fn new() -> Node {
        Node {
            dir: tempfile::Builder::new()
                .prefix("accel-manifests-node.")
                .tempdir()
                .unwrap(),
            real: Vec::new(),
        }
    }

    /// The node's `path` is `to` on this machine.
    fn map(&mut self, path: &str, to: &Path) {
        self.real.push((path.to_owned(), to.to_path_buf()));
    }

    /// This machine's path for the node's `path`.
    fn path(&self, path: &str) -> PathBuf {
        match self.real.iter().find(|(p, _)| p == path) {
            Some((_, to)) => to.clone(),
            None => self.dir.path().join(path.trim_start_matches('/')),
        }
    }
}

/// The pod of `rel`'s one Pod template, its containers started; deleted on drop.
struct Pod {
    work: tempfile::TempDir,
    state: PathBuf,
    running: BTreeMap<String, String>,
}

impl Drop for Pod {
    fn drop(&mut self) {
        for id in self.running.values() {
            let _ = Command::new("runc")
                .arg("--root")
                .arg(&self.state)
                .args(["delete", "-f", id])
                .output();
        }
    }
}

/// The one Pod template of a manifest.
fn pod_template(docs: &[Yaml]) -> &Yaml {
    let templates: Vec<&Yaml> = docs
        .iter()
        .filter(|d| !d["spec"]["template"]["spec"].is_null())
        .map(|d| &d["spec"]["template"]["spec"])
        .collect();
    assert_eq!(templates.len(), 1, "one workload per manifest");
    templates[0]
}

impl Pod {
    /// Starts `rel`'s pod on `node`: every init container to completion, in order, then every
    /// container, detached. `env` replaces a container's variable: (container, name, value).
    fn start(rel: &str, node: &Node, env: &[(&str, &str, &str)]) -> Pod {
        require_root();
        let docs = yaml_docs(rel);
        let spec = pod_template(&docs);
        let work = tempfile::Builder::new()
            .prefix("accel-manifests-pod.")
            .tempdir()
            .unwrap();
        let state = work.path().join("runc");
        let mut pod = Pod {
            state,
            running: BTreeMap::new(),
            work,
        };
        let volumes = pod.volumes(&docs, spec, node);
        for c in seq(spec, "initContainers") {
            let name = yaml_str(c, "name");
            let bundle = pod.bundle(spec, c, &volumes, env);
            let id = unique(&format!("manifest-{name}"));
            let out = Command::new("runc")
                .arg("--root")
                .arg(&pod.state)
                .args(["run", "--bundle"])
                .arg(bundle.path())
                .arg(&id)
                .stdin(Stdio::null())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{rel}: init container {name} failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for c in seq(spec, "containers") {
            let name = yaml_str(c, "name").to_owned();
            let bundle = pod.bundle(spec, c, &volumes, env);
            let id = unique(&format!("manifest-{name}"));
            let log = |ext: &str| {
                std::fs::File::create(pod.work.path().join(format!("{name}.{ext}"))).unwrap()
            };
            // Detached, its stdio in files: a pipe would be held open by the container.
            let status = Command::new("runc")
                .arg("--root")
                .arg(&pod.state)
                .args(["run", "-d", "--bundle"])
                .arg(bundle.path())
                .arg(&id)
                .stdin(Stdio::null())
                .stdout(log("stdout"))
                .stderr(log("stderr"))
                .status()
                .unwrap();
            pod.running.insert(name.clone(), id);
            assert!(
                status.success(),
                "{rel}: container {name} did not start ({status}):\n{}",
                pod.log(&name)
            );
        }
        pod
    }

    /// What the container `name` (not an init container) wrote, and what runc said.
    fn log(&self, name: &str) -> String {
        ["stdout", "stderr"]
            .iter()
            .map(|ext| {
                std::fs::read_to_string(self.work.path().join(format!("{name}.{ext}")))
                    .unwrap_or_default()
            })
            .collect()
    }

    /// `runc state`'s status of the container `name`.
    fn status(&self, name: &str) -> String {
        let out = Command::new("runc")
            .arg("--root")
            .arg(&self.state)
            .args(["state", &self.running[name]])
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        v["status"].as_str().unwrap_or("gone").to_owned()
    }

    /// Panics unless the container `name` is still running after a second: a program that
    /// starts and then fails on what it finds is caught too.
    fn assert_stays_running(&self, name: &str) {
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(self.status(name), "running", "{name}:\n{}", self.log(name));
    }

    /// The source of each volume, by name: hostPath on the node, configMap as a directory
    /// holding its data.
    fn volumes(&self, docs: &[Yaml], spec: &Yaml, node: &Node) -> BTreeMap<String, PathBuf> {
        let mut out = BTreeMap::new();
        for v in seq(spec, "volumes") {
            let name = yaml_str(v, "name").to_owned();
            let source = if !v["hostPath"].is_null() {
                let path = node.path(yaml_str(&v["hostPath"], "path"));
                match v["hostPath"]["type"].as_str().unwrap_or("") {
                    "File" | "FileOrCreate" | "Socket" | "CharDevice" | "BlockDevice" => {}
                    // The node has the directory (Directory) or kubelet makes it (the rest).
                    _ => std::fs::create_dir_all(&path).unwrap(),
                }
                path
            } else if !v["configMap"].is_null() {
                let cm_name = yaml_str(&v["configMap"], "name");
                let cm = docs
                    .iter()
                    .find(|d| {
                        d["kind"].as_str() == Some("ConfigMap")
                            && d["metadata"]["name"].as_str() == Some(cm_name)
                    })
                    .unwrap_or_else(|| panic!("ConfigMap {cm_name} is not in the manifest"));
                let dir = self.work.path().join("configmaps").join(&name);
                std::fs::create_dir_all(&dir).unwrap();
                for (k, text) in cm["data"].as_mapping().unwrap() {
                    std::fs::write(dir.join(k.as_str().unwrap()), text.as_str().unwrap()).unwrap();
                }
                dir
            } else {
                panic!("volume {name}: only hostPath and configMap are known here: {v:?}")
            };
            out.insert(name, source);
        }
        out
    }

    /// The bundle of container `c`: its image's root and the config.json kubelet and
    /// containerd's CRI would give runc.
    fn bundle(
        &self,
        spec: &Yaml,
        c: &Yaml,
        volumes: &BTreeMap<String, PathBuf>,
        env_over: &[(&str, &str, &str)],
    ) -> Bundle {
        let name = yaml_str(c, "name");
        let img = image(
            yaml_str(c, "image"),
            &self.work.path().join(format!("{name}-rootfs")),
        );
        let sc = &c["securityContext"];
        let privileged = sc["privileged"].as_bool() == Some(true);
        let ro_root = sc["readOnlyRootFilesystem"].as_bool() == Some(true);

        // Kubernetes: command replaces ENTRYPOINT (and drops CMD), args replaces CMD.
        let argv: Vec<String> = match (strings(&c["command"]), strings(&c["args"])) {
            (Some(cmd), Some(args)) => [cmd, args].concat(),
            (Some(cmd), None) => cmd,
            (None, Some(args)) => [img.entrypoint.clone(), args].concat(),
            (None, None) => [img.entrypoint.clone(), img.cmd.clone()].concat(),
        };
        // kubelet gives every container the API server's address (the `kubernetes`
        // service); nothing answers there in these tests.
        let mut env = vec![
            PATH_ENV.to_owned(),
            "KUBERNETES_SERVICE_HOST=127.0.0.1".to_owned(),
            "KUBERNETES_SERVICE_PORT=1".to_owned(),
        ];
        for e in seq(c, "env") {
            let var = yaml_str(e, "name");
            let given = || match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("spec.nodeName") => NODE_NAME.to_owned(),
                Some(other) => panic!("{name}: no stand-in for the field {other}"),
                None => yaml_str(e, "value").to_owned(),
            };
            let value = env_over
                .iter()
                .find(|(cn, n, _)| *cn == name && *n == var)
                .map_or_else(given, |o| o.2.to_owned());
            env.push(format!("{var}={value}"));
        }
        for (cn, var, _) in env_over {
            assert!(
                *cn != name || env.iter().any(|e| e.starts_with(&format!("{var}="))),
                "{name} has no variable {var} to replace"
            );
        }

        let caps: Vec<&str> = if privileged {
            privileged_caps()
        } else {
            let drop = strings(&sc["capabilities"]["drop"]).unwrap_or_default();
            let add = strings(&sc["capabilities"]["add"]).unwrap_or_default();
            let full = |c: &str| format!("CAP_{}", c.trim_start_matches("CAP_"));
            let mut caps: Vec<&str> = if drop.iter().any(|d| d == "ALL") {
                Vec::new()
            } else {
                DEFAULT_CAPS
                    .iter()
                    .copied()
                    .filter(|d| !drop.iter().any(|x| full(x) == *d))
                    .collect()
            };
            for a in &add {
                let a = full(a);
                let known = ALL_CAPS
                    .iter()
                    .find(|c| **c == a)
                    .expect("a known capability");
                caps.push(known);
            }
            caps
        };
        let no_new_privs = sc["allowPrivilegeEscalation"].as_bool() == Some(false);

        // The mounts kubelet asks for (volumes, /etc/hosts, /dev/termination-log, the token)
        // and containerd adds (/etc/hostname, /etc/resolv.conf).
        let files = self.work.path().join(format!("{name}-kubelet"));
        std::fs::create_dir_all(&files).unwrap();
        let file = |n: &str, text: &str| {
            let p = files.join(n);
            std::fs::write(&p, text).unwrap();
            p
        };
        let bind = |dest: &str, source: &Path, ro: bool, propagation: &str| {
            let mut options = vec!["rbind", propagation];
            if ro {
                options.push("ro");
            }
            json!({"destination": dest, "type": "bind", "source": source, "options": options})
        };
        let mut pod_mounts = Vec::new();
        for m in seq(c, "volumeMounts") {
            let vol = yaml_str(m, "name");
            let source = &volumes[vol];
            let configmap = source.starts_with(self.work.path().join("configmaps"));
            let propagation = match m["mountPropagation"].as_str() {
                Some("HostToContainer") => "rslave",
                Some("Bidirectional") => "rshared",
                _ => "rprivate",
            };
            pod_mounts.push(bind(
                yaml_str(m, "mountPath"),
                source,
                configmap || m["readOnly"].as_bool() == Some(true),
                propagation,
            ));
        }
        let hosts = file("hosts", "127.0.0.1\tlocalhost\n");
        pod_mounts.push(bind("/etc/hosts", &hosts, false, "rprivate"));
        let termination = file("termination-log", "");
        pod_mounts.push(bind(
            "/dev/termination-log",
            &termination,
            false,
            "rprivate",
        ));
        if spec["automountServiceAccountToken"].as_bool() != Some(false) {
            let token = files.join("serviceaccount");
            std::fs::create_dir_all(&token).unwrap();
            for f in ["token", "namespace"] {
                std::fs::write(token.join(f), "stand-in\n").unwrap();
            }
            // A real certificate, as kubelet mounts the cluster's CA: an API client loads it.
            sh_ok(
                Command::new("openssl")
                    .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
                    .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
                    .args(["-subj", "/CN=stand-in cluster CA", "-keyout"])
                    .arg(files.join("ca.key"))
                    .arg("-out")
                    .arg(token.join("ca.crt")),
            );
            pod_mounts.push(bind(
                "/var/run/secrets/kubernetes.io/serviceaccount",
                &token,
                true,
                "rprivate",
            ));
        }
        let hostname = file("hostname", &format!("{NODE_NAME}\n"));
        pod_mounts.push(bind("/etc/hostname", &hostname, ro_root, "rprivate"));
        let resolv = file("resolv.conf", "nameserver 127.0.0.53\n");
        pod_mounts.push(bind("/etc/resolv.conf", &resolv, ro_root, "rprivate"));
        let depth = |m: &Value| {
            Path::new(m["destination"].as_str().unwrap())
                .components()
                .count()
        };
        pod_mounts.sort_by_key(depth);

        let host_pid = spec["hostPID"].as_bool() == Some(true);
        let mut bundle = Bundle::on_rootfs(&img.rootfs);
        bundle.edit(|s| {
            s["root"]["readonly"] = Value::Bool(ro_root);
            let p = &mut s["process"];
            p["args"] = json!(argv);
            p["env"] = json!(env);
            p["cwd"] = json!("/");
            p["noNewPrivileges"] = Value::Bool(no_new_privs);
            p["capabilities"] = json!({"bounding": caps, "effective": caps, "permitted": caps});
            let taken: Vec<String> = pod_mounts
                .iter()
                .map(|m| m["destination"].as_str().unwrap().to_owned())
                .collect();
            let mut mounts: Vec<Value> = s["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| {
                    let d = m["destination"].as_str().unwrap();
                    !taken.iter().any(|t| {
                        t == d || ((t == "/dev" || t == "/sys") && d.starts_with(&format!("{t}/")))
                    })
                })
                .cloned()
                .collect();
            if privileged {
                for m in &mut mounts {
                    if m["type"] == "sysfs" || m["type"] == "cgroup" {
                        let opts = m["options"].as_array_mut().unwrap();
                        opts.retain(|o| o != "ro");
                        opts.push(json!("rw"));
                    }
                }
            }
            mounts.extend(pod_mounts);
            s["mounts"] = Value::Array(mounts);
            let linux = &mut s["linux"];
            if host_pid {
                linux["namespaces"]
                    .as_array_mut()
                    .unwrap()
                    .retain(|n| n["type"] != "pid");
            }
            if privileged {
                let l = linux.as_object_mut().unwrap();
                l.remove("maskedPaths");
                l.remove("readonlyPaths");
                linux["resources"]["devices"] = json!([{"allow": true, "access": "rwm"}]);
            }
        });
        bundle
    }
}

// ---------------------------------------------------------------------------------------------
// The manifests
// ---------------------------------------------------------------------------------------------

/// A new manifest needs a test below that starts it.
#[test]
fn every_manifest_is_started_by_a_test_here() {
    let mut files: Vec<String> = std::fs::read_dir(repo().join("packaging/kubernetes"))
        .unwrap()
        .map(|e| {
            format!(
                "packaging/kubernetes/{}",
                e.unwrap().file_name().to_str().unwrap()
            )
        })
        .collect();
    files.sort();
    // The DRA driver's pod is started by `dra_driver_daemonset_starts_and_registers`, built
    // with `--features dra`, the exporter's by `exporter_daemonset_starts_and_serves`, built
    // with `--features exporter` (.ci/run runs this file with both).
    let mut tested = vec![PLUGIN, RUNTIME, CHECKPOINT, DRA, EXPORTER];
    tested.sort();
    assert_eq!(files, tested);
}

/// Issue 22, item 1: the device plugin starts under its own securityContext (no privilege,
/// no capability, read-only root) with the mounts its DaemonSet asks for, finds the
/// simulated GCUs through its view of the host's `/`, and registers with the (stand-in)
/// kubelet through the mounted device-plugin directory.
#[test]
fn device_plugin_daemonset_starts_and_registers() {
    require_root();
    let sim = SimRoot::builder().enflame(8).build();
    enflame_sysfs(sim.path(), sim.enflame_major().unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let _rt = rt.enter();
    let kubelet = Kubelet::started();

    let mut node = Node::new();
    // The plugin's view of the node: the real `/`, where the simulated driver root is a
    // temp dir, read-only in the container.
    node.map("/", Path::new("/"));
    node.map("/var/lib/kubelet/device-plugins", kubelet.dir());
    let etc = node.path("/etc/accel-container-runtime");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::write(
        etc.join("config.toml"),
        format!(
            "accept-envvar-unprivileged = false\naccept-container-devices-as-mounts = true\n\
             [profiles.nvidia]\ndriver-root = \"{0}\"\n[profiles.enflame]\ndriver-root = \"{0}\"\n",
            sim.path().display()
        ),
    )
    .unwrap();

    let pod = Pod::start(PLUGIN, &node, &[]);
    let t = Instant::now();
    while !kubelet
        .registrations
        .lock()
        .unwrap()
        .iter()
        .any(|r| r.resource_name == "enflame.com/gcu")
    {
        let status = pod.status("accel-device-plugin");
        assert!(
            status == "running" && t.elapsed() < Duration::from_secs(20),
            "no enflame.com/gcu registration; the plugin ({status}):\n{}",
            pod.log("accel-device-plugin")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let regs = kubelet.registrations.lock().unwrap().clone();
    for r in &regs {
        assert!(
            kubelet.dir().join(&r.endpoint).exists(),
            "{} registered {}, which is not in kubelet's directory",
            r.resource_name,
            r.endpoint
        );
    }
    // Found through /host, answered with the host's own paths: kubelet passes them to the
    // container runtime on the host, where /host means nothing.
    let gcu = regs
        .iter()
        .find(|r| r.resource_name == "enflame.com/gcu")
        .unwrap();
    let answer = rt.block_on(async {
        let ch = grpc::connect(&kubelet.dir().join(&gcu.endpoint), "localhost")
            .await
            .unwrap();
        grpc::allocate(
            &ch,
            AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: vec!["GCU-0".into()],
                }],
            },
        )
        .await
        .unwrap()
    });
    let hosts: Vec<&str> = answer.container_responses[0]
        .devices
        .iter()
        .map(|d| d.host_path.as_str())
        .collect();
    let gcu0 = sim.path().join("dev/gcu0");
    assert!(
        hosts.contains(&gcu0.to_str().unwrap()),
        "no {} among {hosts:?}",
        gcu0.display()
    );
    pod.assert_stays_running("accel-device-plugin");
}

/// Issue 22, item 3's installer: the init container copies the runtime and accel-ctk onto
/// the node, writes the device-plugin-only config and registers the runtime in containerd's
/// config; the main container idles. RESTART_CONTAINERD is false here: the restart is an
/// nsenter into PID 1's namespaces (hostPID), which would restart this machine's containerd.
#[test]
fn runtime_daemonset_installs_on_the_node_and_idles() {
    let node = Node::new();
    let pod = Pod::start(
        RUNTIME,
        &node,
        &[("install", "RESTART_CONTAINERD", "false")],
    );
    let dir = node.path("/usr/local/accel-container-runtime");
    for b in ["accel-container-runtime", "accel-ctk"] {
        let bin = dir.join(b);
        let meta = std::fs::metadata(&bin).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        assert_eq!(meta.permissions().mode() & 0o777, 0o755, "{b}");
    }
    sh_ok(Command::new(dir.join("accel-ctk")).arg("--version"));
    let containerd = std::fs::read_to_string(node.path("/etc/containerd/config.toml")).unwrap();
    assert!(
        containerd.contains("\"/usr/local/accel-container-runtime/accel-container-runtime\""),
        "the runtime is not registered:\n{containerd}"
    );
    let config =
        std::fs::read_to_string(node.path("/etc/accel-container-runtime/config.toml")).unwrap();
    assert!(config
        .lines()
        .any(|l| l == "accept-envvar-unprivileged = false"));
    assert!(config
        .lines()
        .any(|l| l == "accept-container-devices-as-mounts = true"));
    pod.assert_stays_running("done");
}

/// Issue 22, item 2: the init container installs accel-ctk, the unit and its drop-in into
/// the node and enables the unit from a chroot; the pause container idles. The node's
/// `systemctl` is a recording script (it stands for the node's, not for anything of ours).
#[test]
fn checkpoint_daemonset_installs_the_unit_and_idles() {
    require_root();
    let node = Node::new();
    let root = node.path("/");
    busybox_rootfs(&root);
    let systemctl = root.join("usr/bin/systemctl");
    std::fs::create_dir_all(systemctl.parent().unwrap()).unwrap();
    std::fs::write(&systemctl, "#!/bin/sh\necho \"$*\" >> /systemctl.calls\n").unwrap();
    chmod(&systemctl, 0o755);

    let pod = Pod::start(CHECKPOINT, &node, &[]);
    let ctk = node.path("/usr/local/bin/accel-ctk");
    assert_eq!(
        std::fs::metadata(&ctk).unwrap().permissions().mode() & 0o777,
        0o755
    );
    sh_ok(Command::new(&ctk).arg("--version"));
    let unit =
        std::fs::read_to_string(node.path("/etc/systemd/system/accel-ctk-checkpoint.service"))
            .unwrap();
    assert_eq!(unit, read("packaging/systemd/accel-ctk-checkpoint.service"));
    let dropin = std::fs::read_to_string(
        node.path("/etc/systemd/system/accel-ctk-checkpoint.service.d/10-daemonset.conf"),
    )
    .unwrap();
    assert!(dropin.contains("ExecStart=/usr/local/bin/accel-ctk checkpoint check --fix"));
    assert_eq!(
        std::fs::read_to_string(root.join("systemctl.calls")).unwrap(),
        "--no-reload enable accel-ctk-checkpoint.service\n"
    );
    pod.assert_stays_running("idle");
}

/// Issue 27: the DRA driver starts under its own securityContext with its DaemonSet's mounts,
/// finds the simulated GCUs through its view of the host's `/`, and registers through the
/// mounted plugin registry: GetInfo names the DRA socket at the path kubelet dials on the
/// host, and that socket answers. No API server answers here (tests/dra.rs has a stand-in):
/// a prepare fails with the API server named, and the pod keeps running.
#[cfg(feature = "dra")]
#[test]
fn dra_driver_daemonset_starts_and_registers() {
    use accel_container_runtime::kubelet::proto::dra::*;
    use common::grpc::{self as dra, PREPARE_V1, UNPREPARE_V1};
    require_root();
    let sim = SimRoot::builder().enflame(8).build();
    enflame_sysfs(sim.path(), sim.enflame_major().unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut node = Node::new();
    node.map("/", Path::new("/"));
    let etc = node.path("/etc/accel-container-runtime");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::write(
        etc.join("config.toml"),
        format!(
            "[profiles.nvidia]\ndriver-root = \"{0}\"\n[profiles.enflame]\ndriver-root = \"{0}\"\n",
            sim.path().display()
        ),
    )
    .unwrap();
    let pod = Pod::start(DRA, &node, &[]);
    let reg = node
        .path("/var/lib/kubelet/plugins_registry")
        .join("gcu.enflame.com-reg.sock");
    let t = Instant::now();
    while !reg.exists() {
        let status = pod.status("accel-dra-driver");
        assert!(
            status == "running" && t.elapsed() < Duration::from_secs(20),
            "no {}; the driver ({status}):\n{}",
            reg.display(),
            pod.log("accel-dra-driver")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    rt.block_on(async {
        let ch = grpc::connect(&reg, "localhost").await.unwrap();
        let info = dra::get_info(&ch).await.unwrap();
        assert_eq!(info.r#type, "DRAPlugin");
        assert_eq!(info.name, "gcu.enflame.com");
        assert_eq!(
            info.endpoint,
            "/var/lib/kubelet/plugins/gcu.enflame.com/dra.sock"
        );
        let sock = node.path(&info.endpoint);
        let ch = grpc::connect(&sock, "localhost").await.unwrap();
        let uid = "0b4c7f3e-9d2a-4c61-8f1e-2a7b9c0d1e2a";
        let c = Claim {
            namespace: "default".into(),
            name: "c".into(),
            uid: uid.into(),
        };
        let u = dra::unprepare(
            &ch,
            UNPREPARE_V1,
            NodeUnprepareResourcesRequest {
                claims: vec![c.clone()],
            },
        )
        .await
        .unwrap();
        assert_eq!(u.claims[uid].error, "");
        let p = dra::prepare(
            &ch,
            PREPARE_V1,
            NodePrepareResourcesRequest { claims: vec![c] },
        )
        .await
        .unwrap();
        let e = &p.claims[uid].error;
        assert!(e.contains("cannot read it from the API server"), "{e}");
    });
    let log = pod.log("accel-dra-driver");
    assert!(log.contains("cannot publish the ResourceSlices"), "{log}");
    pod.assert_stays_running("accel-dra-driver");
}

/// The exporter starts under its own securityContext (no privilege, SYS_CHROOT alone, read-only
/// root) with its DaemonSet's mounts, finds the simulated GCUs through its view of the host's
/// `/`, runs the profile's efsmi chrooted there, and answers a scrape on its port inside the
/// pod's network namespace with their values; with no kubelet socket in the mounted directory,
/// it says so in a counter instead of failing.
#[cfg(feature = "exporter")]
#[test]
fn exporter_daemonset_starts_and_serves() {
    use std::io::{Read as _, Write as _};
    require_root();
    let sim = SimRoot::builder().enflame(2).build();
    // efsmi as enflame.toml declares it, run chrooted in the driver root (busybox its shell).
    std::fs::create_dir_all(sim.path().join("bin")).unwrap();
    std::fs::copy("/bin/busybox", sim.path().join("bin/sh")).unwrap();
    let efsmi = sim.path().join("usr/bin/efsmi");
    std::fs::write(
        &efsmi,
        "#!/bin/sh\necho '0, -, 10, 2048, 32768, 55, N/A'\necho '1, -, 20, 4096, 32768, 56, N/A'\n",
    )
    .unwrap();
    chmod(&efsmi, 0o755);
    let mut node = Node::new();
    node.map("/", Path::new("/"));
    let etc = node.path("/etc/accel-container-runtime");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::write(
        etc.join("config.toml"),
        format!(
            "[profiles.nvidia]\ndriver-root = \"{0}\"\n[profiles.enflame]\ndriver-root = \"{0}\"\n",
            sim.path().display()
        ),
    )
    .unwrap();
    let pod = Pod::start(EXPORTER, &node, &[]);
    let t = Instant::now();
    while !pod
        .log("accel-exporter")
        .contains("serving http://0.0.0.0:9477/metrics")
    {
        assert!(
            pod.status("accel-exporter") == "running" && t.elapsed() < Duration::from_secs(20),
            "not serving:\n{}",
            pod.log("accel-exporter")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    pod.assert_stays_running("accel-exporter");
    // A scrape from inside the pod's network namespace (its loopback brought up, as a CNI
    // would).
    let out = Command::new("runc")
        .arg("--root")
        .arg(&pod.state)
        .args(["state", &pod.running["accel-exporter"]])
        .output()
        .unwrap();
    let pid = serde_json::from_slice::<Value>(&out.stdout).unwrap()["pid"]
        .as_i64()
        .unwrap();
    let netns = format!("/proc/{pid}/ns/net");
    sh_ok(
        Command::new("nsenter")
            .arg(format!("--net={netns}"))
            .args(["ip", "link", "set", "lo", "up"]),
    );
    let scrape = move || {
        let ns = std::fs::File::open(&netns).unwrap();
        std::thread::spawn(move || {
            use std::os::fd::AsRawFd as _;
            // SAFETY: setns(2) on this thread alone, with an fd it holds open.
            assert_eq!(
                unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) },
                0
            );
            let mut s = std::net::TcpStream::connect("127.0.0.1:9477").unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut body = String::new();
            s.read_to_string(&mut body).unwrap();
            body
        })
        .join()
        .unwrap()
    };
    let t = Instant::now();
    let page = loop {
        let page = scrape();
        if page.contains("accel_memory_used_bytes") || t.elapsed() > Duration::from_secs(20) {
            break page;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    for (device, bytes) in [("0", " 2147483648.0"), ("1", " 4294967296.0")] {
        assert!(
            page.lines().any(
                |l| l.starts_with("accel_memory_used_bytes{profile=\"enflame\"")
                    && l.contains(&format!("device=\"{device}\""))
                    && l.ends_with(bytes)
            ),
            "device {device}\n{page}\n{}",
            pod.log("accel-exporter")
        );
    }
    assert!(
        page.contains("accel_exporter_pod_resources_errors_total{reason=\"no-socket\"}"),
        "{page}"
    );
}
