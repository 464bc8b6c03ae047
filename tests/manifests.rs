//! Issue 22 and 36: every container of every workload that the Kustomize overlays of
//! `packaging/kubernetes/` render (Debian sid's kubectl 1.36, `kubectl kustomize`, fetched by
//! `packaging/scripts/kubectl.sh`) started by real runc the way kubelet and containerd's CRI
//! would start it, from the images `packaging/build-images.sh` builds of the binaries under
//! test (this test build's, or the shipped build's: `common::binary`), unpacked as a pull
//! would unpack them. kubernetes-validate says a manifest is well
//! formed; only a start says whether runc accepts its mounts and whether the program finds what
//! it needs under its securityContext (the device plugin's `/proc/driver` mount, refused by
//! runc, and the checkpoint installer's `/usr/bin/accel-ctk`, absent from its image, both
//! passed validation).
//!
//! What kubelet + containerd give a container, and this file gives it too:
//! - `runc spec`'s mounts (/proc, a /dev tmpfs, /dev/pts, /dev/shm, /dev/mqueue, /sys, the
//!   cgroup tree); a pod mount at a path replaces the default there, one at /dev or /sys
//!   also the defaults below it (containerd's `WithMounts`);
//! - each volumeMount: hostPath as an rbind (`ro` when readOnly, `rslave` for
//!   HostToContainer), configMap as a read-only directory of the ConfigMap's data from the
//!   same overlay;
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

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use accel_container_runtime::kubelet::proto::deviceplugin::{
    AllocateRequest, ContainerAllocateRequest,
};
use common::grpc;
use common::kubelet::{enflame_sysfs, Kubelet};
use common::{binary, busybox_rootfs, require_root, sh_ok, unique, Bundle, SimRoot, CTK};
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;

/// A workload as the tests start it: the overlay that renders it and its DaemonSet's name.
type Workload = (&'static str, &'static str);
const RUNTIME: Workload = ("runtime", "accel-runtime-installer");
const PLUGIN: Workload = ("device-plugin", "accel-device-plugin");
const CHECKPOINT: Workload = ("device-plugin", "accel-ctk-checkpoint");
const PLUGIN_LABELS: Workload = ("device-plugin-labels", "accel-device-plugin");
const DRA: Workload = ("dra", "accel-dra-driver");
const EXPORTER: Workload = ("exporter", "accel-exporter");
const NRI: Workload = ("nri", "accel-nri-plugin");

const KUBE: &str = "packaging/kubernetes";

/// The images of `packaging/build-images.sh`, and what the base's images list makes of their
/// names (the registry a release publishes to, the crate's version).
const OUR_IMAGES: &[&str] = &[
    "accel-container-runtime",
    "accel-device-plugin",
    "accel-dra-driver",
    "accel-exporter",
];
const REGISTRY: &str = "ghcr.io/accel-container-runtime";
const PAUSE: &str = "registry.k8s.io/pause:3.9";

/// The node's label that puts it in one mode.
const MODE_LABEL: &str = "accel-container-runtime/mode";

/// The node's name as kubelet gives it to `fieldRef: spec.nodeName` (and containerd's
/// `/etc/hostname` below).
/// The pod's UID as the downward API gives it (`metadata.uid`).
const POD_UID: &str = "6f1e2d3c-4b5a-4978-8a6b-5c4d3e2f1a0b";
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

fn yaml_docs(what: &str, text: &str) -> Vec<Yaml> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| {
            serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{what}: bad YAML: {e}"))
        })
        .collect()
}

