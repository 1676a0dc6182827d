//! The configurations `memgap compare` runs a command under: glibc's
//! default, its two remedies, the other allocators Debian packages, the NUMA
//! remedies (numactl's policies, GHC's `+RTS --numa`), and the user's own
//! (`--config NAME=VAR=VALUE...`, `--wrap NAME=PROGRAM ARGS...`).
//!
//! A configuration sets environment variables, or runs the command under
//! another program (a wrapper: `numactl --interleave=all CMD...`), or both.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
    Builtin {
        name: "tcmalloc",
        preload: Some(Preload::Library("libtcmalloc_minimal.so.4")),
        env: &[],
        package: Some("libtcmalloc-minimal4"),
    },
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
            let mut spec = ConfigSpec {
                name: builtin.name.into(),
                env,
                wrapper: Vec::new(),
                package: builtin.package.map(String::from),
                available: true,
                note: None,
            };
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

/// The NUMA remedies, in the order compare runs them.
pub const NUMA_CONFIGS: [&str; 3] = ["interleave", "localalloc", "ghc-numa"];

/// How long a GHC program may take to answer `+RTS --info`.
const RTS_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The NUMA remedies for `command`: numactl's page interleaving over every
/// node and its strict local allocation (both wrap the command), and GHC's
/// own NUMA-aware allocation (`+RTS --numa` through GHCRTS, after the
/// user's `ghcrts`), unavailable unless `command` is a GHC program whose RTS
/// accepts it. Wrappers are checked by [`check_wrapper`].
pub fn numa(command: &[OsString], ghcrts: Option<&str>) -> Vec<ConfigSpec> {
    let numactl = |name: &str, policy: &str| ConfigSpec {
        name: name.into(),
        env: Vec::new(),
        wrapper: vec!["numactl".into(), policy.into()],
        package: Some("numactl".into()),
        available: true,
        note: None,
    };
    let ghc_flags = match ghcrts.map(str::trim).filter(|flags| !flags.is_empty()) {
        Some(flags) => format!("{flags} --numa"),
        None => "--numa".to_string(),
    };
    let mut ghc = ConfigSpec {
        name: NUMA_CONFIGS[2].into(),
        env: vec![("GHCRTS".into(), ghc_flags)],
        wrapper: Vec::new(),
        package: None,
        available: true,
        note: None,
    };
    let program = command.first().map(Path::new);
    let why_not = match program.and_then(memgap_source_ghc::detect::resolve_command) {
        None => {
            Some(format!("{}: not found, so not known to be a GHC program", program.map_or(String::new(), |p| p.display().to_string())))
        }
        Some(path) if !memgap_source_ghc::detect::is_ghc_binary(&path) => {
            Some(format!("{} is not a GHC Haskell program (+RTS --numa is the GHC runtime's)", path.display()))
        }
        Some(path) => memgap_source_ghc::detect::probe_numa(&path, ghcrts, RTS_PROBE_TIMEOUT)
            .err()
            .map(|complaint| format!("its RTS refuses --numa: {complaint}")),
    };
    if let Some(why) = why_not {
        ghc.available = false;
        ghc.note = Some(why);
    }
    vec![numactl(NUMA_CONFIGS[0], "--interleave=all"), numactl(NUMA_CONFIGS[1], "--localalloc"), ghc]
}

/// How long a wrapper may take to run `true`.
const WRAPPER_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Marks a configuration that wraps the command unavailable when its
/// program is not installed, or when it cannot run `true` (numactl on a
/// kernel without NUMA, a policy naming a node that does not exist): the
/// reason is its first line on stderr.
pub fn check_wrapper(spec: &mut ConfigSpec) {
    let Some(program) = spec.wrapper.first() else { return };
    if !spec.available {
        return;
    }
    if memgap_source_ghc::detect::resolve_command(Path::new(program)).is_none() {
        spec.available = false;
        spec.note = Some(format!("{program}: command not found"));
        return;
    }
    let Some(truth) = memgap_source_ghc::detect::resolve_command(Path::new("true")) else { return };
    let started = Instant::now();
    let child = Command::new(program)
        .args(&spec.wrapper[1..])
        .arg(&truth)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(error) => {
            spec.available = false;
            spec.note = Some(format!("cannot start {program}: {error}"));
            return;
        }
    };
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() < WRAPPER_PROBE_TIMEOUT => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    if status.is_some_and(|s| s.success()) {
        return;
    }
    let mut stderr = String::new();
    if let Some(pipe) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut std::io::Read::take(pipe, 4096), &mut stderr);
    }
    let first_line = stderr.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("no message");
    let words = format!("{} {}", spec.wrapper.join(" "), truth.display());
    spec.available = false;
    spec.note = Some(match status {
        Some(status) => format!("`{words}` failed ({status}): {first_line}"),
        None => format!("`{words}` did not end within {} s", WRAPPER_PROBE_TIMEOUT.as_secs()),
    });
}

