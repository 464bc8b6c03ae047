//! accel-exporter, the binary, against simulated sources made here: amdgpu, i915/xe and
//! Hygon sysfs + hwmon trees (tests/common/drm.rs), an NVML stand-in library compiled with gcc
//! (the calls nvml-wrapper makes for the metrics exported), stand-in `efsmi` and `npu-smi`
//! scripts run chrooted in their driver root, hostile sources, a stand-in kubelet's
//! PodResources, and a real Prometheus (Debian's package) scraping it.

mod common;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use accel_container_runtime::kubelet::proto::podresources::{
    ClaimResource, ContainerDevices, ContainerResources, DynamicResource, ListPodResourcesResponse,
    PodResources,
};
use common::drm::{self, DrmHost};
use common::{binary, grpc, require_root, sh_ok, SimRoot, LIB_DIR};

static EXPORTER: LazyLock<String> = LazyLock::new(|| binary(env!("CARGO_BIN_EXE_accel-exporter")));
const GIB: u64 = 1 << 30;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A GET over HTTP/1.1: (status, content type, body).
fn get(addr: SocketAddr, path: &str, accept: Option<&str>) -> Option<(u16, String, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let ctype = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type:")
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Some((status, ctype, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = &rest[n + 2..];
    }
    out
}

/// The running exporter, killed on drop.
struct Exporter {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Exporter {
    fn start(config: &Path, extra: &[&str]) -> Exporter {
        let addr = free_addr();
        let log = config.with_file_name(format!("exporter-{}.log", addr.port()));
        let child = Command::new(&*EXPORTER)
            .arg(format!("--listen={addr}"))
            .args(extra)
            .env("ACCEL_CONTAINER_RUNTIME_CONFIG", config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Exporter { child, addr, log }
    }

    fn scrape(&self) -> String {
        let (status, ctype, body) = get(self.addr, "/metrics", None).expect("scrape");
        assert_eq!(status, 200, "{body}");
        assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
        body
    }

    /// SIGTERM, as the kubelet stops a pod: the exit status within 10 s, and the log.
    fn stop(&mut self) -> (std::process::ExitStatus, String) {
        // SAFETY: kill(2) of the child this test started and has not reaped.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let t = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "no exit 10 s after SIGTERM\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        (
            status,
            std::fs::read_to_string(&self.log).unwrap_or_default(),
        )
    }

    /// Scrapes until `ready` holds of the page (polls run on their own period).
    fn until(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let t = Instant::now();
        loop {
            if let Some((200, _, body)) = get(self.addr, "/metrics", None) {
                if ready(&body) {
                    return body;
                }
                if t.elapsed() > Duration::from_secs(30) {
                    panic!(
                        "{what}: not seen in 30 s\n{body}\n--- log:\n{}",
                        std::fs::read_to_string(&self.log).unwrap_or_default()
                    );
                }
            } else if t.elapsed() > Duration::from_secs(30) {
                panic!(
                    "no answer from the exporter\n{}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The samples of `family` in a text page: (labels, value).
fn samples<'a>(page: &'a str, family: &str) -> Vec<(&'a str, f64)> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, rest) = match l.find('{') {
                Some(i) => (&l[..i], &l[i..]),
                None => l.split_at(l.find(' ')?),
            };
            if name != family {
                return None;
            }
            let (labels, value) = rest.rsplit_once(' ')?;
            Some((labels, value.parse().ok()?))
        })
        .collect()
}

/// The value of the one sample of `family` whose labels contain every one of `has`.
fn value(page: &str, family: &str, has: &[&str]) -> Option<f64> {
    let found: Vec<f64> = samples(page, family)
        .into_iter()
        .filter(|(l, _)| has.iter().all(|h| l.contains(h)))
        .map(|(_, v)| v)
        .collect();
    assert!(found.len() <= 1, "{family} {has:?}: {found:?}\n{page}");
    found.first().copied()
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() <= b.abs() * 1e-9 + 1e-9)
}

/// An AMD GPU's name on the node: its KFD unique id (unique here), as discovery writes it.
fn f_name(f: &drm::Func) -> String {
    format!("0x{:x}", f.kfd.unwrap().1)
}

/// The directory of PCI function `bdf` under `root` (through the bus link).
fn func_dir(root: &Path, bdf: &str) -> PathBuf {
    root.join("sys/bus/pci/devices").join(bdf)
}

/// amdgpu's files for each AMD GPU of `host`: busy 10+i %, VRAM (i+1) GiB of 192 GiB, edge
/// 40+i °C, 300 W, a 2.1 GHz clock; an `nvme` hwmon sits beside amdgpu's so the chip name
/// decides.
fn amd_files(root: &Path, host: &DrmHost) {
    for (i, f) in host.offered("0x1002", "amdgpu").iter().enumerate() {
        let d = func_dir(root, &f.bdf);
        write(&d.join("gpu_busy_percent"), &format!("{}\n", 10 + i));
        write(&d.join("mem_busy_percent"), "5\n");
        write(
            &d.join("mem_info_vram_used"),
            &format!("{}\n", (i as u64 + 1) * GIB),
        );
        write(&d.join("mem_info_vram_total"), &format!("{}\n", 192 * GIB));
        write(&d.join("hwmon/hwmon0/name"), "nvme\n");
        write(&d.join("hwmon/hwmon0/temp1_input"), "99000\n");
        let hw = d.join(format!("hwmon/hwmon{}", i + 1));
        write(&hw.join("name"), "amdgpu\n");
        write(&hw.join("temp1_input"), &format!("{}\n", 40_000 + i * 1000));
        write(&hw.join("temp2_input"), "55000\n");
        write(&hw.join("power1_average"), "300000000\n");
        write(&hw.join("power1_cap"), "750000000\n");
        write(&hw.join("freq1_input"), "2100000000\n");
    }
}

/// i915 and xe files: energy, power limit, frequency; xe's temperatures.
fn intel_files(root: &Path, host: &DrmHost) {
    for f in &host.funcs {
        let d = func_dir(root, &f.bdf);
        let chip = f.driver;
        let hw = d.join("hwmon/hwmon3");
        write(&hw.join("name"), &format!("{chip}\n"));
        write(&hw.join("energy1_input"), "123456789\n");
        write(&hw.join("power1_max"), "225000000\n");
        if chip == "xe" {
            write(&hw.join("temp2_input"), "61000\n");
            write(&d.join("tile0/gt0/freq0/act_freq"), "1650\n");
        } else {
            write(
                &d.join(format!("drm/card{}/gt_act_freq_mhz", f.card.unwrap())),
                "1300\n",
            );
        }
    }
}

/// Hygon DCUs: busy percent and VRAM in amdgpu's files, a hwmon of whatever chip name.
fn hygon_files(root: &Path, host: &DrmHost) {
    for f in &host.funcs {
        let d = func_dir(root, &f.bdf);
        write(&d.join("gpu_busy_percent"), "33\n");
        write(&d.join("mem_info_vram_used"), &format!("{}\n", 3 * GIB));
        write(&d.join("mem_info_vram_total"), &format!("{}\n", 64 * GIB));
        write(&d.join("hwmon/hwmon7/name"), "hydcu\n");
        write(&d.join("hwmon/hwmon7/temp1_input"), "47000\n");
    }
}

/// The NVML stand-in: every call nvml-wrapper makes for the exported metrics, answering for
/// the GPUs `uuids` (GPU i: i+1 GiB of 80 GiB used, 20+i % busy, 50+i °C, 250.5 W, 700 W
/// limit, 1 000 000 mJ, clocks 1410/1980/1593 MHz, no ECC (NOT_SUPPORTED), 2 PCIe replays).
fn nvml_stand_in(sim: &SimRoot) {
    nvml_stand_in_lacking(sim, &[]);
}

/// [`nvml_stand_in`] with the functions `lacking` left out of its symbol table (renamed), as
/// an older or a broken driver's library would be.
fn nvml_stand_in_lacking(sim: &SimRoot, lacking: &[&str]) {
    let renamed: String = lacking
        .iter()
        .map(|s| format!("#define {s} {s}_absent\n"))
        .collect();
    let uuids: Vec<String> = sim
        .gpus()
        .iter()
        .map(|g| format!("\"{}\"", g.uuid))
        .collect();
    let buses: Vec<String> = sim
        .gpus()
        .iter()
        .map(|g| format!("\"{}\"", g.bus))
        .collect();
    let n = uuids.len();
    let src = format!(
        r#"{renamed}
#include <string.h>
#include <strings.h>
typedef struct {{ int i; }} dev;
static dev devs[{n}];
static const char *uuids[] = {{ {uuids} }};
static const char *buses[] = {{ {buses} }};
static int up = 0;
int nvmlInit_v2(void) {{ for (int i = 0; i < {n}; i++) devs[i].i = i; up = 1; return 0; }}
int nvmlShutdown(void) {{ up = 0; return 0; }}
int nvmlSystemGetDriverVersion(char *v, unsigned int len) {{ strncpy(v, "550.54.14", len); return 0; }}
int nvmlDeviceGetHandleByUUID(const char *u, dev **d) {{
  if (!up) return 1;
  for (int i = 0; i < {n}; i++) if (!strcmp(u, uuids[i])) {{ *d = &devs[i]; return 0; }}
  return 6; }}
int nvmlDeviceGetHandleByPciBusId_v2(const char *b, dev **d) {{
  for (int i = 0; i < {n}; i++) if (strcasestr(b, buses[i] + 5)) {{ *d = &devs[i]; return 0; }}
  return 6; }}
typedef struct {{ unsigned int gpu, memory; }} util;
int nvmlDeviceGetUtilizationRates(dev *d, util *u) {{ u->gpu = 20 + d->i; u->memory = 7; return 0; }}
typedef struct {{ unsigned int version; unsigned long long total, reserved, free, used; }} mem2;
int nvmlDeviceGetMemoryInfo_v2(dev *d, mem2 *m) {{
  m->total = 80ULL << 30; m->used = (unsigned long long)(d->i + 1) << 30;
  m->reserved = 0; m->free = m->total - m->used; return 0; }}
int nvmlDeviceGetTemperature(dev *d, int s, unsigned int *t) {{ *t = 50 + d->i; return 0; }}
int nvmlDeviceGetPowerUsage(dev *d, unsigned int *p) {{ *p = 250500; return 0; }}
int nvmlDeviceGetEnforcedPowerLimit(dev *d, unsigned int *p) {{ *p = 700000; return 0; }}
int nvmlDeviceGetTotalEnergyConsumption(dev *d, unsigned long long *e) {{ *e = 1000000; return 0; }}
int nvmlDeviceGetClockInfo(dev *d, int c, unsigned int *f) {{ *f = c == 0 ? 1410 : c == 1 ? 1980 : 1593; return 0; }}
int nvmlDeviceGetTotalEccErrors(dev *d, int e, int c, unsigned long long *n) {{ return 3; }}
int nvmlDeviceGetPcieReplayCounter(dev *d, unsigned int *n) {{ *n = 2; return 0; }}
const char *nvmlErrorString(int r) {{ return "stand-in"; }}
"#,
        uuids = uuids.join(", "),
        buses = buses.join(", "),
    );
    let dir = sim.path().join(&LIB_DIR[1..]);
    let c = sim.path().join("nvml.c");
    std::fs::write(&c, src).unwrap();
    let lib = dir.join("libnvidia-ml.so.550.54.14");
    let _ = std::fs::remove_file(&lib);
    let _ = std::fs::remove_file(dir.join("libnvidia-ml.so.1"));
    sh_ok(
        Command::new("gcc")
            .args(["-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o"])
            .arg(&lib)
            .arg(&c),
    );
    symlink("libnvidia-ml.so.550.54.14", dir.join("libnvidia-ml.so.1")).unwrap();
    sh_ok(Command::new("ldconfig").arg("-r").arg(sim.path()));
}

/// busybox as the driver root's `/bin/sh` (and `sleep`), for the CLIs run chrooted there.
fn shell(sim: &Path) {
    std::fs::create_dir_all(sim.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", sim.join("bin/busybox")).unwrap();
    for a in ["sh", "sleep", "cat"] {
        let _ = symlink("busybox", sim.join("bin").join(a));
    }
}

fn script(sim: &Path, path: &str, text: &str) {
    let p = sim.join(path.trim_start_matches('/'));
    write(&p, text);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// efsmi printing the CSV enflame.toml declares: GCU i uses (i+1)*1024 MiB of 32768.
const EFSMI: &str = "#!/bin/sh\n\
case \"$1\" in --query-gcu=*) ;; *) echo 'unknown option'; exit 2 ;; esac\n\
for i in 0 1 2 3; do echo \"$i, 0000:0$i:00.0, $((i * 10 + 5)), $(((i + 1) * 1024)), 32768, $((60 + i)), N/A\"; done\n";

/// npu-smi printing `Key : value` lines for `info -t usages|common -i <id>`.
const NPU_SMI: &str = "#!/bin/sh\n\
id=$5\n\
case \"$3\" in\n\
usages) printf 'Memory Capacity(MB)            : 65536\\nMemory Usage Rate(%%)           : 25\\nAicore Usage Rate(%%)           : %s\\n' $((40 + id)) ;;\n\
common) printf 'Temperature(C)                 : %s\\nPower Dissipation(W)           : 95.5\\n' $((45 + id)) ;;\n\
esac\n";

/// A scratch dir with a config.toml pointing each profile at its simulated root, and the
/// file profiles in its profiles-dir.
fn config(dir: &Path, roots: &[(&str, &Path)], extra: &str) -> PathBuf {
    let profiles = dir.join("profiles.d");
    std::fs::create_dir_all(&profiles).unwrap();
    let mut text = format!("profiles-dir = {:?}\n{extra}\n", profiles);
    for (name, root) in roots {
        if !["nvidia", "enflame"].contains(name) {
            std::fs::copy(
                repo().join(format!("config/profiles/{name}.toml")),
                profiles.join(format!("{name}.toml")),
            )
            .unwrap();
        }
        text.push_str(&format!(
            "[profiles.{name:?}]\ndriver-root = {:?}\n",
            root.display().to_string()
        ));
    }
    let path = dir.join("config.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn promtool_check(page: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (apt-get install prometheus)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {:?}\n{}{}\n{page}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every shipped profile with devices, each from its own source kind, in one exporter: each
/// device exported with its identity and the values its simulated source holds, in base
/// units; promtool finds nothing to lint; OpenMetrics where asked.
#[test]
fn every_profile_exports_its_devices_from_its_sources() {
    require_root();
    let nv = SimRoot::builder()
        .nvidia(&[("0000:af:00.0", 1), ("0000:3b:00.0", 3)])
        .enflame(4)
        .ascend(2)
        .build();
    nvml_stand_in(&nv);
    shell(nv.path());
    script(nv.path(), "/usr/bin/efsmi", EFSMI);
    script(nv.path(), "/usr/local/bin/npu-smi", NPU_SMI);
    write(
        &nv.path().join("usr/local/Ascend/driver/version.info"),
        "Version=24.1.0\n",
    );
    let amd = SimRoot::builder().build();
    let amd_host = drm::amd_node(&amd);
    amd_files(amd.path(), &amd_host);
    let intel = SimRoot::builder().build();
    let intel_host = drm::intel_node(&intel);
    intel_files(intel.path(), &intel_host);
    let hygon = SimRoot::builder().build();
    let hygon_host = drm::hygon_node(&hygon);
    hygon_files(hygon.path(), &hygon_host);
    // The profiles without a source: their devices are exported all the same (identity,
    // health, holders), with no reading and no error.
    let misc = SimRoot::builder().build();
    let m = misc.path();
    let majors = common::free_majors(3);
    for i in 0..2 {
        common::mknod(
            &m.join(format!("dev/cambricon_dev{i}")),
            majors[0],
            i,
            0o666,
        );
    }
    common::mknod(&m.join("dev/accel/accel0"), majors[1], 0, 0o666);
    common::mknod(&m.join("dev/accel/accel_controlD0"), majors[1], 1, 0o666);
    write(&m.join("sys/module/habanalabs/version"), "1.18.0\n");
    common::mknod(&m.join("dev/mtgpu.0"), majors[2], 0, 0o666);
    drm::build(
        m,
        vec![drm::Func {
            bdf: "0000:61:00.0".into(),
            bridges: vec!["0000:60:01.0".into()],
            vendor: "0x9999",
            device: "0x4000",
            driver: "metax",
            numa: 0,
            card: Some(0),
            render: Some(128),
            kfd: None,
        }],
        false,
        &[],
    );
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(
        scratch.path(),
        &[
            ("cambricon", m),
            ("habana", m),
            ("mthreads", m),
            ("metax", m),
            ("nvidia", nv.path()),
            ("enflame", nv.path()),
            ("ascend", nv.path()),
            ("amd", amd.path()),
            ("intel", intel.path()),
            ("intel-xe", intel.path()),
            ("hygon", hygon.path()),
        ],
        "",
    );
    let ex = Exporter::start(&cfg, &["--no-pod-resources", "--poll-seconds=0.5"]);
    let page = ex.until("every profile polled", |p| {
        [
            "nvidia",
            "enflame",
            "ascend",
            "amd",
            "intel",
            "intel-xe",
            "hygon",
            "cambricon",
            "habana",
            "mthreads",
            "metax",
        ]
        .iter()
        .all(|n| {
            value(
                p,
                "accel_exporter_polls_total",
                &[&format!("profile=\"{n}\"")],
            )
            .is_some()
        })
    });
    let devices = |p: &str| {
        samples(&page, "accel_device_info")
            .iter()
            .filter(|(l, _)| l.contains(&format!("profile=\"{p}\"")))
            .count()
    };
    for (p, n) in [
        ("nvidia", 2),
        ("enflame", 4),
        ("ascend", 2),
        ("amd", 8),
        ("intel", 2),
        ("intel-xe", 1),
        ("hygon", 2),
        ("cambricon", 2),
        ("habana", 1),
        ("mthreads", 1),
        ("metax", 1),
    ] {
        assert_eq!(devices(p), n, "{p}\n{page}");
    }
    // Every shipped profile is here, so every one's exposition is checked below.
    let shipped = std::fs::read_dir(repo().join("config/profiles"))
        .unwrap()
        .count();
    assert_eq!(
        samples(&page, "accel_exporter_polls_total").len(),
        shipped,
        "{page}"
    );
    // NVIDIA through the NVML stand-in, by UUID, in PCI bus order.
    for g in nv.gpus() {
        let u = format!("uuid=\"{}\"", g.uuid);
        assert!(close(
            value(&page, "accel_memory_total_bytes", &[&u]),
            80.0 * GIB as f64
        ));
        assert!(
            close(value(&page, "accel_power_watts", &[&u]), 250.5),
            "{page}"
        );
        assert!(close(value(&page, "accel_power_limit_watts", &[&u]), 700.0));
        assert!(close(
            value(&page, "accel_energy_joules_total", &[&u]),
            1000.0
        ));
        assert!(close(
            value(&page, "accel_clock_hertz", &[&u, "clock=\"sm\""]),
            1.98e9
        ));
        assert!(close(
            value(&page, "accel_errors_total", &[&u, "kind=\"pcie-replay\""]),
            2.0
        ));
        assert!(value(&page, "accel_errors_total", &[&u, "kind=\"ecc-corrected\""]).is_none());
    }
    let used: Vec<f64> = samples(&page, "accel_memory_used_bytes")
        .into_iter()
        .filter(|(l, _)| l.contains("profile=\"nvidia\""))
        .map(|(_, v)| v)
        .collect();
    assert_eq!(used.len(), 2);
    assert!(
        used.contains(&(GIB as f64)) && used.contains(&(2.0 * GIB as f64)),
        "{used:?}"
    );
    assert!(samples(&page, "accel_temperature_celsius")
        .iter()
        .any(|(l, v)| l.contains("profile=\"nvidia\"")
            && l.contains("sensor=\"gpu\"")
            && *v == 50.0));
    // Enflame through the efsmi stand-in (CSV by index; "N/A" power is absent, not 0).
    for i in 0..4u64 {
        let d = format!("device=\"{i}\"");
        let e = "profile=\"enflame\"";
        assert!(
            close(
                value(&page, "accel_memory_used_bytes", &[e, &d]),
                ((i + 1) * 1024 * 1024 * 1024) as f64
            ),
            "{page}"
        );
        assert!(close(
            value(&page, "accel_utilization_ratio", &[e, &d]),
            (i * 10 + 5) as f64 / 100.0
        ));
        assert!(close(
            value(
                &page,
                "accel_temperature_celsius",
                &[e, &d, "sensor=\"gcu\""]
            ),
            (60 + i) as f64
        ));
        assert!(value(&page, "accel_power_watts", &[e, &d]).is_none());
    }
    // Ascend through npu-smi, per device: used = rate × capacity.
    for i in 0..2u64 {
        let d = format!("device=\"{i}\"");
        let a = "profile=\"ascend\"";
        assert!(
            close(
                value(&page, "accel_memory_used_bytes", &[a, &d]),
                0.25 * 65536.0 * 1048576.0
            ),
            "{page}"
        );
        assert!(close(
            value(&page, "accel_utilization_ratio", &[a, &d]),
            (40 + i) as f64 / 100.0
        ));
        assert!(close(value(&page, "accel_power_watts", &[a, &d]), 95.5));
    }
    // AMD from amdgpu's files, hwmon chosen by chip name.
    for (i, f) in amd_host.offered("0x1002", "amdgpu").iter().enumerate() {
        // Profile and bus: the Intel host has a function at 0000:03:00.0 too.
        let b = format!("profile=\"amd\",device=\"{}\"", f_name(f));
        let i = i as u64;
        assert!(
            close(
                value(&page, "accel_memory_used_bytes", &[&b]),
                ((i + 1) * GIB) as f64
            ),
            "{b}\n{page}"
        );
        assert!(close(
            value(&page, "accel_memory_total_bytes", &[&b]),
            (192 * GIB) as f64
        ));
        assert!(close(
            value(&page, "accel_utilization_ratio", &[&b]),
            (10 + i) as f64 / 100.0
        ));
        assert!(close(
            value(&page, "accel_temperature_celsius", &[&b, "sensor=\"edge\""]),
            (40 + i) as f64
        ));
        assert!(close(value(&page, "accel_power_watts", &[&b]), 300.0));
        assert!(close(
            value(&page, "accel_clock_hertz", &[&b, "clock=\"graphics\""]),
            2.1e9
        ));
        assert!(value(
            &page,
            "accel_temperature_celsius",
            &[&b, "sensor=\"memory\""]
        )
        .is_none());
    }
    // i915 and xe: energy counters in joules, frequencies in hertz.
    for f in &intel_host.funcs {
        let p = if f.driver == "xe" {
            "intel-xe"
        } else {
            "intel"
        };
        let b = format!("pci_bus_id=\"{}\"", f.bdf);
        let p = format!("profile=\"{p}\"");
        let b = [b.as_str(), p.as_str()];
        let b = &b[..];
        assert!(
            close(value(&page, "accel_energy_joules_total", b), 123.456789),
            "{b:?}\n{page}"
        );
        assert!(close(value(&page, "accel_power_limit_watts", b), 225.0));
        let mhz = if f.driver == "xe" { 1650.0 } else { 1300.0 };
        assert!(close(value(&page, "accel_clock_hertz", b), mhz * 1e6));
    }
    // Hygon: amdgpu's files, the first hwmon whatever its name.
    for f in &hygon_host.funcs {
        let b = format!("pci_bus_id=\"{}\"", f.bdf);
        assert!(
            close(value(&page, "accel_utilization_ratio", &[&b]), 0.33),
            "{page}"
        );
        assert!(close(
            value(&page, "accel_temperature_celsius", &[&b]),
            47.0
        ));
    }
    // Every device healthy, no source failed (optional files absent are no error).
    assert!(
        samples(&page, "accel_device_healthy")
            .iter()
            .all(|(_, v)| *v == 1.0),
        "{page}"
    );
    assert!(
        samples(&page, "accel_exporter_source_errors_total").is_empty(),
        "{page}\n{}",
        std::fs::read_to_string(&ex.log).unwrap()
    );
    promtool_check(&page);
    // OpenMetrics where the scrape asks for it, as Prometheus does.
    let (status, ctype, om) = get(
        ex.addr,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
    )
    .unwrap();
    assert_eq!(status, 200);
    assert!(
        ctype.starts_with("application/openmetrics-text; version=1.0.0"),
        "{ctype}"
    );
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(om.contains("# UNIT accel_memory_used_bytes bytes"), "{om}");
    assert!(om.contains("# TYPE accel_energy_joules counter"), "{om}");
}

/// Sources that block, flood, lead out of the root, print garbage or hang: the scrape stays
/// fast, the values are absent, and the error counter says why.
#[test]
fn hostile_sources_give_absent_values_and_counted_reasons() {
    require_root();
    let amd = SimRoot::builder().enflame(2).build();
    let host = drm::amd_node(&amd);
    amd_files(amd.path(), &host);
    let gpus = host.offered("0x1002", "amdgpu");
    let d0 = func_dir(amd.path(), &gpus[0].bdf);
    // A FIFO where the busy percent should be: never opened (it would block).
    std::fs::remove_file(d0.join("gpu_busy_percent")).unwrap();
    nix::unistd::mkfifo(&d0.join("gpu_busy_percent"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    // A huge file: read no further than the limit.
    std::fs::write(d0.join("mem_info_vram_used"), "1".repeat(8 << 20)).unwrap();
    // A link to a host file outside the root holding a number: resolved inside the root.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "777\n").unwrap();
    std::fs::remove_file(d0.join("mem_info_vram_total")).unwrap();
    symlink(
        outside.path().join("secret"),
        d0.join("mem_info_vram_total"),
    )
    .unwrap();
    // Garbage where a temperature should be.
    std::fs::write(d0.join("hwmon/hwmon1/temp1_input"), "hot\n").unwrap();
    // A character device node where power should be.
    std::fs::remove_file(d0.join("hwmon/hwmon1/power1_average")).unwrap();
    common::mknod(&d0.join("hwmon/hwmon1/power1_average"), 1, 3, 0o666);
    // efsmi that sleeps past its limit, and one that prints garbage.
    shell(amd.path());
    script(amd.path(), "/usr/bin/efsmi", "#!/bin/sh\nsleep 30\n");
    script(
        amd.path(),
        "/usr/local/bin/garbage-smi",
        "#!/bin/sh\nprintf '\\001\\002 not, a, table\\n%0200d\\n' 7\n",
    );
    let scratch = tempfile::tempdir().unwrap();
    let extra = "[profiles.enflame.metrics]\n\
        commands = [\n\
          { binary = \"efsmi\", format = \"csv\", key = \"index\", key-column = 0, timeout-seconds = 2.0, fields = [{ metric = \"memory-used\", column = 1 }] },\n\
          { binary = \"garbage-smi\", format = \"csv\", key = \"index\", key-column = 0, timeout-seconds = 2.0, fields = [{ metric = \"power\", column = 1 }] },\n\
        ]\n";
    let cfg = config(
        scratch.path(),
        &[("amd", amd.path()), ("enflame", amd.path())],
        extra,
    );
    let ex = Exporter::start(&cfg, &["--no-pod-resources", "--poll-seconds=0.5"]);
    let page = ex.until("every hostile source counted", |p| {
        [
            "not-a-file",
            "too-large",
            "missing",
            "parse",
            "timeout",
            "hung",
        ]
        .iter()
        .all(|r| p.contains(&format!("reason=\"{r}\"")))
    });
    let b = format!("pci_bus_id=\"{}\"", gpus[0].bdf);
    let err = |metric: &str, reason: &str| {
        samples(&page, "accel_exporter_source_errors_total")
            .iter()
            .any(|(l, v)| {
                l.contains(&format!("metric=\"{metric}\""))
                    && l.contains(&format!("reason=\"{reason}\""))
                    && *v >= 1.0
            })
    };
    assert!(err("utilization", "not-a-file"), "FIFO\n{page}");
    assert!(err("power", "not-a-file"), "device node\n{page}");
    assert!(err("memory-used", "too-large"), "huge file\n{page}");
    assert!(
        err("memory-total", "missing"),
        "link out of the root\n{page}"
    );
    assert!(err("temperature", "parse"), "garbage\n{page}");
    assert!(
        samples(&page, "accel_exporter_source_errors_total")
            .iter()
            .any(
                |(l, _)| l.contains("source=\"command efsmi\"") && l.contains("reason=\"timeout\"")
            ),
        "{page}"
    );
    assert!(
        samples(&page, "accel_exporter_source_errors_total")
            .iter()
            .any(|(l, _)| l.contains("source=\"command garbage-smi\"")
                && l.contains("reason=\"parse\"")),
        "{page}"
    );
    // The hostile GPU's values are absent (never 0, never the host file's 777); its
    // neighbours' are there.
    for fam in [
        "accel_utilization_ratio",
        "accel_memory_used_bytes",
        "accel_memory_total_bytes",
        "accel_power_watts",
    ] {
        assert!(value(&page, fam, &[&b]).is_none(), "{fam}\n{page}");
    }
    assert!(value(&page, "accel_temperature_celsius", &[&b, "sensor=\"edge\""]).is_none());
    let b1 = format!("pci_bus_id=\"{}\"", gpus[1].bdf);
    assert!(close(
        value(&page, "accel_memory_used_bytes", &[&b1]),
        (2 * GIB) as f64
    ));
    assert!(!page.contains(" 777\n"), "{page}");
    // Scrapes answer at once while efsmi's poll waits out its limit.
    let mut worst = Duration::ZERO;
    for _ in 0..20 {
        let t = Instant::now();
        ex.scrape();
        worst = worst.max(t.elapsed());
    }
    assert!(
        worst < Duration::from_millis(500),
        "slowest scrape {worst:?}"
    );
    promtool_check(&ex.scrape());
}

/// A stand-in kubelet's PodResources serving a device plugin pod, a DRA claim, replicas of a
/// shared device and an idle device; a real Prometheus scrapes the exporter; PromQL gives
/// each held device's memory used with the pod holding it, and the idle one's without.
/// The node and the target labels the Prometheus operator (from the endpoints of the
/// exporter's Service) and Kubernetes service discovery give the exporter's pod: the scrape
/// jobs below are the shipped ones with their discovery replaced by a static target so
/// labelled.
const EXPORTER_NODE: &str = "node-a";
const EXPORTER_TARGET: [(&str, &str); 3] = [
    ("namespace", "accel-system"),
    ("pod", "accel-exporter-x7k2p"),
    ("container", "accel-exporter"),
];

fn monitoring(file: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(repo().join("packaging/monitoring").join(file)).unwrap();
    serde_yaml_ng::from_str(&text).unwrap()
}

/// Relabel rules as Prometheus' configuration spells them (the operator's are camelCase).
fn relabel_rules(rules: &serde_json::Value) -> serde_json::Value {
    let snake = |k: &str| match k {
        "sourceLabels" => "source_labels".to_string(),
        "targetLabel" => "target_label".to_string(),
        other => other.to_string(),
    };
    rules
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            r.as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (snake(k), v.clone()))
                .collect::<serde_json::Map<_, _>>()
                .into()
        })
        .collect::<Vec<serde_json::Value>>()
        .into()
}

/// The job the Prometheus operator makes of the shipped ServiceMonitor's endpoint: the
/// target labelled with the exporter pod's namespace, service, pod, container and endpoint
/// (the operator's own relabelling), then the endpoint's `relabelings`, `honorLabels`.
fn servicemonitor_job(addr: SocketAddr) -> String {
    let sm = monitoring("accel-exporter-servicemonitor.yaml");
    let ep = &sm["spec"]["endpoints"][0];
    let mut labels: serde_json::Map<String, serde_json::Value> = EXPORTER_TARGET
        .iter()
        .map(|(k, v)| (k.to_string(), (*v).into()))
        .collect();
    labels.insert("service".into(), "accel-exporter".into());
    labels.insert("endpoint".into(), ep["port"].clone());
    labels.insert(
        "__meta_kubernetes_pod_node_name".into(),
        EXPORTER_NODE.into(),
    );
    let job = serde_json::json!([{
        "job_name": "servicemonitor",
        "metrics_path": ep["path"],
        "honor_labels": ep["honorLabels"].as_bool().unwrap_or(false),
        "static_configs": [{"targets": [addr.to_string()], "labels": labels}],
        "relabel_configs": relabel_rules(&ep["relabelings"]),
    }]);
    serde_yaml_ng::to_string(&job).unwrap()
}

/// The shipped scrape config's job, its pod discovery replaced by a static target with the
/// labels Kubernetes' pod discovery gives the exporter's `metrics` port.
fn scrape_config_job(addr: SocketAddr) -> String {
    let mut job = monitoring("prometheus-scrape-config.yaml")[0].clone();
    let j = job.as_object_mut().unwrap();
    assert!(j.remove("kubernetes_sd_configs").is_some(), "{j:?}");
    j.insert("job_name".into(), "scrape-config".into());
    j.insert(
        "static_configs".into(),
        serde_json::json!([{
            "targets": [addr.to_string()],
            "labels": {
                "__meta_kubernetes_namespace": EXPORTER_TARGET[0].1,
                "__meta_kubernetes_pod_name": EXPORTER_TARGET[1].1,
                "__meta_kubernetes_pod_container_name": EXPORTER_TARGET[2].1,
                "__meta_kubernetes_pod_container_port_name": "metrics",
                "__meta_kubernetes_pod_node_name": EXPORTER_NODE,
                // Both jobs scrape one exporter: an instance of its own keeps the
                // dashboard's joins on `instance` one-to-one.
                "instance": "scrape-config",
            },
        }]),
    );
    serde_yaml_ng::to_string(&serde_json::json!([job])).unwrap()
}

#[test]
fn prometheus_sees_memory_used_by_pod_for_plugin_and_dra_holders() {
    require_root();
    let sim = SimRoot::builder().enflame(4).build();
    shell(sim.path());
    script(sim.path(), "/usr/bin/efsmi", EFSMI);
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(scratch.path(), &[("enflame", sim.path())], "");
    let mut enflame = accel_container_runtime::config::Config::builtin()
        .profiles
        .into_iter()
        .find(|p| p.name == "enflame")
        .unwrap();
    enflame.driver_root = sim.path().to_path_buf();
    let driver = accel_container_runtime::kubelet::names::driver_name(&enflame, None).unwrap();
    // GCU 1 as the DRA driver names it in its slice (and so in the claim kubelet reports).
    let gcu1 = accel_container_runtime::kubelet::inventory::discover(&enflame)
        .unwrap()
        .into_iter()
        .find(|d| d.index == 1)
        .unwrap();
    let dra_device = accel_container_runtime::kubelet::names::device_name(&enflame, &gcu1.key);
    let container = |name: &str, devices: Vec<ContainerDevices>, dra: Vec<DynamicResource>| {
        ContainerResources {
            name: name.into(),
            devices,
            dynamic_resources: dra,
        }
    };
    let plugin = |ids: &[&str]| ContainerDevices {
        resource_name: "enflame.com/gcu".into(),
        device_ids: ids.iter().map(|s| s.to_string()).collect(),
        topology: None,
    };
    let pod = |name: &str, c: ContainerResources| PodResources {
        name: name.into(),
        namespace: "ml".into(),
        containers: vec![c],
    };
    let answer = ListPodResourcesResponse {
        pod_resources: vec![
            pod("train", container("main", vec![plugin(&["GCU-0"])], vec![])),
            pod(
                "infer",
                container(
                    "srv",
                    vec![],
                    vec![DynamicResource {
                        claim_name: "infer-gcu".into(),
                        claim_namespace: "ml".into(),
                        claim_resources: vec![ClaimResource {
                            cdi_devices: vec![],
                            driver_name: driver.clone(),
                            pool_name: "node-a".into(),
                            device_name: dra_device.clone(),
                            ..Default::default()
                        }],
                    }],
                ),
            ),
            pod(
                "share-a",
                container("c", vec![plugin(&["GCU-2::0"])], vec![]),
            ),
            pod(
                "share-b",
                container("c", vec![plugin(&["GCU-2::1"])], vec![]),
            ),
            // Another vendor's device with the same ID is no holder of ours.
            pod(
                "nic",
                container(
                    "main",
                    vec![ContainerDevices {
                        resource_name: "rdma/hca".into(),
                        device_ids: vec!["GCU-3".into()],
                        topology: None,
                    }],
                    vec![],
                ),
            ),
        ],
    };
    let sock = scratch.path().join("pod-resources/kubelet.sock");
    std::fs::create_dir_all(sock.parent().unwrap()).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    grpc::serve_pod_resources(&rt, &sock, answer);
    let ex = Exporter::start(
        &cfg,
        &[
            &format!("--pod-resources-socket={}", sock.display()),
            "--poll-seconds=0.5",
            "--pod-resources-seconds=0.5",
        ],
    );
    let page = ex.until("holders and values", |p| {
        p.contains("pod=\"infer\"") && samples(p, "accel_memory_used_bytes").len() == 4
    });
    let used = |has: &[&str]| value(&page, "accel_memory_used_bytes", has);
    let g = |i: u64| ((i + 1) * GIB) as f64;
    assert!(
        close(
            used(&[
                "device=\"0\"",
                "pod=\"train\"",
                "container=\"main\"",
                "namespace=\"ml\""
            ]),
            g(0)
        ),
        "{page}"
    );
    assert!(
        close(
            used(&[
                "device=\"1\"",
                "pod=\"infer\"",
                "claim=\"infer-gcu\"",
                "claim_namespace=\"ml\""
            ]),
            g(1)
        ),
        "{page}"
    );
    // Two pods share GCU-2: its value is counted once, without a pod, and both are listed.
    let shared = samples(&page, "accel_memory_used_bytes")
        .into_iter()
        .filter(|(l, _)| l.contains("device=\"2\""))
        .collect::<Vec<_>>();
    assert_eq!(shared.len(), 1, "{page}");
    assert!(!shared[0].0.contains("pod="), "{page}");
    for p in ["share-a", "share-b"] {
        assert!(
            value(
                &page,
                "accel_device_holder_info",
                &["device=\"2\"", &format!("pod=\"{p}\"")]
            )
            .is_some(),
            "{page}"
        );
    }
    assert!(
        value(
            &page,
            "accel_device_holder_info",
            &[
                "device=\"1\"",
                &format!("dra_driver=\"{driver}\""),
                &format!("dra_device=\"{dra_device}\""),
                "dra_pool=\"node-a\""
            ]
        )
        .is_some(),
        "{page}"
    );
    // The idle GCU is exported, without a pod.
    let idle = samples(&page, "accel_memory_used_bytes")
        .into_iter()
        .find(|(l, _)| l.contains("device=\"3\""))
        .expect("idle device exported");
    assert!(!idle.0.contains("pod="), "{page}");
    assert_eq!(
        value(&page, "accel_exporter_pod_resources_up", &[]),
        Some(1.0)
    );
    promtool_check(&page);

    // A real Prometheus scraping it.
    let prom_addr = free_addr();
    let data = scratch.path().join("prometheus-data");
    let prom_cfg = scratch.path().join("prometheus.yml");
    std::fs::write(
        &prom_cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n{}{}",
            servicemonitor_job(ex.addr),
            scrape_config_job(ex.addr)
        ),
    )
    .unwrap();
    let prom_log = scratch.path().join("prometheus.log");
    let mut prom = Command::new("prometheus")
        .arg(format!("--config.file={}", prom_cfg.display()))
        .arg(format!("--storage.tsdb.path={}", data.display()))
        .arg(format!("--web.listen-address={prom_addr}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&prom_log).unwrap())
        .spawn()
        .expect("prometheus (apt-get install prometheus)");
    struct Kill<'a>(&'a mut Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _prom = Kill(&mut prom);
    let query = |q: &str| -> Option<serde_json::Value> {
        let enc: String = q
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let (status, _, body) = get(prom_addr, &format!("/api/v1/query?query={enc}"), None)?;
        if status != 200 {
            return None;
        }
        serde_json::from_str(&body).ok()
    };
    let val = |s: &serde_json::Value| s["value"][1].as_str().unwrap().parse::<f64>().unwrap();
    // Issue 42 item 9: under each shipped scrape config, a series names the holder the
    // exporter gave it and no other: never the exporter's own pod (an idle GCU, the shared
    // one, the exporter's own counters).
    for job in ["servicemonitor", "scrape-config"] {
        let t = Instant::now();
        let result = loop {
            let q = format!("accel_memory_used_bytes{{profile=\"enflame\",job=\"{job}\"}}");
            if let Some(v) = query(&q) {
                let r = v["data"]["result"].as_array().cloned().unwrap_or_default();
                if r.len() == 4 {
                    break r;
                }
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "{job}: Prometheus has not scraped the exporter in 60 s\n{}",
                std::fs::read_to_string(&prom_log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(250));
        };
        let by_device = |d: &str| {
            result
                .iter()
                .find(|s| s["metric"]["device"] == d)
                .unwrap_or_else(|| panic!("{job}: device {d}: {result:?}"))
                .clone()
        };
        let d0 = by_device("0");
        assert_eq!(d0["metric"]["pod"], "train", "{job}: {d0}");
        assert_eq!(d0["metric"]["container"], "main", "{job}: {d0}");
        assert_eq!(d0["metric"]["namespace"], "ml", "{job}: {d0}");
        assert_eq!(val(&d0), g(0));
        let d1 = by_device("1");
        assert_eq!(d1["metric"]["pod"], "infer", "{job}: {d1}");
        assert_eq!(d1["metric"]["claim"], "infer-gcu");
        assert_eq!(val(&d1), g(1));
        for d in ["2", "3"] {
            let s = by_device(d);
            for l in ["namespace", "pod", "container"] {
                assert!(s["metric"].get(l).is_none(), "{job}: {l}: {s}");
            }
        }
        for l in ["namespace", "pod", "container"] {
            let held_by_exporter = query(&format!(
                "{{job=\"{job}\",{l}=~\"{}|{}|{}\"}}",
                EXPORTER_TARGET[0].1, EXPORTER_TARGET[1].1, EXPORTER_TARGET[2].1
            ))
            .unwrap();
            assert_eq!(
                held_by_exporter["data"]["result"],
                serde_json::json!([]),
                "{job}: series labelled with the exporter's own {l}"
            );
        }
        assert_eq!(d0["metric"]["node"], EXPORTER_NODE, "{job}: {d0}");
    }
    // The join operators use: memory per pod through the holder list.
    let per_pod = query(
        "sum by (pod) (accel_memory_used_bytes{job=\"servicemonitor\"} * on (profile, device) group_right accel_device_holder_info{job=\"servicemonitor\"})",
    )
    .unwrap();
    let pods: Vec<String> = per_pod["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["metric"]["pod"].as_str().unwrap_or("").to_string())
        .collect();
    for p in ["train", "infer", "share-a", "share-b"] {
        assert!(pods.contains(&p.to_string()), "{p}: {per_pod}");
    }
    // Every query of the Grafana dashboard is PromQL this Prometheus evaluates, and each
    // panel but the ones of values the stand-ins lack (clocks, errors) has data.
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("packaging/monitoring/grafana-dashboard.json"))
            .unwrap(),
    )
    .unwrap();
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"]
                .as_str()
                .unwrap()
                .replace("$node", ".*")
                .replace("$profile", ".*");
            let v = query(&expr).unwrap_or_else(|| panic!("{}: {expr}", panel["title"]));
            assert_eq!(v["status"], "success", "{}: {expr}: {v}", panel["title"]);
        }
    }
    drop(rt);
}

/// Issue 42 item 3: an NVML that lacks a symbol the exporter calls is an error said once,
/// never a panic: one lacking `nvmlShutdown` (which nvml-wrapper's Drop calls unchecked: a
/// panic, an abort in a release build) is refused at load, one lacking a reading's symbol
/// gives the other readings, and SIGTERM exits 0 with neither.
#[test]
fn nvml_lacking_a_symbol_is_an_error_said_once_and_sigterm_exits_0() {
    require_root();
    for lacking in ["nvmlShutdown", "nvmlDeviceGetPowerUsage"] {
        let sim = SimRoot::builder()
            .nvidia(&[("0000:af:00.0", 1), ("0000:3b:00.0", 3)])
            .build();
        nvml_stand_in_lacking(&sim, &[lacking]);
        let scratch = tempfile::tempdir().unwrap();
        let cfg = config(scratch.path(), &[("nvidia", sim.path())], "");
        let mut ex = Exporter::start(&cfg, &["--no-pod-resources", "--poll-seconds=0.2"]);
        let page = ex.until("three polls", |p| {
            value(p, "accel_exporter_polls_total", &["profile=\"nvidia\""])
                .is_some_and(|n| n >= 3.0)
        });
        let (status, log) = ex.stop();
        assert_eq!(status.code(), Some(0), "{lacking}: {status}\n{log}");
        assert!(!log.contains("panicked"), "{lacking}\n{log}");
        let not_in_library = |metric: &str| {
            value(
                &page,
                "accel_exporter_source_errors_total",
                &[
                    "source=\"nvml\"",
                    &format!("metric=\"{metric}\""),
                    "reason=\"not-in-library\"",
                ],
            )
        };
        if lacking == "nvmlShutdown" {
            // Refused at load: nothing read through it, the refusal counted at each poll.
            assert!(
                not_in_library("-").is_some_and(|n| n >= 3.0),
                "{lacking}\n{page}"
            );
            assert!(
                samples(&page, "accel_memory_used_bytes").is_empty(),
                "{page}"
            );
        } else {
            // Loaded: every other reading there, the one whose symbol is absent counted.
            assert!(not_in_library("power").is_some(), "{lacking}\n{page}");
            assert_eq!(samples(&page, "accel_memory_used_bytes").len(), 2, "{page}");
            assert!(samples(&page, "accel_power_watts").is_empty(), "{page}");
        }
        // The health engine refuses it too, once, in its own words.
        assert_eq!(
            log.lines()
                .filter(|l| l.contains(lacking) && !l.contains("NVML not read"))
                .count(),
            1,
            "{lacking}: said once\n{log}"
        );
    }
}

/// The exporter's sockets (accepted connections and its listener), from /proc.
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Issue 42 item 7: clients that stop reading (a request burst sent, nothing read, a receive
/// buffer of 4 KiB) and clients that send nothing, 100 of them, on the shared metrics server:
/// a scrape is still answered at once, and the server has closed every one of them within its
/// 10 s per-connection deadline.
#[test]
fn clients_that_stop_reading_neither_hold_connections_nor_deny_scrapes() {
    require_root();
    const DEADLINE: Duration = Duration::from_secs(10);
    let gpus: Vec<(String, u32)> = (0..16)
        .map(|i| (format!("0000:{:02x}:00.0", 0x10 + i), i))
        .collect();
    let gpus: Vec<(&str, u32)> = gpus.iter().map(|(b, m)| (b.as_str(), *m)).collect();
    let sim = SimRoot::builder().nvidia(&gpus).build();
    nvml_stand_in(&sim);
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(scratch.path(), &[("nvidia", sim.path())], "");
    let ex = Exporter::start(&cfg, &["--no-pod-resources", "--poll-seconds=0.5"]);
    let page = ex.until("sixteen GPUs read", |p| {
        samples(p, "accel_memory_used_bytes").len() == 16
    });
    // Larger than what a 4 KiB receive buffer and the server's send buffer take in.
    assert!(page.len() > 32 << 10, "{}", page.len());
    let pid = ex.child.id();
    let before = sockets(pid);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let burst = format!("GET /metrics HTTP/1.1\r\nHost: {}\r\n\r\n", ex.addr).repeat(64);
    let opened = Instant::now();
    let mut held: Vec<TcpStream> = Vec::new();
    for i in 0..100 {
        let s = rt.block_on(async {
            let sock = tokio::net::TcpSocket::new_v4().unwrap();
            sock.set_recv_buffer_size(4096).unwrap();
            sock.connect(ex.addr).await.unwrap().into_std().unwrap()
        });
        s.set_nonblocking(false).unwrap();
        if i < 50 {
            // Never read: the answers fill the buffers and the server's write waits.
            (&s).write_all(burst.as_bytes()).unwrap();
        }
        held.push(s);
    }
    std::thread::sleep(Duration::from_millis(300));
    let during = sockets(pid);
    assert!(
        during >= before + 40,
        "the flood reached the server: {before} -> {during}"
    );
    // A scrape is answered at once.
    let t = Instant::now();
    let mut s = TcpStream::connect_timeout(&ex.addr, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        ex.addr
    )
    .unwrap();
    let mut raw = Vec::new();
    let r = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    assert!(
        r.is_ok() && text.starts_with("HTTP/1.1 200") && text.contains("accel_device_info"),
        "no scrape answered in {:?} under 100 stalled clients ({before} -> {during} sockets): {r:?}\n{}",
        t.elapsed(),
        &text[..text.len().min(300)]
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // Every stalled connection closed by the server within its deadline (with slack for a
    // loaded machine), the clients still holding theirs open.
    while sockets(pid) > before && opened.elapsed() < DEADLINE + Duration::from_secs(4) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let after = sockets(pid);
    assert!(
        after <= before,
        "{before} sockets before, {during} during, {after} at {:?}\n{}",
        opened.elapsed(),
        std::fs::read_to_string(&ex.log).unwrap_or_default()
    );
    drop(held);
}

/// Issue 42 item 8: PodResources stops answering (the stand-in kubelet gone). Until the
/// holders' maximum age (three `List` periods by default) the device keeps its holder's
/// labels and `accel_exporter_pod_resources_stale` says they are stale, with their age; past
/// it the labels are gone, stale still 1 and the age past the limit; the log says what was
/// done when it was done.
#[test]
fn attribution_expires_when_pod_resources_stops_answering_and_says_it_is_stale() {
    require_root();
    let sim = SimRoot::builder().enflame(2).build();
    shell(sim.path());
    script(sim.path(), "/usr/bin/efsmi", EFSMI);
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(scratch.path(), &[("enflame", sim.path())], "");
    let answer = ListPodResourcesResponse {
        pod_resources: vec![PodResources {
            name: "train".into(),
            namespace: "ml".into(),
            containers: vec![ContainerResources {
                name: "main".into(),
                devices: vec![ContainerDevices {
                    resource_name: "enflame.com/gcu".into(),
                    device_ids: vec!["GCU-0".into()],
                    topology: None,
                }],
                dynamic_resources: vec![],
            }],
        }],
    };
    let sock = scratch.path().join("pod-resources/kubelet.sock");
    std::fs::create_dir_all(sock.parent().unwrap()).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    grpc::serve_pod_resources(&rt, &sock, answer);
    let ex = Exporter::start(
        &cfg,
        &[
            &format!("--pod-resources-socket={}", sock.display()),
            "--poll-seconds=0.5",
            "--pod-resources-seconds=1",
        ],
    );
    let held = |p: &str| {
        value(
            p,
            "accel_device_healthy",
            &["device=\"0\"", "pod=\"train\"", "container=\"main\""],
        )
        .is_some()
            && value(
                p,
                "accel_device_holder_info",
                &["device=\"0\"", "pod=\"train\""],
            )
            .is_some()
    };
    ex.until("the holder's labels", held);
    // kubelet stops answering.
    rt.shutdown_background();
    let stopped = Instant::now();
    let stale = |p: &str| value(p, "accel_exporter_pod_resources_stale", &[]);
    let age = |p: &str| value(p, "accel_exporter_pod_resources_age_seconds", &[]);
    let mut seen_stale_held = None;
    let dropped = loop {
        let (_, _, page) = get(ex.addr, "/metrics", None).expect("scrape");
        let t = stopped.elapsed();
        if held(&page) {
            if stale(&page) == Some(1.0) {
                seen_stale_held = Some((t, age(&page)));
            }
        } else {
            break Some((t, page));
        }
        if t > Duration::from_secs(15) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = || std::fs::read_to_string(&ex.log).unwrap_or_default();
    let Some((t, page)) = dropped else {
        panic!(
            "the holder's labels still on device 0 15 s after PodResources stopped answering\n{}",
            log()
        );
    };
    let (t_stale, age_stale) = seen_stale_held.unwrap_or_else(|| {
        panic!(
            "never labelled and marked stale before the labels went\n{page}\n{}",
            log()
        )
    });
    // Kept for the maximum age (3 s here) from the last answer (at most one period, 1 s,
    // before the stand-in stopped), then dropped.
    assert!(
        t >= Duration::from_millis(1500) && t < Duration::from_secs(8),
        "dropped {t:?} after PodResources stopped\n{}",
        log()
    );
    assert!(
        age_stale.is_some_and(|a| a > 0.0 && a <= 3.5),
        "age {age_stale:?} at {t_stale:?}"
    );
    assert_eq!(stale(&page), Some(1.0), "{page}");
    assert!(age(&page).is_some_and(|a| a > 3.0), "{page}");
    assert!(!page.contains("pod=\"train\""), "{page}");
    assert_eq!(
        value(&page, "accel_exporter_pod_resources_up", &[]),
        Some(0.0)
    );
    let log = log();
    assert!(
        log.lines()
            .any(|l| l.contains("PodResources") && l.contains("kept")),
        "{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("PodResources") && l.contains("dropped")),
        "{log}"
    );
}

/// Issue 41: `accel_device_healthy` and its `reason` come from the daemons' health engine.
/// Two GCUs with known PCI functions, old counts (no failure); GCU 1's AER fatal count rises:
/// 0 with the reason's short name (the DRA taint's value; the whole line in the log) and
/// `accel_device_unhealthy_since_seconds` the time it turned, GCU 0 stays 1 without one; then
/// GCU 0's RAS `umc` uncorrectable count rises: 0 naming the block, GCU 1's time unchanged;
/// GCU 1's count back at its baseline (a reset): 1 again after the hold-down, its time gone.
#[test]
fn accel_device_healthy_follows_the_health_engine_with_its_reason() {
    require_root();
    let sim = SimRoot::builder().enflame(2).build();
    common::kubelet::enflame_sysfs(sim.path(), sim.enflame_major().unwrap());
    // enflame_sysfs: GCU n is PCI function 0000:1n:00.0.
    let (zero, one) = (
        func_dir(sim.path(), "0000:10:00.0"),
        func_dir(sim.path(), "0000:11:00.0"),
    );
    let fatal = common::health::aer_fatal;
    fatal(&zero, 1);
    fatal(&one, 1);
    common::health::ras(&zero, "umc", 2, 40);
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(scratch.path(), &[("enflame", sim.path())], "");
    let ex = Exporter::start(
        &cfg,
        &[&["--no-pod-resources"][..], &common::health::FAST_FLAGS].concat(),
    );
    let healthy =
        |p: &str, dev: &str| value(p, "accel_device_healthy", &[&format!("device=\"{dev}\"")]);
    let page = ex.until("both GCUs", |p| {
        healthy(p, "0").is_some() && healthy(p, "1").is_some()
    });
    assert_eq!(
        healthy(&page, "0"),
        Some(1.0),
        "old counts are no failure\n{page}"
    );
    assert_eq!(healthy(&page, "1"), Some(1.0), "{page}");

    let unix = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as f64
    };
    let since = |p: &str, dev: &str| {
        value(
            p,
            "accel_device_unhealthy_since_seconds",
            &[&format!("device=\"{dev}\"")],
        )
    };
    assert_eq!(since(&page, "1"), None, "only while unhealthy\n{page}");
    let before = unix().floor();
    fatal(&one, 2);
    let page = ex.until("GCU 1 unhealthy", |p| healthy(p, "1") == Some(0.0));
    let at = since(&page, "1").expect("since exported while unhealthy");
    assert!(
        at >= before && at <= unix(),
        "{at} not in [{before}, now]\n{page}"
    );
    assert!(
        value(
            &page,
            "accel_device_unhealthy_since_seconds",
            &["device=\"1\"", "reason=\"aer-fatal\""]
        )
        .is_some(),
        "{page}"
    );
    assert_eq!(since(&page, "0"), None, "{page}");
    assert!(
        value(
            &page,
            "accel_device_healthy",
            &["device=\"1\"", "reason=\"aer-fatal\""]
        )
        .is_some(),
        "{page}"
    );
    assert_eq!(healthy(&page, "0"), Some(1.0), "{page}");
    let log = std::fs::read_to_string(&ex.log).unwrap();
    assert!(
        log.contains(
            "device \"1\" is unhealthy: 1 fatal PCIe (AER) error(s) on 0000:11:00.0 since it \
             was first read"
        ),
        "the whole line in the log\n{log}"
    );

    common::health::ras(&zero, "umc", 3, 40);
    let page = ex.until("GCU 0 unhealthy", |p| healthy(p, "0") == Some(0.0));
    assert_eq!(since(&page, "1"), Some(at), "kept while unhealthy\n{page}");
    assert!(
        value(
            &page,
            "accel_device_healthy",
            &["device=\"0\"", "reason=\"ras-ue-umc\""]
        )
        .is_some(),
        "{page}"
    );

    // A count back at its baseline: clear, and 1 only once clear for the hold-down.
    fatal(&one, 1);
    let t = Instant::now();
    let page = ex.until("GCU 1 healthy again", |p| healthy(p, "1") == Some(1.0));
    assert_eq!(since(&page, "1"), None, "gone once healthy\n{page}");
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    let log = std::fs::read_to_string(&ex.log).unwrap();
    assert_eq!(
        log.matches("device \"1\" is healthy again").count(),
        1,
        "{log}"
    );
}

/// Issue 41: NVIDIA's signals through NVML (a stand-in library driven by a control file)
/// reach `accel_device_healthy` with their reason. Three GPUs, GPU 1 with an old ECC count (no
/// failure): XID 13 (an application's) changes nothing, XID 79 on GPU 0 is 0 naming it; GPU 1's
/// volatile uncorrected ECC count rising and GPU 2's row remap pending are 0 naming them; a
/// failed event wait is said once, makes no GPU unhealthy, and is said to be over when it is;
/// the library is loaded and initialised once in the process (the metrics' and the health
/// engine's NVML shared: the stand-in logs each load, init and shutdown), shut down once at
/// SIGTERM, which exits 0.
#[test]
fn nvml_xid_ecc_and_remap_reach_accel_device_healthy_with_their_reason() {
    require_root();
    let sim = SimRoot::builder()
        .nvidia(&[
            ("0000:3b:00.0", 0),
            ("0000:af:00.0", 1),
            ("0000:d8:00.0", 2),
        ])
        .build();
    let control = common::nvml::stand_in(&sim, &[]);
    let set = |text: &str| common::nvml::write_control(&control, text);
    set("ecc 1 4\n");
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(scratch.path(), &[("nvidia", sim.path())], "");
    let mut ex = Exporter::start(
        &cfg,
        &[&["--no-pod-resources"][..], &common::health::FAST_FLAGS].concat(),
    );
    // An NVIDIA device is named by its UUID; GPU i here.
    let uuids: Vec<String> = sim.gpus().iter().map(|g| g.uuid.clone()).collect();
    let dev = |i: &str| uuids[i.parse::<usize>().unwrap()].clone();
    let healthy = |p: &str, i: &str| {
        value(
            p,
            "accel_device_healthy",
            &[&format!("device=\"{}\"", dev(i))],
        )
    };
    let reason = |p: &str, i: &str, why: &str| {
        value(
            p,
            "accel_device_healthy",
            &[
                &format!("device=\"{}\"", dev(i)),
                &format!("reason=\"{why}\""),
            ],
        ) == Some(0.0)
    };
    let page = ex.until("three GPUs", |p| {
        (0..3).all(|i| healthy(p, &i.to_string()).is_some())
    });
    for i in 0..3 {
        assert_eq!(healthy(&page, &i.to_string()), Some(1.0), "{page}");
    }
    let log = || std::fs::read_to_string(&ex.log).unwrap();
    // One library in the process, initialised once: the metrics' NVML, which the health
    // engine finds initialised and shares.
    let pid = ex.child.id();
    let ours = |what: &str| {
        common::nvml::calls(&control)
            .iter()
            .filter(|(w, p)| w == what && *p == pid)
            .count()
    };
    assert_eq!(
        (ours("load"), ours("init")),
        (1, 1),
        "{:?}",
        common::nvml::calls(&control)
    );

    set("ecc 1 4\nxid 0 13 1\n");
    let t = Instant::now();
    while !log().contains("XID 13, an application error") {
        assert!(t.elapsed() < Duration::from_secs(3), "{}", log());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(healthy(&ex.scrape(), "0"), Some(1.0));

    set("ecc 1 4\nxid 0 13 1\nxid 0 79 2\n");
    let page = ex.until("GPU 0 unhealthy", |p| healthy(p, "0") == Some(0.0));
    assert!(reason(&page, "0", "xid-79"), "{page}");
    assert_eq!(healthy(&page, "1"), Some(1.0), "{page}");

    set("ecc 1 6\nxid 0 13 1\nxid 0 79 2\nremap 2 pending\n");
    let page = ex.until("GPUs 1 and 2 unhealthy", |p| {
        healthy(p, "1") == Some(0.0) && healthy(p, "2") == Some(0.0)
    });
    assert!(reason(&page, "1", "ecc"), "{page}");
    assert!(reason(&page, "2", "row-remap"), "{page}");
    let said = log();
    for line in [
        "is unhealthy: XID 79 on GPU 0000:3b:00.0",
        "is unhealthy: 2 uncorrected ECC error(s) on GPU 0000:af:00.0 since it was first read \
         (volatile count 6)",
        "is unhealthy: row remapping pending on GPU 0000:d8:00.0 (it needs a reset)",
    ] {
        assert!(said.contains(line), "{line}\n{said}");
    }

    // Clear on GPUs 1 and 2 (a reset zeroes the volatile count), and every wait failing.
    set("xid 0 13 1\nxid 0 79 2\nwaitfail\n");
    let page = ex.until("GPUs 1 and 2 healthy again", |p| {
        healthy(p, "1") == Some(1.0) && healthy(p, "2") == Some(1.0)
    });
    assert_eq!(
        healthy(&page, "0"),
        Some(0.0),
        "an XID holds until a reset\n{page}"
    );
    std::thread::sleep(Duration::from_millis(1500));
    let page = ex.scrape();
    assert_eq!(
        healthy(&page, "1"),
        Some(1.0),
        "a failed wait is no GPU failure\n{page}"
    );
    assert_eq!(healthy(&page, "2"), Some(1.0), "{page}");
    set("xid 0 13 1\nxid 0 79 2\n");
    let t = Instant::now();
    while !log().contains("NVML events are read again") {
        assert!(t.elapsed() < Duration::from_secs(4), "{}", log());
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, log) = ex.stop();
    assert_eq!(status.code(), Some(0), "{status}\n{log}");
    assert_eq!(
        (ours("load"), ours("init"), ours("shutdown")),
        (1, 1, 1),
        "the one init shut down at exit: {:?}",
        common::nvml::calls(&control)
    );
    assert_eq!(
        log.matches("waiting for NVML events failed").count(),
        1,
        "said once\n{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
}

/// Issue 41: an NVML lacking functions the health engine calls: one lacking the remapped-rows
/// and event-wait functions is said once, the GPU still judged by its ECC count; one lacking
/// `nvmlShutdown` is refused by the engine (said once, tried again later) and no GPU is
/// unhealthy for it. SIGTERM exits 0 with either.
#[test]
fn nvml_health_lacking_a_symbol_is_said_once_and_the_gpu_judged_by_the_rest() {
    require_root();
    for lacking in [
        &["nvmlDeviceGetRemappedRows", "nvmlEventSetWait_v2"][..],
        &["nvmlShutdown"][..],
    ] {
        let sim = SimRoot::builder()
            .nvidia(&[("0000:3b:00.0", 0), ("0000:af:00.0", 1)])
            .build();
        let control = common::nvml::stand_in(&sim, lacking);
        common::nvml::write_control(&control, "remap 0 failed\n");
        let scratch = tempfile::tempdir().unwrap();
        let cfg = config(scratch.path(), &[("nvidia", sim.path())], "");
        let mut ex = Exporter::start(
            &cfg,
            &[&["--no-pod-resources"][..], &common::health::FAST_FLAGS].concat(),
        );
        let uuids: Vec<String> = sim.gpus().iter().map(|g| g.uuid.clone()).collect();
        let dev = |i: &str| uuids[i.parse::<usize>().unwrap()].clone();
        let healthy = |p: &str, i: &str| {
            value(
                p,
                "accel_device_healthy",
                &[&format!("device=\"{}\"", dev(i))],
            )
        };
        let page = ex.until("two GPUs", |p| {
            healthy(p, "0").is_some() && healthy(p, "1").is_some()
        });
        assert_eq!(
            healthy(&page, "0"),
            Some(1.0),
            "{lacking:?}: remap not read\n{page}"
        );
        common::nvml::write_control(&control, "remap 0 failed\nxid 1 79 1\necc 1 3\n");
        if lacking[0] == "nvmlShutdown" {
            std::thread::sleep(Duration::from_millis(1500));
            let page = ex.scrape();
            assert_eq!(healthy(&page, "1"), Some(1.0), "{page}");
        } else {
            let page = ex.until("GPU 1 unhealthy by its ECC count", |p| {
                healthy(p, "1") == Some(0.0)
            });
            assert!(
                value(
                    &page,
                    "accel_device_healthy",
                    &[&format!("device=\"{}\"", dev("1")), "reason=\"ecc\""]
                )
                .is_some(),
                "the XID is not read without the wait\n{page}"
            );
        }
        let (status, log) = ex.stop();
        assert_eq!(status.code(), Some(0), "{lacking:?}: {status}\n{log}");
        assert!(!log.contains("panicked"), "{log}");
        let said: Vec<&str> = log.lines().filter(|l| l.contains(lacking[0])).collect();
        // The engine says it once; the exporter's NVML metrics source refuses a library
        // without nvmlShutdown once more, in its own words.
        let engine: Vec<&&str> = said
            .iter()
            .filter(|l| !l.contains("not an NVML the exporter can use"))
            .collect();
        assert_eq!(engine.len(), 1, "{lacking:?}: said once\n{log}");
    }
}

/// Issue 41: a vendor tool's health through the exporter binary. A stand-in `efsmi` in the
/// simulated driver root (run chrooted there, busybox its shell) prints each GCU's bus id and
/// health from a file the test writes: GCU 1 reported `Fault` is 0 with `reason="efsmi"`,
/// and 1 again once the tool says `OK`; a tool that hangs is killed at the limit config.toml
/// set for it (`[profiles.enflame.health.tool] timeout-seconds = 1`, not the profile's 5),
/// judges nothing (GCU 1, reported before, is 1 again) and is said once in the log however
/// often it hangs.
#[test]
fn a_gcu_efsmi_reports_is_unhealthy_and_a_hanging_efsmi_judges_nothing() {
    require_root();
    let sim = SimRoot::builder().enflame(2).build();
    common::kubelet::enflame_sysfs(sim.path(), sim.enflame_major().unwrap());
    let root = sim.path();
    let health = common::health::stand_in_efsmi(root);
    health("Fault");
    let scratch = tempfile::tempdir().unwrap();
    // The tool's limit set short in config.toml, over the profile's 5 s.
    let cfg = config(
        scratch.path(),
        &[("enflame", root)],
        "[profiles.enflame.health.tool]\ntimeout-seconds = 1\n",
    );
    let ex = Exporter::start(
        &cfg,
        &[&["--no-pod-resources"][..], &common::health::FAST_FLAGS].concat(),
    );
    let healthy =
        |p: &str, dev: &str| value(p, "accel_device_healthy", &[&format!("device=\"{dev}\"")]);
    let page = ex.until("GCU 1 reported", |p| healthy(p, "1") == Some(0.0));
    assert!(
        value(
            &page,
            "accel_device_healthy",
            &["device=\"1\"", "reason=\"efsmi\""]
        )
        .is_some(),
        "{page}"
    );
    assert_eq!(healthy(&page, "0"), Some(1.0), "{page}");
    health("OK");
    ex.until("GCU 1 healthy", |p| healthy(p, "1") == Some(1.0));

    health("Fault");
    ex.until("GCU 1 reported again", |p| healthy(p, "1") == Some(0.0));
    write(&root.join("efsmi-hangs"), "");
    let t = Instant::now();
    ex.until("the hanging efsmi judges nothing", |p| {
        healthy(p, "1") == Some(1.0)
    });
    // Killed at the 1 s limit config.toml set, not the profile's 5 s.
    assert!(
        t.elapsed() >= Duration::from_millis(900) && t.elapsed() < Duration::from_secs(4),
        "{:?}",
        t.elapsed()
    );
    // Hung again at least once more: still said once.
    std::thread::sleep(Duration::from_secs(3));
    let log = std::fs::read_to_string(&ex.log).unwrap();
    assert_eq!(log.matches("health from efsmi").count(), 1, "{log}");
    assert!(log.contains("still running after 1s; killed"), "{log}");
}

/// Issue 41: `[health.tool]` read as the daemon starts: a bad value in config.toml's override
/// stops the exporter with one line naming the key; an unknown key is warned of with the
/// nearest, and the exporter runs.
#[test]
fn a_bad_health_tool_key_stops_the_exporter_naming_it() {
    let sim = SimRoot::builder().enflame(1).build();
    let scratch = tempfile::tempdir().unwrap();
    let cfg = config(
        scratch.path(),
        &[("enflame", sim.path())],
        "[profiles.enflame.health.tool]\ntimeout-seconds = 0\n",
    );
    let out = Command::new(&*EXPORTER)
        .arg(format!("--listen={}", free_addr()))
        .arg("--no-pod-resources")
        .env("ACCEL_CONTAINER_RUNTIME_CONFIG", &cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("health.tool.timeout-seconds"))
        .collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(said[0].contains("must be between 0.01 and 120"), "{err}");

    let cfg = config(
        scratch.path(),
        &[("enflame", sim.path())],
        "[profiles.enflame.health.tool]\ntimeout-secnds = 1\n",
    );
    let mut ex = Exporter::start(&cfg, &["--no-pod-resources", "--poll-seconds=0.2"]);
    ex.until("a page", |p| p.contains("accel_device_info"));
    let (status, log) = ex.stop();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(
        log.contains(
            "unknown key `health.tool.timeout-secnds` ignored (did you mean `timeout-seconds`?)"
        ),
        "{log}"
    );
}
