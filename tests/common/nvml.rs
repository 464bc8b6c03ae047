//! A stand-in NVML for the health engine (src/health/nvml.rs): a C library compiled with gcc
//! into the simulated driver root as `libnvidia-ml.so.1`, exporting the functions the engine
//! calls (and the handle look-up by UUID the exporter requires), each answering from a control
//! file the test writes, read again at every call. One line per fact, GPUs by their index in
//! the root's bus-id order:
//! - `xid <gpu> <code> <seq>`: an XID event, delivered once by `nvmlEventSetWait_v2` to a set
//!   the GPU is registered in, in `seq` order (each `seq` larger than the last delivered);
//! - `dbe <gpu> <seq>`: a double-bit ECC event, likewise;
//! - `ecc <gpu> <count>`: the volatile uncorrected ECC count (0 without the line);
//! - `remap <gpu> pending|failed`: the remapped-rows state;
//! - `lost <gpu>`: every call on the GPU answers `NVML_ERROR_GPU_IS_LOST` (15); the line
//!   removed, it answers again: a reset;
//! - `waitfail`: every wait fails (`NVML_ERROR_UNKNOWN`, 999).
//!
//! Each time the library is loaded into a process (its constructor), and each `nvmlInit_v2` and
//! `nvmlShutdown`, appends a line (`load <pid>`, `init <pid>`, `shutdown <pid>`) to the
//! control file's `.calls` sibling ([`calls`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{SimRoot, LIB_DIR};

