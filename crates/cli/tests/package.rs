//! The Debian package (`make deb`, packaging/deb/build.sh): built from this
//! build's memgap, extracted into an empty directory and used from there as
//! an installed memgap would be; its libraries load under glibc 2.31; lintian
//! finds no error. Also `memgap --version`, `man` and `completions`.

mod common;

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// The oldest glibc the preloaded libraries must load under.
const OLDEST_GLIBC: (u32, u32) = (2, 31);

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Runs `cmd`, failing the test after `limit`: building the package
/// compiles the two libraries, which takes longer than common's TIMEOUT.
fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    use std::os::unix::process::CommandExt;
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let (mut stdout, mut stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let stdout = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes);
        bytes
    });
    let stderr = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stderr.read_to_end(&mut bytes);
        bytes
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            sigkill(-(child.id() as i32));
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {limit:?}; killed it");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
}

fn succeed(cmd: &mut Command) -> String {
    let out = output_of(cmd);
    assert!(out.status.success(), "{cmd:?} failed ({}):\n{}{}", out.status, text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

/// The GLIBC_x.y versions a shared object needs, from `objdump -T`.
fn glibc_versions(object: &Path) -> Vec<(u32, u32, u32)> {
    let dump = succeed(Command::new("objdump").arg("-T").arg(object));
    let mut versions: Vec<(u32, u32, u32)> = dump
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|word| word.strip_prefix("GLIBC_"))
        .filter_map(|version| {
            let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
            Some((parts.next()??, parts.next()??, parts.next().flatten().unwrap_or(0)))
        })
        .collect();
    versions.sort();
    versions.dedup();
    versions
}

#[test]
fn the_debian_package_installs_a_working_memgap() {
    let (_tmp, dir) = tempdir();
    let built = output_within(
        Command::new("bash").arg("packaging/deb/build.sh").arg(memgap_bin()).current_dir(repository()),
        Duration::from_secs(900),
    );
    assert!(built.status.success(), "packaging/deb/build.sh failed:\n{}{}", text(&built.stdout), text(&built.stderr));
    let deb = repository().join(text(&built.stdout).trim());
    let version_line = succeed(Command::new(memgap_bin()).arg("--version"));
    let version = version_line.split_whitespace().nth(1).unwrap().to_string();
    assert_eq!(deb.file_name().unwrap().to_str().unwrap(), format!("memgap_{version}_amd64.deb"));

    // Its control data: depends on nothing but libc (and libgcc's unwinder).
    let control = succeed(Command::new("dpkg-deb").arg("-f").arg(&deb));
    let field = |name: &str| {
        control.lines().find_map(|l| l.strip_prefix(&format!("{name}: "))).unwrap_or_else(|| panic!("no {name}:\n{control}")).to_string()
    };
    assert_eq!(field("Package"), "memgap");
    assert_eq!(field("Version"), version);
    for dependency in field("Depends").split(',') {
        let package = dependency.split_whitespace().next().unwrap();
        assert!(["libc6", "libgcc-s1"].contains(&package), "unexpected dependency {dependency:?}:\n{control}");
    }

    // Installed into an empty directory, as dpkg would put it under /.
    let root = dir.join("root");
    fs::create_dir(&root).unwrap();
    succeed(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root));
    let installed = root.join("usr/bin/memgap");
    for library in ["libmemgap_agent.so", "libmemgap_trim.so"] {
        let path = root.join("usr/lib/memgap").join(library);
        let newest = *glibc_versions(&path).last().unwrap();
        assert!((newest.0, newest.1) <= OLDEST_GLIBC, "{library} needs GLIBC_{}.{}.{}: later than 2.31", newest.0, newest.1, newest.2);
    }

    // It records a program with its own agent, found in ../lib/memgap.
    let program = compile(&dir, "exact_counts.c");
    let trace = dir.join("t.mgt");
    let run = output_of(
        Command::new(&installed)
            .args(["run", "-q", "-o"])
            .arg(&trace)
            .arg("--")
            .arg(&program)
            .current_dir(&dir)
            .env_remove("MEMGAP_AGENT")
            .env_remove("MEMGAP_TRIM_LIBRARY")
            .env_remove("LD_PRELOAD"),
    );
    assert!(run.status.success(), "the installed memgap run failed:\n{}", text(&run.stderr));
    assert_eq!(text(&run.stdout), "exact_counts ok\n");
    let summary: Value = serde_json::from_str(&succeed(Command::new(&installed).arg("summary").arg(&trace).arg("--json"))).unwrap();
    assert_eq!(summary["events"]["malloc"], 1_000_000, "{summary:#}");
    assert_eq!(summary["live_bytes_at_end"], 32_000, "{summary:#}");
    let ledger = succeed(Command::new(&installed).arg("ledger").arg(&trace).args(["--json", "--mappings"]));
    let packaged_agent = format!("\"{}\"", root.join("usr/lib/memgap/libmemgap_agent.so").display());
    assert!(ledger.contains(&packaged_agent), "the program did not map the packaged agent {packaged_agent}");
    let ledger: Value = serde_json::from_str(&ledger).unwrap();
    assert!(ledger["rss_bytes"].as_u64().unwrap() > 0, "{ledger:#}");
    assert!(ledger["rows"]["live"].as_u64().unwrap() >= 32_000, "{ledger:#}");
    // And its trim remedy.
    let trimmed =
        output_of(Command::new(&installed).args(["run", "--trim-only", "--", "true"]).current_dir(&dir).env_remove("MEMGAP_TRIM_LIBRARY"));
    assert!(trimmed.status.success(), "{}", text(&trimmed.stderr));

    // Manual pages where man looks for them: memgap(1) and one per command.
    let man_dir = root.join("usr/share/man");
    let pages = succeed(Command::new(&installed).args(["man", "--list"]));
    assert!(pages.lines().count() > 10 && pages.lines().any(|p| p == "memgap-ledger"), "{pages}");
    for page in pages.lines() {
        assert!(man_dir.join(format!("man1/{page}.1.gz")).is_file(), "no {page}(1) in {}", man_dir.display());
    }
    let rendered = succeed(Command::new("man").arg("--manpath").arg(&man_dir).args(["-P", "cat", "memgap-run"]).env("MANWIDTH", "100"));
    // man justifies lines: compare with single spaces.
    let words = rendered.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains("--no-follow") && words.contains("memgap run"), "{rendered}");

    // Completions where bash-completion, zsh and fish look for them; bash's completes.
    let completion = |path: &str| fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert!(completion("usr/share/zsh/vendor-completions/_memgap").contains("#compdef memgap"));
    assert!(completion("usr/share/fish/vendor_completions.d/memgap.fish").contains("complete -c memgap"));
    let script = root.join("usr/share/bash-completion/completions/memgap");
    let completed = succeed(Command::new("bash").arg("-c").arg(format!(
        "source {}; COMP_WORDS=(memgap le); COMP_CWORD=1; _memgap memgap le memgap; echo \"${{COMPREPLY[@]}}\"",
        arg(&script)
    )));
    assert_eq!(completed.trim(), "ledger", "bash completed `memgap le` to {completed:?}");

    // The Go helper's source, and the licences of what is linked in.
    let go_mod = fs::read_to_string(root.join("usr/share/memgap/go/memgap/go.mod")).unwrap();
    assert!(go_mod.starts_with("module memgap.dev/go/memgap"), "{go_mod}");
    let copyright = fs::read_to_string(root.join("usr/share/doc/memgap/copyright")).unwrap();
    for expected in ["CDDL-1.0", "inferno", "framehop", "clap", "lz4_flex", "COMMON DEVELOPMENT AND DISTRIBUTION LICENSE"] {
        assert!(copyright.contains(expected), "the copyright file does not mention {expected}");
    }

    // lintian: no errors (warnings are printed, not fatal).
    let lint = output_of(Command::new("lintian").args(["--fail-on", "error"]).arg(&deb));
    assert!(lint.status.success(), "lintian found errors:\n{}{}", text(&lint.stdout), text(&lint.stderr));
}

#[test]
fn version_names_the_commit_and_the_trace_format() {
    let line = succeed(Command::new(memgap_bin()).arg("--version"));
    let (_, rest) = line.trim().split_once("memgap ").unwrap();
    assert!(rest.starts_with(env!("CARGO_PKG_VERSION")), "{line}");
    assert!(rest.contains(&format!(", trace format {}.", memgap_trace::framing::VERSION_MAJOR)), "{line}");
    let head = output_of(Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).current_dir(repository()));
    if head.status.success() {
        assert!(rest.contains(&format!("(commit {}", text(&head.stdout).trim())), "{line}");
    }
}

#[test]
fn man_and_completions_refuse_what_they_do_not_know() {
    let (_tmp, dir) = tempdir();
    let out = memgap(&dir, &["man", "nosuch"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).starts_with("memgap: no manual page for \"nosuch\": the commands are run, "), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr).lines().count(), 1);
    let out = memgap(&dir, &["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    // A page, as is: roff, not fitted to a terminal's width.
    let out = output_of(memgap_cmd(&dir, &["man", "compare"]).env("COLUMNS", "30"));
    let page = text(&out.stdout);
    assert!(page.contains(".TH memgap-compare 1") && page.lines().any(|l| l.len() > 30), "{page}");
}
