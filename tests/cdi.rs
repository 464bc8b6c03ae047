//! CDI end to end on a simulated accelerator root: `accel-ctk cdi generate` output validated
//! against the CDI JSON schema (with the schema's own good/bad samples), `accel-ctk cdi list`,
//! and the shim's create path run on a bundle (low-level runtime `/bin/true`) to show that a
//! device requested by CDI name, through the variable or a `cdi.k8s.io` annotation, gives
//! config.json the same device nodes, cgroup rules, mounts and groups as the variable does.
//!
//! Needs root (mknod of device nodes with NVIDIA's real major 195) and gcc; CI runs as root and
//! a non-root run fails loudly. Generated specs are validated against the CDI format as this
//! repository writes it down (tests/fixtures/cdi-schema.json); the CDI project's own schema
//! and samples (`../shared/cdi-schema` beside the checkout, or `CDI_SCHEMA_DIR`) are an extra
//! check when they are there, never a requirement.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{free_majors, mknod, CTK, SHIM};
use serde_json::{json, Value};

/// Two simulated NVIDIA GPUs (bus order differs from minor order) and four Enflame GCUs.
const GPUS: &[(&str, u32, &str)] = &[
    (
        "0000:3b:00.0",
        3,
        "GPU-8f6b1c2e-0d7a-4f52-9c1e-3b0000000003",
    ),
    (
        "0000:af:00.0",
        1,
        "GPU-1d2e3f40-5a6b-4c7d-8e9f-af0000000001",
    ),
];

struct Node {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    root: PathBuf,
    config: PathBuf,
    cdi_dirs: [PathBuf; 2],
}

fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The simulated driver root, its config.toml and two CDI spec dirs.
fn node() -> Node {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let root = dir.join("root");
    for d in [
        "dev",
        "etc",
        "usr/bin",
        "usr/lib/x86_64-linux-gnu",
        "proc/driver/nvidia/gpus",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for (bus, minor, uuid) in GPUS {
        let d = root.join("proc/driver/nvidia/gpus").join(bus);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("information"),
            format!("Model: \t\t Simulated GPU\nIRQ:   \t\t 0\nGPU UUID: \t\t {uuid}\nBus Type: \t\t PCIe\nBus Location: \t\t {bus}\nDevice Minor: \t\t {minor}\n"),
        )
        .unwrap();
        mknod(&root.join(format!("dev/nvidia{minor}")), 195, *minor, 0o666);
    }
    // Not world-accessible: the container gets group 44 in additionalGids.
    mknod(&root.join("dev/nvidiactl"), 195, 255, 0o660);
    std::os::unix::fs::chown(root.join("dev/nvidiactl"), Some(0), Some(44)).unwrap();
    let emaj = free_majors(1)[0];
    for n in 0..4 {
        mknod(&root.join(format!("dev/gcu{n}")), emaj, n, 0o666);
    }
    mknod(&root.join("dev/gcuctl"), emaj, 255, 0o666);

    let src = dir.join("lib.c");
    std::fs::write(&src, "int marker(void) { return 42; }\n").unwrap();
    let libdir = root.join("usr/lib/x86_64-linux-gnu");
    for (soname, file) in [
        ("libcuda.so.1", "libcuda.so.550.54.14"),
        ("libnvidia-ml.so.1", "libnvidia-ml.so.550.54.14"),
        ("libefml.so.1", "libefml.so.1.2.3"),
    ] {
        run_ok(
            Command::new("gcc")
                .args(["-shared", "-fPIC", &format!("-Wl,-soname,{soname}"), "-o"])
                .arg(libdir.join(file))
                .arg(&src),
        );
        std::os::unix::fs::symlink(file, libdir.join(soname)).unwrap();
    }
    std::fs::write(root.join("etc/ld.so.conf"), "/usr/lib/x86_64-linux-gnu\n").unwrap();
    run_ok(Command::new("ldconfig").arg("-r").arg(&root));
    for bin in ["nvidia-smi", "efsmi"] {
        let p = root.join("usr/bin").join(bin);
        std::fs::write(&p, "#!/bin/sh\necho simulated\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    let cdi_dirs = [dir.join("etc-cdi"), dir.join("run-cdi")];
    for d in &cdi_dirs {
        std::fs::create_dir_all(d).unwrap();
    }
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "low-level-runtime = \"/bin/true\"\nlog-file = {:?}\nhost-dev-dir = {:?}\ncdi-spec-dirs = [{:?}, {:?}]\n[profiles.nvidia]\ndriver-root = {:?}\n[profiles.enflame]\ndriver-root = {:?}\n",
            dir.join("shim.log"),
            dir.join("dev"),
            cdi_dirs[0],
            cdi_dirs[1],
            root,
            root
        ),
    )
    .unwrap();
    Node {
        _tmp: tmp,
        dir,
        root,
        config,
        cdi_dirs,
    }
}

