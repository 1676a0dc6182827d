//! Finding the agent library that `memgap run` preloads.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

pub const AGENT_FILE: &str = "libmemgap_agent.so";

/// `MEMGAP_AGENT`, else next to the memgap binary (cargo's target dir), else
/// `../lib/memgap/` or `../lib/` relative to it (an installed layout).
pub fn locate() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("MEMGAP_AGENT") {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("MEMGAP_AGENT names {}, which is not a file", path.display());
        }
        return absolute(&path);
    }
    let exe = std::env::current_exe().context("cannot find the memgap binary's own path")?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [dir.join(AGENT_FILE), dir.join("../lib/memgap").join(AGENT_FILE), dir.join("../lib").join(AGENT_FILE)];
    for candidate in &candidates {
        if candidate.is_file() {
            return absolute(candidate);
        }
    }
    bail!("cannot find {AGENT_FILE} next to {} or in ../lib; build it with `cargo build --release` or set MEMGAP_AGENT", exe.display())
}

fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    path.canonicalize().with_context(|| format!("cannot resolve {}", path.display()))
}