/// Debian sid's kubectl 1.36, from `packaging/scripts/kubectl.sh` (fetched once into its
/// cache, then used from there), as `.ci/run` renders the overlays with.
fn kubectl() -> &'static Path {
    static KUBECTL: OnceLock<PathBuf> = OnceLock::new();
    KUBECTL.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo().join("packaging/scripts/kubectl.sh"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "packaging/scripts/kubectl.sh failed (it fetches kubectl from deb.debian.org once):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

/// `kubectl kustomize` of the kustomization in `dir`: what `kubectl apply -k` would apply.
fn kustomize(dir: &Path) -> Result<Vec<Yaml>, String> {
    let out = Command::new(kubectl())
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(yaml_docs(
        &dir.display().to_string(),
        &String::from_utf8(out.stdout).unwrap(),
    ))
}

/// The objects `packaging/kubernetes/overlays/<overlay>` renders.
fn rendered(overlay: &str) -> Vec<Yaml> {
    kustomize(&repo().join(KUBE).join("overlays").join(overlay))
        .unwrap_or_else(|e| panic!("overlays/{overlay} does not render: {e}"))
}

/// The names of the overlays, sorted.
fn overlays() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(repo().join(KUBE).join("overlays"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// Every workload (an object with a pod template) an overlay renders, by name.
fn workloads(docs: &[Yaml]) -> BTreeMap<String, Yaml> {
    docs.iter()
        .filter(|d| !d["spec"]["template"]["spec"].is_null())
        .map(|d| (yaml_str(&d["metadata"], "name").to_owned(), d.clone()))
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
// Images, from packaging/build-images.sh
// ---------------------------------------------------------------------------------------------

/// A root filesystem and the image config's ENTRYPOINT and CMD.
struct Image {
    rootfs: PathBuf,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
}

/// Whether `bin` has a program interpreter (a dynamic build; the shipped one has none).
fn dynamic(bin: &Path) -> bool {
    let out = Command::new("readelf")
        .args(["-l", "-W"])
        .arg(bin)
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    assert!(out.status.success(), "readelf {}", bin.display());
    String::from_utf8_lossy(&out.stdout).contains("Requesting program interpreter")
}

/// The accel-ctk under test: its directory holds every binary the images take.
fn test_build() -> &'static Path {
    Path::new(CTK.as_str())
}

/// Runs `packaging/build-images.sh` on the binaries under test (`--bin-dir`), its archives in
/// `out`: `--allow-dynamic` only where the build is dynamic (cargo's debug build; `.ci/run`
/// runs this file again with `ACCEL_TEST_BINARIES` at the shipped static build, which the
/// script takes as it ships).
fn build_images(out: &Path, images: &[&str]) {
    // The script takes one directory: cargo builds every binary the features allow for an
    // integration test in one, and ACCEL_TEST_BINARIES names one.
    let plugin = binary(env!("CARGO_BIN_EXE_accel-device-plugin"));
    assert_eq!(Path::new(&plugin).parent(), test_build().parent());
    let nri = binary(env!("CARGO_BIN_EXE_accel-nri-plugin"));
    assert_eq!(Path::new(&nri).parent(), test_build().parent());
    #[cfg(feature = "dra")]
    assert_eq!(
        Path::new(&binary(env!("CARGO_BIN_EXE_accel-dra-driver"))).parent(),
        test_build().parent()
    );
    #[cfg(feature = "exporter")]
    assert_eq!(
        Path::new(&binary(env!("CARGO_BIN_EXE_accel-exporter"))).parent(),
        test_build().parent()
    );
    let mut cmd = Command::new("bash");
    cmd.arg(repo().join("packaging/build-images.sh"))
        .arg("--bin-dir")
        .arg(test_build().parent().unwrap())
        .arg("--out")
        .arg(out);
    if dynamic(test_build()) {
        cmd.arg("--allow-dynamic");
    }
    sh_ok(cmd.args(images));
}

/// The images this build can make (the DRA driver's needs `--features dra`), built once per
/// run under cargo's scratch directory for integration tests.
fn archives() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("manifests-images");
        let _ = std::fs::remove_dir_all(&dir);
        let images: Vec<&str> = OUR_IMAGES
            .iter()
            .copied()
            .filter(|i| cfg!(feature = "dra") || *i != "accel-dra-driver")
            .filter(|i| cfg!(feature = "exporter") || *i != "accel-exporter")
            .collect();
        build_images(&dir, &images);
        dir
    })
}

fn sha256(path: &Path) -> String {
    let out = sh_ok(Command::new("sha256sum").arg(path));
    out.stdout[..64].to_owned()
}

