//! Puts the commit memgap is built from into `memgap --version`
//! (MEMGAP_COMMIT overrides it, e.g. when building from a tarball).

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=MEMGAP_COMMIT");
    let commit = std::env::var("MEMGAP_COMMIT").ok().filter(|c| !c.is_empty()).or_else(|| git(&["rev-parse", "--short=12", "HEAD"]));
    // Build again when HEAD moves: HEAD itself, the branch it names, and
    // packed refs, wherever this checkout (or worktree) keeps them.
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]).filter(|path| std::path::Path::new(path).exists()) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rustc-env=MEMGAP_COMMIT={}", commit.as_deref().unwrap_or("unknown"));
}

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok().filter(|output| output.status.success())?;
    let text = String::from_utf8(output.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}
