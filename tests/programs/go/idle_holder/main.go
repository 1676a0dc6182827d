// A Go program without memgap's helper package: it allocates objects of
// three sizes and a map, keeps one in -keep of them, collects, then prints
// its own runtime.MemStats as one JSON line and stays idle (its heap does
// not change) until its standard input closes. `memgap snapshot PID` reads
// the runtime's accounting from outside and is checked against that line.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"os"
	"runtime"
)

type small struct{ a, b uint64 }
type medium struct {
	id   int
	name string
	data [80]byte
}

var (
	keptSmall  []*small
	keptMedium []*medium
	keptBytes  [][]byte
	index      map[int]string
)

func main() {
	keep := flag.Int("keep", 64, "keep one object in this many")
	count := flag.Int("count", 400000, "objects of each size")
	flag.Parse()
	for i := 0; i < *count; i++ {
		s := &small{a: uint64(i)}
		m := &medium{id: i}
		m.data[0] = byte(i)
		b := make([]byte, 300)
		b[0] = byte(i)
		if i%*keep == 0 {
			keptSmall = append(keptSmall, s)
			keptMedium = append(keptMedium, m)
			keptBytes = append(keptBytes, b)
		}
	}
	index = make(map[int]string)
	for i := 0; i < *count / *keep; i++ {
		index[i] = "entry"
	}
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	line, _ := json.Marshal(map[string]uint64{
		"HeapAlloc": m.HeapAlloc, "HeapInuse": m.HeapInuse, "HeapIdle": m.HeapIdle, "HeapReleased": m.HeapReleased,
		"HeapSys": m.HeapSys, "StackInuse": m.StackInuse, "Sys": m.Sys, "NumGC": uint64(m.NumGC),
	})
	os.Stdout.Write(append(line, '\n'))
	// Idle: one blocking read, no allocation, until the test closes stdin.
	bufio.NewReader(os.Stdin).ReadByte()
	runtime.KeepAlive(keptSmall)
	runtime.KeepAlive(keptMedium)
	runtime.KeepAlive(keptBytes)
	runtime.KeepAlive(index)
}
