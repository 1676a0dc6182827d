//! The configurations `memgap compare` runs a command under: glibc's
//! default, its two remedies, the other allocators Debian packages, and the
//! user's own (`--config NAME=VAR=VALUE...`).

use std::path::Path;

use anyhow::bail;
use memgap_model::compare::ConfigSpec;

/// The default every other configuration is compared with.
pub const BASELINE: &str = "glibc";

enum Preload {
    /// memgap's trim remedy library.
    Trim,
    /// A shared library in the system's library directory.
    Library(&'static str),
}

struct Builtin {
    name: &'static str,
    preload: Option<Preload>,
    env: &'static [(&'static str, &'static str)],
    /// The Debian package that installs the library.
    package: Option<&'static str>,
}

const BUILTINS: &[Builtin] = &[
    Builtin { name: BASELINE, preload: None, env: &[], package: None },
    Builtin { name: "arena-max-2", preload: None, env: &[("MALLOC_ARENA_MAX", "2")], package: None },
    // libmemgap_trim.so calls malloc_trim(0) from a thread every
    // MEMGAP_TRIM_INTERVAL_MS (default 1000); it interposes nothing.
    Builtin { name: "trim", preload: Some(Preload::Trim), env: &[], package: None },
    Builtin { name: "jemalloc", preload: Some(Preload::Library("libjemalloc.so.2")), env: &[], package: Some("libjemalloc2") },
    Builtin { name: "tcmalloc", preload: Some(Preload::Library("libtcmalloc_minimal.so.4")), env: &[], package: Some("libtcmalloc-minimal4") },
    Builtin { name: "mimalloc", preload: Some(Preload::Library("libmimalloc.so.2")), env: &[], package: Some("libmimalloc2.0") },
];

/// Where Debian installs shared libraries for this machine's architecture.
fn library_dir() -> String {
    format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH)
}

/// The built-in configurations, `available: false` where a library is
/// missing. `trim` is where the trim remedy's library is, or why it could
/// not be found.
pub fn builtins(trim: Result<&Path, String>, user_preload: Option<&str>) -> Vec<ConfigSpec> {
    BUILTINS
        .iter()
        .map(|builtin| {
            let env: Vec<(String, String)> = builtin.env.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect();
            let mut spec = ConfigSpec { name: builtin.name.into(), env, package: builtin.package.map(String::from), available: true, note: None };
            let library = match &builtin.preload {
                None => return spec,
                Some(Preload::Library(file)) => Path::new(&library_dir()).join(file),
                Some(Preload::Trim) => match &trim {
                    Ok(path) => path.to_path_buf(),
                    Err(why) => {
                        spec.available = false;
                        spec.note = Some(why.clone());
                        return spec;
                    }
                },
            };
            spec.env.insert(0, ("LD_PRELOAD".into(), library.to_string_lossy().into_owned()));
            finish(spec, user_preload)
        })
        .collect()
}

/// The `--config` arguments: each `NAME=VAR=VALUE`, with more `VAR=VALUE`
/// after spaces; a NAME given again adds to its configuration.
pub fn parse_user(arguments: &[String], user_preload: Option<&str>) -> anyhow::Result<Vec<ConfigSpec>> {
    let usage = "expected --config NAME=VAR=VALUE (more VAR=VALUE separated by spaces, quoted), e.g. --config 'jemalloc-bg=LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 MALLOC_CONF=background_thread:true'";
    let mut specs: Vec<ConfigSpec> = Vec::new();
    for argument in arguments {
        let Some((name, assignments)) = argument.trim().split_once('=') else {
            bail!("--config {argument:?}: {usage}");
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
            bail!("--config {argument:?}: a name is letters, digits, '.', '_' and '-'; {usage}");
        }
        if BUILTINS.iter().any(|builtin| builtin.name == name) {
            bail!("--config {name}: that is a built-in configuration; choose another name");
        }
        let index = match specs.iter().position(|spec| spec.name == name) {
            Some(index) => index,
            None => {
                specs.push(ConfigSpec { name: name.into(), env: Vec::new(), package: None, available: true, note: None });
                specs.len() - 1
            }
        };
        for assignment in assignments.split_whitespace() {
            match assignment.split_once('=') {
                Some((variable, value)) if !variable.is_empty() => specs[index].env.push((variable.to_string(), value.to_string())),
                _ => bail!("--config {name}: {assignment:?} is not VAR=VALUE; {usage}"),
            }
        }
    }
    Ok(specs.into_iter().map(|spec| finish(spec, user_preload)).collect())
}