/// The `--config` and `--wrap` arguments: each `--config NAME=VAR=VALUE`,
/// with more `VAR=VALUE` after spaces; each `--wrap NAME=PROGRAM ARGS...`,
/// words separated by spaces, put before the command. A NAME given again,
/// by either option, adds to its configuration.
pub fn parse_user(arguments: &[String], wraps: &[String], user_preload: Option<&str>) -> anyhow::Result<Vec<ConfigSpec>> {
    let usage = "expected --config NAME=VAR=VALUE (more VAR=VALUE separated by spaces, quoted), e.g. --config 'jemalloc-bg=LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 MALLOC_CONF=background_thread:true'";
    let wrap_usage = "expected --wrap NAME=PROGRAM [ARGS...] (words separated by spaces, quoted), e.g. --wrap 'node1=numactl --membind=1'";
    let mut specs: Vec<ConfigSpec> = Vec::new();
    let mut named = |option: &str, argument: &str, usage: &str| -> anyhow::Result<(usize, String)> {
        let Some((name, rest)) = argument.trim().split_once('=') else {
            bail!("{option} {argument:?}: {usage}");
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
            bail!("{option} {argument:?}: a name is letters, digits, '.', '_' and '-'; {usage}");
        }
        if BUILTINS.iter().any(|builtin| builtin.name == name) || NUMA_CONFIGS.contains(&name) {
            bail!("{option} {name}: that is a built-in configuration; choose another name");
        }
        let index = match specs.iter().position(|spec| spec.name == name) {
            Some(index) => index,
            None => {
                specs.push(ConfigSpec {
                    name: name.into(),
                    env: Vec::new(),
                    wrapper: Vec::new(),
                    package: None,
                    available: true,
                    note: None,
                });
                specs.len() - 1
            }
        };
        Ok((index, rest.to_string()))
    };
    let mut assignments_of = Vec::new();
    for argument in arguments {
        assignments_of.push(named("--config", argument, usage)?);
    }
    let mut wrappers_of = Vec::new();
    for argument in wraps {
        wrappers_of.push(named("--wrap", argument, wrap_usage)?);
    }
    for (index, assignments) in assignments_of {
        for assignment in assignments.split_whitespace() {
            match assignment.split_once('=') {
                Some((variable, value)) if !variable.is_empty() => specs[index].env.push((variable.to_string(), value.to_string())),
                _ => bail!("--config {}: {assignment:?} is not VAR=VALUE; {usage}", specs[index].name),
            }
        }
    }
    for (index, words) in wrappers_of {
        let words: Vec<String> = words.split_whitespace().map(String::from).collect();
        if words.is_empty() {
            bail!("--wrap {}: no program to run the command under; {wrap_usage}", specs[index].name);
        }
        specs[index].wrapper.extend(words);
    }
    Ok(specs.into_iter().map(|spec| finish(spec, user_preload)).collect())
}

/// A trace's remedy, as the ledger's JSON lists it under `remedies`.
#[derive(Debug, Clone, PartialEq)]
pub struct Remedy {
    pub id: String,
    pub owner: String,
    pub description: String,
    pub env: Vec<(String, String)>,
    pub expected_savings_bytes: u64,
}

