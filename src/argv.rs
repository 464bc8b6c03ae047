//! Finding the command, the bundle and the engine's log in runc's argv, without parsing it.
//!
//! The argv is never rewritten: it is exec'd as received. Only what the shim needs is read:
//! the command after runc's global flags, `--bundle`/`-b` for `create`/`run`, and the
//! engine's `--log`/`--log-format` so errors can go where containerd looks for them.
//! urfave/cli (runc's parser) accepts `-flag` and `--flag`, with the value as the next
//! argument or after `=`; all of those are handled, for the global flags of crun (argp) and
//! youki (clap) as well, so the command is found whichever low-level runtime is configured.
//! `create`/`run` asking for help (`-h`, `--help`) is not a create: the low-level runtime
//! prints its help, as the engine's user expects.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// Global flags that take a value (the rest are booleans): runc's (`runc --help`), crun's
/// (`--log-level`, `--cgroup-manager`; crun(1)) and youki's (`-r`, `-l`, `--log-level`;
/// liboci-cli's `GlobalOpts` and youki's `--log-level`).
const GLOBAL_VALUE_FLAGS: &[&str] = &[
    "root",
    "r",
    "log",
    "l",
    "log-format",
    "log-level",
    "criu",
    "rootless",
    "cgroup-manager",
];
/// `create`/`run` flags that take a value.
const CREATE_VALUE_FLAGS: &[&str] = &["bundle", "b", "console-socket", "pid-file", "preserve-fds"];

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The runc command (`create`, `start`, ...), if any.
    pub command: Option<String>,
    /// `--bundle` of `create`/`run` as given (relative to cwd); `None` means cwd.
    pub bundle: Option<PathBuf>,
    /// The container id (first positional argument after the command).
    pub id: Option<String>,
    /// The engine's `--log FILE`.
    pub log: Option<PathBuf>,
    /// `--log-format json`.
    pub log_json: bool,
    pub version: bool,
    /// `create -h`/`--help` (and `run`): the low-level runtime prints its help.
    pub help: bool,
}

impl Invocation {
    /// Whether runc will create a container from a bundle (so the shim edits it first).
    pub fn creates(&self) -> bool {
        !self.help && self.is_create_command()
    }

    fn is_create_command(&self) -> bool {
        matches!(self.command.as_deref(), Some("create" | "run"))
    }
}

/// Splits `-x`, `--x`, `--x=v` into (name, inline value); `None` for a non-flag.
fn flag(arg: &[u8]) -> Option<(&[u8], Option<&[u8]>)> {
    let body = arg.strip_prefix(b"--").or_else(|| arg.strip_prefix(b"-"))?;
    if body.is_empty() {
        return None;
    }
    Some(match body.iter().position(|&b| b == b'=') {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    })
}

fn os(b: &[u8]) -> OsString {
    std::ffi::OsStr::from_bytes(b).to_os_string()
}

