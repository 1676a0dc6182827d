//! Short names for demangled C++ (and Rust) functions.
//!
//! A demangled C++ name spells out every template argument, the argument
//! list and, for a function template, the return type: `void
//! std::vector<int, std::allocator<int> >::_M_realloc_insert<int
//! const&>(__gnu_cxx::__normal_iterator<int*, std::vector<int,
//! std::allocator<int> > >, int const&)` runs past a thousand characters in
//! real programs. The short name keeps the qualified name and collapses what
//! is long: `std::vector<…>::_M_realloc_insert<…>(…)`. Template arguments and
//! argument lists that are short and flat stay (`shapes::Box<double>`,
//! `make_name(int)`), so overloads and instantiations of small types still
//! read apart; the return type goes, and so do the qualifiers after the
//! argument list (` const`, ` &&`).
//!
//! The demanglers (cpp_demangle, through blazesym) can drop the argument list
//! or the return type but not collapse template arguments, so this works on
//! the demangled text: brackets are matched, operator names (`operator<<`,
//! `operator()`, `operator<=>`, conversions), `(anonymous namespace)`,
//! lambdas (`{lambda(int)#1}`) and Rust's qualified paths (`<T as
//! Trait>::f`) are recognised. Text it cannot match is cut, never wrong
//! about where it cuts: the result is at most [`MAX_CHARS`] characters.

/// A short name is cut to this many characters (keeping its end, the
/// function's own name).
pub const MAX_CHARS: usize = 160;

/// Brackets whose content this long or longer, or holding brackets of its
/// own, is collapsed to `…`.
const KEPT_CONTENT: usize = 17;

const ELLIPSIS: char = '…';

/// The short form of a demangled function name (see the module's doc).
pub fn short_name(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut pass = Collapse {
        chars: &chars,
        at: 0,
        out: String::with_capacity(name.len().min(256)),
        arguments_at: None,
        separators: Vec::new(),
        depth: 0,
    };
    pass.run(None);
    let Collapse { mut out, arguments_at, separators, .. } = pass;
    // The return type: everything up to the last separating space before
    // the argument list.
    if let Some(at) = arguments_at
        && let Some(&space) = separators.iter().rev().find(|&&s| s < at)
    {
        out.drain(..=space);
    }
    cut_to_end(out.trim().to_string(), MAX_CHARS)
}

/// `text` cut to `max` characters, keeping the end and marking the cut.
fn cut_to_end(text: String, max: usize) -> String {
    let count = text.chars().count();
    if count <= max {
        return text;
    }
    let mut short = String::from(ELLIPSIS);
    short.extend(text.chars().skip(count - (max - 1)));
    short
}

/// Operators whose symbol follows `operator` directly, longest first so
/// that `<<=` is not read as `<<` then `=`.
const OPERATOR_SYMBOLS: &[&str] = &[
    "<<=", ">>=", "<=>", "->*", "()", "[]", "<<", ">>", "<=", ">=", "->", "==", "!=", "&&", "||", "++", "--", "+=", "-=", "*=", "/=", "%=",
    "&=", "|=", "^=", "<", ">", "+", "-", "*", "/", "%", "^", "&", "|", "~", "!", "=", ",",
];

struct Collapse<'a> {
    chars: &'a [char],
    at: usize,
    out: String,
    /// Where (in `out`, bytes) the first argument list at the top level begins.
    arguments_at: Option<usize>,
    /// Spaces at the top level that separate a return type from the name
    /// (in `out`, bytes).
    separators: Vec<usize>,
    /// Groups entered to copy their insides; deeper ones are collapsed.
    depth: usize,
}

/// Groups nested deeper than this are collapsed rather than entered.
const MAX_DEPTH: usize = 16;

