//! The model's top-level modules depend on one another without a cycle, so
//! they read as its data flow: the ledger's types, the owners, the ledger's
//! computation, then the facts built over it. An edge A → B is a path in A's
//! code (not its comments, not its `#[cfg(test)]` items) that names
//! `crate::B…`, or `super::…` climbing from a file of A to B; a name that
//! lib.rs re-exports (`crate::HeapState`) is the module's it comes from.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One use of another module: where it is, for the failure's message.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Use {
    file: String,
    line: usize,
}

type Graph = BTreeMap<String, BTreeMap<String, Use>>;

#[test]
fn the_model_modules_form_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    read_sources(&src, &src, &mut files);
    let graph = module_graph(&files);
    let edges: usize = graph.values().map(BTreeMap::len).sum();
    // A reading that found nothing would pass whatever the code says.
    assert!(graph.contains_key("ledger") && edges > 10, "the model's modules were not read: {graph:?}");
    if let Some(cycle) = find_cycle(&graph) {
        panic!("the model's modules depend on one another in a cycle:\n{}", describe(&graph, &cycle));
    }
}

#[test]
fn a_cycle_through_crate_super_and_a_reexport_is_found() {
    let files = [
        ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\npub use c::{Thing as Renamed, other};\n"),
        ("a.rs", "// crate::c in a comment is no edge\nuse crate::{b::X, self};\n"),
        ("b/mod.rs", "pub mod inner;\n#[cfg(test)]\nmod tests { use crate::a; }\n"),
        ("b/inner.rs", "fn f() -> super::super::Renamed { let s = \"crate::a\"; todo!() }\n"),
        ("c.rs", "pub struct Thing;\nfn g() { crate::a::f(); }\n#[cfg(test)]\nmod tests;\n"),
        ("c/tests.rs", "use crate::b;\n"),
    ];
    let files: Vec<(String, String)> = files.iter().map(|(p, s)| (p.to_string(), s.to_string())).collect();
    let graph = module_graph(&files);
    let names = |m: &str| graph.get(m).map(|to| to.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
    assert_eq!(names("a"), ["b"]);
    assert_eq!(names("b"), ["c"]);
    assert_eq!(names("c"), ["a"]);
    let cycle = find_cycle(&graph).expect("a → b → c → a");
    assert_eq!(cycle.len(), 3, "{cycle:?}");

    let acyclic: Vec<(String, String)> = files.into_iter().filter(|(p, _)| !p.starts_with("c")).collect();
    assert_eq!(find_cycle(&module_graph(&acyclic)), None);
}

fn read_sources(root: &Path, dir: &Path, files: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            read_sources(root, &path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
            files.push((relative, std::fs::read_to_string(&path).unwrap()));
        }
    }
}

/// The module path of a source file: `lib.rs` → [], `ledger/owner.rs` →
/// [ledger, owner], `owners/mod.rs` → [owners].
fn module_path(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file.trim_end_matches(".rs").split('/').map(str::to_string).collect();
    if matches!(parts.last().map(String::as_str), Some("lib" | "mod")) {
        parts.pop();
    }
    parts
}

/// Edges between top-level modules, each with its first use.
fn module_graph(files: &[(String, String)]) -> Graph {
    let mut code = BTreeMap::new();
    let mut test_modules = Vec::new();
    for (file, source) in files {
        let (kept, out_of_line_tests) = without_test_items(&code_only(source));
        let path = module_path(file);
        for name in out_of_line_tests {
            test_modules.push([path.clone(), vec![name]].concat());
        }
        code.insert(file.clone(), (path, kept));
    }
    code.retain(|_, (path, _)| !test_modules.iter().any(|t| path.starts_with(t)));
    let top: BTreeSet<String> = code.values().filter_map(|(path, _)| path.first().cloned()).collect();
    let reexported = code.values().find(|(path, _)| path.is_empty()).map(|(_, lib)| reexports(lib, &top)).unwrap_or_default();

    let mut graph = Graph::new();
    for (file, (path, text)) in &code {
        let Some(from) = path.first() else { continue };
        graph.entry(from.clone()).or_default();
        for (offset, base, name) in named_paths(text) {
            let to = match base {
                Base::Crate => Some(0),
                Base::Super(levels) => path.len().checked_sub(levels),
            };
            let target = match to {
                Some(0) if top.contains(&name) => Some(name),
                Some(0) => reexported.get(&name).cloned(),
                Some(_) => Some(from.clone()),
                None => None,
            };
            if let Some(target) = target.filter(|t| t != from) {
                let line = text[..offset].matches('\n').count() + 1;
                graph.get_mut(from).unwrap().entry(target).or_insert(Use { file: file.clone(), line });
            }
        }
    }
    graph
}

