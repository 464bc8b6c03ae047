//! Golden-file tests of `accel-ctk runtime configure|unconfigure`, run as the real binary on
//! copies of the operator files in `tests/fixtures/engine/`: the output must equal the golden
//! file, every byte outside the added entries must be the input's, a second configure must
//! change nothing, and unconfigure must give back the input byte for byte.
//!
//! `UPDATE_GOLDEN=1 cargo test --test engine_golden` rewrites the golden files (review the diff).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::CTK;

const RUNTIME_PATH: &str = "/usr/bin/accel-container-runtime";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/engine")
        .join(name)
}

fn ctk(args: &[&str]) -> Output {
    Command::new(&*CTK)
        .args(args)
        .output()
        .expect("running accel-ctk")
}

fn ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "accel-ctk failed: {stderr}");
    stderr
}

/// `accel-ctk runtime <verb> --runtime <engine> --config <file> ...`
fn run(verb: &str, engine: &str, file: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "runtime",
        verb,
        "--runtime",
        engine,
        "--config",
        file.to_str().unwrap(),
    ];
    if verb == "configure" {
        args.extend(["--runtime-path", RUNTIME_PATH]);
    }
    args.extend(extra);
    ctk(&args)
}

fn backup_of(file: &Path) -> PathBuf {
    PathBuf::from(format!("{}.accel-ctk.bak", file.display()))
}

fn check_golden(actual: &str, golden: &str) {
    let path = fixture(golden);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    assert_eq!(
        actual,
        expected,
        "output differs from {} (UPDATE_GOLDEN=1 rewrites it; review the diff)",
        path.display()
    );
}

/// `after` is `before` with one contiguous run of bytes inserted and nothing else changed;
/// returns the inserted text.
fn single_insertion<'a>(before: &str, after: &'a str) -> &'a str {
    let prefix = before
        .bytes()
        .zip(after.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    let suffix = before[prefix..]
        .bytes()
        .rev()
        .zip(after[prefix..].bytes().rev())
        .take_while(|(a, b)| a == b)
        .count();
    assert_eq!(
        prefix + suffix,
        before.len(),
        "output is not the input plus one inserted block:\n{after}"
    );
    &after[prefix..after.len() - suffix]
}

struct Case {
    engine: &'static str,
    input: &'static str,
    /// Golden files: registered, and registered as the default.
    configured: &'static str,
    default: &'static str,
    /// The default-runtime line before and after `--set-as-default`, where the input has one.
    default_line: Option<(&'static str, &'static str)>,
}

const DOCKER: Case = Case {
    engine: "docker",
    input: "daemon.json",
    configured: "daemon.configured.json",
    default: "daemon.default.json",
    default_line: Some((
        "\"default-runtime\": \"runc\"",
        "\"default-runtime\": \"accel\"",
    )),
};

const CONTAINERD_V2: Case = Case {
    engine: "containerd",
    input: "containerd-v2.toml",
    configured: "containerd-v2.configured.toml",
    default: "containerd-v2.default.toml",
    default_line: Some((
        "default_runtime_name = \"runc\"  # the operator's choice",
        "default_runtime_name = \"accel\"  # the operator's choice",
    )),
};

const CONTAINERD_V3: Case = Case {
    engine: "containerd",
    input: "containerd-v3.toml",
    configured: "containerd-v3.configured.toml",
    default: "containerd-v3.default.toml",
    default_line: Some((
        "default_runtime_name = 'runc'   # changed by the GPU rollout?",
        "default_runtime_name = \"accel\"   # changed by the GPU rollout?",
    )),
};

/// Debian 12's packaged file: no runtimes, no default (containerd's built-in runc is added
/// beside ours, see engine_containerd.rs).
const CONTAINERD_DEBIAN12: Case = Case {
    engine: "containerd",
    input: "containerd-debian12.toml",
    configured: "containerd-debian12.configured.toml",
    default: "containerd-debian12.default.toml",
    default_line: None,
};

/// Configure (plain, then as default) on a copy of the case's input; check both against the
/// golden files, idempotence, and the byte-exact undo.
fn golden_case(case: &Case) {
    let original = std::fs::read_to_string(fixture(case.input)).unwrap();
    for (extra, golden) in [
        (&[][..], case.configured),
        (&["--set-as-default"][..], case.default),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(case.input);
        std::fs::write(&file, &original).unwrap();

        let stderr = ok(&run("configure", case.engine, &file, extra));
        assert!(
            stderr.contains(&format!("systemctl restart {}", case.engine)),
            "no restart hint: {stderr}"
        );
        let configured = std::fs::read_to_string(&file).unwrap();
        check_golden(&configured, golden);
        assert!(configured.contains(RUNTIME_PATH));
        assert_eq!(
            std::fs::read_to_string(backup_of(&file)).unwrap(),
            original,
            "backup is not the previous file"
        );

        if extra.is_empty() {
            let added = single_insertion(&original, &configured);
            assert!(added.contains("accel"), "inserted block: {added}");
        } else if let Some((before, after)) = case.default_line {
            // As default: the same file as without, but for the default line.
            assert!(configured.contains(after), "{configured}");
            let plain = std::fs::read_to_string(fixture(case.configured)).unwrap();
            assert_eq!(configured.replacen(after, before, 1), plain);
        }

        // Idempotent: a second run changes nothing, not even the backup.
        let stderr = ok(&run("configure", case.engine, &file, extra));
        assert!(stderr.contains("nothing to do"), "{stderr}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), configured);
        assert_eq!(std::fs::read_to_string(backup_of(&file)).unwrap(), original);

        ok(&run("unconfigure", case.engine, &file, &[]));
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            original,
            "unconfigure did not restore the input byte for byte"
        );
        assert!(!backup_of(&file).exists(), "backup left behind");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "stray files: {names:?}");
    }
}