impl Collapse<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn starts_with(&self, text: &str) -> bool {
        text.chars().enumerate().all(|(i, c)| self.chars.get(self.at + i) == Some(&c))
    }

    /// Copies the name up to `close` (the closing bracket of an enclosing
    /// group, not copied) or the end. Only the top level (`close` None)
    /// records the argument list and the separators.
    fn run(&mut self, close: Option<char>) {
        let top = close.is_none();
        while let Some(c) = self.peek() {
            if Some(c) == close {
                return;
            }
            match c {
                _ if self.at_word("operator") => self.operator(close),
                _ if self.starts_with("(anonymous namespace)") => {
                    self.out.push_str("(anonymous namespace)");
                    self.at += "(anonymous namespace)".len();
                }
                '<' if self.at == 0 || self.out.ends_with([' ', '(', ',', '<']) || self.out.ends_with("::") => {
                    // A Rust qualified path, `<T as Trait>::f`: not template arguments.
                    self.enter('<', '>');
                }
                '<' => self.group('<', '>'),
                '(' => {
                    let arguments = top && !self.out.is_empty() && !self.out.ends_with(' ');
                    if arguments {
                        self.arguments_at.get_or_insert(self.out.len());
                        self.group('(', ')');
                        // `f(int)::{lambda()#1}::operator()()`: a local entity of f.
                        if !self.starts_with("::") {
                            self.after_arguments();
                            return;
                        }
                        continue;
                    }
                    // A declarator such as a function pointer's `(*)`: kept, its insides shortened.
                    self.enter('(', ')');
                }
                // A lambda or unnamed type: `{lambda(int)#1}`.
                '{' => self.enter('{', '}'),
                '[' => self.group('[', ']'),
                ' ' => {
                    self.at += 1;
                    if top && !self.out.is_empty() {
                        self.separators.push(self.out.len());
                    }
                    self.out.push(' ');
                }
                _ => {
                    self.at += 1;
                    self.out.push(c);
                }
            }
        }
    }

    /// The group at `open` copied with its insides shortened (collapsed
    /// when nested too deep).
    fn enter(&mut self, open: char, close: char) {
        if self.depth >= MAX_DEPTH {
            return self.group(open, close);
        }
        self.depth += 1;
        self.at += 1;
        self.out.push(open);
        self.run(Some(close));
        self.closing(close);
        self.depth -= 1;
    }

    /// `word` starts here, and not inside a longer identifier.
    fn at_word(&self, word: &str) -> bool {
        let before = self.at.checked_sub(1).and_then(|i| self.chars.get(i));
        self.starts_with(word) && !before.is_some_and(|c| c.is_alphanumeric() || *c == '_') && {
            let after = self.chars.get(self.at + word.chars().count());
            !after.is_some_and(|c| c.is_alphanumeric() || *c == '_')
        }
    }

    fn closing(&mut self, close: char) {
        if self.peek() == Some(close) {
            self.at += 1;
            self.out.push(close);
        }
    }

    /// `operator` and its symbol, `new[]`, `delete`, `""` literal suffix or
    /// conversion type, copied whole (its `<` or `()` are not brackets).
    fn operator(&mut self, close: Option<char>) {
        self.out.push_str("operator");
        self.at += "operator".len();
        if let Some(symbol) = OPERATOR_SYMBOLS.iter().find(|s| self.starts_with(s)) {
            self.out.push_str(symbol);
            self.at += symbol.len();
            // `operator<< <std::char_traits<char> >`: its template arguments.
            if self.starts_with(" <") {
                self.at += 1;
                self.out.push(' ');
                self.group('<', '>');
            }
            return;
        }
        for word in [" new[]", " new", " delete[]", " delete"] {
            if self.starts_with(word) {
                self.out.push_str(word);
                self.at += word.len();
                return;
            }
        }
        if self.starts_with("\"\"") {
            // A literal operator, `operator"" _km`: its suffix is its name.
            self.out.push_str("\"\"");
            self.at += 2;
            while let Some(c) = self.peek().filter(|&c| c == ' ' || c.is_alphanumeric() || c == '_') {
                self.out.push(c);
                self.at += 1;
            }
            return;
        }
        // A conversion, `operator std::string()`: its type, up to the argument list.
        while let Some(c) = self.peek() {
            if c == '(' || Some(c) == close {
                return;
            }
            if c == '<' {
                self.group('<', '>');
            } else {
                self.at += 1;
                self.out.push(c);
            }
        }
    }

    /// A bracketed group from here (at `open`) to its matching `close`:
    /// copied when short and flat, else `open…close`.
    fn group(&mut self, open: char, close: char) {
        let start = self.at;
        let end = self.matching(start, open, close);
        let inner: String = self.chars[start + 1..end.min(self.chars.len())].iter().collect();
        let flat = !inner.contains(['<', '(', '[', '{']);
        self.out.push(open);
        if inner.is_empty() || (flat && inner.chars().count() < KEPT_CONTENT) {
            self.out.push_str(&inner);
        } else {
            self.out.push(ELLIPSIS);
        }
        if end < self.chars.len() {
            self.out.push(close);
        }
        self.at = (end + 1).min(self.chars.len());
    }

    /// The index of the bracket closing the one at `start` (the end of the
    /// text when it is never closed). Inside, every kind of bracket nests,
    /// and operator names are skipped (`std::less<operator<>`: no).
    fn matching(&self, start: usize, open: char, close: char) -> usize {
        let mut depth: Vec<char> = vec![close];
        let mut i = start + 1;
        while i < self.chars.len() {
            let c = self.chars[i];
            if self.chars[i..].starts_with(&['o', 'p', 'e', 'r', 'a', 't', 'o', 'r'])
                && (i == 0 || !(self.chars[i - 1].is_alphanumeric() || self.chars[i - 1] == '_'))
            {
                i += "operator".len();
                if let Some(symbol) = OPERATOR_SYMBOLS.iter().find(|s| self.chars[i..].iter().take(s.len()).copied().eq(s.chars())) {
                    i += symbol.len();
                }
                continue;
            }
            match c {
                '<' | '(' | '[' | '{' => depth.push(match c {
                    '<' => '>',
                    '(' => ')',
                    '[' => ']',
                    _ => '}',
                }),
                _ if Some(&c) == depth.last() => {
                    depth.pop();
                    if depth.is_empty() {
                        return i;
                    }
                }
                // A `>` that closes nothing open here (`(3>2)` as the
                // demangler never writes it): ignored.
                _ => {}
            }
            i += 1;
        }
        let _ = open;
        self.chars.len()
    }

    /// After the argument list: qualifiers (` const`, ` volatile`, ` &`,
    /// ` &&`, ` noexcept`) are dropped, a clone suffix (` [clone .cold]`) is
    /// kept.
    fn after_arguments(&mut self) {
        let rest: String = self.chars[self.at..].iter().collect();
        if let Some(clone) = rest.find(" [clone") {
            self.out.push_str(&rest[clone..]);
        }
        self.at = self.chars.len();
    }
}

