//! The runtime's own config and profile files, read under the root.

use std::path::{Path, PathBuf};

use super::{Ctx, Finding};
use crate::config::{self, Config};
use crate::profile::Profile;
/// Loads the runtime config under the root (`Config::load_under`: nothing of this machine's
/// own files is read for another root). Returns the result and a config to go on with: the
/// loaded one, or on error the built-in defaults (so the other checks still run), rooted.
pub fn load_config(ctx: &Ctx) -> (Result<Config, config::ConfigError>, Config) {
    let loaded = if ctx.is_real_root() {
        Config::load(&ctx.config_path)
    } else {
        Config::load_under(&ctx.root, &ctx.config_path)
    };
    let usable = match &loaded {
        Ok(c) => c.clone(),
        // On the node itself its profile files still count; under another root only what
        // is under it.
        Err(_) if ctx.is_real_root() => {
            Config::parse("", None).unwrap_or_else(|_| Config::builtin())
        }
        Err(_) => Config::builtin_under(&ctx.root),
    };
    (loaded, usable)
}

/// The runtime's config and profile files parse.
pub fn check_config(ctx: &Ctx, loaded: &Result<Config, config::ConfigError>) -> Vec<Finding> {
    const C: &str = "config";
    let shown = ctx.config_path.display();
    let mut out = Vec::new();
    match loaded {
        Ok(c) => {
            if c.warnings.is_empty() {
                out.push(Finding::ok(
                    C,
                    match &c.path {
                        Some(_) => format!("{shown} and {} profile(s) parse", c.profiles.len()),
                        None => format!("{shown} absent: built-in defaults"),
                    },
                ));
            }
            for w in &c.warnings {
                out.push(Finding::warn(C, w.clone(), format!("edit {shown}")));
            }
        }
        Err(e) => out.push(Finding::fail(
            C,
            format!("the runtime's config does not load, so every container start fails: {e}"),
            "correct the file named above, then re-run `accel-ctk doctor`",
        )),
    }
    out
}

/// Each file in `profiles-dir` (already under the root, as `load_config` leaves it) parses
/// on its own: the config check stops at the first broken one.
pub fn check_profile_files(dir: &Path) -> Vec<Finding> {
    const C: &str = "profiles";
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let result = crate::bounded::read_text(&f, config::MAX_FILE_SIZE)
                .map_err(|e| e.to_string())
                .and_then(|t| toml::from_str::<toml::Table>(&t).map_err(|e| e.to_string()))
                .and_then(|t| {
                    Profile::from_table(t, &f.display().to_string()).map_err(|e| e.to_string())
                });
            match result {
                Ok((p, _)) => Finding::ok(C, format!("{}: profile {} parses", f.display(), p.name)),
                Err(e) => Finding::fail(
                    C,
                    format!("{}: {e}", f.display()),
                    format!("correct or remove {}", f.display()),
                ),
            }
        })
        .collect()
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::testing::Tree;
    use crate::doctor::Status;

    #[test]
    fn config_absent_broken_and_unknown_key() {
        let t = Tree::new();
        let (loaded, _) = load_config(&t.ctx());
        let f = check_config(&t.ctx(), &loaded);
        assert_eq!(f[0].status, Status::Ok, "{f:?}");
        assert!(f[0].message.contains("built-in defaults"));

        t.write(config::DEFAULT_PATH, "log-level = \"loud\"\n");
        let (loaded, usable) = load_config(&t.ctx());
        let f = check_config(&t.ctx(), &loaded);
        assert_eq!(f[0].status, Status::Fail);
        assert!(f[0].message.contains("log-level"), "{f:?}");
        assert!(usable
            .profile("nvidia")
            .unwrap()
            .driver_root
            .starts_with(t.0.path()));

        t.write(config::DEFAULT_PATH, "low-level-runtim = \"crun\"\n");
        let (loaded, _) = load_config(&t.ctx());
        let f = check_config(&t.ctx(), &loaded);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].status, Status::Warn);
        assert!(f[0].message.contains("low-level-runtim"));
    }

    /// `doctor --root` reads nothing of this machine's own files (issue 23): a profiles-dir
    /// named in the rooted config.toml is read under the root, never at its host path.
    #[test]
    fn a_rooted_load_reads_nothing_outside_the_root() {
        let t = Tree::new();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(
            outside.path().join("broken.toml"),
            "name = \"x\"\nvisible-devices-env = [\"X\"]\n",
        )
        .unwrap();
        t.write(
            config::DEFAULT_PATH,
            &format!("profiles-dir = {:?}\n", outside.path()),
        );
        let (loaded, usable) = load_config(&t.ctx());
        let cfg = loaded.expect("the broken file outside the root is not read");
        assert_eq!(cfg.profiles_dir, t.ctx().path(outside.path()));
        assert!(usable.profile("x").is_none());
        // Under the root it is read, and fails the load.
        t.write(
            &format!("{}/broken.toml", outside.path().display()),
            "name = \"x\"\nvisible-devices-env = [\"X\"]\n",
        );
        let (loaded, usable) = load_config(&t.ctx());
        assert!(loaded.is_err());
        assert!(usable
            .profile("nvidia")
            .unwrap()
            .driver_root
            .starts_with(t.0.path()));
    }

    #[test]
    fn profiles_are_rooted_and_each_file_checked() {
        let t = Tree::new();
        t.write(
            config::DEFAULT_PATH,
            "[profiles.nvidia]\ndriver-root = \"/run/nvidia/driver\"\n",
        );
        let dir = "/etc/accel-container-runtime/profiles.d";
        t.write(
            &format!("{dir}/ascend.toml"),
            include_str!("../../config/profiles/ascend.toml"),
        );
        t.write(
            &format!("{dir}/broken.toml"),
            "name = \"x\"\nvisible-devices-env = [\"X\"]\n",
        );
        let (loaded, usable) = load_config(&t.ctx());
        // The broken file also breaks the config as a whole.
        assert!(loaded.is_err());
        let f = check_profile_files(&usable.profiles_dir);
        assert_eq!(f.len(), 2, "{f:?}");
        assert_eq!(f[0].status, Status::Ok);
        assert_eq!(f[1].status, Status::Fail);
        assert!(f[1].message.contains("broken.toml"), "{f:?}");

        std::fs::remove_file(t.ctx().path(format!("{dir}/broken.toml"))).unwrap();
        let (loaded, usable) = load_config(&t.ctx());
        loaded.unwrap();
        assert_eq!(
            usable.profile("nvidia").unwrap().driver_root,
            t.0.path().join("run/nvidia/driver")
        );
        assert!(usable
            .profile("ascend")
            .unwrap()
            .driver_root
            .starts_with(t.0.path()));
    }
}