/// Appends the user's own LD_PRELOAD after the configuration's (the
/// configuration's allocator must come first to serve malloc), and marks the
/// configuration unavailable when a library it preloads does not exist: the
/// loader would only warn and run the command without it.
fn finish(mut spec: ConfigSpec, user_preload: Option<&str>) -> ConfigSpec {
    let Some((_, preload)) = spec.env.iter_mut().find(|(name, _)| name == "LD_PRELOAD") else { return spec };
    let missing = preload.split([':', ' ']).find(|entry| entry.contains('/') && !Path::new(entry).is_file()).map(String::from);
    if let Some(user) = user_preload.filter(|user| !user.is_empty()) {
        preload.push(':');
        preload.push_str(user);
    }
    if let Some(missing) = missing {
        spec.available = false;
        spec.note = Some(format!("{missing} does not exist"));
    }
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(spec: &'a ConfigSpec, name: &str) -> Option<&'a str> {
        spec.env.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn builtins_in_order_with_their_environment() {
        let trim = std::env::current_exe().unwrap();
        let specs = builtins(Ok(&trim), None);
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["glibc", "arena-max-2", "trim", "jemalloc", "tcmalloc", "mimalloc"]);
        assert!(specs[0].env.is_empty() && specs[0].available);
        assert_eq!(env(&specs[1], "MALLOC_ARENA_MAX"), Some("2"));
        assert_eq!(env(&specs[2], "LD_PRELOAD"), trim.to_str());
        for spec in &specs[3..] {
            let library = env(spec, "LD_PRELOAD").unwrap();
            assert_eq!(spec.available, Path::new(library).is_file(), "{spec:?}");
            assert!(spec.package.is_some());
        }
    }

    #[test]
    fn trim_without_its_library_is_unavailable() {
        let specs = builtins(Err("cannot find libmemgap_trim.so".into()), None);
        assert!(!specs[2].available);
        assert_eq!(specs[2].note.as_deref(), Some("cannot find libmemgap_trim.so"));
    }

    #[test]
    fn the_users_preload_comes_after_ours() {
        let trim = std::env::current_exe().unwrap();
        let specs = builtins(Ok(&trim), Some("/opt/libmine.so"));
        assert_eq!(env(&specs[2], "LD_PRELOAD").unwrap(), format!("{}:/opt/libmine.so", trim.display()));
        assert_eq!(env(&specs[0], "LD_PRELOAD"), None, "a config without a preload keeps the user's, inherited");
    }

    #[test]
    fn user_configs() {
        let parse = |arguments: &[&str]| parse_user(&arguments.iter().map(|a| a.to_string()).collect::<Vec<_>>(), None);
        let specs = parse(&["je=MALLOC_CONF=a:1,b:2 OTHER=x=y", "je=THIRD=3", "two=A=1"]).unwrap();
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0].name, "je");
        let env: Vec<(&str, &str)> = specs[0].env.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        assert_eq!(env, [("MALLOC_CONF", "a:1,b:2"), ("OTHER", "x=y"), ("THIRD", "3")]);
        assert!(specs[0].available);
        let missing = &parse(&["gone=LD_PRELOAD=/nonexistent/libgone.so"]).unwrap()[0];
        assert!(!missing.available);
        assert_eq!(missing.note.as_deref(), Some("/nonexistent/libgone.so does not exist"));
        assert!(parse(&["glibc=A=1"]).is_err());
        assert!(parse(&["noenv"]).is_err());
        assert!(parse(&["x=A=1 ./prog"]).unwrap_err().to_string().contains("\"./prog\" is not VAR=VALUE"));
    }
}