#[cfg(test)]
mod tests {
    use super::short_name;

    #[test]
    fn templates_and_arguments_collapse_and_the_return_type_goes() {
        assert_eq!(
            short_name(
                "void std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>(__gnu_cxx::__normal_iterator<int*, std::vector<int, std::allocator<int> > >, int const&)"
            ),
            "std::vector<…>::_M_realloc_insert<int const&>(…)"
        );
        assert_eq!(
            short_name("std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > make_name(int)"),
            "make_name(int)"
        );
        assert_eq!(short_name("double shapes::scaled_area<double>(shapes::Box<double> const&, double)"), "shapes::scaled_area<double>(…)");
        assert_eq!(
            short_name("std::map<int, int, std::less<int>, std::allocator<std::pair<int const, int> > >::operator[](int const&)"),
            "std::map<…>::operator[](int const&)"
        );
    }

    #[test]
    fn plain_names_stay() {
        for name in [
            "main",
            "parse_config",
            "build(int)",
            "cache::grow()",
            "alloc::raw_vec::finish_grow",
            "(anonymous namespace)::build(int)",
            "shapes::Box<double>::area() [clone .cold]",
        ] {
            assert_eq!(short_name(name), name.replace(" const", ""));
        }
        assert_eq!(short_name("unsigned long table::grow(unsigned long)"), "table::grow(unsigned long)");
        assert_eq!(short_name("std::vector<int>::size() const"), "std::vector<int>::size()");
        assert_eq!(short_name("widget::operator=(widget&&) &&"), "widget::operator=(widget&&)");
    }