impl Node {
    fn ctk(&self, args: &[&str]) -> Output {
        Command::new(&*CTK)
            .args(args)
            .env("ACCEL_CONTAINER_RUNTIME_CONFIG", &self.config)
            .output()
            .unwrap()
    }

    fn ctk_ok(&self, args: &[&str]) -> String {
        let out = self.ctk(args);
        assert!(
            out.status.success(),
            "accel-ctk {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Generates both vendors' specs into the first (lower-priority) CDI dir.
    fn generate(&self) {
        let dir = self.cdi_dirs[0].to_str().unwrap();
        self.ctk_ok(&["cdi", "generate", "--output", dir]);
        self.ctk_ok(&[
            "cdi",
            "generate",
            "--vendor",
            "enflame",
            "--format",
            "json",
            "--output",
            self.cdi_dirs[0]
                .join("enflame.com-gcu.json")
                .to_str()
                .unwrap(),
        ]);
        std::fs::remove_file(self.cdi_dirs[0].join("enflame.com-gcu.yaml")).unwrap();
    }

    /// A bundle from runc's own `runc spec` output, with a rootfs that has Debian's library
    /// directory (so the variable path and the generated spec agree on where libraries go).
    fn bundle(&self, name: &str, env: &[&str], annotations: Value) -> PathBuf {
        let b = self.dir.join(name);
        std::fs::create_dir_all(b.join("rootfs/usr/lib/x86_64-linux-gnu")).unwrap();
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/specs/runc-1.1-spec.json"),
        )
        .unwrap();
        let mut spec: Value = serde_json::from_str(&text).unwrap();
        for e in env {
            spec["process"]["env"]
                .as_array_mut()
                .unwrap()
                .push(json!(e));
        }
        if !annotations.is_null() {
            spec["annotations"] = annotations;
        }
        std::fs::write(
            b.join("config.json"),
            serde_json::to_vec_pretty(&spec).unwrap(),
        )
        .unwrap();
        b
    }

    /// Runs the shim's create on a bundle: (success, stderr, config.json afterwards).
    fn create(&self, bundle: &Path) -> (bool, String, Value) {
        self.create_with(bundle, &self.config)
    }

    /// The same with another shim config file.
    fn create_with(&self, bundle: &Path, config: &Path) -> (bool, String, Value) {
        let out = Command::new(&*SHIM)
            .args(["create", "--bundle"])
            .arg(bundle)
            .arg("cdi-test")
            .env("ACCEL_CONTAINER_RUNTIME_CONFIG", config)
            .output()
            .unwrap();
        assert!(
            out.stdout.is_empty(),
            "the shim wrote to stdout: {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
        let text = std::fs::read(bundle.join("config.json")).unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            serde_json::from_slice(&text).unwrap(),
        )
    }

    fn create_ok(&self, bundle: &Path) -> Value {
        let (ok, stderr, spec) = self.create(bundle);
        assert!(ok, "create failed: {stderr}");
        spec
    }
}

/// What device injection put in the spec: nodes and rules as sorted sets, mounts in order,
/// extra groups; everything else in the document must be unchanged by the request's form.
fn injected(spec: &Value) -> Value {
    let sorted = |v: &Value| {
        let mut items: Vec<String> = v
            .as_array()
            .map(|a| a.iter().map(Value::to_string).collect())
            .unwrap_or_default();
        items.sort();
        json!(items)
    };
    json!({
        "devices": sorted(&spec["linux"]["devices"]),
        "rules": sorted(&spec["linux"]["resources"]["devices"]),
        "mounts": spec["mounts"],
        "gids": spec["process"]["user"]["additionalGids"],
    })
}

/// The document without the request itself (the variable, annotations), for a whole-file
/// comparison.
fn without_request(spec: &Value) -> Value {
    let mut s = spec.clone();
    s["process"]["env"]
        .as_array_mut()
        .unwrap()
        .retain(|e| !e.as_str().unwrap().contains("_VISIBLE_DEVICES="));
    s.as_object_mut().unwrap().remove("annotations");
    let devices = s["linux"]["devices"].take();
    s["linux"]["devices"] = injected(&json!({"linux": {"devices": devices}}))["devices"].clone();
    let rules = s["linux"]["resources"]["devices"].take();
    s["linux"]["resources"]["devices"] =
        injected(&json!({"linux": {"resources": {"devices": rules}}}))["rules"].clone();
    s
}

/// The CDI project's own schema and samples (`../shared/cdi-schema` beside the checkout, or
/// `CDI_SCHEMA_DIR`): reference material, checked against only when it is there.
fn shared_schema_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("CDI_SCHEMA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/cdi-schema"));
    let there = dir.join("schema.json").is_file() && dir.join("defs.json").is_file();
    if !there {
        eprintln!(
            "note: no CDI project schema at {}: checked against tests/fixtures/cdi-schema.json only",
            dir.display()
        );
    }
    there.then_some(dir)
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The CDI spec format as this repository writes it down (tests/fixtures/cdi-schema.json).
fn validator() -> jsonschema::Validator {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cdi-schema.json");
    jsonschema::options()
        .build(&read_json(&path))
        .expect("the repository's CDI schema compiles")
}

