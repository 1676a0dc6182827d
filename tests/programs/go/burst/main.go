// A burst that leaves free spans in the Go heap: 160 MiB of 64 KiB
// buffers, one in ten kept, a GC, then it holds still for -hold seconds
// (RSS is measured from outside meanwhile). Built with -tags helper, the
// memgap helper package reports runtime/metrics (helper.go); without it,
// memgap has only gctrace.
package main

import (
	"flag"
	"fmt"
	"runtime"
	"time"
)

var kept [][]byte

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
	time.Sleep(time.Duration(*hold * float64(time.Second)))
	fmt.Println(len(kept))
}
