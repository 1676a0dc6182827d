#!/usr/bin/env bash
# build.sh [MEMGAP]: builds target/debian/memgap_<version>_amd64.deb from a
# release build (`make deb` runs it after `cargo build --release`).
#
# The package is put together with dpkg-deb from files in a staging tree,
# not with cargo-deb: memgap ships two cdylibs of other crates, man pages
# and completions that the built binary generates, and libraries linked
# against glibc stand-ins; each of those would be a script around
# cargo-deb anyway, and dpkg-deb and dpkg-shlibdeps come with Debian.
#
# MEMGAP: the memgap binary to package (default target/release/memgap). The
# agent and trim libraries are built again here, with cargo in a target dir
# of their own, linked so that they load under glibc 2.31 and newer (see
# packaging/glibc/stubs.sh); the build fails if they need a later glibc.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
memgap=$(realpath "${1:-target/release/memgap}")
oldest_glibc=2.31
out=target/debian
die() { echo "build.sh: $*" >&2; exit 1; }

[ -x "$memgap" ] || die "$memgap does not exist: run cargo build --release first"
for tool in dpkg-deb dpkg-shlibdeps objdump strip gzip; do
    command -v "$tool" >/dev/null || die "$tool is missing (apt install dpkg-dev binutils)"
done
arch=$(dpkg --print-architecture)
[ "$arch" = amd64 ] || die "only amd64 is supported (this machine is $arch)"
version=$("$memgap" --version | awk '{ print $2 }')
[ -n "$version" ] || die "$memgap --version printed no version"

# The two preloaded libraries, linked against the glibc stand-ins.
stubs="$root/$out/glibc-stubs"
bash packaging/glibc/stubs.sh "$stubs" "$oldest_glibc"
link_flags=(-C "link-arg=-L$stubs" -C "link-arg=$stubs/stat_shim.o" -C link-arg=-Wl,-z,defs
            -C link-arg=-Wl,--no-as-needed -C "link-arg=$stubs/libpthread.so.0" -C "link-arg=$stubs/libdl.so.2")
for crate in memgap-agent memgap-trim; do
    cargo rustc --quiet --release --locked -p "$crate" --lib --crate-type cdylib --target-dir "$out/cargo" -- "${link_flags[@]}"
done
libs=("$out/cargo/release/libmemgap_agent.so" "$out/cargo/release/libmemgap_trim.so")
for lib in "${libs[@]}"; do
    needed=$(objdump -T "$lib" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
    if [ "$(printf '%s\n%s\n' "$needed" "$oldest_glibc" | sort -V | tail -1)" != "$oldest_glibc" ]; then
        die "$lib needs GLIBC_$needed, later than $oldest_glibc"
    fi
done

stage="$out/stage"
rm -rf "$stage"
mkdir -p "$stage/DEBIAN"
install -D -m 755 "$memgap" "$stage/usr/bin/memgap"
for lib in "${libs[@]}"; do
    install -D -m 644 "$lib" "$stage/usr/lib/memgap/$(basename "$lib")"
done
# Debian ships binaries without debug information and symbol tables;
# blame recognises the agent by its file name, not its symbols.
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$stage/usr/bin/memgap" "$stage"/usr/lib/memgap/*.so

man="$stage/usr/share/man/man1"
mkdir -p "$man"
for page in $("$memgap" man --list); do
    "$memgap" man "$page" | gzip -9n >"$man/$page.1.gz"
done
install -d "$stage/usr/share/bash-completion/completions" "$stage/usr/share/zsh/vendor-completions" "$stage/usr/share/fish/vendor_completions.d"
"$memgap" completions bash >"$stage/usr/share/bash-completion/completions/memgap"
"$memgap" completions zsh >"$stage/usr/share/zsh/vendor-completions/_memgap"
"$memgap" completions fish >"$stage/usr/share/fish/vendor_completions.d/memgap.fish"

# The Go helper module, to point a go.mod's replace directive at.
install -d "$stage/usr/share/memgap/go"
cp -r go/memgap "$stage/usr/share/memgap/go/"

doc="$stage/usr/share/doc/memgap"
install -d "$doc"
bash packaging/deb/copyright.sh >"$doc/copyright"
commit=$("$memgap" --version | sed -n 's/.*commit \([^,]*\),.*/\1/p')
{
    echo "memgap ($version) unstable; urgency=medium"
    echo
    echo "  * Built from commit $commit."
    echo
    echo " -- memgap developers <maintainers@memgap.dev>  $(date -R -d "@${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}")"
} | gzip -9n >"$doc/changelog.gz"

# What the binaries need at run time, as Debian computes it.
depends=$(
    cd "$stage" && mkdir -p debian && printf 'Source: memgap\n\nPackage: memgap\nArchitecture: %s\n' "$arch" >debian/control &&
    dpkg-shlibdeps -O --warnings=0 usr/bin/memgap usr/lib/memgap/*.so 2>/dev/null | sed -n 's/^shlibs:Depends=//p'
    rm -rf debian
)
[ -n "$depends" ] || die "dpkg-shlibdeps found no dependencies"
installed_size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<CONTROL
Package: memgap
Version: $version
Architecture: $arch
Maintainer: memgap developers <maintainers@memgap.dev>
Installed-Size: $installed_size
Depends: $depends
Suggests: libjemalloc2, libtcmalloc-minimal4, libmimalloc2.0
Section: devel
Priority: optional
Homepage: https://memgap.dev
Description: explains why a process's RSS is far above its live heap
 memgap records every heap call of a program with an LD_PRELOAD agent (any
 language that uses malloc; Go and GHC programs through their runtimes) and
 shows where every resident byte sits: live data, allocator slack,
 fragmentation, pages the allocator retains, lazily freed pages. It names
 the call sites that keep mostly-empty pages resident and measures remedies
 (malloc_trim, fewer arenas, other allocators) by running them.
 .
 The agent and trim libraries load in programs using glibc 2.31 or newer.
CONTROL
(cd "$stage" && find usr -type f -print0 | sort -z | xargs -0 md5sum >DEBIAN/md5sums)
chmod 644 "$stage/DEBIAN/control" "$stage/DEBIAN/md5sums"

deb="$out/memgap_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
echo "$deb"
