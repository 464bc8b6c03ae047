//! Checks of everything under `packaging/` that cannot be run for real here (no registry, no
//! cluster): the Kubernetes manifests parse and hang together, the Kustomize layout names every
//! image in one place, the image script copies files that exist and builds what the packages
//! ship, every accel-ctk flag a script passes exists in the clap definition, the templates
//! parse and say what `accel-ctk runtime configure` writes, the package metadata names files
//! that exist. And `packaging/install.sh` run for real into a temp root (`--destdir`): install,
//! idempotent re-install, an operator's edit kept, uninstall giving back the engines' files
//! byte for byte. (tests/manifests.rs renders the overlays with kubectl and starts their
//! containers from the images the script builds.)

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::CTK;
use serde_yaml_ng::Value as Yaml;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn cargo_toml() -> toml::Table {
    toml::from_str(&read("Cargo.toml")).unwrap()
}

fn bin_names() -> BTreeSet<String> {
    cargo_toml()["bin"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The long flags `accel-ctk <args> --help` lists.
fn ctk_flags(args: &[&str]) -> BTreeSet<String> {
    let out = Command::new(&*CTK)
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    long_flags(&String::from_utf8(out.stdout).unwrap())
}

fn long_flags(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(str::to_owned)
        .collect()
}

/// Shell text with `\`-continued lines joined.
fn logical_lines(script: &str) -> Vec<String> {
    script
        .replace("\\\n", " ")
        .lines()
        .map(str::to_owned)
        .collect()
}

fn yaml_docs(rel: &str) -> Vec<Yaml> {
    let text = read(rel);
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| {
            serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{rel}: bad YAML: {e}"))
        })
        .collect()
}

fn s<'a>(v: &'a Yaml, path: &[&str]) -> &'a str {
    let mut cur = v;
    for k in path {
        cur = &cur[*k];
    }
    cur.as_str()
        .unwrap_or_else(|| panic!("{} is not a string", path.join(".")))
}

fn seq<'a>(v: &'a Yaml, key: &str) -> &'a Vec<Yaml> {
    v[key]
        .as_sequence()
        .unwrap_or_else(|| panic!("{key} is not a list"))
}

const IMAGES: &str = "packaging/build-images.sh";
const KUBE: &str = "packaging/kubernetes";
const RUNTIME: &str = "packaging/kubernetes/components/runtime/accel-runtime-installer.yaml";
const PLUGIN: &str = "packaging/kubernetes/components/device-plugin/accel-device-plugin.yaml";
const DRA: &str = "packaging/kubernetes/components/dra/accel-dra-driver.yaml";

/// What `packaging/build-images.sh` puts in its images from the repository: (source,
/// destination in the image), from its `put_file SOURCE "$root/DEST" MODE` lines.
fn image_files() -> Vec<(String, String)> {
    logical_lines(&read(IMAGES))
        .iter()
        .filter_map(|l| l.trim().strip_prefix("put_file "))
        .filter(|rest| !rest.starts_with('"'))
        .map(|rest| {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let dest = words[1]
                .trim_matches('"')
                .strip_prefix("$root")
                .unwrap_or_else(|| panic!("{IMAGES}: put_file outside the image root: {rest}"));
            (words[0].to_owned(), dest.to_owned())
        })
        .collect()
}

/// Every YAML file under `packaging/kubernetes/`, relative to the repository root.
fn kube_files() -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                out.push(p.strip_prefix(repo()).unwrap().to_str().unwrap().to_owned());
            }
        }
    }
    let mut files = Vec::new();
    walk(&repo().join(KUBE), &mut files);
    files.sort();
    files
}

/// The directories of `packaging/kubernetes/<kind>/` (`components`, `overlays`), sorted.
fn kube_dirs(kind: &str) -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(repo().join(KUBE).join(kind))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn kubernetes_manifests_hang_together() {
    let files = kube_files();
    assert!(files.len() >= 10, "{files:?}");
    // Every manifest parses and every document has the basic shape; a kustomization has none
    // of a resource's.
    for rel in &files {
        for doc in yaml_docs(rel) {
            assert!(!s(&doc, &["apiVersion"]).is_empty(), "{rel}");
            assert!(!s(&doc, &["kind"]).is_empty(), "{rel}");
            if !rel.ends_with("/kustomization.yaml") {
                assert!(!s(&doc, &["metadata", "name"]).is_empty(), "{rel}");
            }
        }
    }

    let base = yaml_docs("packaging/kubernetes/base/namespace.yaml");
    let ns = s(&base[0], &["metadata", "name"]);
    let docs = yaml_docs(RUNTIME);
    let by_kind: BTreeMap<&str, &Yaml> = docs.iter().map(|d| (s(d, &["kind"]), d)).collect();
    assert!(
        !by_kind.contains_key("Namespace"),
        "the namespace is the base's"
    );
    let sa = by_kind["ServiceAccount"];
    assert_eq!(s(sa, &["metadata", "namespace"]), ns);
    let rc = by_kind["RuntimeClass"];
    assert_eq!(s(rc, &["handler"]), "accel");

    let ds = by_kind["DaemonSet"];
    assert_eq!(s(ds, &["apiVersion"]), "apps/v1");
    assert_eq!(s(ds, &["metadata", "namespace"]), ns);
    let spec = &ds["spec"];
    let pod = &spec["template"]["spec"];
    // The selector selects the template.
    for (k, v) in spec["selector"]["matchLabels"].as_mapping().unwrap() {
        assert_eq!(
            &spec["template"]["metadata"]["labels"][k.as_str().unwrap()],
            v
        );
    }
    assert_eq!(
        s(pod, &["serviceAccountName"]),
        s(sa, &["metadata", "name"])
    );
    assert!(
        !pod["nodeSelector"].as_mapping().unwrap().is_empty(),
        "must select accelerator nodes only"
    );
    assert_eq!(
        pod["nodeSelector"], rc["scheduling"]["nodeSelector"],
        "RuntimeClass must schedule onto the nodes the DaemonSet installs on"
    );
    assert!(!seq(pod, "tolerations").is_empty());
    assert_eq!(
        pod["hostPID"].as_bool(),
        Some(true),
        "nsenter needs hostPID"
    );

    let volumes: BTreeMap<&str, &str> = seq(pod, "volumes")
        .iter()
        .map(|v| (s(v, &["name"]), s(v, &["hostPath", "path"])))
        .collect();
    assert!(volumes.values().any(|p| *p == "/etc/containerd"));

    let entrypoint = read("packaging/container/entrypoint.sh");
    let entry_dest = image_files()
        .into_iter()
        .find(|(src, _)| src == "packaging/container/entrypoint.sh")
        .map(|(_, d)| d)
        .expect("the installer image has the entrypoint");
    let init = &seq(pod, "initContainers")[0];
    assert_eq!(init["securityContext"]["privileged"].as_bool(), Some(true));
    let command: Vec<&str> = seq(init, "command")
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(command, [entry_dest.as_str(), "install"]);
    assert!(entrypoint.contains("install) install_runtime"));

    let env: BTreeMap<&str, &str> = seq(init, "env")
        .iter()
        .map(|e| (s(e, &["name"]), s(e, &["value"])))
        .collect();
    for name in env.keys() {
        assert!(
            entrypoint.contains(&format!("{name}=\"${{{name}:-")),
            "entrypoint.sh does not read {name}"
        );
    }
    // Each mount is HOST_ROOT + the node path of its hostPath volume, and the directories the
    // entrypoint writes to are mounted.
    let host_root = env["HOST_ROOT"];
    let mounts: Vec<&str> = seq(init, "volumeMounts")
        .iter()
        .map(|m| {
            let path = s(m, &["mountPath"]);
            let node = volumes[s(m, &["name"])];
            assert_eq!(path, format!("{host_root}{node}"));
            path
        })
        .collect();
    for node_dir in [
        env["INSTALL_DIR"],
        "/etc/accel-container-runtime",
        Path::new(env["CONTAINERD_CONFIG"])
            .parent()
            .unwrap()
            .to_str()
            .unwrap(),
    ] {
        assert!(
            mounts.contains(&format!("{host_root}{node_dir}").as_str()),
            "{node_dir} is not mounted"
        );
    }
    for c in seq(pod, "containers")
        .iter()
        .chain(seq(pod, "initContainers"))
    {
        // The name the base's images list turns into a registry, name and tag.
        assert_eq!(s(c, &["image"]), "accel-container-runtime");
    }
}

