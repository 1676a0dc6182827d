//! Builds small C and C++ programs, runs them to learn where their modules
//! were loaded and where known functions ended up (as the agent would record
//! them), then symbolizes those addresses after the process has exited.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use memgap_symbolize::{Frame, Symbolizer, Warning};
use memgap_trace::records::Module;

const PROGRAMS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/programs");

fn sh(program: &str, args: &[&str]) {
    let output = Command::new(program).args(args).output().unwrap_or_else(|error| panic!("cannot run {program}: {error}"));
    assert!(output.status.success(), "{program} {args:?} failed:\n{}", String::from_utf8_lossy(&output.stderr));
}

/// Compiles `tests/programs/<source>` into `dir/<name>` with a build-id.
fn build(dir: &Path, source: &str, name: &str, flags: &[&str]) -> PathBuf {
    let output = dir.join(name);
    let compiler = if source.ends_with(".cpp") { "c++" } else { "cc" };
    let source = format!("{PROGRAMS}/{source}");
    let mut args = vec!["-g", "-O2", "-Wl,--build-id", "-o", output.to_str().unwrap(), &source];
    args.extend_from_slice(flags);
    sh(compiler, &args);
    output
}

/// What one run of a test program printed (see programs/report.h).
struct Run {
    modules: Vec<Module>,
    addresses: HashMap<String, u64>,
}

impl Run {
    fn of(binary: &Path) -> Run {
        let output = Command::new(binary).output().unwrap();
        assert!(output.status.success(), "{} failed", binary.display());
        let mut run = Run { modules: Vec::new(), addresses: HashMap::new() };
        let hex = |text: &str| u64::from_str_radix(text.trim_start_matches("0x"), 16).unwrap();
        for line in String::from_utf8(output.stdout).unwrap().lines() {
            let fields: Vec<&str> = line.splitn(5, ' ').collect();
            match fields[..] {
                ["module", base, size, build_id, path] => run.modules.push(Module {
                    path: path.to_string(),
                    base: hex(base),
                    size: hex(size),
                    build_id: (0..build_id.len()).step_by(2).map(|i| u8::from_str_radix(&build_id[i..i + 2], 16).unwrap()).collect(),
                }),
                ["address", name, address] => {
                    run.addresses.insert(name.to_string(), hex(address));
                }
                _ => panic!("unexpected line from {}: {line}", binary.display()),
            }
        }
        run
    }

    fn address(&self, name: &str) -> u64 {
        self.addresses[name]
    }

    fn module(&self, path_part: &str) -> &Module {
        self.modules.iter().find(|module| module.path.contains(path_part)).unwrap()
    }

    /// Where the program's return address into outer_function points: the
    /// call site, inside the call instruction, as the CLI will look it up.
    fn outer_call_site(&self) -> u64 {
        self.address("outer_return") - 1
    }
}

/// The line of `source` marked with the comment `line: <marker>`.
fn marked_line(source: &str, marker: &str) -> u32 {
    let text = std::fs::read_to_string(format!("{PROGRAMS}/{source}")).unwrap();
    let index =
        text.lines().position(|line| line.ends_with(&format!("line: {marker} */")) || line.ends_with(&format!("line: {marker}"))).unwrap();
    index as u32 + 1
}

fn names(frames: &[Frame]) -> Vec<Option<&str>> {
    frames.iter().map(|frame| frame.function.as_deref()).collect()
}

