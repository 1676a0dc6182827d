#!/usr/bin/env bash
# copyright.sh: the Debian copyright file of the memgap package: memgap's
# licence, then every crate linked into the memgap binary or its two
# libraries (cargo's normal dependencies, no proc-macros) with its licence,
# and the licence texts that cannot be pointed to in /usr/share/common-licenses.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

crates=$(cargo tree --locked -e normal,no-proc-macro -p memgap -p memgap-agent -p memgap-trim \
    --target x86_64-unknown-linux-gnu --prefix none -f '{p}|{l}' |
    sed -n 's/ (\*)$//; /^memgap/d; s/^\([^ ]*\) v\([^ |]*\)[^|]*|/\1|\2|/p' | sort -u)
registry_dir() { ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"$1-$2" 2>/dev/null | head -1; }

cat <<HEAD
memgap

Copyright: the memgap developers
License: MIT OR Apache-2.0 (at your option)

The Apache License 2.0 is in /usr/share/common-licenses/Apache-2.0.
MIT: see the end of this file.

Linked in
---------

/usr/bin/memgap, /usr/lib/memgap/libmemgap_agent.so and
/usr/lib/memgap/libmemgap_trim.so are Rust programs that contain these
crates, statically linked, with Rust's standard library (MIT OR
Apache-2.0, https://github.com/rust-lang/rust); each crate's source is at
https://crates.io/crates/NAME/VERSION.

HEAD
echo "$crates" | awk -F'|' '{ printf "  %-28s %-10s %s\n", $1, $2, $3 }'
cat <<'CDDL'

inferno (the flame graph writer, in /usr/bin/memgap) is under the Common
Development and Distribution License 1.0, a file-level copyleft: its
source is at https://crates.io/crates/inferno and
https://github.com/jonhoo/inferno; its licence text is below.

Where a crate offers Apache-2.0 among its choices, memgap's package takes
it. The other crates' own licence files follow.
CDDL
echo "$crates" | while IFS='|' read -r name version licence; do
    case "$licence" in *Apache-2.0*) continue ;; esac
    dir=$(registry_dir "$name" "$version")
    echo
    echo "$name $version ($licence)"
    echo "------------------------------------------------------------------"
    files=()
    [ -n "$dir" ] && mapfile -t files < <(find "$dir" -maxdepth 1 -type f \( -iname 'LICEN[CS]E*' -o -iname 'COPYING*' -o -iname 'UNLICENSE' \) | sort)
    if [ "${#files[@]}" -eq 0 ]; then
        echo "(no licence file in the crate; licence: $licence)"
    else
        for file in "${files[@]}"; do sed 's/[[:space:]]*$//' "$file"; echo; done
    fi
done
cat <<'MIT'

memgap's MIT licence
--------------------

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in
all copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
MIT
