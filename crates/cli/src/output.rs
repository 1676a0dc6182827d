//! Writing to stdout: lines fitted to the terminal's width, and no death on
//! a closed pipe (`memgap summary | head`).

use std::io::{ErrorKind, IsTerminal, Write};

pub fn print(text: &str) -> anyhow::Result<()> {
    let fitted = match width() {
        Some(width) => fit(text, width),
        None => text.to_string(),
    };
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(fitted.as_bytes()).and_then(|_| stdout.flush()) {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// The width to fit: $COLUMNS, else the terminal's; none when stdout is not
/// a terminal (scripts get lines as they are).
pub fn width() -> Option<usize> {
    if let Some(columns) = std::env::var("COLUMNS").ok().and_then(|c| c.trim().parse::<usize>().ok()).filter(|&c| c >= 20) {
        return Some(columns);
    }
    if !std::io::stdout().is_terminal() {
        return None;
    }
    // SAFETY: winsize is plain data, valid all zero.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ fills a winsize; stdout is a terminal.
    let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
    (ok && size.ws_col >= 20).then_some(size.ws_col as usize)
}

/// Every line at most `width` columns: long lines break at spaces, the rest
/// indented under the line's own indentation; a word longer than the width
/// is cut with `…`. Colour escapes take no column.
pub fn fit(text: &str, width: usize) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, newline) = match line.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (line, ""),
        };
        if columns(body) <= width {
            out.push_str(line);
            continue;
        }
        let indent = body.len() - body.trim_start().len();
        let hanging = " ".repeat((indent + 2).min(width / 2));
        let mut current = body[..indent].to_string();
        let mut current_columns = indent;
        // Columns of the current line before its first word.
        let mut line_start = indent;
        // Words with the spaces before them: a table row that fits after a
        // break keeps its alignment.
        let rest = &body[indent..];
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < rest.len() {
            let word_at = rest[i..].find(|c| c != ' ').map_or(rest.len(), |j| i + j);
            let word_end = rest[word_at..].find(' ').map_or(rest.len(), |j| word_at + j);
            if word_at < word_end {
                tokens.push((word_at - i, &rest[word_at..word_end]));
            }
            i = word_end;
        }
        for (spaces, word) in tokens {
            let word_columns = columns(word);
            let lead = if current_columns > line_start { spaces.max(1) } else { 0 };
            if current_columns + lead + word_columns > width && current_columns > line_start {
                out.push_str(current.trim_end());
                out.push('\n');
                current = hanging.clone();
                current_columns = hanging.len();
                line_start = hanging.len();
            } else if lead > 0 {
                current.extend(std::iter::repeat_n(' ', lead));
                current_columns += lead;
            }
            if current_columns + word_columns > width {
                let room = width.saturating_sub(current_columns + 1);
                current.extend(word.chars().take(room));
                current.push('…');
                current_columns = width;
            } else {
                current.push_str(word);
                current_columns += word_columns;
            }
        }
        out.push_str(current.trim_end());
        out.push_str(newline);
    }
    out
}

/// Columns a string takes on a terminal: characters, less colour escapes.
fn columns(text: &str) -> usize {
    let mut count = 0;
    let mut in_escape = false;
    for c in text.chars() {
        match (in_escape, c) {
            (false, '\x1b') => in_escape = true,
            (true, 'm') => in_escape = false,
            (true, _) => {}
            (false, _) => count += 1,
        }
    }
    count
}

/// Writes a file memgap made from a trace (a report, an export): into a new
/// private file (mode 0600: it holds addresses, command lines and symbol
/// names) beside its target, then renamed onto it, so no half-written file
/// is left and nothing planted at the name is followed; see
/// [`memgap_trace::files::write_replacing`].
pub fn write_private(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    memgap_trace::files::write_replacing(path, |file| file.write_all(bytes)).map_err(|error| match error.kind() {
        ErrorKind::AlreadyExists => anyhow::anyhow!("{error}"),
        _ => anyhow::anyhow!("cannot write {}: {error}", path.display()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_break_under_their_indentation() {
        let text = "short\n  one two three four five six\nx\n";
        let fitted = fit(text, 14);
        assert_eq!(fitted, "short\n  one two\n    three four\n    five six\nx\n");
        assert!(fitted.lines().all(|l| columns(l) <= 14));
        assert_eq!(fit("  a    b    c    d", 12), "  a    b\n    c    d");
    }

    #[test]
    fn long_words_are_cut_and_colours_take_no_room() {
        assert_eq!(fit("abcdefghijklmnop", 8), "abcdefg…");
        let coloured = "\x1b[32m█▓\x1b[0m ok";
        assert_eq!(fit(coloured, 5), coloured);
        for width in 20..60 {
            let fitted = fit("  memgap: a b c averyveryverylongwordthatgoesonandonandon d e f g h i j k l", width);
            assert!(fitted.lines().all(|l| columns(l) <= width), "{width}: {fitted}");
        }
    }
}
