// The Go field report's workload (seeds 003/004): 1<<20 individually
// allocated [16]byte objects, every step-th kept, then 1<<19 [32]byte
// objects; with -compact, the survivors are copied into new objects before
// that. At each measured point: a GC, memory returned to the OS, MemStats
// printed as one JSON line on stdout, and a memgap snapshot.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"unsafe"

	"memgap.dev/go/memgap"
)

var sink []*[32]byte

// allocate returns n distinct objects, each written (real programs write
// their objects; memory never written is never resident).
func allocate(n int) []*[16]byte {
	objects := make([]*[16]byte, n)
	for i := range objects {
		objects[i] = new([16]byte)
		objects[i][0] = byte(i)
	}
	return objects
}

func measure(point string) {
	runtime.GC()
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	json.NewEncoder(os.Stdout).Encode(map[string]any{
		"point": point, "HeapAlloc": m.HeapAlloc, "HeapInuse": m.HeapInuse, "HeapSys": m.HeapSys,
		"HeapReleased": m.HeapReleased, "HeapIdle": m.HeapIdle, "StackInuse": m.StackInuse, "Sys": m.Sys,
	})
	memgap.Snapshot()
}

func main() {
	step := flag.Int("step", 512, "keep every step-th object")
	compact := flag.Bool("compact", false, "copy the survivors into new objects")
	flag.Parse()
	fmt.Fprintf(os.Stderr, "fragment: step %d\n", *step)
	// Measured first, while no span of the class has free slots to reuse.
	perSpan := objectsPerSpan()

	measure("start")
	all := allocate(1 << 20)
	measure("allocated")
	kept := make([]*[16]byte, 0, len(all) / *step + 1)
	for i := 0; i < len(all); i += *step {
		kept = append(kept, all[i])
	}
	all = nil
	measure("kept")
	if *compact {
		for i, object := range kept {
			fresh := new([16]byte)
			*fresh = *object
			kept[i] = fresh
		}
		measure("compacted")
	}
	sink = make([]*[32]byte, 1<<19)
	for i := range sink {
		sink[i] = new([32]byte)
		sink[i][0] = byte(i)
	}
	measure("more")
	runtime.KeepAlive(kept)
	runtime.KeepAlive(all)
	json.NewEncoder(os.Stdout).Encode(map[string]any{"point": "objects_per_span", "16": perSpan})
	os.Stderr.WriteString("fragment: done")
}

// objectsPerSpan measures how many 16-byte objects this runtime puts in one
// 8 KiB span: spans are 8 KiB-aligned, so fresh objects group by address.
func objectsPerSpan() int {
	objects := allocate(1 << 14)
	perSpan := map[uintptr]int{}
	most := 0
	for _, object := range objects {
		span := uintptr(unsafe.Pointer(object)) / 8192
		perSpan[span]++
		if perSpan[span] > most {
			most = perSpan[span]
		}
	}
	runtime.KeepAlive(objects)
	return most
}