/// The full-DWARF expectations for sample.c, shared by every variant that
/// should find its debug information somewhere.
fn assert_full_symbols(symbolizer: &mut Symbolizer, run: &Run) {
    let frames = symbolizer.symbolize(run.outer_call_site());
    assert_eq!(names(&frames), [Some("inlined_helper"), Some("outer_function")], "{frames:#?}");
    assert!(frames[0].inlined && !frames[1].inlined);
    assert!(frames[0].file.as_deref().unwrap().ends_with("programs/sample.c"), "{frames:#?}");
    assert_eq!(frames[0].line, Some(marked_line("sample.c", "inlined_call")));
    assert_eq!(frames[1].line, Some(marked_line("sample.c", "outer_call")));
    let executable = &run.modules[0];
    for frame in &frames {
        assert_eq!(frame.address, run.outer_call_site());
        assert_eq!(frame.module, executable.path);
        assert_eq!(frame.module_offset, run.outer_call_site() - executable.base);
    }

    let frames = symbolizer.symbolize(run.address("plain_function"));
    assert_eq!(names(&frames), [Some("plain_function")]);
    // The entry instruction belongs to the declaration or the first statement.
    let body = marked_line("sample.c", "plain_body");
    assert!((body - 1..=body).contains(&frames[0].line.unwrap()), "{frames:#?}");
    assert!(symbolizer.warnings().is_empty(), "{:?}", symbolizer.warnings());
}

#[test]
fn pie_with_dwarf_gives_inlined_frames_and_lines() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build(dir.path(), "sample.c", "pie", &["-fPIE", "-pie"]);
    let run = Run::of(&binary);
    assert_full_symbols(&mut Symbolizer::new(&run.modules), &run);
}

#[test]
fn non_pie_executable() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build(dir.path(), "sample.c", "no-pie", &["-fno-pie", "-no-pie"]);
    let run = Run::of(&binary);
    assert_eq!(run.modules[0].base, 0x400000, "expected the classic non-PIE load address");
    assert_full_symbols(&mut Symbolizer::new(&run.modules), &run);
}

#[test]
fn stripped_executable_gives_module_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build(dir.path(), "sample.c", "stripped", &[]);
    sh("strip", &["--strip-all", binary.to_str().unwrap()]);
    let run = Run::of(&binary);
    let mut symbolizer = Symbolizer::new(&run.modules);
    let address = run.address("plain_function");
    let frames = symbolizer.symbolize(address);
    let expected_offset = address - run.modules[0].base;
    assert_eq!(
        frames,
        [Frame {
            function: None,
            file: None,
            line: None,
            module: binary.to_str().unwrap().to_string(),
            module_offset: expected_offset,
            inlined: false,
            address,
        }]
    );
    assert_eq!(frames[0].label(), format!("stripped+{expected_offset:#x}"));
    // A stripped file is the right file, just without names: nothing to warn about.
    assert!(symbolizer.warnings().is_empty());
}

#[test]
fn stripped_executable_falls_back_to_dynsym() {
    let dir = tempfile::tempdir().unwrap();
    // -rdynamic exports the functions, so .dynsym keeps their names.
    let binary = build(dir.path(), "sample.c", "exported", &["-rdynamic"]);
    sh("strip", &["--strip-all", binary.to_str().unwrap()]);
    let run = Run::of(&binary);
    let mut symbolizer = Symbolizer::new(&run.modules);
    let frames = symbolizer.symbolize(run.address("plain_function"));
    assert_eq!(names(&frames), [Some("plain_function")]);
    assert_eq!((frames[0].file.as_deref(), frames[0].line), (None, None));
    let frames = symbolizer.symbolize(run.outer_call_site());
    assert_eq!(names(&frames), [Some("outer_function")], "no DWARF, so no inlined frame");
}

#[test]
fn debug_info_split_off_behind_a_debuglink() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build(dir.path(), "sample.c", "split", &[]);
    let path = binary.to_str().unwrap();
    let debug_file = dir.path().join("split.debug");
    sh("objcopy", &["--only-keep-debug", path, debug_file.to_str().unwrap()]);
    sh("strip", &["--strip-all", path]);
    sh("objcopy", &[&format!("--add-gnu-debuglink={}", debug_file.display()), path]);
    let run = Run::of(&binary);
    assert_full_symbols(&mut Symbolizer::new(&run.modules), &run);
}