/// The CDI project's schema (draft-07, `$ref`s into defs.json), resolved offline.
fn shared_validator(dir: &Path) -> jsonschema::Validator {
    let registry = jsonschema::Registry::new()
        .add(
            "file:///cdi-schema/defs.json",
            read_json(&dir.join("defs.json")),
        )
        .expect("defs.json")
        .prepare()
        .expect("registry");
    jsonschema::options()
        .with_base_uri("file:///cdi-schema/schema.json")
        .with_registry(&registry)
        .build(&read_json(&dir.join("schema.json")))
        .expect("the CDI schema compiles")
}

fn schema_errors(v: &jsonschema::Validator, doc: &Value) -> Vec<String> {
    v.iter_errors(doc).map(|e| e.to_string()).collect()
}

/// The CDI project's good and bad samples: its schema, this repository's schema and this
/// runtime's loader agree on each (only where the samples are there: see shared_schema_dir).
#[test]
fn schema_samples_good_pass_bad_fail() {
    let Some(dir) = shared_schema_dir() else {
        return;
    };
    let ours = validator();
    let v = shared_validator(&dir);
    let testdata = dir.join("testdata");
    for (kind, expect_valid) in [("good", true), ("bad", false)] {
        let mut n = 0;
        for entry in std::fs::read_dir(testdata.join(kind)).unwrap() {
            let path = entry.unwrap().path();
            n += 1;
            let data = std::fs::read(&path).unwrap();
            let schema_ok = serde_json::from_slice::<Value>(&data)
                .is_ok_and(|doc| schema_errors(&v, &doc).is_empty());
            let ours_ok = serde_json::from_slice::<Value>(&data)
                .is_ok_and(|doc| schema_errors(&ours, &doc).is_empty());
            assert_eq!(ours_ok, expect_valid, "our schema on {}", path.display());
            // This runtime's loader must agree with the schema on every sample.
            let loader_ok = accel_container_runtime::cdi::registry::read_spec(&path).is_ok();
            assert_eq!(schema_ok, expect_valid, "schema on {}", path.display());
            assert_eq!(loader_ok, expect_valid, "loader on {}", path.display());
        }
        assert!(n > 0, "no {kind} samples in {}", testdata.display());
    }
}

