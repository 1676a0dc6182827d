#!/usr/bin/env bash
# A real two-node NUMA run, in a QEMU guest. The guest has 2 CPUs and 2 nodes
# (CPU 0 + 512 MiB on node 0, CPU 1 + 512 MiB on node 1) and boots from an
# initramfs built here: busybox, numactl, memgap, its agent and the test
# programs, with the shared libraries they need copied from this machine.
# Inside it, memgap records programs whose placement is known, and
# check.py compares `memgap numa --json` with that placement:
#   remote      numactl --cpunodebind=0 --membind=1    numa_touch: all on node 1, allocated from node 0
#   local       numactl --cpunodebind=1 --membind=1    numa_touch: all on node 1, allocated from node 1
#   interleave  numactl --cpunodebind=0 --interleave=0,1  half on each node
#   readers     numa_readers: main pinned to CPU 0 writes everything, then
#               a reader per CPU reads it: node 0 takes everything
#   ghc         numa_caps +RTS -N2 -qa -qg: capability n's thread on CPU n, so
#               its collections are node n's; counts and bytes copied per
#               node must add up to the RTS's own +RTS -s
#   ghc-membind the same under numactl --membind=1: the GHC heap on node 1
#   compare     memgap compare on numa_readers (untraced): the NUMA
#               configurations offered by default on two nodes; the default
#               and localalloc keep the pages on the writer's node (local
#               fraction near 1), interleave spreads them (near 0.5)
#
#   bash tests/numa-qemu/run.sh            # from the repository root, as root
#
# Needs Debian's qemu-system-x86 linux-image-amd64 busybox-static numactl
# cpio (installed here with apt when missing, so root). KVM when /dev/kvm
# opens read-write (then -cpu host), TCG with a longer timeout otherwise.
# MEMGAP_BIN and MEMGAP_AGENT name prebuilt binaries (the cargo test passes
# them); without them the script builds with cargo. NUMA_QEMU_KEEP=DIR keeps
# the console, the JSON and the traces' numa output there.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
work=$(mktemp -d /tmp/memgap-numa-qemu.XXXXXX)
trap 'rm -rf "$work"' EXIT

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v numactl >/dev/null || need+=(numactl)
command -v cpio >/dev/null || need+=(cpio)
[ -x /bin/busybox ] || need+=(busybox-static)
kernel=$(ls /boot/vmlinuz-* 2>/dev/null | sort -V | tail -1 || true)
[ -n "$kernel" ] || need+=(linux-image-amd64)
if [ ${#need[@]} -gt 0 ]; then
    echo "numa-qemu: installing ${need[*]}"
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
    kernel=$(ls /boot/vmlinuz-* | sort -V | tail -1)
fi

if [ -z "${MEMGAP_BIN:-}" ]; then
    cargo build --release -q
    MEMGAP_BIN=$root/target/release/memgap
fi
MEMGAP_AGENT=${MEMGAP_AGENT:-$(dirname "$MEMGAP_BIN")/libmemgap_agent.so}
cc -O2 -g -pthread -o "$work/numa_touch" tests/programs/numa_touch.c
cc -O2 -g -pthread -o "$work/numa_readers" tests/programs/numa_readers.c
# A GHC program whose two capabilities both allocate and collect, when ghc
# is installed (.ci/run installs it); the guest runs it with +RTS -N2 -qa.
programs=(numa_touch numa_readers)
if command -v ghc >/dev/null; then
    ghc -O -threaded -rtsopts -eventlog -outputdir "$work/ghc" -o "$work/numa_caps" tests/programs/ghc/numa_caps.hs >/dev/null
    programs+=(numa_caps)
else
    echo "numa-qemu: ghc is not installed: no GHC scenario"
fi

# The initramfs: busybox, the binaries and every library ldd names.
fs=$work/fs
mkdir -p "$fs"/{bin,sbin,proc,sys,dev,tmp,lib/memgap}
cp /bin/busybox "$fs/bin/"
# `true`: compare checks that each wrapper can run it.
for tool in sh mount poweroff cat mkdir echo sleep true; do ln -sf busybox "$fs/bin/$tool"; done
cp "$MEMGAP_BIN" "$fs/bin/memgap"
cp "$MEMGAP_AGENT" "$fs/lib/memgap/libmemgap_agent.so"
cp "$(command -v numactl)" "$fs/bin/"
for program in "${programs[@]}"; do cp "$work/$program" "$fs/bin/"; done
for binary in "$fs/bin/memgap" "$fs/bin/numactl" "${programs[@]/#/$fs/bin/}" "$fs/lib/memgap/libmemgap_agent.so"; do
    ldd "$binary" | grep -o '/[^ ]*' | while read -r lib; do
        mkdir -p "$fs$(dirname "$lib")"
        cp -L "$lib" "$fs$lib"
    done
done
cat > "$fs/init" <<'INIT'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mkdir -p /dev/shm && mount -t tmpfs shm /dev/shm
cd /tmp
export PATH=/bin:/sbin
export MEMGAP_AGENT=/lib/memgap/libmemgap_agent.so
results=/dev/ttyS1
# The kernel's automatic NUMA balancing moves pages toward the threads that
# read them (readers: 3.5 of 32 MiB within 2 s): off, so each placement stays
# the one the scenario forces.
echo 0 > /proc/sys/kernel/numa_balancing
# Transparent huge pages interleave 2 MiB at a time: interleave's 40 MiB
# came out 24.9 / 18.9 MiB with them. Off, so pages alternate one by one.
echo never > /sys/kernel/mm/transparent_hugepage/enabled
echo "=== nodes online: $(cat /sys/devices/system/node/online)"
numactl --hardware
# scenario NAME COMMAND...: COMMAND runs memgap with -o /tmp/NAME.mgt; its
# status, then memgap numa's JSON and text go to the results port.
scenario() {
    name=$1; shift
    echo "=== $name: $*"
    "$@" 2> /tmp/$name.err
    status=$?
    cat /tmp/$name.err
    echo "=== STATUS $name $status" > $results
    # A GHC program's own +RTS -s figures: collections per generation, bytes copied.
    grep -E 'Gen +[0-9]+ .* colls|bytes copied during GC' /tmp/$name.err | sed "s/^/=== RTS $name /" > $results
    echo "=== JSON $name" > $results
    /bin/memgap numa /tmp/$name.mgt --at end --json > $results
    echo "=== END $name" > $results
    /bin/memgap numa /tmp/$name.mgt --at end
}
scenario remote numactl --cpunodebind=0 --membind=1 /bin/memgap run --numa -o /tmp/remote.mgt -- /bin/numa_touch 16
scenario local numactl --cpunodebind=1 --membind=1 /bin/memgap run --numa -o /tmp/local.mgt -- /bin/numa_touch 16
scenario interleave numactl --cpunodebind=0 --interleave=0,1 /bin/memgap run --numa -o /tmp/interleave.mgt -- /bin/numa_touch 32
scenario readers /bin/memgap run --numa -o /tmp/readers.mgt -- /bin/numa_readers 32 8
if [ -x /bin/numa_caps ]; then
    scenario ghc /bin/memgap run --numa -o /tmp/ghc.mgt -- /bin/numa_caps 50000 +RTS -N2 -qa -qg -s -RTS
    scenario ghc-membind numactl --membind=1 /bin/memgap run --numa -o /tmp/ghc-membind.mgt -- /bin/numa_caps 50000 +RTS -N2 -qa -qg -s -RTS
fi
# Untraced: the default, numactl --interleave=all and --localalloc, each
# run's first touches (or accesses) sampled; one round keeps it short.
echo "=== compare: memgap compare --json --repeat 1 --only interleave,localalloc -- numa_readers 32 2"
echo "=== COMPARE readers" > $results
/bin/memgap compare --json --repeat 1 --only interleave,localalloc -- /bin/numa_readers 32 2 > $results 2> /tmp/compare.err
echo "=== STATUS compare $?" > $results
echo "=== END COMPARE" > $results
cat /tmp/compare.err
echo "=== DONE" > $results
poweroff -f
INIT
chmod +x "$fs/init"
(cd "$fs" && find . | cpio -o -H newc --quiet | gzip -1) > "$work/initrd.gz"

# KVM when /dev/kvm opens read-write and a guest under it starts the kernel
# within 20 s: under some nested hypervisors KVM runs, but the kernel's
# decompressor alone takes minutes, and TCG boots in seconds.
# NUMA_QEMU_ACCEL=kvm|tcg skips the probe.
machine=(-display none -monitor none -no-reboot -m 1G -smp 2
    -object memory-backend-ram,size=512M,id=m0 -object memory-backend-ram,size=512M,id=m1
    -numa node,nodeid=0,cpus=0,memdev=m0 -numa node,nodeid=1,cpus=1,memdev=m1
    -kernel "$kernel")
accel=${NUMA_QEMU_ACCEL:-}
if [ -z "$accel" ]; then
    accel=tcg
    if [ -c /dev/kvm ] && { exec 3<>/dev/kvm; } 2>/dev/null; then
        exec 3>&-
        timeout 20 qemu-system-x86_64 -machine q35,accel=kvm -cpu host,-arch-capabilities "${machine[@]}" \
            -serial "file:$work/probe.txt" -append "console=ttyS0 panic=-1" 2>/dev/null || true
        if grep -q 'Linux version' "$work/probe.txt" 2>/dev/null; then
            accel=kvm
        else
            echo "numa-qemu: /dev/kvm opens, but a KVM guest did not start its kernel within 20 s (nested virtualization?): using TCG"
        fi
    else
        echo "numa-qemu: /dev/kvm is not usable here: using TCG"
    fi
fi
if [ "$accel" = kvm ]; then
    # -arch-capabilities: some hosts' KVM refuses to set that MSR for -cpu host.
    cpu=(-machine q35,accel=kvm -cpu host,-arch-capabilities)
    limit=300
else
    cpu=(-machine q35,accel=tcg -cpu max)
    limit=540
fi
echo "numa-qemu: booting with ${cpu[*]} (at most ${limit} s)"
started=$(date +%s)
timeout "$limit" qemu-system-x86_64 "${cpu[@]}" "${machine[@]}" -initrd "$work/initrd.gz" \
    -append "console=ttyS0 panic=-1 loglevel=4" \
    -serial "file:$work/console.txt" -serial "file:$work/results.txt" || true
echo "numa-qemu: the guest ran $(( $(date +%s) - started )) s"
if [ -n "${NUMA_QEMU_KEEP:-}" ]; then
    mkdir -p "$NUMA_QEMU_KEEP" && cp "$work/console.txt" "$work/results.txt" "$NUMA_QEMU_KEEP/"
fi
if ! grep -q '=== DONE' "$work/results.txt"; then
    echo "numa-qemu: the guest did not finish; its console:" >&2
    tail -60 "$work/console.txt" >&2
    exit 1
fi
python3 tests/numa-qemu/check.py "$work/results.txt" || { tail -80 "$work/console.txt" >&2; exit 1; }
