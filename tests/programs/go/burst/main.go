// A burst that leaves free spans in the Go heap: 160 MiB of 64 KiB
// buffers, one in ten kept, a GC, then -hold seconds of light steady work
// (as a service between bursts: a short-lived 32 KiB buffer every 10 ms),
// while RSS is measured from outside. The runtime returns free spans under
// a memory limit at its next collections, which that work brings; a program
// that allocates nothing after a burst may keep them until the forced one.
// Built with -tags helper, the memgap helper package reports runtime/metrics
// (helper.go); without it, memgap has only gctrace.
package main

import (
	"flag"
	"fmt"
	"runtime"
	"time"
)

var (
	kept [][]byte
	sink []byte
)

func main() {
	hold := flag.Float64("hold", 2, "seconds to hold still after the burst")
	flag.Parse()
	buffers := make([][]byte, 0, 2560)
	for i := 0; i < 2560; i++ {
		b := make([]byte, 64<<10)
		for j := range b {
			b[j] = byte(i + j)
		}
		buffers = append(buffers, b)
	}
	for i := 0; i < len(buffers); i += 10 {
		kept = append(kept, buffers[i])
	}
	buffers = nil
	runtime.GC()
	snapshot()
	for end := time.Now().Add(time.Duration(*hold * float64(time.Second))); time.Now().Before(end); {
		sink = make([]byte, 32<<10)
		sink[len(sink)-1] = 1
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println(len(kept), len(sink))
}