#[test]
fn generated_specs_validate_and_list() {
    let node = node();
    let v = validator();

    // JSON and YAML, both vendors, every output form: each file passes the schema.
    node.generate();
    let nvidia_yaml = node.cdi_dirs[0].join("nvidia.com-gpu.yaml");
    let enflame_json = node.cdi_dirs[0].join("enflame.com-gcu.json");
    let nvidia: Value = serde_yaml_ng::from_slice(&std::fs::read(&nvidia_yaml).unwrap()).unwrap();
    let enflame = read_json(&enflame_json);
    let stdout_json = node.ctk_ok(&["cdi", "generate", "--vendor", "nvidia", "--format", "json"]);
    let stdout_json: Value = serde_json::from_str(&stdout_json).unwrap();
    assert_eq!(
        stdout_json, nvidia,
        "stdout JSON == the YAML file's content"
    );
    let shared = shared_schema_dir().map(|d| shared_validator(&d));
    for (what, doc) in [("nvidia", &nvidia), ("enflame", &enflame)] {
        let errors = schema_errors(&v, doc);
        assert!(errors.is_empty(), "{what}: {errors:?}\n{doc:#}");
        if let Some(shared) = &shared {
            let errors = schema_errors(shared, doc);
            assert!(
                errors.is_empty(),
                "{what} (CDI project schema): {errors:?}\n{doc:#}"
            );
        }
    }
    // The validator follows the $refs into defs.json: a node without `path` fails.
    let mut broken = nvidia.clone();
    broken["containerEdits"]["deviceNodes"][0]
        .as_object_mut()
        .unwrap()
        .remove("path");
    assert!(!schema_errors(&v, &broken).is_empty());

    // nvidia: devices by index, UUID, PCI function and `all`; shared edits: control node, libraries by
    // soname under the multiarch dir, binaries; group 44 for nvidiactl, hence 0.7.0.
    assert_eq!(nvidia["kind"], "nvidia.com/gpu");
    assert_eq!(nvidia["cdiVersion"], "0.7.0");
    let names: Vec<&str> = nvidia["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["0", GPUS[0].2, GPUS[0].0, "1", GPUS[1].2, GPUS[1].0, "all"]
    );
    let root = node.root.to_str().unwrap();
    assert_eq!(
        nvidia["devices"][4]["containerEdits"],
        nvidia["devices"][3]["containerEdits"]
    );
    assert_eq!(
        nvidia["devices"][3]["containerEdits"],
        json!({"deviceNodes": [{"path": "/dev/nvidia1", "hostPath": format!("{root}/dev/nvidia1")}]})
    );
    let shared = &nvidia["containerEdits"];
    assert_eq!(
        shared["deviceNodes"],
        json!([{"path": "/dev/nvidiactl", "hostPath": format!("{root}/dev/nvidiactl")}])
    );
    assert_eq!(shared["additionalGids"], json!([44]));
    assert_eq!(
        shared["mounts"][0],
        json!({"hostPath": format!("{root}/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14"),
               "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
               "options": ["ro", "nosuid", "nodev", "bind"], "type": "bind"})
    );
    let dests: Vec<&str> = shared["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["containerPath"].as_str().unwrap())
        .collect();
    assert!(dests.contains(&"/usr/bin/nvidia-smi"), "{dests:?}");
    assert!(
        dests.contains(&"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
        "{dests:?}"
    );

    // enflame: no UUIDs, so index and `all`; world-accessible nodes, so 0.5.0.
    assert_eq!(enflame["kind"], "enflame.com/gcu");
    assert_eq!(enflame["cdiVersion"], "0.5.0");
    assert_eq!(enflame["devices"].as_array().unwrap().len(), 5);

    // Several vendors to one file is refused with a clear line; an unknown vendor too.
    let out = node.ctk(&[
        "cdi",
        "generate",
        "--output",
        node.dir.join("x.yaml").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("found devices of nvidia, enflame: pass --vendor"),
        "{err}"
    );
    let out = node.ctk(&["cdi", "generate", "--vendor", "nvidai"]);
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("no profile \"nvidai\"; known: nvidia, enflame"));

    // list: every name of both files, sorted; a broken file is reported on stderr, skipped.
    std::fs::write(node.cdi_dirs[1].join("broken.yaml"), "cdiVersion: [").unwrap();
    let out = node.ctk(&["cdi", "list"]);
    assert!(out.status.success());
    let listed = String::from_utf8(out.stdout).unwrap();
    let mut want: Vec<String> = (0..4)
        .map(|i| format!("enflame.com/gcu={i}"))
        .chain(["enflame.com/gcu=all".to_string()])
        .chain(names.iter().map(|n| format!("nvidia.com/gpu={n}")))
        .collect();
    want.sort();
    assert_eq!(listed.lines().collect::<Vec<_>>(), want);
    assert!(String::from_utf8_lossy(&out.stderr).contains("broken.yaml"));
}

#[test]
fn cdi_injection_equals_variable_injection() {
    let node = node();
    node.generate();

    let by_var = node.create_ok(&node.bundle("var", &["NVIDIA_VISIBLE_DEVICES=1"], Value::Null));
    let by_name = node.create_ok(&node.bundle(
        "name",
        &["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1"],
        Value::Null,
    ));
    let by_uuid = node.create_ok(&node.bundle(
        "uuid",
        &[&format!(
            "NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu={}",
            GPUS[1].2
        )],
        Value::Null,
    ));
    let by_annotation = node.create_ok(&node.bundle(
        "annotation",
        &[],
        json!({"cdi.k8s.io/test_gpu1": "nvidia.com/gpu=1"}),
    ));

    // The variable path really injected: GPU 1 is minor 1 (bus order), plus nvidiactl.
    let inj = injected(&by_var);
    let devices = inj["devices"].to_string();
    assert!(
        devices.contains("/dev/nvidia1") && devices.contains("/dev/nvidiactl"),
        "{inj:#}"
    );
    assert!(!devices.contains("/dev/nvidia3"), "{inj:#}");
    assert_eq!(inj["gids"], json!([44]));
    assert!(inj["mounts"].as_array().unwrap().len() >= 4, "{inj:#}");

    for (what, spec) in [
        ("variable with CDI name", &by_name),
        ("variable with CDI UUID name", &by_uuid),
        ("cdi.k8s.io annotation", &by_annotation),
    ] {
        assert_eq!(injected(spec), inj, "{what}");
        assert_eq!(without_request(spec), without_request(&by_var), "{what}");
    }

    // Plain items and CDI names mixed in one variable.
    let mixed_var =
        node.create_ok(&node.bundle("mix-var", &["NVIDIA_VISIBLE_DEVICES=0,1"], Value::Null));
    let mixed = node.create_ok(&node.bundle(
        "mix",
        &["NVIDIA_VISIBLE_DEVICES=0,nvidia.com/gpu=1"],
        Value::Null,
    ));
    assert_eq!(injected(&mixed), injected(&mixed_var));
    assert_eq!(injected(&mixed)["devices"].as_array().unwrap().len(), 3);

    // Enflame, two devices and `all`, by variable and by names.
    let var = node.create_ok(&node.bundle("ef-var", &["ENFLAME_VISIBLE_DEVICES=1,3"], Value::Null));
    let names = node.create_ok(&node.bundle(
        "ef-names",
        &["ENFLAME_VISIBLE_DEVICES=enflame.com/gcu=1,enflame.com/gcu=3"],
        Value::Null,
    ));
    assert_eq!(injected(&names), injected(&var));
    assert_eq!(injected(&var)["devices"].as_array().unwrap().len(), 3);
    let all_var =
        node.create_ok(&node.bundle("ef-all", &["ENFLAME_VISIBLE_DEVICES=all"], Value::Null));
    let all_cdi = node.create_ok(&node.bundle(
        "ef-all-cdi",
        &[],
        json!({"cdi.k8s.io/ef": "enflame.com/gcu=all"}),
    ));
    assert_eq!(injected(&all_cdi), injected(&all_var));

    // A second create on an already edited bundle adds nothing (rules deduplicated,
    // nodes and mounts replaced in place).
    let b = node.dir.join("name");
    assert_eq!(node.create_ok(&b), by_name);
}

#[test]
fn bad_cdi_requests_leave_config_untouched() {
    let node = node();
    node.generate();
    let check = |name: &str, env: &[&str], ann: Value, want: &[&str]| {
        let b = node.bundle(name, env, ann);
        let before = std::fs::read(b.join("config.json")).unwrap();
        let (ok, stderr, _) = node.create(&b);
        assert!(!ok, "{name}: create succeeded");
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{name}: one line: {stderr}"
        );
        for w in want {
            assert!(stderr.contains(w), "{name}: {w:?} not in {stderr}");
        }
        assert_eq!(
            std::fs::read(b.join("config.json")).unwrap(),
            before,
            "{name}: config.json changed"
        );
    };
    let dirs = format!(
        "{}, {}",
        node.cdi_dirs[0].display(),
        node.cdi_dirs[1].display()
    );
    check(
        "unknown",
        &["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=7"],
        Value::Null,
        &[
            "NVIDIA_VISIBLE_DEVICES: unknown CDI device \"nvidia.com/gpu=7\"",
            &dirs,
        ],
    );
    check(
        "bad-annotation",
        &[],
        json!({"cdi.k8s.io/x": "nvidia.com/gpu=0,../../etc/shadow"}),
        &["annotation \"cdi.k8s.io/x\": \"../../etc/shadow\" is not a fully-qualified CDI device name"],
    );

    // A higher-priority file that redefines a device wins; here it names a plain file as the
    // host node, a hook, and a relative mount destination (the last makes it invalid).
    let later = &node.cdi_dirs[1];
    std::fs::write(
        later.join("override.yaml"),
        format!(
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n    - {{path: /dev/nvidia0, hostPath: {}}}\n- name: hooked\n  containerEdits:\n    deviceNodes:\n    - {{path: /dev/nvidia1, hostPath: {}}}\n    hooks:\n    - {{hookName: createContainer, path: /usr/bin/vendor-hook}}\n",
            node.config.display(),
            node.root.join("dev/nvidia1").display()
        ),
    )
    .unwrap();
    std::fs::write(
        later.join("invalid.yaml"),
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: evil\n  containerEdits:\n    mounts:\n    - {hostPath: /etc/shadow, containerPath: ../../x}\n",
    )
    .unwrap();
    check(
        "not-a-device",
        &["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0"],
        Value::Null,
        &[
            "override.yaml: device /dev/nvidia0: host path",
            "is not a char or block device",
        ],
    );
    check(
        "hook",
        &[],
        json!({"cdi.k8s.io/h": "nvidia.com/gpu=hooked"}),
        &[
            "override.yaml: hooks are not supported",
            "createContainer hook /usr/bin/vendor-hook",
        ],
    );
    check(
        "invalid",
        &["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=evil"],
        Value::Null,
        &[
            "unknown CDI device \"nvidia.com/gpu=evil\"",
            "skipped invalid",
            "invalid.yaml",
            "containerPath",
        ],
    );
}

/// `accept-envvar-unprivileged = false` covers CDI annotations as well as the variable: both
/// are the container's own input, and both are ignored for an unprivileged container. The same requests from a privileged container pass.
#[test]
fn unprivileged_cdi_annotations_follow_the_envvar_policy() {
    let node = node();
    node.generate();
    let strict = node.dir.join("strict.toml");
    let text = std::fs::read_to_string(&node.config).unwrap();
    std::fs::write(
        &strict,
        format!("accept-envvar-unprivileged = false\n{text}"),
    )
    .unwrap();
    for (name, env, ann) in [
        ("ann", vec![], json!({"cdi.k8s.io/x": "nvidia.com/gpu=1"})),
        (
            "var",
            vec!["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1"],
            Value::Null,
        ),
    ] {
        let b = node.bundle(name, &env, ann.clone());
        let before = std::fs::read(b.join("config.json")).unwrap();
        // Ignored, not refused: the container starts with no device from it.
        let (ok, stderr, _) = node.create_with(&b, &strict);
        assert!(
            ok,
            "{name}: an ignored request stopped the container: {stderr}"
        );
        assert_eq!(
            std::fs::read(b.join("config.json")).unwrap(),
            before,
            "{name}: an unprivileged request was applied"
        );

        let p = node.bundle(&format!("{name}-privileged"), &env, ann);
        let mut spec = read_json(&p.join("config.json"));
        spec["process"]["capabilities"]["bounding"]
            .as_array_mut()
            .unwrap()
            .push(json!("CAP_SYS_ADMIN"));
        std::fs::write(p.join("config.json"), serde_json::to_vec(&spec).unwrap()).unwrap();
        let (ok, stderr, after) = node.create_with(&p, &strict);
        assert!(ok, "{name}: privileged create failed: {stderr}");
        assert!(
            after["linux"]["devices"]
                .to_string()
                .contains("/dev/nvidia1"),
            "{name}: {after}"
        );
    }
}

/// A third-party spec of the toolkit's shape loads (and lists), but a request for one of its
/// devices is refused because of its hook: one line naming the file and the hook.
#[test]
fn toolkit_style_spec_loads_and_its_hook_is_refused() {
    use accel_container_runtime::cdi::{self, Registry};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cdi");
    let reg = Registry::load(std::slice::from_ref(&dir));
    assert!(reg.invalid.is_empty(), "{:?}", reg.invalid);
    assert_eq!(
        reg.names(),
        [
            "nvidia.com/gpu=0",
            "nvidia.com/gpu=GPU-8f6b1c2e-0d7a-4f52-9c1e-3b0000000003",
            "nvidia.com/gpu=all"
        ]
    );
    let req = [(
        "NVIDIA_VISIBLE_DEVICES".to_string(),
        "nvidia.com/gpu=0".to_string(),
    )];
    let err = cdi::resolve(std::slice::from_ref(&dir), &req)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        format!(
            "CDI spec {}: hooks are not supported by this runtime (createContainer hook /usr/bin/nvidia-cdi-hook: this runtime runs no hook programs; see docs/cdi.md)",
            dir.join("toolkit-style.yaml").display()
        )
    );
}