/// Builds the stand-in into `sim` with the functions `lacking` left out of its symbol table
/// (renamed), and returns its control file (empty: every GPU clear).
pub fn stand_in(sim: &SimRoot, lacking: &[&str]) -> PathBuf {
    let control = sim.path().join("nvml-control");
    write_control(&control, "");
    let renamed: String = lacking
        .iter()
        .map(|s| format!("#define {s} {s}_absent\n"))
        .collect();
    let quoted = |v: Vec<String>| {
        v.iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let uuids = quoted(sim.gpus().iter().map(|g| g.uuid.clone()).collect());
    let buses = quoted(sim.gpus().iter().map(|g| g.bus.clone()).collect());
    let n = sim.gpus().len();
    let src = format!(
        r#"{renamed}
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
typedef struct {{ int i; }} dev;
typedef struct {{ dev *device; unsigned long long type, data; unsigned int gi, ci; }} evdata;
static dev devs[{n}];
static const char *uuids[] = {{ {uuids} }};
static const char *buses[] = {{ {buses} }};
static int inits = 0;
static int registered[{n}];
static long delivered = 0;

/* The control file into buf (NUL-terminated), 0 where absent. */
static int load(char *buf, int len) {{
  FILE *f = fopen("{control}", "r");
  if (!f) {{ buf[0] = 0; return 0; }}
  size_t r = fread(buf, 1, len - 1, f); buf[r] = 0; fclose(f); return 1; }}
/* Whether a line "<word> <gpu>" (or "<word>" for gpu -1) is there; its next field in rest. */
static int line(const char *word, int gpu, char *rest, int restlen) {{
  char buf[8192]; load(buf, sizeof buf);
  char *save = 0;
  for (char *l = strtok_r(buf, "\n", &save); l; l = strtok_r(0, "\n", &save)) {{
    char w[32]; int g = -1, used = 0;
    if (gpu < 0) {{ if (sscanf(l, "%31s%n", w, &used) == 1 && !strcmp(w, word)) return 1; continue; }}
    if (sscanf(l, "%31s %d %n", w, &g, &used) >= 2 && !strcmp(w, word) && g == gpu) {{
      if (rest) {{ strncpy(rest, l + used, restlen - 1); rest[restlen - 1] = 0; }}
      return 1; }}
  }}
  return 0; }}
static int lost(dev *d) {{ return line("lost", d->i, 0, 0); }}
static void said(const char *what) {{
  FILE *f = fopen("{control}.calls", "a");
  if (f) {{ fprintf(f, "%s %d\n", what, (int)getpid()); fclose(f); }} }}
__attribute__((constructor)) static void loaded(void) {{ said("load"); }}

int nvmlInit_v2(void) {{ for (int i = 0; i < {n}; i++) devs[i].i = i; inits++; said("init"); return 0; }}
int nvmlShutdown(void) {{ if (inits > 0) inits--; said("shutdown"); return 0; }}
int nvmlDeviceGetHandleByUUID(const char *u, dev **d) {{
  if (!inits) return 1;
  for (int i = 0; i < {n}; i++) if (!strcmp(u, uuids[i])) {{ *d = &devs[i]; return lost(&devs[i]) ? 15 : 0; }}
  return 6; }}
int nvmlDeviceGetHandleByPciBusId_v2(const char *b, dev **d) {{
  if (!inits) return 1;
  for (int i = 0; i < {n}; i++) if (strcasestr(b, buses[i] + 5)) {{ *d = &devs[i]; return lost(&devs[i]) ? 15 : 0; }}
  return 6; }}
int nvmlEventSetCreate(void **set) {{ *set = &delivered; return 0; }}
int nvmlEventSetFree(void *set) {{ return 0; }}
int nvmlDeviceGetSupportedEventTypes(dev *d, unsigned long long *t) {{ *t = 0x1 | 0x2 | 0x8; return 0; }}
int nvmlDeviceRegisterEvents(dev *d, unsigned long long types, void *set) {{
  if (lost(d)) return 15;
  registered[d->i] = 1; return 0; }}
int nvmlEventSetWait_v2(void *set, evdata *e, unsigned int ms) {{
  if (ms > 100) ms = 100;
  if (line("waitfail", -1, 0, 0)) {{ usleep(ms * 1000); return 999; }}
  char buf[8192]; load(buf, sizeof buf);
  long best = -1; int bi = 0; unsigned long long btype = 0, bcode = 0;
  char *save = 0;
  for (char *l = strtok_r(buf, "\n", &save); l; l = strtok_r(0, "\n", &save)) {{
    int g; long code = 0, seq; unsigned long long type;
    if (sscanf(l, "xid %d %ld %ld", &g, &code, &seq) == 3) type = 0x8;
    else if (sscanf(l, "dbe %d %ld", &g, &seq) == 2) type = 0x2;
    else continue;
    if (g < 0 || g >= {n} || !registered[g] || seq <= delivered) continue;
    if (best < 0 || seq < best) {{ best = seq; bi = g; btype = type; bcode = code; }}
  }}
  if (best < 0) {{ usleep(ms * 1000); return 10; }}
  delivered = best;
  e->device = &devs[bi]; e->type = btype; e->data = bcode; e->gi = e->ci = 0xffffffff;
  return 0; }}
int nvmlDeviceGetTotalEccErrors(dev *d, int type, int counter, unsigned long long *n) {{
  if (lost(d)) return 15;
  char rest[64]; *n = 0;
  if (type == 1 && counter == 0 && line("ecc", d->i, rest, sizeof rest)) sscanf(rest, "%llu", n);
  return 0; }}
int nvmlDeviceGetRemappedRows(dev *d, unsigned int *c, unsigned int *u, unsigned int *p, unsigned int *f) {{
  if (lost(d)) return 15;
  char rest[64] = ""; *c = *u = *p = *f = 0;
  if (line("remap", d->i, rest, sizeof rest)) {{ *p = !strncmp(rest, "pending", 7); *f = !strncmp(rest, "failed", 6); }}
  return 0; }}
const char *nvmlErrorString(int r) {{ return r == 15 ? "GPU is lost" : "stand-in error"; }}
"#,
        control = control.display(),
    );
    let dir = sim.path().join(&LIB_DIR[1..]);
    let c = sim.path().join("nvml-health.c");
    std::fs::write(&c, src).unwrap();
    let lib = dir.join("libnvidia-ml.so.550.54.14");
    let _ = std::fs::remove_file(&lib);
    let _ = std::fs::remove_file(dir.join("libnvidia-ml.so.1"));
    run(Command::new("gcc")
        .args([
            "-shared",
            "-fPIC",
            "-O1",
            "-Wl,-soname,libnvidia-ml.so.1",
            "-o",
        ])
        .arg(&lib)
        .arg(&c));
    std::os::unix::fs::symlink("libnvidia-ml.so.550.54.14", dir.join("libnvidia-ml.so.1")).unwrap();
    run(Command::new("ldconfig").arg("-r").arg(sim.path()));
    control
}

/// The calls the stand-in of `control` logged so far: (`load`/`init`/`shutdown`, pid).
pub fn calls(control: &Path) -> Vec<(String, u32)> {
    std::fs::read_to_string(control.with_extension("calls"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (what, pid) = l.split_once(' ')?;
            Some((what.to_string(), pid.parse().ok()?))
        })
        .collect()
}

/// Replaces the control file whole (renamed into place: a call never reads half of it).
pub fn write_control(control: &Path, text: &str) {
    let tmp = control.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, control).unwrap();
}

fn run(c: &mut Command) {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{c:?}: {:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
