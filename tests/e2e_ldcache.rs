//! What CUDA frameworks look for, end to end with real runc and the simulated driver root:
//! the container's loader cache (`ldconfig -p` lists every injected library by soname, the
//! image's own entries stay), development links (`libcuda.so`), `ldconfig` run afterwards in
//! the container, read-only roots, images without a cache, CUDA forward-compatibility
//! libraries newer and older than the host's driver, and `NVIDIA_REQUIRE_*`. Every assertion
//! about the container is made from inside it, with the image's own glibc loader and the
//! host's real `/sbin/ldconfig` copied into the image. Issue 15.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// dlopen()s each argument by name and prints `name: marker` or `name: dlopen failed`.
const PROBE: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    int bad = 0;
    for (int i = 1; i < argc; i++) {
        void *h = dlopen(argv[i], RTLD_NOW);
        if (!h) { printf("%s: dlopen failed\n", argv[i]); bad = 1; continue; }
        int (*f)(void) = (int (*)(void))dlsym(h, "accel_sim_marker");
        printf("%s: %d\n", argv[i], f ? f() : -1);
    }
    return bad;
}
"#;

/// A glibc image (its own `/etc/ld.so.cache` from `ldconfig -r`) with the probe at
/// `/usr/bin/dlprobe` and the host's static `/sbin/ldconfig`.
fn image(src: &Path) -> Bundle {
    let program = compile_program(src, "dlprobe", PROBE);
    let b = Bundle::glibc(&program);
    let sbin = b.rootfs().join("sbin");
    std::fs::create_dir_all(&sbin).unwrap();
    std::fs::copy("/sbin/ldconfig", sbin.join("ldconfig")).unwrap();
    b
}

/// `ldconfig -p`'s entries as (soname, path).
fn ldconfig_p(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| l.starts_with('\t'))
        .filter_map(|l| {
            let (lhs, path) = l.trim().split_once(" => ")?;
            Some((lhs.split(' ').next()?.to_string(), path.to_string()))
        })
        .collect()
}

/// The text of one `== name` section of the container's output.
fn section<'a>(out: &'a str, name: &str) -> &'a str {
    let start = out
        .find(&format!("== {name}\n"))
        .unwrap_or_else(|| panic!("no section {name} in {out}"));
    let rest = &out[start + name.len() + 4..];
    &rest[..rest.find("\n== ").map_or(rest.len(), |e| e + 1)]
}

const LIB: &str = LIB_DIR;