    #[test]
    fn operators_are_names_not_brackets() {
        assert_eq!(
            short_name(
                "std::basic_ostream<char, std::char_traits<char> >& std::operator<< <std::char_traits<char> >(std::basic_ostream<char, std::char_traits<char> >&, char const*)"
            ),
            "std::operator<< <…>(…)"
        );
        assert_eq!(short_name("bool operator<(key const&, key const&)"), "operator<(…)");
        assert_eq!(short_name("bool operator<=>(key const&, key const&)"), "operator<=>(…)");
        assert_eq!(short_name("matrix::operator()(unsigned long, unsigned long) const"), "matrix::operator()(…)");
        assert_eq!(short_name("operator new(unsigned long)"), "operator new(unsigned long)");
        assert_eq!(short_name("operator delete[](void*, unsigned long)"), "operator delete[](…)");
        assert_eq!(
            short_name("cache::operator std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >() const"),
            "cache::operator std::__cxx11::basic_string<…>()"
        );
        assert_eq!(short_name("node::operator->() const"), "node::operator->()");
        assert_eq!(
            short_name("std::less<void>::operator()<int const&, int const&>(int const&, int const&) const"),
            "std::less<void>::operator()<…>(…)"
        );
    }

    #[test]
    fn lambdas_and_function_pointers() {
        assert_eq!(short_name("main::{lambda(int)#1}::operator()(int) const"), "main::{lambda(int)#1}::operator()(int)");
        assert_eq!(
            short_name("std::_Function_handler<void (int), main::{lambda(int)#1}>::_M_invoke(std::_Any_data const&, int&&)"),
            "std::_Function_handler<…>::_M_invoke(…)"
        );
        assert_eq!(
            short_name(
                "auto worker::run<std::vector<int, std::allocator<int> > >(std::vector<int, std::allocator<int> > const&)::{lambda(auto:1&&)#2}::operator()<int&>(int&) const"
            ),
            "worker::run<…>(…)::{lambda(auto:1&&)#2}::operator()<int&>(int&)"
        );
        assert_eq!(short_name("register_handler(void (*)(int, siginfo_t*, void*), int)"), "register_handler(…)");
        assert_eq!(short_name("void (*lookup(char const*))(int)"), "(*lookup(char const*))(int)");
    }

    #[test]
    fn rust_paths_keep_their_qualified_self() {
        assert_eq!(
            short_name("<alloc::vec::Vec<T,A> as core::ops::drop::Drop>::drop"),
            "<alloc::vec::Vec<T,A> as core::ops::drop::Drop>::drop"
        );
        assert_eq!(
            short_name("<hashbrown::map::HashMap<K,V,S,A> as core::iter::traits::collect::Extend<(K,V)>>::extend"),
            "<hashbrown::map::HashMap<K,V,S,A> as core::iter::traits::collect::Extend<…>>::extend"
        );
        assert_eq!(short_name("rust_alloc::build::{{closure}}"), "rust_alloc::build::{{closure}}");
    }

    #[test]
    fn anything_is_bounded_and_never_panics() {
        for name in [
            "",
            "<",
            ">",
            "(",
            ")",
            "operator",
            "operator<",
            "a<b(c>d)",
            "f(((((",
            "x<<<<",
            "{lambda(",
            "foo() const &",
            " ",
            "a b c",
            "operator\"\" _km(unsigned long long)",
        ] {
            let short = short_name(name);
            assert!(short.chars().count() <= super::MAX_CHARS, "{name:?} → {short:?}");
        }
        let deep = format!("f{}{}", "<a".repeat(5000), ">".repeat(5000));
        assert!(short_name(&deep).chars().count() <= super::MAX_CHARS);
        let long = format!("{}::g(int)", "namespace_name".repeat(40));
        let short = short_name(&long);
        assert_eq!(short.chars().count(), super::MAX_CHARS);
        assert!(short.starts_with('…') && short.ends_with("::g(int)"), "{short}");
        assert_eq!(short_name("operator\"\" _km(unsigned long long)"), "operator\"\" _km(…)");
        let nested = format!("a {}", "(".repeat(100_000));
        assert!(short_name(&nested).chars().count() <= super::MAX_CHARS);
    }
}