#[test]
fn scripts_pass_only_flags_accel_ctk_has() {
    let configure = ctk_flags(&["runtime", "configure"]);
    let unconfigure = ctk_flags(&["runtime", "unconfigure"]);
    let mut checked = 0;
    for rel in [
        "packaging/container/entrypoint.sh",
        "packaging/scripts/engines.sh",
    ] {
        let mut in_configure_args = false;
        for line in logical_lines(&read(rel)) {
            let known = if line.contains("runtime configure") {
                in_configure_args = true;
                &configure
            } else if line.contains("runtime unconfigure") {
                &unconfigure
            } else if in_configure_args && line.contains("set -- \"$@\"") {
                // More arguments appended to an accel-ctk command line built with `set --`.
                &configure
            } else {
                continue;
            };
            for flag in long_flags(&line) {
                assert!(
                    known.contains(&flag),
                    "{rel}: accel-ctk has no {flag}: {line}"
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 10,
        "found only {checked} flags: the scan is broken"
    );
}

/// Issue 36: what the image script puts in its images from the repository exists.
#[test]
fn image_script_copies_what_exists() {
    let files = image_files();
    assert!(files.len() >= 2, "{files:?}");
    for (src, dest) in &files {
        assert!(repo().join(src).is_file(), "{IMAGES}: {src} does not exist");
        assert!(dest.starts_with('/'), "{IMAGES}: {dest}");
    }
    let script = read(IMAGES);
    assert!(
        script.contains("for p in config/profiles/*.toml; do"),
        "the installer image carries every profile"
    );
}

/// The words of the `cargo build` command in `line` (to the next `&&`), quotes removed.
fn cargo_build_words(line: &str) -> Vec<String> {
    let at = line
        .find("cargo build")
        .unwrap_or_else(|| panic!("no cargo build in {line:?}"));
    let end = line[at..].find("&&").map_or(line.len(), |e| at + e);
    line[at..end]
        .split_whitespace()
        .map(|w| w.replace('"', ""))
        .collect()
}

/// The `cargo build` commands of a script that builds with `RUSTFLAGS="$rustflags"`, and
/// asserts that it takes those flags and the target from `packaging/target.sh`.
fn shipped_builds(rel: &str) -> Vec<Vec<String>> {
    let lines = logical_lines(&read(rel));
    for want in [
        r#"triple="$(bash packaging/target.sh)""#,
        r#"rustflags="$(bash packaging/target.sh --rustflags)""#,
    ] {
        assert!(
            lines.iter().any(|l| l.trim() == want),
            "{rel}: no line {want}"
        );
    }
    lines
        .iter()
        .filter(|l| l.contains(r#"RUSTFLAGS="$rustflags" cargo build"#))
        .map(|l| cargo_build_words(l))
        .collect()
}

/// Issue 17, issue 22 (item 3) and issue 36: the images hold the binaries the packages ship.
/// The image script builds exactly the commands `packaging/build-packages.sh` runs (same
/// target and RUSTFLAGS from `target.sh`, same flags), one for each image's binaries, and
/// refuses a binary with a program interpreter (tests/manifests.rs runs it on the shipped
/// build in `.ci/run`).
#[test]
fn image_script_builds_what_the_packages_ship() {
    let packages = shipped_builds("packaging/build-packages.sh");
    let images = shipped_builds(IMAGES);
    assert_eq!(images.len(), 4, "{images:?}");
    for words in &images {
        assert!(
            packages.contains(words),
            "{IMAGES} builds {words:?}, which is none of build-packages.sh's {packages:?}"
        );
        for w in ["--release", "--locked", "--target", "$triple"] {
            assert!(words.iter().any(|x| x == w), "{w} missing from {words:?}");
        }
    }
    let with = |feature: &str, bin: &str| {
        images.iter().any(|w| {
            w.windows(2).any(|p| p == ["--features", feature])
                && w.windows(2).any(|p| p == ["--bin", bin])
        })
    };
    assert!(with("plugin", "accel-device-plugin"));
    assert!(with("plugin", "accel-nri-plugin"));
    assert!(with("dra", "accel-dra-driver"));
    assert!(with("exporter", "accel-exporter"));
    assert!(with("plugin", "accel-ctk"));
    let script = read(IMAGES);
    assert!(script.contains("'Requesting program interpreter'"));
    assert!(script.contains("strip \"$2\""));
}

/// Issue 42 item 4: `accel-ctk pods` is documented, but the packages built accel-ctk without
/// the feature that has it (`plugin`: kubelet's protocols). Every script that builds a shipped
/// accel-ctk (the packages, the images, install.sh) builds it with that feature, and none
/// builds all binaries at once without it (`--bins`, which would make one without);
/// build-packages.sh then runs each subcommand the docs name on the packaged binary.
#[test]
fn packaged_accel_ctk_has_every_subcommand_the_docs_name() {
    for rel in [
        "packaging/build-packages.sh",
        IMAGES,
        "packaging/install.sh",
    ] {
        let builds: Vec<Vec<String>> = logical_lines(&read(rel))
            .iter()
            .filter(|l| l.contains("cargo build") && !l.trim_start().starts_with('#'))
            .map(|l| {
                // install.sh runs each in a subshell: `(cd "$src" && ... --bin accel-ctk)`.
                cargo_build_words(l)
                    .into_iter()
                    .map(|w| w.trim_end_matches(')').to_string())
                    .collect()
            })
            .collect();
        let ctk: Vec<&Vec<String>> = builds
            .iter()
            .filter(|w| w.windows(2).any(|p| p == ["--bin", "accel-ctk"]))
            .collect();
        assert_eq!(ctk.len(), 1, "{rel}: accel-ctk built by {ctk:?}");
        assert!(
            ctk[0].windows(2).any(|p| p == ["--features", "plugin"]),
            "{rel}: accel-ctk built without the plugin feature: {:?}",
            ctk[0]
        );
        assert!(
            !builds.iter().any(|w| w.iter().any(|x| x == "--bins")),
            "{rel}: a --bins build: {builds:?}"
        );
    }
    // The docs' subcommands, as build-packages.sh finds them, include the one behind the
    // feature, and the script checks them.
    let script = read("packaging/build-packages.sh");
    assert!(
        script.contains(r#"grep -ohE '(`|^ *(sudo )?)accel-ctk [a-z][a-z-]+' README.md docs/*.md"#)
    );
    assert!(script.contains(r#""target/$triple/release/accel-ctk" "$sub" --help"#));
    let docs = std::fs::read_to_string(repo().join("docs/operating.md")).unwrap();
    assert!(docs.contains("accel-ctk pods"));
}

/// The base's `images:` list as (name, newName, newTag).
fn base_images() -> Vec<(String, String, String)> {
    let k = &yaml_docs("packaging/kubernetes/base/kustomization.yaml")[0];
    seq(k, "images")
        .iter()
        .map(|i| {
            (
                s(i, &["name"]).to_owned(),
                s(i, &["newName"]).to_owned(),
                s(i, &["newTag"]).to_owned(),
            )
        })
        .collect()
}

/// Every `image:` of a container in `doc` (a workload, however deep its pod template).
fn container_images(doc: &Yaml, out: &mut Vec<String>) {
    match doc {
        Yaml::Mapping(m) => {
            for (k, v) in m {
                if k.as_str() == Some("image") {
                    if let Some(i) = v.as_str() {
                        out.push(i.to_owned());
                    }
                }
                container_images(v, out);
            }
        }
        Yaml::Sequence(s) => s.iter().for_each(|v| container_images(v, out)),
        _ => {}
    }
}

/// Issue 36, "one way to deploy": the overlays are Kustomize kustomizations of components, the
/// base (a component every overlay lists last, so its transformers reach every object) names
/// every image and its tag in one place, with the crate's version, and the resources name
/// images only by the names that list turns into references.
#[test]
fn kustomize_layout_names_every_image_in_one_place() {
    let version = cargo_toml()["package"]["version"]
        .as_str()
        .unwrap()
        .to_owned();
    let script = read(IMAGES);
    let ours: Vec<String> = script
        .lines()
        .find_map(|l| l.strip_prefix("all_images=\""))
        .expect("build-images.sh lists its images")
        .trim_end_matches('"')
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(ours.len(), 4, "{ours:?}");
    let listed = base_images();
    for (name, new_name, tag) in &listed {
        if ours.contains(name) {
            assert_eq!(
                new_name,
                &format!("ghcr.io/accel-container-runtime/{name}"),
                "the default is what a release publishes"
            );
            assert_eq!(tag, &version, "{name}: the tag is the crate's version");
        } else {
            assert_eq!(
                (name.as_str(), new_name.as_str()),
                ("pause", "registry.k8s.io/pause")
            );
        }
    }
    let names: BTreeSet<&str> = listed.iter().map(|(n, _, _)| n.as_str()).collect();
    for image in &ours {
        assert!(
            names.contains(image.as_str()),
            "{image} is not in the base's images"
        );
    }

    // Every image a resource names is one the list names, and every listed one is used.
    let mut used = BTreeSet::new();
    for rel in kube_files() {
        for doc in yaml_docs(&rel) {
            let mut images = Vec::new();
            container_images(&doc, &mut images);
            for i in images {
                assert!(
                    names.contains(i.as_str()),
                    "{rel}: image {i} is not a name of the base's images list"
                );
                used.insert(i);
            }
        }
    }
    assert_eq!(
        used.iter().map(String::as_str).collect::<BTreeSet<_>>(),
        names
    );

    // The base is the only place with images, labels or a namespace; components are
    // Components; overlays compose components and end with the base.
    let kustomization = |rel: String| -> Yaml { yaml_docs(&rel).remove(0) };
    let base = kustomization(format!("{KUBE}/base/kustomization.yaml"));
    assert_eq!(s(&base, &["kind"]), "Component");
    let components = kube_dirs("components");
    for c in &components {
        let k = kustomization(format!("{KUBE}/components/{c}/kustomization.yaml"));
        assert_eq!(s(&k, &["kind"]), "Component", "{c}");
        for key in ["images", "labels", "commonLabels", "namespace"] {
            assert!(
                k[key].is_null(),
                "components/{c} sets {key}: the base's alone"
            );
        }
    }
    let mut in_overlays = BTreeSet::new();
    let overlays = kube_dirs("overlays");
    assert!(overlays.len() >= 4, "{overlays:?}");
    for o in &overlays {
        let k = kustomization(format!("{KUBE}/overlays/{o}/kustomization.yaml"));
        assert_eq!(s(&k, &["kind"]), "Kustomization", "{o}");
        for key in ["resources", "images", "labels", "commonLabels", "namespace"] {
            assert!(k[key].is_null(), "overlays/{o} sets {key}");
        }
        let list: Vec<&str> = seq(&k, "components")
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        assert_eq!(list.last(), Some(&"../../base"), "{o}: the base comes last");
        for c in &list[..list.len() - 1] {
            let name = c
                .strip_prefix("../../components/")
                .unwrap_or_else(|| panic!("{o}: {c} is not one of components/"));
            assert!(components.iter().any(|x| x == name), "{o}: no {c}");
            in_overlays.insert(name.to_owned());
        }
        // A node runs the runtime installer and at most one mode; an overlay never has both.
        // The NRI overlay is the one without the runtime: the node keeps its stock runtime,
        // and nothing (no runtime, no checkpoint unit) is installed on the host.
        let has = |c: &str| list.contains(&format!("../../components/{c}").as_str());
        if o == "nri" {
            assert!(has("nri") && has("device-plugin"), "{o}: {list:?}");
            assert!(
                !has("runtime") && !has("checkpoint"),
                "{o}: installs on the host"
            );
        } else {
            assert!(!has("nri"), "{o}: the NRI plugin beside the runtime");
            assert!(has("runtime"), "{o}: every overlay installs the runtime");
        }
        assert!(!(has("device-plugin") && has("dra")), "{o}: two modes");
    }
    assert_eq!(
        in_overlays.into_iter().collect::<Vec<_>>(),
        components,
        "a component no overlay uses is never rendered in CI"
    );
}

/// Issue 36: device-plugin mode and DRA mode never run on one node, however the overlays are
/// combined: each DaemonSet selects the nodes whose `accel-container-runtime/mode` label names
/// it, and a label has one value.
#[test]
fn the_modes_select_disjoint_nodes() {
    let mode = |rel: &str| -> String {
        let docs = yaml_docs(rel);
        let ds = docs
            .iter()
            .find(|d| s(d, &["kind"]) == "DaemonSet")
            .unwrap();
        let pod = &ds["spec"]["template"]["spec"];
        assert!(pod["affinity"].is_null(), "{rel}: the label alone selects");
        s(pod, &["nodeSelector", "accel-container-runtime/mode"]).to_owned()
    };
    assert_eq!(mode(PLUGIN), "device-plugin");
    assert_eq!(mode(DRA), "dra");
}

/// `build-images.sh --set-images` in a copy of the files it reads and writes, with `args`.
fn set_images(args: &[&str]) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let copy = |rel: &str| {
        let to = dir.path().join(rel);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(repo().join(rel), &to).unwrap();
    };
    for rel in [
        IMAGES,
        "Cargo.toml",
        "packaging/kubernetes/base/kustomization.yaml",
    ] {
        copy(rel);
    }
    let out = Command::new("bash")
        .arg(dir.path().join(IMAGES))
        .arg("--set-images")
        .args(args)
        .env("PATH", "/usr/bin:/bin")
        .env("CARGO", "/nonexistent")
        .output()
        .unwrap();
    let after = std::fs::read_to_string(
        dir.path()
            .join("packaging/kubernetes/base/kustomization.yaml"),
    )
    .unwrap();
    (
        out.status.code(),
        after,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Issue 36: `build-images.sh --push` names what it pushed in the base's images list, the
/// way `kustomize edit set image` would, and nothing else there; without images named, all
/// three; a registry that is not one is refused before anything is written.
#[test]
fn set_images_names_the_pushed_images_in_the_one_list() {
    let before = read("packaging/kubernetes/base/kustomization.yaml");
    let version = cargo_toml()["package"]["version"]
        .as_str()
        .unwrap()
        .to_owned();
    let (code, after, err) = set_images(&[
        "--registry",
        "registry.example.com:5000/team",
        "accel-device-plugin",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let changed: Vec<(&str, &str)> = before
        .lines()
        .zip(after.lines())
        .filter(|(a, b)| a != b)
        .collect();
    assert_eq!(
        changed,
        [(
            "  newName: ghcr.io/accel-container-runtime/accel-device-plugin",
            "  newName: registry.example.com:5000/team/accel-device-plugin"
        )]
    );
    assert_eq!(before.lines().count(), after.lines().count());

    let (code, after, err) = set_images(&["--registry", "r.example/x"]);
    assert_eq!(code, Some(0), "{err}");
    let images: BTreeMap<String, (String, String)> = serde_yaml_ng::from_str::<Yaml>(&after)
        .unwrap()["images"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|i| {
            (
                s(i, &["name"]).to_owned(),
                (s(i, &["newName"]).to_owned(), s(i, &["newTag"]).to_owned()),
            )
        })
        .collect();
    for name in [
        "accel-container-runtime",
        "accel-device-plugin",
        "accel-dra-driver",
        "accel-exporter",
    ] {
        assert_eq!(
            images[name],
            (format!("r.example/x/{name}"), version.clone())
        );
    }
    assert_eq!(images["pause"].0, "registry.k8s.io/pause");

    for bad in ["Registry.Example", "r.example/x/", "r.example x", "-r"] {
        let (code, after, err) = set_images(&["--registry", bad]);
        assert_eq!(code, Some(2), "{bad}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert_eq!(after, before, "{bad}");
    }
}

/// `accel-ctk runtime configure --dry-run` output for a config file holding `start`
/// (None: a missing file).
fn dry_run(engine: &str, start: Option<&str>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config");
    if let Some(text) = start {
        std::fs::write(&file, text).unwrap();
    }
    let out = Command::new(&*CTK)
        .args(["runtime", "configure", "--runtime", engine, "--config"])
        .arg(&file)
        .args([
            "--runtime-path",
            "/usr/bin/accel-container-runtime",
            "--dry-run",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn toml_at<'a>(t: &'a toml::Table, path: &[&str]) -> &'a toml::Value {
    let mut cur = &t[path[0]];
    for k in &path[1..] {
        cur = &cur[*k];
    }
    cur
}

#[test]
fn templates_parse_and_match_what_configure_writes() {
    let daemon = read("packaging/docker/daemon.json");
    let _: serde_json::Value = serde_json::from_str(&daemon).unwrap();
    assert_eq!(daemon, dry_run("docker", None));

    for (rel, version, plugin) in [
        (
            "packaging/containerd/config-v2.toml",
            2,
            "io.containerd.grpc.v1.cri",
        ),
        (
            "packaging/containerd/config-v3.toml",
            3,
            "io.containerd.cri.v1.runtime",
        ),
    ] {
        let template: toml::Table = toml::from_str(&read(rel)).unwrap();
        assert_eq!(template["version"].as_integer(), Some(version), "{rel}");
        let written: toml::Table = toml::from_str(&dry_run(
            "containerd",
            Some(&format!("version = {version}\n")),
        ))
        .unwrap();
        let path = ["plugins", plugin, "containerd", "runtimes"];
        assert_eq!(
            toml_at(&template, &path),
            toml_at(&written, &path),
            "{rel} differs from what accel-ctk writes"
        );
    }

    let template: toml::Table = toml::from_str(&read("packaging/crio/99-accel.conf")).unwrap();
    let written: toml::Table = toml::from_str(&dry_run("crio", None)).unwrap();
    assert_eq!(
        template["crio"]["runtime"]["runtimes"],
        written["crio"]["runtime"]["runtimes"]
    );
}

#[test]
fn package_metadata_names_real_files() {
    let cargo = cargo_toml();
    let meta = &cargo["package"]["metadata"];
    let bins = bin_names();
    let check_source = |src: &str| match src.strip_prefix("target/release/") {
        Some(name) => assert!(bins.contains(name), "{name} is not a [[bin]]"),
        None => assert!(repo().join(src).is_file(), "package asset {src} missing"),
    };

    let deb = &meta["deb"];
    let mut deb_dests = BTreeSet::new();
    for a in deb["assets"].as_array().unwrap() {
        let a = a.as_array().unwrap();
        check_source(a[0].as_str().unwrap());
        deb_dests.insert(a[1].as_str().unwrap().to_owned());
    }
    let scripts = repo().join(deb["maintainer-scripts"].as_str().unwrap());
    for s in ["postinst", "prerm", "postrm"] {
        let mode = std::fs::metadata(scripts.join(s))
            .unwrap()
            .permissions()
            .mode();
        assert!(mode & 0o111 != 0, "{s} is not executable");
    }

    let rpm = &meta["generate-rpm"];
    let mut rpm_dests = BTreeSet::new();
    for a in rpm["assets"].as_array().unwrap() {
        let src = a["source"].as_str().unwrap();
        let dest = a["dest"].as_str().unwrap();
        check_source(src);
        if dest.starts_with("/etc/") {
            assert_eq!(
                a.get("config").and_then(|c| c.as_str()),
                Some("noreplace"),
                "{dest} must be %config(noreplace)"
            );
        }
        rpm_dests.insert(dest.trim_start_matches('/').to_owned());
    }
    for s in ["post_install_script", "pre_uninstall_script"] {
        assert!(repo().join(rpm[s].as_str().unwrap()).is_file(), "{s}");
    }
    assert_eq!(
        deb_dests, rpm_dests,
        "the .deb and .rpm ship different files"
    );
    // Every file profile ships; the compiled-in ones don't.
    for p in std::fs::read_dir(repo().join("config/profiles")).unwrap() {
        let name = p.unwrap().file_name().into_string().unwrap();
        let dest = format!("etc/accel-container-runtime/profiles.d/{name}");
        let builtin = name == "nvidia.toml" || name == "enflame.toml";
        assert_eq!(deb_dests.contains(&dest), !builtin, "{dest}");
    }
}

/// Every regular file and link under `root`, with its content (a link: its target).
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_owned();
            if meta.is_dir() {
                stack.push(p);
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&p).unwrap();
                out.insert(rel, target.into_os_string().into_encoded_bytes());
            } else {
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn install_sh(root: &Path, extra: &[&str]) -> String {
    let bin_dir = Path::new(CTK.as_str()).parent().unwrap();
    assert!(bin_dir.join("accel-container-runtime").is_file());
    let out = Command::new("sh")
        .arg(repo().join("packaging/install.sh"))
        .arg("--destdir")
        .arg(root)
        .arg("--no-build")
        .arg("--bin-dir")
        .arg(bin_dir)
        .args(["--engines", "docker containerd crio"])
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "install.sh {extra:?} failed:\n{stderr}"
    );
    assert!(out.stdout.is_empty(), "stdout: {:?}", out.stdout);
    stderr
}

#[test]
fn install_sh_installs_reinstalls_and_uninstalls_into_a_destdir() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let daemon = root.join("etc/docker/daemon.json");
    let containerd = root.join("etc/containerd/config.toml");
    std::fs::create_dir_all(daemon.parent().unwrap()).unwrap();
    std::fs::create_dir_all(containerd.parent().unwrap()).unwrap();
    let daemon_before = "{\n    \"log-driver\": \"journald\"\n}\n";
    std::fs::write(&daemon, daemon_before).unwrap();
    let containerd_before = read("tests/fixtures/engine/containerd-debian12.toml");
    std::fs::write(&containerd, &containerd_before).unwrap();

    let log = install_sh(root, &[]);
    assert!(log.contains("systemctl restart docker"), "{log}");
    let bin = root.join("usr/bin");
    for b in ["accel-container-runtime", "accel-ctk"] {
        let mode = std::fs::metadata(bin.join(b)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755, "{b}");
    }
    assert_eq!(
        std::fs::read_link(bin.join("nvidia-container-runtime-hook")).unwrap(),
        Path::new("accel-container-runtime")
    );
    // Called by that name (docker's --gpus prestart hook run by plain runc), the runtime says
    // it was bypassed, on one line, and fails.
    let hook = Command::new(bin.join("nvidia-container-runtime-hook"))
        .arg("prestart")
        .output()
        .unwrap();
    assert_eq!(hook.status.code(), Some(1));
    assert!(hook.stdout.is_empty());
    let msg = String::from_utf8_lossy(&hook.stderr);
    assert_eq!(msg.lines().count(), 1, "{msg}");
    assert!(msg.contains("--runtime accel"), "{msg}");
    let etc = root.join("etc/accel-container-runtime");
    assert_eq!(
        std::fs::read_to_string(etc.join("config.toml")).unwrap(),
        read("config/config.toml")
    );
    let profiles: BTreeSet<String> = std::fs::read_dir(etc.join("profiles.d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let shipped: BTreeSet<String> = std::fs::read_dir(repo().join("config/profiles"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "nvidia.toml" && n != "enflame.toml")
        .collect();
    assert_eq!(profiles, shipped);
    assert!(root.join("var/log").is_dir());
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&daemon).unwrap()).unwrap();
    assert_eq!(d["log-driver"], "journald");
    assert_eq!(
        d["runtimes"]["accel"]["path"], "/usr/bin/accel-container-runtime",
        "the path written is the final one, not under --destdir"
    );
    assert!(std::fs::read_to_string(&containerd)
        .unwrap()
        .contains("BinaryName = \"/usr/bin/accel-container-runtime\""));
    let crio = root.join("etc/crio/crio.conf.d/99-accel.conf");
    assert!(std::fs::read_to_string(&crio)
        .unwrap()
        .contains("runtime_path = \"/usr/bin/accel-container-runtime\""));

    // Idempotent: a second run leaves every file as it was.
    let first = snapshot(root);
    install_sh(root, &[]);
    assert_eq!(snapshot(root), first);

    // The operator's config edit survives a re-install; the shipped file goes beside it.
    let edited =
        read("config/config.toml").replace("log-level = \"info\"", "log-level = \"debug\"");
    std::fs::write(etc.join("config.toml"), &edited).unwrap();
    let log = install_sh(root, &[]);
    assert!(log.contains("kept"), "{log}");
    assert_eq!(
        std::fs::read_to_string(etc.join("config.toml")).unwrap(),
        edited
    );
    assert_eq!(
        std::fs::read_to_string(etc.join("config.toml.new")).unwrap(),
        read("config/config.toml")
    );

    install_sh(root, &["--uninstall"]);
    assert_eq!(std::fs::read_to_string(&daemon).unwrap(), daemon_before);
    assert_eq!(
        std::fs::read_to_string(&containerd).unwrap(),
        containerd_before
    );
    assert!(!crio.exists());
    assert!(std::fs::symlink_metadata(bin.join("nvidia-container-runtime-hook")).is_err());
    assert!(!bin.join("accel-ctk").exists());
    assert!(!bin.join("accel-container-runtime").exists());
    // The operator's config stays; what was still as shipped goes.
    let left: Vec<PathBuf> = snapshot(root)
        .into_keys()
        .filter(|p| p.starts_with("etc/accel-container-runtime"))
        .collect();
    assert_eq!(
        left,
        [PathBuf::from("etc/accel-container-runtime/config.toml")]
    );
}

#[test]
fn install_sh_never_touches_an_existing_hook() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let hook = root.join("usr/bin/nvidia-container-runtime-hook");
    std::fs::create_dir_all(hook.parent().unwrap()).unwrap();
    std::fs::write(&hook, "#!/bin/sh\n# NVIDIA's\n").unwrap();
    install_sh(root, &["--engines", "none"]);
    assert_eq!(
        std::fs::read_to_string(&hook).unwrap(),
        "#!/bin/sh\n# NVIDIA's\n"
    );
    install_sh(root, &["--engines", "none", "--uninstall"]);
    assert_eq!(
        std::fs::read_to_string(&hook).unwrap(),
        "#!/bin/sh\n# NVIDIA's\n"
    );
    assert!(!root.join("usr/bin/accel-ctk").exists());
}

/// The installer image's entrypoint, run outside a container: the image layout and the
/// node's root are temp dirs, and containerd is not restarted (RESTART_CONTAINERD=false).
fn entrypoint(image: &Path, host: &Path, mode: &str) -> String {
    let out = Command::new("sh")
        .arg(repo().join("packaging/container/entrypoint.sh"))
        .arg(mode)
        .env("ACCEL_IMAGE_DIR", image)
        .env("HOST_ROOT", host)
        .env("RESTART_CONTAINERD", "false")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "entrypoint {mode} failed:\n{stderr}");
    stderr
}

#[test]
fn image_entrypoint_installs_on_the_node_and_uninstalls() {
    let dir = tempfile::tempdir().unwrap();
    // The image, laid out as packaging/build-images.sh lays it out (ACCEL_IMAGE_DIR).
    let image = dir.path().join("image");
    let bin_dir = Path::new(CTK.as_str()).parent().unwrap();
    std::fs::create_dir_all(image.join("bin")).unwrap();
    std::fs::create_dir_all(image.join("etc/profiles")).unwrap();
    for b in ["accel-container-runtime", "accel-ctk"] {
        std::fs::copy(bin_dir.join(b), image.join("bin").join(b)).unwrap();
    }
    std::fs::copy(
        repo().join("config/config.toml"),
        image.join("etc/config.toml"),
    )
    .unwrap();
    for p in std::fs::read_dir(repo().join("config/profiles")).unwrap() {
        let p = p.unwrap().path();
        std::fs::copy(&p, image.join("etc/profiles").join(p.file_name().unwrap())).unwrap();
    }
    // The node.
    let host = dir.path().join("host");
    let containerd = host.join("etc/containerd/config.toml");
    std::fs::create_dir_all(containerd.parent().unwrap()).unwrap();
    let before = read("tests/fixtures/engine/containerd-v2.toml");
    std::fs::write(&containerd, &before).unwrap();

    let log = entrypoint(&image, &host, "install");
    assert!(log.contains("restart containerd on the node"), "{log}");
    let installed = host.join("usr/local/accel-container-runtime");
    for b in ["accel-container-runtime", "accel-ctk"] {
        assert_eq!(
            std::fs::read(installed.join(b)).unwrap(),
            std::fs::read(bin_dir.join(b)).unwrap()
        );
    }
    let after = std::fs::read_to_string(&containerd).unwrap();
    assert!(
        after.contains(
            "BinaryName = \"/usr/local/accel-container-runtime/accel-container-runtime\""
        ),
        "{after}"
    );
    let etc = host.join("etc/accel-container-runtime");
    assert!(etc.join("config.toml").is_file());
    // Kubernetes defaults (issue 17): device lists only from the plugin's mounts, the
    // variable of an unprivileged container ignored; every other line as shipped.
    let written = std::fs::read_to_string(etc.join("config.toml")).unwrap();
    let shipped = read("config/config.toml");
    let changed: Vec<(&str, &str)> = shipped
        .lines()
        .zip(written.lines())
        .filter(|(a, b)| a != b)
        .collect();
    assert_eq!(
        changed,
        [
            (
                "accept-envvar-unprivileged = true",
                "accept-envvar-unprivileged = false"
            ),
            (
                "accept-container-devices-as-mounts = false",
                "accept-container-devices-as-mounts = true"
            )
        ],
        "{written}"
    );
    assert_eq!(shipped.lines().count(), written.lines().count());
    assert!(etc.join("profiles.d/ascend.toml").is_file());
    assert!(!etc.join("profiles.d/nvidia.toml").exists());

    // A pod restart on an installed node changes nothing, so containerd is left alone.
    let log = entrypoint(&image, &host, "install");
    assert!(!log.contains("restart containerd"), "{log}");
    assert_eq!(std::fs::read_to_string(&containerd).unwrap(), after);

    entrypoint(&image, &host, "uninstall");
    assert_eq!(std::fs::read_to_string(&containerd).unwrap(), before);
    assert!(!installed.exists());
}

/// Issue 16 item 6: every script in packaging/ answers --help with its header and does
/// nothing else, and refuses an option it does not know (exit 2, one line naming it), instead
/// of handing it to mkdir and rm.
#[test]
fn packaging_scripts_take_help_and_reject_unknown_options() {
    let mut scripts: Vec<PathBuf> = std::fs::read_dir(repo().join("packaging"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "sh"))
        .collect();
    scripts.sort();
    assert!(scripts.len() >= 4, "{scripts:?}");
    for script in scripts {
        let name = script.file_name().unwrap().to_str().unwrap().to_owned();
        let run = |arg: &str| {
            let dir = tempfile::tempdir().unwrap();
            let out = Command::new("bash")
                .arg(&script)
                .arg(arg)
                .current_dir(dir.path())
                // Nothing may be built or installed: no cargo, no rustc on this PATH.
                .env("PATH", "/usr/bin:/bin")
                .env("CARGO", "/nonexistent")
                .output()
                .unwrap();
            (
                out.status.code(),
                String::from_utf8(out.stdout).unwrap(),
                String::from_utf8(out.stderr).unwrap(),
            )
        };
        let (code, stdout, stderr) = run("--help");
        assert_eq!(code, Some(0), "{name} --help: {stderr}");
        let first = read(&format!("packaging/{name}"))
            .lines()
            .nth(1)
            .unwrap()
            .trim_start_matches("# ")
            .to_owned();
        assert!(
            stdout.starts_with(&first),
            "{name} --help printed: {stdout}"
        );
        assert!(!stdout.contains("set -e"), "{name}: {stdout}");

        let (code, stdout, stderr) = run("--no-such-option");
        assert_eq!(code, Some(2), "{name}: {stdout}{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{name}: {stderr}");
        assert!(stderr.contains("'--no-such-option'"), "{name}: {stderr}");
    }
    assert!(
        !repo().join("--help").exists() && !repo().join("--no-such-option").exists(),
        "a script took an option for a directory"
    );
}

/// Issue 16 item 9: the binaries are static, so cargo-deb's `$auto` finds nothing and the
/// .deb's Depends would be empty; the low-level runtime it execs is named instead.
#[test]
fn deb_depends_on_a_low_level_runtime() {
    let cargo = cargo_toml();
    let depends = cargo["package"]["metadata"]["deb"]["depends"]
        .as_str()
        .unwrap();
    assert!(!depends.contains("$auto"), "{depends}");
    assert!(depends.split('|').any(|d| d.trim() == "runc"), "{depends}");
}

/// Issue 16 item 7: every apt-get of .ci/run and the packaging scripts waits for another
/// apt's lock: through `accel_apt_get` (packaging/scripts/apt.sh) or apt's own option.
#[test]
fn every_apt_get_waits_for_the_lock() {
    let mut files = vec![".ci/run".to_owned()];
    for dir in ["packaging", "packaging/scripts", "packaging/container"] {
        for e in std::fs::read_dir(repo().join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "sh") {
                files.push(p.strip_prefix(repo()).unwrap().display().to_string());
            }
        }
    }
    let mut calls = 0;
    for f in &files {
        for line in logical_lines(&read(f)) {
            let code = line.split('#').next().unwrap();
            if !code.contains("apt-get ") || code.trim_start().starts_with("echo") {
                continue;
            }
            calls += 1;
            assert!(
                code.contains("DPkg::Lock::Timeout="),
                "{f}: apt-get without the lock wait (use accel_apt_get): {line}"
            );
        }
        if read(f).contains("accel_apt_get ") {
            calls += 1;
        }
    }
    assert!(
        calls >= 3,
        "found {calls} apt-get calls: the scan is broken"
    );
}

/// `accel_apt_get` tries an update again while another apt holds the lists lock (apt's
/// option does not cover that lock), and returns any other failure at once. The apt-get here
/// is a stand-in on PATH that records its arguments; the real lock wait was tried by hand.
#[test]
fn accel_apt_get_retries_only_a_held_lock() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let stub = bin.join("apt-get");
    std::fs::write(
        &stub,
        r#"#!/bin/sh
echo "$*" >> "$CALLS"
n=$(wc -l < "$CALLS")
if [ "$MODE" = lock ] && [ "$n" -lt 3 ]; then
    echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 1 (apt-get)" >&2
    exit 100
fi
if [ "$MODE" = broken ]; then echo "E: The repository is not signed." >&2; exit 100; fi
exit 0
"#,
    )
    .unwrap();
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = |mode: &str| {
        let calls = dir.path().join(format!("calls-{mode}"));
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                ". {}/packaging/scripts/apt.sh && accel_apt_get update -q",
                repo().display()
            ))
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .env("CALLS", &calls)
            .env("MODE", mode)
            .env("ACCEL_APT_RETRY_SECONDS", "0")
            .output()
            .unwrap();
        let calls = std::fs::read_to_string(&calls).unwrap();
        (out.status.code(), calls)
    };
    let (code, calls) = run("lock");
    assert_eq!(code, Some(0));
    assert_eq!(
        calls,
        "-o DPkg::Lock::Timeout=600 update -q\n".repeat(3),
        "tried until the lock was free"
    );
    let (code, calls) = run("broken");
    assert_eq!(code, Some(100));
    assert_eq!(calls.lines().count(), 1, "no retry of another failure");
}

/// Issue 22, item 9: into an empty cache, `tests/vm/build-guest.sh` printed mke2fs's
/// "Creating regular file ..." on stdout, and `tests/vm/run.sh` took that line as the image
/// directory. Stand-ins for mmdebstrap and mke2fs that write to stdout, as the real ones do,
/// run the whole script without network or root; its stdout must be the one line, cold and
/// warm.
#[test]
fn guest_builder_prints_only_the_image_dir_into_an_empty_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let stubs = tmp.path().join("bin");
    std::fs::create_dir_all(&stubs).unwrap();
    let stub = |name: &str, body: &str| {
        let p = stubs.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    // mmdebstrap [options] SUITE TARGET MIRROR: a root with a kernel and an initramfs.
    stub(
        "mmdebstrap",
        "eval \"root=\\${$(($# - 1))}\"\n\
         echo 'I: chroot architecture amd64 is equal to the host architecture'\n\
         mkdir -p \"$root/boot\"\n\
         echo kernel > \"$root/boot/vmlinuz-6.1.0-accel\"\n\
         echo initrd > \"$root/boot/initrd.img-6.1.0-accel\"\n",
    );
    // mke2fs ... -d ROOT IMAGE SIZE: what e2fsprogs 1.47 prints even with -q.
    stub(
        "mke2fs",
        "eval \"image=\\${$(($# - 1))}\"\n\
         echo \"Creating regular file $image\"\n\
         echo disk > \"$image\"\n",
    );
    let cache = tmp.path().join("cache");
    let path = format!(
        "{}:{}",
        stubs.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (flavour, run) in [
        ("bookworm", "cold"),
        ("bookworm", "warm"),
        ("sid", "cold"),
        ("sid", "warm"),
    ] {
        let run = format!("{flavour} {run}");
        let out = Command::new("bash")
            .arg(repo().join("tests/vm/build-guest.sh"))
            .arg(flavour)
            .arg(&cache)
            .env("PATH", &path)
            .output()
            .unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(
            out.status.success(),
            "{run}: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 1, "{run}: stdout is not one line: {stdout:?}");
        let dir = Path::new(lines[0]);
        assert!(dir.starts_with(&cache), "{run}: {stdout:?}");
        let name = dir.file_name().unwrap().to_string_lossy();
        assert!(
            name.starts_with(&format!("guest-{flavour}-")),
            "{run}: {name}"
        );
        for f in ["disk.img", "kernel", "initrd.img"] {
            assert!(dir.join(f).is_file(), "{run}: no {f} in {}", dir.display());
        }
    }
}

/// Issue 22, 8: the volume-mounts strategy hands a device to any pod that can mount hostPath
/// /dev/null at the device-list path. The DaemonSet that defaults to it, the README's
/// Kubernetes quickstart and the security model (docs/security.md, issue 33) must say that it
/// is safe only under Pod Security "baseline".
#[test]
fn the_volume_mounts_strategy_states_its_pod_security_requirement() {
    let manifest = read(PLUGIN);
    let readme = read("README.md");
    let security_doc = read("docs/security.md");
    let header: String = manifest
        .lines()
        .take_while(|l| l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        manifest.contains("--strategy=volume-mounts"),
        "the test is about the default strategy"
    );
    for text in [&header, &readme, &security_doc] {
        assert!(
            text.contains("pod-security.kubernetes.io/enforce=baseline"),
            "no Pod Security requirement in {}",
            &text[..80]
        );
        assert!(text.contains("hostPath"), "hostPath not named");
    }
    let model = &security_doc[security_doc.find("\n## Pod Security").unwrap() + 1..];
    let model = &model[..model.find("\n## ").unwrap()];
    for want in [
        "baseline",
        "hostPath",
        "pod-security.kubernetes.io/enforce=baseline",
    ] {
        assert!(
            model.contains(want),
            "the security model's Pod Security section does not name {want}"
        );
    }
}

/// The packages ship accel-exporter and its unit; build-packages.sh builds it with its feature
/// and checks both are in the .deb and the .rpm.
#[test]
fn packages_ship_the_exporter_and_its_unit() {
    let toml = read("Cargo.toml");
    for want in [
        r#"["target/release/accel-exporter", "usr/bin/accel-exporter", "755"]"#,
        r#"["packaging/systemd/accel-exporter.service", "lib/systemd/system/accel-exporter.service", "644"]"#,
        r#"{ source = "target/release/accel-exporter", dest = "/usr/bin/accel-exporter", mode = "755" }"#,
        r#"{ source = "packaging/systemd/accel-exporter.service", dest = "/lib/systemd/system/accel-exporter.service", mode = "644" }"#,
    ] {
        assert!(toml.contains(want), "Cargo.toml lacks {want}");
    }
    let script = read("packaging/build-packages.sh");
    assert!(script.contains("--features exporter --bin accel-exporter"));
    for want in [
        "/usr/bin/accel-exporter\n",
        "/lib/systemd/system/accel-exporter.service\n",
    ] {
        assert!(
            script.contains(want),
            "build-packages.sh does not check {want}"
        );
    }
    let unit = read("packaging/systemd/accel-exporter.service");
    assert!(unit
        .lines()
        .any(|l| l.starts_with("ExecStart=/usr/bin/accel-exporter ")));
}

/// Issue 43 item 4: the packages ship accel-nri-plugin and its unit (built with the device
/// plugin's feature, checked in the .deb and the .rpm); the unit starts after the engines and
/// restarts always; the device plugin's image carries the binary, which the NRI overlay's
/// DaemonSet runs with the host's NRI socket directory and the host's `/` read-only, unprivileged,
/// on the nodes labelled for it, changing no engine config.
#[test]
fn nri_plugin_packaged_as_unit_image_and_overlay() {
    let toml = read("Cargo.toml");
    for want in [
        r#"["target/release/accel-nri-plugin", "usr/bin/accel-nri-plugin", "755"]"#,
        r#"["packaging/systemd/accel-nri-plugin.service", "lib/systemd/system/accel-nri-plugin.service", "644"]"#,
        r#"{ source = "target/release/accel-nri-plugin", dest = "/usr/bin/accel-nri-plugin", mode = "755" }"#,
        r#"{ source = "packaging/systemd/accel-nri-plugin.service", dest = "/lib/systemd/system/accel-nri-plugin.service", mode = "644" }"#,
    ] {
        assert!(toml.contains(want), "Cargo.toml lacks {want}");
    }
    let packages = read("packaging/build-packages.sh");
    assert!(packages.contains("--features plugin --bin accel-device-plugin --bin accel-nri-plugin"));
    for want in [
        "/usr/bin/accel-nri-plugin\n",
        "/lib/systemd/system/accel-nri-plugin.service\n",
        " accel-nri-plugin ",
    ] {
        assert!(
            packages.contains(want),
            "build-packages.sh does not check {want:?}"
        );
    }
    let unit = read("packaging/systemd/accel-nri-plugin.service");
    let line =
        |key: &str| -> Vec<&str> { unit.lines().filter_map(|l| l.strip_prefix(key)).collect() };
    assert_eq!(
        line("ExecStart="),
        ["/usr/bin/accel-nri-plugin --socket /var/run/nri/nri.sock"]
    );
    assert_eq!(line("Restart="), ["always"]);
    assert!(line("After=")[0]
        .split_whitespace()
        .any(|u| u == "containerd.service"));
    assert!(line("After=")[0]
        .split_whitespace()
        .any(|u| u == "crio.service"));
    assert_eq!(line("WantedBy="), ["multi-user.target"]);

    // The image: the device plugin's, the NRI plugin beside it.
    let images = read(IMAGES);
    assert!(images
        .contains(r#"put_binary "$bin_dir/accel-nri-plugin" "$root/usr/bin/accel-nri-plugin""#));

    // The DaemonSet.
    let docs = yaml_docs("packaging/kubernetes/components/nri/accel-nri-plugin.yaml");
    assert_eq!(docs.len(), 1, "the DaemonSet alone");
    let ds = &docs[0];
    assert_eq!(s(ds, &["kind"]), "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        s(pod, &["nodeSelector", "accel-container-runtime/nri"]),
        "true"
    );
    assert!(pod["nodeSelector"]["accel-container-runtime/mode"].is_null());
    assert_eq!(
        s(
            &ds["spec"]["template"],
            &[
                "metadata",
                "annotations",
                "tolerate-missing-plugins.noderesource.dev"
            ]
        ),
        "true"
    );
    assert!(
        pod["hostPID"].is_null() && pod["initContainers"].is_null(),
        "no installer"
    );
    let c = &seq(pod, "containers")[0];
    assert_eq!(s(c, &["image"]), "accel-device-plugin");
    assert_eq!(s(&seq(c, "command")[0], &[]), "/usr/bin/accel-nri-plugin");
    let args: Vec<&str> = seq(c, "args").iter().map(|a| a.as_str().unwrap()).collect();
    assert!(args.contains(&"--socket=/var/run/nri/nri.sock"), "{args:?}");
    assert!(args.contains(&"--host-root=/host"), "{args:?}");
    assert!(c["securityContext"]["privileged"].is_null());
    assert_eq!(
        c["securityContext"]["allowPrivilegeEscalation"].as_bool(),
        Some(false)
    );
    let volumes: BTreeMap<&str, &str> = seq(pod, "volumes")
        .iter()
        .map(|v| (s(v, &["name"]), s(v, &["hostPath", "path"])))
        .collect();
    let mounts: BTreeMap<&str, (&str, bool)> = seq(c, "volumeMounts")
        .iter()
        .map(|m| {
            (
                volumes[s(m, &["name"])],
                (s(m, &["mountPath"]), m["readOnly"].as_bool() == Some(true)),
            )
        })
        .collect();
    assert_eq!(mounts["/var/run/nri"], ("/var/run/nri", false));
    assert_eq!(mounts["/"], ("/host", true));
    assert_eq!(
        mounts["/etc/accel-container-runtime"],
        ("/etc/accel-container-runtime", true)
    );
    // The device plugin's DaemonSet mounts the host's `/` the same way.
    let plugin = &yaml_docs(PLUGIN)[0]["spec"]["template"]["spec"];
    let host = seq(&seq(plugin, "containers")[0], "volumeMounts")
        .iter()
        .find(|m| s(m, &["mountPath"]) == "/host")
        .unwrap();
    let ours = seq(c, "volumeMounts")
        .iter()
        .find(|m| s(m, &["mountPath"]) == "/host")
        .unwrap();
    assert_eq!(host, ours);
    // No other host path: no engine config, nothing it could install into.
    assert_eq!(
        volumes.values().copied().collect::<BTreeSet<_>>(),
        BTreeSet::from(["/", "/etc/accel-container-runtime", "/var/run/nri"])
    );
}