#[test]
fn docker_daemon_json_golden() {
    golden_case(&DOCKER);
}

#[test]
fn containerd_v2_golden() {
    golden_case(&CONTAINERD_V2);
}

#[test]
fn containerd_v3_golden() {
    golden_case(&CONTAINERD_V3);
}

#[test]
fn containerd_distro_default_golden() {
    golden_case(&CONTAINERD_DEBIAN12);
}

#[test]
fn plain_then_default_then_unconfigure_restores_input() {
    for case in [
        &DOCKER,
        &CONTAINERD_V2,
        &CONTAINERD_V3,
        &CONTAINERD_DEBIAN12,
    ] {
        let original = std::fs::read_to_string(fixture(case.input)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(case.input);
        std::fs::write(&file, &original).unwrap();
        ok(&run("configure", case.engine, &file, &[]));
        ok(&run("configure", case.engine, &file, &["--set-as-default"]));
        check_golden(&std::fs::read_to_string(&file).unwrap(), case.default);
        // Scripts may undo with configure's own flags; they change nothing.
        ok(&run(
            "unconfigure",
            case.engine,
            &file,
            &["--set-as-default", "--runtime-path", "/elsewhere"],
        ));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), original);
    }
}

#[test]
fn unconfigure_after_operator_edit_takes_out_only_ours() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    let original = std::fs::read_to_string(fixture("containerd-v2.toml")).unwrap();
    std::fs::write(&file, &original).unwrap();
    ok(&run(
        "configure",
        "containerd",
        &file,
        &["--set-as-default"],
    ));
    // The operator changes something unrelated after configure.
    let edited = std::fs::read_to_string(&file)
        .unwrap()
        .replace("oom_score = -999", "oom_score = -500");
    std::fs::write(&file, &edited).unwrap();
    let stderr = ok(&run("unconfigure", "containerd", &file, &[]));
    assert!(stderr.contains("changed since configure"), "{stderr}");
    let after = std::fs::read_to_string(&file).unwrap();
    assert_eq!(
        after,
        original.replace("oom_score = -999", "oom_score = -500")
    );
}

#[test]
fn invalid_json_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("daemon.json");
    let original = std::fs::read(fixture("invalid.json")).unwrap();
    std::fs::write(&file, &original).unwrap();
    let out = run("configure", "docker", &file, &["--set-as-default"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("{}: not valid JSON", file.display())),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), original);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn missing_daemon_json_is_created_and_removed_again() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("etc/docker/daemon.json");
    ok(&run("configure", "docker", &file, &["--create-parents"]));
    let text = std::fs::read_to_string(&file).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["runtimes"]["accel"]["path"], RUNTIME_PATH);
    ok(&run("unconfigure", "docker", &file, &[]));
    assert!(!file.exists());
}

#[test]
fn crio_drop_in_golden_and_removed_by_unconfigure() {
    let dir = tempfile::tempdir().unwrap();
    // crio.conf.d is often missing on a fresh CRI-O install.
    let file = dir.path().join("crio.conf.d/99-accel.conf");
    let stderr = ok(&run(
        "configure",
        "crio",
        &file,
        &["--set-as-default", "--create-parents"],
    ));
    assert!(stderr.contains("systemctl restart crio"), "{stderr}");
    check_golden(
        &std::fs::read_to_string(&file).unwrap(),
        "crio-99-accel.conf",
    );
    ok(&run("unconfigure", "crio", &file, &[]));
    assert!(!file.exists());
}

#[test]
fn dry_run_prints_the_file_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.toml");
    let original = std::fs::read_to_string(fixture("containerd-v3.toml")).unwrap();
    std::fs::write(&file, &original).unwrap();
    let out = run("configure", "containerd", &file, &["--dry-run"]);
    ok(&out);
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        std::fs::read_to_string(fixture("containerd-v3.configured.toml")).unwrap()
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), original);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn runtime_path_defaults_to_the_binary_beside_accel_ctk() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("daemon.json");
    ok(&ctk(&[
        "runtime",
        "configure",
        "--runtime",
        "docker",
        "--config",
        file.to_str().unwrap(),
        "--runtime-name",
        "gpu",
    ]));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let beside = Path::new(&*CTK).with_file_name("accel-container-runtime");
    assert_eq!(v["runtimes"]["gpu"]["path"], beside.to_str().unwrap());
}

#[test]
fn version_flag() {
    let out = ctk(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("accel-ctk {}\n", env!("CARGO_PKG_VERSION"))
    );
}