/// Scans argv (without argv[0]).
pub fn scan(args: &[OsString]) -> Invocation {
    let mut inv = Invocation::default();
    let mut i = 0;
    // Global flags, up to the command.
    while i < args.len() {
        let a = args[i].as_bytes();
        if a == b"--" {
            i += 1;
            break;
        }
        let Some((name, inline)) = flag(a) else { break };
        let takes_value = GLOBAL_VALUE_FLAGS.iter().any(|f| f.as_bytes() == name);
        let value = match (takes_value, inline) {
            (true, Some(v)) => Some(v),
            (true, None) => {
                i += 1;
                args.get(i).map(|v| v.as_bytes())
            }
            (false, _) => None,
        };
        match name {
            b"log" => inv.log = value.map(|v| PathBuf::from(os(v))),
            b"log-format" => inv.log_json = value == Some(b"json"),
            b"version" | b"v" => inv.version = true,
            _ => {}
        }
        i += 1;
    }
    let Some(cmd) = args.get(i) else { return inv };
    inv.command = Some(cmd.to_string_lossy().into_owned());
    if !inv.is_create_command() {
        return inv;
    }
    i += 1;
    while i < args.len() {
        let a = args[i].as_bytes();
        if a == b"--" {
            if inv.id.is_none() {
                inv.id = args.get(i + 1).map(|v| v.to_string_lossy().into_owned());
            }
            break;
        }
        match flag(a) {
            Some((name, inline)) => {
                let takes_value = CREATE_VALUE_FLAGS.iter().any(|f| f.as_bytes() == name);
                let value = if takes_value && inline.is_none() {
                    i += 1;
                    args.get(i).map(|v| v.as_bytes())
                } else {
                    inline
                };
                match name {
                    b"bundle" | b"b" => inv.bundle = value.map(|v| PathBuf::from(os(v))),
                    b"help" | b"h" => inv.help = true,
                    _ => {}
                }
            }
            None if inv.id.is_none() => inv.id = Some(args[i].to_string_lossy().into_owned()),
            None => {}
        }
        i += 1;
    }
    inv
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Invocation {
        scan(&v.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn containerd_create() {
        let inv = s(&[
            "--root",
            "/run/containerd/runc/k8s.io",
            "--log",
            "/b/log.json",
            "--log-format",
            "json",
            "--systemd-cgroup",
            "create",
            "--bundle",
            "/b",
            "--pid-file",
            "/b/init.pid",
            "--console-socket",
            "/tmp/s",
            "ctr1",
        ]);
        assert_eq!(inv.command.as_deref(), Some("create"));
        assert_eq!(inv.bundle, Some(PathBuf::from("/b")));
        assert_eq!(inv.log, Some(PathBuf::from("/b/log.json")));
        assert!(inv.log_json);
        assert_eq!(inv.id.as_deref(), Some("ctr1"));
    }

    #[test]
    fn docker_create_with_equals_and_single_dash() {
        let inv = s(&[
            "-root=/var/run/docker/runtime-runc/moby",
            "--log=/x/log.json",
            "--log-format=json",
            "create",
            "-bundle=/b",
            "id",
        ]);
        assert_eq!(inv.bundle, Some(PathBuf::from("/b")));
        assert_eq!(inv.log, Some(PathBuf::from("/x/log.json")));
        assert!(inv.log_json && inv.creates());
        let inv = s(&["create", "-b", "/c", "id"]);
        assert_eq!(inv.bundle, Some(PathBuf::from("/c")));
    }

    #[test]
    fn bundle_named_create_and_default_cwd() {
        let inv = s(&["--root", "create", "create", "--bundle", "create", "run"]);
        assert_eq!(inv.command.as_deref(), Some("create"));
        assert_eq!(inv.bundle, Some(PathBuf::from("create")));
        assert_eq!(inv.id.as_deref(), Some("run"));
        let inv = s(&["run", "-d", "x"]);
        assert!(inv.creates() && inv.bundle.is_none());
    }

    /// crun's and youki's global flags, in both forms, do not hide the command.
    #[test]
    fn crun_and_youki_global_flags() {
        for args in [
            &["--log-level", "debug", "create", "--bundle", "/b", "id"][..],
            &["--log-level=debug", "create", "--bundle", "/b", "id"],
            &["--cgroup-manager", "systemd", "create", "-b", "/b", "id"],
            &[
                "--cgroup-manager=disabled",
                "--systemd-cgroup",
                "create",
                "-b",
                "/b",
                "id",
            ],
            &[
                "-r",
                "/run/youki",
                "-l",
                "/x.log",
                "--debug",
                "create",
                "-b",
                "/b",
                "id",
            ],
            &[
                "--root=/run/crun",
                "--log=/x.log",
                "--log-level",
                "warning",
                "create",
                "-b",
                "/b",
                "id",
            ],
        ] {
            let inv = s(args);
            assert!(inv.creates(), "{args:?}");
            assert_eq!(inv.bundle, Some(PathBuf::from("/b")), "{args:?}");
            assert_eq!(inv.id.as_deref(), Some("id"), "{args:?}");
        }
    }

    #[test]
    fn help_is_not_a_create() {
        for args in [
            &["create", "-h"][..],
            &["create", "--help"],
            &["run", "-h"],
            &["--root", "/r", "run", "--bundle", "/b", "--help", "id"],
        ] {
            let inv = s(args);
            assert!(!inv.creates() && inv.help, "{args:?}");
        }
        // A value that happens to be `-h` is a value.
        assert!(s(&["create", "--pid-file", "-h", "id"]).creates());
    }

    #[test]
    fn pass_through_commands() {
        for cmd in [
            "start",
            "state",
            "kill",
            "delete",
            "exec",
            "update",
            "ps",
            "events",
            "pause",
            "resume",
            "features",
            "checkpoint",
            "restore",
            "bogus",
        ] {
            let inv = s(&["--debug", "--rootless", "false", cmd, "--bundle", "/x"]);
            assert_eq!(inv.command.as_deref(), Some(cmd));
            assert!(!inv.creates());
            assert_eq!(inv.bundle, None, "bundle must not be read for {cmd}");
        }
        assert!(s(&["--version"]).version);
        assert_eq!(s(&["--help"]).command, None);
        assert_eq!(s(&[]), Invocation::default());
    }
}