#[test]
fn ldconfig_p_lists_the_driver_and_the_image_and_ldconfig_still_runs() {
    require_root();
    let sim = SimRoot::standard();
    let src = tempfile::tempdir().unwrap();
    let mut b = image(src.path());
    let own = ldconfig_p(
        &sh_ok(
            Command::new("ldconfig")
                .arg("-p")
                .arg("-C")
                .arg(b.rootfs().join("etc/ld.so.cache")),
        )
        .stdout,
    );
    assert!(own.iter().any(|(n, _)| n == "libc.so.6"), "{own:?}");
    assert!(
        !own.iter().any(|(n, _)| n.starts_with("libcuda")),
        "{own:?}"
    );
    // `runc spec` makes a read-only root; an image that runs ldconfig has a writable one.
    b.edit(|s| s["root"]["readonly"] = false.into());
    b.env("NVIDIA_VISIBLE_DEVICES=0").sh(
        "echo '== before'; /sbin/ldconfig -p; \
         echo '== dlopen'; /usr/bin/dlprobe libcuda.so.1 libnvidia-ml.so.1 libcuda.so libnvidia-ml.so; echo rc=$?; \
         echo '== dev'; readlink -f /usr/lib/x86_64-linux-gnu/libcuda.so; ls -l /usr/lib/x86_64-linux-gnu/libcuda.so; \
         echo '== ldconfig'; /sbin/ldconfig 2>&1; echo rc=$?; \
         echo '== after'; /sbin/ldconfig -p; \
         echo '== dlopen-after'; /usr/bin/dlprobe libcuda.so.1; echo rc=$?",
    );
    let runc = Runc::new(&sim);
    let id = runc.id("ldcache");
    let out = runc.run(&b, &id);
    out.ok();
    let text = &out.stdout;

    // Every injected library is listed by soname, at its mount, before the image's own.
    let before = ldconfig_p(section(text, "before"));
    for soname in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        assert!(
            before.contains(&(soname.to_string(), format!("{LIB}/{soname}"))),
            "{soname} not listed: {before:?}"
        );
    }
    // The image's own entries are all still there.
    for e in &own {
        assert!(before.contains(e), "image entry {e:?} lost: {before:?}");
    }
    assert_eq!(before.len(), own.len() + 2, "{before:?}");

    assert_eq!(
        section(text, "dlopen"),
        format!(
            "libcuda.so.1: {MARKER_VALUE}\nlibnvidia-ml.so.1: {MARKER_VALUE}\nlibcuda.so: {MARKER_VALUE}\nlibnvidia-ml.so: {MARKER_VALUE}\nrc=0\n"
        )
    );
    // The dev link is the driver's file itself (a read-only bind mount, not a link in the
    // image).
    let dev = section(text, "dev");
    assert!(dev.starts_with(&format!("{LIB}/libcuda.so\n")), "{dev}");

    // The container's own ldconfig renames its new cache over ours: it must succeed, and
    // the driver's libraries (in a directory it scans) stay listed.
    assert_eq!(section(text, "ldconfig"), "rc=0\n", "{text}");
    let after = ldconfig_p(section(text, "after"));
    assert!(after.iter().any(|(n, _)| n == "libc.so.6"), "{after:?}");
    assert!(after.iter().any(|(n, _)| n == "libcuda.so.1"), "{after:?}");
    assert_eq!(
        section(text, "dlopen-after"),
        format!("libcuda.so.1: {MARKER_VALUE}\nrc=0\n")
    );

    // On the host: a plain file in the image, ours, readable by everyone.
    let cache = b.rootfs().join("etc/ld.so.cache");
    let meta = std::fs::symlink_metadata(&cache).unwrap();
    assert!(meta.file_type().is_file());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o644);
    // The spec has no mount over the cache.
    let spec = b.read_spec();
    assert!(!spec["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["destination"] == "/etc/ld.so.cache"));
}

#[test]
fn read_only_root_and_an_image_without_a_cache() {
    require_root();
    let sim = SimRoot::standard();
    let src = tempfile::tempdir().unwrap();
    for (name, readonly, remove_cache) in [
        ("ro", true, false),
        ("nocache", false, true),
        ("ro-nocache", true, true),
    ] {
        let mut b = image(src.path());
        if remove_cache {
            std::fs::remove_file(b.rootfs().join("etc/ld.so.cache")).unwrap();
        }
        b.edit(|s| s["root"]["readonly"] = readonly.into());
        b.env("NVIDIA_VISIBLE_DEVICES=all").sh(
            "echo '== p'; /sbin/ldconfig -p; echo '== dlopen'; /usr/bin/dlprobe libcuda.so.1 libcuda.so; echo rc=$?; \
             echo '== rootfs'; touch /probe-write 2>/dev/null && echo writable || echo read-only",
        );
        let runc = Runc::new(&sim);
        let id = runc.id(name);
        let out = runc.run(&b, &id);
        out.ok();
        let listed = ldconfig_p(section(&out.stdout, "p"));
        assert!(
            listed.contains(&("libcuda.so.1".into(), format!("{LIB}/libcuda.so.1"))),
            "{name}: {listed:?}"
        );
        // The image's libc is found either way (from its cache, or the default path).
        assert_eq!(
            section(&out.stdout, "dlopen"),
            format!("libcuda.so.1: {MARKER_VALUE}\nlibcuda.so: {MARKER_VALUE}\nrc=0\n"),
            "{name}"
        );
        if remove_cache {
            // A cache made from nothing holds only the driver's libraries.
            assert_eq!(listed.len(), 2, "{name}: {listed:?}");
        } else {
            assert!(listed.iter().any(|(n, _)| n == "libc.so.6"), "{name}");
        }
        let want = if readonly {
            "read-only\n"
        } else {
            "writable\n"
        };
        assert_eq!(section(&out.stdout, "rootfs"), want, "{name}");
    }
}

#[test]
fn a_symlinked_cache_in_the_image_is_never_followed_on_the_host() {
    require_root();
    let sim = SimRoot::standard();
    let src = tempfile::tempdir().unwrap();
    let host_file = src.path().join("host-file");
    std::fs::write(&host_file, "host").unwrap();
    for planted in ["cache", "etc"] {
        let mut b = image(src.path());
        let etc = b.rootfs().join("etc");
        if planted == "cache" {
            std::fs::remove_file(etc.join("ld.so.cache")).unwrap();
            std::os::unix::fs::symlink(&host_file, etc.join("ld.so.cache")).unwrap();
        } else {
            std::fs::rename(&etc, b.rootfs().join("etc.real")).unwrap();
            std::os::unix::fs::symlink(src.path(), &etc).unwrap();
        }
        b.env("NVIDIA_VISIBLE_DEVICES=0")
            .args(&["/usr/bin/dlprobe", "libcuda.so.1"]);
        let runc = Runc::new(&sim);
        let id = runc.id(&format!("planted-{planted}"));
        let out = runc.run(&b, &id);
        // The library still loads by soname (the default directory), nothing outside the
        // image was touched, and the log says why the cache was left alone.
        out.ok();
        assert_eq!(out.stdout, format!("libcuda.so.1: {MARKER_VALUE}\n"));
        assert_eq!(std::fs::read(&host_file).unwrap(), b"host");
        let names: Vec<_> = std::fs::read_dir(src.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains("ld.so.cache"))
            .collect();
        assert!(names.is_empty(), "{planted}: written outside: {names:?}");
        let log = runc.shim_log();
        assert!(log.contains("loader cache not updated"), "{planted}: {log}");
    }
}

/// A library with soname `libcuda.so.1` whose marker returns `value`.
fn compat_lib(dir: &Path, value: i32) -> std::path::PathBuf {
    let c = dir.join(format!("compat{value}.c"));
    std::fs::write(
        &c,
        format!("int {MARKER_SYMBOL}(void) {{ return {value}; }}\n"),
    )
    .unwrap();
    let so = dir.join(format!("compat{value}.so"));
    sh_ok(
        Command::new("gcc")
            .args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
            .arg(&so)
            .arg(&c),
    );
    so
}

/// An image carrying NVIDIA's cuda-compat layout: `/usr/local/cuda -> cuda-12.8`, and in
/// `compat/` `libcuda.so.<version>` with its soname link.
fn image_with_compat(src: &Path, version: &str, marker: i32) -> Bundle {
    let b = image(src);
    let dir = b.rootfs().join("usr/local/cuda-12.8/compat");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink("cuda-12.8", b.rootfs().join("usr/local/cuda")).unwrap();
    std::fs::copy(
        compat_lib(src, marker),
        dir.join(format!("libcuda.so.{version}")),
    )
    .unwrap();
    std::os::unix::fs::symlink(format!("libcuda.so.{version}"), dir.join("libcuda.so.1")).unwrap();
    b
}

#[test]
fn compat_libraries_win_only_when_newer_than_the_host_driver() {
    require_root();
    // The simulated host driver is 550.54.14 (CUDA 12.4).
    let sim = SimRoot::standard();
    let src = tempfile::tempdir().unwrap();
    for (version, marker, wins) in [("570.124.06", 57, true), ("535.104.05", 35, false)] {
        let mut b = image_with_compat(src.path(), version, marker);
        // Needs CUDA 12.8: met only through the newer compat libraries.
        let require = if wins { "cuda>=12.8" } else { "cuda>=12.4" };
        b.env("NVIDIA_VISIBLE_DEVICES=0")
            .env(&format!("NVIDIA_REQUIRE_CUDA={require}"))
            .sh("echo '== p'; /sbin/ldconfig -p; echo '== dlopen'; /usr/bin/dlprobe libcuda.so.1");
        let runc = Runc::new(&sim);
        let id = runc.id("compat");
        let out = runc.run(&b, &id);
        out.ok();
        let expect = if wins { marker } else { MARKER_VALUE };
        assert_eq!(
            section(&out.stdout, "dlopen"),
            format!("libcuda.so.1: {expect}\n"),
            "compat {version}"
        );
        let listed = ldconfig_p(section(&out.stdout, "p"));
        let cuda: Vec<&str> = listed
            .iter()
            .filter(|(n, _)| n == "libcuda.so.1")
            .map(|(_, p)| p.as_str())
            .collect();
        let want: &[&str] = if wins {
            &[
                "/usr/local/cuda/compat/libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            ]
        } else {
            &["/usr/lib/x86_64-linux-gnu/libcuda.so.1"]
        };
        assert_eq!(cuda, want, "compat {version}");
    }
}

#[test]
fn nvidia_require_cuda_met_unmet_and_disabled() {
    require_root();
    // Host: driver 550.54.14, CUDA 12.4.
    let sim = SimRoot::standard();
    let cuda_image =
        "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471";
    for (env, ok) in [
        (vec!["NVIDIA_REQUIRE_CUDA=cuda>=12.4"], true),
        (vec![&*format!("NVIDIA_REQUIRE_CUDA={cuda_image}")], true),
        (
            vec!["NVIDIA_REQUIRE_CUDA=cuda>=13.0 driver>=550,driver<551"],
            true,
        ),
        (vec!["NVIDIA_REQUIRE_CUDA=cuda>=12.8"], false),
        (
            vec!["NVIDIA_REQUIRE_CUDA=cuda>=12.8 brand=tesla,driver>=550"],
            false,
        ),
        (
            vec![
                "NVIDIA_REQUIRE_CUDA=cuda>=12.0",
                "NVIDIA_REQUIRE_DRIVER=driver>=560",
            ],
            false,
        ),
        (vec!["CUDA_VERSION=12.9.1"], false),
        (vec!["CUDA_VERSION=12.4.1"], true),
        (
            vec![
                "NVIDIA_REQUIRE_CUDA=cuda>=12.8",
                "NVIDIA_DISABLE_REQUIRE=true",
            ],
            true,
        ),
    ] {
        let mut b = Bundle::busybox();
        b.env("NVIDIA_VISIBLE_DEVICES=0");
        for e in &env {
            b.env(e);
        }
        b.sh("echo ran");
        let before = b.config_bytes();
        let runc = Runc::new(&sim);
        let id = runc.id("require");
        let out = runc.run(&b, &id);
        if ok {
            out.ok();
            assert_eq!(out.stdout, "ran\n", "{env:?}");
            continue;
        }
        assert_ne!(out.code, 0, "{env:?}: {out:#?}");
        assert_eq!(out.stdout, "", "{env:?}");
        let lines: Vec<&str> = out.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{env:?}: {:?}", out.stderr);
        let var = env.last().unwrap().split('=').next().unwrap();
        assert!(
            lines[0].contains(var) && lines[0].contains("driver 550.54.14"),
            "{env:?}: {}",
            lines[0]
        );
        assert!(lines[0].contains("CUDA 12.4"), "{}", lines[0]);
        assert_eq!(b.config_bytes(), before, "{env:?}: config.json changed");
        assert!(
            !b.rootfs().join("etc/ld.so.cache").exists(),
            "{env:?}: the image was written"
        );
        assert!(!runc.exists(&id), "{env:?}");
    }
}

/// What the writer makes reads back through the real `ldconfig -p -C`: the host's whole cache
/// plus driver entries, listed in ldconfig's own order, with our generator line.
#[test]
fn real_ldconfig_reads_what_the_writer_wrote() {
    use accel_container_runtime::ldcache::{self, Record};
    let host = std::fs::read("/etc/ld.so.cache").unwrap();
    let mut recs = ldcache::records(&host).unwrap();
    recs.insert(
        0,
        Record::native("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
    );
    recs.push(Record::native(
        "libzz-accel-test.so.10",
        "/opt/libzz-accel-test.so.10",
    ));
    recs.push(Record::native(
        "libzz-accel-test.so.9",
        "/opt/libzz-accel-test.so.9",
    ));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cache");
    std::fs::write(&file, ldcache::write(recs.clone())).unwrap();
    let ours = sh_ok(Command::new("ldconfig").arg("-p").arg("-C").arg(&file)).stdout;
    assert!(
        ours.contains("Cache generated by: accel-container-runtime"),
        "{ours}"
    );
    let listed = ldconfig_p(&ours);
    assert_eq!(listed.len(), recs.len());
    let host_listed = ldconfig_p(&sh_ok(Command::new("ldconfig").arg("-p")).stdout);
    // ldconfig's order, with ours in their places: remove ours and the host's order remains.
    let without: Vec<_> = listed
        .iter()
        .filter(|(n, _)| n != "libcuda.so.1" && !n.starts_with("libzz-accel-test"))
        .cloned()
        .collect();
    assert_eq!(without, host_listed);
    let pos = |n: &str| listed.iter().position(|(x, _)| x == n).unwrap();
    assert!(pos("libzz-accel-test.so.10") < pos("libzz-accel-test.so.9"));
    assert!(pos("libzz-accel-test.so.9") < pos("libcuda.so.1"));
    assert!(pos("libcuda.so.1") < pos("libc.so.6"));
}
