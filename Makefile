# `make install` puts memgap in $(PREFIX)/bin and its agent and trim
# library in $(PREFIX)/lib/memgap, where `memgap run` looks for them.
PREFIX ?= /usr/local

.PHONY: build install deb test demo

build:
	cargo build --release

install: build
	install -D -m 755 target/release/memgap $(DESTDIR)$(PREFIX)/bin/memgap
	install -D -m 755 target/release/libmemgap_agent.so $(DESTDIR)$(PREFIX)/lib/memgap/libmemgap_agent.so
	install -D -m 755 target/release/libmemgap_trim.so $(DESTDIR)$(PREFIX)/lib/memgap/libmemgap_trim.so

# target/debian/memgap_<version>_amd64.deb (packaging/deb/build.sh says how).
deb: build
	bash packaging/deb/build.sh target/release/memgap

test:
	bash .ci/run

demo:
	bash examples/demo.sh
