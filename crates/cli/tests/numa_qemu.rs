//! The two-node NUMA run: tests/numa-qemu/run.sh boots a QEMU guest with two
//! nodes, records programs whose placement numactl or the program forces,
//! and checks `memgap numa --json` against it (tests/numa-qemu/check.py).
//! Runs where /dev/kvm opens read-write (the script still falls back to TCG
//! when a KVM guest cannot start its kernel in time) and where the script can
//! install what it needs (root) or finds it installed; skips with the reason
//! printed otherwise.

mod common;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// The script's own limits: 20 s for the KVM probe, 540 s for a TCG guest.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(600);

fn skip_reason() -> Option<String> {
    if let Err(error) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        return Some(format!("/dev/kvm is not usable ({error})"));
    }
    let installed = |tool: &str| {
        Command::new("sh").args(["-c", &format!("command -v {tool}")]).stdout(Stdio::null()).status().is_ok_and(|s| s.success())
    };
    // SAFETY: no precondition.
    let is_root = unsafe { libc::geteuid() } == 0;
    let tools_installed = installed("qemu-system-x86_64") && installed("numactl") && installed("cpio");
    if !is_root && !tools_installed {
        return Some("qemu-system-x86, numactl or cpio is missing and only root may install them".into());
    }
    if !installed("python3") {
        return Some("python3 (the result checker) is missing".into());
    }
    None
}

#[test]
fn two_nodes_in_a_guest_match_their_forced_placement() {
    if let Some(reason) = skip_reason() {
        println!("skipped: the two-node guest run: {reason}");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let bin = memgap_bin();
    let mut child = Command::new("bash")
        .arg(root.join("tests/numa-qemu/run.sh"))
        .env("MEMGAP_BIN", &bin)
        .env("MEMGAP_AGENT", bin.with_file_name("libmemgap_agent.so"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("run tests/numa-qemu/run.sh");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).ok();
        text
    });
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        stderr.read_to_string(&mut text).ok();
        text
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the script") {
            break Some(status);
        }
        if started.elapsed() > SCRIPT_TIMEOUT {
            // SAFETY: no memory precondition; the process group of the child this test started.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            child.wait().ok();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let (out, err) = (out_reader.join().unwrap(), err_reader.join().unwrap());
    println!("{out}");
    let status = status.unwrap_or_else(|| panic!("the two-node run took over {SCRIPT_TIMEOUT:?}\n{out}\n{err}"));
    assert!(status.success() && out.contains("numa-qemu: ok"), "the two-node run failed ({status}):\n{out}\n{err}");
}