/// Puts the debug part of `binary` where gdb and Debian put it:
/// `<debug_dir>/.build-id/ab/cdef….debug`, and strips the binary.
fn split_into_build_id_dir(binary: &Path, build_id: &[u8], debug_dir: &Path) {
    let hex: String = build_id.iter().map(|byte| format!("{byte:02x}")).collect();
    let debug_file = debug_dir.join(".build-id").join(&hex[..2]).join(format!("{}.debug", &hex[2..]));
    std::fs::create_dir_all(debug_file.parent().unwrap()).unwrap();
    sh("objcopy", &["--only-keep-debug", binary.to_str().unwrap(), debug_file.to_str().unwrap()]);
    sh("strip", &["--strip-all", binary.to_str().unwrap()]);
}

#[test]
fn debug_info_in_a_build_id_directory() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build(dir.path(), "sample.c", "by-build-id", &[]);
    let debug_dir = dir.path().join("debug");
    let run = Run::of(&binary);
    split_into_build_id_dir(&binary, &run.modules[0].build_id, &debug_dir);
    // No debuglink in the binary: only the build-id leads to the debug file.
    assert_full_symbols(&mut Symbolizer::with_debug_dirs(&run.modules, &[&debug_dir]), &run);
    let frames = Symbolizer::new(&run.modules).symbolize(run.address("plain_function"));
    assert_eq!(frames[0].function, None, "without the debug directory the stripped binary has no names");

    // The debug file, found by the recorded build-id, still serves once the
    // binary itself is gone.
    std::fs::remove_file(&binary).unwrap();
    assert_full_symbols(&mut Symbolizer::with_debug_dirs(&run.modules, &[&debug_dir]), &run);
}

#[test]
fn missing_file_gives_module_and_offset_and_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build(dir.path(), "sample.c", "deleted", &[]);
    let run = Run::of(&binary);
    std::fs::remove_file(&binary).unwrap();
    let mut symbolizer = Symbolizer::new(&run.modules);
    let frames = symbolizer.symbolize_many(&[run.address("plain_function"), run.outer_call_site()]);
    assert!(frames.iter().all(|frames| frames.len() == 1 && frames[0].function.is_none()));
    assert_eq!(frames[0][0].label(), format!("deleted+{:#x}", run.address("plain_function") - run.modules[0].base));
    assert_eq!(symbolizer.warnings(), [Warning::Missing { module: binary.to_str().unwrap().to_string() }]);
}

#[test]
fn a_file_that_is_not_elf_is_unreadable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("libnot-elf.so");
    std::fs::write(&path, "just text").unwrap();
    let module = Module { path: path.to_str().unwrap().to_string(), base: 0x1000, size: 0x1000, build_id: vec![1, 2, 3, 4, 5, 6, 7, 8] };
    let mut symbolizer = Symbolizer::new(&[module]);
    assert_eq!(symbolizer.symbolize(0x1234)[0].label(), "libnot-elf.so+0x234");
    assert!(matches!(symbolizer.warnings(), [Warning::Unreadable { .. }]), "{:?}", symbolizer.warnings());
}

#[test]
fn rebuilt_file_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build(dir.path(), "sample.c", "rebuilt", &[]);
    let mut run = Run::of(&binary);
    // As if the program had been rebuilt after the trace was taken.
    run.modules[0].build_id[0] ^= 0xff;
    let mut symbolizer = Symbolizer::new(&run.modules);
    let frames = symbolizer.symbolize(run.address("plain_function"));
    assert_eq!(frames[0].function, None);
    assert_eq!(frames[0].module, binary.to_str().unwrap());
    let [Warning::BuildIdMismatch { module, .. }] = symbolizer.warnings() else {
        panic!("expected one build-id warning, got {:?}", symbolizer.warnings());
    };
    assert_eq!(module, binary.to_str().unwrap());
    let message = symbolizer.warnings()[0].to_string();
    assert!(message.contains("rebuilt") && message.contains("module+offset"), "{message}");
}

