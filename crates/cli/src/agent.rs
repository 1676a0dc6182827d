//! Finding the libraries that `memgap run` preloads: the agent, and the
//! trim remedy's.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use memgap_trace::vocabulary::env::{self, EnvVar};

pub const AGENT_FILE: &str = "libmemgap_agent.so";
/// The trim remedy's library (`memgap run --trim-only`, `memgap compare`).
pub const TRIM_FILE: &str = "libmemgap_trim.so";

/// The agent: `MEMGAP_AGENT`, else next to the memgap binary (cargo's
/// target dir), else `../lib/memgap/` or `../lib/` relative to it (an
/// installed layout).
pub fn locate() -> anyhow::Result<PathBuf> {
    locate_library(AGENT_FILE, env::AGENT)
}

/// The trim remedy's library, found as the agent is (`MEMGAP_TRIM_LIBRARY`).
pub fn locate_trim() -> anyhow::Result<PathBuf> {
    locate_library(TRIM_FILE, env::TRIM_LIBRARY)
}

fn locate_library(file: &str, variable: EnvVar) -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(variable) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("{variable} names {}, which is not a file", path.display());
        }
        return absolute(&path);
    }
    let exe = std::env::current_exe().context("cannot find the memgap binary's own path")?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [dir.join(file), dir.join("../lib/memgap").join(file), dir.join("../lib").join(file)];
    for candidate in &candidates {
        if candidate.is_file() {
            return absolute(candidate);
        }
    }
    bail!("cannot find {file} next to {} or in ../lib; build it with `cargo build --release` or set {variable}", exe.display())
}

fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    path.canonicalize().with_context(|| format!("cannot resolve {}", path.display()))
}