/// The remedies in a ledger's JSON; an error when it has no `remedies` list.
pub fn remedies_of_ledger(ledger: &serde_json::Value) -> anyhow::Result<Vec<Remedy>> {
    let Some(list) = ledger.get("remedies").and_then(|r| r.as_array()) else {
        bail!("its ledger lists no remedies (this memgap's ledger has no `remedies`)");
    };
    let text = |value: &serde_json::Value, key: &str| value.get(key).and_then(|v| v.as_str()).unwrap_or_default().to_string();
    Ok(list
        .iter()
        .map(|remedy| Remedy {
            id: text(remedy, "id"),
            owner: text(remedy, "owner"),
            description: text(remedy, "description"),
            env: remedy
                .get("env")
                .and_then(|e| e.as_object())
                .map(|env| {
                    env.iter().map(|(name, value)| (name.clone(), value.as_str().map_or_else(|| value.to_string(), String::from))).collect()
                })
                .unwrap_or_default(),
            expected_savings_bytes: remedy.get("expected_savings_bytes").and_then(|v| v.as_u64()).unwrap_or(0),
        })
        .filter(|remedy| !remedy.id.is_empty())
        .collect())
}

/// The configurations of `memgap compare --remedies`: the program as it is
/// (`default`), then one per remedy. A remedy that is a change to the
/// program (no environment) is listed, unavailable. A library named without
/// a directory is memgap's trim library or one in the system's library
/// directory.
pub fn from_remedies(remedies: &[Remedy], trim: Result<&Path, String>, user_preload: Option<&str>) -> Vec<ConfigSpec> {
    let mut specs = vec![ConfigSpec {
        name: REMEDIES_BASELINE.into(),
        env: Vec::new(),
        wrapper: Vec::new(),
        package: None,
        available: true,
        note: None,
    }];
    for remedy in remedies {
        let expected = format!(
            "{}: {} (expected to save {})",
            remedy.owner,
            remedy.description,
            memgap_model::human_bytes(remedy.expected_savings_bytes)
        );
        let mut spec = ConfigSpec {
            name: remedy.id.clone(),
            env: remedy.env.clone(),
            wrapper: Vec::new(),
            package: None,
            available: true,
            note: Some(expected.clone()),
        };
        if remedy.env.is_empty() {
            spec.available = false;
            spec.note = Some(format!("a change to the program, not measurable here — {expected}"));
            specs.push(spec);
            continue;
        }
        let mut unresolved = None;
        for (name, value) in spec.env.iter_mut().filter(|(name, _)| name == "LD_PRELOAD") {
            let _ = name;
            let entries: Vec<String> = value
                .split([':', ' '])
                .filter(|entry| !entry.is_empty())
                .map(|entry| {
                    if entry.contains('/') {
                        entry.to_string()
                    } else if entry == crate::agent::TRIM_FILE {
                        match &trim {
                            Ok(path) => path.display().to_string(),
                            Err(why) => {
                                unresolved = Some(why.clone());
                                entry.to_string()
                            }
                        }
                    } else {
                        Path::new(&library_dir()).join(entry).display().to_string()
                    }
                })
                .collect();
            *value = entries.join(":");
        }
        if let Some(why) = unresolved {
            spec.available = false;
            spec.note = Some(why);
            specs.push(spec);
            continue;
        }
        specs.push(finish(spec, user_preload));
    }
    specs
}