#[test]
fn cpp_names_are_demangled() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build(dir.path(), "sample.cpp", "cpp", &[]);
    let run = Run::of(&binary);
    let frames = Symbolizer::new(&run.modules).symbolize(run.address("scaled_area"));
    let demangled = "double shapes::scaled_area<double>(shapes::Box<double> const&, double)";
    assert_eq!(frames[0].function.as_deref(), Some(demangled));
    assert!(frames[0].file.as_deref().unwrap().ends_with("programs/sample.cpp"));

    // The same without DWARF: the name comes from the mangled ELF symbol.
    sh("strip", &["--strip-debug", binary.to_str().unwrap()]);
    let frames = Symbolizer::new(&run.modules).symbolize(run.address("scaled_area"));
    assert_eq!(frames[0].function.as_deref(), Some(demangled));
    assert_eq!(frames[0].file, None);
}

#[test]
fn shared_library_function() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build(dir.path(), "sample.c", "uses-libc", &[]);
    let run = Run::of(&binary);
    let libc = run.module("libc.so");
    let mut symbolizer = Symbolizer::new(&run.modules);
    let frames = symbolizer.symbolize(run.address("malloc"));
    let frame = frames.last().unwrap();
    assert!(frame.function.as_deref().unwrap().contains("malloc"), "{frames:#?}");
    assert_eq!(frame.module, libc.path);
    assert_eq!(frame.module_offset, run.address("malloc") - libc.base);
    // Debian's libc6-dbg installs libc's DWARF under /usr/lib/debug/.build-id.
    let hex: String = libc.build_id.iter().map(|byte| format!("{byte:02x}")).collect();
    if Path::new(&format!("/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..])).exists() {
        assert!(frame.file.as_deref().unwrap().ends_with("malloc.c"), "{frames:#?}");
    } else {
        println!("note: libc6-dbg is not installed; checked libc's symbol table only");
    }
    assert!(symbolizer.warnings().is_empty(), "{:?}", symbolizer.warnings());
}

#[test]
fn addresses_outside_files_get_plain_labels_without_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build(dir.path(), "sample.c", "outside", &[]);
    let run = Run::of(&binary);
    let vdso = run.module("vdso");
    let mut symbolizer = Symbolizer::new(&run.modules);
    let frames = symbolizer.symbolize_many(&[0x10, vdso.base + 0x20]);
    assert_eq!(frames[0][0].label(), "0x10");
    assert_eq!(frames[0][0].module, "");
    assert_eq!(frames[1][0].label(), format!("{}+0x20", vdso.path));
    assert!(symbolizer.warnings().is_empty(), "{:?}", symbolizer.warnings());
}

#[test]
fn batch_matches_single_lookups_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let binary = build(dir.path(), "sample.c", "batch", &[]);
    let run = Run::of(&binary);
    let libc = run.module("libc.so");
    // Thousands of distinct addresses across libc, the executable and
    // nowhere, with repeats, in no particular order.
    let mut addresses: Vec<u64> = (0..4000).map(|i| libc.base + (i * 7919) % libc.size).collect();
    addresses.extend([run.outer_call_site(), 0x10, run.address("plain_function"), run.outer_call_site(), libc.base]);
    addresses.reverse();
    let started = std::time::Instant::now();
    let batch = Symbolizer::new(&run.modules).symbolize_many(&addresses);
    println!("{} addresses in {:?}", addresses.len(), started.elapsed());
    assert_eq!(batch.len(), addresses.len());
    let mut one_by_one = Symbolizer::new(&run.modules);
    for (address, frames) in addresses.iter().zip(&batch) {
        assert!(!frames.is_empty());
        assert!(frames.iter().all(|frame| frame.address == *address));
        assert_eq!(frames, &one_by_one.symbolize(*address));
    }
    assert_eq!(names(&batch[1]), [Some("inlined_helper"), Some("outer_function")]);
}
