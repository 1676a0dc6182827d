//! What memgap writes is readable by its owner only (traces and reports hold
//! addresses, command lines and symbol names), and `memgap trim` runs code
//! only in the caller's own processes, whatever capabilities it was given.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use common::*;

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o777
}

/// Runs `f` with the umask at 000, as the most careless user would: what
/// memgap creates must be 0600 all the same.
fn under_umask_000<T>(f: impl FnOnce() -> T) -> T {
    // The umask is per process, and tests run on threads: take a lock.
    static UMASK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = UMASK.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: no precondition; UMASK keeps the tests of this file from changing it at once.
    let old = unsafe { libc::umask(0) };
    let result = f();
    // SAFETY: restores the mask read above.
    unsafe { libc::umask(old) };
    result
}

#[test]
fn traces_reports_and_exports_are_private() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "fork_exec.c");
    let trace = dir.join("t.mgt");
    let out = under_umask_000(|| memgap(&dir, &["run", "--quiet", "--report", "-o", arg(&trace), "--", arg(&prog)]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let traces = traces_in(&dir);
    assert!(traces.len() >= 2, "the fork child's trace too: {traces:?}");
    for name in &traces {
        assert_eq!(mode(&dir.join(name)), 0o600, "{name}");
    }
    assert_eq!(mode(&dir.join("t.html")), 0o600, "the report");
    // An output of an earlier run, readable by all, is replaced by a private one.
    fs::set_permissions(dir.join("t.html"), fs::Permissions::from_mode(0o644)).unwrap();
    let out = under_umask_000(|| memgap(&dir, &["report", arg(&trace)]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(mode(&dir.join("t.html")), 0o600, "the report written again");
    let out = under_umask_000(|| memgap(&dir, &["export", arg(&trace), "--folded", "t.folded", "--pprof", "t.pb.gz"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(mode(&dir.join("t.folded")), 0o600);
    assert_eq!(mode(&dir.join("t.pb.gz")), 0o600);
    let out = under_umask_000(|| memgap(&dir, &["flamegraph", arg(&trace), "-o", "t.svg"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(mode(&dir.join("t.svg")), 0o600);
    let partials: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".partial"))
        .collect();
    assert!(partials.is_empty(), "{partials:?}");
}

#[test]
fn a_taken_trace_name_stops_the_run_before_the_program_starts() {
    let (_tmp, dir) = tempdir();
    let made = dir.join("made-by-the-program");
    let script = format!("echo ran > '{}'", made.display());
    let victim = dir.join("victim.txt");
    fs::write(&victim, b"precious").unwrap();
    let trace = dir.join("t.mgt");
    let stale = dir.join("stale.mgt");
    fs::write(&stale, b"an earlier run's").unwrap();
    std::os::unix::fs::symlink(&victim, &trace).unwrap();
    fs::create_dir(dir.join("a-directory")).unwrap();
    for output in [arg(&trace), arg(&stale), "a-directory", "no-such-directory/t.mgt"] {
        let out = memgap(&dir, &["run", "-o", output, "--", "sh", "-c", &script]);
        let line = assert_one_line_failure(&out);
        assert!(line.contains("already exists") || line.contains("directory"), "{output}: {line}");
        assert!(!made.exists(), "{output}: the program ran: {line}");
    }
    assert_eq!(fs::read(&victim).unwrap(), b"precious", "the symlink's target was written");
    assert_eq!(fs::read(&stale).unwrap(), b"an earlier run's");
    assert_eq!(fs::read_link(&trace).unwrap(), victim);
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 4, "nothing else was created");
}

#[test]
fn a_symlink_planted_at_the_trace_name_is_not_followed() {
    let (_tmp, dir) = tempdir();
    let prog = compile(&dir, "outputs.c");
    let victim = dir.join("victim.txt");
    fs::write(&victim, b"precious").unwrap();
    // The agent's own check, for a name the CLI does not make: a child's.
    // Symlinks at every pid the fork child may get.
    let first = fs::read_to_string("/proc/sys/kernel/ns_last_pid").ok().and_then(|t| t.trim().parse::<u32>().ok());
    let Some(first) = first else {
        eprintln!("no /proc/sys/kernel/ns_last_pid: cannot predict pids; skipped");
        return;
    };
    let prog_fork = compile(&dir, "fork_exec.c");
    for pid in first..first + 3000 {
        std::os::unix::fs::symlink(&victim, dir.join(format!("t2.{pid}.mgt"))).unwrap();
    }
    let plain = run_plain(&dir, arg(&prog), &["x"]);
    let traced = memgap(&dir, &["run", "-o", "t.mgt", "--", arg(&prog), "x"]);
    assert_eq!(traced.stdout, plain.stdout);
    assert_eq!(traced.status.code(), plain.status.code());
    let traced = memgap(&dir, &["run", "-o", "t2.mgt", "--", arg(&prog_fork)]);
    assert!(traced.status.success(), "{}", text(&traced.stderr));
    assert_eq!(fs::read(&victim).unwrap(), b"precious", "the symlink's target was written");
}

/// tests/programs/retainer.c, running as root (the test's user).
fn retainer(dir: &Path) -> Background {
    let exe = compile(dir, "retainer.c");
    let counter = dir.join("counter");
    Background::start(command(arg(&exe), ["1".to_string(), "1".to_string(), arg(&counter).to_string()]).current_dir(dir), 2)
}

#[test]
fn trim_with_cap_sys_ptrace_still_refuses_another_users_process() {
    let (_tmp, dir) = tempdir();
    if proc_status(std::process::id(), "Uid").and_then(|u| u.split_whitespace().next().map(str::to_string)).as_deref() != Some("0") {
        eprintln!("not root: cannot run memgap as another user; skipped");
        return;
    }
    let target = retainer(&dir);
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    let memgap_copy = dir.join("memgap");
    fs::copy(memgap_bin(), &memgap_copy).unwrap();
    // nobody, holding CAP_SYS_PTRACE: the kernel would let it trace root's
    // process; memgap must not.
    let pid = target.pid.to_string();
    let setpriv = [
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=+sys_ptrace",
        "--ambient-caps=+sys_ptrace",
        arg(&memgap_copy),
        "trim",
        &pid,
    ];
    let out = output_of(command("setpriv", setpriv).current_dir(&dir));
    let line = assert_one_line_failure(&out);
    assert!(line.contains("belongs to uid 0") && line.contains("uid 65534") && line.contains("only on your own processes"), "{line}");
    assert_eq!(proc_status(target.pid, "TracerPid").as_deref(), Some("0"));
}

/// Someone with an ordinary account plants symlinks, in a shared sticky
/// directory such as /tmp, at every name memgap would use, pointing at a
/// file of root's; root then runs memgap there. Nothing outside the run
/// changes, and a taken name stops memgap in one line with exit status 1.
/// A world-writable sticky directory (`shared`, inside `base`) where another
/// user, made for the test, planted a symlink at each of `names`, all to
/// `victim`, a file of ours outside it that says "precious". None when this
/// is not root (said why).
fn symlinks_planted_by_another_user(base: &Path, names: &[String]) -> Option<(PathBuf, PathBuf)> {
    if proc_status(std::process::id(), "Uid").and_then(|u| u.split_whitespace().next().map(str::to_string)).as_deref() != Some("0") {
        eprintln!("not root: cannot create another user to plant symlinks; skipped");
        return None;
    }
    // Tests of this file run at once: one user each.
    static USERS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let user = format!("mgatk{}x{}", std::process::id() % 100_000, USERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let made = output_of(&mut command("useradd", ["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", &user]));
    if !made.status.success() {
        eprintln!("useradd failed ({}); skipped", text(&made.stderr).trim());
        return None;
    }
    let uid = output_of(&mut command("id", ["-u", &user]));
    let uid = text(&uid.stdout).trim().to_string();
    fs::set_permissions(base, fs::Permissions::from_mode(0o755)).unwrap();
    let shared = base.join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = base.join("root-owned");
    fs::write(&victim, b"precious").unwrap();
    let script = format!("for n in {}; do ln -s '{}' \"$n\" || exit 1; done", names.join(" "), victim.display());
    let planted = output_of(
        command("setpriv", [format!("--reuid={uid}"), format!("--regid={uid}"), "--clear-groups".into(), "sh".into(), "-c".into(), script])
            .current_dir(&shared),
    );
    let _ = output_of(&mut command("userdel", [&user]));
    assert!(planted.status.success(), "{}", text(&planted.stderr));
    Some((shared, victim))
}

#[test]
fn symlinks_planted_by_another_user_in_a_sticky_directory() {
    let (_tmp, base) = tempdir();
    let first_pid = fs::read_to_string("/proc/sys/kernel/ns_last_pid").ok().and_then(|t| t.trim().parse::<u32>().ok()).unwrap_or(1000);
    // As the other user: a symlink at every name memgap would use.
    let mut names: Vec<String> =
        ["t.mgt", "u.html", "v.mgt.snap", "planted.html", "planted.pb.gz", "planted.folded", "planted.svg", "v.partial", "v.html.partial"]
            .map(String::from)
            .to_vec();
    names.extend((first_pid..first_pid + 3000).map(|pid| format!("v.{pid}.mgt")));
    let Some((shared, victim)) = symlinks_planted_by_another_user(&base, &names) else { return };
    let prog = compile(&base, "fork_exec.c");
    let made_by_program = base.join("ran");

    // The trace's name is taken: refused before the program runs.
    let run_then_touch = format!("touch '{}'", made_by_program.display());
    let line = assert_one_line_failure(&memgap(&shared, &["run", "-o", "t.mgt", "--", "sh", "-c", &run_then_touch]));
    assert!(line.contains("t.mgt") && line.contains("already exists"), "{line}");
    assert!(!made_by_program.exists(), "the program ran");
    // The report's name is taken.
    let line = assert_one_line_failure(&memgap(&shared, &["run", "--report", "-o", "u.mgt", "--", "sh", "-c", &run_then_touch]));
    assert!(line.contains("u.html"), "{line}");
    assert!(!made_by_program.exists(), "the program ran");
    // The fork child's names are all taken: the child goes untraced, the run goes on.
    let out = memgap(&shared, &["run", "-o", "v.mgt", "--", arg(&prog)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Outputs at taken names: one line each, exit 1.
    for args in [
        &["report", "v.mgt", "-o", "planted.html"][..],
        &["export", "v.mgt", "--pprof", "planted.pb.gz"],
        &["export", "v.mgt", "--folded", "planted.folded"],
        &["flamegraph", "v.mgt", "-o", "planted.svg"],
    ] {
        let line = assert_one_line_failure(&memgap(&shared, args));
        assert!(line.contains("planted") && line.contains("symlink"), "{}: {line}", args.join(" "));
    }
    // A report at a free name is written, and no .partial is left.
    let out = memgap(&shared, &["report", "v.mgt", "-o", "fine.html"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(fs::read(&victim).unwrap(), b"precious", "a file outside the run changed");
    let mut outside: Vec<String> = fs::read_dir(&base).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    outside.sort();
    assert_eq!(outside, ["fork_exec", "root-owned", "shared"], "files outside the shared directory");
}

/// A GHC program's eventlog: the RTS opens whatever name it is given with
/// fopen, following symlinks, so memgap hands it a name in a private
/// directory of its own; the eventlog kept beside the trace is created as
/// every trace is. Another user's symlinks at each name either could take
/// (the kept eventlog, and the RTS's own default and per-pid names) change
/// nothing outside the run.
#[test]
fn a_ghc_run_beside_symlinks_planted_by_another_user() {
    if command("ghc", ["--version"]).output().map(|o| !o.status.success()).unwrap_or(true) {
        assert!(std::env::var_os("CI").is_none(), "ghc is not installed (apt-get install ghc)");
        eprintln!("ghc is not installed: skipped");
        return;
    }
    let (_tmp, base) = tempdir();
    let first_pid = fs::read_to_string("/proc/sys/kernel/ns_last_pid").ok().and_then(|t| t.trim().parse::<u32>().ok()).unwrap_or(1000);
    let mut names: Vec<String> = ["g.eventlog", "pinned.eventlog", "h.mgt.partial"].map(String::from).to_vec();
    names.extend((first_pid..first_pid + 2000).flat_map(|pid| [format!("h.{pid}.ghc.eventlog"), format!("h.{pid}.mgt")]));
    let Some((shared, victim)) = symlinks_planted_by_another_user(&base, &names) else { return };
    let exe = base.join("pinned");
    let out = output_of(
        command("ghc", ["-O", "-rtsopts", "-eventlog", "-outputdir"])
            .arg(base.join("o"))
            .arg("-o")
            .arg(&exe)
            .arg(programs_dir().join("ghc/pinned.hs")),
    );
    assert!(out.status.success(), "ghc failed:\n{}", text(&out.stderr));

    // The kept eventlog's name is taken: refused before the program starts.
    let line = assert_one_line_failure(&memgap(&shared, &["run", "-o", "g.mgt", "--", arg(&exe), "strip", "20000"]));
    assert!(line.contains("g.eventlog") && line.contains("symlink"), "{line}");
    assert!(!shared.join("g.mgt").exists());
    // Free names: the run records the GHC heap, and its files are ours and private.
    let out = under_umask_000(|| memgap(&shared, &["run", "-o", "h.mgt", "--", arg(&exe), "strip", "20000"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    for name in ["h.mgt", "h.eventlog"] {
        let path = shared.join(name);
        let meta = fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(meta.file_type().is_file() && meta.uid() == 0, "{name}");
        assert_eq!(mode(&path), 0o600, "{name}");
    }
    let ledger = memgap(&shared, &["ledger", "h.mgt", "--json"]);
    assert!(ledger.status.success(), "{}", text(&ledger.stderr));
    let json: serde_json::Value = serde_json::from_slice(&ledger.stdout).unwrap();
    assert!(json["ghc"]["timeline"].as_array().is_some_and(|t| !t.is_empty()), "{}", json["ghc"]);
    assert_eq!(fs::read(&victim).unwrap(), b"precious", "a file outside the run changed");
}
