//! The low-level runtime (runc) and its known device bugs.

use std::io::ErrorKind;
use std::path::Path;
use std::process::Command;

use super::{is_executable, Ctx, Finding, RUNC_MIN};
use crate::config::Config;
/// `(major, minor, patch)` from `runc --version` output (`runc version 1.1.5+ds1`).
pub fn parse_runc_version(output: &str) -> Option<(u64, u64, u64)> {
    let v = output
        .lines()
        .find_map(|l| l.strip_prefix("runc version "))?
        .trim();
    let mut nums = v.split(['.', '-', '+', '~']).map(|p| {
        let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u64>().ok()
    });
    Some((
        nums.next()??,
        nums.next()??,
        nums.next().flatten().unwrap_or(0),
    ))
}

/// The low-level runtime exists and, when it is runc, is at least 1.1.7.
pub fn check_low_level(ctx: &Ctx, config: &Config) -> Finding {
    const C: &str = "low-level-runtime";
    let name = &config.low_level_runtime;
    let bin = match &ctx.runc {
        Some(p) => Some(p.clone()).filter(|p| is_executable(p)),
        None if Path::new(name).is_absolute() => Some(ctx.path(name)).filter(|p| is_executable(p)),
        None => ctx.find_bin(name),
    };
    let Some(bin) = bin else {
        return Finding::fail(
            C,
            format!("low-level runtime {name:?} (config key low-level-runtime) not found: every container start fails"),
            "apt-get install runc   (or dnf install runc)",
        );
    };
    // A binary written a moment ago can still be open for writing in a forked child
    // (ETXTBSY); that clears within milliseconds.
    let mut tries = 0;
    let out = loop {
        match Command::new(&bin).arg("--version").output() {
            Err(e) if e.kind() == ErrorKind::ExecutableFileBusy && tries < 5 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => break other,
        }
    };
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            return Finding::warn(
                C,
                format!("{} found but cannot run `--version`: {e}", bin.display()),
                format!("run `{} --version` on the node", bin.display()),
            )
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(v) = parse_runc_version(&text) else {
        let first = text.lines().next().unwrap_or("").to_string();
        return Finding::ok(
            C,
            format!("{} ({first}); not runc, version not checked", bin.display()),
        );
    };
    if v < RUNC_MIN {
        return Finding::fail(
            C,
            format!(
                "{} is runc {}.{}.{}, older than 1.1.7: with the systemd cgroup driver, runc 1.1.3 to 1.1.6 leave out systemd DeviceAllow rules for devices without a /dev/char/<major>:<minor> link (NVIDIA's), so `systemctl daemon-reload` re-applies systemd's rules and running containers lose their GPUs (\"Failed to initialize NVML: Unknown Error\"; opencontainers/runc#3671, fixed in 1.1.7 with systemd >= 240)",
                bin.display(), v.0, v.1, v.2
            ),
            "install runc >= 1.1.7 (distro backports, or the static binary from github.com/opencontainers/runc/releases as /usr/sbin/runc); until then creating the /dev/char links avoids it",
        );
    }
    Finding::ok(
        C,
        format!("{} is runc {}.{}.{}", bin.display(), v.0, v.1, v.2),
    )
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::testing::Tree;
    use crate::doctor::Status;

    #[test]
    fn runc_versions() {
        assert_eq!(
            parse_runc_version("runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1\nspec: 1.0.2-dev\n"),
            Some((1, 1, 5))
        );
        assert_eq!(
            parse_runc_version("runc version 1.2.0-rc.1\n"),
            Some((1, 2, 0))
        );
        assert_eq!(
            parse_runc_version("runc version 1.1.12\n"),
            Some((1, 1, 12))
        );
        assert_eq!(parse_runc_version("crun version 1.8.1\n"), None);

        let t = Tree::new();
        let config = Config::parse("", None).unwrap();
        let f = check_low_level(&t.ctx(), &config);
        assert!(
            f.status == Status::Fail && f.message.contains("not found"),
            "{f:?}"
        );
        t.exe(
            "/usr/sbin/runc",
            "#!/bin/sh\necho 'runc version 1.1.5+ds1'\necho 'commit: x'\n",
        );
        let f = check_low_level(&t.ctx(), &config);
        assert_eq!(f.status, Status::Fail, "{f:?}");
        assert!(f.message.contains("1.1.5") && f.message.contains("daemon-reload"));
        t.exe("/usr/sbin/runc", "#!/bin/sh\necho 'runc version 1.1.12'\n");
        assert_eq!(check_low_level(&t.ctx(), &config).status, Status::Ok);

        // An explicit binary is run as given.
        let other = t.exe("/elsewhere/runc", "#!/bin/sh\necho 'runc version 1.0.0'\n");
        let mut ctx = t.ctx();
        ctx.runc = Some(other);
        assert_eq!(check_low_level(&ctx, &config).status, Status::Fail);
    }
}