/// The program as it is, in `memgap compare --remedies`.
pub const REMEDIES_BASELINE: &str = "default";

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
    fn remedies_become_configurations() {
        let ledger = serde_json::json!({"remedies": [
            {"id": "glibc-trim", "owner": "glibc", "description": "trim", "env": {"LD_PRELOAD": "libmemgap_trim.so"}, "expected_savings_bytes": 1048576},
            {"id": "glibc-arena-max", "owner": "glibc", "description": "fewer arenas", "env": {"MALLOC_ARENA_MAX": "2"}, "expected_savings_bytes": 5},
            {"id": "tcmalloc-release-from-code", "owner": "tcmalloc", "description": "call ReleaseFreeMemory", "env": {}, "expected_savings_bytes": 7},
            {"id": "other-allocator", "owner": "x", "description": "", "env": {"LD_PRELOAD": "libnosuch-memgap-test.so.1"}, "expected_savings_bytes": 0},
        ]});
        let remedies = remedies_of_ledger(&ledger).unwrap();
        assert_eq!(remedies.len(), 4);
        assert_eq!(remedies[1].env, [("MALLOC_ARENA_MAX".to_string(), "2".to_string())]);
        let trim = std::env::current_exe().unwrap();
        let specs = from_remedies(&remedies, Ok(&trim), None);
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["default", "glibc-trim", "glibc-arena-max", "tcmalloc-release-from-code", "other-allocator"]);
        assert_eq!(env(&specs[1], "LD_PRELOAD"), trim.to_str());
        assert!(specs[1].available && specs[2].available);
        assert!(specs[1].note.as_deref().unwrap().contains("expected to save 1.00 MiB"), "{:?}", specs[1].note);
        assert!(!specs[3].available && specs[3].note.as_deref().unwrap().starts_with("a change to the program"));
        assert!(!specs[4].available, "a library that is not installed: {:?}", specs[4]);
        assert!(remedies_of_ledger(&serde_json::json!({"rows": {}})).unwrap_err().to_string().contains("lists no remedies"));
    }

    #[test]
    fn user_configs() {
        let parse = |arguments: &[&str]| parse_user(&arguments.iter().map(|a| a.to_string()).collect::<Vec<_>>(), &[], None);
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

    #[test]
    fn wrappers_join_their_configuration() {
        let strings = |list: &[&str]| list.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let specs = parse_user(&strings(&["node1=MALLOC_ARENA_MAX=1"]), &strings(&["node1=numactl  --membind=1", "plain=nice -n 5"]), None)
            .unwrap();
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0].wrapper, ["numactl", "--membind=1"]);
        assert_eq!(env(&specs[0], "MALLOC_ARENA_MAX"), Some("1"));
        assert_eq!(
            (specs[1].name.as_str(), specs[1].wrapper.as_slice(), specs[1].env.is_empty()),
            ("plain", &["nice".to_string(), "-n".into(), "5".into()][..], true)
        );
        assert!(parse_user(&[], &strings(&["empty=  "]), None).unwrap_err().to_string().contains("no program to run the command under"));
        assert!(
            parse_user(&[], &strings(&["interleave=numactl -i all"]), None).unwrap_err().to_string().contains("built-in configuration")
        );
        assert!(parse_user(&[], &strings(&["numactl --interleave=all"]), None).unwrap_err().to_string().contains("a name is letters"));
    }

    #[test]
    fn a_wrapper_that_cannot_run_true_is_unavailable() {
        let spec = |wrapper: &[&str]| ConfigSpec {
            name: "w".into(),
            env: Vec::new(),
            wrapper: wrapper.iter().map(|w| w.to_string()).collect(),
            package: None,
            available: true,
            note: None,
        };
        let mut fine = spec(&["env", "A=1"]);
        check_wrapper(&mut fine);
        assert!(fine.available, "{fine:?}");
        let mut missing = spec(&["memgap-no-such-wrapper", "-x"]);
        check_wrapper(&mut missing);
        assert_eq!(missing.note.as_deref(), Some("memgap-no-such-wrapper: command not found"));
        let mut failing = spec(&["sh", "-c", "echo refused >&2; exit 3"]);
        check_wrapper(&mut failing);
        assert!(!failing.available);
        assert!(failing.note.as_deref().unwrap().ends_with(": refused"), "{failing:?}");
    }

    #[test]
    fn ghc_numa_needs_a_ghc_program() {
        let specs = numa(&["sh".into(), "-c".into(), "true".into()], Some("-N2"));
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, NUMA_CONFIGS);
        assert_eq!(specs[0].wrapper, ["numactl", "--interleave=all"]);
        assert_eq!(specs[1].wrapper, ["numactl", "--localalloc"]);
        assert_eq!(env(&specs[2], "GHCRTS"), Some("-N2 --numa"));
        assert!(!specs[2].available && specs[2].note.as_deref().unwrap().contains("is not a GHC Haskell program"), "{:?}", specs[2]);
        let missing = numa(&["./memgap-no-such-program".into()], None);
        assert!(!missing[2].available && missing[2].note.as_deref().unwrap().contains("not found"), "{:?}", missing[2]);
    }
}