/// The archive `tar` (an OCI image layout with docker's manifest.json beside its index) read
/// as a pull reads it: the one manifest the index names as `reference`, its config and its one
/// layer, each checked against its digest and size; the layer unpacked into `rootfs` as root
/// (owners kept). Returns the image and its config.
fn unpack(tar: &Path, reference: &str, rootfs: &Path) -> (Image, Value) {
    let layout = rootfs.with_extension("layout");
    std::fs::create_dir_all(&layout).unwrap();
    sh_ok(
        Command::new("tar")
            .arg("-xf")
            .arg(tar)
            .arg("-C")
            .arg(&layout),
    );
    let json = |p: &Path| -> Value {
        serde_json::from_slice(&std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let blob = |d: &Value| -> PathBuf {
        let digest = d["digest"].as_str().expect("a digest");
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        let path = layout.join("blobs/sha256").join(hex);
        let size = std::fs::metadata(&path)
            .unwrap_or_else(|e| panic!("{}: blob {digest}: {e}", tar.display()))
            .len();
        assert_eq!(Some(size), d["size"].as_u64(), "{digest}: size");
        assert_eq!(sha256(&path), hex, "{digest}: content");
        path
    };
    assert_eq!(
        json(&layout.join("oci-layout")),
        json!({"imageLayoutVersion": "1.0.0"})
    );
    let index = json(&layout.join("index.json"));
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "{index}");
    assert_eq!(
        manifests[0]["annotations"]["io.containerd.image.name"],
        reference
    );
    let manifest = json(&blob(&manifests[0]));
    assert_eq!(
        manifest["mediaType"],
        "application/vnd.oci.image.manifest.v1+json"
    );
    let config_path = blob(&manifest["config"]);
    let config = json(&config_path);
    assert_eq!(config["os"], "linux");
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "one layer on an empty root");
    assert_eq!(
        layers[0]["mediaType"],
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    let layer = blob(&layers[0]);
    let diff_id = sh_ok(
        Command::new("sh")
            .args(["-c", "gzip -dc \"$1\" | sha256sum", "sh"])
            .arg(&layer),
    );
    assert_eq!(
        config["rootfs"],
        json!({"type": "layers", "diff_ids": [format!("sha256:{}", &diff_id.stdout[..64])]})
    );
    // What docker load reads where it does not read the index: the same config and layer.
    let rel = |p: &Path| {
        p.strip_prefix(&layout)
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(
        json(&layout.join("manifest.json")),
        json!([{"Config": rel(&config_path), "RepoTags": [reference], "Layers": [rel(&layer)]}])
    );
    std::fs::create_dir_all(rootfs).unwrap();
    sh_ok(
        Command::new("tar")
            .args(["-xzf"])
            .arg(&layer)
            .arg("-C")
            .arg(rootfs)
            .args(["--same-owner", "--numeric-owner"]),
    );
    let list = |k: &str| -> Vec<String> {
        config["config"][k]
            .as_array()
            .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
            .unwrap_or_default()
    };
    let image = Image {
        rootfs: rootfs.to_path_buf(),
        entrypoint: list("Entrypoint"),
        cmd: list("Cmd"),
    };
    (image, config)
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

/// Every regular file, link and directory under `root`: path -> (kind, mode, uid, gid, link
/// target).
fn tree(root: &Path) -> BTreeMap<String, (char, u32, u32, u32, Option<PathBuf>)> {
    fn walk(
        root: &Path,
        dir: &Path,
        out: &mut BTreeMap<String, (char, u32, u32, u32, Option<PathBuf>)>,
    ) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_str().unwrap().to_owned();
            let kind = if m.is_symlink() {
                'l'
            } else if m.is_dir() {
                'd'
            } else {
                'f'
            };
            let target = m.is_symlink().then(|| std::fs::read_link(&p).unwrap());
            out.insert(rel, (kind, m.mode() & 0o7777, m.uid(), m.gid(), target));
            if kind == 'd' {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
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

/// The image a rendered overlay names: one of the script's (as the base's images list names
/// it by default), or the pause image.
fn image(name: &str, rootfs: &Path) -> Image {
    if name == PAUSE {
        return pause_image(rootfs);
    }
    let ours = OUR_IMAGES
        .iter()
        .find(|i| name == format!("{REGISTRY}/{i}:{}", env!("CARGO_PKG_VERSION")))
        .unwrap_or_else(|| panic!("no recipe for the image {name}: add one to this test"));
    let (img, _) = unpack(&archives().join(format!("{ours}.tar")), name, rootfs);
    // A dynamic test build needs its libraries, which an image made for the static one lacks.
    for (path, (kind, ..)) in tree(rootfs) {
        let file = rootfs.join(&path);
        let bin = file.file_name().unwrap().to_str().unwrap();
        if kind == 'f' && bin.starts_with("accel-") && bin != "accel-entrypoint" {
            copy_libraries(&file, rootfs);
        }
    }
    img
}

/// The config keys the device plugin's strategies need on the node: no variable from an
/// unprivileged pod, device-list mounts read as requests.
const STRATEGY_KEYS: &str =
    "accept-envvar-unprivileged = false\naccept-container-devices-as-mounts = true\n";

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

    /// A node whose `/` is this machine's (the simulated driver root is a temp dir, read-only
    /// in the container), with a config.toml naming `driver_root` for both vendors after
    /// `keys`.
    fn seeing(driver_root: &Path, keys: &str) -> Node {
        let mut node = Node::new();
        node.map("/", Path::new("/"));
        let etc = node.path("/etc/accel-container-runtime");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(
            etc.join("config.toml"),
            format!(
                "{keys}[profiles.nvidia]\ndriver-root = \"{0}\"\n[profiles.enflame]\ndriver-root = \"{0}\"\n",
                driver_root.display()
            ),
        )
        .unwrap();
        node
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

/// The pod of a workload's Pod template, its containers started; deleted on drop.
struct Pod {
    work: tempfile::TempDir,
    state: PathBuf,
    running: BTreeMap<String, String>,
    /// What each init container wrote (stdout, then stderr).
    init_logs: BTreeMap<String, String>,
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

impl Pod {
    /// Starts the pod of `workload` as its overlay renders it on `node`: every init container
    /// to completion, in order, then every container, detached. `env` replaces a container's
    /// variable: (container, name, value).
    fn start(workload: Workload, node: &Node, env: &[(&str, &str, &str)]) -> Pod {
        require_root();
        let (overlay, name) = workload;
        let rel = format!("overlays/{overlay}: {name}");
        let docs = rendered(overlay);
        let ds = workloads(&docs)
            .remove(name)
            .unwrap_or_else(|| panic!("overlays/{overlay} renders no {name}"));
        let spec = &ds["spec"]["template"]["spec"];
        let work = tempfile::Builder::new()
            .prefix("accel-manifests-pod.")
            .tempdir()
            .unwrap();
        let state = work.path().join("runc");
        let mut pod = Pod {
            state,
            running: BTreeMap::new(),
            init_logs: BTreeMap::new(),
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
            let log = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                out.status.success(),
                "{rel}: init container {name} failed ({}):\n{log}",
                out.status,
            );
            pod.init_logs.insert(name.to_owned(), log);
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
                    .unwrap_or_else(|| panic!("ConfigMap {cm_name} is not in the overlay"));
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
                Some("metadata.uid") => POD_UID.to_owned(),
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

/// A new workload in an overlay needs a test below that starts it, unless another overlay
/// renders the same object (byte for byte, as parsed) and a test starts that one.
#[test]
fn every_workload_of_every_overlay_is_started_by_a_test_here() {
    // The DRA driver's pod is started by `dra_driver_daemonset_starts_and_registers`, built
    // with `--features dra`, the exporter's by `exporter_daemonset_starts_and_serves`, built
    // with `--features exporter` (.ci/run runs this file with both).
    let tested = [
        RUNTIME,
        PLUGIN,
        CHECKPOINT,
        PLUGIN_LABELS,
        DRA,
        EXPORTER,
        NRI,
    ];
    let all: Vec<(String, BTreeMap<String, Yaml>)> = overlays()
        .into_iter()
        .map(|o| {
            let w = workloads(&rendered(&o));
            (o, w)
        })
        .collect();
    let get = |(o, n): Workload| all.iter().find(|(x, _)| x == o).and_then(|(_, w)| w.get(n));
    for w in tested {
        assert!(get(w).is_some(), "{w:?} is not rendered");
    }
    for (o, ws) in &all {
        for (name, object) in ws {
            assert!(
                tested
                    .iter()
                    .any(|&t| t.1 == name && get(t) == Some(object)),
                "overlays/{o}: {name} is started by no test here (nor is an identical copy of it)"
            );
        }
    }
}

/// Issue 36: every overlay renders, every container image is named by the base's one list
/// (the release's registry, the crate's version) or is the pause image, every object carries
/// the common label and no selector does (a DaemonSet's selector cannot change), and every
/// namespaced object is in accel-system but the checkpoint installer's (kube-system).
#[test]
fn every_overlay_renders_with_one_list_of_images_and_the_common_label() {
    let version = env!("CARGO_PKG_VERSION");
    let mut seen = BTreeSet::new();
    for o in overlays() {
        for d in rendered(&o) {
            let kind = yaml_str(&d, "kind");
            let name = yaml_str(&d["metadata"], "name");
            assert_eq!(
                d["metadata"]["labels"]["app.kubernetes.io/part-of"].as_str(),
                Some("accel-container-runtime"),
                "overlays/{o}: {kind} {name}"
            );
            if let Some(ns) = d["metadata"]["namespace"].as_str() {
                let want = if name == "accel-ctk-checkpoint" || name == "accel-ctk-checkpoint-unit"
                {
                    "kube-system"
                } else {
                    "accel-system"
                };
                assert_eq!(ns, want, "overlays/{o}: {kind} {name}");
            }
            let spec = &d["spec"]["template"]["spec"];
            if spec.is_null() {
                continue;
            }
            assert!(
                d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/part-of"].is_null(),
                "overlays/{o}: {name}'s selector"
            );
            for c in seq(spec, "initContainers")
                .iter()
                .chain(seq(spec, "containers"))
            {
                let image = yaml_str(c, "image");
                assert!(
                    image == PAUSE
                        || OUR_IMAGES
                            .iter()
                            .any(|i| image == format!("{REGISTRY}/{i}:{version}")),
                    "overlays/{o}: {name} runs {image}"
                );
                seen.insert(image.to_owned());
            }
        }
    }
    assert_eq!(seen.len(), OUR_IMAGES.len() + 1, "{seen:?}");
}

/// Issue 36: no overlay runs the device plugin and the DRA driver, and where either runs, it
/// runs only on the nodes whose mode label names it: a node has one value for a label, so
/// applying both overlays to one cluster still puts one mode on each node. Each mode comes with
/// the runtime installer, but for the NRI overlay's, whose nodes keep their stock runtime.
#[test]
fn a_node_runs_one_mode_whatever_the_overlays() {
    let mode = |w: &Yaml| {
        w["spec"]["template"]["spec"]["nodeSelector"][MODE_LABEL]
            .as_str()
            .map(str::to_owned)
    };
    let mut modes = BTreeSet::new();
    for o in overlays() {
        let w = workloads(&rendered(&o));
        let plugin = w.get("accel-device-plugin");
        let dra = w.get("accel-dra-driver");
        assert!(plugin.is_none() || dra.is_none(), "overlays/{o} runs both");
        if let Some(p) = plugin {
            assert_eq!(mode(p).as_deref(), Some("device-plugin"), "overlays/{o}");
            modes.insert("device-plugin");
        }
        if let Some(d) = dra {
            assert_eq!(mode(d).as_deref(), Some("dra"), "overlays/{o}");
            modes.insert("dra");
        }
        assert_eq!(
            w.contains_key("accel-runtime-installer"),
            o != "nri",
            "overlays/{o}"
        );
        for (name, x) in &w {
            if name != "accel-device-plugin" && name != "accel-dra-driver" {
                assert_eq!(mode(x), None, "overlays/{o}: {name} is in no mode");
            }
        }
    }
    assert_eq!(modes.len(), 2);
}

/// Issue 36: the labels component patches the device plugin's DaemonSet; composed without it
/// (with the DRA driver, say), the build fails and names the DaemonSet, instead of rendering
/// without labels.
#[test]
fn the_labels_component_needs_the_device_plugin() {
    let dir = tempfile::tempdir().unwrap();
    // kustomize takes no absolute path: from the temp dir up to `/`, then down to the repo.
    let up = "../".repeat(dir.path().components().count() - 1);
    let kube = format!(
        "{up}{}",
        repo().join(KUBE).to_str().unwrap().trim_start_matches('/')
    );
    let mut k = String::from(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\ncomponents:\n",
    );
    for c in ["runtime", "dra", "nfd-labels"] {
        k.push_str(&format!("- {kube}/components/{c}\n"));
    }
    k.push_str(&format!("- {kube}/base\n"));
    std::fs::write(dir.path().join("kustomization.yaml"), &k).unwrap();
    let err = kustomize(dir.path()).expect_err("nfd-labels without the device plugin rendered");
    assert!(
        err.contains("DaemonSet.v1.apps/accel-device-plugin.accel-system"),
        "{err}"
    );
    // The same kustomization with the device plugin in place of the driver renders.
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        k.replace("/components/dra\n", "/components/device-plugin\n"),
    )
    .unwrap();
    kustomize(dir.path()).unwrap();
}

/// Issue 36: each image is exactly what `packaging/build-images.sh` says it is, every entry
/// root's: the plugin's and the driver's the binary alone at /usr/bin; the installer's the
/// runtime and accel-ctk, the config and every profile as in the repository, the entrypoint,
/// and busybox with its applet links (its shell and tools). The archives are reproducible.
#[test]
fn images_hold_what_the_script_says_and_nothing_else() {
    let version = env!("CARGO_PKG_VERSION");
    let work = tempfile::tempdir().unwrap();
    let unpacked = |image: &str| {
        let root = work.path().join(image);
        let (img, config) = unpack(
            &archives().join(format!("{image}.tar")),
            &format!("{REGISTRY}/{image}:{version}"),
            &root,
        );
        assert_eq!(
            config["config"]["Labels"]["org.opencontainers.image.version"],
            version
        );
        (img, tree(&root))
    };
    let dirs_of = |files: &[&str]| -> BTreeSet<String> {
        files
            .iter()
            .flat_map(|f| {
                Path::new(f)
                    .ancestors()
                    .skip(1)
                    .map(|a| a.to_str().unwrap().to_owned())
            })
            .filter(|a| !a.is_empty())
            .collect()
    };
    let mut single = vec!["accel-device-plugin"];
    if cfg!(feature = "dra") {
        single.push("accel-dra-driver");
    }
    if cfg!(feature = "exporter") {
        single.push("accel-exporter");
    }
    for bin in single {
        let (img, tree) = unpacked(bin);
        let file = format!("usr/bin/{bin}");
        // The device plugin's image carries the NRI plugin too (its DaemonSet names it).
        let mut files = vec![file.clone()];
        if bin == "accel-device-plugin" {
            files.push("usr/bin/accel-nri-plugin".into());
        }
        let mut want: BTreeSet<String> =
            dirs_of(&files.iter().map(String::as_str).collect::<Vec<_>>());
        want.extend(files.iter().cloned());
        assert_eq!(tree.keys().cloned().collect::<BTreeSet<_>>(), want, "{bin}");
        for f in &files {
            assert_eq!(tree[f], ('f', 0o755, 0, 0, None), "{f}");
            if !dynamic(test_build()) {
                assert!(!dynamic(&img.rootfs.join(f)), "{f} is not static");
            }
        }
        assert_eq!(img.entrypoint, [format!("/{file}")]);
        assert!(img.cmd.is_empty());
    }

    let (img, tree) = unpacked("accel-container-runtime");
    assert_eq!(img.entrypoint, ["/usr/local/bin/accel-entrypoint"]);
    assert_eq!(img.cmd, ["install"]);
    let mut want: BTreeMap<String, (u32, Vec<u8>)> = BTreeMap::new();
    let repo_file = |rel: &str| std::fs::read(repo().join(rel)).unwrap();
    want.insert(
        "opt/accel-container-runtime/etc/config.toml".into(),
        (0o644, repo_file("config/config.toml")),
    );
    for p in std::fs::read_dir(repo().join("config/profiles")).unwrap() {
        let p = p.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap();
        want.insert(
            format!("opt/accel-container-runtime/etc/profiles/{name}"),
            (0o644, std::fs::read(&p).unwrap()),
        );
    }
    want.insert(
        "usr/local/bin/accel-entrypoint".into(),
        (0o755, repo_file("packaging/container/entrypoint.sh")),
    );
    want.insert(
        "bin/busybox".into(),
        (0o755, std::fs::read("/bin/busybox").unwrap()),
    );
    let bins = ["accel-container-runtime", "accel-ctk"];
    let mut files: Vec<String> = want.keys().cloned().collect();
    files.extend(
        bins.iter()
            .map(|b| format!("opt/accel-container-runtime/bin/{b}")),
    );
    let applets = sh_ok(Command::new("/bin/busybox").arg("--list"));
    let applets: Vec<&str> = applets.stdout.lines().filter(|a| *a != "busybox").collect();
    assert!(applets.contains(&"sh") && applets.contains(&"nsenter"));
    let mut expected: BTreeSet<String> =
        dirs_of(&files.iter().map(String::as_str).collect::<Vec<_>>());
    expected.extend(files.iter().cloned());
    expected.extend(applets.iter().map(|a| format!("bin/{a}")));
    assert_eq!(tree.keys().cloned().collect::<BTreeSet<_>>(), expected);
    for (path, (mode, bytes)) in &want {
        assert_eq!(tree[path].0, 'f', "{path}");
        assert_eq!(
            (tree[path].1, tree[path].2, tree[path].3),
            (*mode, 0, 0),
            "{path}"
        );
        assert_eq!(
            &std::fs::read(img.rootfs.join(path)).unwrap(),
            bytes,
            "{path}"
        );
    }
    for b in bins {
        let path = format!("opt/accel-container-runtime/bin/{b}");
        assert_eq!(tree[&path], ('f', 0o755, 0, 0, None), "{path}");
        sh_ok(Command::new(img.rootfs.join(&path)).arg("--version"));
    }
    for a in &applets {
        assert_eq!(
            tree[&format!("bin/{a}")],
            ('l', 0o777, 0, 0, Some(PathBuf::from("busybox"))),
            "bin/{a}"
        );
    }
    for (path, (kind, mode, uid, gid, _)) in &tree {
        if *kind == 'd' {
            assert_eq!((*mode, *uid, *gid), (0o755, 0, 0), "{path}");
        }
    }

    // Built again, byte for byte the same archive.
    let again = work.path().join("again");
    build_images(&again, &["accel-device-plugin"]);
    assert_eq!(
        sha256(&again.join("accel-device-plugin.tar")),
        sha256(&archives().join("accel-device-plugin.tar")),
        "the archive is not reproducible"
    );
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

    let mut node = Node::seeing(sim.path(), STRATEGY_KEYS);
    node.map("/var/lib/kubelet/device-plugins", kubelet.dir());

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

/// Issue 36, the labels overlay: the device plugin keeps Node Feature Discovery's feature file
/// in the node's features.d (mounted read-write under its read-only root), with the labels of
/// the simulated GCUs it finds through its view of the host's `/`.
#[test]
fn device_plugin_labels_overlay_keeps_the_nfd_feature_file() {
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
    let mut node = Node::seeing(sim.path(), STRATEGY_KEYS);
    node.map("/var/lib/kubelet/device-plugins", kubelet.dir());
    let features = node.path("/etc/kubernetes/node-feature-discovery/features.d");
    let file = features.join("accel-container-runtime");

    let pod = Pod::start(PLUGIN_LABELS, &node, &[]);
    let t = Instant::now();
    let text = loop {
        if let Ok(text) = std::fs::read_to_string(&file) {
            break text;
        }
        let status = pod.status("accel-device-plugin");
        assert!(
            status == "running" && t.elapsed() < Duration::from_secs(20),
            "no {}; the plugin ({status}):\n{}",
            file.display(),
            pod.log("accel-device-plugin")
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        text.lines().any(|l| l.starts_with("# +expiry-time=")),
        "{text}"
    );
    for want in ["accel-enflame.present=true", "accel-enflame.count=8"] {
        assert!(text.lines().any(|l| l == want), "no {want} in:\n{text}");
    }
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
    let changed = "containerd config changed; restart containerd on the node to apply";
    assert!(
        pod.init_logs["install"].contains(changed),
        "{:?}",
        pod.init_logs
    );
    pod.assert_stays_running("done");
    drop(pod);

    // The pod again on the same node (a node reboot, a rollout): the installer's tools are the
    // image's busybox, and the second install finds containerd's config as the first left
    // it, so nothing is restarted.
    let again = Pod::start(
        RUNTIME,
        &node,
        &[("install", "RESTART_CONTAINERD", "false")],
    );
    let log = &again.init_logs["install"];
    assert!(!log.contains(changed), "{log}");
    assert_eq!(
        std::fs::read_to_string(node.path("/etc/containerd/config.toml")).unwrap(),
        containerd
    );
    again.assert_stays_running("done");
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
    let node = Node::seeing(sim.path(), "");
    let pod = Pod::start(DRA, &node, &[]);
    let reg = node
        .path("/var/lib/kubelet/plugins_registry")
        .join(format!("gcu.enflame.com-{POD_UID}-reg.sock"));
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
    // The node's paths of the sockets are under this test's scratch dir, longer than a socket
    // address takes: dialled through short links, as a connect follows links.
    let short = tempfile::Builder::new()
        .prefix("dra")
        .tempdir_in("/tmp")
        .unwrap();
    let link = |name: &str, to: &Path| {
        let l = short.path().join(name);
        std::os::unix::fs::symlink(to, &l).unwrap();
        l
    };
    rt.block_on(async {
        let ch = grpc::connect(&link("r", &reg), "localhost").await.unwrap();
        let info = dra::get_info(&ch).await.unwrap();
        assert_eq!(info.r#type, "DRAPlugin");
        assert_eq!(info.name, "gcu.enflame.com");
        // The pod's own sockets, named with its UID: an upgrade's old and new pod both serve.
        assert_eq!(
            info.endpoint,
            format!("/var/lib/kubelet/plugins/gcu.enflame.com/dra-{POD_UID}.sock")
        );
        let ch = grpc::connect(&link("s", &node.path(&info.endpoint)), "localhost")
            .await
            .unwrap();
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
    assert!(log.contains("watching the ResourceSlices"), "{log}");
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
    let node = Node::seeing(sim.path(), "");
    let pod = Pod::start(EXPORTER, &node, &[]);
    let name = "accel-exporter";
    let t = Instant::now();
    while !pod
        .log(name)
        .contains("serving http://0.0.0.0:9477/metrics")
    {
        assert!(
            pod.status(name) == "running" && t.elapsed() < Duration::from_secs(20),
            "not serving:\n{}",
            pod.log(name)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    pod.assert_stays_running(name);
    // A scrape from inside the pod's network namespace (its loopback brought up, as a CNI
    // would).
    let out = Command::new("runc")
        .arg("--root")
        .arg(&pod.state)
        .args(["state", &pod.running[name]])
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
            pod.log(name)
        );
    }
    assert!(
        page.contains("accel_exporter_pod_resources_errors_total{reason=\"no-socket\"}"),
        "{page}"
    );
}

/// Issue 42 item 11: the exporter serves every holder's namespace, pod, container and claim
/// names on its pod IP, to any pod that reaches it. Wherever the exporter runs, a
/// NetworkPolicy selects exactly its pods, admits only the monitoring namespace on the metrics
/// port, and allows no egress (the exporter opens no connection).
#[test]
fn tenant_names_on_an_open_port_only_the_monitoring_namespace_reaches_the_exporter() {
    let mut checked = 0;
    for o in overlays() {
        let docs = rendered(&o);
        let Some(exporter) = workloads(&docs).remove("accel-exporter") else {
            continue;
        };
        let pod_labels = &exporter["spec"]["template"]["metadata"]["labels"];
        let policies: Vec<&Yaml> = docs
            .iter()
            .filter(|d| yaml_str(d, "kind") == "NetworkPolicy")
            .filter(|d| {
                let sel = d["spec"]["podSelector"]["matchLabels"]
                    .as_mapping()
                    .unwrap();
                !sel.is_empty()
                    && sel
                        .iter()
                        .all(|(k, v)| pod_labels[k.as_str().unwrap()] == *v)
            })
            .collect();
        assert_eq!(policies.len(), 1, "overlays/{o}: {policies:?}");
        let spec = &policies[0]["spec"];
        assert_eq!(
            yaml_str(&policies[0]["metadata"], "namespace"),
            yaml_str(&exporter["metadata"], "namespace")
        );
        assert!(spec["podSelector"]["matchExpressions"].is_null());
        assert_eq!(
            strings(&spec["policyTypes"]).unwrap(),
            ["Ingress", "Egress"],
            "overlays/{o}"
        );
        assert!(
            seq(spec, "egress").is_empty(),
            "overlays/{o}: egress allowed"
        );
        let ingress = seq(spec, "ingress");
        assert_eq!(ingress.len(), 1, "overlays/{o}: {ingress:?}");
        let from = seq(&ingress[0], "from");
        assert_eq!(from.len(), 1, "overlays/{o}: {from:?}");
        let peer = from[0].as_mapping().unwrap();
        assert_eq!(
            peer.len(),
            1,
            "overlays/{o}: a peer of one selector: {peer:?}"
        );
        assert_eq!(
            from[0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"].as_str(),
            Some("monitoring"),
            "overlays/{o}"
        );
        let ports = seq(&ingress[0], "ports");
        let container = &seq(&exporter["spec"]["template"]["spec"], "containers")[0];
        let metrics = seq(container, "ports")
            .iter()
            .find(|p| p["name"].as_str() == Some("metrics"))
            .expect("the exporter's metrics port");
        assert_eq!(ports.len(), 1, "overlays/{o}: {ports:?}");
        assert_eq!(ports[0]["port"].as_str(), Some("metrics"));
        assert_eq!(ports[0]["protocol"], metrics["protocol"]);
        let listen = seq(container, "args")
            .iter()
            .filter_map(|a| a.as_str()?.strip_prefix("--listen="))
            .next()
            .expect("--listen");
        assert!(
            listen.ends_with(&format!(":{}", metrics["containerPort"].as_u64().unwrap())),
            "{listen}"
        );
        checked += 1;
    }
    assert!(checked >= 1, "no overlay runs the exporter");
}

/// Issue 43 item 4: the NRI plugin's pod starts under its own securityContext (no privilege,
/// no capability, read-only root) on a node without the engine's NRI socket, says so once and
/// keeps running, retrying; once a socket appears in the node's `/var/run/nri` (the hostPath
/// it mounts), it connects to it there.
#[test]
fn nri_plugin_daemonset_waits_for_the_socket_then_connects() {
    require_root();
    let sim = SimRoot::builder().enflame(2).build();
    let node = Node::seeing(sim.path(), "");
    let pod = Pod::start(NRI, &node, &[]);
    let name = "accel-nri-plugin";
    let waiting = "cannot connect to /var/run/nri/nri.sock";
    let t = Instant::now();
    while !pod.log(name).contains(waiting) {
        assert!(
            pod.status(name) == "running" && t.elapsed() < Duration::from_secs(20),
            "no {waiting:?}:\n{}",
            pod.log(name)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    pod.assert_stays_running(name);
    assert_eq!(
        pod.log(name).matches(waiting).count(),
        1,
        "{}",
        pod.log(name)
    );

    // The engine comes up: a socket in the node's directory, which the pod mounts.
    let listener =
        std::os::unix::net::UnixListener::bind(node.path("/var/run/nri").join("nri.sock")).unwrap();
    listener.set_nonblocking(true).unwrap();
    let t = Instant::now();
    loop {
        match listener.accept() {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("accept: {e}"),
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the plugin never connected:\n{}",
            pod.log(name)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let t = Instant::now();
    while !pod
        .log(name)
        .contains("nri: connected to /var/run/nri/nri.sock")
    {
        assert!(t.elapsed() < Duration::from_secs(5), "{}", pod.log(name));
        std::thread::sleep(Duration::from_millis(50));
    }
    pod.assert_stays_running(name);
}