/// The source with comments and the insides of string and char literals
/// blanked out (newlines kept, so offsets keep their line).
fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out: Vec<char> = Vec::with_capacity(chars.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let ident_before = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.extend([' ', ' ']);
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.extend([' ', ' ']);
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && !ident_before && matches!(next, Some('"' | '#')) && raw_string_end(&chars, i + 1).is_some() {
            let end = raw_string_end(&chars, i + 1).unwrap();
            out.extend(chars[i..end].iter().map(|&c| blank(c)));
            i = end;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                let skip = if chars[i] == '\\' { 2 } else { 1 };
                out.extend(chars[i..(i + skip).min(chars.len())].iter().map(|&c| blank(c)));
                i += skip;
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && next == Some('\\') {
            let end = chars[i + 2..].iter().position(|&c| c == '\'').map_or(chars.len(), |p| i + 3 + p);
            out.extend(chars[i..end.min(chars.len())].iter().map(|&c| blank(c)));
            i = end;
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            out.extend([' ', ' ', ' ']);
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out.into_iter().collect()
}

/// Where a raw string starting with `#`s or `"` at `at` ends, if it is one.
fn raw_string_end(chars: &[char], at: usize) -> Option<usize> {
    let hashes = chars[at..].iter().take_while(|&&c| c == '#').count();
    if chars.get(at + hashes) != Some(&'"') {
        return None;
    }
    let closing: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
    let body = at + hashes + 1;
    (body..chars.len()).find(|&k| chars[k..].starts_with(&closing)).map(|k| k + closing.len())
}

/// The code without its `#[cfg(test)]` items (blanked), and the names of
/// the test modules it declares out of line (`#[cfg(test)] mod tests;`).
fn without_test_items(code: &str) -> (String, Vec<String>) {
    let mut bytes = code.as_bytes().to_vec();
    let mut out_of_line = Vec::new();
    let mut from = 0;
    while let Some(found) = code[from..].find("#[cfg(test)]") {
        let start = from + found;
        let item = start + "#[cfg(test)]".len();
        let Some(open) = code[item..].find(['{', ';']).map(|p| item + p) else { break };
        let end = if code.as_bytes()[open] == b';' {
            let words: Vec<&str> = code[item..open].split_whitespace().collect();
            if let [.., "mod", name] = words.as_slice() {
                out_of_line.push(name.to_string());
            }
            open + 1
        } else {
            let mut depth = 0;
            let mut at = open;
            for (k, b) in code.bytes().enumerate().skip(open) {
                depth += match b {
                    b'{' => 1,
                    b'}' => -1,
                    _ => 0,
                };
                at = k + 1;
                if depth == 0 {
                    break;
                }
            }
            at
        };
        for b in &mut bytes[start..end] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
        from = end;
    }
    (String::from_utf8(bytes).unwrap(), out_of_line)
}

/// Where a path starts: the crate root, or `super` climbed so many times.
#[derive(Debug, Clone, Copy)]
enum Base {
    Crate,
    Super(usize),
}

/// Every path in `code` from the crate root or a parent: its offset, its
/// base and the first name after it (each name of a `{…}` group).
fn named_paths(code: &str) -> Vec<(usize, Base, String)> {
    let tokens = tokens(code);
    let mut found = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let (offset, word) = &tokens[i];
        let preceded_by_path = i > 0 && tokens[i - 1].1 == "::";
        let base = match word.as_str() {
            "crate" if !preceded_by_path => Base::Crate,
            "super" if !preceded_by_path => {
                let mut levels = 1;
                while tokens.get(i + 2 * levels).is_some_and(|t| t.1 == "super") && tokens[i + 2 * levels - 1].1 == "::" {
                    levels += 1;
                }
                i += 2 * (levels - 1);
                Base::Super(levels)
            }
            _ => {
                i += 1;
                continue;
            }
        };
        if tokens.get(i + 1).is_some_and(|t| t.1 == "::") {
            match tokens.get(i + 2).map(|t| t.1.as_str()) {
                Some("{") => {
                    let mut depth = 0;
                    let mut first = true;
                    for (_, token) in &tokens[i + 2..] {
                        match token.as_str() {
                            "{" => depth += 1,
                            "}" => depth -= 1,
                            "," if depth == 1 => first = true,
                            t if first && depth == 1 && is_identifier(t) => {
                                found.push((*offset, base, t.to_string()));
                                first = false;
                            }
                            _ => {}
                        }
                        if depth == 0 {
                            break;
                        }
                    }
                }
                Some(name) if is_identifier(name) => found.push((*offset, base, name.to_string())),
                _ => {}
            }
        }
        i += 1;
    }
    found
}

fn is_identifier(token: &str) -> bool {
    token.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_') && token != "self"
}

/// Identifiers, `::` and single punctuation, each with its byte offset.
fn tokens(code: &str) -> Vec<(usize, String)> {
    let mut tokens = Vec::new();
    let mut chars = code.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            let mut word = c.to_string();
            while let Some(&(_, n)) = chars.peek().filter(|(_, n)| n.is_alphanumeric() || *n == '_') {
                word.push(n);
                chars.next();
            }
            tokens.push((at, word));
        } else if c == ':' && chars.peek().is_some_and(|&(_, n)| n == ':') {
            chars.next();
            tokens.push((at, "::".to_string()));
        } else if !c.is_whitespace() {
            tokens.push((at, c.to_string()));
        }
    }
    tokens
}

/// The names lib.rs re-exports from each top-level module (`pub use m::…`).
fn reexports(lib: &str, top: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for statement in lib.split(';') {
        let words: Vec<(usize, String)> = tokens(statement);
        let Some(use_at) = words.iter().position(|t| t.1 == "use") else { continue };
        let Some(module) = words.get(use_at + 1).map(|t| t.1.clone()).filter(|m| top.contains(m)) else { continue };
        for (_, word) in &words[use_at + 2..] {
            if is_identifier(word) && word != "as" {
                names.insert(word.clone(), module.clone());
            }
        }
    }
    names
}

/// A cycle of the graph, if it has one, as the modules along it.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(node: &str, graph: &Graph, done: &mut BTreeSet<String>, path: &mut Vec<String>) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            return Some(path[at..].to_vec());
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flat_map(BTreeMap::keys) {
            if let Some(cycle) = visit(next, graph, done, path) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

/// Each step of the cycle with the line that makes it.
fn describe(graph: &Graph, cycle: &[String]) -> String {
    let mut lines = Vec::new();
    for (k, from) in cycle.iter().enumerate() {
        let to = &cycle[(k + 1) % cycle.len()];
        let at = &graph[from][to];
        lines.push(format!("  {from} -> {to}  ({}:{})", at.file, at.line));
    }
    lines.join("\n")
}