/// A generator that sees the nodes but none of the driver's libraries (a plugin pod given
/// only /dev, issue 22, 7) refuses with one line naming the vendor, the root and what it
/// looked for; it never writes a spec that hands out devices frameworks cannot use.
#[test]
fn generate_refuses_a_spec_without_the_drivers_libraries() {
    let node = node();
    let libdir = node.root.join("usr/lib/x86_64-linux-gnu");
    for e in std::fs::read_dir(&libdir).unwrap() {
        let p = e.unwrap().path();
        if p.file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("libcuda")
            || p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("libnvidia-ml")
        {
            std::fs::remove_file(p).unwrap();
        }
    }
    let out_file = node.dir.join("nvidia.json");
    let out = node.ctk(&[
        "cdi",
        "generate",
        "--vendor",
        "nvidia",
        "--output",
        out_file.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "no nvidia driver library found under {} (looked for libcuda, ",
            node.root.display()
        )),
        "{err}"
    );
    assert!(!out_file.exists(), "no spec written");
    // Every vendor at once: the same refusal, not a spec with the others only.
    let out = node.ctk(&["cdi", "generate", "--output", node.dir.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no nvidia driver library found"));
    // Enflame's library is still there: its spec is written.
    node.ctk_ok(&["cdi", "generate", "--vendor", "enflame"]);
}
